import DocumentModel
import DocumentStore
import Foundation
import NIOCore

/// Reads a MIME multipart body as it arrives: part headers, then each part's
/// bytes in pieces, so a 2 GiB attachment part never sits in memory.
///
/// Tolerates what real clients send: a body that starts with the delimiter and
/// no preamble, parts without headers, and a close delimiter with or without a
/// trailing CRLF.
final class MultipartReader {
    private enum State { case preamble, headers, body, done }

    private let source: () async throws -> ByteBuffer?
    private let delimiter: [UInt8]
    private var buffer: [UInt8]
    private var position = 0
    private var sourceEnded = false
    private var state = State.preamble
    /// Limit on one part's header block.
    private static let maximumHeaderBytes = 64 * 1024

    init(boundary: String, source: @escaping () async throws -> ByteBuffer?) {
        self.source = source
        self.delimiter = Array("\r\n--\(boundary)".utf8)
        // A CRLF before the body makes a delimiter at its very start look like every other.
        self.buffer = [0x0D, 0x0A]
    }

    static func malformed(_ why: String) -> HTTPError {
        HTTPError(.badRequest, "bad_request", "malformed multipart body: \(why)", closeConnection: true)
    }

    /// Reads more input; false at its end.
    private func fill() async throws -> Bool {
        guard !sourceEnded else { return false }
        guard var chunk = try await source() else {
            sourceEnded = true
            return false
        }
        if position > 256 * 1024 && position * 2 > buffer.count {
            buffer.removeSubrange(..<position)
            position = 0
        }
        buffer.append(contentsOf: chunk.readBytes(length: chunk.readableBytes) ?? [])
        return true
    }

    private func find(_ needle: [UInt8], from start: Int) -> Int? {
        guard buffer.count - start >= needle.count else { return nil }
        return buffer.withUnsafeBytes { haystack in
            needle.withUnsafeBytes { pattern in
                let base = haystack.baseAddress!
                var at = start
                let last = haystack.count - pattern.count
                while at <= last {
                    // memchr finds candidates for the first byte quickly; memcmp confirms.
                    guard let hit = memchr(base + at, Int32(pattern[0]), last - at + 1) else { return nil }
                    let index = base.distance(to: UnsafeRawPointer(hit))
                    if memcmp(base + index, pattern.baseAddress!, pattern.count) == 0 { return index }
                    at = index + 1
                }
                return nil
            }
        }
    }

    /// The headers of the next part (names lowercased); nil after the last part.
    func nextPart() async throws -> [String: String]? {
        while state == .body { _ = try await readChunk() }
        if state == .preamble {
            while true {
                if let found = find(delimiter, from: position) {
                    position = found + delimiter.count
                    state = .headers
                    break
                }
                position = max(position, buffer.count - delimiter.count)
                guard try await fill() else { throw MultipartReader.malformed("no opening boundary") }
            }
        }
        guard state == .headers else { return nil }
        // After a delimiter: "--" closes; otherwise optional padding, CRLF, headers, CRLF.
        while buffer.count - position < 2 {
            guard try await fill() else { throw MultipartReader.malformed("ends after a boundary") }
        }
        if buffer[position] == UInt8(ascii: "-") && buffer[position + 1] == UInt8(ascii: "-") {
            state = .done
            return nil
        }
        var lineEnd: Int
        while true {
            if let found = find([0x0D, 0x0A], from: position) { lineEnd = found; break }
            guard buffer.count - position < MultipartReader.maximumHeaderBytes, try await fill() else {
                throw MultipartReader.malformed("unterminated boundary line")
            }
        }
        var headerEnd: Int
        while true {
            if let found = find([0x0D, 0x0A, 0x0D, 0x0A], from: lineEnd) { headerEnd = found; break }
            guard buffer.count - lineEnd < MultipartReader.maximumHeaderBytes, try await fill() else {
                throw MultipartReader.malformed("unterminated part headers")
            }
        }
        var headers: [String: String] = [:]
        if headerEnd > lineEnd {
            let text = String(decoding: buffer[(lineEnd + 2)..<headerEnd], as: UTF8.self)
            for line in text.split(separator: "\r\n") {
                guard let colon = line.firstIndex(of: ":") else { throw MultipartReader.malformed("bad part header line") }
                headers[line[..<colon].trimmingCharacters(in: .whitespaces).lowercased()] =
                    line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
        }
        position = headerEnd + 4
        state = .body
        return headers
    }

    /// The next bytes of the current part; nil at its end.
    func readChunk() async throws -> [UInt8]? {
        guard state == .body else { return nil }
        while true {
            if let found = find(delimiter, from: position) {
                if found > position {
                    let bytes = Array(buffer[position..<found])
                    position = found
                    return bytes
                }
                position = found + delimiter.count
                state = .headers
                return nil
            }
            // Everything but a possible partial delimiter at the end is part data.
            let safeEnd = buffer.count - (delimiter.count - 1)
            if safeEnd - position >= 64 * 1024 || (safeEnd > position && sourceEnded) {
                let bytes = Array(buffer[position..<safeEnd])
                position = safeEnd
                return bytes
            }
            guard try await fill() else {
                if safeEnd > position { continue }
                throw MultipartReader.malformed("a part is not closed by a boundary")
            }
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

/// Where an uploaded attachment body goes: decoded if gzip, hashed (MD5 of what
/// came in, MD5 of the decoded bytes) and streamed into the blob store.
final class AttachmentSink: @unchecked Sendable {
    // Sendable invariant: used by one request at a time, serially.
    private let writer: BlobWriter
    private let inflater: GzipDecoder?
    private let encodedMD5 = MessageDigest(.md5)
    private let identityMD5 = MessageDigest(.md5)
    private(set) var encodedLength: Int64 = 0

    init(blobs: BlobStore, gzip: Bool) throws {
        writer = try blobs.makeWriter()
        inflater = gzip ? try GzipDecoder() : nil
    }

    func write(_ bytes: [UInt8]) throws {
        encodedLength += Int64(bytes.count)
        encodedMD5.update(bytes)
        if let inflater {
            try inflater.decode(bytes) { try writeIdentity($0) }
        } else {
            try writeIdentity(bytes)
        }
    }

    private func writeIdentity(_ bytes: [UInt8]) throws {
        identityMD5.update(bytes)
        try bytes.withUnsafeBytes { try writer.write($0) }
    }

    /// Completes the blob. `claimedDigest` (`md5-…` or `sha1-…`) is checked against the
    /// bytes as sent; the digest returned describes the bytes as stored.
    func finish(claimedDigest: String?) throws -> (blob: StoredBlob, digest: String) {
        do {
            try inflater?.finish()
            let blob = try writer.finish()
            let identity = "md5-" + Data(identityMD5.finalize()).base64EncodedString()
            let encoded = "md5-" + Data(encodedMD5.finalize()).base64EncodedString()
            if let claimed = claimedDigest {
                let matches = claimed.hasPrefix("md5-") ? (claimed == encoded || claimed == identity)
                    : claimed.hasPrefix("sha1-") ? (inflater != nil || claimed == blob.key.digestString) : true
                guard matches else {
                    throw HTTPError(.badRequest, "bad_request", "attachment body does not match its digest \(claimed)")
                }
            }
            // Bodies are stored decoded, so a digest of gzip bytes no longer describes them.
            let digest = claimedDigest?.hasPrefix("md5-") == true ? identity : blob.key.digestString
            return (blob, digest)
        } catch {
            writer.cancel()
            throw error
        }
    }

    func cancel() { writer.cancel() }
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
