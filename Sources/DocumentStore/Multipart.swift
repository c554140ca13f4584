import DocumentModel
import Foundation

/// Reads a MIME multipart body pushed to it in pieces of any size (curl's receive callback,
/// a server's request body): each part's headers, then its bytes as they come, so a 2 GiB
/// attachment part never sits in memory. Nested multiparts (`multipart/mixed` holding
/// `multipart/related`, as `_bulk_get` answers) are read by feeding a part's bytes to
/// another parser.
///
/// Tolerates what real peers send: a body that starts with the delimiter and no preamble,
/// parts without headers, and a close delimiter with or without a trailing CRLF.
public final class MultipartParser {
    public enum Event {
        /// A part begins; header names are lowercased.
        case part([String: String])
        /// Bytes of the current part (valid only during the call).
        case bytes(UnsafeRawBufferPointer)
        /// The current part ended.
        case partEnd
    }

    private enum State { case preamble, afterDelimiter, body, done }

    private let delimiter: [UInt8]
    private let handle: (Event) throws -> Void
    private var buffer: [UInt8]
    private var position = 0
    private var state = State.preamble
    /// Limit on one part's header block.
    public static let maximumHeaderBytes = 64 * 1024

    public init(boundary: String, handle: @escaping (Event) throws -> Void) {
        delimiter = Array("\r\n--\(boundary)".utf8)
        self.handle = handle
        // A CRLF before the body makes a delimiter at its very start look like every other.
        buffer = [0x0D, 0x0A]
    }

    /// The close delimiter has been read (anything after it is ignored).
    public var isComplete: Bool { state == .done }

    public func feed(_ bytes: UnsafeRawBufferPointer) throws {
        guard state != .done, !bytes.isEmpty else { return }
        buffer.append(contentsOf: bytes)
        try process()
        buffer.removeSubrange(..<position)
        position = 0
    }

    public func feed(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try feed($0) }
    }

    /// The input ended: throws unless the close delimiter was read.
    public func finish() throws {
        guard state == .done else {
            throw MultipartError(state == .body ? "a part is not closed by a boundary" : "the body ends before its close delimiter")
        }
    }

    private func process() throws {
        while true {
            switch state {
            case .done:
                position = buffer.count
                return
            case .preamble:
                guard let found = find(delimiter, from: position) else {
                    position = max(position, buffer.count - delimiter.count)
                    return
                }
                position = found + delimiter.count
                state = .afterDelimiter
            case .afterDelimiter:
                // "--" closes; otherwise optional padding, CRLF, headers, CRLF.
                guard buffer.count - position >= 2 else { return }
                if buffer[position] == UInt8(ascii: "-") && buffer[position + 1] == UInt8(ascii: "-") {
                    state = .done
                    continue
                }
                guard let lineEnd = find([0x0D, 0x0A], from: position) else {
                    if buffer.count - position > MultipartParser.maximumHeaderBytes { throw MultipartError("unterminated boundary line") }
                    return
                }
                guard let headerEnd = find([0x0D, 0x0A, 0x0D, 0x0A], from: lineEnd) else {
                    if buffer.count - lineEnd > MultipartParser.maximumHeaderBytes { throw MultipartError("unterminated part headers") }
                    return
                }
                var headers: [String: String] = [:]
                if headerEnd > lineEnd {
                    // By bytes: a `_bulk_get` answer has a few headers per document, thousands a second.
                    for line in buffer[(lineEnd + 2)..<headerEnd].split(separator: 0x0A) {
                        guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { throw MultipartError("bad part header line") }
                        headers[MultipartParser.trimmed(line[..<colon]).lowercased()] = MultipartParser.trimmed(line[(colon + 1)...])
                    }
                }
                position = headerEnd + 4
                state = .body
                try handle(.part(headers))
            case .body:
                if let found = find(delimiter, from: position) {
                    try emit(upTo: found)
                    position = found + delimiter.count
                    state = .afterDelimiter
                    try handle(.partEnd)
                    continue
                }
                // Everything but a possible partial delimiter at the end is part data.
                try emit(upTo: buffer.count - (delimiter.count - 1))
                return
            }
        }
    }

    private func emit(upTo end: Int) throws {
        guard end > position else { return }
        try buffer.withUnsafeBytes { all in try handle(.bytes(UnsafeRawBufferPointer(rebasing: all[position..<end]))) }
        position = end
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

    /// The text of header bytes without the spaces, tabs and CR around it.
    private static func trimmed(_ bytes: ArraySlice<UInt8>) -> String {
        let blank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }
        guard let first = bytes.firstIndex(where: { !blank($0) }), let last = bytes.lastIndex(where: { !blank($0) }) else { return "" }
        return String(decoding: bytes[first...last], as: UTF8.self)
    }

    /// `text` without the spaces and tabs around it (Foundation's trimming is slow per part).
    private static func trimmed(_ text: Substring) -> Substring {
        let utf8 = text.utf8
        var (start, end) = (utf8.startIndex, utf8.endIndex)
        while start < end, utf8[start] == 0x20 || utf8[start] == 0x09 { start = utf8.index(after: start) }
        while end > start, utf8[utf8.index(before: end)] == 0x20 || utf8[utf8.index(before: end)] == 0x09 { end = utf8.index(before: end) }
        return text[start..<end]
    }

    /// A parameter of a header value (`boundary` of a Content-Type, `filename` of a
    /// Content-Disposition), unquoted; nil when absent.
    public static func parameter(_ value: String, _ name: String) -> String? {
        for piece in value.split(separator: ";").dropFirst() {
            let pair = piece.split(separator: "=", maxSplits: 1)
            guard pair.count == 2, trimmed(pair[0]).lowercased() == name else { continue }
            var result = String(trimmed(pair[1]))
            if result.count >= 2 && result.hasPrefix("\"") && result.hasSuffix("\"") {
                result = String(result.dropFirst().dropLast())
            }
            return result
        }
        return nil
    }

    /// The media type of a Content-Type value, lowercased, without parameters.
    public static func mediaType(_ value: String) -> String {
        value.split(separator: ";", maxSplits: 1).first.map { trimmed($0).lowercased() } ?? ""
    }
}

extension IncomingAttachment {
    /// Takes from `following` (a document's attachments marked `follows`, in order) the one a
    /// body part carries: by the part's filename, else the next; nil when none is left for it.
    /// `gzip`: the part is gzip-encoded (its header, or the attachment's `encoding`).
    public static func take(partWith headers: [String: String], from following: inout [IncomingAttachment])
        -> (attachment: IncomingAttachment, gzip: Bool)? {
        let named = headers["content-disposition"].flatMap { MultipartParser.parameter($0, "filename") }
        guard let index = named.flatMap({ name in following.firstIndex { $0.name == name } }) ?? (following.isEmpty ? nil : 0) else {
            return nil
        }
        let attachment = following.remove(at: index)
        return (attachment, (headers["content-encoding"] ?? attachment.encoding)?.lowercased() == "gzip")
    }

    /// The document's attachments whose bodies follow as parts.
    public static func following(in document: IncomingDocument) -> [IncomingAttachment] {
        (document.attachments ?? []).filter { if case .follows = $0.body { true } else { false } }
    }
}

/// A multipart body that cannot be read; says what is wrong with it.
public struct MultipartError: Error, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { "malformed multipart body: \(reason)" }
}

/// Where an attachment body arriving from a peer goes: decoded if gzip, hashed (MD5 of what
/// came in, MD5 of the decoded bytes) and streamed into the blob store, then checked against
/// the digest and length its sender claimed before it is installed.
public final class IncomingBody: @unchecked Sendable {
    // Sendable invariant: used by one request at a time, serially (a server hands it between threads).
    private let writer: BlobWriter
    private let inflater: GzipDecoder?
    /// MD5 of the bytes as received, when they are gzip (else they are the identity bytes).
    private let encodedMD5 = MessageDigest(.md5)
    private let identityMD5 = MessageDigest(.md5)
    /// Bytes received (encoded, if gzip).
    public private(set) var receivedLength: Int64 = 0
    /// Bytes stored (decoded).
    public var length: Int64 { writer.length }

    public init(blobs: BlobStore, gzip: Bool) throws {
        writer = try blobs.makeWriter()
        inflater = gzip ? try GzipDecoder() : nil
    }

    public func write(_ bytes: UnsafeRawBufferPointer) throws {
        receivedLength += Int64(bytes.count)
        guard let inflater else { return try writeIdentity(bytes) }
        encodedMD5.update(bytes)
        try inflater.decode(Array(bytes)) { piece in try piece.withUnsafeBytes { try writeIdentity($0) } }
    }

    public func write(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try write($0) }
    }

    private func writeIdentity(_ bytes: UnsafeRawBufferPointer) throws {
        identityMD5.update(bytes)
        try writer.write(bytes)
    }

    /// Installs the blob when the bytes match `claimedDigest` (`md5-…` of the bytes as sent or
    /// as decoded, or `sha1-…` of the decoded bytes; unchecked for gzip bodies, whose sender
    /// may mean either) and `claimedLength` (decoded); a body that does not is never stored
    /// (`IncomingBodyMismatch`). The digest returned describes the bytes as stored.
    public func finish(claimedDigest: String?, claimedLength: Int64? = nil, durable: Bool = true) throws
        -> (blob: StoredBlob, digest: String) {
        do {
            try inflater?.finish()
            let identity = "md5-" + Data(identityMD5.finalize()).base64EncodedString()
            // Bytes that were not encoded are their own encoded form: one MD5 for both.
            let encoded = inflater == nil ? identity : "md5-" + Data(encodedMD5.finalize()).base64EncodedString()
            let mismatch = IncomingBodyMismatch(claimedDigest: claimedDigest, claimedLength: claimedLength, length: writer.length)
            if let claimedLength, claimedLength != writer.length { throw mismatch }
            var expected: BlobKey?
            if let claimed = claimedDigest, claimed.hasPrefix("md5-") {
                guard claimed == encoded || claimed == identity else { throw mismatch }
            } else if let claimed = claimedDigest, claimed.hasPrefix("sha1-"), inflater == nil {
                guard let key = BlobKey(digestString: claimed) else { throw mismatch }
                expected = key
            }
            let blob: StoredBlob
            do {
                blob = try writer.finish(expecting: expected, durable: durable)
            } catch SofaError.blobCorrupted {
                throw mismatch
            }
            // Bodies are stored decoded, so a digest of gzip bytes no longer describes them.
            return (blob, claimedDigest?.hasPrefix("md5-") == true ? identity : blob.key.digestString)
        } catch {
            writer.cancel()
            throw error
        }
    }

    public func cancel() { writer.cancel() }
}

/// An attachment body whose bytes do not match the digest or length its sender gave.
public struct IncomingBodyMismatch: Error, CustomStringConvertible {
    public let claimedDigest: String?
    public let claimedLength: Int64?
    /// Bytes received, decoded.
    public let length: Int64

    public var description: String {
        "the body received (\(length) bytes) does not match its digest \(claimedDigest ?? "(none)")"
            + (claimedLength.map { " and length \($0)" } ?? "")
    }
}
