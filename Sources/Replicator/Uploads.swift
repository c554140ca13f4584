import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport

/// Bytes read a piece at a time: a blob, or a body being encoded on the way.
protocol ByteStream: AnyObject {
    /// Fills up to `buffer.count` bytes; 0 at the end.
    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int
}

extension BlobReader: ByteStream {}

/// A request body made of pieces that curl reads one after the other: bytes held, or a
/// stream opened when its turn comes, so that a body is never whole in memory.
final class PiecewiseUpload: UploadSource {
    enum Piece {
        case bytes([UInt8])
        case stream(length: Int64, open: () throws -> ByteStream)
    }

    private let pieces: [Piece]
    private var current = 0
    private var offset = 0
    private var stream: ByteStream?
    let length: Int64

    init(_ pieces: [Piece]) {
        self.pieces = pieces
        length = pieces.reduce(0) { total, piece in
            switch piece {
            case .bytes(let bytes): total + Int64(bytes.count)
            case .stream(let length, _): total + length
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
            case .stream(_, let open):
                if stream == nil { stream = try open() }
                let count = try stream!.read(into: buffer)
                if count > 0 { return count }
                stream = nil
            }
            current += 1
            offset = 0
        }
        return 0
    }

    /// `multipart/related` for `PUT /db/doc?new_edits=false`: the JSON part, then each
    /// attachment streamed from its blob.
    static func multipart(json: [UInt8], attachments: [Attachment], boundary: String,
                          open: @escaping (Attachment) throws -> BlobReader) -> PiecewiseUpload {
        var pieces: [Piece] = [.bytes(Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8) + json)]
        for attachment in attachments {
            pieces.append(.bytes(Array("\r\n--\(boundary)\r\n\(CouchFormat.partHeaders(attachment))".utf8)))
            pieces.append(.stream(length: attachment.length) { try open(attachment) })
        }
        pieces.append(.bytes(Array("\r\n--\(boundary)--".utf8)))
        return PiecewiseUpload(pieces)
    }

    /// `{"new_edits":false,"docs":[…]}`: each document's JSON with the bodies it must send
    /// inline as base64, encoded from their blobs as curl reads, in `_attachments` order;
    /// stubs stay stubs.
    static func inlineBulkDocs(_ documents: [(rendered: CouchFormat.Rendered, docID: String)],
                               open: @escaping (Attachment, String) throws -> BlobReader) -> PiecewiseUpload {
        var pieces: [Piece] = []
        var text: [UInt8] = Array(#"{"new_edits":false,"docs":["#.utf8)
        for (index, (rendered, docID)) in documents.enumerated() {
            if index > 0 { text += Array(",".utf8) }
            guard !rendered.following.isEmpty else {
                text += JSONValue.object(rendered.json).serialized()
                continue
            }
            var json = rendered.json
            let attachments = json["_attachments"]?.objectValue ?? [:]
            json["_attachments"] = nil
            text += json.isEmpty ? Array("{".utf8) : Array(JSONValue.object(json).serialized().dropLast()) + Array(",".utf8)
            text += Array(#""_attachments":{"#.utf8)
            let following = Dictionary(rendered.following.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
            for (position, (name, entry)) in attachments.enumerated() {
                if position > 0 { text += Array(",".utf8) }
                text += JSONValue.string(name).serialized() + Array(":".utf8)
                guard let attachment = following[name] else {
                    text += entry.serialized()
                    continue
                }
                var meta = JSONObject()
                meta["content_type"] = entry["content_type"]
                meta["revpos"] = entry["revpos"]
                // CouchDB's kind of digest goes along, so that a copy shows the digest it was given
                // (CouchDB recomputes its own and ignores it; Sofa keeps it when it names these bytes).
                if let digest = entry["digest"]?.stringValue, digest.hasPrefix("md5-") { meta["digest"] = .string(digest) }
                text += Array(JSONValue.object(meta).serialized().dropLast()) + Array(#","data":""#.utf8)
                pieces.append(.bytes(text))
                text = []
                pieces.append(.stream(length: (attachment.length + 2) / 3 * 4) { Base64Stream(try open(attachment, docID)) })
                text += Array(#""}"#.utf8)
            }
            text += Array("}}".utf8)
        }
        pieces.append(.bytes(text + Array("]}".utf8)))
        return PiecewiseUpload(pieces)
    }
}

/// A stream's bytes as base64, encoded a piece at a time (whole groups of 3 bytes until the end).
final class Base64Stream: ByteStream {
    private let source: ByteStream
    /// Bytes read and not encoded yet (fewer than 3), and encoded ones not handed over yet.
    private var leftover: [UInt8] = []
    private var encoded: [UInt8] = []
    private var offset = 0
    private var ended = false
    private var chunk = [UInt8](repeating: 0, count: 48 * 1024)

    init(_ source: ByteStream) { self.source = source }

    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        while offset == encoded.count {
            guard !ended else { return 0 }
            let count = try chunk.withUnsafeMutableBytes { try source.read(into: $0) }
            var bytes = leftover + chunk[..<count]
            if count == 0 {
                ended = true
                leftover = []
            } else {
                let whole = bytes.count / 3 * 3
                leftover = Array(bytes[whole...])
                bytes = Array(bytes[..<whole])
            }
            (encoded, offset) = (Array(Data(bytes).base64EncodedData()), 0)
        }
        let count = min(buffer.count, encoded.count - offset)
        encoded.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: count) }
        offset += count
        return count
    }
}
