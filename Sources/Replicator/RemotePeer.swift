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
        return ChangeBatch(changes: changes, lastSequence: lastSeq, isLast: rows.count < limit)
    }

    /// `since=` as CouchDB wants it: numbers bare, opaque strings verbatim.
    static func sequenceParameter(_ seq: JSONValue) -> String {
        switch seq {
        case .string(let text): text.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed.subtracting(CharacterSet(charactersIn: "&+="))) ?? text
        default: seq.jsonString()
        }
    }

    func revisions(_ wanted: [(id: String, rev: RevisionID)]) throws -> [Result<ReplicatedRevision, DocumentFailure>] {
        try fetchDocuments(wanted).map { entry in
            guard let document = entry["ok"] else {
                let error = entry["error"]
                return .failure(DocumentFailure(docID: error?["id"]?.stringValue ?? "?", rev: error?["rev"]?.stringValue,
                                                error: error?["error"]?.stringValue ?? "error",
                                                reason: error?["reason"]?.stringValue ?? "the source did not give this revision"))
            }
            do {
                return .success(try RemotePeer.replicatedRevision(document))
            } catch {
                return .failure(DocumentFailure(docID: document["_id"]?.stringValue ?? "?", rev: document["_rev"]?.stringValue,
                                                error: "invalid", reason: "\(error)"))
            }
        }
    }

    /// A revision as the source sent it, attachments as metadata only.
    static func replicatedRevision(_ json: JSONValue) throws -> ReplicatedRevision {
        let document = try IncomingDocument(json)
        guard let id = document.id, let rev = document.rev else {
            throw CouchFormatError("bad_request", "a document without _id or _rev")
        }
        return ReplicatedRevision(docID: id, revID: rev, ancestors: document.ancestors, deleted: document.deleted,
                                  properties: document.properties,
                                  attachments: (document.attachments ?? []).map { $0.metadata(of: rev) })
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
        let writer = try blobs.makeWriter()
        let receivedMD5 = MessageDigest(.md5)
        let identityMD5 = MessageDigest(.md5)
        var decoder: GzipDecoder?
        var started = false
        var lastReport = Date()
        do {
            let answer = try client.send("GET", url, headers: ["Accept": "*/*", "Accept-Encoding": "gzip"]) { [bodyProgress] bytes, status, headers in
                guard status < 300 else { return false }
                if !started {
                    started = true
                    if headers["content-encoding"]?.lowercased() == "gzip" { decoder = try GzipDecoder() }
                }
                if let bodyProgress, Date().timeIntervalSince(lastReport) >= 0.5 {
                    lastReport = Date()
                    bodyProgress(BodyProgress(digest: stub.digest, docID: docID, name: stub.name, present: writer.length,
                                              length: stub.length, fetching: true))
                }
                receivedMD5.update(bytes)
                if let decoder {
                    try decoder.decode(Array(bytes)) { piece in
                        identityMD5.update(piece)
                        try piece.withUnsafeBytes { try writer.write($0) }
                    }
                } else {
                    identityMD5.update(bytes)
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
        let received = "md5-" + Data(receivedMD5.finalize()).base64EncodedString()
        let identity = "md5-" + Data(identityMD5.finalize()).base64EncodedString()
        let mismatch = ReplicationError.protocolError(
            "attachment \(stub.name) of \(docID): the body received (\(writer.length) bytes) does not match its digest \(stub.digest) and length \(stub.length)")
        guard !stub.digest.hasPrefix("md5-") || stub.digest == received || stub.digest == identity else {
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
        return (blob, stub.digest.hasPrefix("sha1-") ? stub.digest : identity)
    }

    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader {
        throw SofaError.invalidArgument("Sofa replicates between a local database and a remote one, not between two remote databases")
    }

    // MARK: - As a target

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
        var bulk: [(revision: ReplicatedRevision, json: JSONValue)] = []
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
            if rendered.following.isEmpty {
                bulk.append((revision, .object(rendered.json)))
                continue
            }
            do {
                try client.withRetry { try putMultipart(rendered, id: revision.docID, from: source) }
                result.docsWritten += 1
            } catch ReplicationError.http(_, let error, let reason, _) {
                // Refused for good (a validation function's `forbidden`), or still failing after the retries.
                failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: error, reason: reason))
            }
        }
        guard !bulk.isEmpty else { return failures }
        let (status, answer) = try client.json("POST", "_bulk_docs", ["new_edits": false, "docs": .array(bulk.map(\.json))], allow: [412])
        if status == 412 {
            // One missing stub refuses the whole batch: send the documents one by one.
            for (revision, json) in bulk {
                let (one, answer) = try client.json("POST", "_bulk_docs", ["new_edits": false, "docs": [json]], allow: [412])
                if one < 300, let failure = RemotePeer.failures(answer).first {
                    failures.append(failure)
                } else if one < 300 {
                    result.docsWritten += 1
                } else {
                    failures.append(DocumentFailure(docID: revision.docID, rev: revision.revID.description,
                                                    error: answer["error"]?.stringValue ?? "HTTP \(one)",
                                                    reason: answer["reason"]?.stringValue ?? ""))
                }
            }
            return failures
        }
        let refused = RemotePeer.failures(answer)
        result.docsWritten += bulk.count - refused.count
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

    /// `PUT /db/doc?new_edits=false` as `multipart/related`, the bodies streamed from `source`.
    private func putMultipart(_ rendered: CouchFormat.Rendered, id: String, from source: ReplicationPeer) throws {
        let boundary = BlobKey.hexString((0..<16).map { _ in UInt8.random(in: 0...255) })
        let upload = MultipartUpload(json: JSONValue.object(rendered.json).serialized(), attachments: rendered.following,
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

    init(json: [UInt8], attachments: [Attachment], boundary: String, open: @escaping (Attachment) throws -> BlobReader) {
        self.open = open
        pieces.append(.bytes(Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8) + json))
        for attachment in attachments {
            pieces.append(.bytes(Array("\r\n--\(boundary)\r\n\(CouchFormat.partHeaders(attachment))".utf8)))
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
