import DocumentModel
import Foundation
import Logging

/// A file a mount was writing, made durable by an fsync before it was saved as a revision.
public struct PendingSave: Hashable, Sendable {
    public let id: String
    /// The mount process that wrote it.
    public let pid: pid_t
    public let docID: String
    /// The attachment; nil for properties.json.
    public let name: String?
    public let base: RevisionID?
    public let contentType: String?
    /// Its bytes, synced to disk.
    public let file: String

    public init(id: String, pid: pid_t, docID: String, name: String?, base: RevisionID?, contentType: String?, file: String) {
        (self.id, self.pid, self.docID, self.name, self.base, self.contentType, self.file) = (id, pid, docID, name, base, contentType, file)
    }
}

extension PendingSave {
    /// `pending_saves` (version 4): files a mount was writing when they were fsynced, not yet
    /// saved as revisions (`file` holds their bytes, synced). A mount that stopped before saving
    /// them saves them when the database is mounted again (`pid` was not running).
    static let schemaStep = SchemaStep("pending saves", numberedVersion: 4, forgetInCopies: "DELETE FROM pending_saves", sql: """
        CREATE TABLE IF NOT EXISTS pending_saves (
            id TEXT PRIMARY KEY,
            pid INTEGER NOT NULL,
            doc_id TEXT NOT NULL,
            name TEXT,
            base_rev TEXT,
            content_type TEXT,
            file TEXT NOT NULL
        ) WITHOUT ROWID;
        """)
}

extension Database {
    /// Where a pending save keeps its bytes: beside the blob store's temporary files, under a
    /// name compaction never sweeps.
    public func pendingSaveFile(_ id: String) -> String { "\(blobs.directory)/tmp/pending-\(id).keep" }

    /// Writes a pending save's small body (a properties.json made durable by fsync) to `path`,
    /// synced; sealed in an encrypted database, as every body is.
    public func writePendingSave(_ bytes: [UInt8], to path: String) throws {
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        if let key = blobs.key?.blobs {
            let file = try SealedFile(creating: fd, path: path, key: key)
            try bytes.withUnsafeBytes { try file.write($0, at: 0) }
        } else {
            try bytes.withUnsafeBytes { try writeFully(fd, $0, path: path) }
        }
        guard fdatasync(fd) == 0 else { throw SofaError.system("sync", path: path, errno: errno) }
    }

    /// Reads back what `writePendingSave` wrote (at most `limit` bytes).
    public func readPendingSave(_ path: String, limit: Int) throws -> [UInt8] {
        let fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        var length: Int64
        var file: SealedFile?
        if let key = blobs.key?.blobs {
            do { file = try SealedFile(opening: fd, path: path, key: key) } catch let damage as SealedBlobDamaged {
                throw SofaError.blobCorrupted(key: "(pending save)", path: damage.path)
            }
            length = file!.length
        } else {
            var info = stat()
            fstat(fd, &info)
            length = Int64(info.st_size)
        }
        guard length <= Int64(limit) else { throw SofaError.invalidArgument("\(path) is larger than \(limit) bytes") }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        let got = try bytes.withUnsafeMutableBytes { buffer -> Int in
            if let file {
                do { return try file.read(into: buffer, at: 0) } catch let damage as SealedBlobDamaged {
                    throw SofaError.blobCorrupted(key: "(pending save)", path: damage.path)
                }
            }
            return pread(fd, buffer.baseAddress, buffer.count, 0)
        }
        guard got == bytes.count else { throw SofaError.system("read", path: path, errno: EIO) }
        return bytes
    }

    public func recordPendingSave(_ save: PendingSave) throws {
        guard schema.has(PendingSave.schemaStep) else { return }
        try write { connection in
            try connection.run("""
                INSERT OR REPLACE INTO pending_saves (id, pid, doc_id, name, base_rev, content_type, file) VALUES (?, ?, ?, ?, ?, ?, ?)
                """, .text(save.id), .integer(Int64(save.pid)), .text(save.docID), SQLValue(save.name), SQLValue(save.base?.description),
                SQLValue(save.contentType), .text(save.file))
        }
    }

    /// Forgets a pending save (saved, or dropped) and deletes its bytes.
    public func removePendingSave(_ id: String) {
        guard schema.has(PendingSave.schemaStep) else { return }
        do {
            let file = try read { try $0.query("SELECT file FROM pending_saves WHERE id = ?", .text(id)) { $0.text(0) }.first }
            try write { try $0.run("DELETE FROM pending_saves WHERE id = ?", .text(id)) }
            if let file { unlink(file) }
        } catch {
            // The row stays: the next mount finds the save it records already made (its base
            // revision is no longer current) and keeps it as a conflict at worst, never loses it.
            Logger(label: "sofa.store").error("pending save \(id) was saved but is still recorded: \(error)")
        }
    }

    /// Deletes the bytes of pending saves that no row names any more (a mount stopped between
    /// the two), once older than `Tuning.blobGracePeriod` (a mount may be about to record one).
    /// Returns the bytes freed.
    func removeOrphanedPendingSaveFiles(dryRun: Bool = false) -> Int64 {
        // Unknown which files are recorded: none is removed (a sweep that can wait).
        guard schema.has(PendingSave.schemaStep), let recorded = try? Set(pendingSaves().map(\.file)) else { return 0 }
        let folder = "\(blobs.directory)/tmp"
        let cutoff = Date().timeIntervalSince1970 - Tuning.blobGracePeriod
        var freed: Int64 = 0
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []  // no folder: nothing to sweep
        where name.hasPrefix("pending-") && name.hasSuffix(".keep") && !recorded.contains("\(folder)/\(name)") {
            var info = stat()
            guard stat("\(folder)/\(name)", &info) == 0, Double(info.st_mtim.tv_sec) < cutoff else { continue }
            if dryRun || unlink("\(folder)/\(name)") == 0 { freed += Int64(info.st_blocks) * 512 }
        }
        return freed
    }

    public func pendingSaves() throws -> [PendingSave] {
        guard schema.has(PendingSave.schemaStep) else { return [] }
        return try read { connection in
            try connection.query("SELECT id, pid, doc_id, name, base_rev, content_type, file FROM pending_saves") { row in
                PendingSave(id: row.text(0), pid: pid_t(row.int64(1)), docID: row.text(2), name: row.optionalText(3),
                            base: row.optionalText(4).flatMap(RevisionID.init), contentType: row.optionalText(5), file: row.text(6))
            }
        }
    }
}
