import DocumentModel
import Foundation

/// What `_revs_diff` answers for one document: the asked revisions not here, and the
/// leaves here that may be their ancestors.
public struct MissingRevisions: Hashable, Sendable {
    public let missing: [RevisionID]
    /// Leaves of lower generation than the newest missing revision (CouchDB's rule).
    public let possibleAncestors: [RevisionID]
    /// When `possibleAncestors` is empty though the document is here (edited on both sides
    /// since they last met: its leaves are as new as the missing revisions), the leaves and
    /// their latest ancestors, one of which the missing revisions may descend from. Not part of
    /// `_revs_diff`'s answer: a pull gives them as `atts_since`, so that the attachments of the
    /// common ancestor come as stubs instead of travelling again.
    public let heldRevisions: [RevisionID]

    public init(missing: [RevisionID], possibleAncestors: [RevisionID], heldRevisions: [RevisionID] = []) {
        self.missing = missing
        self.possibleAncestors = possibleAncestors
        self.heldRevisions = heldRevisions
    }

    /// How many ancestors of each leaf `heldRevisions` lists.
    static let heldGenerations = 10
}

/// A revision that a replication could not carry, with the reason the peer gave
/// (`forbidden`, `missing_stub`, `not_found`…) or Sofa's own.
public struct DocumentFailure: Error, Hashable, Sendable, CustomStringConvertible {
    public let docID: String
    public let rev: String?
    public let error: String
    public let reason: String

    public init(docID: String, rev: String?, error: String, reason: String) {
        self.docID = docID
        self.rev = rev
        self.error = error
        self.reason = reason
    }

    public var description: String { "\(docID)\(rev.map { " \($0)" } ?? ""): \(error): \(reason)" }

    public var json: JSONValue {
        ["id": .string(docID), "rev": rev.map { .string($0) } ?? .null, "error": .string(error), "reason": .string(reason)]
    }
}

/// The database as one side of a replication: the questions CouchDB's protocol asks of a
/// target. The server's `_revs_diff` and `_bulk_docs?new_edits=false` and the replicator's
/// local peer both answer with these, so they cannot disagree.
extension Database {
    /// The revision tree of `id`, or nil if the document was never here. Other errors throw.
    func revisionTreeIfAny(of id: String) throws -> RevisionTree? {
        do { return try revisionTree(of: id) } catch SofaError.documentNotFound { return nil }
    }

    /// CouchDB's `_revs_diff`: for each document, the revisions asked for that are not here.
    /// Documents with nothing missing are left out; the order asked in is kept.
    /// For each document of `ids` that is here, its revision tree and current revision, read
    /// in one snapshot: what a server answers a Couchbase Lite `proposeChanges` with.
    public func treesAndCurrentRevisions(of ids: [String]) throws -> [String: (tree: RevisionTree, current: RevisionID, deleted: Bool)] {
        try read { connection in
            var found: [String: (tree: RevisionTree, current: RevisionID, deleted: Bool)] = [:]
            for id in ids where found[id] == nil {
                guard let row = try Database.documentRow(id, in: connection) else { continue }
                found[id] = (try Database.loadTree(docKey: row.key, in: connection), row.current, row.deleted)
            }
            return found
        }
    }

    /// Read in one snapshot.
    public func revsDiff(_ asked: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        try read { connection in try revsDiff(asked, in: connection) }
    }

    private func revsDiff(_ asked: [(id: String, revs: [RevisionID])], in connection: SQLiteConnection) throws
        -> [(id: String, missing: MissingRevisions)] {
        try asked.compactMap { id, revs in
            let tree = try Database.documentRow(id, in: connection).map { try Database.loadTree(docKey: $0.key, in: connection) }
            let missing = revs.filter { !(tree?.contains($0) ?? false) }
            guard let highest = missing.map(\.generation).max() else { return nil }
            let ancestors = tree?.leaves.filter { $0.id.generation < highest }.map(\.id).sorted() ?? []
            var held: [RevisionID] = []
            if let tree, ancestors.isEmpty {
                var seen = Set<RevisionID>()
                for leaf in tree.leaves {
                    held += tree.history(of: leaf.id).prefix(MissingRevisions.heldGenerations).filter { seen.insert($0).inserted }
                }
            }
            return (id, MissingRevisions(missing: missing, possibleAncestors: ancestors, heldRevisions: held))
        }
    }

    /// The attachments a replicated revision's stubs may refer to: by name, from the nearest
    /// ancestor of `ancestors` (parent first) that is stored here with its attachments, then
    /// from the document's leaves for names no ancestor has.
    ///
    /// CouchDB's rule for a stub is "the attachment of that name in the revision this one
    /// follows"; a stub whose name is found nowhere is a `missing_stub`.
    public func attachmentsForStubs(of id: String, ancestors: [RevisionID]) throws -> [String: Attachment] {
        guard let tree = try revisionTreeIfAny(of: id) else { return [:] }
        var result: [String: Attachment] = [:]
        // Farthest first, so nearer revisions overwrite: leaves, then ancestors from the root side.
        let candidates = tree.leaves.map(\.id) + ancestors.filter(tree.contains).reversed()
        for rev in candidates {
            let revision: Revision
            do { revision = try self.revision(rev, of: id) } catch SofaError.revisionNotFound { continue }
            for attachment in revision.attachments { result[attachment.name] = attachment }
        }
        return result
    }

    /// A body here for an incoming attachment's metadata, without transferring it, and the
    /// digest that describes it as stored: the same attachment in an ancestor stored here
    /// (same name and revpos: CouchDB's identity of an unchanged attachment), or any body
    /// known under the incoming digest.
    public func localBody(for attachment: Attachment, ancestorsAttachments: [String: Attachment]) throws
        -> (blob: StoredBlob, digest: String)? {
        if attachment.revpos > 0, let known = ancestorsAttachments[attachment.name], known.revpos == attachment.revpos,
           known.length == attachment.length, let key = known.blobKey, blobs.contains(key) {
            return (StoredBlob(key: key, length: known.length), known.digest)
        }
        guard !attachment.digest.isEmpty, let blob = try storedBody(digest: attachment.digest), blob.length == attachment.length else {
            return nil
        }
        let asStored = try read { connection in
            try connection.query("SELECT digest FROM rev_attachments WHERE blob_key = ? LIMIT 1", .text(blob.key.hex)) { $0.text(0) }
        }
        return (blob, asStored.first ?? blob.key.digestString)
    }
}

extension Database {
    /// Version 1 stored a body that came gzip-encoded from CouchDB decoded, but kept CouchDB's
    /// digest of the gzip form on the attachment; sending that digest with the decoded bytes
    /// is refused by CouchDB (`500 function_clause`). When such a database is upgraded, each
    /// MD5-named body of a type CouchDB compresses is hashed once: the attachment takes the
    /// digest of its stored bytes, and CouchDB's name stays known as an alias.
    /// Returns how many bodies were renamed.
    @discardableResult
    func upgradeDigestsFromVersion1() throws -> Int {
        let rows = try read { connection in
            try connection.query("""
                SELECT DISTINCT digest, blob_key FROM rev_attachments
                WHERE digest LIKE 'md5-%' AND blob_key IS NOT NULL
                  AND (content_type LIKE 'text/%' OR content_type LIKE '%json%' OR content_type LIKE '%javascript%'
                       OR content_type LIKE '%xml%')
                """) { ($0.text(0), $0.text(1)) }
        }
        var renamed = 0
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        for (digest, hex) in rows {
            guard let key = BlobKey(hex: hex), blobs.contains(key) else { continue }
            let reader = try blobs.openReader(key)
            let md5 = MessageDigest(.md5)
            while case let count = try reader.read(into: buffer), count > 0 {
                md5.update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
            }
            let stored = "md5-" + Data(md5.finalize()).base64EncodedString()
            guard stored != digest else { continue }
            try write { connection in
                try connection.run("UPDATE rev_attachments SET digest = ? WHERE digest = ? AND blob_key = ?",
                                   .text(stored), .text(digest), .text(hex))
                try recordAlias(digest, of: key, in: connection)
            }
            renamed += 1
        }
        return renamed
    }
}
