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
                    let blob = try download(attachment, docID: docID, revID: revID, transfer: transfer)
                    try database.attachBody(digest: attachment.digest, blob: blob)
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

    /// Downloads one body, blocking: retried, resumed from where an interrupted try stopped.
    func download(_ attachment: Attachment, docID: String, revID: RevisionID, transfer: BodyTransfer) throws -> StoredBlob {
        let client = try HTTPClient(remote: remote)
        client.caFile = caFile
        client.retry = retry
        client.onRetry = { [log] error, attempt in log.warning("\(docID)/\(attachment.name): retrying after attempt \(attempt): \(error)") }
        try client.withRetry { try client.logIn() }
        let name = attachment.name.split(separator: "/", omittingEmptySubsequences: false).map { percentEncodedPathSegment(String($0)) }.joined(separator: "/")
        let url = remote.url("\(percentEncodedPathSegment(docID))/\(name)?rev=\(revID)")
        var body = try IncomingBody(blobs: database.blobs, transfer: transfer, checkMD5: attachment.digest.hasPrefix("md5-"))
        defer { body.writer.cancel() }
        return try client.withRetry {
            let resumeFrom = body.writer.length
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
            if let decoder = body.decoder {
                do { try decoder.finish() } catch {
                    try body.restart()
                    throw ReplicationError.protocolError("\(attachment.name): truncated gzip body")
                }
            }
            guard body.writer.length == attachment.length else {
                throw ReplicationError.protocolError("\(attachment.name): \(body.writer.length) of \(attachment.length) bytes arrived")
            }
            let mismatch = ReplicationError.protocolError("\(attachment.name): the body received does not match its digest \(attachment.digest)")
            if body.checkMD5 && attachment.digest != "md5-" + Data(body.md5.finalize()).base64EncodedString() {
                try body.restart()
                throw mismatch
            }
            do {
                return try body.writer.finish(expecting: attachment.digest.hasPrefix("sha1-") ? BlobKey(digestString: attachment.digest) : nil)
            } catch SofaError.blobCorrupted {
                try body.restart()
                throw mismatch
            }
        }
    }

    /// Downloads every deferred body of the current revisions (of one document, or one
    /// attachment), one at a time; `progress` gets (done, total, bytes).
    public func downloadMissing(docID: String? = nil, name: String? = nil,
                                progress: ((Int, Int, Int64) -> Void)? = nil) throws -> (count: Int, bytes: Int64) {
        let missing = try database.missingBodies().filter { entry in
            (docID == nil || entry.docID == docID) && (name == nil || entry.attachment.name == name)
        }
        var seen = Set<String>()
        var bytes: Int64 = 0
        var done = 0
        for (id, rev, attachment) in missing where seen.insert(attachment.digest).inserted {
            let transfer = BodyTransfer(attachment: attachment)
            let blob = try download(attachment, docID: id, revID: rev, transfer: transfer)
            try database.attachBody(digest: attachment.digest, blob: blob)
            bytes += blob.length
            done += 1
            progress?(done, seen.count, bytes)
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
private struct IncomingBody {
    let blobs: BlobStore
    let transfer: BodyTransfer
    let checkMD5: Bool
    var writer: BlobWriter
    var md5 = MessageDigest(.md5)
    var decoder: GzipDecoder?
    private var pending: [UInt8] = []

    init(blobs: BlobStore, transfer: BodyTransfer, checkMD5: Bool) throws {
        self.blobs = blobs
        self.transfer = transfer
        self.checkMD5 = checkMD5
        writer = try blobs.makeWriter()
        pending.reserveCapacity(1 << 20)
        transfer.started(writingTo: writer.temporaryPath)
    }

    mutating func receive(_ bytes: UnsafeRawBufferPointer) throws {
        if let decoder {
            if checkMD5 { md5.update(bytes) }  // the digest covers the gzip stream as sent
            var decoded: [[UInt8]] = []
            try decoder.decode(Array(bytes)) { decoded.append($0) }
            for piece in decoded { try append(piece) }
        } else {
            try append(Array(bytes))
        }
    }

    private mutating func append(_ bytes: [UInt8]) throws {
        pending += bytes
        if pending.count >= 1 << 20 { try flush() }
    }

    /// Writes what is gathered; identity bytes are hashed here, so a resumed body's MD5
    /// covers exactly what the file holds.
    mutating func flush() throws {
        guard !pending.isEmpty else { return }
        if checkMD5 && decoder == nil { md5.update(pending) }
        try pending.withUnsafeBytes { try writer.write($0) }
        pending.removeAll(keepingCapacity: true)
        transfer.progressed(to: writer.length)
    }

    /// Drops everything received and starts a new file.
    mutating func restart() throws {
        writer.cancel()
        writer = try blobs.makeWriter()
        md5 = MessageDigest(.md5)
        pending.removeAll(keepingCapacity: true)
        transfer.started(writingTo: writer.temporaryPath)
    }
}
