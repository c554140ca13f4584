import DocumentModel
import DocumentStore
import Foundation

/// A Couchbase Lite 3 database file (`NAME.cblite2`) as a replication peer. As a source: its
/// documents with every leaf, histories as its revision trees hold them, deletions, conflicts
/// and blobs (copied from its `Attachments/` folder by digest). As a target: revisions written
/// as LiteCore writes them (`CouchbaseLiteDatabase.insert`), their blob and attachment bodies
/// installed in `Attachments/` first. Its half of each checkpoint is kept by the Sofa database
/// of the replication (`checkpoints`), under the file's private UUID: nothing is written into
/// the file but documents, and a file replaced by another starts from its beginning.
final class CouchbaseLitePeer: ReplicationPeer {
    let database: CouchbaseLiteDatabase
    /// Where this file's checkpoints are kept.
    let checkpoints: LocalPeer
    /// The feed, read once: LiteCore keeps no index by sequence across its two tables.
    private var feed: [(sequence: Int64, id: String)]?

    init(_ database: CouchbaseLiteDatabase, checkpoints: LocalPeer) {
        self.database = database
        self.checkpoints = checkpoints
    }

    var name: String { database.path }

    func changes(since: JSONValue, limit: Int, filter: ReplicationFilter) throws -> ChangeBatch {
        guard filter.channels == nil, filter.function == nil else {
            throw SofaError.invalidArgument("a Couchbase Lite database file is read with --doc-ids or --selector filters only")
        }
        let from = since.int64Value ?? 0
        if feed == nil { feed = try database.sequences(after: from) }
        let all = feed ?? []
        let start = all.firstIndex { $0.sequence > from } ?? all.count
        let page = all[start..<min(all.count, start + limit)]
        var changes: [PeerChange] = []
        for entry in page {
            if let ids = filter.docIDs, !ids.contains(entry.id) { continue }
            guard let document = try database.document(entry.id) else { continue }  // gone since: an app purged it
            let tree = try database.revisionTree(of: document)
            if let selector = filter.selector {
                var body = try database.body(of: document.revID, in: document, tree: tree)?.properties ?? JSONObject()
                body["_id"] = .string(entry.id)
                if document.deleted { body["_deleted"] = true }
                guard selector.matches(body) else { continue }
            }
            changes.append(PeerChange(sequence: .integer(entry.sequence), docID: entry.id, revs: tree.tree.leaves.map(\.id)))
        }
        let last = page.last?.sequence ?? from
        return ChangeBatch(changes: changes, lastSequence: .integer(last), isLast: start + limit >= all.count,
                           pending: max(0, all.count - start - page.count))
    }

    func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        try database.revsDiff(revs)
    }

    func revisions(_ wanted: [(id: String, rev: RevisionID)], bodies: BodyRequest?) throws
        -> [Result<ReplicatedRevision, DocumentFailure>] {
        try wanted.map { id, rev in
            func failure(_ reason: String) -> Result<ReplicatedRevision, DocumentFailure> {
                .failure(DocumentFailure(docID: id, rev: rev.description, error: "not_found", reason: reason))
            }
            guard let document = try database.document(id) else { return failure("no longer in \(database.path)") }
            let tree: LiteCoreRevisionTree
            let read: (properties: JSONObject, deleted: Bool)?
            do {
                tree = try database.revisionTree(of: document)
                read = try database.body(of: rev, in: document, tree: tree)
            } catch let error as SofaError {
                return .failure(DocumentFailure(docID: id, rev: rev.description, error: "invalid", reason: "\(error)"))
            }
            guard let index = tree.index(of: rev), let (properties, deleted) = read else {
                return failure("\(database.path) keeps no body of this revision")
            }
            do {
                let (kept, attachments) = try Self.attachments(of: properties, docID: id, generation: rev.generation)
                return .success(ReplicatedRevision(docID: id, revID: rev, ancestors: Array(tree.history(of: index).dropFirst()),
                                                   deleted: deleted, properties: deleted ? JSONObject() : kept,
                                                   attachments: deleted ? [] : attachments))
            } catch let error as SofaError {
                return .failure(DocumentFailure(docID: id, rev: rev.description, error: "invalid", reason: "\(error)"))
            }
        }
    }

    /// The properties without `_attachments` and CouchDB's other special keys, and the
    /// bodies they name: each entry of `_attachments` (a Couchbase Lite 1.x-style attachment)
    /// and each blob dictionary (`"@type": "blob"`), named by its SHA-1 digest.
    static func attachments(of properties: JSONObject, docID: String, generation: Int) throws -> (JSONObject, [Attachment]) {
        var kept = properties
        for key in ["_id", "_rev", "_deleted", "_revisions", "_attachments"] { kept[key] = nil }
        var attachments: [Attachment] = []
        for (name, value) in properties["_attachments"]?.objectValue ?? [:] {
            guard let metadata = value.objectValue, let digest = metadata["digest"]?.stringValue, BlobKey(digestString: digest) != nil else {
                throw SofaError.invalidDocument(reason: "\(docID): attachment \(name) has no SHA-1 digest")
            }
            attachments.append(Attachment(name: name, contentType: metadata["content_type"]?.stringValue ?? MIMEType.forFileName(name),
                                          length: metadata["length"]?.int64Value ?? -1, digest: digest, blobKey: nil,
                                          revpos: metadata["revpos"]?.int64Value.map(Int.init) ?? generation))
        }
        let named = Set(attachments.map(\.digest))
        for blob in try Blobs.find(in: kept, docID: docID, lenient: true) where !named.contains(blob.key.digestString) {
            attachments.append(Attachment(name: blob.standInName, contentType: blob.contentType ?? MIMEType.fallback,
                                          length: blob.length ?? -1, digest: blob.key.digestString, blobKey: nil, revpos: generation))
        }
        return (kept, attachments)
    }

    func bodyRequest(for missing: [(id: String, missing: MissingRevisions)]) -> BodyRequest? { nil }

    func fetchBody(of attachment: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String) {
        guard let key = attachment.blobKey ?? BlobKey(digestString: attachment.digest) else {
            throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
        }
        let file = database.blobPath(key)
        guard access(file, F_OK) == 0 else {
            throw SofaError.invalidDocument(reason: "\(docID): the body of \(attachment.name) (\(attachment.digest)) is missing from \(database.path)/Attachments")
        }
        do {
            // Both stores are content-addressed and never change a body in place: on one file
            // system the body is shared by a hard link instead of copied (checked all the same).
            if let linked = try? blobs.adopt(fileAt: file, keepingOriginal: true), linked.key == key {
                return (linked, attachment.digest)
            }
            return (try blobs.write(contentsOf: file, expecting: key), attachment.digest)
        } catch SofaError.blobCorrupted {
            throw SofaError.invalidDocument(reason: "\(docID): \(file) does not hold \(attachment.name): its SHA-1 is not \(attachment.digest)")
        }
    }

    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader {
        throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
    }

    func write(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions], from source: ReplicationPeer,
               result: inout ReplicationResult) throws -> [DocumentFailure] {
        var failures: [DocumentFailure] = []
        var ready: [CouchbaseLiteDatabase.IncomingRevision] = []
        for revision in revisions {
            do {
                ready.append(try incoming(revision, from: source))
            } catch let error as SofaError where !error.isEnvironmental {
                failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: error.failureName,
                                                reason: "\(error)"))
            }
        }
        result.docsWritten += try database.insert(ready)
        return failures
    }

    /// A revision as Couchbase Lite keeps it, its bodies installed: blob dictionaries as they
    /// are, other attachments in `_attachments` named by SHA-1 (LiteCore finds bodies by it).
    private func incoming(_ revision: ReplicatedRevision, from source: ReplicationPeer) throws
        -> CouchbaseLiteDatabase.IncomingRevision {
        for id in [revision.revID] + revision.ancestors where !CouchbaseLiteDatabase.canStore(id) {
            throw SofaError.invalidArgument("revision \(id) cannot be stored by Couchbase Lite (its ids end in an even number of hex digits)")
        }
        var body = revision.properties
        var stubs = JSONObject()
        for attachment in revision.attachments where !revision.deleted {
            guard attachment.contentAvailable, let key = attachment.blobKey else {
                throw SofaError.invalidArgument(
                    "the body of \(attachment.name) is not here (left on a server): `sofa download` fetches it, then copy again")
            }
            // A plain body of a Sofa database on the same file system is shared by a hard link.
            let local = (source as? LocalPeer).flatMap { $0.database.contentPath(of: attachment) }
            if local.map({ database.linkBlob(key, from: $0) }) != true {
                try database.installBlob(key, from: try source.openBody(of: attachment, docID: revision.docID))
            }
            if attachment.name.hasPrefix("blob_/") { continue }  // a blob: its dictionary is in the properties
            stubs[attachment.name] = ["content_type": .string(attachment.contentType), "digest": .string(key.digestString),
                                      "length": .integer(attachment.length), "revpos": .integer(Int64(attachment.revpos)), "stub": true]
        }
        if !stubs.isEmpty { body["_attachments"] = .object(stubs) }
        return CouchbaseLiteDatabase.IncomingRevision(docID: revision.docID, revID: revision.revID, ancestors: revision.ancestors,
                                                      deleted: revision.deleted, body: body)
    }

    private func key(_ id: String) throws -> String { "couchbase-lite-\(try database.privateUUID)-\(id)" }

    func checkpoint(_ id: String) throws -> JSONObject? { try checkpoints.checkpoint(try key(id)) }

    func saveCheckpoint(_ id: String, _ body: JSONObject) throws { try checkpoints.saveCheckpoint(try key(id), body) }
}
