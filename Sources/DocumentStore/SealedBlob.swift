import CCrypto
import CSeal
import DocumentModel
import Foundation

/// A blob's body sealed on disk (docs/encryption.md, "Blobs"): a 32-byte header, then the body
/// in blocks of 4 KiB, each sealed with AES-256-GCM and followed by its 16-byte tag. Each file
/// has its own key (HKDF of the blobs' key and the file's random salt), so a block's nonce can
/// be its index; the associated data is the index and whether the block is the last, so a
/// file cut at a block boundary, blocks moved or a flipped byte fail, and a reader gets an
/// error, never other bytes. A range read opens only the blocks it touches.
///
/// Not yet used by `BlobStore` (issue #32): the store, partial and cached bodies come next.
enum SealedBlob {
    static let blockSize = 4096
    static let tagSize = 16
    static let headerSize = 32
    static let sealedBlockSize = blockSize + tagSize
    /// "SOFASEAL", version 1, 2^12-byte blocks, 6 bytes kept for later, then the salt.
    static let magic = Array("SOFASEAL".utf8) + [1, 12, 0, 0, 0, 0, 0, 0]

    /// The size on disk of a body of `length` bytes: one block at least, even empty, so that a
    /// file cut to its header fails too.
    static func sealedSize(ofPlain length: Int64) -> Int64 {
        let blocks = max(1, (length + Int64(blockSize) - 1) / Int64(blockSize))
        return Int64(headerSize) + length + blocks * Int64(tagSize)
    }

    /// The body's length from the file's, or nil when no body seals to that size.
    static func plainSize(ofSealed size: Int64) -> Int64? {
        let data = size - Int64(headerSize)
        guard data >= Int64(tagSize) else { return nil }
        let (full, rest) = data.quotientAndRemainder(dividingBy: Int64(sealedBlockSize))
        if rest == 0 { return full * Int64(blockSize) }
        return rest >= Int64(tagSize) ? full * Int64(blockSize) + rest - Int64(tagSize) : nil
    }

    static func nonce(_ index: Int64) -> [UInt8] {
        [0, 0, 0, 0] + (0..<8).map { UInt8(truncatingIfNeeded: UInt64(index) >> (56 - 8 * $0)) }
    }

    static func associatedData(_ index: Int64, isLast: Bool) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: UInt64(index) >> (56 - 8 * $0)) } + [isLast ? 1 : 0]
    }

    static func fileKey(_ key: SealingKey, salt: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        let info = Array("sofa blob file v1".utf8)
        guard key.bytes.withUnsafeBufferPointer({ sofa_derive_key($0.baseAddress, salt, Int32(salt.count), info, Int32(info.count), &out) }) == 1 else {
            throw SofaError.invalidArgument("the key of a sealed blob could not be derived (OpenSSL)")
        }
        return out
    }
}

/// The 32-byte key that seals blobs; wiped when it goes.
final class SealingKey: @unchecked Sendable {
    // Sendable invariant: `bytes` is written only by init and deinit.
    private(set) var bytes: [UInt8]

    init(_ bytes: [UInt8]) throws {
        guard bytes.count == 32 else { throw SofaError.invalidArgument("a sealing key is 32 bytes, not \(bytes.count)") }
        self.bytes = bytes
    }

    deinit { bytes.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
}

/// Why a sealed body cannot be read: the bytes on disk are not what was sealed.
struct SealedBlobDamaged: Error, CustomStringConvertible {
    let path: String
    let why: String
    var description: String { "\(path): \(why)" }
}

/// Writes a body sealed, block by block as it comes; the last block is sealed at `finish()`.
final class SealedBlobWriter {
    private let descriptor: Int32
    private let path: String
    private var fileKey: [UInt8]
    private var block: [UInt8] = []
    /// The block sealed, with its tag: one buffer for every block.
    private var sealed = [UInt8](repeating: 0, count: SealedBlob.sealedBlockSize)
    private var index: Int64 = 0
    private(set) var length: Int64 = 0

    /// Starts the file at `descriptor` (empty, open for writing) with a header and a new salt.
    init(descriptor: Int32, path: String, key: SealingKey) throws {
        (self.descriptor, self.path) = (descriptor, path)
        var salt = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&salt, 16) == 1 else { throw SofaError.invalidArgument("no random salt for \(path) (OpenSSL)") }
        fileKey = try SealedBlob.fileKey(key, salt: salt)
        try write((SealedBlob.magic + salt)[...], at: 0)
        block.reserveCapacity(SealedBlob.blockSize)
    }

    deinit { fileKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }

    func write(_ bytes: UnsafeRawBufferPointer) throws {
        var rest = bytes[...]
        while !rest.isEmpty {
            // A full block is sealed only when more follows: the last block is marked so.
            if block.count == SealedBlob.blockSize { try seal(isLast: false) }
            let take = min(SealedBlob.blockSize - block.count, rest.count)
            block.append(contentsOf: rest.prefix(take))
            rest = rest.dropFirst(take)
        }
        length += Int64(bytes.count)
    }

    /// Seals the last block; returns the body's length.
    func finish() throws -> Int64 {
        try seal(isLast: true)
        return length
    }

    private func seal(isLast: Bool) throws {
        let count = block.count
        let ok = sealed.withUnsafeMutableBufferPointer { out in
            sofa_seal(fileKey, SealedBlob.nonce(index), SealedBlob.associatedData(index, isLast: isLast), block, Int32(count),
                      out.baseAddress, out.baseAddress! + count)
        }
        guard ok == 1 else { throw SofaError.invalidArgument("\(path): a block could not be sealed (OpenSSL)") }
        try write(sealed[..<(count + SealedBlob.tagSize)], at: Int64(SealedBlob.headerSize) + index * Int64(SealedBlob.sealedBlockSize))
        index += 1
        block.removeAll(keepingCapacity: true)
    }

    private func write(_ bytes: ArraySlice<UInt8>, at offset: Int64) throws {
        var done = 0
        while done < bytes.count {
            let wrote = bytes.withUnsafeBytes { pwrite(descriptor, $0.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done)) }
            if wrote < 0 {
                if errno == EINTR { continue }
                throw SofaError.system("write", path: path, errno: errno)
            }
            done += wrote
        }
    }
}

/// Reads a sealed body at any offset, opening only the blocks a read touches.
final class SealedBlobReader {
    private let descriptor: Int32
    private let path: String
    private var fileKey: [UInt8]
    /// The body's length.
    let length: Int64
    private let blocks: Int64
    private var sealed = [UInt8](repeating: 0, count: SealedBlob.sealedBlockSize)
    private var plain = [UInt8](repeating: 0, count: SealedBlob.blockSize)

    init(descriptor: Int32, path: String, key: SealingKey) throws {
        (self.descriptor, self.path) = (descriptor, path)
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { throw SofaError.system("fstat", path: path, errno: errno) }
        var header = [UInt8](repeating: 0, count: SealedBlob.headerSize)
        let read = header.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, $0.count, 0) }
        guard read == SealedBlob.headerSize, Array(header.prefix(16)) == SealedBlob.magic else {
            throw SealedBlobDamaged(path: path, why: "not a sealed body (no header)")
        }
        guard let length = SealedBlob.plainSize(ofSealed: Int64(status.st_size)) else {
            throw SealedBlobDamaged(path: path, why: "a sealed body cannot be \(status.st_size) bytes long: cut or grown")
        }
        self.length = length
        blocks = max(1, (length + Int64(SealedBlob.blockSize) - 1) / Int64(SealedBlob.blockSize))
        fileKey = try SealedBlob.fileKey(key, salt: Array(header.suffix(16)))
    }

    deinit {
        fileKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) }
        plain.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) }
    }

    /// Reads up to `buffer.count` bytes at `offset`; 0 at the end.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        var done = 0
        while done < buffer.count, offset + Int64(done) < length {
            let position = offset + Int64(done)
            let index = position / Int64(SealedBlob.blockSize)
            let count = try open(index)
            let within = Int(position - index * Int64(SealedBlob.blockSize))
            let take = min(count - within, buffer.count - done)
            plain.withUnsafeBytes { buffer.baseAddress!.advanced(by: done).copyMemory(from: $0.baseAddress! + within, byteCount: take) }
            done += take
        }
        return done
    }

    /// Opens block `index` into `plain`; returns its length.
    private func open(_ index: Int64) throws -> Int {
        let isLast = index == blocks - 1
        let count = isLast ? Int(length - index * Int64(SealedBlob.blockSize)) : SealedBlob.blockSize
        let size = count + SealedBlob.tagSize
        let offset = off_t(SealedBlob.headerSize) + off_t(index) * off_t(SealedBlob.sealedBlockSize)
        var got = 0
        while got < size {
            let read = sealed.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress! + got, size - got, offset + off_t(got)) }
            if read < 0 && errno == EINTR { continue }
            guard read > 0 else {
                if read < 0 { throw SofaError.system("read", path: path, errno: errno) }
                throw SealedBlobDamaged(path: path, why: "block \(index) is cut short")
            }
            got += read
        }
        let ok = sealed.withUnsafeBufferPointer { input in
            plain.withUnsafeMutableBufferPointer { output in
                sofa_unseal(fileKey, SealedBlob.nonce(index), SealedBlob.associatedData(index, isLast: isLast), input.baseAddress,
                            Int32(count), output.baseAddress, input.baseAddress! + count)
            }
        }
        guard ok == 1 else { throw SealedBlobDamaged(path: path, why: "block \(index) fails its tag: damaged, or another key") }
        return count
    }
}
