import CCrypto
import CSeal
import DocumentModel
import Foundation

/// The mount's scratch folder, `NAME.sofa/scratch/`: files programs make in a document's folder
/// that are not attachments (an editor's swap file, rsync's temporary file before its rename,
/// saved queries, a rejected properties.json), in a folder per escaped document id.
///
/// In a plain database names and contents are stored as they are. In an encrypted one
/// (docs/encryption.md, "Scratch files") each name is sealed with AES-256-SIV and stored in
/// base64url: equal names seal equally, so a path is found without a listing and a rename is
/// one `rename(2)`. Contents are sealed bodies (`SealedBlob` under the blobs' key), so a scratch
/// file renamed into attachments/ still becomes a blob by a rename. What stays visible: the
/// tree's shape, sizes, times and modes, and which names in two folders are equal.
///
/// A sealed name is 16 bytes longer and a third longer again in base64url, so a name of more than
/// 175 bytes does not fit in a file name: the file system answers ENAMETOOLONG. A document's
/// folder whose id is that long is named by an HMAC of it instead, with the id sealed in a
/// file `~name` inside (names starting with "~" are never sealed names: never listed).
public final class ScratchFolder: Sendable {
    public let root: String
    private let key: DatabaseKey?
    /// Reads and writes of sealed files, one at a time: a write may rewrite a block another
    /// descriptor of the same file reads, and each descriptor's `SealedFile` learns the length
    /// from the file under this lock.
    let sealedAccess = NSLock()

    public var isSealed: Bool { key != nil }

    /// The scratch folder of `database`.
    public convenience init(database: Database) {
        self.init(root: "\(database.path)/scratch", key: database.encryption)
    }

    init(root: String, key: DatabaseKey?) {
        (self.root, self.key) = (root, key)
    }

    // MARK: - Names

    /// The longest name that can be sealed into a file name (255 bytes of base64url).
    public static let longestSealedName = 175

    /// `name` as stored: itself, or sealed.
    public func storedName(_ name: String) -> String {
        guard let key else { return name }
        let plain = Array(name.utf8)
        var sealed = [UInt8](repeating: 0, count: plain.count + 16)
        guard sofa_siv_seal(key.scratchNames.bytes, plain, Int32(plain.count), &sealed) == 1 else {
            // OpenSSL without AES-SIV: no name that could be found again, so none that leaks.
            return "~" + String(repeating: "0", count: 256)
        }
        return ScratchFolder.base64url(sealed)
    }

    /// A stored name as shown; nil for one that does not open with this key (a document folder
    /// named by its HMAC, another key's, a damaged one, or a plain name in a sealed folder).
    public func shownName(_ stored: String) -> String? {
        guard let key else { return stored }
        guard let sealed = ScratchFolder.bytes(ofBase64url: stored), sealed.count >= 16 else { return nil }
        var plain = [UInt8](repeating: 0, count: sealed.count - 16)
        guard sofa_siv_open(key.scratchNames.bytes, sealed, Int32(sealed.count), &plain) == 1 else { return nil }
        return String(validating: plain, as: UTF8.self)
    }

    /// RFC 4648's base64url without padding (a scratch folder is read a name at a time, on
    /// every lookup: Foundation's base64 and three replacements cost a fifth of an rsync's time).
    static let base64urlDigits = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    static func base64url(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index < bytes.count {
            let count = min(3, bytes.count - index)
            var group = UInt32(bytes[index]) << 16
            if count > 1 { group |= UInt32(bytes[index + 1]) << 8 }
            if count > 2 { group |= UInt32(bytes[index + 2]) }
            for digit in 0...count { out.append(base64urlDigits[Int(group >> (18 - 6 * UInt32(digit))) & 63]) }
            index += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of a base64url name without padding; nil if it is not one.
    static func bytes(ofBase64url text: String) -> [UInt8]? {
        var out: [UInt8] = []
        var group: UInt32 = 0, digits = 0
        for character in text.utf8 {
            let value: UInt8
            switch character {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = character - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = character - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"): value = 62
            case UInt8(ascii: "_"): value = 63
            default: return nil
            }
            group = group << 6 | UInt32(value)
            digits += 1
            if digits == 4 {
                out += [UInt8(group >> 16 & 0xFF), UInt8(group >> 8 & 0xFF), UInt8(group & 0xFF)]
                (group, digits) = (0, 0)
            }
        }
        switch digits {
        case 0: break
        // The bits past the last byte are zeros in the one way to write these bytes.
        case 2 where group & 0xF == 0: out.append(UInt8(group >> 4 & 0xFF))
        case 3 where group & 0x3 == 0: out += [UInt8(group >> 10 & 0xFF), UInt8(group >> 2 & 0xFF)]
        default: return nil  // one digit left over is no byte; or bits that are not zeros
        }
        return out
    }

    /// The folder of the scratch files of the document whose escaped id is `escapedID`.
    public func folder(ofEscapedID escapedID: String) -> String {
        let stored = storedName(escapedID)
        if let key, stored.utf8.count > Int(NAME_MAX) { return "\(root)/~\(key.fileName(ofScratchFolder: escapedID))" }
        return "\(root)/\(stored)"
    }

    /// The file in a document folder named by an HMAC that holds its (escaped) id.
    static let folderNameFile = "~name"

    /// Makes the folder of the scratch files of the document whose escaped id is `escapedID`,
    /// as `mkdir(2)` would (EEXIST if it is there).
    public func makeFolder(ofEscapedID escapedID: String) throws {
        let folder = folder(ofEscapedID: escapedID)
        guard mkdir(folder, 0o755) == 0 else { throw SofaError.system("mkdir", path: folder, errno: errno) }
        try nameFolder(ofEscapedID: escapedID)
    }

    /// Writes a document folder named by an HMAC its `~name` file (a folder made or moved
    /// there); nothing for any other.
    public func nameFolder(ofEscapedID escapedID: String) throws {
        let folder = folder(ofEscapedID: escapedID)
        guard folder.hasPrefix("\(root)/~") else { return }
        try write(Array(escapedID.utf8), to: "\(folder)/\(ScratchFolder.folderNameFile)")
    }

    /// The escaped ids of the documents that have a scratch folder.
    public func documentFolderNames() throws -> [String] {
        try ScratchFolder.storedNames(in: root).compactMap { stored in
            shownName(stored) ?? documentFolderName(stored)
        }
    }

    /// The stored path of `relative` (names joined by "/") below the stored folder `directory`.
    public func path(_ directory: String, _ relative: String) -> String {
        guard isSealed else { return relative.isEmpty ? directory : "\(directory)/\(relative)" }
        return relative.split(separator: "/").reduce(directory) { "\($0)/\(storedName(String($1)))" }
    }

    /// The names in the stored folder `directory`, as shown; none when it does not exist. Any
    /// other failure (permissions, a disk error) is passed up.
    public func names(in directory: String) throws -> [String] {
        try ScratchFolder.storedNames(in: directory).compactMap(shownName)
    }

    static func storedNames(in directory: String) throws -> [String] {
        guard let folder = LongPath.openFolder(directory) else {
            if errno == ENOENT || errno == ENOTDIR { return [] }
            throw SofaError.system("opendir", path: directory, errno: errno)
        }
        defer { closedir(folder) }
        var names: [String] = []
        while let entry = readdir(folder) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    /// Every file below the stored folder `directory` (not folders): its path relative to it as
    /// shown, and its stored path. Names that do not open are left out.
    public func files(below directory: String) throws -> [(relative: String, path: String)] {
        var found: [(String, String)] = []
        for stored in try ScratchFolder.storedNames(in: directory) {
            guard let name = shownName(stored) else { continue }
            let path = "\(directory)/\(stored)"
            if ScratchFolder.isFolder(path) {
                found += try files(below: path).map { ("\(name)/\($0.relative)", $0.path) }
            } else {
                found.append((name, path))
            }
        }
        return found
    }

    /// Whether the stored folder `directory` holds no file (empty subfolders do not count).
    public func holdsNoFile(_ directory: String) -> Bool {
        guard let names = try? ScratchFolder.storedNames(in: directory) else { return false }
        return names.allSatisfy {
            isSealed && $0 == ScratchFolder.folderNameFile || ScratchFolder.isFolder("\(directory)/\($0)") && holdsNoFile("\(directory)/\($0)")
        }
    }

    static func isFolder(_ path: String) -> Bool {
        var info = stat()
        return LongPath.lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// Sealed in place: the plain names and contents an earlier version kept in an encrypted
    /// database's scratch folder (a name that is both plain and sealed is left as it is).
    /// Returns how many it sealed.
    public func sealPlainFiles() throws -> Int {
        // Done once: a version that seals never writes a plain file here, so the walk (a name
        // opened per file, the trash's too) is not repeated at every mount.
        let done = "\(root)/~sealed"
        guard isSealed, access(done, F_OK) != 0 else { return 0 }
        let count = try sealPlainFiles(in: root, top: true)
        let marker = Glibc.open(done, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        if marker >= 0 { Glibc.close(marker) }  // without it, the next mount walks again: harmless
        return count
    }

    private func sealPlainFiles(in directory: String, top: Bool) throws -> Int {
        var count = 0
        for stored in try ScratchFolder.storedNames(in: directory) {
            var path = "\(directory)/\(stored)"
            if shownName(stored) == nil, !stored.hasPrefix("~") {
                let target = top ? folder(ofEscapedID: stored) : "\(directory)/\(storedName(stored))"
                guard !LongPath.exists(target) else { continue }
                if ScratchFolder.isFolder(path) || BlobStore.isSealedFile(path) {
                    guard LongPath.rename(path, target) == 0 else { throw SofaError.system("rename", path: path, errno: errno) }
                } else {
                    try seal(path, to: target)
                }
                path = target
                count += 1
            }
            if ScratchFolder.isFolder(path) { count += try sealPlainFiles(in: path, top: false) }
        }
        return count
    }

    /// The plain file at `path` sealed into `target` (its mode and times kept), then removed.
    private func seal(_ path: String, to target: String) throws {
        let plain = LongPath.open(path, O_RDONLY)
        guard plain >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(plain) }
        var info = stat()
        guard fstat(plain, &info) == 0 else { throw SofaError.system("fstat", path: path, errno: errno) }
        // "~" starts no sealed name: a file left by a crash here is never listed.
        let temporary = (target as NSString).deletingLastPathComponent + "/~sealing-\(getpid())"
        let file = try open(temporary, flags: O_WRONLY | O_CREAT | O_TRUNC, mode: info.st_mode & 0o7777)
        do {
            defer { file.close() }
            try file.fill { buffer, offset in
                let count = pread(plain, buffer.baseAddress, buffer.count, off_t(offset))
                guard count >= 0 else { throw SofaError.system("read", path: path, errno: errno) }
                return count
            }
            try file.sync()
            var times = [info.st_atim, info.st_mtim]
            _ = LongPath.setTimes(temporary, &times)
            guard LongPath.rename(temporary, target) == 0 else { throw SofaError.system("rename", path: temporary, errno: errno) }
        } catch {
            _ = LongPath.unlink(temporary)
            throw error
        }
        _ = LongPath.unlink(path)
    }

    /// Copies every folder and file of this scratch folder into `target` (which holds none):
    /// names and contents opened here and stored as `target` stores them, modes and times kept
    /// (`sofa encrypt`/`decrypt`). A document folder named by an HMAC is named again by the id
    /// among `documentIDs()` it was made for; one whose id is not there cannot be named, and fails.
    func copyAll(to target: ScratchFolder, documentIDs: () throws -> [String]) throws {
        var hashed: [String: String]?
        let names = try ScratchFolder.storedNames(in: root)
        if !names.isEmpty, mkdir(target.root, 0o755) != 0, errno != EEXIST {
            throw SofaError.system("mkdir", path: target.root, errno: errno)
        }
        for stored in names {
            let escapedID: String
            if let name = shownName(stored) {
                escapedID = name
            } else if let name = documentFolderName(stored) {
                escapedID = name
            } else if stored.hasPrefix("~"), ScratchFolder.isFolder("\(root)/\(stored)"), let key {
                if hashed == nil {
                    hashed = [:]
                    for id in try documentIDs() where storedName(FileNames.escape(id)).utf8.count > Int(NAME_MAX) {
                        hashed![key.fileName(ofScratchFolder: FileNames.escape(id))] = FileNames.escape(id)
                    }
                }
                guard let name = hashed![String(stored.dropFirst())] else {
                    throw SofaError.invalidArgument("\(root)/\(stored) holds scratch files of a document whose id cannot be found: move them out through a mount first")
                }
                escapedID = name
            } else {
                continue  // a file this folder does not name (a crash's leftover, the ~sealed mark): nothing of the user's
            }
            try copyEntry("\(root)/\(stored)", to: target.folder(ofEscapedID: escapedID), in: target)
            try target.nameFolder(ofEscapedID: escapedID)
        }
    }

    /// The escaped id the `~name` file of the folder `stored` (named by an HMAC) holds, if it
    /// is the one the folder is named for.
    private func documentFolderName(_ stored: String) -> String? {
        guard stored.hasPrefix("~"), let bytes = try? contents(of: "\(root)/\(stored)/\(ScratchFolder.folderNameFile)"),
              let name = String(validating: bytes, as: UTF8.self), folder(ofEscapedID: name) == "\(root)/\(stored)" else { return nil }
        return name
    }

    private func copyEntry(_ path: String, to destination: String, in target: ScratchFolder) throws {
        var info = stat()
        guard LongPath.lstat(path, &info) == 0 else { throw SofaError.system("lstat", path: path, errno: errno) }
        if info.st_mode & S_IFMT == S_IFDIR {
            guard LongPath.mkdir(destination, info.st_mode & 0o7777) == 0 else { throw SofaError.system("mkdir", path: destination, errno: errno) }
            for stored in try ScratchFolder.storedNames(in: path) {
                guard let name = shownName(stored) else { continue }
                try copyEntry("\(path)/\(stored)", to: target.path(destination, name), in: target)
            }
        } else if info.st_mode & S_IFMT == S_IFREG {
            let from = try open(path, flags: O_RDONLY), to = try target.open(destination, flags: O_WRONLY | O_CREAT | O_EXCL, mode: info.st_mode & 0o7777)
            defer { from.close(); to.close() }
            try to.fill(from: from.read)
        } else {
            return  // a mount makes only folders and files here
        }
        var times = [info.st_atim, info.st_mtim]
        _ = LongPath.setTimes(destination, &times)
    }

    // MARK: - Contents

    /// The length of what a file of `size` bytes on disk holds.
    public func contentLength(ofStoredSize size: Int64) -> Int64 {
        isSealed ? SealedBlob.plainSize(ofSealed: size) ?? 0 : size
    }

    /// Opens the stored file at `path` with `open(2)`'s `flags` (and `mode` when it is made).
    public func open(_ path: String, flags: Int32, mode: mode_t = 0o644) throws -> ScratchFile {
        guard let key else {
            let fd = LongPath.open(path, flags, mode)
            guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
            return ScratchFile(path: path, fd: fd, sealing: nil)
        }
        // A sealed file is read to patch a block and written at the offsets of its records:
        // read and write access, no O_APPEND (the offsets given are the body's), no O_TRUNC
        // (the header stays; the body is cut below).
        let writing = flags & O_ACCMODE != O_RDONLY
        let fd = LongPath.open(path, (flags & ~(O_ACCMODE | O_APPEND | O_TRUNC)) | (writing ? O_RDWR : O_RDONLY), mode)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        let file = ScratchFile(path: path, fd: fd, sealing: (key.blobs, sealedAccess))
        if writing && flags & O_TRUNC != 0 {
            do { try file.truncate(to: 0) } catch {
                file.close()
                throw error
            }
        }
        return file
    }

    /// What the stored file at `path` holds.
    public func contents(of path: String) throws -> [UInt8] {
        let file = try open(path, flags: O_RDONLY)
        defer { file.close() }
        var bytes = [UInt8](repeating: 0, count: Int(try file.size()))
        var done = 0
        while done < bytes.count {
            let count = try bytes.withUnsafeMutableBytes { try file.read(into: UnsafeMutableRawBufferPointer(rebasing: $0[done...]), at: Int64(done)) }
            guard count > 0 else { break }
            done += count
        }
        return Array(bytes.prefix(done))
    }

    /// Makes (or empties) the stored file at `path` and writes `bytes` into it.
    public func write(_ bytes: [UInt8], to path: String) throws {
        let file = try open(path, flags: O_WRONLY | O_CREAT | O_TRUNC)
        defer { file.close() }
        _ = try bytes.withUnsafeBytes { try file.write($0, at: 0) }
    }

    /// Makes (or empties) the stored file at `path` and writes what `reader` reads into it.
    public func copy(_ reader: BlobReader, to path: String) throws {
        let file = try open(path, flags: O_WRONLY | O_CREAT | O_TRUNC)
        defer { file.close() }
        try file.fill { buffer, _ in try reader.read(into: buffer) }
    }

    /// Cuts or grows the stored file at `path` to `size` bytes.
    public func truncate(_ path: String, to size: Int64) throws {
        guard isSealed else {
            guard LongPath.truncate(path, off_t(size)) == 0 else { throw SofaError.system("truncate", path: path, errno: errno) }
            return
        }
        let file = try open(path, flags: O_WRONLY)
        defer { file.close() }
        try file.truncate(to: size)
    }
}

/// An open scratch file: a descriptor, and in an encrypted database the sealed body over it.
/// Reads and writes may come from several threads (a mount's).
public final class ScratchFile: @unchecked Sendable {
    // Sendable invariant: `sealed` is made and used under `sealing.access` only.
    public let path: String
    private let fd: Int32
    private let sealing: (key: SealingKey, access: NSLock)?
    private var sealed: SealedFile?

    init(path: String, fd: Int32, sealing: (SealingKey, NSLock)?) {
        (self.path, self.fd) = (path, fd)
        self.sealing = sealing.map { (key: $0.0, access: $0.1) }
    }

    /// The sealed body as the file holds it now (another descriptor may have written it):
    /// none while the file is empty (made, its header not yet written).
    private func body(creating: Bool) throws -> SealedFile? {
        guard let sealing else { return nil }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw SofaError.system("fstat", path: path, errno: errno) }
        if info.st_size == 0 {
            guard creating else { return nil }
            sealed = try SealedFile(creating: fd, path: path, key: sealing.key)
        } else if let sealed {
            try sealed.reload(size: Int64(info.st_size))
        } else {
            sealed = try SealedFile(opening: fd, path: path, key: sealing.key)
        }
        return sealed
    }

    private func sealedAccess<T>(_ body: () throws -> T) throws -> T {
        sealing!.access.lock()
        defer { sealing!.access.unlock() }
        do { return try body() } catch let damaged as SealedBlobDamaged {
            throw SofaError.blobCorrupted(key: "(scratch file)", path: damaged.path)
        }
    }

    /// Reads up to `buffer.count` bytes at `offset`; 0 at the end.
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        guard sealing != nil else {
            let count = pread(fd, buffer.baseAddress, buffer.count, off_t(offset))
            guard count >= 0 else { throw SofaError.system("read", path: path, errno: errno) }
            return count
        }
        return try sealedAccess { try body(creating: false)?.read(into: buffer, at: offset) ?? 0 }
    }

    /// Writes all of `bytes` at `offset`; returns how many (all of them).
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        guard sealing != nil else {
            var done = 0
            while done < bytes.count {
                // In pieces of Tuning.largestWrite, as the blob store writes.
                let count = pwrite(fd, bytes.baseAddress! + done, min(bytes.count - done, Tuning.largestWrite), off_t(offset) + off_t(done))
                guard count > 0 else { throw SofaError.system("write", path: path, errno: count < 0 ? errno : ENOSPC) }
                done += count
            }
            return done
        }
        try sealedAccess { try body(creating: true)!.write(bytes, at: offset) }
        return bytes.count
    }

    /// Writes what `read` gives (into a buffer, for an offset) from offset 0 on, until it gives 0.
    func fill(from read: (UnsafeMutableRawBufferPointer, Int64) throws -> Int) throws {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        var offset: Int64 = 0
        while case let count = try read(buffer, offset), count > 0 {
            _ = try write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]), at: offset)
            offset += Int64(count)
        }
    }

    /// Cuts or grows the file to `size` bytes.
    public func truncate(to size: Int64) throws {
        guard sealing != nil else {
            guard ftruncate(fd, off_t(size)) == 0 else { throw SofaError.system("truncate", path: path, errno: errno) }
            return
        }
        try sealedAccess {
            if size == 0 {
                // A new header and salt: nothing of the old body's key stays in use.
                guard ftruncate(fd, 0) == 0 else { throw SofaError.system("truncate", path: path, errno: errno) }
                sealed = nil
            }
            try body(creating: true)!.truncate(to: size)
        }
    }

    /// The length of what the file holds.
    public func size() throws -> Int64 {
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw SofaError.system("fstat", path: path, errno: errno) }
        return sealing == nil ? Int64(info.st_size) : SealedBlob.plainSize(ofSealed: Int64(info.st_size)) ?? 0
    }

    public func sync() throws {
        guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: path, errno: errno) }
    }

    public func close() { Glibc.close(fd) }
}
