import CLinux
import DocumentModel
import Foundation
import Synchronization

/// A blob in the store: its key and its length in bytes.
public struct StoredBlob: Hashable, Sendable {
    public let key: BlobKey
    public let length: Int64
    /// The MD5 of its bytes, when it was worked out as they were hashed (a small body written
    /// through the mount, `BlobStore.md5Limit`): the revision id CouchDB gives a body of a type
    /// it does not compress takes it, and a save then need not read the body again for it (a
    /// fifth of a fold of 10,000 files of 4 KiB). Not part of the blob's identity.
    public let md5: [UInt8]?

    public init(key: BlobKey, length: Int64, md5: [UInt8]? = nil) {
        self.key = key
        self.length = length
        self.md5 = md5
    }

    public static func == (lhs: StoredBlob, rhs: StoredBlob) -> Bool { lhs.key == rhs.key && lhs.length == rhs.length }
    public func hash(into hasher: inout Hasher) {
        hasher.combine(key)
        hasher.combine(length)
    }
}

/// The content-addressed store of attachment bodies: `attachments/<sha1 hex>.blob`.
///
/// A blob is written to `attachments/tmp/<pid>-<uuid>.tmp`, hashed while it
/// streams, fsynced, and renamed to its key's name, after which the directory is
/// fsynced; identical content is stored once, and a crash never leaves a partial
/// blob under a real name. Temporary files of processes that died are swept by
/// `removeAbandonedTemporaryFiles()` (compaction calls it).
///
/// ```swift
/// let blob = try store.write(Array("hello".utf8))
/// let reader = try store.openReader(blob.key, expectedLength: blob.length)
/// ```
///
/// In an encrypted database (`key` set) every body is sealed on disk (`SealedBlob`: 4 KiB
/// blocks, AES-256-GCM) and its file is named by an HMAC of its SHA-1, so neither the bytes nor
/// the names say anything of the bodies; readers get the plaintext, writers give it.
public final class BlobStore: Sendable {
    public let directory: String
    let temporaryDirectory: String
    /// The keys of an encrypted database; nil for a plain one.
    let key: DatabaseKey?
    /// Whether bodies are sealed on disk: then no file here may be handed out as it is
    /// (to FUSE passthrough, or copied by path).
    public var isSealed: Bool { key != nil }

    /// Bytes moved per read or write call while streaming.
    public static let chunkSize = 1 << 20

    init(directory: String, key: DatabaseKey? = nil) {
        self.directory = directory
        self.temporaryDirectory = directory + "/tmp"
        self.key = key
    }

    /// Creates the store's directories if they are missing.
    func createDirectories() throws {
        for path in [directory, temporaryDirectory] where mkdir(path, 0o755) != 0 && errno != EEXIST {
            throw SofaError.system("create directory", path: path, errno: errno)
        }
    }

    /// The file of blob `key`: its SHA-1 in hex, or in an encrypted database an HMAC of it.
    public func path(for key: BlobKey) -> String { "\(directory)/\(fileName(for: key))" }

    func fileName(for key: BlobKey) -> String { (self.key?.fileName(of: key) ?? key.hex) + BlobStore.fileSuffix }

    static let fileSuffix = ".blob"

    public func contains(_ key: BlobKey) -> Bool { access(path(for: key), F_OK) == 0 }

    /// The size of the blob `key`, or nil if it is not here.
    public func size(of key: BlobKey) -> Int64? {
        var info = stat()
        guard stat(path(for: key), &info) == 0 else { return nil }
        return isSealed ? SealedBlob.plainSize(ofSealed: Int64(info.st_size)) : Int64(info.st_size)
    }

    /// Starts streaming a new blob into the store.
    public func makeWriter() throws -> BlobWriter {
        try BlobWriter(store: self)
    }

    /// Where the partial body for `digest` waits: the base64 made file-name safe, or in an
    /// encrypted store an HMAC of the digest (`partialToken`).
    func partialPath(for digest: String) -> String? {
        guard let token = partialToken(for: digest) else { return nil }
        return "\(temporaryDirectory)/\(token)\(BlobStore.partialSuffix)"
    }

    /// What names the partial body of `digest` (and what `partialBodies()` lists it by): the
    /// digest, file-name safe; in an encrypted store, 40 hex digits of its HMAC, which
    /// `partialBodies()` gives back as they are.
    func partialToken(for digest: String) -> String? {
        if isSealed, BlobKey(hex: digest) != nil { return digest }  // as partialBodies() lists it
        guard digest.hasPrefix("sha1-") || digest.hasPrefix("md5-"), digest.count < 100,
              digest.utf8.allSatisfy({ isalnum(Int32($0)) != 0 || "+/=-".utf8.contains($0) }) else { return nil }
        if let key { return key.fileName(ofDigest: digest) }
        return digest.replacingOccurrences(of: "/", with: "_")
    }

    static let partialSuffix = ".partial"

    /// How `partialBodies()` lists the partial body of `digest`: the digest itself, or in an
    /// encrypted store its keyed name.
    func partialListing(of digest: String) -> String? { isSealed ? partialToken(for: digest) : digest }

    /// Partial bodies waiting for their remaining chunks (`PartialBody`): (digest, bytes on disk).
    /// In an encrypted store the "digest" is the file's keyed name (`partialListing(of:)`); it
    /// serves `removePartialBody` all the same.
    public func partialBodies() -> [(digest: String, length: Int64)] {
        var result: [(String, Int64)] = []
        for name in BlobStore.names(in: temporaryDirectory) ?? [] {
            guard name.hasSuffix(BlobStore.partialSuffix) else { continue }
            var info = stat()
            guard stat("\(temporaryDirectory)/\(name)", &info) == 0 else { continue }
            let stem = String(name.dropLast(BlobStore.partialSuffix.count))
            let digest = isSealed ? stem : stem.replacingOccurrences(of: "_", with: "/")
            // The file is sparse: count the bytes it holds, not its size.
            result.append((digest, min(Int64(info.st_size), Int64(info.st_blocks) * 512)))
        }
        return result.sorted { $0.0 < $1.0 }
    }

    /// When the partial body of `digest` last received bytes (0 if there is none).
    func partialModificationTime(of digest: String) -> Double {
        var info = stat()
        guard let path = partialPath(for: digest), stat(path, &info) == 0 else { return 0 }
        return Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
    }

    /// Deletes the partial body of `digest` unless a reader or writer holds it. Returns whether it went.
    func removePartialBody(digest: String) -> Bool {
        guard let path = partialPath(for: digest) else { return false }
        let fd = open(path, O_RDWR | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else { return false }
        // Emptied first: a file without a map that still had its size would pass for the old
        // format's body, all of it here, to a process opening it meanwhile.
        _ = ftruncate(fd, 0)
        let removed = unlink(path) == 0
        unlink(String(path.dropLast(BlobStore.partialSuffix.count)) + PartialBody.mapSuffix)
        return removed
    }

    /// Deletes partial bodies whose digest is not in `wanted`, unless a writer holds them.
    /// Returns bytes freed.
    func removePartialBodies(except wanted: Set<String>, dryRun: Bool = false) -> Int64 {
        var freed: Int64 = 0
        let wanted = Set(wanted.compactMap(partialListing(of:)))
        for (digest, length) in partialBodies() where !wanted.contains(digest) && (dryRun || removePartialBody(digest: digest)) {
            freed += length
        }
        return freed
    }

    /// Stores `bytes` and returns their key.
    public func write(_ bytes: some ContiguousBytes) throws -> StoredBlob {
        let writer = try makeWriter()
        try bytes.withUnsafeBytes { (buffer) throws in try writer.write(buffer) }
        return try writer.finish()
    }

    /// Streams the file at `path` into the store (a pipe or FIFO works too).
    public func write(contentsOf path: String, expecting expected: BlobKey? = nil, durable: Bool = true,
                      progress: ((Int64) -> Void)? = nil) throws -> StoredBlob {
        let fd = LongPath.open(path, O_RDONLY)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { close(fd) }
        return try write(fromDescriptor: fd, name: path, expecting: expected, durable: durable, progress: progress)
    }

    /// Streams everything readable from `fd` into the store; `progress` is told the bytes so far.
    /// `expected` and `durable` are as `BlobWriter.finish` takes them.
    public func write(fromDescriptor fd: Int32, name: String, expecting expected: BlobKey? = nil, durable: Bool = true,
                      progress: ((Int64) -> Void)? = nil) throws -> StoredBlob {
        let writer = try makeWriter()
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while true {
            let count = read(fd, buffer.baseAddress, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw SofaError.system("read", path: name, errno: errno)
            }
            if count == 0 { break }
            try writer.write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
            progress?(writer.length)
        }
        return try writer.finish(expecting: expected, durable: durable)
    }

    /// Opens a blob for reading. Throws if it is missing or its size is not `expectedLength`.
    public func openReader(_ key: BlobKey, expectedLength: Int64? = nil) throws -> BlobReader {
        try BlobReader(key: key, path: path(for: key), expectedLength: expectedLength, sealedWith: self.key?.blobs)
    }

    /// Reads a whole blob and checks its hash. For tests and small bodies only.
    public func contents(of key: BlobKey) throws -> [UInt8] {
        let reader = try openReader(key)
        var bytes: [UInt8] = []
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 * 1024, alignment: 16)
        defer { chunk.deallocate() }
        while case let count = try reader.read(into: chunk), count > 0 {
            bytes.append(contentsOf: chunk[0..<count])
        }
        return bytes
    }

    /// Hashes a blob's file and throws `blobCorrupted` unless it matches its key.
    public func verify(_ key: BlobKey) throws {
        let reader = try openReader(key)
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { chunk.deallocate() }
        while try reader.read(into: chunk) > 0 {}
    }

    /// Makes blobs stored without `durable` durable: each file, then the folder once.
    /// Writeback of a group of files starts for all of them before the first fsync, so
    /// the disk takes them together and each fsync finds its file written (2,000 bodies
    /// of 4 KiB here: 0.30–1.0 s one fsync after another, 0.11–0.16 s so).
    ///
    /// Many bodies at once (a fold of thousands of copied files) are synced by one `syncfs`
    /// of the store's file system instead, when little else waits to be written on the
    /// machine: each fsync writes its inode and flushes the disk, `syncfs` does both once
    /// (10,000 bodies of 4 KiB here: 0.38–0.42 s in groups, 0.065 s so). It also writes
    /// whatever other programs left unwritten there, hence a limit for those bytes
    /// (`Tuning.wholeFileSystemSyncBytesPerBody`): past it, the groups.
    public func sync(_ keys: some Collection<BlobKey>) throws {
        try sync(keys, bytesWaiting: bytesWaitingForDisks())
    }

    /// `sync(_:)` with `bytesWaiting` bytes waiting for the machine's disks (nil: not known).
    func sync(_ keys: some Collection<BlobKey>, bytesWaiting: Int64?) throws {
        guard !keys.isEmpty else { return }
        if BlobStore.syncsWholeFileSystem(bodies: keys.count, bytesWaiting: bytesWaiting) {
            // As the fsyncs would: a body that is not here is an error, not a revision without it.
            if let missing = keys.first(where: { !contains($0) }) {
                throw SofaError.system("open", path: path(for: missing), errno: ENOENT)
            }
            try syncFileSystem(of: directory)
            return
        }
        let keys = Array(keys)
        for start in stride(from: 0, to: keys.count, by: BlobStore.syncGroup) {
            let group = keys[start..<min(start + BlobStore.syncGroup, keys.count)]
            var opened: [(fd: Int32, key: BlobKey)] = []
            defer { for file in opened { close(file.fd) } }
            for key in group {
                let fd = open(path(for: key), O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else { throw SofaError.system("open", path: path(for: key), errno: errno) }
                opened.append((fd, key))
                _ = sync_file_range(fd, 0, 0, 2 /* SYNC_FILE_RANGE_WRITE: start writeback, do not wait */)
            }
            for file in opened where fsync(file.fd) != 0 {
                throw SofaError.system("fsync", path: path(for: file.key), errno: errno)
            }
        }
        try syncDirectory()
    }

    /// Whether `sync` of `bodies` bodies is one `syncfs`, with `bytesWaiting` bytes waiting for
    /// the machine's disks (nil: not known).
    static func syncsWholeFileSystem(bodies: Int, bytesWaiting: Int64?) -> Bool {
        guard bodies >= Tuning.wholeFileSystemSyncBodies, let bytesWaiting else { return false }
        return bytesWaiting <= Int64(bodies) * Tuning.wholeFileSystemSyncBytesPerBody
    }

    /// How many bodies `sync` holds open at once.
    static let syncGroup = 256

    /// Deletes a blob; a missing one is not an error.
    func remove(_ key: BlobKey) throws {
        try remove(fileNamed: fileName(for: key))
    }

    /// Deletes the blob file `name` (as `allBlobs` lists it); a missing one is not an error.
    func remove(fileNamed name: String) throws {
        let path = "\(directory)/\(name)"
        guard unlink(path) == 0 || errno == ENOENT else { throw SofaError.system("remove", path: path, errno: errno) }
    }

    /// Every blob file on disk: its name, its size on disk and, in a plain store, its key (an
    /// encrypted store's names do not give the key back).
    func allBlobs() throws -> [(name: String, key: BlobKey?, size: Int64)] {
        guard let names = BlobStore.names(in: directory) else { throw SofaError.system("list", path: directory, errno: errno) }
        var result: [(String, BlobKey?, Int64)] = []
        for name in names where name.hasSuffix(BlobStore.fileSuffix) {
            let stem = String(name.dropLast(BlobStore.fileSuffix.count))
            guard let named = BlobKey(hex: stem) else { continue }
            var info = stat()
            guard stat("\(directory)/\(name)", &info) == 0 else { continue }
            result.append((name, isSealed ? nil : named, Int64(info.st_size)))
        }
        return result
    }

    /// A name no file in the temporary folder has: `PID-TOKEN-N.tmp`, the process's id first
    /// (`removeAbandonedTemporaryFiles` reads it), a random token of the process (a crashed
    /// process of the same id left its own files) and a count. Costs no system call: a mount
    /// makes one per file written.
    func newTemporaryPath() -> String {
        "\(temporaryDirectory)/\(TemporaryNames.prefix)\(TemporaryNames.count.add(1, ordering: .relaxed).newValue).tmp"
    }

    /// Deletes temporary files left by processes that no longer run. Returns bytes freed.
    @discardableResult
    func removeAbandonedTemporaryFiles(dryRun: Bool = false) -> Int64 {
        var freed: Int64 = 0
        for name in BlobStore.names(in: temporaryDirectory) ?? [] {
            guard name.hasSuffix(".tmp"), let dash = name.firstIndex(of: "-"), let pid = pid_t(name[..<dash]) else { continue }
            guard kill(pid, 0) != 0 && errno == ESRCH else { continue }
            let path = "\(temporaryDirectory)/\(name)"
            var info = stat()
            if stat(path, &info) == 0, dryRun || unlink(path) == 0 { freed += Int64(info.st_size) }
        }
        return freed
    }

    /// The names in `folder` (with `errno` set and nil when it cannot be read).
    static func names(in folder: String) -> [String]? {
        guard let dir = opendir(folder) else { return nil }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            names.append(withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) })
        }
        return names
    }

    /// Makes the temporary file `fd` (at `temporaryPath`) the blob `key`: fsync, make it
    /// read-only, rename it into place and fsync the directory. Closes `fd`. Without
    /// `durable`, both fsyncs are left to the caller (a staged copy syncs once at its end).
    func install(_ fd: Int32, at temporaryPath: String, as key: BlobKey, durable: Bool = true) throws {
        defer { close(fd) }
        guard !durable || fsync(fd) == 0 else { throw SofaError.system("fsync", path: temporaryPath, errno: errno) }
        fchmod(fd, 0o444)
        let finalPath = path(for: key)
        // One call where the body is new (every file of a copy): a rename that does not
        // replace, where it was a look for the blob and a rename, two walks of its path.
        var failure = LongPath.renameWithoutReplacing(temporaryPath, finalPath) == 0 ? 0 : errno
        if failure == EINVAL || failure == ENOSYS {  // a file system without it
            failure = contains(key) ? EEXIST : LongPath.rename(temporaryPath, finalPath) == 0 ? 0 : errno
        }
        if failure == 0 {
            if durable { try syncDirectory() }
        } else if failure == EEXIST {
            // The same bytes are stored already. Touch the blob so that a compaction
            // running before this save commits sees it as fresh and keeps it. (Not a rename
            // over it: without `durable` the new file is not synced yet, and a power loss
            // could take the body a saved revision holds.)
            _ = LongPath.unlink(temporaryPath)
            utimensat(AT_FDCWD, finalPath, nil, 0)
        } else {
            throw SofaError.system("rename", path: finalPath, errno: failure)
        }
    }

    /// A new temporary file for random-access writing, starting as a copy of `key`'s body.
    public func makeTemporaryFile(copying key: BlobKey? = nil) throws -> TemporaryBlobFile {
        try TemporaryBlobFile(store: self, copying: key)
    }

    /// Moves the file at `path` (on the same file system) into the store, without
    /// copying it. With `keepingOriginal`, the store gets a hard link and the file
    /// stays where it is, for the caller to remove once the blob is referenced; the link is
    /// made under the blob's own name once the file is hashed (a link to a temporary name
    /// and its rename cost rsync's rename of each file two more path walks).
    ///
    /// In an encrypted store, a file in the sealed format (a scratch file of this store) is
    /// adopted as it is; any other is plaintext, and is sealed into a new blob.
    /// Not `durable`: neither the body nor its name is synced (`sync(_:)` does it before a
    /// revision refers to it).
    public func adopt(fileAt path: String, keepingOriginal: Bool = false, durable: Bool = true) throws -> StoredBlob {
        if isSealed, !BlobStore.isSealedFile(path) {
            let blob = try write(contentsOf: path, durable: durable)
            if !keepingOriginal { _ = LongPath.unlink(path) }
            return blob
        }
        let fd = LongPath.open(path, O_RDONLY)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        let digest = MessageDigest(.sha1), md5 = MessageDigest(.md5)
        let length: Int64
        do {
            length = try hashFile(fd, path: path, into: digest, md5: md5)
        } catch {
            close(fd)
            throw error
        }
        let key = BlobKey(digest: digest.finalize())
        // A new blob's time says it is fresh (compaction keeps unreferenced ones that are, as a
        // save may be about to use them): the file's own time may be any (`rsync -a` set it to
        // its source's before the rename that brings it here).
        futimens(fd, nil)
        if keepingOriginal {
            try installLink(fd, to: path, as: key, durable: durable)
        } else {
            try install(fd, at: path, as: key, durable: durable)
        }
        return StoredBlob(key: key, length: length, md5: length <= BlobStore.md5Limit ? md5.finalize() : nil)
    }

    /// Up to which length a body's MD5 is worked out as it is hashed (`StoredBlob.md5`): the
    /// bodies a mount's writer hashes on its own thread (`TemporaryBlobFile`). A larger one is
    /// hashed on another core as it arrives, and its MD5 is read at the save as before.
    static let md5Limit = Int64(TemporaryBlobFile.hashUnit)

    /// `install` for a file that stays where it is: the blob `key` is a hard link to it
    /// (`original`, open as `fd`), unless the store holds those bytes already. Closes `fd`.
    private func installLink(_ fd: Int32, to original: String, as key: BlobKey, durable: Bool) throws {
        defer { close(fd) }
        guard !durable || fsync(fd) == 0 else { throw SofaError.system("fsync", path: original, errno: errno) }
        fchmod(fd, 0o444)
        let finalPath = path(for: key)
        if LongPath.link(original, finalPath) == 0 {
            if durable { try syncDirectory() }
        } else if errno == EEXIST {
            utimensat(AT_FDCWD, finalPath, nil, 0)  // as `install`: fresh for a compaction running before the save
        } else {
            throw SofaError.system("link", path: original, errno: errno)
        }
    }

    /// Whether the file at `path` starts as a sealed body does.
    static func isSealedFile(_ path: String) -> Bool {
        let fd = LongPath.open(path, O_RDONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var magic = [UInt8](repeating: 0, count: SealedBlob.magic.count)
        return pread(fd, &magic, magic.count, 0) == magic.count && magic == SealedBlob.magic
    }

    /// Hashes a whole file from offset 0 with `pread`; returns its length. The holes of a
    /// sparse file (`truncate -s`) are hashed as zeros without being read.
    /// In an encrypted store, the file is a sealed one and its plaintext is hashed.
    /// `md5` is given the bytes too while they are within `md5Limit`.
    fileprivate func hashFile(_ fd: Int32, path: String, into digest: MessageDigest, md5: MessageDigest? = nil) throws -> Int64 {
        var md5 = md5
        func update(_ bytes: UnsafeRawBufferPointer, at offset: Int64) {
            digest.update(bytes)
            if offset + Int64(bytes.count) <= BlobStore.md5Limit { md5?.update(bytes) } else { md5 = nil }
        }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        if let key {
            do {
                let file = try SealedFile(opening: fd, path: path, key: key.blobs)
                var offset: Int64 = 0
                while offset < file.length, case let count = try file.read(into: buffer, at: offset), count > 0 {
                    update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]), at: offset)
                    offset += Int64(count)
                }
                return offset
            } catch let damage as SealedBlobDamaged {
                throw SofaError.blobCorrupted(key: "(unknown)", path: damage.path)
            }
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw SofaError.system("stat", path: path, errno: errno) }
        let length = Int64(info.st_size)
        var offset: Int64 = 0
        while offset < length {
            // Where the next data starts (the end when only a hole is left); what lies before is a hole.
            let data = lseek(fd, off_t(offset), 3 /* SEEK_DATA */)
            let holeEnd = data < 0 ? length : min(Int64(data), length)
            if holeEnd > offset {
                buffer.initializeMemory(as: UInt8.self, repeating: 0)
                while offset < holeEnd {
                    let count = Int(min(Int64(buffer.count), holeEnd - offset))
                    update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]), at: offset)
                    offset += Int64(count)
                }
                continue
            }
            let next = lseek(fd, off_t(offset), 4 /* SEEK_HOLE */)
            let dataEnd = next < 0 ? length : min(Int64(next), length)
            while offset < dataEnd {
                let count = pread(fd, buffer.baseAddress, Int(min(Int64(buffer.count), dataEnd - offset)), off_t(offset))
                if count < 0 {
                    if errno == EINTR { continue }
                    throw SofaError.system("read", path: path, errno: errno)
                }
                if count == 0 { return offset }
                update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]), at: offset)
                offset += Int64(count)
            }
        }
        return length
    }

    /// A sealed body that fails its check, said as any damaged body is (and logged where it is
    /// read: the error names the file).
    static func damaged(_ damage: SealedBlobDamaged, key: BlobKey) -> SofaError {
        .blobCorrupted(key: key.hex, path: damage.path)
    }

    fileprivate func syncDirectory() throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw SofaError.system("open", path: directory, errno: errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: directory, errno: errno) }
    }
}

/// Streams one new blob into the store. `finish()` makes it permanent; a writer
/// dropped or cancelled before that leaves nothing behind.
///
/// One thread at a time; it owns its temporary file descriptor.
public final class BlobWriter {
    private let store: BlobStore
    /// The file being written, renamed (same inode) to the blob's path by `finish()`:
    /// readers may open it to read what has been written so far.
    public let temporaryPath: String
    private var fd: Int32
    private let digest = MessageDigest(.sha1)
    public private(set) var length: Int64 = 0
    private var writeback = EarlyWriteback()
    /// Seals the bytes on their way to the file (an encrypted database's store).
    private var sealer: SealedFile?

    fileprivate init(store: BlobStore) throws {
        self.store = store
        temporaryPath = store.newTemporaryPath()
        // 0444: a blob never changes once written, and `contentPath` hands it out as read-only.
        // Readable too when sealed: a write that ends inside a block reads it back to add to it.
        fd = open(temporaryPath, (store.isSealed ? O_RDWR : O_WRONLY) | O_CREAT | O_EXCL | O_CLOEXEC, 0o444)
        guard fd >= 0 else { throw SofaError.system("create", path: temporaryPath, errno: errno) }
        if let key = store.key {
            do {
                sealer = try SealedFile(creating: fd, path: temporaryPath, key: key.blobs)
            } catch {
                cancel()
                throw error
            }
        }
    }

    deinit { cancel() }

    /// Appends bytes to the blob.
    public func write(_ bytes: UnsafeRawBufferPointer) throws {
        precondition(fd >= 0, "write after finish or cancel")
        digest.update(bytes)
        do {
            if let sealer { try sealer.write(bytes, at: length) } else { try writeFully(fd, bytes, path: temporaryPath) }
        } catch {
            cancel()
            throw error
        }
        length += Int64(bytes.count)
        writeback.written(upTo: length, fd: fd)
    }

    /// Syncs the bytes to disk and moves them under their key's name. With `expected`,
    /// bytes that hash to another key are discarded (`blobCorrupted`) and never installed.
    /// `durable: false` skips the syncs, for a store that is synced as a whole later.
    public func finish(expecting expected: BlobKey? = nil, durable: Bool = true) throws -> StoredBlob {
        precondition(fd >= 0, "finish after finish or cancel")
        let key = BlobKey(digest: digest.finalize())
        if let expected, expected != key {
            cancel()
            throw SofaError.blobCorrupted(key: expected.hex, path: temporaryPath)
        }
        do {
            sealer = nil
            let descriptor = fd
            fd = -1
            try store.install(descriptor, at: temporaryPath, as: key, durable: durable)
        } catch {
            cancel()
            throw error
        }
        return StoredBlob(key: key, length: length)
    }

    /// Abandons the blob: deletes its temporary file.
    public func cancel() {
        if fd >= 0 { unlink(temporaryPath) }
        closeFile()
    }

    private func closeFile() {
        if fd >= 0 {
            Glibc.close(fd)
            fd = -1
        }
    }
}

/// Reads a blob sequentially and checks, at its end, that the bytes hash to the
/// key: a corrupt blob ends in `SofaError.blobCorrupted`, never in a clean EOF.
///
/// `read(at:)` reads at any offset without that check (the mount's random reads).
public final class BlobReader {
    public let key: BlobKey
    public let path: String
    /// The body's length (not the sealed file's, in an encrypted database).
    public let length: Int64
    private let fd: Int32
    private let digest = MessageDigest(.sha1)
    private var position: Int64 = 0
    private var verified = false
    /// Opens the sealed blocks (an encrypted database's store); nil for a plain file.
    private let unsealer: SealedFile?

    fileprivate init(key: BlobKey, path: String, expectedLength: Int64?, sealedWith sealingKey: SealingKey?) throws {
        self.key = key
        self.path = path
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        self.fd = fd
        do {
            unsealer = try sealingKey.map { try SealedFile(opening: fd, path: path, key: $0) }
        } catch let damage as SealedBlobDamaged {
            close(fd)
            throw BlobStore.damaged(damage, key: key)
        } catch {
            close(fd)
            throw error
        }
        var info = stat()
        fstat(fd, &info)
        length = unsealer?.length ?? Int64(info.st_size)
        if let expectedLength, expectedLength != length {
            close(fd)
            throw SofaError.blobCorrupted(key: key.hex, path: path)
        }
    }

    deinit { close(fd) }

    /// The open file, for a reader that needs it (the kernel reading it directly: FUSE
    /// passthrough); nil when the file holds the body sealed (an encrypted database), which only
    /// this reader can open. Borrowed: it stays open as long as this reader, and is not to be closed.
    public var descriptor: Int32? { unsealer == nil ? fd : nil }

    /// Reads the next bytes into `buffer`; 0 at the end, once the hash has been checked.
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        while true {
            let count = unsealer != nil ? try read(into: buffer, at: position) : Glibc.read(fd, buffer.baseAddress, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw SofaError.system("read", path: path, errno: errno)
            }
            if count == 0 {
                if !verified {
                    guard position == length, BlobKey(digest: digest.finalize()) == key else {
                        throw SofaError.blobCorrupted(key: key.hex, path: path)
                    }
                    verified = true
                }
                return 0
            }
            digest.update(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
            position += Int64(count)
            return count
        }
    }

    /// Reads up to `buffer.count` bytes at `offset`, without hash checking (a sealed body's
    /// blocks are checked by their tags: a damaged one is `blobCorrupted`, never other bytes).
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        if let unsealer {
            do {
                return try unsealer.read(into: buffer, at: offset)
            } catch let damage as SealedBlobDamaged {
                throw BlobStore.damaged(damage, key: key)
            }
        }
        while true {
            let count = pread(fd, buffer.baseAddress, buffer.count, off_t(offset))
            if count < 0 {
                if errno == EINTR { continue }
                throw SofaError.system("read", path: path, errno: errno)
            }
            return count
        }
    }
}

/// What names the temporary files of this process.
private enum TemporaryNames {
    static let prefix = "\(getpid())-\(String(UInt64.random(in: 0...UInt64.max), radix: 36))-"
    static let count = Atomic<Int>(0)
}

/// A temporary file written at any offset (the mount's attachment writes), that
/// becomes a blob with `commit()`. While writes arrive in order from offset 0 the
/// bytes are hashed as they come; otherwise the file is hashed once at commit.
/// One thread at a time.
public final class TemporaryBlobFile {
    private let store: BlobStore
    public let path: String
    private var fd: Int32
    /// Non-nil while every byte so far was written in order. Updated on `hasher` only.
    private var digest: MessageDigest? = MessageDigest(.sha1)
    /// The MD5 of the same bytes while they are hashed here, on the writer's thread (`StoredBlob.md5`).
    private var md5: MessageDigest? = MessageDigest(.md5)
    private var hashedLength: Int64 = 0
    /// Whether a write went to `hasher`: the later ones go there too, in order.
    private var hashedElsewhere = false
    private var writeback = EarlyWriteback()
    public private(set) var size: Int64 = 0
    /// Hashes in-order writes on another core while the writer carries on (a mount's
    /// write returns once its bytes are in the file); `commit` waits for it.
    private let hasher = DispatchQueue(label: "sofa.blob-hash")
    /// Bounds the bytes waiting to be hashed: 8 MiB, in units of 128 KiB (counting pieces
    /// let 64 MiB wait once the mount's writes grew to 1 MiB, and the mount's peak RSS with it).
    private let hashSlots = DispatchSemaphore(value: 64)
    static let hashUnit = 128 << 10
    /// The file sealed (an encrypted database): it becomes the blob by a rename all the same.
    private var sealed: SealedFile?

    fileprivate init(store: BlobStore, copying key: BlobKey?) throws {
        self.store = store
        path = store.newTemporaryPath()
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        if let sealingKey = store.key?.blobs {
            do { sealed = try SealedFile(creating: fd, path: path, key: sealingKey) } catch {
                discard()
                throw error
            }
        }
        if let key {
            do {
                let reader = try store.openReader(key)
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
                defer { buffer.deallocate() }
                while case let count = try reader.read(into: buffer), count > 0 {
                    try write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]), at: size)
                }
            } catch {
                discard()
                throw error
            }
        }
    }

    deinit { discard() }

    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws {
        if let sealed { try sealed.write(bytes, at: offset) } else { try writeFully(fd, bytes, at: offset, path: path) }
        defer { size = max(size, offset + Int64(bytes.count)) }
        guard let digest, offset == hashedLength else {
            digest = nil  // out of order: hashed once at `commit`
            return
        }
        if !hashedElsewhere && hashedLength + Int64(bytes.count) <= TemporaryBlobFile.hashUnit {
            // A small file's bytes are hashed here: handing 4 KiB to another thread and waiting
            // for it at `commit` costs two wake-ups, more than SHA-1 of 128 KiB.
            digest.update(bytes)
            md5?.update(bytes)
            hashedLength += Int64(bytes.count)
        } else {
            hashedElsewhere = true
            md5 = nil
            let copy = [UInt8](bytes)
            let box = HashingDigest(digest)
            let units = max(1, (bytes.count + TemporaryBlobFile.hashUnit - 1) / TemporaryBlobFile.hashUnit)
            for _ in 0..<units { hashSlots.wait() }
            hasher.async { [hashSlots] in
                box.digest.update(copy)
                for _ in 0..<units { hashSlots.signal() }
            }
            hashedLength += Int64(bytes.count)
            writeback.written(upTo: hashedLength, fd: fd)
        }
    }

    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        if let sealed {
            do { return try sealed.read(into: buffer, at: offset) } catch let damage as SealedBlobDamaged {
                throw SofaError.blobCorrupted(key: "(being written)", path: damage.path)
            }
        }
        while true {
            let count = pread(fd, buffer.baseAddress, buffer.count, off_t(offset))
            if count >= 0 { return count }
            if errno != EINTR { throw SofaError.system("read", path: path, errno: errno) }
        }
    }

    public func truncate(to newSize: Int64) throws {
        if let sealed { try sealed.truncate(to: newSize) } else if ftruncate(fd, off_t(newSize)) != 0 {
            throw SofaError.system("truncate", path: path, errno: errno)
        }
        if newSize == 0 {
            digest = MessageDigest(.sha1)
            md5 = MessageDigest(.md5)
            hashedLength = 0
            hashedElsewhere = false
        } else if newSize != hashedLength {
            digest = nil
        }
        size = newSize
    }

    /// Makes what was written durable (the file, not yet a blob).
    public func sync() throws {
        guard fdatasync(fd) == 0 else { throw SofaError.system("sync", path: path, errno: errno) }
    }

    /// Makes the file a blob; the file is gone afterwards. Without `durable`, the caller syncs
    /// it later (`BlobStore.sync(_:)`) before a revision refers to it.
    public func commit(durable: Bool = true) throws -> StoredBlob {
        precondition(fd >= 0, "commit after commit or discard")
        let finished: MessageDigest
        var md5 = self.md5
        hasher.sync {}  // every queued piece is hashed
        if let digest, hashedLength == size {
            finished = digest
        } else {
            finished = MessageDigest(.sha1)
            md5 = MessageDigest(.md5)
            _ = try store.hashFile(fd, path: path, into: finished, md5: md5)
        }
        let key = BlobKey(digest: finished.finalize())
        let descriptor = fd
        fd = -1
        do {
            try store.install(descriptor, at: path, as: key, durable: durable)
        } catch {
            unlink(path)
            throw error
        }
        return StoredBlob(key: key, length: size, md5: size <= BlobStore.md5Limit ? md5?.finalize() : nil)
    }

    /// Deletes the file unless it was committed.
    public func discard() {
        guard fd >= 0 else { return }
        close(fd)
        fd = -1
        unlink(path)
    }
}

/// Has the disk start writing a body while more of it arrives (`sync_file_range`, which
/// does not wait), so that the fsync before the body is installed finds little left to do:
/// that fsync took 0.3–0.5 s of a 1 GiB copy into the mount.
struct EarlyWriteback {
    private var started: Int64 = 0
    static let step: Int64 = 8 << 20

    /// The bytes before `end` are written (in order).
    mutating func written(upTo end: Int64, fd: Int32) {
        guard end - started >= EarlyWriteback.step else { return }
        _ = sync_file_range(fd, started, end - started, 2 /* SYNC_FILE_RANGE_WRITE */)
        started = end
    }
}

/// Hands a digest to the hashing queue. Sendable invariant: once handed over, it is
/// used only on that serial queue until `commit` has drained it.
private final class HashingDigest: @unchecked Sendable {
    let digest: MessageDigest
    init(_ digest: MessageDigest) { self.digest = digest }
}
