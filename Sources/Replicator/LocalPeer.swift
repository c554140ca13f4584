import DocumentModel
import DocumentStore
import Foundation

/// A Sofa database as a replication peer. As a target it keeps bodies it already has
/// (by ancestry or digest), downloads the others its policy allows, and leaves the rest
/// deferred (metadata only, fetched when read).
final class LocalPeer: ReplicationPeer {
    let database: Database
    var downloads: DownloadPolicy
    /// The `_rev` of each checkpoint document, once read (then taken from each save).
    private var checkpointRevs: [String: String?] = [:]
    /// Changes left after the last page read (for progress).
    private var pendingChanges: Int?

    init(_ database: Database, downloads: DownloadPolicy = DownloadPolicy()) {
        self.database = database
        self.downloads = downloads
    }

    var name: String { database.path }

    func changes(since: JSONValue, limit: Int, filter: ReplicationFilter) throws -> ChangeBatch {
        guard filter.channels == nil else { throw SofaError.invalidArgument("channels filter only pulls from a Sync Gateway") }
        let from = since.int64Value ?? since.stringValue.flatMap { Int64($0) } ?? 0
        let page = try database.changes(since: from, limit: limit)
        let function = try filter.function.map { try DesignFilter(named: $0, in: database) }
        let request = DesignFilter.localRequest(databaseName: database.validationName, query: filter.queryParameters)
        var changes: [PeerChange] = []
        for change in page {
            if let ids = filter.docIDs, !ids.contains(change.docID) { continue }
            if let function, try !function.passes(database.revision(change.revID, of: change.docID), in: database, request: request) {
                continue
            }
            if let selector = filter.selector {
                let revision = try database.revision(change.revID, of: change.docID)
                var document = revision.properties
                document["_id"] = .string(change.docID)
                if revision.deleted { document["_deleted"] = true }
                guard selector.matches(document) else { continue }
            }
            let leaves = try database.revisionTree(of: change.docID).leaves.map(\.id)
            changes.append(PeerChange(sequence: .integer(change.sequence), docID: change.docID, revs: leaves))
        }
        // What is left: counted once, then told down page by page (a count per page would read
        // the whole rest of the index each time).
        let left = try pendingChanges.map { $0 - page.count } ?? database.changeCount(since: from) - page.count
        pendingChanges = max(0, left)
        return ChangeBatch(changes: changes, lastSequence: .integer(page.last?.sequence ?? from), isLast: page.count < limit,
                           pending: pendingChanges)
    }

    func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        try database.revsDiff(revs)
    }

    func revisions(_ wanted: [(id: String, rev: RevisionID)], bodies: BodyRequest?) throws
        -> [Result<ReplicatedRevision, DocumentFailure>] {
        try wanted.map { id, rev in
            let revision: Revision
            let tree: RevisionTree
            do {
                revision = try database.revision(rev, of: id)
                tree = try database.revisionTree(of: id)
            } catch SofaError.revisionNotFound, SofaError.documentNotFound {
                // Compacted away between the changes feed and now: the next run sends what replaced it.
                return .failure(DocumentFailure(docID: id, rev: rev.description, error: "not_found",
                                                reason: "the revision is no longer stored here"))
            }
            return .success(ReplicatedRevision(docID: id, revID: rev, ancestors: Array(tree.history(of: rev).dropFirst()),
                                               deleted: revision.deleted, properties: revision.properties,
                                               attachments: revision.attachments))
        }
    }

    /// Every body, when the policy downloads them all: they then come in the requests that
    /// bring the revisions. A policy that leaves some on the server asks for each it wants.
    func bodyRequest(for missing: [(id: String, missing: MissingRevisions)]) -> BodyRequest? {
        guard downloads.enabled, downloads.maximumSize == nil, downloads.types.isEmpty else { return nil }
        // The revisions the server may share with this database: its bodies of their
        // attachments stay here (as stubs), also after edits on both sides.
        return BodyRequest(blobs: database.blobs,
                           attsSince: Dictionary(missing.map { ($0.id, $0.missing.possibleAncestors + $0.missing.heldRevisions) },
                                                 uniquingKeysWith: { $0 + $1 }))
    }

    func fetchBody(of attachment: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String) {
        guard let key = attachment.blobKey, database.blobs.contains(key) else {
            throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
        }
        if let path = database.contentPath(of: attachment) {
            return (try blobs.write(contentsOf: path, expecting: key), attachment.digest)
        }
        // Sealed in an encrypted database: read through its store, sealed again by the other's.
        let reader = try database.openContent(of: attachment, docID: docID)
        let writer = try blobs.makeWriter()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while case let count = try reader.read(into: buffer), count > 0 {
            try writer.write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
        }
        return (try writer.finish(expecting: key), attachment.digest)
    }

    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader {
        try database.openContent(of: attachment, docID: docID)
    }

    func write(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions], from source: ReplicationPeer,
               result: inout ReplicationResult) throws -> [DocumentFailure] {
        var failures: [DocumentFailure] = []
        var ready: [(revision: ReplicatedRevision, fetched: [StoredBlob])] = []
        // Bodies this run wrote, which a document that does not fit takes away: those fetched
        // here and those that arrived with the revisions.
        let started = revisions.flatMap { $0.arrivedBodies.values.map(\.since) }.min() ?? Date()
        for revision in revisions {
            var fetched: [StoredBlob] = []
            do {
                ready.append((try withBodies(revision, from: source, result: &result, fetched: &fetched), fetched))
            } catch let error as SofaError where !error.isEnvironmental {
                failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: "invalid",
                                                reason: "\(error)"))
            } catch let error as SofaError where error.isDiskFull {
                // This document does not fit: the ones that do go on (they may be small), the
                // checkpoint stays before it, and the bodies it brought go at once.
                failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: "disk_full",
                                                reason: "\(error)"))
                try database.removeUnreferencedBlobs(fetched.map(\.key), writtenSince: started)
            }
        }
        // Bodies that came with the revisions are made durable before anything refers to them.
        try database.blobs.sync(revisions.flatMap { $0.arrivedBodies.values.map(\.blob.key) })
        // One transaction for the batch; a revision this database refuses (an invalid id or
        // body) is left out and named, the others are saved.
        do {
            var refused: [DocumentFailure] = []
            var written = 0
            try database.inBatch { batch in
                (refused, written) = ([], 0)  // a retried batch counts again
                for (revision, _) in ready {
                    do {
                        if try batch.insert(revision) { written += 1 }
                    } catch let error as SofaError where !error.isEnvironmental {
                        refused.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: error.failureName,
                                                       reason: "\(error)"))
                    }
                }
            }
            failures += refused
            result.docsWritten += written
        } catch let error as SofaError where error.isDiskFull && ready.count > 1 {
            // No room for the batch's rows: each document on its own, so that those that fit are kept.
            for (revision, fetched) in ready {
                do {
                    try database.inBatch { batch in if try batch.insert(revision) { result.docsWritten += 1 } }
                } catch let error as SofaError where !error.isEnvironmental || error.isDiskFull {
                    failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description,
                                                    error: error.isDiskFull ? "disk_full" : error.failureName, reason: "\(error)"))
                    if error.isDiskFull { try database.removeUnreferencedBlobs(fetched.map(\.key), writtenSince: started) }
                }
            }
        }
        return failures
    }

    /// Whether `attachment` is one an ancestor here has without its body (same name and revpos,
    /// CouchDB's identity of an unchanged attachment): an edit that keeps a deferred body
    /// never fetches it, whatever the download rules.
    private func isKeptDeferred(_ attachment: Attachment, ancestors: [String: Attachment]) -> Bool {
        guard attachment.revpos > 0, let known = ancestors[attachment.name] else { return false }
        return known.revpos == attachment.revpos && known.length == attachment.length && !known.contentAvailable
    }

    /// `revision` with each attachment's body: one here already, one fetched from `source`, or
    /// none (deferred) when the download policy says so.
    /// `fetched`: the bodies fetched for it so far, also when it fails.
    private func withBodies(_ revision: ReplicatedRevision, from source: ReplicationPeer,
                            result: inout ReplicationResult, fetched: inout [StoredBlob]) throws -> ReplicatedRevision {
        guard !revision.attachments.isEmpty else { return revision }
        let ancestors = try database.attachmentsForStubs(of: revision.docID, ancestors: revision.ancestors)
        var attachments: [Attachment] = []
        for attachment in revision.attachments {
            let body: (blob: StoredBlob, digest: String)
            let downloaded: Bool
            if let arrived = revision.arrivedBodies[attachment.name] {
                (body, downloaded) = ((arrived.blob, arrived.digest), true)
            } else if let here = try database.localBody(for: attachment, ancestorsAttachments: ancestors) {
                // Here already (an earlier revision, another document): it never travels again.
                (body, downloaded) = (here, false)
            } else if downloads.allows(attachment) && !isKeptDeferred(attachment, ancestors: ancestors) {
                (body, downloaded) = (try source.fetchBody(of: attachment, docID: revision.docID, rev: revision.revID, into: database.blobs), true)
            } else {
                result.attachmentsDeferred += 1
                attachments.append(attachment)
                continue
            }
            if downloaded {
                fetched.append(body.blob)
                result.attachmentsDownloaded += 1
                result.attachmentBytesDownloaded += body.blob.length
            }
            if !attachment.digest.isEmpty, attachment.digest != body.digest { try database.recordAlias(attachment.digest, of: body.blob.key) }
            attachments.append(attachment.withBody(body.blob, digest: body.digest))
        }
        return ReplicatedRevision(docID: revision.docID, revID: revision.revID, ancestors: revision.ancestors,
                                  deleted: revision.deleted, properties: revision.properties, attachments: attachments)
    }

    func checkpoint(_ id: String) throws -> JSONObject? {
        let document = try database.localDocument(withID: "_local/\(id)")
        checkpointRevs[id] = .some(document?.rev)
        return document?.body
    }

    func saveCheckpoint(_ id: String, _ body: JSONObject) throws {
        if checkpointRevs[id] == nil { _ = try checkpoint(id) }
        checkpointRevs[id] = .some(try database.replaceLocalDocument("_local/\(id)", body: body, after: checkpointRevs[id] ?? nil))
    }
}

extension Attachment {
    /// This attachment's metadata with a body that is here, under the digest of its stored bytes.
    func withBody(_ blob: StoredBlob, digest: String) -> Attachment {
        Attachment(name: name, contentType: contentType, length: blob.length, digest: digest, blobKey: blob.key,
                   revpos: revpos, contentAvailable: true)
    }
}

extension SofaError {
    /// Failures of the machine rather than of the document: worth stopping for.
    /// The error name a refused revision is reported with, as CouchDB names it.
    var failureName: String {
        switch self {
        case .forbidden: "forbidden"
        case .unauthorized: "unauthorized"
        case .designFunctionFailed(let error, _): error
        default: "invalid"
        }
    }

    var isDiskFull: Bool { if case .diskFull = self { true } else { false } }

    var isEnvironmental: Bool {
        switch self {
        case .diskFull, .readOnlyFileSystem, .io, .sqlite, .blobCorrupted: true
        default: false
        }
    }
}
