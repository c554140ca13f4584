import DocumentModel
import Foundation

/// A body arriving in pieces, in any order: a sparse file the size of the body
/// (`attachments/tmp/<digest>.partial`) and a map of the chunks that have arrived
/// (`<digest>.chunks`, one bit per `chunkSize` bytes). Both outlive the process: a
/// later run, or another process fetching the same body, starts from what is here.
///
/// The map on disk only ever claims chunks whose bytes were synced before it was
/// written, and processes merge their maps (bitwise or, under `flock`), so a crash
/// or a second writer can lose progress but never claim bytes that are not there.
/// `finish` hashes the whole file against the body's digest before it becomes a
/// blob: bytes that do not match are dropped, never installed.
///
/// In an encrypted database the file is sealed (`SealedFile`, its size that of the sealed body,
/// blocks not yet here left as holes the map never lets anyone read); writers give whole 4 KiB
/// blocks, or the last one (`IncomingChunks`).
///
/// Thread-safe: the map is guarded by a lock; reads and writes are `pread`/`pwrite`.
public final class PartialBody: @unchecked Sendable {
    /// The unit of fetching and of the map. Small, so that scattered small reads fetch
    /// little (a reader going forward gets bigger ranges, as many chunks at a time).
    public static let chunkSize = 16 << 10

    public let digest: String
    public let length: Int64
    public let chunkCount: Int
    let path: String
    let mapPath: String
    private let store: BlobStore
    private var fd: Int32 = -1
    private let lock = NSLock()
    // Guarded by `lock`.
    private var bits: [UInt64]
    private var present = 0
    private var unsaved = false
    private var lastSave = Date.distantPast
    private var closed = false
    /// The sealed file (an encrypted database); set once in init.
    private var sealed: SealedFile?

    /// Opens (or creates) the partial body of `digest`. Throws for a digest that cannot
    /// name a file, and when the file cannot be made (a full disk, permissions).
    public init(store: BlobStore, digest: String, length: Int64) throws {
        guard let path = store.partialPath(for: digest) else {
            throw SofaError.invalidDocument(reason: "digest \(digest) cannot name a partial body")
        }
        self.store = store
        self.digest = digest
        self.length = length
        self.path = path
        mapPath = String(path.dropLast(BlobStore.partialSuffix.count)) + PartialBody.mapSuffix
        chunkCount = Int((length + Int64(PartialBody.chunkSize) - 1) / Int64(PartialBody.chunkSize))
        bits = [UInt64](repeating: 0, count: (chunkCount + 63) / 64)
        var fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        var created = fd >= 0
        if !created {
            fd = open(path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
            var info = stat()
            fstat(fd, &info)
            let hasMap = access(mapPath, F_OK) == 0
            let sealedSize = SealedBlob.sealedSize(ofPlain: length)
            if store.isSealed ? Int64(info.st_size) != sealedSize && info.st_size > 0 || !BlobStore.isSealedFile(path) && info.st_size > 0
                : Int64(info.st_size) > length {
                // Not this body (a lying server's leftovers): start again.
                Glibc.close(fd)
                unlink(path)
                unlink(mapPath)
                fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
                guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
                created = true
            } else if !hasMap && info.st_size > 0 && !store.isSealed {
                // Left by a version that wrote bodies from the start only: its whole chunks are here.
                let whole = Int(Int64(info.st_size) / Int64(PartialBody.chunkSize))
                for chunk in 0..<whole { setBit(chunk) }
                if Int64(info.st_size) == length, chunkCount > whole { setBit(chunkCount - 1) }
                unsaved = true
            }
        }
        self.fd = fd
        // Held while open: compaction leaves partial bodies in use alone.
        flock(fd, LOCK_SH)
        do {
            // A new body's (empty) map exists before the file takes its size: a sized file
            // without a map is always one of the old format.
            if created {
                // A map without its file is left from a removal that was cut short: it claims nothing now.
                unlink(mapPath)
                unsaved = true
                try save()
            }
            if let key = store.key?.blobs {
                var info = stat()
                fstat(fd, &info)
                if info.st_size == 0 { _ = try SealedFile(creating: fd, path: path, key: key, fillingGaps: false) }
                guard ftruncate(fd, off_t(SealedBlob.sealedSize(ofPlain: length))) == 0 else {
                    throw SofaError.system("truncate", path: path, errno: errno)
                }
                sealed = try SealedFile(opening: fd, path: path, key: key, fillingGaps: false)
            } else {
                guard ftruncate(fd, off_t(length)) == 0 else { throw SofaError.system("truncate", path: path, errno: errno) }
            }
        } catch {
            Glibc.close(fd)
            throw error
        }
        _ = try? merge()  // what another process recorded; unreadable, its chunks are fetched again
    }

    deinit { close() }

    static let mapSuffix = ".chunks"
    private static let magic: [UInt8] = Array("SOFACHK1".utf8)

    /// Saves the map and closes the file; the partial body stays for later.
    public func close() {
        let wasOpen = lock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        guard wasOpen else { return }
        try? save()  // the map of what arrived: lost, those chunks are fetched again, never read wrong
        Glibc.close(fd)
    }

    // MARK: The map

    private func setBit(_ chunk: Int) {
        let mask = UInt64(1) << UInt64(chunk % 64)
        if bits[chunk / 64] & mask == 0 {
            bits[chunk / 64] |= mask
            present += 1
        }
    }

    public func isPresent(_ chunk: Int) -> Bool {
        lock.withLock { bits[chunk / 64] & (UInt64(1) << UInt64(chunk % 64)) != 0 }
    }

    /// Whether every chunk in `chunks` is here.
    public func arePresent(_ chunks: Range<Int>) -> Bool {
        lock.withLock {
            chunks.allSatisfy { bits[$0 / 64] & (UInt64(1) << UInt64($0 % 64)) != 0 }
        }
    }

    /// The first chunk in `chunk..<end` that is not here, if any.
    public func firstMissing(from chunk: Int, before end: Int) -> Int? {
        lock.withLock { first(from: chunk, before: end, present: false) }
    }

    /// The first chunk in `chunk..<end` that is here, if any.
    public func firstPresent(from chunk: Int, before end: Int) -> Int? {
        lock.withLock { first(from: chunk, before: end, present: true) }
    }

    /// Scans a word at a time. Under `lock`.
    private func first(from start: Int, before end: Int, present: Bool) -> Int? {
        var chunk = start
        while chunk < end {
            let word = present ? bits[chunk / 64] : ~bits[chunk / 64]
            let masked = word & (~UInt64(0) << UInt64(chunk % 64))
            if masked != 0 {
                let found = (chunk / 64) * 64 + masked.trailingZeroBitCount
                return found < end ? found : nil
            }
            chunk = (chunk / 64 + 1) * 64
        }
        return nil
    }

    public var isComplete: Bool { lock.withLock { present == chunkCount } }

    /// Bytes of the body here so far.
    public var presentBytes: Int64 {
        lock.withLock { PartialBody.bytesPresent(in: bits, length: length) }
    }

    /// The bytes the chunks marked in `words` hold (the last chunk may be short).
    private static func bytesPresent(in words: [UInt64], length: Int64) -> Int64 {
        let size = Int64(chunkSize)
        let chunkCount = Int((length + size - 1) / size)
        var bytes = Int64(words.reduce(0) { $0 + $1.nonzeroBitCount }) * size
        let last = chunkCount - 1
        if last >= 0, words[last / 64] & (UInt64(1) << UInt64(last % 64)) != 0 {
            bytes -= size - (length - Int64(last) * size)
        }
        return bytes
    }

    /// The byte range of `chunk`.
    public func chunkRange(_ chunk: Int) -> (offset: Int64, count: Int64) {
        let start = Int64(chunk) * Int64(PartialBody.chunkSize)
        return (start, min(Int64(PartialBody.chunkSize), length - start))
    }

    /// The chunks bytes `offset..<offset+count` fall in.
    public func chunks(covering offset: Int64, count: Int64) -> Range<Int> {
        guard count > 0, offset < length else { return 0..<0 }
        let first = Int(offset / Int64(PartialBody.chunkSize))
        let end = Int((min(length, offset + count) - 1) / Int64(PartialBody.chunkSize)) + 1
        return first..<end
    }

    /// Records chunks as here (their bytes written with `write`).
    public func markPresent(_ chunks: Range<Int>) {
        lock.withLock {
            for chunk in chunks { setBit(chunk) }
            unsaved = true
        }
    }

    /// Adds what other processes saved to the map. Returns whether anything was new.
    @discardableResult
    public func merge() throws -> Bool {
        guard let saved = try withMapFile({ readMap($0) }) else { return false }
        return lock.withLock {
            let before = present
            for chunk in 0..<chunkCount where saved[chunk / 64] & (UInt64(1) << UInt64(chunk % 64)) != 0 { setBit(chunk) }
            return present != before
        }
    }

    /// Syncs the bytes written, then merges the map into the one on disk. With `atMostEvery`,
    /// does nothing if the last save was more recent (fetches save as they end: a scattered
    /// reader would otherwise pay a disk sync per read).
    public func save(atMostEvery interval: Double = 0) throws {
        let pending = lock.withLock { () -> Bool in
            guard unsaved, interval == 0 || Date().timeIntervalSince(lastSave) >= interval else { return false }
            unsaved = false
            lastSave = Date()
            return true
        }
        guard pending else { return }
        // A new body's map claims nothing: no bytes need to be on disk before it.
        if lock.withLock({ present }) > 0 {
            guard fdatasync(fd) == 0 else { throw SofaError.system("sync", path: path, errno: errno) }
        }
        try withMapFile { mapFD in
            let mine = lock.withLock { bits }
            let merged = zip(mine, readMap(mapFD) ?? mine).map { $0 | $1 }
            var bytes = PartialBody.magic
            withUnsafeBytes(of: UInt64(length).littleEndian) { bytes += $0 }
            withUnsafeBytes(of: UInt64(PartialBody.chunkSize).littleEndian) { bytes += $0 }
            for word in merged { withUnsafeBytes(of: word.littleEndian) { bytes += $0 } }
            guard pwrite(mapFD, bytes, bytes.count, 0) == bytes.count else {
                throw SofaError.system("write", path: mapPath, errno: errno)
            }
        }
    }

    /// Bytes of the body of `digest` that a saved map says are here, without opening it for writing.
    public static func savedBytes(in store: BlobStore, digest: String, length: Int64) -> Int64? {
        guard let path = store.partialPath(for: digest),
              let bytes = FileManager.default.contents(atPath: String(path.dropLast(BlobStore.partialSuffix.count)) + mapSuffix),
              let words = decodeMap([UInt8](bytes), length: length) else { return nil }
        return bytesPresent(in: words, length: length)
    }

    /// Runs `body` with the map file open and locked; nil when there is no map and `body` reads.
    private func withMapFile<T>(_ body: (Int32) throws -> T?) throws -> T? {
        let mapFD = open(mapPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard mapFD >= 0 else { throw SofaError.system("open", path: mapPath, errno: errno) }
        defer { Glibc.close(mapFD) }
        flock(mapFD, LOCK_EX)
        defer { flock(mapFD, LOCK_UN) }
        return try body(mapFD)
    }

    /// The map in `mapFD`, if it is one for this body.
    private func readMap(_ mapFD: Int32) -> [UInt64]? {
        // `bits` may be changing under `lock` meanwhile: its length never does.
        let size = PartialBody.mapHeaderSize + (chunkCount + 63) / 64 * 8
        var bytes = [UInt8](repeating: 0, count: size)
        guard pread(mapFD, &bytes, size, 0) == size else { return nil }
        return PartialBody.decodeMap(bytes, length: length)
    }

    private static let mapHeaderSize = 24

    /// The chunk bits of a saved map, if it is one for a body of `length` bytes.
    private static func decodeMap(_ bytes: [UInt8], length: Int64) -> [UInt64]? {
        let wordCount = (Int((length + Int64(chunkSize) - 1) / Int64(chunkSize)) + 63) / 64
        let size = mapHeaderSize + wordCount * 8
        guard bytes.count >= size, Array(bytes[0..<8]) == magic else { return nil }
        let words = bytes.withUnsafeBytes { raw in
            (0..<(size / 8)).map { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 8, as: UInt64.self)) }
        }
        guard words[1] == UInt64(length), words[2] == UInt64(chunkSize) else { return nil }
        return Array(words[3...])
    }

    // MARK: Bytes

    /// Whether writes must come in whole 4 KiB blocks (or end at the body's end): a sealed
    /// body's blocks not yet here are holes that cannot be added to.
    public var takesWholeBlocksOnly: Bool { sealed != nil }

    /// Writes bytes at `offset` (which the caller then marks present by whole chunks).
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        if let sealed { try sealed.write(bytes, at: offset) } else { try writeFully(fd, bytes, at: offset, path: path) }
    }

    /// Reads bytes at `offset`; the caller checked that their chunks are here.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        if let sealed {
            do { return try sealed.read(into: buffer, at: offset) } catch let damage as SealedBlobDamaged {
                throw SofaError.blobCorrupted(key: digest, path: damage.path)
            }
        }
        while true {
            let count = pread(fd, buffer.baseAddress, buffer.count, off_t(offset))
            if count >= 0 { return count }
            if errno != EINTR { throw SofaError.system("read", path: path, errno: errno) }
        }
    }

    // MARK: Ending

    /// Hashes the whole body and, when it matches `digest` (or `verified` says the caller
    /// checked the bytes as they came), makes it a blob. Returns the blob and the digest its
    /// bytes go by as stored (for an `md5-` digest, the MD5 of the bytes here). Bytes that do
    /// not match are deleted and `blobCorrupted` thrown.
    public func finish(verified: Bool = false) throws -> (blob: StoredBlob, digest: String) {
        try save()
        let sha1 = MessageDigest(.sha1)
        let md5 = digest.hasPrefix("md5-") ? MessageDigest(.md5) : nil
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while offset < length {
            let count = try read(into: buffer, at: offset)
            guard count > 0 else { break }
            let bytes = UnsafeRawBufferPointer(rebasing: buffer[0..<count])
            sha1.update(bytes)
            md5?.update(bytes)
            offset += Int64(count)
        }
        let key = BlobKey(digest: sha1.finalize())
        let stored = md5.map { "md5-" + Data($0.finalize()).base64EncodedString() } ?? key.digestString
        guard offset == length, verified || stored == digest else {
            discard()
            throw SofaError.blobCorrupted(key: digest, path: path)
        }
        let blob = StoredBlob(key: key, length: length)
        if store.contains(key) {
            // Another process (a second mount, sofa download) installed the same body first.
            if isOurs(path) { unlink(path) }
            unlink(mapPath)
            return (blob, stored)
        }
        let installFD = open(path, O_RDONLY | O_CLOEXEC)
        guard installFD >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        try store.install(installFD, at: path, as: key)
        unlink(mapPath)
        return (blob, stored)
    }

    /// Whether `path` still names the file this object writes.
    private func isOurs(_ path: String) -> Bool {
        var named = stat(), opened = stat()
        return stat(path, &named) == 0 && fstat(fd, &opened) == 0 && named.st_ino == opened.st_ino && named.st_dev == opened.st_dev
    }

    /// Deletes the partial body and its map (a body that failed its digest).
    public func discard() {
        lock.withLock {
            bits = [UInt64](repeating: 0, count: bits.count)
            present = 0
            unsaved = false
        }
        unlink(path)
        unlink(mapPath)
    }
}
