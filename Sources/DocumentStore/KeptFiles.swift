import DocumentModel
import Foundation

/// Kept files: bytes a table's rows name that are not blobs yet (a mount's pending saves, whose
/// table is in the MountTables module), in the blob store's temporary folder so that one becomes
/// a blob by a rename, under a name the sweep of abandoned temporary files never takes
/// (`*.keep`). Sealed in an encrypted store, as every body is.
///
/// Invariant: a kept file is removed only by the part whose row names it, or by compaction once
/// no row of any schema step names it (`SchemaStep.keptFiles`) and it is older than
/// `Tuning.blobGracePeriod` (a writer may be between writing it and recording its row).
extension BlobStore {
    /// The kept file `id` (letters, digits and dashes).
    public func keptFilePath(_ id: String) -> String { "\(temporaryDirectory)/pending-\(id).keep" }

    /// Writes a small kept file (a `properties.json` a program fsynced), synced.
    public func writeKeptFile(_ bytes: [UInt8], to path: String) throws {
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        if let key = key?.blobs {
            let file = try SealedFile(creating: fd, path: path, key: key)
            try bytes.withUnsafeBytes { try file.write($0, at: 0) }
        } else {
            try bytes.withUnsafeBytes { try writeFully(fd, $0, path: path) }
        }
        guard fdatasync(fd) == 0 else { throw SofaError.system("sync", path: path, errno: errno) }
    }

    /// Reads back a kept file (at most `limit` bytes; a longer one is refused).
    public func readKeptFile(_ path: String, limit: Int) throws -> [UInt8] {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        func damaged(_ damage: SealedBlobDamaged) -> SofaError { .blobCorrupted(key: "(kept file)", path: damage.path) }
        var file: SealedFile?
        let length: Int64
        if let key = key?.blobs {
            do { file = try SealedFile(opening: fd, path: path, key: key) } catch let damage as SealedBlobDamaged { throw damaged(damage) }
            length = file!.length
        } else {
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw SofaError.system("stat", path: path, errno: errno) }
            length = Int64(info.st_size)
        }
        guard length <= Int64(limit) else { throw SofaError.invalidArgument("\(path) is larger than \(limit) bytes") }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        let got = try bytes.withUnsafeMutableBytes { buffer -> Int in
            if let file {
                do { return try file.read(into: buffer, at: 0) } catch let damage as SealedBlobDamaged { throw damaged(damage) }
            }
            return pread(fd, buffer.baseAddress, buffer.count, 0)
        }
        guard got == bytes.count else { throw SofaError.system("read", path: path, errno: EIO) }
        return bytes
    }

    /// Deletes the kept files not in `named` once older than `Tuning.blobGracePeriod`. Returns
    /// the bytes freed.
    func removeKeptFiles(notIn named: Set<String>, dryRun: Bool) -> Int64 {
        let cutoff = Date().timeIntervalSince1970 - Tuning.blobGracePeriod
        var freed: Int64 = 0
        for name in BlobStore.names(in: temporaryDirectory) ?? []  // no folder: nothing to sweep
        where name.hasSuffix(".keep") && !named.contains("\(temporaryDirectory)/\(name)") {
            let path = "\(temporaryDirectory)/\(name)"
            var info = stat()
            guard stat(path, &info) == 0, Double(info.st_mtim.tv_sec) < cutoff else { continue }
            if dryRun || unlink(path) == 0 { freed += Int64(info.st_blocks) * 512 }
        }
        return freed
    }
}
