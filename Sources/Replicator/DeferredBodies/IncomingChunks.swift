import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// `Content-Range: bytes FIRST-LAST/TOTAL`.
struct ContentRange {
    let first: Int64
    let last: Int64
    let total: Int64

    init?(_ header: String) {
        guard header.hasPrefix("bytes ") else { return nil }
        let parts = header.dropFirst(6).split(separator: "/")
        guard parts.count == 2, let total = Int64(parts[1]) else { return nil }
        let bounds = parts[0].split(separator: "-")
        guard bounds.count == 2, let first = Int64(bounds[0]), let last = Int64(bounds[1]), first <= last else { return nil }
        (self.first, self.last, self.total) = (first, last, total)
    }
}

/// Bytes of one answer written where they belong in the partial body; each chunk they
/// complete is marked present and reported (`arrived` gets the next chunk expected).
final class IncomingChunks: @unchecked Sendable {
    // Sendable invariant: fed by one transfer at a time (a BLIP reply's chunks come from its connection's actor, in order).
    let body: PartialBody
    let fetch: ChunkFetch
    let from: Int64
    let decoder: GzipDecoder?
    let md5: MessageDigest?
    let room: CacheRoom
    private(set) var position: Int64

    init(body: PartialBody, fetch: ChunkFetch, from: Int64, decoder: GzipDecoder?, md5: MessageDigest?, room: CacheRoom) {
        self.body = body
        self.fetch = fetch
        self.from = from
        self.decoder = decoder
        self.md5 = md5
        self.room = room
        position = from
    }

    func receive(_ bytes: UnsafeRawBufferPointer, arrived: (Int) -> Void) throws {
        md5?.update(bytes)
        if let decoder {
            var pieces: [[UInt8]] = []
            try decoder.decode(Array(bytes)) { pieces.append($0) }
            for piece in pieces { try piece.withUnsafeBytes { try write($0, arrived: arrived) } }
        } else {
            try write(bytes, arrived: arrived)
        }
    }

    /// Bytes received past `position` that do not yet fill a block of the body: a body sealed
    /// on disk (an encrypted database) is written a whole 4 KiB block at a time, or up to its end.
    private var pending: [UInt8] = []
    static let blockSize = 4096

    private func write(_ bytes: UnsafeRawBufferPointer, arrived: (Int) -> Void) throws {
        guard position + Int64(pending.count + bytes.count) <= body.length else {
            throw ReplicationError.protocolError("\(body.digest): more bytes than the body's \(body.length)")
        }
        room.reserve(Int64(bytes.count))
        let whole: Int
        if body.takesWholeBlocksOnly {
            pending.append(contentsOf: bytes)
            let end = position + Int64(pending.count)
            whole = end == body.length ? pending.count : pending.count - Int(end % Int64(IncomingChunks.blockSize))
            guard whole > 0 else { return }
            try pending.withUnsafeBytes { try body.write(UnsafeRawBufferPointer(rebasing: $0[0..<whole]), at: position) }
            pending.removeFirst(whole)
        } else {
            whole = bytes.count
            try body.write(bytes, at: position)
        }
        let before = Int(position / Int64(PartialBody.chunkSize))
        position += Int64(whole)
        let complete = position == body.length ? body.chunkCount : Int(position / Int64(PartialBody.chunkSize))
        if complete > before {
            body.markPresent(before..<complete)
            arrived(complete)
        }
    }

    func finish() throws {
        guard let decoder else { return }
        do { try decoder.finish() } catch {
            throw ReplicationError.protocolError("\(body.digest): truncated gzip body")
        }
    }
}
