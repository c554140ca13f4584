import CGzip
import DocumentModel
import Foundation

/// The MD5 CouchDB keeps for an attachment body, which its revision ids are derived from
/// (`RevisionID.derive`): of the bytes as CouchDB stores them. CouchDB 3 stores the types
/// of its default `[attachments] compressible_types` gzip-compressed at its default
/// `compression_level` (8), so for those it is the MD5 of that gzip stream (the digest
/// CouchDB then shows, `md5-iMaiC8wq…` for "hello" as text/plain), and for any other
/// type the MD5 of the bytes themselves. zlib's output at a given level is the same
/// whatever the input's pieces, so the same body gives the same MD5 here and there.
///
/// Working it out costs a second pass over the body: MD5 runs at ~550 MB/s here (a 1 GiB
/// file copied into the mount took 1.2–1.6 s, and 3.4 s with the pass), and zlib at level 8
/// at 10–25 MB/s on text (a 150 MB log: 15.6 s). So it is worked out from the body only up to
/// a size (`exactLimit`); a body beyond it is named by what is known for free where that is
/// CouchDB's MD5 (a body from CouchDB of a type it does not compress keeps that MD5 as its
/// digest; one that came gzip-encoded keeps CouchDB's name in `body_digests`), else by the MD5
/// of its SHA-1 digest: the same for the same body on every Sofa replica, not CouchDB's.
enum CouchAttachmentMD5 {
    /// CouchDB's `compression_level` default.
    static let compressionLevel: Int32 = 8

    /// A body as its MD5 is worked out: its bytes, and whether CouchDB stores them gzipped.
    struct Body: Hashable {
        let key: BlobKey
        let compressible: Bool
    }

    /// The largest body whose MD5 is worked out from its bytes: 1 MiB of a compressed type
    /// (at most ~0.1 s of gzip), 64 MiB of any other (~0.12 s of MD5).
    static func exactLimit(compressible: Bool) -> Int64 { compressible ? 1 << 20 : 64 << 20 }

    /// Whether a save reads `attachment`'s body for its MD5, when nothing known names it: a
    /// body here within `exactLimit` whose digest is not already CouchDB's MD5 of it. The one
    /// test for both the save and the work done ahead of it (`Database.workOutCouchMD5s`).
    static func isWorkedOutFromBody(_ attachment: Attachment) -> Bool {
        let compressible = isCompressible(attachment.contentType)
        return attachment.blobKey != nil && attachment.length <= exactLimit(compressible: compressible)
            && (compressible || md5(ofDigest: attachment.digest) == nil)
    }

    /// Whether CouchDB (with its defaults: `text/*, application/javascript,
    /// application/json, application/xml`, any case, parameters after `;` ignored)
    /// compresses bodies of this type. Read as ASCII bytes: a fold asks it of every
    /// attachment of the document, three times each, and through Foundation's trimming it
    /// was a quarter of a fold of 10,000 files.
    static func isCompressible(_ contentType: String) -> Bool {
        let bytes = contentType.utf8
        func isBlank(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        var start = bytes.startIndex, end = bytes.firstIndex(of: UInt8(ascii: ";")) ?? bytes.endIndex
        while start < end, isBlank(bytes[start]) { start = bytes.index(after: start) }
        while start < end, isBlank(bytes[bytes.index(before: end)]) { end = bytes.index(before: end) }
        let type = bytes[start..<end].lazy.map(ASCII.lowercased)
        func equals(_ name: String) -> Bool { type.count == name.utf8.count && type.elementsEqual(name.utf8) }
        return type.starts(with: "text/".utf8)
            || equals("application/javascript") || equals("application/json") || equals("application/xml")
    }

    /// The MD5 of the blob `key` as CouchDB would store a body of `contentType`. Reads the
    /// blob once, in pieces.
    static func md5(of key: BlobKey, contentType: String, in blobs: BlobStore) throws -> [UInt8] {
        try Worker().md5(of: key, contentType: contentType, in: blobs)
    }

    /// Works out the MD5s of bodies one after another with one gzip stream, reset between them
    /// (one thread at a time). A stream made for each body (zlib's state and a 256 KiB buffer)
    /// cost more than compressing a small text body: the last fold of 10,000 text files of 4 KiB
    /// took 3.3 s, most of it in making streams.
    final class Worker {
        private var deflater: Deflater?

        /// `CouchAttachmentMD5.md5(of:contentType:in:)`.
        func md5(of key: BlobKey, contentType: String, in blobs: BlobStore) throws -> [UInt8] {
            try md5(of: Body(key: key, compressible: isCompressible(contentType)), in: blobs)
        }

        func md5(of body: Body, in blobs: BlobStore) throws -> [UInt8] {
            let key = body.key
            var deflater: Deflater? = nil
            if body.compressible {
                if let made = self.deflater { try made.reset() } else { self.deflater = try Deflater(.gzip, level: compressionLevel) }
                deflater = self.deflater
            }
            return try CouchAttachmentMD5.md5(of: key, in: blobs, deflater: deflater)
        }
    }

    /// The MD5 of body `key`, gzipped by `deflater` first when given.
    private static func md5(of key: BlobKey, in blobs: BlobStore, deflater: Deflater?) throws -> [UInt8] {
        let reader = try blobs.openReader(key)
        let md5 = MessageDigest(.md5)
        // As large as the body, up to a chunk: a fold works out thousands of small bodies' MD5s
        // in its transaction, and a zeroed chunk each (1 MiB) was most of their cost.
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: Int(min(Int64(BlobStore.chunkSize), max(reader.length, 1))), alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while true {
            let count = try reader.read(into: buffer, at: offset)
            guard count > 0 else { break }
            offset += Int64(count)
            let piece = UnsafeRawBufferPointer(rebasing: buffer[0..<count])
            if let deflater { try deflater.deflate(piece, finish: false) { md5.update($0) } } else { md5.update(piece) }
        }
        guard offset == reader.length else { throw SofaError.blobCorrupted(key: key.hex, path: reader.path) }
        try deflater?.deflate(UnsafeRawBufferPointer(start: nil, count: 0), finish: true) { md5.update($0) }
        return md5.finalize()
    }

    /// The MD5 a digest string names, when it is CouchDB's kind (`md5-<base64>`).
    static func md5(ofDigest digest: String) -> [UInt8]? {
        guard digest.hasPrefix("md5-"), let data = Data(base64Encoded: String(digest.dropFirst(4))), data.count == 16 else { return nil }
        return [UInt8](data)
    }
}
