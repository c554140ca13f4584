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

/// A key of 32 bytes (64 for AES-SIV); wiped when it goes.
final class SealingKey: @unchecked Sendable {
    // Sendable invariant: `bytes` is written only by init and deinit.
    private(set) var bytes: [UInt8]

    init(_ bytes: [UInt8]) throws {
        guard bytes.count == 32 || bytes.count == 64 else { throw SofaError.invalidArgument("a sealing key is 32 or 64 bytes, not \(bytes.count)") }
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
    /// A cipher context and buffers kept from one call for the next (a mount writes a body in
    /// thousands of calls); a call that finds them taken by another thread makes its own.
    private let kept = Locked<(Cipher, Batch)?>(nil)
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

    /// Takes the body's length from the file's `size` (another descriptor may have written it).
    func reload(size: Int64) throws {
        guard let length = SealedBlob.plainSize(ofSealed: size) else {
            throw SealedBlobDamaged(path: path, why: "a sealed body cannot be \(size) bytes long: cut or grown")
        }
        self.length = length
    }

    /// Reads up to `buffer.count` bytes at `offset`; 0 at the end. The records of up to
    /// `batchBlocks` blocks are read with one `pread` and opened with one cipher context.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        let end = min(length, offset + Int64(buffer.count))
        guard offset < end else { return 0 }
        let (cipher, batch) = try borrow()
        defer { giveBack(cipher, batch) }
        var position = offset
        while position < end {
            let first = position / Int64(SealedBlob.blockSize)
            let last = min((end - 1) / Int64(SealedBlob.blockSize), first + Int64(SealedFile.batchBlocks) - 1)
            try readRecords(first...last, into: batch)
            for index in first...last {
                let start = index * Int64(SealedBlob.blockSize)
                let within = Int(position - start)
                let take = Int(min(Int64(SealedBlob.blockSize - within), end - position))
                let done = Int(position - offset)
                if within == 0 && take == blockLength(index) {
                    // A whole block: opened straight into the caller's buffer.
                    try open(index, from: batch.record(index - first), into: buffer.baseAddress! + done, cipher: cipher, batch: batch)
                } else {
                    try open(index, from: batch.record(index - first), into: batch.plain.baseAddress!, cipher: cipher, batch: batch)
                    (buffer.baseAddress! + done).copyMemory(from: batch.plain.baseAddress! + within, byteCount: take)
                }
                position += Int64(take)
            }
        }
        return Int(end - offset)
    }

    /// Writes `bytes` at `offset`, the body growing as needed: the records of up to
    /// `batchBlocks` blocks are sealed into one buffer with one cipher context and written with
    /// one `pwrite` (a block the write covers only in part is read and opened first).
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        if fillingGaps && offset > length { try writeZeros(from: length, to: offset) }
        guard !bytes.isEmpty else { return }
        let (cipher, batch) = try borrow()
        defer { giveBack(cipher, batch) }
        let end = offset + Int64(bytes.count)
        var position = offset
        while position < end {
            let first = position / Int64(SealedBlob.blockSize)
            let last = min((end - 1) / Int64(SealedBlob.blockSize), first + Int64(SealedFile.batchBlocks) - 1)
            guard RAND_bytes(batch.nonces.baseAddress, Int32(SealedBlob.nonceSize * Int(last - first + 1))) == 1 else {
                throw SofaError.invalidArgument("\(path): no random nonce (OpenSSL)")
            }
            var size = 0
            for index in first...last {
                let start = index * Int64(SealedBlob.blockSize)
                let within = Int(position - start)
                let take = Int(min(Int64(SealedBlob.blockSize - within), end - position))
                // What of this block the body holds now, and what it will hold.
                let held = Int(max(0, min(Int64(SealedBlob.blockSize), length - start)))
                let count = max(held, within + take)
                let plain = batch.plain.baseAddress!
                if within > 0 && held > 0 || within + take < held {
                    try readRecords(index...index, into: batch, at: SealedFile.spareRecord)
                    try open(index, from: batch.record(Int64(SealedFile.spareRecord)), into: plain, cipher: cipher, batch: batch)
                }
                if within > held { memset(plain + held, 0, within - held) }
                (plain + within).copyMemory(from: bytes.baseAddress! + Int(position - offset), byteCount: take)
                let slot = Int(index - first)
                try batch.seal(index, count: count, slot: slot, cipher: cipher, path: path)
                size = slot * SealedBlob.recordSize + count + SealedBlob.overhead
                position += Int64(take)
                if start + Int64(count) > length { length = start + Int64(count) }  // (a partial body's never grows: no write)
            }
            try writeFully(descriptor, UnsafeRawBufferPointer(rebasing: batch.records[0..<size]), at: Int64(SealedFile.recordOffset(first)), path: path)
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
            // The block the cut falls in, sealed again shorter.
            var kept = [UInt8](repeating: 0, count: within)
            _ = try kept.withUnsafeMutableBytes { try read(into: $0, at: index * Int64(SealedBlob.blockSize)) }
            guard ftruncate(descriptor, off_t(SealedBlob.sealedSize(ofPlain: index * Int64(SealedBlob.blockSize)))) == 0 else {
                throw SofaError.system("truncate", path: path, errno: errno)
            }
            length = index * Int64(SealedBlob.blockSize)
            try kept.withUnsafeBytes { try write($0, at: length) }
            kept.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) }
            return
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

    private func borrow() throws -> (Cipher, Batch) {
        if let kept = kept.withLock({ kept in defer { kept = nil }; return kept }) { return kept }
        return (try Cipher(fileKey, path: path), Batch())
    }

    private func giveBack(_ cipher: Cipher, _ batch: Batch) {
        kept.withLock { kept in if kept == nil { kept = (cipher, batch) } }
    }

    /// Blocks read or written with one system call: 1 MiB of body.
    static let batchBlocks = 256
    /// The record slot past the batch's, for a block read back to be patched.
    static let spareRecord = batchBlocks

    /// One call's cipher context (the key schedule made once for all its blocks); a call of its
    /// own each time, so that reads and writes on several threads never share one.
    private final class Cipher: @unchecked Sendable {
        // Sendable invariant: used by one call at a time (`borrow`).
        let context: OpaquePointer
        init(_ key: [UInt8], path: String) throws {
            guard let context = sofa_gcm_new(key) else { throw SofaError.invalidArgument("\(path): no cipher (OpenSSL)") }
            self.context = context
        }
        deinit { sofa_gcm_free(context) }
    }

    /// A call's buffers: the records of a batch (and one spare), their nonces, one block's
    /// plaintext and the associated data.
    private final class Batch: @unchecked Sendable {
        // Sendable invariant: used by one call at a time (`borrow`).
        let records = UnsafeMutableRawBufferPointer.allocate(byteCount: (SealedFile.batchBlocks + 1) * SealedBlob.recordSize, alignment: 16)
        let nonces = UnsafeMutableRawBufferPointer.allocate(byteCount: SealedFile.batchBlocks * SealedBlob.nonceSize, alignment: 16)
        let plain = UnsafeMutableRawBufferPointer.allocate(byteCount: SealedBlob.blockSize, alignment: 16)
        var associated = [UInt8](repeating: 0, count: 9)

        deinit {
            OPENSSL_cleanse(plain.baseAddress, plain.count)
            records.deallocate()
            nonces.deallocate()
            plain.deallocate()
        }

        /// Where record slot `slot` starts.
        func record(_ slot: Int64) -> UnsafeMutableRawPointer { records.baseAddress! + Int(slot) * SealedBlob.recordSize }

        /// Seals the first `count` bytes of `plain` as block `index` into record slot `slot`, under nonce number `slot`.
        func seal(_ index: Int64, count: Int, slot: Int, cipher: Cipher, path: String) throws {
            SealedBlob.associatedData(index, into: &associated)
            let base = record(Int64(slot)).assumingMemoryBound(to: UInt8.self)
            base.update(from: nonces.baseAddress!.assumingMemoryBound(to: UInt8.self) + slot * SealedBlob.nonceSize, count: SealedBlob.nonceSize)
            guard sofa_gcm_seal(cipher.context, base, associated, plain.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(count),
                                base + SealedBlob.nonceSize, base + SealedBlob.nonceSize + count) == 1 else {
                throw SofaError.invalidArgument("\(path): a block could not be sealed (OpenSSL)")
            }
        }
    }

    /// The length of block `index` of the body.
    private func blockLength(_ index: Int64) -> Int {
        Int(min(Int64(SealedBlob.blockSize), length - index * Int64(SealedBlob.blockSize)))
    }

    static func recordOffset(_ index: Int64) -> off_t {
        off_t(SealedBlob.headerSize) + off_t(index) * off_t(SealedBlob.recordSize)
    }

    /// Reads the records of `blocks` into the batch, from slot `slot` on (0: the batch's own).
    private func readRecords(_ blocks: ClosedRange<Int64>, into batch: Batch, at slot: Int = 0) throws {
        let size = (blocks.count - 1) * SealedBlob.recordSize + blockLength(blocks.upperBound) + SealedBlob.overhead
        let offset = SealedFile.recordOffset(blocks.lowerBound)
        let start = batch.record(Int64(slot))
        var got = 0
        while got < size {
            let read = pread(descriptor, start + got, size - got, offset + off_t(got))
            if read < 0 && errno == EINTR { continue }
            guard read > 0 else {
                if read < 0 { throw SofaError.system("read", path: path, errno: errno) }
                throw SealedBlobDamaged(path: path, why: "block \(blocks.lowerBound + Int64(got / SealedBlob.recordSize)) is cut short")
            }
            got += read
        }
    }

    /// Opens block `index` from the record at `record` into `output` (its length).
    private func open(_ index: Int64, from record: UnsafeMutableRawPointer, into output: UnsafeMutableRawPointer, cipher: Cipher, batch: Batch) throws {
        let count = blockLength(index)
        SealedBlob.associatedData(index, into: &batch.associated)
        let base = record.assumingMemoryBound(to: UInt8.self)
        let ok = sofa_gcm_open(cipher.context, base, batch.associated, base + SealedBlob.nonceSize, Int32(count),
                               output.assumingMemoryBound(to: UInt8.self), base + SealedBlob.nonceSize + count)
        guard ok == 1 else { throw SealedBlobDamaged(path: path, why: "block \(index) fails its tag: damaged, or another key") }
    }

    private static func write(_ descriptor: Int32, _ bytes: ArraySlice<UInt8>, at offset: off_t, path: String) throws {
        try bytes.withUnsafeBytes { try writeFully(descriptor, $0, at: Int64(offset), path: path) }
    }
}
