import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Fetches deferred attachment bodies from the remote: one transfer per body
/// however many readers ask, streamed into the blob store where readers can follow
/// it as it arrives, checked against its digest, retried with backoff, and resumed
/// with an HTTP Range after an interruption instead of starting over.
public final class BodyDownloader: BodySource, @unchecked Sendable {
    // Sendable invariant: `transfers` is guarded by `lock`; each transfer runs on its own thread.
    public let database: Database
    public let remote: RemoteDatabase
    private let retry: RetryPolicy
    private let caFile: String?
    private let lock = NSLock()
    private var transfers: [String: BodyTransfer] = [:]
    private let log = Logger(label: "sofa.download")
    /// Stops every transfer; what has arrived stays for the next download of the body.
    public let cancellation = Cancellation()

    public init(database: Database, remote: RemoteDatabase, retry: RetryPolicy = RetryPolicy(), caFile: String? = nil) {
        self.database = database
        self.remote = remote
        self.retry = retry
        self.caFile = caFile
    }

    /// Transfers under way, for status files.
    public var active: [BodyTransfer] { lock.withLock { Array(transfers.values) } }

    public func transfer(digest: String) -> BodyTransfer? { lock.withLock { transfers[digest] } }

    public func fetch(_ attachment: Attachment, docID: String, revID: RevisionID) -> BodyTransfer {
        if let blob = try? database.storedBody(digest: attachment.digest) {
            return BodyTransfer(attachment: attachment, blob: blob)
        }
        let (transfer, isNew) = lock.withLock { () -> (BodyTransfer, Bool) in
            if let existing = transfers[attachment.digest] { return (existing, false) }
            let transfer = BodyTransfer(attachment: attachment)
            transfers[attachment.digest] = transfer
            return (transfer, true)
        }
        if isNew {
            Thread.detachNewThread { [self] in
                do {
                    let (blob, stored) = try download(attachment, docID: docID, revID: revID, transfer: transfer)
                    try database.attachBody(digest: attachment.digest, blob: blob, storedDigest: stored)
                    lock.withLock { _ = transfers.removeValue(forKey: attachment.digest) }
                    transfer.finished(blob)
                } catch {
                    log.error("\(docID)/\(attachment.name): download failed: \(error)")
                    lock.withLock { _ = transfers.removeValue(forKey: attachment.digest) }
                    transfer.failed(error)
                }
            }
        }
        return transfer
    }

    /// Stops every download under way; each keeps what arrived for the next try.
    public func cancel() { cancellation.cancel() }

    /// Downloads one body, blocking: retried, resumed from where an interrupted try stopped
    /// (in this process or an earlier one: a partial body waits in the store under its digest).
    /// Returns the blob and the digest of its bytes as stored (`CouchFormat`'s rule: the MD5
    /// of the decoded bytes when the remote named a gzip form by its MD5).
    func download(_ attachment: Attachment, docID: String, revID: RevisionID, transfer: BodyTransfer) throws
        -> (blob: StoredBlob, digest: String) {
        let client = try HTTPClient(remote: remote)
        client.caFile = caFile
        client.retry = retry
        client.cancellation = cancellation
        client.onRetry = { [log] error, attempt in log.warning("\(docID)/\(attachment.name): retrying after attempt \(attempt): \(error)") }
        try client.withRetry { try client.logIn() }
        let name = attachment.name.split(separator: "/", omittingEmptySubsequences: false).map { percentEncodedPathSegment(String($0)) }.joined(separator: "/")
        let url = remote.url("\(percentEncodedPathSegment(docID))/\(name)?rev=\(revID)")
        let body = try IncomingBody(blobs: database.blobs, transfer: transfer, digest: attachment.digest)
        defer { body.writer.cancel() }
        if body.writer.length > 0 {
            log.info("\(docID)/\(attachment.name): resuming after the \(body.writer.length) bytes an earlier download left")
        }
        return try client.withRetry {
            let resumeFrom = body.writer.length
            // Everything arrived before an earlier try stopped: only the checks are left.
            if resumeFrom < attachment.length || resumeFrom == 0 {
                try receive(url, into: body, from: resumeFrom, client: client)
            }
            if let decoder = body.decoder {
                do { try decoder.finish() } catch {
                    try body.restart()
                    throw ReplicationError.protocolError("\(attachment.name): truncated gzip body")
                }
            }
            guard body.writer.length == attachment.length else {
                // Too many bytes cannot be the start of the body; too few are, and the retry asks for the rest.
                if body.writer.length > attachment.length { try body.restart() }
                throw ReplicationError.protocolError("\(attachment.name): \(body.writer.length) of \(attachment.length) bytes arrived")
            }
            let mismatch = ReplicationError.protocolError("\(attachment.name): the body received does not match its digest \(attachment.digest)")
            if body.checkMD5 && attachment.digest != "md5-" + Data(body.md5.finalize()).base64EncodedString() {
                try body.restart()
                throw mismatch
            }
            let stored = body.checkMD5 && body.decoder != nil
                ? "md5-" + Data(body.identityMD5.finalize()).base64EncodedString() : attachment.digest
            do {
                let blob = try body.writer.finish(expecting: attachment.digest.hasPrefix("sha1-") ? BlobKey(digestString: attachment.digest) : nil)
                return (blob, stored)
            } catch SofaError.blobCorrupted {
                try body.restart()
                throw mismatch
            }
        }
    }

    /// One GET of the body (the rest of it with a Range when `resumeFrom` > 0) into `body`.
    private func receive(_ url: String, into body: IncomingBody, from resumeFrom: Int64, client: HTTPClient) throws {
        var headers = ["Accept": "*/*", "Accept-Encoding": "gzip"]
        if resumeFrom > 0 { headers["Range"] = "bytes=\(resumeFrom)-" }
        var started = false
        let answer: HTTPAnswer
        do {
            answer = try client.send("GET", url, headers: headers) { bytes, status, responseHeaders in
                guard status < 300 else { return false }
                if !started {
                    started = true
                    let gzip = responseHeaders["content-encoding"]?.lowercased() == "gzip"
                    // A whole body again (no 206), or a gzip stream (which cannot resume): start over.
                    if resumeFrom > 0 && (status != 206 || gzip) || gzip && body.writer.length > 0 { try body.restart() }
                    body.decoder = gzip ? try GzipDecoder() : nil
                }
                try body.receive(bytes)
                return true
            }
        } catch {
            // Keep what arrived before the failure: the retry asks for the rest with a Range.
            try? body.flush()
            throw error
        }
        guard answer.status < 300 else { throw client.httpError(answer, url: url) }
        try body.flush()
    }

    /// Downloads every deferred body of the current revisions (of one document, or one
    /// attachment), one at a time; `progress` gets (done, total, bytes).
    public func downloadMissing(docID: String? = nil, name: String? = nil,
                                progress: ((Int, Int, Int64) -> Void)? = nil) throws -> (count: Int, bytes: Int64) {
        let missing = try database.missingBodies().filter { entry in
            (docID == nil || entry.docID == docID) && (name == nil || entry.attachment.name == name)
        }
        var seen = Set<String>()
        let total = Set(missing.map { $0.attachment.digest }).count
        var bytes: Int64 = 0
        var done = 0
        for (id, rev, attachment) in missing where seen.insert(attachment.digest).inserted {
            if cancellation.isCancelled { throw ReplicationError.cancelled }
            let transfer = BodyTransfer(attachment: attachment)
            let (blob, stored) = try download(attachment, docID: id, revID: rev, transfer: transfer)
            try database.attachBody(digest: attachment.digest, blob: blob, storedDigest: stored)
            bytes += blob.length
            done += 1
            progress?(done, total, bytes)
        }
        return (done, bytes)
    }
}

extension Database {
    private static let remoteDocument = "_local/sofa-remote"

    /// The remote this database last pulled from (no credentials), where deferred bodies are fetched.
    public var rememberedRemote: String? {
        (try? localDocument(withID: Database.remoteDocument))??.body["url"]?.stringValue
    }

    public func rememberRemote(_ url: String) throws {
        let current = try localDocument(withID: Database.remoteDocument)
        guard current?.body["url"]?.stringValue != url else { return }
        _ = try replaceLocalDocument(Database.remoteDocument, body: ["url": .string(url)], after: current?.rev)
    }
}

/// A body arriving into a blob writer: gathered into 1 MiB writes (curl hands over
/// 16 KiB at a time), MD5-hashed when the digest is one, decoded when gzip.
private final class IncomingBody {
    let blobs: BlobStore
    let transfer: BodyTransfer
    let digest: String
    let checkMD5: Bool
    var writer: BlobWriter
    var md5 = MessageDigest(.md5)
    /// The decoded bytes' MD5 when the body comes gzip-encoded (a gzip body always starts over,
    /// so this covers the whole body).
    var identityMD5 = MessageDigest(.md5)
    var decoder: GzipDecoder?
    private var pending: [UInt8] = []

    init(blobs: BlobStore, transfer: BodyTransfer, digest: String) throws {
        self.blobs = blobs
        self.transfer = transfer
        self.digest = digest
        checkMD5 = digest.hasPrefix("md5-")
        // Another process fetching the same body holds its partial file: this one writes its own.
        writer = try blobs.makeResumableWriter(digest: digest) ?? blobs.makeWriter()
        if checkMD5 && writer.length > 0 { try writer.hashWritten(into: md5) }
        pending.reserveCapacity(1 << 20)
        transfer.started(writingTo: writer.temporaryPath)
        if writer.length > 0 { transfer.progressed(to: writer.length) }
    }

    func receive(_ bytes: UnsafeRawBufferPointer) throws {
        if let decoder {
            if checkMD5 { md5.update(bytes) }  // the digest covers the gzip stream as sent
            var decoded: [[UInt8]] = []
            try decoder.decode(Array(bytes)) { decoded.append($0) }
            for piece in decoded { try append(piece) }
        } else {
            try append(Array(bytes))
        }
    }

    private func append(_ bytes: [UInt8]) throws {
        pending += bytes
        if pending.count >= 1 << 20 { try flush() }
    }

    /// Writes what is gathered; identity bytes are hashed here, so a resumed body's MD5
    /// covers exactly what the file holds.
    func flush() throws {
        guard !pending.isEmpty else { return }
        if checkMD5 && decoder == nil { md5.update(pending) }
        if checkMD5 && decoder != nil { identityMD5.update(pending) }
        try pending.withUnsafeBytes { try writer.write($0) }
        pending.removeAll(keepingCapacity: true)
        transfer.progressed(to: writer.length)
    }

    /// Drops everything received and starts a new file.
    func restart() throws {
        writer.discard()
        writer = try blobs.makeResumableWriter(digest: digest) ?? blobs.makeWriter()
        md5 = MessageDigest(.md5)
        identityMD5 = MessageDigest(.md5)
        pending.removeAll(keepingCapacity: true)
        transfer.started(writingTo: writer.temporaryPath)
    }
}
