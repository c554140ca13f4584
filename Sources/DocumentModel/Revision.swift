/// A revision id, `GENERATION-SUFFIX` (`3-9b2f…`).
///
/// Sofa derives the suffix as CouchDB does (`derive`), so identical edits made in Sofa and
/// in CouchDB, or on two replicas, get identical ids. Revisions from other servers keep
/// their own suffixes.
public struct RevisionID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let generation: Int
    public let suffix: String

    public init(generation: Int, suffix: String) {
        self.generation = generation
        self.suffix = RevisionID.asCouchDBWritesIt(suffix)
    }

    /// Parses `GEN-SUFFIX`; nil unless GEN is a positive decimal and SUFFIX is not empty.
    public init?(_ text: String) {
        guard let dash = text.firstIndex(of: "-"),
              let generation = Int(text[..<dash]), generation >= 1,
              text[..<dash].allSatisfy(\.isASCII),
              text.index(after: dash) < text.endIndex else { return nil }
        self.generation = generation
        self.suffix = RevisionID.asCouchDBWritesIt(String(text[text.index(after: dash)...]))
    }

    /// A suffix of 32 hex digits in capitals as CouchDB writes it back, in small letters: it
    /// keeps such a suffix as the 16 bytes it spells (`suffixBytes`), the same revision.
    static func asCouchDBWritesIt(_ suffix: String) -> String {
        let utf8 = suffix.utf8
        guard utf8.count == 32, utf8.contains(where: { $0 &- UInt8(ascii: "A") < 6 }),
              utf8.allSatisfy({ ASCII.hexValue($0) != nil }) else { return suffix }
        return suffix.lowercased()
    }

    /// Parses or throws `SofaError.invalidRevisionID`.
    public static func parse(_ text: String) throws(SofaError) -> RevisionID {
        guard let rev = RevisionID(text) else { throw .invalidRevisionID(text) }
        return rev
    }

    public var description: String { "\(generation)-\(suffix)" }

    /// CouchDB's order: by generation, then by the suffix's bytes as CouchDB keeps them
    /// (`suffixBytes`: 32 hex digits as 16 bytes, other suffixes, such as Couchbase Lite's 40
    /// digits, as text), so that the winner and the order of branches are CouchDB's. Suffixes
    /// of one length compare as their text (hex digits in small letters sort as their bytes).
    public static func < (lhs: RevisionID, rhs: RevisionID) -> Bool {
        if lhs.generation != rhs.generation { return lhs.generation < rhs.generation }
        let (left, right) = (lhs.suffix.utf8, rhs.suffix.utf8)
        if left.count == right.count { return left.lexicographicallyPrecedes(right) }
        return lhs.suffixBytes.lexicographicallyPrecedes(rhs.suffixBytes)
    }

    /// The id CouchDB gives a new revision with this content on top of `parent`
    /// (`couch_db:new_revid/1`): the MD5 of `[Deleted, OldStart, OldRev, Body, Atts]` in
    /// Erlang's term format, where OldRev is the parent's suffix as 16 bytes (as text when it
    /// is not 32 hex digits) or 0, Body the properties in their order, and Atts each
    /// attachment's `{Name, Type, MD5}` in the reverse of the revision's order. The same
    /// edit of the same parent so gets the same id in Sofa and in CouchDB.
    public static func derive(parent: RevisionID?, deleted: Bool, properties: JSONObject,
                              attachments: [RevisionAttachmentIdentity]) -> RevisionID {
        var term = CouchRevisionTerm()
        term.list(count: 5) { term, index in
            switch index {
            case 0: term.atom(deleted ? "true" : "false")
            case 1: term.integer(Int64(parent?.generation ?? 0))
            case 2:
                if let parent {
                    term.binary(parent.suffixBytes)
                } else {
                    term.integer(0)
                }
            case 3: term.object(properties)
            default:
                let reversed = Array(attachments.reversed())
                term.list(count: reversed.count) { term, index in
                    term.tuple(arity: 3)
                    term.binary(reversed[index].name.utf8)
                    term.binary(reversed[index].contentType.utf8)
                    term.binary(reversed[index].md5)
                }
            }
        }
        let digest = MessageDigest.hash(.md5, term.bytes)
        return RevisionID(generation: (parent?.generation ?? 0) + 1, suffix: BlobKey.hexString(digest))
    }

    /// The suffix as CouchDB keeps it (`couch_doc:parse_revid/1`): 32 hex digits as the 16
    /// bytes they spell, anything else as its text.
    var suffixBytes: [UInt8] {
        let utf8 = Array(suffix.utf8)
        guard utf8.count == 32 else { return utf8 }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        for index in stride(from: 0, to: 32, by: 2) {
            guard let high = ASCII.hexValue(utf8[index]), let low = ASCII.hexValue(utf8[index + 1]) else { return utf8 }
            bytes.append(high << 4 | low)
        }
        return bytes
    }
}

/// What a revision id says about one attachment: its name, type and the MD5 CouchDB keeps
/// for its body (of the stored bytes: gzip-compressed ones for the types CouchDB compresses).
public struct RevisionAttachmentIdentity: Hashable, Sendable {
    public let name: String
    public let contentType: String
    public let md5: [UInt8]

    public init(name: String, contentType: String, md5: [UInt8]) {
        self.name = name
        self.contentType = contentType
        self.md5 = md5
    }
}

/// One revision in a document's tree.
public struct RevisionNode: Hashable, Sendable {
    public let id: RevisionID
    /// The parent id, or nil for a root (or when history above was pruned).
    public let parent: RevisionID?
    public let deleted: Bool
    public let isLeaf: Bool

    public init(id: RevisionID, parent: RevisionID?, deleted: Bool, isLeaf: Bool) {
        self.id = id
        self.parent = parent
        self.deleted = deleted
        self.isLeaf = isLeaf
    }
}

/// A document's revision tree: every known revision with its parent.
///
/// The winner follows CouchDB so that all replicas agree: a live leaf beats a
/// deleted one, then the higher generation wins, then the higher suffix.
public struct RevisionTree: Sendable {
    public let nodes: [RevisionID: RevisionNode]

    public init(_ nodes: [RevisionNode]) {
        self.nodes = Dictionary(nodes.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
    }

    public var leaves: [RevisionNode] { nodes.values.filter(\.isLeaf).sorted(by: RevisionTree.winsOver) }

    /// The current revision; nil only for an empty tree.
    public var winner: RevisionNode? { leaves.first }

    /// Live leaves other than the winner: the document's conflicts.
    public var conflicts: [RevisionNode] { leaves.dropFirst().filter { !$0.deleted } }

    public func contains(_ id: RevisionID) -> Bool { nodes[id] != nil }

    /// `id` and its known ancestors, newest first.
    public func history(of id: RevisionID) -> [RevisionID] {
        var result: [RevisionID] = []
        var current: RevisionID? = id
        while let rev = current, let node = nodes[rev], result.count <= nodes.count {
            result.append(rev)
            current = node.parent
        }
        return result
    }

    /// The revisions to forget so that at most `limit` generations stay behind every leaf.
    public func revisionsBeyond(limit: Int) -> [RevisionID] {
        var keep = Set<RevisionID>()
        for leaf in nodes.values where leaf.isLeaf {
            keep.formUnion(history(of: leaf.id).prefix(limit))
        }
        return nodes.keys.filter { !keep.contains($0) }.sorted()
    }

    /// Whether `a` beats `b` for the winner: live first, then higher revision id.
    public static func winsOver(_ a: RevisionNode, _ b: RevisionNode) -> Bool {
        if a.deleted != b.deleted { return !a.deleted }
        return b.id < a.id
    }
}
