import BLIP
import DocumentModel
import DocumentStore
import Foundation

/// Attachment and blob bodies: those this side sends when asked (`getAttachment`,
/// `proveAttachment`) and those it asks the other side for.
extension BLIPReplicator {
    /// `getAttachment`: the body with `digest`, streamed from the blob store; on a server whose
    /// database left the body on its own remote, fetched from there as it streams.
    func sendBody(_ request: BLIPMessage) async throws {
        let digest = try Self.required(request, "digest")
        let source = try await openBody(digest: digest, docID: request["docID"])
        await connection.reply(to: request, source: source)
    }

    /// `proveAttachment`: the SHA-1 of the nonce's length, the nonce and the body, as a digest,
    /// to show that this side has the body without sending it.
    func proveBody(_ request: BLIPMessage) async throws {
        let digest = try Self.required(request, "digest")
        guard (16...255).contains(request.body.count) else { throw BLIPError.badRequest("proveAttachment: the nonce must have 16 to 255 bytes") }
        let db = database
        let proof = try await pool.run { () -> String in
            guard let body = try db.openBody(digest: digest) else { throw BLIPError.notFound("no attachment body with digest \(digest) is here") }
            return try body.proof(nonce: request.body)
        }
        await connection.reply(to: request, body: Array(proof.utf8))
    }

    private func openBody(digest: String, docID: String?) async throws -> BLIPBodyReader {
        let db = database
        let bodySource: (any BodySource)? = if case .passive(let passive) = role { passive.bodySource } else { nil }
        return try await pool.run { () -> BLIPBodyReader in
            if let body = try db.openBody(digest: digest) { return { maximum in try body.read(maximum) } }
            // Deferred here: the attachment of that document naming this body, read through the source.
            guard let bodySource, let docID, let revision = try db.currentRevision(of: docID),
                  let attachment = revision.attachments.first(where: { $0.digest == digest || $0.blobKey?.digestString == digest }) else {
                throw BLIPError.notFound("no attachment body with digest \(digest) is here")
            }
            let reader = try bodySource.open(attachment, docID: docID, revID: revision.revID)
            return RemoteBodyChunks(reader, length: attachment.length).read
        }
    }

    /// Asks the other side for the body with `digest` (SHA-1) and stores it, checked against
    /// it as it arrives, not yet synced. The half-written file is dropped if the connection
    /// ends first.
    func fetchBody(digest: String, docID: String) async throws -> StoredBlob {
        guard let key = BlobKey(digestString: digest) else {
            throw BLIPError.badRequest("\(docID): the digest \(digest) is not a SHA-1 digest (sha1-…), which is what Couchbase Lite sends")
        }
        await bodyPermits.acquire()
        defer { bodyPermits.release() }
        let writer = try database.blobs.makeWriter()
        // Whoever takes the writer out of `incoming` ends it: this fetch, or `close` (once).
        guard let token = incoming.register(writer) else { throw BLIPSyncError.closed("the replication stopped") }
        do {
            _ = try await request("getAttachment", [("digest", digest), ("docID", docID)], sink: WriterSink(writer))
            guard incoming.take(token) else { throw BLIPSyncError.closed("the replication stopped") }
            // Synced with the other bodies of its batch before the revision naming it is saved
            // (`Inserter`), as a pull over HTTP syncs the bodies that came with its revisions.
            return try writer.finish(expecting: key, durable: false)
        } catch {
            if incoming.take(token) { writer.cancel() }
            throw error
        }
    }
}

/// The blob writers of bodies being received: each connection drops its own half-written files
/// when it closes (a client killed in the middle of a push leaves nothing in `attachments/tmp`).
final class IncomingBodies: Sendable {
    private let writers = Locked<(next: Int, open: [Int: BlobWriter], closed: Bool)>((0, [:], false))

    /// Registers `writer`; nil (and the writer cancelled) once the connection has closed.
    func register(_ writer: BlobWriter) -> Int? {
        let token = writers.withLock { state -> Int? in
            guard !state.closed else { return nil }
            state.next += 1
            state.open[state.next] = writer
            return state.next
        }
        if token == nil { writer.cancel() }
        return token
    }

    /// Takes the writer back; false when `cancelAll` took (and cancelled) it first.
    func take(_ token: Int) -> Bool {
        writers.withLock { $0.open.removeValue(forKey: token) != nil }
    }

    /// Cancels every writer still open, and any registered from now on. Called once the
    /// connection is closed, so that no body chunk is written into them any more.
    func cancelAll() {
        let open = writers.withLock { state -> [BlobWriter] in
            state.closed = true
            defer { state.open = [:] }
            return Array(state.open.values)
        }
        open.forEach { $0.cancel() }
    }

}

/// A body arriving in a reply, into the blob store.
private final class WriterSink: BLIPBodySink, @unchecked Sendable {
    // Sendable invariant: written by the connection's actor only, then finished by the one waiting for it.
    private let writer: BlobWriter

    init(_ writer: BlobWriter) { self.writer = writer }

    func write(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try writer.write($0) } }
}

/// A deferred body read in order from its source (the database's remote), for a reply.
private final class RemoteBodyChunks: @unchecked Sendable {
    // Sendable invariant: `offset` is only touched by the one sender reading it at a time.
    private let reader: any BodyReader
    private let length: Int64
    private var offset: Int64 = 0

    init(_ reader: any BodyReader, length: Int64) {
        self.reader = reader
        self.length = length
    }

    deinit { reader.close() }

    func read(_ maximum: Int) throws -> [UInt8]? {
        guard offset < length else { return nil }
        var chunk = [UInt8](repeating: 0, count: maximum)
        let count = try chunk.withUnsafeMutableBytes { try reader.read(into: $0, at: offset, timeout: BLIPTuning.bodyFetchTimeout) }
        guard count > 0 else { throw SofaError.bodyNotAvailable(docID: "", name: "the body ended at byte \(offset) of \(length)") }
        offset += Int64(count)
        return Array(chunk[..<count])
    }
}

extension BLIPReplicator {
    /// Asks the other side for the body with `digest` and hands its bytes to `received` as they
    /// arrive (on the connection's actor: it must not wait on this engine). For a body read
    /// later than its revision arrived (`sofa pull --no-download-attachments`, then a read).
    public func streamBody(digest: String, docID: String, into received: @escaping @Sendable ([UInt8]) throws -> Void) async throws {
        _ = try await request("getAttachment", [("digest", digest), ("docID", docID)], sink: ClosureSink(received))
    }
}

/// A body arriving in a reply, handed over chunk by chunk.
private final class ClosureSink: BLIPBodySink, @unchecked Sendable {
    // Sendable invariant: called by the connection's actor only.
    private let received: @Sendable ([UInt8]) throws -> Void

    init(_ received: @escaping @Sendable ([UInt8]) throws -> Void) { self.received = received }

    func write(_ bytes: [UInt8]) throws { try received(bytes) }
}

/// At most a number of holders at once; the others wait their turn, first come first served.
final class Permits: Sendable {
    private let state: Locked<(available: Int, waiting: [CheckedContinuation<Void, Never>])>

    init(_ count: Int) { state = Locked((count, [])) }

    func acquire() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                guard state.available > 0 else {
                    state.waiting.append(continuation)
                    return false
                }
                state.available -= 1
                return true
            }
            if now { continuation.resume() }
        }
    }

    func release() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiting.isEmpty else {
                state.available += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }
}
