import DocumentModel
import DocumentStore
import Foundation
import Logging

/// A file a mount was writing, made durable by an fsync before it was saved as a revision: a
/// row of `pending_saves` (`Schema.pendingSaves`) naming a kept file of the blob store
/// (`BlobStore.keptFilePath`) that holds its bytes, synced. The mount that wrote it drops it once
/// its close has saved it; a mount finding one whose process is gone saves it.
///
/// ```swift
/// let keep = db.blobs.keptFilePath(id)
/// try db.blobs.writeKeptFile(bytes, to: keep)
/// try db.recordPendingSave(PendingSave(id: id, pid: getpid(), docID: "doc", name: nil, base: rev,
///                                      contentType: nil, file: keep))
/// // … the close saves the revision …
/// db.removePendingSave(id)
/// ```
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

extension Database {
    /// Records a pending save whose kept file is written and synced (a read-only database, or
    /// one from before the table, records nothing: its mount cannot write).
    public func recordPendingSave(_ save: PendingSave) throws {
        guard schema.has(Schema.pendingSaves) else { return }
        try write { connection in
            try connection.run("""
                INSERT OR REPLACE INTO pending_saves (id, pid, doc_id, name, base_rev, content_type, file) VALUES (?, ?, ?, ?, ?, ?, ?)
                """, .text(save.id), .integer(Int64(save.pid)), .text(save.docID), SQLValue(save.name), SQLValue(save.base?.description),
                SQLValue(save.contentType), .text(save.file))
        }
    }

    /// Forgets a pending save (saved, or dropped) and deletes its bytes.
    public func removePendingSave(_ id: String) {
        guard schema.has(Schema.pendingSaves) else { return }
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

    /// Every pending save recorded, of every mount (the caller tells a stopped one by its `pid`).
    public func pendingSaves() throws -> [PendingSave] {
        guard schema.has(Schema.pendingSaves) else { return [] }
        return try read { connection in
            try connection.query("SELECT id, pid, doc_id, name, base_rev, content_type, file FROM pending_saves") { row in
                PendingSave(id: row.text(0), pid: pid_t(row.int64(1)), docID: row.text(2), name: row.optionalText(3),
                            base: row.optionalText(4).flatMap(RevisionID.init), contentType: row.optionalText(5), file: row.text(6))
            }
        }
    }
}
