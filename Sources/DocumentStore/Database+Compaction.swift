import DocumentModel
import Foundation

/// Compaction (history bodies, unreferenced blobs, VACUUM), the end of a process's log, and the
/// integrity check.
extension Database {
    /// Removes bodies written for a save that will not happen (a pulled document that did not
    /// fit on the disk), at once rather than at the next compaction: each of `keys` that no
    /// revision or staged file references and whose file was written since `since` (so not one
    /// that was here before). Checked and removed under the write lock, so no save of this
    /// database commits a reference meanwhile.
    public func removeUnreferencedBlobs(_ keys: [BlobKey], writtenSince since: Date) throws {
        guard !keys.isEmpty else { return }
        try write { connection in
            let held = try heldBlobKeys(in: connection)
            for key in Set(keys) {
                let referenced = try held.contains(key.hex) || connection.query(
                    "SELECT EXISTS (SELECT 1 FROM rev_attachments WHERE blob_key = ?)", .text(key.hex)) { $0.bool(0) }[0]
                var info = stat()
                guard !referenced, stat(blobs.path(for: key), &info) == 0,
                      Double(info.st_mtim.tv_sec) + 1 >= since.timeIntervalSince1970 else { continue }
                try blobs.remove(key)
            }
        }
    }

    /// Drops the bodies of non-leaf revisions, prunes history beyond the revs
    /// limit, deletes blobs that no revision references (keeping the metadata of
    /// referenced bodies that are not downloaded), sweeps abandoned temporary
    /// files and partial downloads no revision waits for, and vacuums the SQLite file.
    ///
    /// Blobs modified in the last `Tuning.blobGracePeriod` are kept even when
    /// unreferenced: another process may have just written one for a save that
    /// has not committed yet.
    ///
    /// Unreferenced blobs written in the last `Tuning.blobGracePeriod` are kept, as another
    /// writer may have written one for a save it has not committed yet, unless `alone`: the
    /// caller has no save of its own under way (the command line), and no other process has
    /// the database open (checked here), so every unreferenced blob goes at once. With
    /// `dryRun`, counts what would go and changes nothing (the SQLite file's shrinking is not
    /// known before the VACUUM: `databaseBytesAfter` stays the size before).
    public func compact(alone: Bool = false, dryRun: Bool = false) throws -> CompactionReport {
        var report = CompactionReport()
        report.databaseBytesBefore = databaseFileBytes()
        struct RollBack: Error {}
        do {
            try withOtherProcessesExcluded { noOtherProcess in
                report.sharedWithOtherProcesses = !noOtherProcess
                try write { connection in
                    let limit = try Database.revsLimit(in: connection)
                    let docKeys = try connection.query("SELECT doc_key FROM revs GROUP BY doc_key HAVING COUNT(*) > ?", SQLValue(limit)) { $0.int64(0) }
                    for docKey in docKeys {
                        let tree = try Database.loadTree(docKey: docKey, in: connection)
                        for id in tree.revisionsBeyond(limit: limit) {
                            try Database.deleteRevision(docKey: docKey, revID: id, in: connection)
                            report.revisionsPruned += 1
                        }
                    }
                    try connection.run("""
                        DELETE FROM rev_attachments WHERE EXISTS (SELECT 1 FROM revs r WHERE r.doc_key = rev_attachments.doc_key
                            AND r.rev_id = rev_attachments.rev_id AND r.leaf = 0)
                        """)
                    try connection.run("UPDATE revs SET body = NULL WHERE leaf = 0 AND body IS NOT NULL")
                    report.bodiesDropped = connection.changes
                    // Still under the write lock: no save in this process can reference a blob meanwhile.
                    var referenced = Set(try Database.referencedBlobKeys(in: connection).map(\.hex))
                    // Bodies other parts hold that no revision names yet (a mount's staged files).
                    referenced.formUnion(try heldBlobKeys(in: connection))
                    let cutoff = alone && noOtherProcess ? Double.infinity : Date().timeIntervalSince1970 - Tuning.blobGracePeriod
                    // Compared by file name: an encrypted store's names do not give the key back.
                    let referencedFiles = Set(referenced.compactMap(BlobKey.init(hex:)).map(blobs.fileName(for:)))
                    for blob in try blobs.allBlobs() where !referencedFiles.contains(blob.name) {
                        var info = stat()
                        guard stat("\(blobs.directory)/\(blob.name)", &info) == 0 else { continue }
                        guard Double(info.st_mtim.tv_sec) < cutoff else {
                            report.recentBlobsKept += 1
                            continue
                        }
                        if !dryRun { try blobs.remove(fileNamed: blob.name) }
                        report.blobsDeleted += 1
                        report.blobBytesFreed += blob.size
                    }
                    if dryRun { throw RollBack() }
                    if schema.has(Schema.bodyDigests) {
                        // Aliases of bodies that are gone (deleted above, purged, or never kept).
                        let aliased = try connection.query("SELECT DISTINCT blob_key FROM body_digests") { $0.text(0) }
                        for hex in aliased {
                            guard let key = BlobKey(hex: hex), !blobs.contains(key) else { continue }
                            try connection.run("DELETE FROM body_digests WHERE blob_key = ?", .text(hex))
                        }
                    }
                }
            }
        } catch is RollBack {}
        report.temporaryBytesFreed = blobs.removeAbandonedTemporaryFiles(dryRun: dryRun)
        // Unknown which kept files rows name: none is removed (a sweep that can wait).
        if let named = try? read({ try schema.keptFiles(in: $0) }) {
            report.temporaryBytesFreed += blobs.removeKeptFiles(notIn: named, dryRun: dryRun)
        }
        // Partial downloads stay while some revision still waits for their body.
        let deferred = try read { try $0.query("SELECT DISTINCT digest FROM rev_attachments WHERE blob_key IS NULL") { $0.text(0) } }
        report.temporaryBytesFreed += blobs.removePartialBodies(except: Set(deferred), dryRun: dryRun)
        guard !dryRun else {
            report.databaseBytesAfter = report.databaseBytesBefore
            return report
        }
        // (write() above has already refused a read-only database.)
        try withWriter { writer in
            try writer.execute("VACUUM")
            try writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        }
        report.databaseBytesAfter = databaseFileBytes()
        return report
    }

    /// Moves the write-ahead log into the database file and empties it: for a process that ends
    /// (a mount, a server), which would otherwise leave the log behind it at up to several MB
    /// (a connection closed at exit does this itself; one still open when the process exits
    /// does not). Readers in other processes keep what they read; a log they still need is
    /// left as it is, which costs room, not data.
    public func checkpoint() throws {
        guard !isReadOnly else { return }
        try withWriter { try $0.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    /// Checks the SQLite file (`PRAGMA integrity_check`) and every blob's hash.
    /// Returns the problems found; empty means healthy.
    public func check() throws -> [String] {
        var problems = try read { connection in
            try connection.query("PRAGMA integrity_check") { $0.text(0) }.filter { $0 != "ok" }
        }
        if blobs.isSealed {
            // Names do not give keys back: every body the revisions refer to is read and hashed.
            let keys = try read { try Database.referencedBlobKeys(in: $0) }
            for key in keys where blobs.contains(key) {
                do { try blobs.verify(key) } catch { problems.append("\(error)") }
            }
        } else {
            for blob in try blobs.allBlobs() {
                guard let key = blob.key else { continue }
                do { try blobs.verify(key) } catch { problems.append("\(error)") }
            }
        }
        return problems
    }
}

extension Database {
    /// The bodies other parts hold that no revision names yet (a mount's staged files, in its
    /// rows and its logs: `SchemaStep.blobKeys`, `StepFiles.blobKeys`): compaction keeps them.
    func heldBlobKeys(in connection: SQLiteConnection) throws -> Set<String> {
        try schema.heldBlobKeys(in: connection, folder: path)
    }
}
