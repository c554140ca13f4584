import DocumentModel
import DocumentStore
import Foundation
import NIOCore

/// A request's MIME multipart body read as it arrives (`MultipartParser` fed from the
/// request's pieces): part headers, then each part's bytes in pieces, so a 2 GiB attachment
/// part never sits in memory.
final class MultipartReader {
    private enum Item {
        case part([String: String])
        case bytes([UInt8])
        case partEnd
    }

    private let source: () async throws -> ByteBuffer?
    private var parser: MultipartParser!
    /// What the parser read from the last piece, not yet taken.
    private var items: [Item] = []
    private var head = 0
    private var sourceEnded = false

    init(boundary: String, source: @escaping () async throws -> ByteBuffer?) {
        self.source = source
        parser = MultipartParser(boundary: boundary) { [unowned self] event in
            switch event {
            case .part(let headers): items.append(.part(headers))
            case .bytes(let bytes): items.append(.bytes(Array(bytes)))
            case .partEnd: items.append(.partEnd)
            }
        }
    }

    static func malformed(_ why: String) -> HTTPError {
        HTTPError(.badRequest, "bad_request", "malformed multipart body: \(why)", closeConnection: true)
    }

    /// The next thing read; nil at the end of the body.
    private func next() async throws -> Item? {
        while head == items.count {
            items.removeAll(keepingCapacity: true)
            head = 0
            guard !sourceEnded, !parser.isComplete else { return nil }
            do {
                if let chunk = try await source() {
                    try chunk.readableBytesView.withUnsafeBytes { try parser.feed($0) }
                } else {
                    sourceEnded = true
                    try parser.finish()
                }
            } catch let error as MultipartError {
                throw MultipartReader.malformed(error.reason)
            }
        }
        defer { head += 1 }
        return items[head]
    }

    /// The headers of the next part (names lowercased); nil after the last part.
    func nextPart() async throws -> [String: String]? {
        while let item = try await next() {
            if case .part(let headers) = item { return headers }
        }
        return nil
    }

    /// The next bytes of the current part; nil at its end.
    func readChunk() async throws -> [UInt8]? {
        switch try await next() {
        case .bytes(let bytes): return bytes
        case .part:
            head -= 1  // the next part's; left for nextPart
            return nil
        case .partEnd, nil: return nil
        }
    }

    /// A whole (small) part.
    func readPart(limit: Int) async throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let chunk = try await readChunk() {
            bytes += chunk
            guard bytes.count <= limit else {
                throw HTTPError(.payloadTooLarge, "too_large", "a JSON part is larger than \(limit) bytes", closeConnection: true)
            }
        }
        return bytes
    }
}

/// A random MIME boundary: 32 hex digits, as CouchDB makes them.
func makeBoundary() -> String {
    (0..<16).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
}

extension ResponseWriter {
    /// Streams a blob's bytes, in pieces of `pieceSize`: the whole body, read in order so
    /// the reader verifies its hash at the end, or `length` bytes from `offset` (a range).
    func streamBody(_ box: ReaderBox, server: CouchServer, offset: Int64? = nil, length: Int64, pieceSize: Int = ServerTuning.bodyPiece) async throws {
        // One piece is read (and hashed) on the pool while the previous one is being sent.
        func read(from start: Int64) -> Task<ByteBuffer, any Error> {
            let count = Int(min(Int64(pieceSize), length - start))
            return Task { try await server.blocking { try box.piece(count: count, at: offset.map { $0 + start }, endsAt: start + Int64(count) == length) } }
        }
        var sent: Int64 = 0
        var next: Task<ByteBuffer, any Error>? = length > 0 ? read(from: 0) : nil
        while let current = next {
            let piece: ByteBuffer
            piece = try await current.value
            sent += Int64(piece.readableBytes)
            next = sent < length ? read(from: sent) : nil
            do {
                try await write(piece)
            } catch {
                next?.cancel()
                _ = try? await next?.value  // the read ahead, cancelled: the write's error is the answer
                throw error
            }
        }
    }
}

/// Carries a body reader into pool closures; used by one request at a time, one piece at a time.
/// A stored body is a `BlobReader` (hash-checked when read in order); a deferred one is fetched
/// from the remote by a `BodyReader` (checked by its digest when complete, before it is kept).
final class ReaderBox: @unchecked Sendable {
    private let blob: BlobReader?
    private let deferred: (any BodyReader)?
    /// Where the next in-order piece of a deferred body starts.
    private var next: Int64 = 0

    init(_ reader: BlobReader) {
        blob = reader
        deferred = nil
    }

    init(_ reader: any BodyReader) {
        blob = nil
        deferred = reader
    }

    deinit { deferred?.close() }

    /// For a deferred body: waits until the byte at `offset` is here, so that an answer starts
    /// only once its first bytes can be sent (a remote that cannot be read fails the request
    /// with a status instead of a cut connection).
    func awaitFirstByte(at offset: Int64) throws {
        guard let deferred, offset < deferred.length else { return }
        var byte: UInt8 = 0
        _ = try withUnsafeMutableBytes(of: &byte) { try deferred.read(into: $0, at: offset, timeout: ServerTuning.deferredReadTimeout) }
    }

    /// `count` bytes, from `position` (a range, unverified) or next in order (verified:
    /// the last piece is only returned once the whole body matched its hash).
    func piece(count: Int, at position: Int64?, endsAt last: Bool) throws -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: count)
        var filled = 0
        while filled < count {
            let read = try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count - filled) { raw in
                let target = UnsafeMutableRawBufferPointer(rebasing: raw.prefix(count - filled))
                if let deferred {
                    return try deferred.read(into: target, at: (position ?? next) + Int64(filled), timeout: ServerTuning.deferredReadTimeout)
                }
                return try position.map { try blob!.read(into: target, at: $0 + Int64(filled)) } ?? blob!.read(into: target)
            }
            guard read > 0 else { throw corrupted }
            filled += read
        }
        if deferred != nil {
            if position == nil { next += Int64(count) }
        } else if position == nil && last {
            var probe: UInt8 = 0
            guard try withUnsafeMutableBytes(of: &probe, { try blob!.read(into: $0) }) == 0 else { throw corrupted }
        }
        return buffer
    }

    private var corrupted: SofaError {
        blob.map { SofaError.blobCorrupted(key: $0.key.hex, path: $0.path) } ?? SofaError.invalidArgument("a deferred body ended early")
    }
}
