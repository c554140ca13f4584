import DocumentModel
import Foundation

/// The SQLite schema of `db.sqlite3`, version 8.
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
/// - `attachment_times` (version 4 to 6): modification times given to attachments; version 7
///   moved them into `local_attributes` (to the nanosecond).
/// - `pending_saves` (version 4): files a mount was writing when they were fsynced, not yet
///   saved as revisions (`file` holds their bytes, synced): a mount that stopped before
///   saving them saves them when the database is mounted again (`pid` was not running).
/// - `body_cache` (version 4): what the cache of fetched bodies knows per body digest: when
///   it was last read, whether it was fetched from the remote (`fetched`: it can be fetched
///   again, so it may be evicted) and whether it is pinned (kept here). The limit is the
///   `cache_limit` row of `meta` (no row: no limit).
///
/// - `mango_indexes`, `mango_keys` (version 5): Mango JSON indexes, as their query design
///   documents define them, and their entries: key, document id and the indexed values (a JSON
///   array), which let a query skip documents without reading them (see `MangoIndexes.swift`).
///
/// - `staged_attachments` (version 6): attachment bodies a mount has saved into a document
///   that are not part of a revision yet (a burst of files: `cp -r`, `tar x`, `rsync`). The
///   body is in the blob store; `expected_digest` is the digest the name had where the writer
///   started (NULL: absent). The mount folds them into one revision when the document has
///   been quiet for a moment; a mount that stopped leaves them to its successor (`pid`). See
///   `Staging.swift`. Indexed by document and name: a file staged again replaces its row, and
///   without the index finding it scanned every row of the burst (quadratic in the burst).
///
/// - `local_attributes` (version 7): what a mount keeps about a file or folder of a document
///   that revisions do not hold: times given to it (`touch -d`, `cp -a`, `rsync -a`; in
///   nanoseconds), for the body it had then (`digest`), and its permission bits (`chmod +x`).
///   A folder's row is named with a `/` at its end (`/` alone: `attachments/`). Local, never
///   replicated. See `LocalAttributes.swift`.
///
/// - `rev_attachments.position`, `rev_attachments.couch_md5` (version 8): a revision's
///   attachments in their order (CouchDB keeps the order it was given them in, and derives
///   revision ids from it; NULL in rows from before: by name) and the MD5 CouchDB keeps for
///   each body (NULL: not worked out yet), which revision ids are derived from (see
///   `RevisionID.derive`, `CouchAttachmentMD5`).
///
/// Older databases are upgraded when opened for writing (new tables and an index).
enum Schema {
    static let version = 8

    /// Version 8's columns, added to an older `rev_attachments`.
    static func addAttachmentOrderColumns(_ connection: SQLiteConnection) throws {
        let columns = try connection.query("PRAGMA table_info(rev_attachments)") { $0.text(1) }
        if !columns.contains("position") { try connection.execute("ALTER TABLE rev_attachments ADD COLUMN position INTEGER") }
        if !columns.contains("couch_md5") { try connection.execute("ALTER TABLE rev_attachments ADD COLUMN couch_md5 BLOB") }
    }

    static let bodyDigestsTable = """
        CREATE TABLE IF NOT EXISTS body_digests (digest TEXT PRIMARY KEY, blob_key TEXT NOT NULL) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS body_digests_by_blob ON body_digests (blob_key);
        """

    static let version3Tables = """
        CREATE TABLE IF NOT EXISTS body_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, digest TEXT NOT NULL);
        CREATE INDEX IF NOT EXISTS rev_attachments_by_digest ON rev_attachments (digest);
        """

    static let version4Tables = """
        CREATE TABLE IF NOT EXISTS pending_saves (
            id TEXT PRIMARY KEY,
            pid INTEGER NOT NULL,
            doc_id TEXT NOT NULL,
            name TEXT,
            base_rev TEXT,
            content_type TEXT,
            file TEXT NOT NULL
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS body_cache (
            digest TEXT PRIMARY KEY,
            last_read REAL NOT NULL DEFAULT 0,
            fetched INTEGER NOT NULL DEFAULT 0,
            pinned INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;
        """

    static let version5Tables = """
        CREATE TABLE IF NOT EXISTS mango_indexes (
            index_id INTEGER PRIMARY KEY,
            ddoc TEXT NOT NULL,
            name TEXT NOT NULL,
            definition TEXT NOT NULL,
            UNIQUE (ddoc, name)
        );
        CREATE TABLE IF NOT EXISTS mango_keys (
            index_id INTEGER NOT NULL,
            key BLOB NOT NULL,
            doc_id TEXT NOT NULL,
            field_values TEXT NOT NULL,
            PRIMARY KEY (index_id, key, doc_id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS mango_keys_by_doc ON mango_keys (doc_id);
        """

    static let version6Tables = """
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
        """

    static let version7Tables = """
        CREATE TABLE IF NOT EXISTS local_attributes (
            doc_id TEXT NOT NULL,
            name TEXT NOT NULL,
            digest TEXT,
            modified INTEGER,
            accessed INTEGER,
            mode INTEGER,
            PRIMARY KEY (doc_id, name)
        ) WITHOUT ROWID;
        """

    /// Version 4 to 6 kept modification times (seconds, as REAL) in `attachment_times`.
    static func moveAttachmentTimes(_ connection: SQLiteConnection) throws {
        let found = try connection.query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'attachment_times'") { $0.int(0) }[0]
        guard found > 0 else { return }
        try connection.execute("""
            INSERT OR IGNORE INTO local_attributes (doc_id, name, digest, modified)
                SELECT doc_id, name, digest, CAST(round(modified * 1e9) AS INTEGER) FROM attachment_times;
            DROP TABLE attachment_times;
            """)
    }

    static func create(_ connection: SQLiteConnection, revsLimit: Int) throws {
        try configure(connection)
        try connection.execute("BEGIN IMMEDIATE")
        do {
            try connection.execute("""
                CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL) WITHOUT ROWID;
                CREATE TABLE docs (
                    doc_key INTEGER PRIMARY KEY,
                    doc_id TEXT NOT NULL UNIQUE,
                    current_rev TEXT NOT NULL,
                    deleted INTEGER NOT NULL,
                    sequence INTEGER UNIQUE
                );
                CREATE TABLE revs (
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
                CREATE TABLE rev_attachments (
                    doc_key INTEGER NOT NULL,
                    rev_id TEXT NOT NULL,
                    name TEXT NOT NULL,
                    content_type TEXT NOT NULL,
                    length INTEGER NOT NULL,
                    digest TEXT NOT NULL,
                    blob_key TEXT,
                    revpos INTEGER NOT NULL,
                    position INTEGER,
                    couch_md5 BLOB,
                    PRIMARY KEY (doc_key, rev_id, name)
                ) WITHOUT ROWID;
                CREATE INDEX rev_attachments_by_blob ON rev_attachments (blob_key);
                CREATE TABLE local_docs (doc_id TEXT PRIMARY KEY, rev TEXT NOT NULL, body TEXT NOT NULL) WITHOUT ROWID;
                """ + bodyDigestsTable + version3Tables + version4Tables + version5Tables + version6Tables + version7Tables)
            try connection.run("INSERT INTO meta (key, value) VALUES ('public_uuid', ?), ('private_uuid', ?), " +
                               "('previous_private_uuids', '[]'), ('last_sequence', 0), ('revs_limit', ?), ('instance_start_time', ?)",
                               .text(newUUID()), .text(newUUID()), SQLValue(revsLimit), .integer(Int64(Date().timeIntervalSince1970)))
            try connection.execute("PRAGMA user_version = \(version)")
            try connection.execute("COMMIT")
        } catch {
            try? connection.execute("ROLLBACK")  // the error thrown below is the one that matters
            throw error
        }
    }

    /// Checks that an existing file is a Sofa database of this version or an older one it
    /// upgrades, and configures the connection. Returns the version the file had when opened
    /// (a read-only version 1 file stays at 1; a writable one is now at `version`).
    @discardableResult
    static func check(_ connection: SQLiteConnection, path: String, readOnly: Bool) throws -> Int {
        let userVersion = try connection.query("PRAGMA user_version") { $0.int(0) }[0]
        guard (1...version).contains(userVersion) else {
            throw SofaError.notADatabase(path: path, reason: userVersion == 0
                ? "\(Database.databaseFileName) holds no Sofa schema"
                : "schema version \(userVersion) is not supported (expected \(version))")
        }
        if readOnly { return userVersion }
        try configure(connection)
        if userVersion == version {
            // Tables added to this version after it was first made.
            try connection.execute(version4Tables + version5Tables + version6Tables + version7Tables)
        }
        if userVersion < version {
            try connection.execute("BEGIN IMMEDIATE")
            do {
                try connection.execute(bodyDigestsTable + version3Tables + version4Tables + version5Tables + version6Tables +
                                       version7Tables)
                try moveAttachmentTimes(connection)
                try addAttachmentOrderColumns(connection)
                try connection.execute("PRAGMA user_version = \(version)")
                try connection.execute("COMMIT")
            } catch {
                try? connection.execute("ROLLBACK")  // the error thrown below is the one that matters
                throw error
            }
        }
        return userVersion
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
