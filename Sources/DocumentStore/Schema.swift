import DocumentModel
import Foundation

/// The SQLite schema of `db.sqlite3`: the steps that make it, in order (`SchemaMigrator`). A file
/// made before steps had names says in `PRAGMA user_version` (1–8) which it has; the versions
/// below name the steps that brought each table. The mount's own tables (`pending_saves`,
/// `staged_attachments`, `staging_log_folds`, `local_attributes`) are declared in
/// `Schema+MountTables.swift` (every opener must know them), their code is in `MountTables/`.
///
/// - `meta`: identity (`public_uuid`, `private_uuid`, `previous_private_uuids`),
///   `last_sequence`, `revs_limit`.
/// - `docs`: one row per document: its winning revision, whether that is a
///   tombstone, and the sequence of its latest change.
/// - `revs`: every known revision with its parent; `body` is NULL for history
///   revisions received without a body or compacted away.
/// - `rev_attachments`: attachment metadata per revision; `blob_key` is NULL while
///   only the remote's digest is known.
/// - `local_docs`: `_local` documents, outside the revision machinery.
/// - `body_digests` (version 2): other names a stored body is known by. A body that came
///   gzip-encoded from CouchDB is stored decoded and its attachment's digest describes the
///   decoded bytes; CouchDB's name for it (the MD5 of its gzip form) is kept here, so a
///   later pull that names it so finds it.
/// - `body_events` (version 3): bodies that arrived or went (downloaded, purged, evicted),
///   by digest, so that a mount of the database sees such changes made by other processes
///   (they change no document's sequence). The last thousand are kept.
/// - `rev_attachments_by_digest` (version 3): presence is a matter of the digest, for every
///   revision that references it.
/// - `pending_saves` (version 4), `staged_attachments` (version 6), `local_attributes`
///   (version 7; it took in version 4's `attachment_times`): the mount's, with what they mean
///   in `Schema+MountTables.swift`.
/// - `body_cache` (version 4, `BodyCache.swift`) and `mango_indexes`, `mango_keys` (version 5,
///   `MangoIndexes.swift`).
///
/// - `rev_attachments.position`, `rev_attachments.couch_md5` (version 8): a revision's
///   attachments in their order (CouchDB keeps the order it was given them in, and derives
///   revision ids from it; NULL in rows from before: by name) and the MD5 CouchDB keeps for
///   each body (NULL: not worked out yet), which revision ids are derived from (see
///   `RevisionID.derive`, `CouchAttachmentMD5`).
///
/// - `schema_steps`: the names of the steps the file has had (`SchemaMigrator`).
///
/// Older databases are upgraded when opened for writing (new tables and an index).
package enum Schema {
    /// Every step, in the order a file gets them. Released steps keep their names and places.
    static let steps: [SchemaStep] = [
        documentsAndRevisions, bodyDigests, bodyEvents, Schema.pendingSaves, CachedBody.schemaStep,
        MangoIndex.schemaStep, Schema.stagedAttachments, Schema.localAttributes, attachmentOrder,
        Schema.stagingLogFolds,
    ]

    static let documentsAndRevisions = SchemaStep("documents and revisions", numberedVersion: 1, sql: """
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS docs (
            doc_key INTEGER PRIMARY KEY,
            doc_id TEXT NOT NULL UNIQUE,
            current_rev TEXT NOT NULL,
            deleted INTEGER NOT NULL,
            sequence INTEGER UNIQUE
        );
        CREATE TABLE IF NOT EXISTS revs (
            doc_key INTEGER NOT NULL,
            rev_id TEXT NOT NULL,
            parent_id TEXT,
            generation INTEGER NOT NULL,
            deleted INTEGER NOT NULL,
            leaf INTEGER NOT NULL,
            body TEXT,
            sequence INTEGER NOT NULL,
            saved_at REAL NOT NULL,
            PRIMARY KEY (doc_key, rev_id)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS rev_attachments (
            doc_key INTEGER NOT NULL,
            rev_id TEXT NOT NULL,
            name TEXT NOT NULL,
            content_type TEXT NOT NULL,
            length INTEGER NOT NULL,
            digest TEXT NOT NULL,
            blob_key TEXT,
            revpos INTEGER NOT NULL,
            PRIMARY KEY (doc_key, rev_id, name)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS rev_attachments_by_blob ON rev_attachments (blob_key);
        CREATE TABLE IF NOT EXISTS local_docs (doc_id TEXT PRIMARY KEY, rev TEXT NOT NULL, body TEXT NOT NULL) WITHOUT ROWID;
        """)

    static let bodyDigests = SchemaStep("body digests", numberedVersion: 2, sql: """
        CREATE TABLE IF NOT EXISTS body_digests (digest TEXT PRIMARY KEY, blob_key TEXT NOT NULL) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS body_digests_by_blob ON body_digests (blob_key);
        """)

    static let bodyEvents = SchemaStep("body events", numberedVersion: 3, sql: """
        CREATE TABLE IF NOT EXISTS body_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, digest TEXT NOT NULL);
        CREATE INDEX IF NOT EXISTS rev_attachments_by_digest ON rev_attachments (digest);
        """)

    /// Version 8's columns, added to an older `rev_attachments`.
    static let attachmentOrder = SchemaStep("attachment order and MD5", numberedVersion: 8) { connection in
        let columns = try connection.query("PRAGMA table_info(rev_attachments)") { $0.text(1) }
        if !columns.contains("position") { try connection.execute("ALTER TABLE rev_attachments ADD COLUMN position INTEGER") }
        if !columns.contains("couch_md5") { try connection.execute("ALTER TABLE rev_attachments ADD COLUMN couch_md5 BLOB") }
    }

    /// A new file: every step, its identity and settings, in one transaction.
    static func create(_ connection: SQLiteConnection, revsLimit: Int) throws {
        try configure(connection)
        _ = try SchemaMigrator.migrate(connection, path: "", readOnly: false, creating: true) {
            try connection.run("INSERT INTO meta (key, value) VALUES ('public_uuid', ?), ('private_uuid', ?), " +
                               "('previous_private_uuids', '[]'), ('last_sequence', 0), ('revs_limit', ?), ('instance_start_time', ?)",
                               .text(newUUID()), .text(newUUID()), SQLValue(revsLimit), .integer(Int64(Date().timeIntervalSince1970)))
        }
    }

    /// Checks that an existing file is a Sofa database this Sofa can open, brings a writable
    /// one up to every step, and configures the connection.
    static func check(_ connection: SQLiteConnection, path: String, readOnly: Bool) throws -> SchemaMigrator.Outcome {
        if !readOnly { try configure(connection) }
        return try SchemaMigrator.migrate(connection, path: path, readOnly: readOnly)
    }

    /// WAL so readers never block the writer; synchronous=NORMAL is durable against
    /// a killed process (a power cut may lose the last commits, never corrupt).
    static func configure(_ connection: SQLiteConnection) throws {
        try connection.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = OFF")
    }

    /// A random UUID as 32 lowercase hex digits, the form CouchDB uses.
    static func newUUID() -> String {
        UUID().uuidString.replacingOccurrences(of: "-", with: "").lowercased()
    }
}
