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
        let name = attachment.name.split(separator: "/", omittingEmptySubsequences: false).map { pathSegment(String($0)) }.joined(separator: "/")
        let url = remote.url("\(pathSegment(docID))/\(name)?rev=\(revID)")

        var writer = try database.blobs.makeWriter()
        var md5 = MessageDigest(.md5)
        transfer.started(writingTo: writer.temporaryPath)
        defer { writer.cancel() }
        return try client.withRetry {
            let resumeFrom = writer.length
            var decoder: GzipDecoder?
            var checked = false
            var headers = ["Accept": "*/*", "Accept-Encoding": "gzip"]
            if resumeFrom > 0 { headers["Range"] = "bytes=\(resumeFrom)-" }
            let answer = try client.send("GET", url, headers: headers) { bytes, status, responseHeaders in
                guard status < 300 else { return false }
                if !checked {
                    checked = true
                    if resumeFrom > 0 && status != 206 {
                        // The server sent the whole body again: start over.
                        writer.cancel()
                        writer = try self.database.blobs.makeWriter()
                        md5 = MessageDigest(.md5)
                        transfer.started(writingTo: writer.temporaryPath)
                    }
                    if responseHeaders["content-encoding"]?.lowercased() == "gzip" {
                        if writer.length > 0 {
                            writer.cancel()
                            writer = try self.database.blobs.makeWriter()
                            md5 = MessageDigest(.md5)
                            transfer.started(writingTo: writer.temporaryPath)
                        }
                        decoder = try GzipDecoder()
                    }
                }
                md5.update(bytes)
                if let decoder {
                    try decoder.decode(Array(bytes)) { piece in try piece.withUnsafeBytes { try writer.write($0) } }
                } else {
                    try writer.write(bytes)
                }
                transfer.progressed(to: writer.length)
                return true
            }
            guard answer.status < 300 else { throw client.httpError(answer, url: url) }
            if let decoder {
                // A gzip stream cannot be resumed from the middle: an interrupted one starts over.
                do { try decoder.finish() } catch {
                    writer.cancel()
                    writer = try database.blobs.makeWriter()
                    md5 = MessageDigest(.md5)
                    transfer.started(writingTo: writer.temporaryPath)
                    throw ReplicationError.protocolError("truncated gzip body")
                }
            }
            guard writer.length == attachment.length else {
                throw ReplicationError.protocolError("\(attachment.name): \(writer.length) of \(attachment.length) bytes arrived")
            }
            let received = "md5-" + Data(md5.finalize()).base64EncodedString()
            if attachment.digest.hasPrefix("md5-") && attachment.digest != received {
                writer.cancel()
                writer = try database.blobs.makeWriter()
                md5 = MessageDigest(.md5)
                transfer.started(writingTo: writer.temporaryPath)
                throw ReplicationError.protocolError("\(attachment.name): the body received does not match its digest \(attachment.digest)")
            }
            do {
                return try writer.finish(expecting: attachment.digest.hasPrefix("sha1-") ? BlobKey(digestString: attachment.digest) : nil)
            } catch SofaError.blobCorrupted {
                writer = try database.blobs.makeWriter()
                md5 = MessageDigest(.md5)
                transfer.started(writingTo: writer.temporaryPath)
                throw ReplicationError.protocolError("\(attachment.name): the body received does not match its digest \(attachment.digest)")
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
