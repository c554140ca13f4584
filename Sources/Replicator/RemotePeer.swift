import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// A CouchDB-compatible database over HTTP as a replication peer (CouchDB 2.x/3.x,
/// PouchDB Server, Sync Gateway, `sofa serve`).
final class RemotePeer: ReplicationPeer {
    let client: HTTPClient
    /// Told every half second while a body arrives.
    var bodyProgress: ((BodyProgress) -> Void)?
    private let log = Logger(label: "sofa.replicate")
    /// Servers without `_bulk_get` (CouchDB before 2.2, some gateways) answer 404, 405 or 400.
    private var bulkGetUnsupported = false
    /// Whether the server answers `_bulk_get` in `multipart/mixed` (nil: not asked yet).
    private var bulkGetMultipart: Bool?
    /// Connections of the parts of a `_bulk_get` fetched at once beside `client`'s, kept between pages.
    private var fetchClients: [HTTPClient] = []
    /// Connections of pushes' parallel uploads beside `client`'s, kept between pages.
    private var uploadClients: [HTTPClient] = []
    /// The `_rev` of each checkpoint document, once known (read once, then taken from each PUT's answer).
    private var checkpointRevs: [String: String?] = [:]

    init(client: HTTPClient) {
        self.client = client
    }

    var name: String { client.remote.url }

    // MARK: - As a source

    func changes(since: JSONValue, limit: Int, filter: ReplicationFilter) throws -> ChangeBatch {
        var path = "_changes?feed=normal&style=all_docs&limit=\(limit)&since=\(RemotePeer.sequenceParameter(since))"
        var body: JSONValue?
        if let docIDs = filter.docIDs {
            path += "&filter=_doc_ids"
            body = ["doc_ids": .array(docIDs.map { .string($0) })]
        } else if let selector = filter.selector {
            path += "&filter=_selector"
            body = ["selector": .object(selector.json)]
        } else if let function = filter.function {
            let allowed = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-_.~"))
            func encoded(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text }
            path += "&filter=" + function.split(separator: "/", maxSplits: 1).map { encoded(String($0)) }.joined(separator: "/")
            for (name, value) in filter.queryParameters.sorted(by: { $0.key < $1.key }) { path += "&\(encoded(name))=\(encoded(value))" }
        } else if let channels = filter.channels {
            let list = channels.joined(separator: ",")
            path += "&filter=sync_gateway/bychannel&channels="
                + (list.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: ",-_."))) ?? "")
        }
        let (_, answer) = try client.json(body == nil ? "GET" : "POST", path, body)
        guard let rows = answer["results"]?.arrayValue, let lastSeq = answer["last_seq"] else {
            throw ReplicationError.protocolError("_changes without results and last_seq")
        }
        let changes = rows.compactMap { row -> PeerChange? in
            guard let id = row["id"]?.stringValue, !DocumentID.isLocal(id) else { return nil }
            let revs = (row["changes"]?.arrayValue ?? []).compactMap { $0["rev"]?.stringValue.flatMap(RevisionID.init) }
            return PeerChange(sequence: row["seq"] ?? lastSeq, docID: id, revs: revs)
        }
        return ChangeBatch(changes: changes, lastSequence: lastSeq, isLast: rows.count < limit,
                           pending: answer["pending"]?.int64Value.map { Int($0) })
    }

    /// `since=` as CouchDB wants it: numbers bare, opaque strings verbatim.
    static func sequenceParameter(_ seq: JSONValue) -> String {
        switch seq {
        case .string(let text): text.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed.subtracting(CharacterSet(charactersIn: "&+="))) ?? text
        default: seq.jsonString()
        }
    }

    func revisions(_ wanted: [(id: String, rev: RevisionID)], bodies: BodyRequest?) throws -> [Result<ReplicatedRevision, DocumentFailure>] {
        if let bodies, !bulkGetUnsupported, bulkGetMultipart != false, let results = try revisionsWithBodies(wanted, bodies) {
            return results
        }
        return try fetchDocuments(wanted).map { entry in
            guard let document = entry["ok"] else { return .failure(.notGiven(entry["error"])) }
            return RemotePeer.revisionResult(document)
        }
    }

    /// A revision as the source sent it, or why it cannot be taken.
    static func revisionResult(_ json: JSONValue) -> Result<ReplicatedRevision, DocumentFailure> {
        do {
            return .success(try replicatedRevision(try IncomingDocument(json)))
        } catch {
            return .failure(DocumentFailure(docID: json["_id"]?.stringValue ?? "?", rev: json["_rev"]?.stringValue,
                                            error: "invalid", reason: "\(error)"))
        }
    }

    /// A revision as the source sent it, attachments as metadata only.
    static func replicatedRevision(_ document: IncomingDocument) throws -> ReplicatedRevision {
        guard let id = document.id, let rev = document.rev else {
            throw CouchFormatError("bad_request", "a document without _id or _rev")
        }
        return ReplicatedRevision(docID: id, revID: rev, ancestors: document.ancestors, deleted: document.deleted,
                                  properties: document.properties,
                                  attachments: (document.attachments ?? []).map { $0.metadata(of: rev) })
    }

    /// The revisions and the bodies they carry in one `_bulk_get` per batch, `multipart/mixed`
    /// with `attachments=true` (bodies the target has, by `atts_since`, stay as stubs), streamed
    /// into the blob store as they arrive. Nil when the server answers in JSON instead (it
    /// would inline every body in base64): the revisions are then read without bodies, which
    /// the target asks for one by one.
    private func revisionsWithBodies(_ wanted: [(id: String, rev: RevisionID)], _ bodies: BodyRequest) throws
        -> [Result<ReplicatedRevision, DocumentFailure>]? {
        // Split in parts fetched at once, each on a connection of its own, once the server
        // has shown that it answers in multipart.
        let parts = bulkGetMultipart == true ? min(ReplicatorTuning.bulkGetsInFlight, max(1, wanted.count / 16)) : 1
        while fetchClients.count < parts - 1 { fetchClients.append(try client.sibling()) }
        let clients = [client] + fetchClients.prefix(parts - 1)
        let size = (wanted.count + parts - 1) / parts
        let slices = stride(from: 0, to: wanted.count, by: size).map { Array(wanted[$0..<min($0 + size, wanted.count)]) }
        let outcomes = Locked([Result<[Result<ReplicatedRevision, DocumentFailure>], any Error>?](repeating: nil, count: slices.count))
        runConcurrently(slices.count) { [self] index in
            let outcome = Result { try bulkGetWithBodies(slices[index], bodies, on: clients[index]) }
            outcomes.withLock { $0[index] = outcome }
        }
        do {
            let results = try outcomes.withLock { $0 }.flatMap { try $0!.get() }
            bulkGetMultipart = true
            return results
        } catch is BulkGetNotMultipart {
            log.info("\(name) answers _bulk_get in JSON only; attachment bodies come one by one")
            bulkGetMultipart = false
            return nil
        } catch ReplicationError.http(let status, _, _, _) where [400, 404, 405].contains(status) {
            log.info("\(name) has no _bulk_get (HTTP \(status)); fetching revisions one by one")
            bulkGetUnsupported = true
            return nil
        }
    }

    /// One `_bulk_get` with bodies, retried while failures may pass.
    private func bulkGetWithBodies(_ wanted: [(id: String, rev: RevisionID)], _ bodies: BodyRequest, on client: HTTPClient) throws
        -> [Result<ReplicatedRevision, DocumentFailure>] {
        let docs = wanted.map { id, rev -> JSONValue in
            var entry: JSONObject = ["id": .string(id), "rev": .string(rev.description)]
            if let since = bodies.attsSince[id], !since.isEmpty { entry["atts_since"] = .array(since.map { .string($0.description) }) }
            return .object(entry)
        }
        let request = JSONValue.object(["docs": .array(docs)]).serialized()
        let url = client.remote.url("_bulk_get?revs=true&latest=true&attachments=true&att_encoding_info=true")
        let results = try client.withRetry { () -> [Result<ReplicatedRevision, DocumentFailure>] in
            let reader = BulkGetReader(wanted: wanted, blobs: bodies.blobs, bodyProgress: bodyProgress)
            let answer = try client.send("POST", url, headers: ["Accept": "multipart/mixed", "Content-Type": "application/json"],
                                         body: BytesUpload(request)) { bytes, status, headers in
                guard status < 300 else { return false }
                if !reader.isStarted, !reader.start(contentType: headers["content-type"] ?? "") { throw BulkGetNotMultipart() }
                try reader.feed(bytes)
                return true
            }
            guard answer.status < 300 else { throw client.httpError(answer, url: url) }
            return try reader.finish()
        }
        return results
    }

    /// The requested revisions as `{"ok": doc}` / `{"error": …}` entries: one `_bulk_get`,
    /// or, where the server lacks it, `GET doc?open_revs=[rev]&revs=true&latest=true` each.
    private func fetchDocuments(_ wanted: [(id: String, rev: RevisionID)]) throws -> [JSONValue] {
        if !bulkGetUnsupported {
            let request: JSONValue = ["docs": .array(wanted.map { ["id": .string($0.id), "rev": .string($0.rev.description)] })]
            do {
                let (_, answer) = try client.json("POST", "_bulk_get?revs=true&latest=true&attachments=false", request)
                return (answer["results"]?.arrayValue ?? []).flatMap { $0["docs"]?.arrayValue ?? [] }
            } catch ReplicationError.http(let status, _, _, _) where [400, 404, 405].contains(status) {
                log.info("\(name) has no _bulk_get (HTTP \(status)); fetching revisions one by one")
                bulkGetUnsupported = true
            }
        }
        return try wanted.flatMap { id, rev -> [JSONValue] in
            let revs = JSONValue.array([.string(rev.description)]).jsonString()
            let query = "open_revs=\(revs.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? revs)&revs=true&latest=true"
            let (_, answer) = try client.json("GET", "\(percentEncodedPathSegment(id))?\(query)")
            return answer.arrayValue ?? []
        }
    }

    /// Streams one body into the blob store, retried while failures may pass. CouchDB's MD5
    /// digests cover the bytes as it stores them (gzip for `text/*`), so the body is asked for
    /// as stored, checked, and decoded on the way in; the digest returned is the MD5 of the
    /// decoded bytes (or the `sha1-` digest it came with).
    func fetchBody(of attachment: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String) {
        try client.withRetry { try download(attachment, docID: docID, rev: rev, into: blobs) }
    }

    private func download(_ stub: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String) {
        let name = stub.name.split(separator: "/", omittingEmptySubsequences: false).map { percentEncodedPathSegment(String($0)) }.joined(separator: "/")
        let url = client.remote.url("\(percentEncodedPathSegment(docID))/\(name)?rev=\(rev)")
        var body: IncomingBody?
        var lastReport = Date()
        do {
            let answer = try client.send("GET", url, headers: ["Accept": "*/*", "Accept-Encoding": "gzip"]) { [bodyProgress] bytes, status, headers in
                guard status < 300 else { return false }
                if body == nil { body = try IncomingBody(blobs: blobs, gzip: headers["content-encoding"]?.lowercased() == "gzip") }
                if let bodyProgress, Date().timeIntervalSince(lastReport) >= 0.5 {
                    lastReport = Date()
                    bodyProgress(BodyProgress(digest: stub.digest, docID: docID, name: stub.name, present: body?.length ?? 0,
                                              length: stub.length, fetching: true))
                }
                try body?.write(bytes)
                return true
            }
            guard answer.status < 300 else { throw client.httpError(answer, url: url) }
            // Checked before the blob is installed: a body that fails its digest is never stored.
            let received = try body ?? IncomingBody(blobs: blobs, gzip: false)
            body = nil
            return try received.finish(claimedDigest: stub.digest, claimedLength: stub.length)
        } catch let mismatch as IncomingBodyMismatch {
            throw ReplicationError.protocolError("attachment \(stub.name) of \(docID): \(mismatch)")
        } catch {
            body?.cancel()
            throw error
        }
    }

    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader {
        throw SofaError.invalidArgument("Sofa replicates between a local database and a remote one, not between two remote databases")
    }

    // MARK: - As a target

    func bodyRequest(for missing: [(id: String, missing: MissingRevisions)]) -> BodyRequest? { nil }

    func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        guard !revs.isEmpty else { return [] }
        let request = JSONValue.object(JSONObject(revs.map { ($0.id, JSONValue.array($0.revs.map { .string($0.description) })) }))
        let (_, diff) = try client.json("POST", "_revs_diff", request)
        guard case .object(let answer) = diff else { throw ReplicationError.protocolError("_revs_diff did not answer an object") }
        return answer.map { id, entry in
            func revisions(_ key: String) -> [RevisionID] {
                (entry[key]?.arrayValue ?? []).compactMap { $0.stringValue.flatMap(RevisionID.init) }
            }
            return (id, MissingRevisions(missing: revisions("missing"), possibleAncestors: revisions("possible_ancestors")))
        }
    }

    func write(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions], from source: ReplicationPeer,
               result: inout ReplicationResult) throws -> [DocumentFailure] {
        let held = try ancestorsHeld(revisions, missing: missing)
        var failures: [DocumentFailure] = []
        var inline: [(revision: ReplicatedRevision, rendered: CouchFormat.Rendered)] = []
        var uploads: [Upload] = []
        for revision in revisions {
            var options = CouchFormat.Options()
            options.revisions = true
            options.bodies = .follows
            options.attsSince = (missing[revision.docID]?.possibleAncestors ?? []) + (held[revision.docID] ?? [])
            let history = [revision.revID] + revision.ancestors
            let rendered = try CouchFormat.render(revision, history: history, options: options, readBody: { _ in [] })
            // A body the target lacks and this machine never downloaded cannot go; say so rather
            // than send a stub the target will refuse.
            if let absent = rendered.absent.first {
                failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: "body_not_here",
                                                reason: "the body of attachment \(absent.name) was never downloaded here (sofa download fetches it)"))
                continue
            }
            if rendered.following.allSatisfy({ $0.length <= ReplicatorTuning.largestInlineBody }) {
                inline.append((revision, rendered))
            } else {
                uploads.append(.multipart(revision, rendered))
            }
        }
        // The others in `_bulk_docs` requests, small bodies inline, a few requests at once.
        var group: [(revision: ReplicatedRevision, rendered: CouchFormat.Rendered)] = []
        var groupBytes: Int64 = 0
        for entry in inline {
            let bytes = entry.rendered.following.reduce(0) { $0 + $1.length }
            if !group.isEmpty && (groupBytes + bytes > ReplicatorTuning.inlineBytesPerRequest
                || group.count == ReplicatorTuning.documentsPerRequest) {
                uploads.append(.inline(group))
                (group, groupBytes) = ([], 0)
            }
            group.append(entry)
            groupBytes += bytes
        }
        if !group.isEmpty { uploads.append(.inline(group)) }
        let (written, refused) = try sendAll(uploads, from: source)
        result.docsWritten += written
        return failures + refused
    }

    /// The per-document errors of a `_bulk_docs` answer (`forbidden` from a validation function…).
    static func failures(_ answer: JSONValue) -> [DocumentFailure] {
        (answer.arrayValue ?? []).compactMap { row in
            guard let error = row["error"]?.stringValue else { return nil }
            return DocumentFailure(docID: row["id"]?.stringValue ?? "?", rev: row["rev"]?.stringValue, error: error,
                                   reason: row["reason"]?.stringValue ?? "")
        }
    }

    /// Which ancestors of the revisions the target holds. `possible_ancestors` lists only its
    /// leaves of lower generation, so after concurrent edits (its leaf is as new as ours) it
    /// says nothing; a second `_revs_diff` about the ancestors themselves tells which
    /// attachments it has, so they go as stubs instead of travelling again.
    private func ancestorsHeld(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions]) throws -> [String: [RevisionID]] {
        var asked: [String: Set<RevisionID>] = [:]
        for revision in revisions where missing[revision.docID]?.possibleAncestors.isEmpty ?? true
            && revision.attachments.contains(where: { $0.revpos > 0 }) {
            asked[revision.docID, default: []].formUnion(revision.ancestors.prefix(20))
        }
        asked = asked.filter { !$0.value.isEmpty }
        guard !asked.isEmpty else { return [:] }
        var absent: [String: Set<RevisionID>] = [:]
        for (id, entry) in try revsDiff(asked.map { (id: $0.key, revs: Array($0.value)) }) { absent[id, default: []].formUnion(entry.missing) }
        var held: [String: [RevisionID]] = [:]
        for (id, ancestors) in asked { held[id] = ancestors.filter { !(absent[id]?.contains($0) ?? false) } }
        return held
    }

    /// The documents: in `_bulk_docs` requests with small bodies inline
    /// (base64, streamed from `source`), the others each a `PUT /db/doc?new_edits=false` in
    /// `multipart/related`; `ReplicatorTuning.uploadsInFlight` requests at once, each on a
    /// connection of its own. A request per document costs a round trip and a commit of the
    /// server (CouchDB syncs each), which in turn bound a push. Returns how many were written
    /// and those the server refused for good.
    private func sendAll(_ uploads: [Upload], from source: ReplicationPeer) throws -> (written: Int, refused: [DocumentFailure]) {
        guard !uploads.isEmpty else { return (0, []) }
        let workers = min(ReplicatorTuning.uploadsInFlight, uploads.count)
        while uploadClients.count < workers - 1 { uploadClients.append(try client.sibling()) }
        let job = UploadJob(uploads: uploads, clients: [client] + uploadClients.prefix(workers - 1), source: source)
        runConcurrently(workers) { job.run(worker: $0) }
        return try job.outcome()
    }

    /// `POST /db/_bulk_docs` with `new_edits=false`, the bodies of `following` inline. One
    /// missing stub refuses the whole request (412): the documents are then sent one by one.
    fileprivate static func postInline(_ documents: [(revision: ReplicatedRevision, rendered: CouchFormat.Rendered)],
                                       from source: ReplicationPeer, with client: HTTPClient) throws
        -> (written: Int, refused: [DocumentFailure]) {
        let url = client.remote.url("_bulk_docs")
        func post(_ part: [(revision: ReplicatedRevision, rendered: CouchFormat.Rendered)]) throws -> (status: Int, json: JSONValue) {
            try client.withRetry {
                let upload = PiecewiseUpload.inlineBulkDocs(part.map { ($0.rendered, $0.revision.docID) }) { attachment, id in
                    try source.openBody(of: attachment, docID: id)
                }
                let answer = try client.send("POST", url, headers: ["Content-Type": "application/json"], body: upload)
                guard answer.status < 300 || answer.status == 412 else { throw client.httpError(answer, url: url) }
                guard let json = answer.json else { throw ReplicationError.protocolError("POST _bulk_docs answered \(answer.status) without JSON") }
                return (answer.status, json)
            }
        }
        let (status, answer) = try post(documents)
        guard status == 412 else {
            let refused = RemotePeer.failures(answer)
            return (documents.count - refused.count, refused)
        }
        var written = 0
        var refused: [DocumentFailure] = []
        for document in documents {
            let (one, answer) = try post([document])
            if one < 300, let failure = RemotePeer.failures(answer).first {
                refused.append(failure)
            } else if one < 300 {
                written += 1
            } else {
                refused.append(DocumentFailure(docID: document.revision.docID, rev: document.revision.revID.description,
                                               error: answer["error"]?.stringValue ?? "HTTP \(one)", reason: answer["reason"]?.stringValue ?? ""))
            }
        }
        return (written, refused)
    }

    /// `PUT /db/doc?new_edits=false` as `multipart/related`, the bodies streamed from `source`.
    fileprivate static func putMultipart(_ rendered: CouchFormat.Rendered, id: String, from source: ReplicationPeer,
                                         with client: HTTPClient) throws {
        let boundary = BlobKey.hexString((0..<16).map { _ in UInt8.random(in: 0...255) })
        let upload = PiecewiseUpload.multipart(json: JSONValue.object(rendered.json).serialized(), attachments: rendered.following,
                                                 boundary: boundary, open: { try source.openBody(of: $0, docID: id) })
        let url = client.remote.url("\(percentEncodedPathSegment(id))?new_edits=false")
        let answer = try client.send("PUT", url, headers: ["Content-Type": "multipart/related; boundary=\"\(boundary)\""], body: upload)
        guard answer.status < 300 else { throw client.httpError(answer, url: url) }
    }

    // MARK: - Checkpoints

    func checkpoint(_ id: String) throws -> JSONObject? {
        let (status, document) = try client.json("GET", "_local/\(id)", allow: [404])
        guard status == 200, case .object(let body) = document else {
            checkpointRevs[id] = .some(nil)
            return nil
        }
        checkpointRevs[id] = .some(body["_rev"]?.stringValue)
        return body
    }

    func saveCheckpoint(_ id: String, _ body: JSONObject) throws {
        if checkpointRevs[id] == nil { _ = try checkpoint(id) }
        var document = body
        if let rev = checkpointRevs[id] ?? nil { document["_rev"] = .string(rev) }
        let (_, saved) = try client.json("PUT", "_local/\(id)", .object(document))
        checkpointRevs[id] = .some(saved["rev"]?.stringValue)
    }
}

/// A `_bulk_get` answered in JSON when asked for `multipart/mixed`.
private struct BulkGetNotMultipart: Error {}

/// One request of a push's page: documents in `_bulk_docs` (small bodies inline), or one
/// with large bodies in a multipart PUT.
private enum Upload {
    case inline([(revision: ReplicatedRevision, rendered: CouchFormat.Rendered)])
    case multipart(ReplicatedRevision, CouchFormat.Rendered)
}

/// One page's uploads shared by the threads that send them: each takes the next request.
private final class UploadJob: @unchecked Sendable {
    // Sendable invariant: worker i alone uses clients[i]; `next`, `written`, `refused` and
    // `error` are guarded by `lock`; `source` is a local database (it opens bodies from any thread).
    private let uploads: [Upload]
    private let clients: [HTTPClient]
    private let source: ReplicationPeer
    private let lock = NSLock()
    private var next = 0
    private var written = 0
    private var refused: [DocumentFailure] = []
    private var error: (any Error)?

    init(uploads: [Upload], clients: [HTTPClient], source: ReplicationPeer) {
        (self.uploads, self.clients, self.source) = (uploads, clients, source)
    }

    func run(worker: Int) {
        let client = clients[worker]
        while true {
            let index = lock.withLock { () -> Int? in
                guard error == nil, next < uploads.count else { return nil }
                defer { next += 1 }
                return next
            }
            guard let index else { return }
            do {
                switch uploads[index] {
                case .inline(let documents):
                    let (count, failures) = try RemotePeer.postInline(documents, from: source, with: client)
                    lock.withLock {
                        written += count
                        refused += failures
                    }
                case .multipart(let revision, let rendered):
                    do {
                        try client.withRetry { try RemotePeer.putMultipart(rendered, id: revision.docID, from: source, with: client) }
                        lock.withLock { written += 1 }
                    } catch ReplicationError.http(_, let error, let reason, _) {
                        // Refused for good (a validation function's `forbidden`), or still failing after the retries.
                        lock.withLock { refused.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: error, reason: reason)) }
                    }
                }
            } catch {
                lock.withLock { self.error = self.error ?? error }
            }
        }
    }

    /// How many were written and those refused; throws what stopped the uploads.
    func outcome() throws -> (written: Int, refused: [DocumentFailure]) {
        try lock.withLock {
            if let error { throw error }
            return (written, refused)
        }
    }
}
