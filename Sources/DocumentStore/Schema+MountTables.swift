import DocumentModel
import Foundation

/// The steps of the mount's own tables (their code is in the MountTables module). Declared
/// here because every opener must know them: a `sofa compact` or `sofa encrypt` that never
/// links the mount still keeps the bodies staged rows hold, leaves a pending save's bytes, waits
/// for a stopped mount's work and forgets a purged document's local attributes, through these
/// steps' hooks.
extension Schema {
    /// `pending_saves` (version 4): files a mount was writing when a program fsynced them, not
    /// saved as revisions yet (`PendingSave`, in the MountTables module). `file` is a kept file
    /// (`BlobStore.keptFilePath`) holding their bytes, synced. A mount that stopped before saving
    /// them saves them when the database is mounted again (`pid` was not running).
    package static let pendingSaves = SchemaStep("pending saves", numberedVersion: 4, forgetInCopies: "DELETE FROM pending_saves",
                                               keptFiles: "SELECT file FROM pending_saves",
                                               unfinishedWork: ("SELECT EXISTS (SELECT 1 FROM pending_saves)",
                                                                "saves a stopped mount made durable but did not finish"), sql: """
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

    /// `staged_attachments` (version 6): the rows, by document and name (a file staged again
    /// replaces its row; without the index, finding it scanned every row of the burst). Their
    /// bodies are in the blob store and named by no revision yet: compaction and encryption keep
    /// them (`blobKeys`), and automatic compaction waits for them to stay the same (`activity`).
    package static let stagedAttachments = SchemaStep("staged attachments", numberedVersion: 6,
                                                    blobKeys: "SELECT DISTINCT blob_key FROM staged_attachments",
                                                    activity: "SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM staged_attachments",
                                                    forgetInCopies: "DELETE FROM staged_attachments", sql: """
        CREATE TABLE IF NOT EXISTS staged_attachments (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            pid INTEGER NOT NULL,
            doc_id TEXT NOT NULL,
            name TEXT NOT NULL,
            content_type TEXT NOT NULL,
            length INTEGER NOT NULL,
            blob_key TEXT NOT NULL,
            expected_digest TEXT,
            base_rev TEXT
        );
        CREATE INDEX IF NOT EXISTS staged_attachments_by_name ON staged_attachments (doc_id, name);
        """)

    /// `staging_log_folds`: the records of a mount's staging log (`StagingLog`, in the
    /// MountTables module) already saved in a revision, written in the fold's transaction, so a
    /// log read after a kill gives back only what no revision holds. A log's rows go once the
    /// log is emptied. Its bodies are in the log files (`StagingLogFiles`), not here: the
    /// step's `files` say which bodies they hold (compaction and encryption keep them), change
    /// with them (automatic compaction waits), and that a stopped mount left work in them
    /// (`sofa encrypt` waits for a mount to save it: the records name documents and files in
    /// clear, and the next mount makes them rows).
    package static let stagingLogFolds = SchemaStep("staging log folds", numberedVersion: nil,
                                                    forgetInCopies: "DELETE FROM staging_log_folds",
                                                    files: StepFiles(blobKeys: { try StagingLogFiles.heldBlobKeys(ofDatabaseAt: $0) },
                                                                     activity: { try StagingLogFiles.activity(ofDatabaseAt: $0) },
                                                                     unfinishedWork: ({ try !StagingLogFiles.paths(in: StagingLogFiles.directory(ofDatabaseAt: $0)).isEmpty },
                                                                                      "files a stopped mount wrote and did not save as revisions yet")),
                                                    sql: """
        CREATE TABLE IF NOT EXISTS staging_log_folds (
            log TEXT NOT NULL,
            seq INTEGER NOT NULL,
            PRIMARY KEY (log, seq)
        ) WITHOUT ROWID;
        """)

    /// `local_attributes` (version 7). Versions 4 to 6 kept modification times (seconds, as
    /// REAL) in `attachment_times`; their rows move here, to the nanosecond. A purged
    /// document's rows go with it.
    package static let localAttributes = SchemaStep("local attributes", numberedVersion: 7,
                                                  forgetDocument: "DELETE FROM local_attributes WHERE doc_id = ?") { connection in
        try connection.execute("""
            CREATE TABLE IF NOT EXISTS local_attributes (
                doc_id TEXT NOT NULL,
                name TEXT NOT NULL,
                digest TEXT,
                modified INTEGER,
                accessed INTEGER,
                mode INTEGER,
                PRIMARY KEY (doc_id, name)
            ) WITHOUT ROWID;
            """)
        let found = try connection.query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'attachment_times'") { $0.int(0) }[0]
        guard found > 0 else { return }
        try connection.execute("""
            INSERT OR IGNORE INTO local_attributes (doc_id, name, digest, modified)
                SELECT doc_id, name, digest, CAST(round(modified * 1e9) AS INTEGER) FROM attachment_times;
            DROP TABLE attachment_times;
            """)
    }
}
