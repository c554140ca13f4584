import DocumentModel

/// A document's revision tree as LiteCore 3 keeps it in the `extra` column (its
/// `RawRevTree` layout): revisions in priority order, the current one first, each
/// `size(4, big-endian) parentIndex(2) flags(1) revIDLength(1) revID varint(sequence) [body]`,
/// a zero size, then which revision each remote last had and which were rejected. The
/// current revision's body is in the `body` column, not here.
public struct LiteCoreRevisionTree: Sendable {
    public struct Revision: Sendable {
        public let id: RevisionID
        /// Index of the parent in `revisions`, nil for a root.
        public let parent: Int?
        public let flags: UInt8
        /// 0 for the current revision: the document's sequence.
        public let sequence: Int64
        /// The Fleece body, when this revision kept one.
        public let body: [UInt8]?

        public var deleted: Bool { flags & LiteCoreRevisionTree.deleted != 0 }
        public var isLeaf: Bool { flags & LiteCoreRevisionTree.leaf != 0 }
        public var hasAttachments: Bool { flags & LiteCoreRevisionTree.hasAttachments != 0 }
        /// A branch LiteCore closed (a resolved conflict's loser): no longer a leaf that counts.
        public var isClosed: Bool { flags & LiteCoreRevisionTree.closed != 0 }
    }

    // LiteCore's `Rev::Flags`.
    public static let deleted: UInt8 = 0x01, leaf: UInt8 = 0x02, hasAttachments: UInt8 = 0x08, keepBody: UInt8 = 0x10,
                      isConflict: UInt8 = 0x20, closed: UInt8 = 0x40
    /// Only on disk: the revision carries its body.
    static let hasData: UInt8 = 0x80

    public let revisions: [Revision]
    /// Remote database number (its `kv_info` entry `remotes`) → index of the revision it last had.
    public let remotes: [Int: Int]
    /// Indexes of revisions a remote rejected.
    public let rejected: [Int]

    public init(revisions: [Revision], remotes: [Int: Int] = [:], rejected: [Int] = []) {
        self.revisions = revisions
        self.remotes = remotes
        self.rejected = rejected
    }

    /// Reads `extra`; `docID` names the document in errors.
    public init(decoding raw: [UInt8], docID: String) throws(SofaError) {
        func damaged(_ why: String) -> SofaError { .invalidDocument(reason: "\(docID): its revision tree is damaged (\(why))") }
        var revisions: [Revision] = []
        var at = 0
        while true {
            guard at + 4 <= raw.count else { throw damaged("no end marker") }
            let size = Int(raw[at]) << 24 | Int(raw[at + 1]) << 16 | Int(raw[at + 2]) << 8 | Int(raw[at + 3])
            if size == 0 { at += 4; break }
            guard size >= 8, at + size <= raw.count else { throw damaged("a revision of \(size) bytes at \(at)") }
            let parent = Int(raw[at + 4]) << 8 | Int(raw[at + 5])
            let flags = raw[at + 6]
            let idLength = Int(raw[at + 7])
            guard 8 + idLength <= size else { throw damaged("a revision id longer than its revision at \(at)") }
            let id = try Self.revisionID(Array(raw[(at + 8)..<(at + 8 + idLength)]), docID: docID)
            var cursor = at + 8 + idLength
            var sequence: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard cursor < at + size, shift < 64 else { throw damaged("a sequence past its revision at \(at)") }
                let byte = raw[cursor]
                sequence |= UInt64(byte & 0x7F) << shift
                cursor += 1
                if byte & 0x80 == 0 { break }
                shift += 7
            }
            let body = flags & Self.hasData != 0 ? Array(raw[cursor..<(at + size)]) : nil
            revisions.append(Revision(id: id, parent: parent == 0xFFFF ? nil : parent, flags: flags & ~Self.hasData,
                                      sequence: Int64(truncatingIfNeeded: sequence), body: body))
            at += size
        }
        for revision in revisions {
            if let parent = revision.parent, parent >= revisions.count { throw damaged("a parent index \(parent) of \(revisions.count)") }
        }
        var remotes: [Int: Int] = [:]
        var rejected: [Int] = []
        var pastMark = false
        while at + 4 <= raw.count {
            let remote = Int(raw[at]) << 8 | Int(raw[at + 1])
            let index = Int(raw[at + 2]) << 8 | Int(raw[at + 3])
            at += 4
            guard index < revisions.count else { throw damaged("remote \(remote) names revision \(index) of \(revisions.count)") }
            if pastMark {
                rejected.append(index)
            } else if remote == 0 {
                pastMark = index == 0  // the 0/0 mark before rejected revisions (LiteCore 3.1+)
                if !pastMark { throw damaged("a remote entry without a remote") }
            } else {
                remotes[remote] = index
            }
        }
        guard at == raw.count else { throw damaged("\(raw.count - at) stray bytes at the end") }
        self.revisions = revisions
        self.remotes = remotes
        self.rejected = rejected
    }

    /// A LiteCore binary revision id: a varint generation and the digest's bytes
    /// (`3-86e8…` is 0x03 0x86 0xe8…). A leading zero byte is a version vector's, which
    /// Sofa does not read (Couchbase Lite 4).
    public static func revisionID(_ bytes: [UInt8], docID: String) throws(SofaError) -> RevisionID {
        guard let first = bytes.first else { throw .invalidDocument(reason: "\(docID): an empty revision id") }
        guard first != 0 else {
            throw .invalidDocument(reason: "\(docID): its revision is a version vector (Couchbase Lite 4's), which Sofa does not read")
        }
        var generation = 0
        var shift = 0
        var at = 0
        while true {
            guard at < bytes.count, shift < 56 else { throw .invalidDocument(reason: "\(docID): a damaged revision id") }
            let byte = bytes[at]
            generation |= Int(byte & 0x7F) << shift
            at += 1
            if byte & 0x80 == 0 { break }
            shift += 7
        }
        guard generation > 0, at < bytes.count else { throw .invalidDocument(reason: "\(docID): a damaged revision id") }
        return RevisionID(generation: generation, suffix: BlobKey.hexString(Array(bytes[at...])))
    }

    /// The tree as Sofa's model has it (parents by id; closed branches are not leaves).
    public var tree: RevisionTree {
        RevisionTree(revisions.map { revision in
            RevisionNode(id: revision.id, parent: revision.parent.map { revisions[$0].id }, deleted: revision.deleted,
                         isLeaf: revision.isLeaf && !revision.isClosed)
        })
    }

    public func index(of id: RevisionID) -> Int? { revisions.firstIndex { $0.id == id } }

    /// `index`'s revision and its ancestors, newest first.
    public func history(of index: Int) -> [RevisionID] {
        var result: [RevisionID] = []
        var current: Int? = index
        while let at = current, result.count <= revisions.count {
            result.append(revisions[at].id)
            current = revisions[at].parent
        }
        return result
    }
}
