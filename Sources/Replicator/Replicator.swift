import DocumentModel
import DocumentStore
import Foundation
import Logging

/// What a replication did, with PouchDB's result fields.
public struct ReplicationResult: Sendable {
    public var docsRead = 0
    public var docsWritten = 0
    public var docWriteFailures = 0
    public var attachmentsDownloaded = 0
    public var attachmentBytesDownloaded: Int64 = 0
    public var attachmentsDeferred = 0
    public var lastSeq: JSONValue = 0
    public var status = "complete"

    public var json: JSONValue {
        ["ok": .bool(status == "complete"), "status": .string(status), "docs_read": .integer(Int64(docsRead)),
         "docs_written": .integer(Int64(docsWritten)), "doc_write_failures": .integer(Int64(docWriteFailures)),
         "attachments_downloaded": .integer(Int64(attachmentsDownloaded)),
         "attachment_bytes_downloaded": .integer(attachmentBytesDownloaded),
         "attachments_deferred": .integer(Int64(attachmentsDeferred)), "last_seq": lastSeq]
    }
}

/// Which attachment bodies a pull downloads; the others are stored as metadata
/// only (`contentAvailable == false`) and fetched when read.
public struct DownloadPolicy: Sendable {
    public var enabled = true
    public var maximumSize: Int64?
    /// Patterns like `image/*` or `text/plain`; empty means all types.
    public var types: [String] = []

    public init() {}

    public func allows(_ attachment: Attachment) -> Bool {
        guard enabled else { return false }
        if let maximumSize, attachment.length > maximumSize { return false }
        guard !types.isEmpty else { return true }
        let type = attachment.contentType.lowercased().split(separator: ";")[0].trimmingCharacters(in: .whitespaces)
        return types.contains { pattern in
            pattern.hasSuffix("/*") ? type.hasPrefix(pattern.dropLast()) : type == pattern.lowercased()
        }
    }
}

/// The client side of CouchDB's replication protocol, one-shot, between a local
/// database and a remote one (a CouchDB, or another `sofa serve`).
///
/// Checkpoints live in `_local/<replication id>` on both sides; a run starts from
/// the checkpoint both agree on, and a checkpoint never moves past what is saved.
public final class Replicator {
    public enum Direction: String, Sendable { case pull, push }

    public let database: Database
    public let remote: RemoteDatabase
    public let direction: Direction
    public var downloads = DownloadPolicy()
    public var docIDs: [String]?
    /// A CouchDB Mango selector: pulls ask the remote to filter with it; pushes filter here.
    public var selector: Selector?
    /// Sync Gateway channels (pull only: `filter=sync_gateway/bychannel`).
    public var channels: [String]?
    /// Changes read per batch.
    public var batchSize = 200
    /// Pushes create the remote database when it does not exist (CouchDB's `create_target`).
    public var createTarget = false
    /// Called after each batch with the running totals.
    public var progress: ((ReplicationResult) -> Void)?
    let client: HTTPClient
    let log = Logger(label: "sofa.replicate")

    public init(database: Database, remote: RemoteDatabase, direction: Direction, caFile: String? = nil,
                retry: RetryPolicy = RetryPolicy()) throws {
        self.database = database
        self.remote = remote
        self.direction = direction
        self.client = try HTTPClient(remote: remote)
        client.caFile = caFile
        client.retry = retry
        client.onRetry = { [log] error, attempt in log.warning("retrying after attempt \(attempt): \(error)") }
    }

    /// The replication id: the local private UUID, the normalised remote URL (no
    /// credentials, default port explicit), the direction and the filter.
    public var replicationID: String { replicationID(privateUUID: database.privateUUID) }

    /// The id this replication had under another private UUID (before the database was copied).
    func replicationID(privateUUID: String) -> String {
        let key: JSONValue = [.string(privateUUID), .string(remote.url), .string(direction.rawValue),
                              docIDs.map { .array($0.sorted().map { .string($0) }) } ?? .null,
                              selector.map { .object($0.json) } ?? .null,
                              channels.map { .array($0.sorted().map { .string($0) }) } ?? .null]
        return BlobKey.hexString(MessageDigest.hash(.md5, key.serialized(.canonical)))
    }

    public func run() throws -> ReplicationResult {
        try client.logIn()
        var (status, info) = try client.json("GET", "", allow: direction == .push && createTarget ? [404] : [])
        if status == 404 {
            _ = try client.json("PUT", "", allow: [412])  // 412: someone created it meanwhile
            (_, info) = try client.json("GET", "")
        }
        guard info["db_name"] != nil || info["update_seq"] != nil else {
            throw ReplicationError.protocolError("\(remote) is not a CouchDB database")
        }
        switch direction {
        case .pull:
            try database.rememberRemote(remote.url)
            return try pull()
        case .push: return try push()
        }
    }

    // MARK: - Checkpoints

    private var checkpointID: String { "_local/\(replicationID)" }

    /// The sequence both sides' checkpoints agree on (the source's), or nil. A copied
    /// database (`sofa copy`) also looks under the ids its originals replicated with.
    private func startingSequence() throws -> JSONValue? {
        for uuid in [database.privateUUID] + database.previousPrivateUUIDs {
            if let seq = try startingSequence(id: replicationID(privateUUID: uuid)) {
                if uuid != database.privateUUID { log.info("resuming from the checkpoint of the database this one was copied from") }
                return seq
            }
        }
        return nil
    }

    private func startingSequence(id: String) throws -> JSONValue? {
        let local = try database.localDocument(withID: "_local/\(id)")?.body
        guard local != nil else { return nil }
        let (status, remoteDoc) = try client.json("GET", "_local/\(id)", allow: [404])
        guard let local, status == 200, case .object(let remoteCheckpoint) = remoteDoc else { return nil }
        if local["session_id"] == remoteCheckpoint["session_id"], let seq = local["source_last_seq"] { return seq }
        // Different last sessions: the newest session both histories know.
        let remoteSessions = Dictionary((remoteCheckpoint["history"]?.arrayValue ?? []).compactMap { entry in
            entry["session_id"]?.stringValue.map { ($0, entry) }
        }, uniquingKeysWith: { first, _ in first })
        for entry in local["history"]?.arrayValue ?? [] {
            if let session = entry["session_id"]?.stringValue, remoteSessions[session] != nil { return entry["recorded_seq"] }
        }
        return nil
    }

    /// The remote checkpoint's `_rev`, once known (read once, then taken from each PUT's answer).
    private var remoteCheckpointRev: String??

    private func saveCheckpoint(session: String, started: Date, startSeq: JSONValue, seq: JSONValue, result: ReplicationResult) throws {
        let local = try database.localDocument(withID: checkpointID)
        let existing = local?.body
        let entry: JSONValue = ["session_id": .string(session), "start_time": .string(httpDate(started)),
                                "end_time": .string(httpDate(Date())), "start_last_seq": startSeq, "end_last_seq": seq,
                                "recorded_seq": seq, "docs_read": .integer(Int64(result.docsRead)),
                                "docs_written": .integer(Int64(result.docsWritten)),
                                "doc_write_failures": .integer(Int64(result.docWriteFailures))]
        var history = (existing?["history"]?.arrayValue ?? []).filter { $0["session_id"]?.stringValue != session }
        history.insert(entry, at: 0)
        let body: JSONObject = ["session_id": .string(session), "source_last_seq": seq, "replication_id_version": 1,
                                "history": .array(Array(history.prefix(50)))]
        // Remote first: if it fails, the local checkpoint (which decides nothing alone) is untouched.
        if remoteCheckpointRev == nil {
            remoteCheckpointRev = .some(try client.json("GET", "_local/\(replicationID)", allow: [404]).json["_rev"]?.stringValue)
        }
        var remoteBody = body
        if let rev = remoteCheckpointRev ?? nil { remoteBody["_rev"] = .string(rev) }
        let (_, saved) = try client.json("PUT", "_local/\(replicationID)", .object(remoteBody))
        remoteCheckpointRev = .some(saved["rev"]?.stringValue)
        _ = try database.replaceLocalDocument(checkpointID, body: body, after: local?.rev)
    }

    // MARK: - Pull

    private func pull() throws -> ReplicationResult {
        var result = ReplicationResult()
        let session = UUID().uuidString.lowercased()
        let started = Date()
        let startSeq = try startingSequence() ?? 0
        var since = startSeq
        result.lastSeq = since
        while true {
            var path = "_changes?feed=normal&style=all_docs&limit=\(batchSize)&since=\(sequenceParameter(since))"
            var body: JSONValue?
            if let docIDs {
                path += "&filter=_doc_ids"
                body = ["doc_ids": .array(docIDs.map { .string($0) })]
            } else if let selector {
                path += "&filter=_selector"
                body = ["selector": .object(selector.json)]
            } else if let channels {
                path += "&filter=sync_gateway/bychannel&channels=\(channels.joined(separator: ",").addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: ",-_."))) ?? "")"
            }
            let (_, changes) = try client.json(body == nil ? "GET" : "POST", path, body)
            guard let rows = changes["results"]?.arrayValue, let lastSeq = changes["last_seq"] else {
                throw ReplicationError.protocolError("_changes without results and last_seq")
            }
            if rows.isEmpty { break }
            // Which of the listed revisions are missing here.
            var wanted: [(id: String, rev: RevisionID)] = []
            for row in rows {
                guard let id = row["id"]?.stringValue, !DocumentID.isLocal(id) else { continue }
                let tree = try? database.revisionTree(of: id)
                for change in row["changes"]?.arrayValue ?? [] {
                    guard let text = change["rev"]?.stringValue, let rev = RevisionID(text) else { continue }
                    if !(tree?.contains(rev) ?? false) { wanted.append((id, rev)) }
                }
            }
            if !wanted.isEmpty { try fetch(wanted, into: &result) }
            since = lastSeq
            result.lastSeq = lastSeq
            try saveCheckpoint(session: session, started: started, startSeq: startSeq, seq: since, result: result)
            progress?(result)
            if rows.count < batchSize { break }
        }
        return result
    }

    /// `since=` as CouchDB wants it: numbers bare, opaque strings verbatim.
    func sequenceParameter(_ seq: JSONValue) -> String {
        switch seq {
        case .string(let text): text.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed.subtracting(CharacterSet(charactersIn: "&+="))) ?? text
        default: seq.jsonString()
        }
    }

    /// Fetches revisions with `_bulk_get` (stubs), then each needed body on its own,
    /// streamed into the blob store and checked against its digest; saves them with history.
    private func fetch(_ wanted: [(id: String, rev: RevisionID)], into result: inout ReplicationResult) throws {
        var revisions: [ReplicatedRevision] = []
        for doc in try fetchDocuments(wanted) {
            do {
                guard let body = doc["ok"] else { continue }
                result.docsRead += 1
                revisions.append(try replicatedRevision(body, result: &result))
            } catch let error as SofaError where !error.isEnvironmental {
                // This document cannot be stored here (invalid id or body): count it and go on.
                log.warning("cannot replicate \(doc["ok"]?["_id"]?.stringValue ?? "?"): \(error)")
                result.docWriteFailures += 1
            }
            // Anything else (the remote failing after retries, a full disk) stops the run
            // before the checkpoint moves past this batch.
        }
        try database.inBatch { batch in
            for revision in revisions where try batch.insert(revision) { result.docsWritten += 1 }
        }
    }

    /// Servers without `_bulk_get` (CouchDB before 2.2, some gateways) answer 404, 405 or 400.
    private var bulkGetUnsupported = false

    /// The requested revisions as `{"ok": doc}` / `{"error": …}` entries: one `_bulk_get`,
    /// or, where the server lacks it, `GET doc?open_revs=[rev]&revs=true&latest=true` each.
    private func fetchDocuments(_ wanted: [(id: String, rev: RevisionID)]) throws -> [JSONValue] {
        if !bulkGetUnsupported {
            let request: JSONValue = ["docs": .array(wanted.map { ["id": .string($0.id), "rev": .string($0.rev.description)] })]
            do {
                let (_, answer) = try client.json("POST", "_bulk_get?revs=true&latest=true&attachments=false", request)
                return (answer["results"]?.arrayValue ?? []).flatMap { $0["docs"]?.arrayValue ?? [] }
            } catch ReplicationError.http(let status, _, _, _) where [400, 404, 405].contains(status) {
                log.info("\(remote) has no _bulk_get (HTTP \(status)); fetching revisions one by one")
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

    private func replicatedRevision(_ body: JSONValue, result: inout ReplicationResult) throws -> ReplicatedRevision {
        guard case .object(let object) = body, let id = object["_id"]?.stringValue,
              let revText = object["_rev"]?.stringValue, let rev = RevisionID(revText) else {
            throw ReplicationError.protocolError("a document without _id or _rev")
        }
        var ancestors: [RevisionID] = []
        if let start = object["_revisions"]?["start"]?.int64Value, let ids = object["_revisions"]?["ids"]?.arrayValue {
            ancestors = ids.enumerated().dropFirst().compactMap { index, value in
                value.stringValue.map { RevisionID(generation: Int(start) - index, suffix: $0) }
            }
        }
        let properties = object.filter { !$0.hasPrefix("_") }
        var attachments: [Attachment] = []
        if case .object(let entries) = object["_attachments"] ?? .null {
            for (name, entry) in entries {
                let stub = Attachment(name: name, contentType: entry["content_type"]?.stringValue ?? MIMEType.fallback,
                                      length: entry["length"]?.int64Value ?? 0, digest: entry["digest"]?.stringValue ?? "",
                                      blobKey: nil, revpos: Int(entry["revpos"]?.int64Value ?? Int64(rev.generation)))
                if !stub.digest.isEmpty, let local = try database.storedBody(digest: stub.digest) {
                    // The same body under this digest is here already (an earlier revision): it never travels again.
                    attachments.append(stub.withBlob(local))
                } else if downloads.allows(stub) {
                    attachments.append(try client.withRetry { try download(stub, id: id, rev: rev, result: &result) })
                } else {
                    result.attachmentsDeferred += 1
                    attachments.append(stub)
                }
            }
        }
        return ReplicatedRevision(docID: id, revID: rev, ancestors: ancestors, deleted: object["_deleted"]?.boolValue ?? false,
                                  properties: properties, attachments: attachments.sorted { $0.name < $1.name })
    }

    /// Streams one body into the blob store. CouchDB's MD5 digests cover the bytes as it
    /// stores them (gzip for `text/*`), so the body is asked for as stored, checked, and
    /// decoded on the way in.
    private func download(_ stub: Attachment, id: String, rev: RevisionID, result: inout ReplicationResult) throws -> Attachment {
        let name = stub.name.split(separator: "/", omittingEmptySubsequences: false).map { percentEncodedPathSegment(String($0)) }.joined(separator: "/")
        let url = remote.url("\(percentEncodedPathSegment(id))/\(name)?rev=\(rev)")
        let writer = try database.blobs.makeWriter()
        let md5 = MessageDigest(.md5)
        var decoder: GzipDecoder?
        var started = false
        do {
            let answer = try client.send("GET", url, headers: ["Accept": "*/*", "Accept-Encoding": "gzip"]) { bytes, status, headers in
                guard status < 300 else { return false }
                if !started {
                    started = true
                    if headers["content-encoding"]?.lowercased() == "gzip" { decoder = try GzipDecoder() }
                }
                md5.update(bytes)
                if let decoder {
                    try decoder.decode(Array(bytes)) { piece in try piece.withUnsafeBytes { try writer.write($0) } }
                } else {
                    try writer.write(bytes)
                }
                return true
            }
            guard answer.status < 300 else { throw client.httpError(answer, url: url) }
            try decoder?.finish()
        } catch {
            writer.cancel()
            throw error
        }
        // Checked before the blob is installed: a body that fails its digest is never stored.
        let received = "md5-" + Data(md5.finalize()).base64EncodedString()
        let mismatch = ReplicationError.protocolError(
            "attachment \(stub.name) of \(id): the body received (\(writer.length) bytes) does not match its digest \(stub.digest) and length \(stub.length)")
        guard (!stub.digest.hasPrefix("md5-") || stub.digest == received), writer.length == stub.length || decoder != nil else {
            writer.cancel()
            throw mismatch
        }
        let blob: StoredBlob
        do {
            blob = try writer.finish(expecting: stub.digest.hasPrefix("sha1-") ? BlobKey(digestString: stub.digest) : nil)
        } catch SofaError.blobCorrupted {
            throw mismatch
        }
        guard blob.length == stub.length else { throw mismatch }
        result.attachmentsDownloaded += 1
        result.attachmentBytesDownloaded += blob.length
        return stub.withBlob(blob)
    }

    // MARK: - Push

    private func push() throws -> ReplicationResult {
        var result = ReplicationResult()
        let session = UUID().uuidString.lowercased()
        let started = Date()
        let startSeq = try startingSequence() ?? 0
        var since: Int64 = startSeq.int64Value ?? Int64(startSeq.stringValue ?? "") ?? 0
        result.lastSeq = .integer(since)
        while true {
            var changes = try database.changes(since: since, limit: batchSize)
            guard let last = changes.last else { break }
            if let docIDs { changes = changes.filter { docIDs.contains($0.docID) } }
            if let selector {
                changes = changes.filter { change in
                    (try? database.revision(change.revID, of: change.docID)).map { revision in
                        var document = revision.properties
                        document["_id"] = .string(change.docID)
                        if revision.deleted { document["_deleted"] = true }
                        return selector.matches(document)
                    } ?? false
                }
            }
            var leaves: [String: [RevisionID]] = [:]
            for change in changes { leaves[change.docID] = (try? database.revisionTree(of: change.docID))?.leaves.map(\.id) ?? [] }
            if !leaves.isEmpty { try send(leaves, into: &result) }
            since = last.sequence
            result.lastSeq = .integer(since)
            try saveCheckpoint(session: session, started: started, startSeq: startSeq, seq: .integer(since), result: result)
            progress?(result)
        }
        return result
    }

    private func send(_ leaves: [String: [RevisionID]], into result: inout ReplicationResult) throws {
        let request = JSONValue.object(JSONObject(leaves.map { ($0.key, JSONValue.array($0.value.map { .string($0.description) })) }))
        let (_, diff) = try client.json("POST", "_revs_diff", request)
        guard case .object(let missing) = diff else { return }
        let held = try ancestorsHeldByRemote(missing)
        var bulk: [JSONValue] = []
        for (id, entry) in missing {
            let tree = try database.revisionTree(of: id)
            let ancestors = (entry["possible_ancestors"]?.arrayValue ?? []).compactMap { $0.stringValue.flatMap(RevisionID.init) }
                + (held[id] ?? [])
            for revText in entry["missing"]?.arrayValue?.compactMap(\.stringValue) ?? [] {
                guard let rev = RevisionID(revText), let revision = try? database.revision(rev, of: id) else { continue }
                result.docsRead += 1
                let history = tree.history(of: rev)
                // Attachments the remote has: those not changed since an ancestor it holds.
                let known = ancestors.filter { history.contains($0) }.map(\.generation).max() ?? 0
                var json = JSONObject()
                json["_id"] = .string(id)
                json["_rev"] = .string(rev.description)
                if revision.deleted { json["_deleted"] = true }
                for (key, value) in revision.properties { json[key] = value }
                json["_revisions"] = ["start": .integer(Int64(rev.generation)), "ids": .array(history.map { .string($0.suffix) })]
                var following: [Attachment] = []
                if !revision.attachments.isEmpty {
                    var attachments = JSONObject()
                    for attachment in revision.attachments {
                        var entry: JSONObject = ["content_type": .string(attachment.contentType), "revpos": .integer(Int64(attachment.revpos)),
                                                 "digest": .string(attachment.digest), "length": .integer(attachment.length)]
                        if attachment.revpos > known && attachment.contentAvailable {
                            entry["follows"] = true
                            following.append(attachment)
                        } else {
                            entry["stub"] = true
                        }
                        attachments[attachment.name] = .object(entry)
                    }
                    json["_attachments"] = .object(attachments)
                }
                if following.isEmpty {
                    bulk.append(.object(json))
                } else {
                    do {
                        try client.withRetry { try putMultipart(json, id: id, following: following) }
                        result.docsWritten += 1
                    } catch let error as ReplicationError where !error.isTransient {
                        log.warning("cannot push \(id) \(rev): \(error)")
                        result.docWriteFailures += 1
                    }
                }
            }
        }
        guard !bulk.isEmpty else { return }
        let (status, answer) = try client.json("POST", "_bulk_docs", ["new_edits": false, "docs": .array(bulk)], allow: [412])
        if status == 412 {
            // One missing stub refuses the whole batch: send the documents one by one.
            for doc in bulk {
                let (one, _) = try client.json("POST", "_bulk_docs", ["new_edits": false, "docs": [doc]], allow: [412])
                if one == 201 { result.docsWritten += 1 } else { result.docWriteFailures += 1 }
            }
            return
        }
        let failures = answer.arrayValue?.filter { $0["error"] != nil }.count ?? 0
        result.docWriteFailures += failures
        result.docsWritten += bulk.count - failures
    }

    /// Which ancestors of the missing revisions the remote holds. `possible_ancestors` lists
    /// only its leaves of lower generation, so after concurrent edits (its leaf is as new as
    /// ours) it says nothing; a second `_revs_diff` about the ancestors themselves tells
    /// which attachments it has, so they go as stubs instead of travelling again.
    private func ancestorsHeldByRemote(_ missing: JSONObject) throws -> [String: [RevisionID]] {
        var asked: [String: [RevisionID]] = [:]
        for (id, entry) in missing where entry["possible_ancestors"] == nil {
            guard let tree = try? database.revisionTree(of: id) else { continue }
            let revs = (entry["missing"]?.arrayValue ?? []).compactMap { $0.stringValue.flatMap(RevisionID.init) }
            let ancestors = Set(revs.flatMap { tree.history(of: $0).dropFirst().prefix(20) })
            if !ancestors.isEmpty { asked[id] = Array(ancestors) }
        }
        guard !asked.isEmpty else { return [:] }
        let request = JSONValue.object(JSONObject(asked.map { ($0.key, JSONValue.array($0.value.map { .string($0.description) })) }))
        let (_, diff) = try client.json("POST", "_revs_diff", request)
        var held: [String: [RevisionID]] = [:]
        for (id, ancestors) in asked {
            let absent = Set((diff[id]?["missing"]?.arrayValue ?? []).compactMap(\.stringValue))
            held[id] = ancestors.filter { !absent.contains($0.description) }
        }
        return held
    }

    /// `PUT /db/doc?new_edits=false` as `multipart/related`, the bodies streamed from the blob store.
    private func putMultipart(_ json: JSONObject, id: String, following: [Attachment]) throws {
        let boundary = BlobKey.hexString((0..<16).map { _ in UInt8.random(in: 0...255) })
        let upload = try MultipartUpload(json: JSONValue.object(json).serialized(), attachments: following, boundary: boundary,
                                         open: { try self.database.openContent(of: $0, docID: id) })
        let url = remote.url("\(percentEncodedPathSegment(id))?new_edits=false")
        let answer = try client.send("PUT", url, headers: ["Content-Type": "multipart/related; boundary=\"\(boundary)\""], body: upload)
        guard answer.status < 300 else { throw client.httpError(answer, url: url) }
    }
}

/// A `multipart/related` document body produced as curl reads it: the JSON part,
/// then each attachment streamed from its blob.
final class MultipartUpload: UploadSource {
    private var pieces: [Piece] = []
    private var current = 0
    private var offset = 0
    let length: Int64

    private enum Piece {
        case bytes([UInt8])
        case blob(Attachment)
    }
    private let open: (Attachment) throws -> BlobReader
    private var reader: BlobReader?

    init(json: [UInt8], attachments: [Attachment], boundary: String, open: @escaping (Attachment) throws -> BlobReader) throws {
        self.open = open
        pieces.append(.bytes(Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8) + json))
        for attachment in attachments {
            let name = attachment.name.replacingOccurrences(of: "\"", with: "\\\"")
            pieces.append(.bytes(Array(("\r\n--\(boundary)\r\nContent-Disposition: attachment; filename=\"\(name)\"\r\n"
                + "Content-Type: \(attachment.contentType)\r\nContent-Length: \(attachment.length)\r\n\r\n").utf8)))
            pieces.append(.blob(attachment))
        }
        pieces.append(.bytes(Array("\r\n--\(boundary)--".utf8)))
        length = pieces.reduce(0) { total, piece in
            switch piece {
            case .bytes(let bytes): total + Int64(bytes.count)
            case .blob(let attachment): total + attachment.length
            }
        }
    }

    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        while current < pieces.count {
            switch pieces[current] {
            case .bytes(let bytes):
                let count = min(buffer.count, bytes.count - offset)
                if count > 0 {
                    bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: count) }
                    offset += count
                    return count
                }
            case .blob(let attachment):
                if reader == nil { reader = try open(attachment) }
                let count = try reader!.read(into: buffer)
                if count > 0 { return count }
                reader = nil
            }
            current += 1
            offset = 0
        }
        return 0
    }
}

extension Attachment {
    /// This attachment's metadata with the body of `blob`.
    func withBlob(_ blob: StoredBlob) -> Attachment {
        Attachment(name: name, contentType: contentType, length: blob.length, digest: digest, blobKey: blob.key,
                   revpos: revpos, contentAvailable: true)
    }
}

extension SofaError {
    /// Failures of the machine rather than of the document: worth stopping for.
    var isEnvironmental: Bool {
        switch self {
        case .diskFull, .readOnlyFileSystem, .io, .sqlite, .blobCorrupted: true
        default: false
        }
    }
}
