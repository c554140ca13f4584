import CCrypto
import CSeal
import DocumentModel
import Foundation

/// A body sealed on disk (docs/encryption.md, "Blobs"): a 32-byte header with a random salt,
/// then the body in blocks of 4 KiB, each stored as a record of a random 12-byte nonce, the
/// block sealed with AES-256-GCM and its 16-byte tag. Each file has its own key (HKDF of the
/// blobs' key and the salt) and every record written gets a new random nonce, so a block may be
/// written again (the mount's random writes, a scratch file) without a nonce used twice; the
/// associated data is the block's index, so blocks moved, a flipped byte or another key fail,
/// and a reader gets an error, never other bytes. A range read opens only the blocks it touches.
///
/// One format for every body an encrypted database keeps: blobs, the mount's scratch files
/// (which become blobs by a rename) and partial bodies.
enum SealedBlob {
    static let blockSize = 4096
    static let nonceSize = 12
    static let tagSize = 16
    static let headerSize = 32
    static let overhead = nonceSize + tagSize
    static let recordSize = blockSize + overhead
    /// "SOFASEAL", version 2, 2^12-byte blocks, 6 bytes kept for later, then the salt.
    static let magic = Array("SOFASEAL".utf8) + [2, 12, 0, 0, 0, 0, 0, 0]

    /// The size on disk of a body of `length` bytes (an empty body is its header alone).
    static func sealedSize(ofPlain length: Int64) -> Int64 {
        let blocks = (length + Int64(blockSize) - 1) / Int64(blockSize)
        return Int64(headerSize) + length + blocks * Int64(overhead)
    }

    /// The body's length from the file's, or nil when no body seals to that size.
    static func plainSize(ofSealed size: Int64) -> Int64? {
        let data = size - Int64(headerSize)
        guard data >= 0 else { return nil }
        let (full, rest) = data.quotientAndRemainder(dividingBy: Int64(recordSize))
        if rest == 0 { return full * Int64(blockSize) }
        return rest > Int64(overhead) ? full * Int64(blockSize) + rest - Int64(overhead) : nil
    }

    /// The associated data of block `index`: its index, big-endian, and a zero byte.
    static func associatedData(_ index: Int64, into bytes: inout [UInt8]) {
        for i in 0..<8 { bytes[i] = UInt8(truncatingIfNeeded: UInt64(index) >> (56 - 8 * i)) }
        bytes[8] = 0
    }

    static func fileKey(_ key: SealingKey, salt: [UInt8]) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        let info = Array("sofa blob file v2".utf8)
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

/// A sealed body's file, read and written at any offset: `SealedBlob`'s format over a
/// descriptor it borrows. A write that covers part of a block reads the block, patches it and
/// seals it again under a new nonce. `fillingGaps` (a scratch file) writes zeros into any gap a
/// write past the end leaves, so every block reads; without it (a partial body, whose map says
/// which blocks are there) a gap stays a hole that is never read.
/// One thread at a time, or callers that serialise their writes (reads may run beside them).
final class SealedFile {
    private let descriptor: Int32
    let path: String
    private var fileKey: [UInt8]
    private let fillingGaps: Bool
    /// The body's length.
    private(set) var length: Int64

    /// A new file: the (empty) file at `descriptor` gets a header and a new salt.
    init(creating descriptor: Int32, path: String, key: SealingKey, fillingGaps: Bool = true) throws {
        (self.descriptor, self.path, self.fillingGaps, length) = (descriptor, path, fillingGaps, 0)
        var salt = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&salt, 16) == 1 else { throw SofaError.invalidArgument("no random salt for \(path) (OpenSSL)") }
        fileKey = try SealedBlob.fileKey(key, salt: salt)
        try SealedFile.write(descriptor, (SealedBlob.magic + salt)[...], at: 0, path: path)
    }

    /// The sealed file at `descriptor`, as it is.
    init(opening descriptor: Int32, path: String, key: SealingKey, fillingGaps: Bool = true) throws {
        (self.descriptor, self.path, self.fillingGaps) = (descriptor, path, fillingGaps)
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
        fileKey = try SealedBlob.fileKey(key, salt: Array(header.suffix(16)))
    }

    deinit { fileKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }

    /// Reads up to `buffer.count` bytes at `offset`; 0 at the end.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        var block = Block()
        var done = 0
        while done < buffer.count, offset + Int64(done) < length {
            let position = offset + Int64(done)
            let index = position / Int64(SealedBlob.blockSize)
            let count = try open(index, into: &block)
            let within = Int(position - index * Int64(SealedBlob.blockSize))
            let take = min(count - within, buffer.count - done)
            block.plain.withUnsafeBytes { buffer.baseAddress!.advanced(by: done).copyMemory(from: $0.baseAddress! + within, byteCount: take) }
            done += take
        }
        return done
    }

    /// Writes `bytes` at `offset`, the body growing as needed.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        if fillingGaps && offset > length { try writeZeros(from: length, to: offset) }
        var block = Block()
        var done = 0
        while done < bytes.count {
            let position = offset + Int64(done)
            let index = position / Int64(SealedBlob.blockSize)
            let start = index * Int64(SealedBlob.blockSize)
            let within = Int(position - start)
            let take = min(SealedBlob.blockSize - within, bytes.count - done)
            // What of this block the body holds now, and what it will hold.
            let held = Int(max(0, min(Int64(SealedBlob.blockSize), length - start)))
            let count = max(held, within + take)
            if within > 0 && held > 0 || within + take < held {
                _ = try open(index, into: &block)
            }
            if within > held { block.plain.withUnsafeMutableBytes { _ = memset($0.baseAddress! + held, 0, within - held) } }
            block.plain.withUnsafeMutableBytes { $0.baseAddress!.advanced(by: within).copyMemory(from: bytes.baseAddress! + done, byteCount: take) }
            try seal(index, count: count, from: &block)
            if start + Int64(count) > length { length = start + Int64(count) }  // (a partial body's never grows: no write)
            done += take
        }
    }

    /// Cuts or grows the body to `size` (growing with zeros).
    func truncate(to size: Int64) throws {
        if size > length {
            try writeZeros(from: length, to: size)
            return
        }
        let index = size / Int64(SealedBlob.blockSize)
        let within = Int(size - index * Int64(SealedBlob.blockSize))
        if within > 0 && size < length {
            var block = Block()
            _ = try open(index, into: &block)
            try seal(index, count: within, from: &block)
        }
        guard ftruncate(descriptor, off_t(SealedBlob.sealedSize(ofPlain: size))) == 0 else {
            throw SofaError.system("truncate", path: path, errno: errno)
        }
        length = size
    }

    private func writeZeros(from start: Int64, to end: Int64) throws {
        let zeros = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 << 10, alignment: 16)
        defer { zeros.deallocate() }
        zeros.initializeMemory(as: UInt8.self, repeating: 0)
        var position = start
        while position < end {
            let count = Int(min(Int64(zeros.count), end - position))
            try write(UnsafeRawBufferPointer(rebasing: zeros[0..<count]), at: position)
            position += Int64(count)
        }
    }

    /// A block's buffers: its plaintext, its record and its associated data.
    private struct Block {
        var plain = [UInt8](repeating: 0, count: SealedBlob.blockSize)
        var record = [UInt8](repeating: 0, count: SealedBlob.recordSize)
        var associated = [UInt8](repeating: 0, count: 9)
    }

    private static func recordOffset(_ index: Int64) -> off_t {
        off_t(SealedBlob.headerSize) + off_t(index) * off_t(SealedBlob.recordSize)
    }

    /// Seals the first `count` bytes of `block.plain` as block `index` under a new nonce.
    private func seal(_ index: Int64, count: Int, from block: inout Block) throws {
        SealedBlob.associatedData(index, into: &block.associated)
        let ok = block.record.withUnsafeMutableBufferPointer { record in
            RAND_bytes(record.baseAddress, Int32(SealedBlob.nonceSize)) == 1
                && sofa_seal(fileKey, record.baseAddress, block.associated, block.plain, Int32(count),
                             record.baseAddress! + SealedBlob.nonceSize, record.baseAddress! + SealedBlob.nonceSize + count) == 1
        }
        guard ok else { throw SofaError.invalidArgument("\(path): a block could not be sealed (OpenSSL)") }
        try SealedFile.write(descriptor, block.record[..<(count + SealedBlob.overhead)], at: SealedFile.recordOffset(index), path: path)
    }

    /// Opens block `index` into `block.plain`; returns its length.
    private func open(_ index: Int64, into block: inout Block) throws -> Int {
        let start = index * Int64(SealedBlob.blockSize)
        let count = Int(min(Int64(SealedBlob.blockSize), length - start))
        let size = count + SealedBlob.overhead
        let offset = SealedFile.recordOffset(index)
        var got = 0
        while got < size {
            let read = block.record.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress! + got, size - got, offset + off_t(got)) }
            if read < 0 && errno == EINTR { continue }
            guard read > 0 else {
                if read < 0 { throw SofaError.system("read", path: path, errno: errno) }
                throw SealedBlobDamaged(path: path, why: "block \(index) is cut short")
            }
            got += read
        }
        SealedBlob.associatedData(index, into: &block.associated)
        let ok = block.record.withUnsafeBufferPointer { record in
            block.plain.withUnsafeMutableBufferPointer { output in
                sofa_unseal(fileKey, record.baseAddress, block.associated, record.baseAddress! + SealedBlob.nonceSize,
                            Int32(count), output.baseAddress, record.baseAddress! + SealedBlob.nonceSize + count)
            }
        }
        guard ok == 1 else { throw SealedBlobDamaged(path: path, why: "block \(index) fails its tag: damaged, or another key") }
        return count
    }

    private static func write(_ descriptor: Int32, _ bytes: ArraySlice<UInt8>, at offset: off_t, path: String) throws {
        try bytes.withUnsafeBytes { try writeFully(descriptor, $0, at: Int64(offset), path: path) }
    }
}
