import DocumentModel
import Foundation

/// A Sofa database: the directory `NAME.sofa/` with `db.sqlite3` (WAL mode) and
/// the blob store `attachments/`.
///
/// Documents follow CouchDB's revision semantics (see `RevisionTree`). The
/// database is safe to use from many threads and from several processes at once:
/// every save runs in an `IMMEDIATE` transaction that re-reads the document, so a
/// save from a revision that is no longer current fails with
/// `SofaError.conflict` instead of overwriting it, and readers see committed
/// snapshots only.
///
/// ```swift
/// let db = try Database.create(at: "/tmp/notes.sofa")
/// var draft = try db.newRevision(of: "hello")
/// draft.properties["text"] = "Hello, world"
/// let rev = try db.save(draft)
/// let current = try db.document(withID: "hello")   // == rev
/// ```
public final class Database: @unchecked Sendable {
    // Sendable invariant: `writer` is only used under `writeLock`; reader
    // connections are only used by the thread that checked them out of `idleReaders`.

    public let path: String
    public let blobs: BlobStore
    public let publicUUID: String
    public let privateUUID: String
    /// True when the database sits on a read-only file system: it is opened
    /// immutable, reads work, and every write fails with `readOnlyFileSystem`.
    public let isReadOnly: Bool
    /// Whether the file has `body_digests` (a version 1 database opened read-only has not).
    let hasBodyDigests: Bool
    /// Whether the file has `body_events` (version 3).
    let hasBodyEvents: Bool
    /// Whether the file has `body_cache` (version 4).
    let hasBodyCache: Bool
    /// Whether the file has `mango_indexes` and `mango_keys` (version 5).
    let hasMangoIndexes: Bool
    /// Whether the file has `staged_attachments` (version 6).
    let hasStaging: Bool
    /// Whether the file has `local_attributes` (version 7; older ones opened read-only keep
    /// `attachment_times`).
    let hasLocalAttributes: Bool
    /// Every commit, this process's and others' (see `ChangeStream`).
    public let changeStream = ChangeStream()
    /// The design documents' `validate_doc_update` functions, read again when one changes.
    let validators = Validators()
    /// Reads of bodies not recorded yet (`noteRead`). Guarded by `readNotesLock`.
    var readNotes = ReadNotes()
    let readNotesLock = Lock()

    /// The one connection that writes. Guarded by `writeLock`.
    private let writer: SQLiteConnection
    /// Serialises this process's writes. Lock order: 1 (taken before `readersLock`).
    private let writeLock = Lock()
    /// The writer's `PRAGMA data_version` when last asked (`otherConnectionCommitted`). Guarded by `writeLock`.
    private var lastDataVersion: Int64?
    /// Connections ready for reading. Guarded by `readersLock`.
    private var idleReaders: [SQLiteConnection] = []
    /// Guards `idleReaders`. Lock order: 2 (a leaf: nothing is locked while it is held).
    private let readersLock = Lock()

    /// Every process that opens the database writable holds a shared `flock` on this file
    /// (not on the SQLite file: closing any descriptor of that would drop SQLite's own
    /// locks), so compaction can tell whether it is alone. -1 when read-only.
    private let openLock: Int32
    static let openLockFileName = "open.lock"

    static let databaseFileName = "db.sqlite3"
    static let attachmentsDirectoryName = "attachments"

    public var databaseFilePath: String { "\(path)/\(Database.databaseFileName)" }

    private init(path: String, writer: SQLiteConnection, readOnly: Bool = false, schemaVersion: Int = Schema.version) throws {
        self.path = path
        self.writer = writer
        self.isReadOnly = readOnly
        self.hasBodyDigests = schemaVersion >= 2
        self.hasBodyEvents = schemaVersion >= 3
        self.hasBodyCache = schemaVersion >= 4
        self.hasMangoIndexes = schemaVersion >= 5
        self.hasStaging = schemaVersion >= 6
        self.hasLocalAttributes = schemaVersion >= 7
        self.blobs = BlobStore(directory: "\(path)/\(Database.attachmentsDirectoryName)")
        let meta = try writer.query("SELECT key, value FROM meta WHERE key IN ('public_uuid', 'private_uuid')") { row in
            (row.text(0), row.text(1))
        }
        let values = Dictionary(meta, uniquingKeysWith: { $1 })
        guard let publicUUID = values["public_uuid"], let privateUUID = values["private_uuid"] else {
            throw SofaError.notADatabase(path: path, reason: "its identity is missing")
        }
        self.publicUUID = publicUUID
        self.privateUUID = privateUUID
        var lock: Int32 = -1
        if !readOnly {
            lock = Glibc.open("\(path)/\(Database.openLockFileName)", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
            if lock >= 0 { flock(lock, LOCK_SH) }
        }
        openLock = lock
        changeStream.foreignWatch = { [weak self] in self?.watchForeignCommits() }
    }

    deinit {
        changeStream.close()
        if openLock >= 0 { Glibc.close(openLock) }
    }

    /// Starts finding other processes' commits for `changeStream` (none on a read-only file:
    /// it is opened immutable, as nothing changes it).
    private func watchForeignCommits() -> ForeignCommits? {
        guard !isReadOnly else { return nil }
        _ = otherConnectionCommitted()
        let name = Database.databaseFileName
        return ForeignCommits(directory: path, names: [name, "\(name)-wal"],
                              changed: { [weak self] in self?.otherConnectionCommitted() ?? false },
                              publish: { [weak self] in self?.changeStream.publish() })
    }

    /// Whether another connection (another process, or another `Database` on this file)
    /// committed since the last call: the writer's `data_version` changes only then.
    private func otherConnectionCommitted() -> Bool {
        writeLock.withLock {
            // A failed read says nothing: count it as a change (a waiter looks, and finds out).
            guard let version = try? writer.query("PRAGMA data_version", row: { $0.int64(0) }).first else { return true }
            defer { lastDataVersion = version }
            return lastDataVersion.map { $0 != version } ?? false
        }
    }

    /// Runs `body` with whether no other process has the database open: if none has, none
    /// can open it until `body` returns (they wait for the lock).
    func withOtherProcessesExcluded<T>(_ body: (_ alone: Bool) throws -> T) rethrows -> T {
        guard openLock >= 0, flock(openLock, LOCK_EX | LOCK_NB) == 0 else { return try body(false) }
        defer { flock(openLock, LOCK_SH) }
        return try body(true)
    }

    /// Creates a new, empty database directory at `path`.
    public static func create(at path: String, revsLimit: Int = Tuning.defaultRevsLimit) throws -> Database {
        let path = normalize(path)
        guard mkdir(path, 0o755) == 0 else {
            throw errno == EEXIST ? SofaError.databaseExists(path: path) : SofaError.system("create directory", path: path, errno: errno)
        }
        do {
            try BlobStore(directory: "\(path)/\(attachmentsDirectoryName)").createDirectories()
            let connection = try SQLiteConnection(path: "\(path)/\(databaseFileName)", create: true)
            try Schema.create(connection, revsLimit: revsLimit)
            return try Database(path: path, writer: connection)
        } catch {
            // Leave nothing half-made.
            try? FileManager.default.removeItem(atPath: path)
            throw error
        }
    }

    /// Opens an existing database directory.
    public static func open(at path: String) throws -> Database {
        let path = normalize(path)
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw SofaError.notADatabase(path: path, reason: errno == ENOENT ? "no such file or directory" : String(cString: strerror(errno)))
        }
        guard info.st_mode & S_IFMT == S_IFDIR else { throw SofaError.notADatabase(path: path, reason: "it is not a directory") }
        let file = "\(path)/\(databaseFileName)"
        guard access(file, F_OK) == 0 else { throw SofaError.notADatabase(path: path, reason: "it has no \(databaseFileName)") }
        var fileSystem = statvfs()
        var wal = stat()
        // Immutable mode ignores the WAL, so it is only safe when all commits are in the main file.
        let readOnly = statvfs(path, &fileSystem) == 0 && fileSystem.f_flag & UInt(ST_RDONLY) != 0
            && (stat(file + "-wal", &wal) != 0 || wal.st_size == 0)
        let connection = try SQLiteConnection(path: file, create: false, immutable: readOnly)
        let found = try Schema.check(connection, path: path, readOnly: readOnly)
        let database = try Database(path: path, writer: connection, readOnly: readOnly,
                                    schemaVersion: readOnly ? found : Schema.version)
        if !readOnly {
            try database.blobs.createDirectories()
            // What killed writers left (an attach, import or pull cut short) goes on the next open.
            _ = database.blobs.removeAbandonedTemporaryFiles()
        }
        if !readOnly && found == 1 { try database.upgradeDigestsFromVersion1() }
        if !readOnly && found < 5 { try database.buildMangoIndexesFromDesignDocuments() }
        return database
    }

    static func normalize(_ path: String) -> String {
        var path = path
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        return path
    }

    // MARK: - Transactions

    /// Runs `body` in a read transaction on a pooled connection: one consistent snapshot.
    func read<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        let connection = try readersLock.withLock { idleReaders.popLast() }
            ?? SQLiteConnection(path: databaseFilePath, create: false, immutable: isReadOnly)
        defer { readersLock.withLock { idleReaders.append(connection) } }
        try connection.execute("BEGIN")
        defer { try? connection.execute("COMMIT") }
        return try body(connection)
    }

    /// Runs `body` in an IMMEDIATE write transaction; rolls back if it throws. Each commit
    /// is published on `changeStream`.
    func write<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        guard !isReadOnly else { throw SofaError.readOnlyFileSystem(path: databaseFilePath) }
        let result = try writeLock.withLock {
            try writer.execute("BEGIN IMMEDIATE")
            do {
                let result = try body(writer)
                try writer.execute("COMMIT")
                return result
            } catch {
                try? writer.execute("ROLLBACK")
                throw error
            }
        }
        changeStream.publish()
        return result
    }

    /// Saves many revisions in one transaction: all or none are saved.
    ///
    /// ```swift
    /// try db.inBatch { batch in
    ///     for draft in drafts { try batch.save(draft) }
    /// }
    /// ```
    public func inBatch<T>(_ body: (Batch) throws -> T) throws -> T {
        try write { connection in try body(Batch(database: self, connection: connection)) }
    }

    /// Write operations inside `inBatch`.
    public struct Batch {
        let database: Database
        let connection: SQLiteConnection

        @discardableResult
        public func save(_ draft: RevisionDraft, allowConflict: Bool = false) throws -> Revision {
            try database.save(draft, allowConflict: allowConflict, in: connection)
        }

        @discardableResult
        public func insert(_ revision: ReplicatedRevision) throws -> Bool {
            try database.insert(revision, in: connection)
        }
    }

    // MARK: - Reading documents

    /// The current revision of a live document; nil if it does not exist or is deleted.
    public func document(withID id: String) throws -> Revision? {
        guard let revision = try currentRevision(of: id), !revision.deleted else { return nil }
        return revision
    }

    /// The current revision, which may be a tombstone; nil if the document never existed.
    public func currentRevision(of id: String) throws -> Revision? {
        try read { connection in
            guard let row = try Database.documentRow(id, in: connection) else { return nil }
            return try loadRevision(docKey: row.key, docID: id, revID: row.current, in: connection)
        }
    }

    /// A specific revision. Throws `revisionNotFound` if unknown or compacted away.
    public func revision(_ revID: RevisionID, of id: String) throws -> Revision {
        try read { connection in
            guard let row = try Database.documentRow(id, in: connection) else { throw SofaError.documentNotFound(id) }
            guard let revision = try loadRevision(docKey: row.key, docID: id, revID: revID, in: connection) else {
                throw SofaError.revisionNotFound(docID: id, revID: revID.description)
            }
            return revision
        }
    }

    /// The document's revision tree.
    public func revisionTree(of id: String) throws -> RevisionTree {
        try read { connection in
            guard let row = try Database.documentRow(id, in: connection) else { throw SofaError.documentNotFound(id) }
            return try Database.loadTree(docKey: row.key, in: connection)
        }
    }

    /// Live documents in id order, `limit` at a time after `afterID`, so that huge
    /// databases can be listed page by page.
    /// With `including`, the listing starts at `afterID` itself when it exists.
    /// With `countingConflicts`, each summary's `conflictCount` too (a look at the document's leaves).
    public func documents(after afterID: String? = nil, including: Bool = false, offset: Int = 0, limit: Int = Int.max,
                          includeDeleted: Bool = false, countingConflicts: Bool = false) throws -> [DocumentSummary] {
        // The bound stands alone (`doc_id >= ?`): inside an OR it made SQLite scan the index
        // from its start for every page (listing 100,000 documents took 2.2 s instead of 0.3 s).
        try read { connection in
            try connection.query("""
                SELECT d.doc_id, d.current_rev, d.deleted, d.sequence,
                       (SELECT COUNT(*) FROM rev_attachments a WHERE a.doc_key = d.doc_key AND a.rev_id = d.current_rev),
                       r.saved_at,
                       CASE WHEN ? THEN (SELECT COUNT(*) FROM revs c WHERE c.doc_key = d.doc_key AND c.leaf = 1
                                         AND c.deleted = 0 AND c.rev_id != d.current_rev) ELSE 0 END
                FROM docs d JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev
                WHERE d.doc_id >= ? AND (d.doc_id > ? OR ?) AND (? OR d.deleted = 0)
                ORDER BY d.doc_id LIMIT ? OFFSET ?
                """, SQLValue(countingConflicts), .text(afterID ?? ""), .text(afterID ?? ""), SQLValue(including), SQLValue(includeDeleted),
                SQLValue(min(limit, Int(Int64.max))), SQLValue(offset)
            ) { row in
                var summary = DocumentSummary(docID: row.text(0), revID: try Database.revisionID(row.text(1)), deleted: row.bool(2),
                                              sequence: row.int64(3), attachmentCount: row.int(4),
                                              modified: Date(timeIntervalSince1970: row.double(5)))
                summary.conflictCount = row.int(6)
                return summary
            }
        }
    }

    /// Live documents in the order they were first stored, from the one after `key`: a
    /// position that holds while documents come and go (the mount lists /docs this way).
    public func documentsInStorageOrder(afterKey key: Int64, limit: Int) throws -> [StoredDocument] {
        try read { connection in
            try connection.query("""
                SELECT d.doc_key, d.doc_id, r.saved_at
                FROM docs d JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev
                WHERE d.doc_key > ? AND d.deleted = 0 ORDER BY d.doc_key LIMIT ?
                """, .integer(key), SQLValue(limit)
            ) { row in
                StoredDocument(key: row.int64(0), docID: row.text(1), modified: Date(timeIntervalSince1970: row.double(2)))
            }
        }
    }

    /// The documents changed after `sequence`, each once at its latest change, oldest first.
    public func changes(since sequence: Int64 = 0, limit: Int = Int.max) throws -> [Change] {
        try read { connection in
            try connection.query("""
                SELECT doc_id, current_rev, deleted, sequence FROM docs WHERE sequence > ? ORDER BY sequence LIMIT ?
                """, .integer(sequence), SQLValue(min(limit, Int(Int64.max)))
            ) { row in
                Change(docID: row.text(0), revID: try Database.revisionID(row.text(1)), deleted: row.bool(2), sequence: row.int64(3))
            }
        }
    }

    /// Live and deleted document counts and the last sequence, from one snapshot
    /// (cheaper than `info()`, which also sizes the blob store).
    public func counts() throws -> (documents: Int, deleted: Int, lastSequence: Int64) {
        try read { connection in
            let counts = try connection.query("SELECT COALESCE(SUM(deleted = 0), 0), COALESCE(SUM(deleted), 0) FROM docs") { ($0.int(0), $0.int(1)) }[0]
            return (counts.0, counts.1, try Database.lastSequence(in: connection))
        }
    }

    /// How many documents changed after `sequence`.
    public func changeCount(since sequence: Int64) throws -> Int {
        try read { connection in
            try connection.query("SELECT COUNT(*) FROM docs WHERE sequence > ?", .integer(sequence)) { $0.int(0) }[0]
        }
    }

    public var lastSequence: Int64 {
        get throws { try read { try Database.lastSequence(in: $0) } }
    }

    // MARK: - Attachment bodies

    /// Opens an attachment's body for streaming; the reader checks the hash at the end.
    public func openContent(of attachment: Attachment, docID: String) throws -> BlobReader {
        guard let key = attachment.blobKey, blobs.contains(key) else {
            throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
        }
        return try blobs.openReader(key, expectedLength: attachment.length)
    }

    /// The path of an attachment's body file (read-only; never write to it), or nil if not here.
    public func contentPath(of attachment: Attachment) -> String? {
        guard let key = attachment.blobKey, blobs.contains(key) else { return nil }
        return blobs.path(for: key)
    }

    /// Records that the body known by `digest`, fetched from the remote, is now in the blob
    /// store, for every revision that refers to it without a body (the cache may evict it). Returns how many attachments gained it.
    /// With `storedDigest` (the digest of the bytes as stored, when `digest` named an
    /// encoded form), those attachments take that digest and `digest` stays known as an
    /// alias of the body (`body_digests`).
    @discardableResult
    public func attachBody(digest: String, blob: StoredBlob, storedDigest: String? = nil) throws -> Int {
        try write { connection in
            try connection.run("UPDATE rev_attachments SET blob_key = ?, digest = ? WHERE digest = ? AND length = ? AND (blob_key IS NULL OR blob_key != ?)",
                               .text(blob.key.hex), .text(storedDigest ?? digest), .text(digest), .integer(blob.length), .text(blob.key.hex))
            let changed = Int(connection.changes)
            if let storedDigest, storedDigest != digest { try recordAlias(digest, of: blob.key, in: connection) }
            try noteFetched(storedDigest ?? digest, renaming: digest, in: connection)
            try recordBodyEvent(Set([digest, storedDigest ?? digest]), in: connection)
            return changed
        }
    }

    /// Notes that the bodies named `digests` arrived or went, for mounts in other processes.
    func recordBodyEvent(_ digests: Set<String>, in connection: SQLiteConnection) throws {
        guard hasBodyEvents else { return }
        for digest in digests.sorted() {
            try connection.run("INSERT INTO body_events (digest) VALUES (?)", .text(digest))
        }
        try connection.run("DELETE FROM body_events WHERE seq <= last_insert_rowid() - 1000")
    }

    /// The latest body event (0 for none).
    public func lastBodyEvent() throws -> Int64 {
        guard hasBodyEvents else { return 0 }
        return try read { try $0.query("SELECT COALESCE(MAX(seq), 0) FROM body_events") { $0.int64(0) }[0] }
    }

    /// Documents whose attachments (in any revision) use a body that arrived or went after
    /// event `seq`, and the latest event.
    public func documentsWithBodyEvents(after seq: Int64) throws -> (docIDs: [String], last: Int64) {
        guard hasBodyEvents else { return ([], seq) }
        return try read { connection in
            let events = try connection.query("SELECT seq, digest FROM body_events WHERE seq > ? ORDER BY seq", .integer(seq)) {
                ($0.int64(0), $0.text(1))
            }
            guard let last = events.last?.0 else { return ([], seq) }
            var ids = Set<String>()
            for digest in Set(events.map(\.1)) {
                ids.formUnion(try connection.query(
                    "SELECT DISTINCT d.doc_id FROM rev_attachments a JOIN docs d ON d.doc_key = a.doc_key WHERE a.digest = ?",
                    .text(digest)) { $0.text(0) })
            }
            return (ids.sorted(), last)
        }
    }

    /// Remembers that the body `key` is also known as `digest` (an encoded form's digest).
    public func recordAlias(_ digest: String, of key: BlobKey) throws {
        try write { try recordAlias(digest, of: key, in: $0) }
    }

    func recordAlias(_ digest: String, of key: BlobKey, in connection: SQLiteConnection) throws {
        guard hasBodyDigests, digest != key.digestString else { return }
        try connection.run("INSERT OR REPLACE INTO body_digests (digest, blob_key) VALUES (?, ?)", .text(digest), .text(key.hex))
    }

    /// Turns a local body back into a deferred one: every revision that refers to the body
    /// under `digest` keeps its metadata and loses the body, which is deleted if nothing else
    /// uses it. Attachments that took the body's own digest when it arrived encoded (a gzip
    /// body from CouchDB, `body_digests`) get back the name the remote knows it by, so that it
    /// can be fetched again. Returns the bytes freed.
    @discardableResult
    public func purgeBody(digest: String) throws -> Int64 {
        try purgeBody(digest: digest, if: { _ in true }) ?? 0
    }

    /// `purgeBody`, if `allowed` (asked in the same transaction) says so; nil when it did not.
    func purgeBody(digest: String, if allowed: (SQLiteConnection) throws -> Bool) throws -> Int64? {
        let keys = try write { connection -> [String]? in
            guard try allowed(connection) else { return nil }
            let keys = try connection.query("SELECT DISTINCT blob_key FROM rev_attachments WHERE digest = ? AND blob_key IS NOT NULL",
                                            .text(digest)) { $0.text(0) }
            var names: Set<String> = [digest]
            if hasBodyDigests, keys.count == 1,
               let remoteName = try connection.query("SELECT digest FROM body_digests WHERE blob_key = ? ORDER BY digest LIMIT 1",
                                                     .text(keys[0]), row: { $0.text(0) }).first {
                try connection.run("UPDATE rev_attachments SET blob_key = NULL, digest = ? WHERE digest = ?", .text(remoteName), .text(digest))
                if hasBodyCache {
                    try connection.run("UPDATE OR IGNORE body_cache SET digest = ? WHERE digest = ?", .text(remoteName), .text(digest))
                }
                names.insert(remoteName)
            } else {
                try connection.run("UPDATE rev_attachments SET blob_key = NULL WHERE digest = ?", .text(digest))
            }
            try recordBodyEvent(names, in: connection)
            // Keys still used under another digest stay.
            return try keys.filter { key in
                try connection.query("SELECT COUNT(*) FROM rev_attachments WHERE blob_key = ?", .text(key)) { $0.int(0) }[0] == 0
            }
        }
        guard let keys else { return nil }
        var freed: Int64 = 0
        for hex in keys {
            guard let key = BlobKey(hex: hex) else { continue }
            var info = stat()
            if stat(blobs.path(for: key), &info) == 0, unlink(blobs.path(for: key)) == 0 { freed += Int64(info.st_blocks) * 512 }
        }
        return freed
    }

    /// A body already here under `digest`: the digest of an attachment whose body is here,
    /// an alias recorded for a body (`recordAlias`), or a `sha1-` digest naming a blob.
    public func storedBody(digest: String) throws -> StoredBlob? {
        let keys = try read { connection in
            var keys = try connection.query("SELECT blob_key, length FROM rev_attachments WHERE digest = ? AND blob_key IS NOT NULL", .text(digest)) { row in
                (row.text(0), Optional(row.int64(1)))
            }
            if hasBodyDigests {
                keys += try connection.query("SELECT blob_key FROM body_digests WHERE digest = ?", .text(digest)) { row in
                    (row.text(0), Int64?.none)
                }
            }
            return keys
        }
        for (hex, length) in keys {
            guard let key = BlobKey(hex: hex), blobs.contains(key) else { continue }
            if let length { return StoredBlob(key: key, length: length) }
            if let size = blobs.size(of: key) { return StoredBlob(key: key, length: size) }
        }
        if let key = BlobKey(digestString: digest), let size = blobs.size(of: key) { return StoredBlob(key: key, length: size) }
        return nil
    }

    /// Attachments of current revisions whose bodies are not here: (document, revision, attachment).
    public func missingBodies() throws -> [(docID: String, revID: RevisionID, attachment: Attachment)] {
        let rows = try read { connection in
            try connection.query("""
                SELECT d.doc_id, d.current_rev FROM docs d
                WHERE d.deleted = 0 AND EXISTS (SELECT 1 FROM rev_attachments a WHERE a.doc_key = d.doc_key AND a.rev_id = d.current_rev)
                ORDER BY d.doc_id
                """) { ($0.text(0), try Database.revisionID($0.text(1))) }
        }
        var result: [(String, RevisionID, Attachment)] = []
        for (id, rev) in rows {
            guard let revision = try? revision(rev, of: id) else { continue }
            for attachment in revision.attachments where !attachment.contentAvailable { result.append((id, rev, attachment)) }
        }
        return result
    }

    // MARK: - Saving

    /// A draft of the next revision of `id`: on top of its current revision, or of
    /// nothing for a new document. A deleted document is continued from its tombstone.
    public func newRevision(of id: String) throws -> RevisionDraft {
        try DocumentID.validate(id)
        guard let current = try currentRevision(of: id) else {
            return RevisionDraft(docID: id, parent: nil, properties: JSONObject(), attachments: [], blobs: blobs)
        }
        return RevisionDraft(docID: id, parent: current.revID, properties: current.deleted ? JSONObject() : current.properties,
                             attachments: current.deleted ? [] : current.attachments, blobs: blobs)
    }

    /// A draft of a brand-new document. Saving it when the id exists already is a
    /// conflict, or a new root branch with `allowConflict`.
    public func newDocument(_ id: String) throws -> RevisionDraft {
        try DocumentID.validate(id)
        return RevisionDraft(docID: id, parent: nil, properties: JSONObject(), attachments: [], blobs: blobs)
    }

    /// A draft on top of a specific revision (which may be stale; see `save(_:allowConflict:)`).
    public func newRevision(of id: String, from revID: RevisionID) throws -> RevisionDraft {
        let base = try revision(revID, of: id)
        return RevisionDraft(docID: id, parent: revID, properties: base.properties, attachments: base.attachments, blobs: blobs)
    }

    /// Saves a draft as a new revision.
    ///
    /// If the draft's parent is no longer the current revision, this throws
    /// `SofaError.conflict` unless `allowConflict` is true, in which case the draft
    /// becomes a new branch (a conflict) and nothing is lost. Saving content
    /// identical to an existing child of the parent returns that revision.
    @discardableResult
    public func save(_ draft: RevisionDraft, allowConflict: Bool = false) throws -> Revision {
        try write { try save(draft, allowConflict: allowConflict, in: $0) }
    }

    /// Deletes a document by saving a tombstone on top of `revID` (or the current revision).
    @discardableResult
    public func deleteDocument(_ id: String, revID: RevisionID? = nil) throws -> Revision {
        try write { connection in
            guard let row = try Database.documentRow(id, in: connection), !row.deleted else { throw SofaError.documentNotFound(id) }
            if let revID, revID != row.current {
                throw SofaError.conflict(docID: id, revID: revID.description, current: row.current.description)
            }
            var draft = RevisionDraft(docID: id, parent: row.current, properties: JSONObject(), attachments: [], blobs: blobs)
            draft.deleted = true
            return try save(draft, allowConflict: false, in: connection)
        }
    }

    /// Inserts a revision with its history, as replication does (`new_edits=false`).
    /// Returns false when the revision was already here.
    @discardableResult
    public func insert(_ revision: ReplicatedRevision) throws -> Bool {
        try write { try insert(revision, in: $0) }
    }

    func save(_ draft: RevisionDraft, allowConflict: Bool, in connection: SQLiteConnection) throws -> Revision {
        try DocumentID.validate(draft.docID)
        guard !DocumentID.isLocal(draft.docID) else {
            throw SofaError.invalidDocumentID(draft.docID, reason: "_local documents are saved with putLocalDocument")
        }
        try Database.validateProperties(draft.properties)
        let row = try Database.documentRow(draft.docID, in: connection)
        let tree = try row.map { try Database.loadTree(docKey: $0.key, in: connection) } ?? RevisionTree([])

        var parent = draft.parent
        if let requested = draft.parent {
            guard let row else { throw SofaError.documentNotFound(draft.docID) }
            guard tree.contains(requested) else {
                throw SofaError.revisionNotFound(docID: draft.docID, revID: requested.description)
            }
            if requested != row.current && !allowConflict {
                throw SofaError.conflict(docID: draft.docID, revID: requested.description, current: row.current.description)
            }
        } else if let row {
            if row.deleted {
                parent = row.current  // re-creating a deleted document continues from its tombstone
            } else if !allowConflict {
                throw SofaError.conflict(docID: draft.docID, revID: nil, current: row.current.description)
            }
        }
        if draft.deleted && row == nil { throw SofaError.documentNotFound(draft.docID) }

        let parentAttachments: [String: Attachment]
        if let parent, let key = row?.key {
            parentAttachments = Dictionary(try Database.loadAttachments(docKey: key, revID: parent, in: connection, blobs: nil)
                .map { ($0.name, $0) }, uniquingKeysWith: { $1 })
        } else {
            parentAttachments = [:]
        }
        var draftRows = draft.attachments
        if !draft.deleted {
            let parentProperties = try parentAttachments.keys.contains(where: Blobs.isStandInName)
                ? loadRevision(docKey: row!.key, docID: draft.docID, revID: parent!, in: connection)?.properties : nil
            draftRows = try StandInRows(docID: draft.docID, parentProperties: parentProperties, parentAttachments: parentAttachments,
                                        blobs: blobs).rows(for: draft.properties, draftRows: draftRows)
        }
        let generation = (parent?.generation ?? 0) + 1
        let attachments: [Attachment] = draft.deleted ? [] : draftRows.values.sorted { $0.name < $1.name }.map { attachment in
            // Keep revpos when neither body nor type changed since the parent.
            let old = parentAttachments[attachment.name]
            let unchanged = old.map { $0.digest == attachment.digest && $0.contentType == attachment.contentType } ?? false
            return attachment.with(revpos: unchanged ? old!.revpos : generation)
        }
        let properties = draft.deleted ? JSONObject() : draft.properties
        try validate(docID: draft.docID, newDocument: {
            Database.validationJSON(docID: draft.docID, rev: parent, history: parent.map { [$0] } ?? [], deleted: draft.deleted,
                                    properties: properties, attachments: attachments)
        }, oldDocument: {
            guard let parent, let key = row?.key, let old = try loadRevision(docKey: key, docID: draft.docID, revID: parent, in: connection),
                  !old.deleted else { return nil }
            return Database.validationJSON(docID: draft.docID, rev: parent, history: tree.history(of: parent), deleted: false,
                                           properties: old.properties, attachments: old.attachments)
        }, author: Author.current, in: connection)
        let revID = RevisionID.derive(parent: parent, deleted: draft.deleted, properties: properties,
                                      attachments: attachments.map { ($0.name, $0.digest) })
        let docKey = try row?.key ?? Database.insertDocumentRow(draft.docID, revID: revID, in: connection)
        if tree.contains(revID) {
            // The same edit of the same parent was saved before.
            return try loadRevision(docKey: docKey, docID: draft.docID, revID: revID, in: connection)!
        }
        // The same seconds value is stored and returned, so a reloaded revision compares equal.
        let savedAt = Date(timeIntervalSince1970: Date().timeIntervalSince1970)
        try insertRevision(docKey: docKey, revID: revID, parent: parent, deleted: draft.deleted,
                           properties: properties, attachments: attachments, savedAt: savedAt, in: connection)
        try noteSavedHere(attachments.filter { $0.revpos == generation && $0.blobKey != nil }.map(\.digest), in: connection)
        let newNode = RevisionNode(id: revID, parent: parent, deleted: draft.deleted, isLeaf: true)
        let sequence = try finishChange(docKey: docKey, docID: draft.docID, tree: tree, added: [newNode], in: connection)
        return Revision(docID: draft.docID, revID: revID, parentRevID: parent, deleted: draft.deleted, properties: properties,
                        attachments: attachments.map { $0.with(contentAvailable: $0.blobKey.map(blobs.contains) ?? false) },
                        sequence: sequence, savedAt: savedAt)
    }

    private func insert(_ revision: ReplicatedRevision, in connection: SQLiteConnection) throws -> Bool {
        try DocumentID.validate(revision.docID)
        guard !DocumentID.isLocal(revision.docID) else {
            throw SofaError.invalidDocumentID(revision.docID, reason: "_local documents do not replicate")
        }
        try Database.validateProperties(revision.properties)
        for attachment in revision.attachments { try AttachmentName.validate(attachment.name) }
        var expected = revision.revID.generation
        for ancestor in revision.ancestors {
            expected -= 1
            guard ancestor.generation == expected, expected >= 1 else {
                throw SofaError.invalidDocument(reason: "the history of \(revision.revID) is not a chain of generations (\(ancestor))")
            }
        }
        let row = try Database.documentRow(revision.docID, in: connection)
        let tree = try row.map { try Database.loadTree(docKey: $0.key, in: connection) } ?? RevisionTree([])
        if tree.contains(revision.revID) { return false }
        try validate(docID: revision.docID, newDocument: {
            Database.validationJSON(docID: revision.docID, rev: revision.revID, history: [revision.revID] + revision.ancestors,
                                    deleted: revision.deleted, properties: revision.properties, attachments: revision.attachments)
        }, oldDocument: {
            // As CouchDB: the nearest ancestor this database has, when it has its body.
            guard let key = row?.key, let ancestor = revision.ancestors.first(where: tree.contains),
                  let old = try loadRevision(docKey: key, docID: revision.docID, revID: ancestor, in: connection), !old.deleted else { return nil }
            return Database.validationJSON(docID: revision.docID, rev: ancestor, history: tree.history(of: ancestor), deleted: false,
                                           properties: old.properties, attachments: old.attachments)
        }, author: Author.current, in: connection)
        let docKey = try row?.key ?? Database.insertDocumentRow(revision.docID, revID: revision.revID, in: connection)

        // Graft: the ancestors we lack become body-less history revisions.
        let known = revision.ancestors.firstIndex(where: tree.contains) ?? revision.ancestors.count
        var added: [RevisionNode] = []
        for index in stride(from: known - 1, through: 0, by: -1) {
            let id = revision.ancestors[index]
            let parent = index + 1 < revision.ancestors.count ? revision.ancestors[index + 1] : nil
            try connection.run("""
                INSERT INTO revs (doc_key, rev_id, parent_id, generation, deleted, leaf, body, sequence, saved_at)
                VALUES (?, ?, ?, ?, 0, 0, NULL, 0, ?)
                """, .integer(docKey), .text(id.description), SQLValue(parent?.description), SQLValue(id.generation),
                .real(Date().timeIntervalSince1970))
            added.append(RevisionNode(id: id, parent: parent, deleted: false, isLeaf: false))
        }
        let parent = revision.ancestors.first
        try insertRevision(docKey: docKey, revID: revision.revID, parent: parent, deleted: revision.deleted,
                           properties: revision.deleted ? JSONObject() : revision.properties,
                           attachments: revision.attachments, in: connection)
        added.append(RevisionNode(id: revision.revID, parent: parent, deleted: revision.deleted, isLeaf: true))
        try finishChange(docKey: docKey, docID: revision.docID, tree: tree, added: added, in: connection)
        return true
    }

    private func insertRevision(docKey: Int64, revID: RevisionID, parent: RevisionID?, deleted: Bool,
                                properties: JSONObject, attachments: [Attachment], savedAt: Date = Date(),
                                in connection: SQLiteConnection) throws {
        let body = JSONValue.object(properties).jsonString()
        try connection.run("""
            INSERT INTO revs (doc_key, rev_id, parent_id, generation, deleted, leaf, body, sequence, saved_at)
            VALUES (?, ?, ?, ?, ?, 1, ?, 0, ?)
            """, .integer(docKey), .text(revID.description), SQLValue(parent?.description), SQLValue(revID.generation),
            SQLValue(deleted), .text(body), .real(savedAt.timeIntervalSince1970))
        for attachment in attachments {
            try connection.run("""
                INSERT INTO rev_attachments (doc_key, rev_id, name, content_type, length, digest, blob_key, revpos)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                """, .integer(docKey), .text(revID.description), .text(attachment.name), .text(attachment.contentType),
                .integer(attachment.length), .text(attachment.digest), SQLValue(attachment.blobKey?.hex),
                SQLValue(attachment.revpos))
        }
    }

    /// After revisions were added: pick the winner, take a new sequence, prune old history.
    @discardableResult
    private func finishChange(docKey: Int64, docID: String, tree: RevisionTree, added: [RevisionNode], in connection: SQLiteConnection) throws -> Int64 {
        var nodes = tree.nodes
        for node in added {
            nodes[node.id] = node
            // A revision that gained a child is no longer a leaf, in memory and on disk.
            if let parent = node.parent, let old = nodes[parent], old.isLeaf {
                nodes[parent] = RevisionNode(id: old.id, parent: old.parent, deleted: old.deleted, isLeaf: false)
                try connection.run("UPDATE revs SET leaf = 0 WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(parent.description))
            }
        }
        let updated = RevisionTree(Array(nodes.values))
        let winner = updated.winner!
        let sequence = try Database.nextSequence(in: connection)
        try connection.run("UPDATE docs SET current_rev = ?, deleted = ?, sequence = ? WHERE doc_key = ?",
                           .text(winner.id.description), SQLValue(winner.deleted), .integer(sequence), .integer(docKey))
        try documentChanged(docKey: docKey, docID: docID, winner: (winner.id, winner.deleted), in: connection)
        for node in added {
            try connection.run("UPDATE revs SET sequence = ? WHERE doc_key = ? AND rev_id = ?",
                               .integer(sequence), .integer(docKey), .text(node.id.description))
        }
        let limit = try Database.revsLimit(in: connection)
        if updated.nodes.count > limit {
            for id in updated.revisionsBeyond(limit: limit) {
                try Database.deleteRevision(docKey: docKey, revID: id, in: connection)
            }
        }
        if added.contains(where: { $0.parent != nil }) { try pruneHistoryBodies(docKey: docKey, in: connection) }
        return sequence
    }

    /// Drops the bodies and attachment lists of a document's non-leaf revisions once they hold
    /// more than `Tuning.historyAttachmentRows` attachment rows, as CouchDB's compaction would:
    /// a document of many files then stores one list per leaf, not one per revision it ever
    /// had (2,000 files added one by one used to leave ~2 million rows). Revision ids stay
    /// (within the revs limit) for replication; leaves, and so conflicts, are never touched.
    /// A small document keeps its history's bodies until `compact()`, as before.
    private func pruneHistoryBodies(docKey: Int64, in connection: SQLiteConnection) throws {
        let historyRows = try connection.query("""
            SELECT COUNT(*) FROM rev_attachments a JOIN revs r ON r.doc_key = a.doc_key AND r.rev_id = a.rev_id
            WHERE a.doc_key = ? AND r.leaf = 0
            """, .integer(docKey)) { $0.int(0) }[0]
        guard historyRows > Tuning.historyAttachmentRows else { return }
        try connection.run("""
            DELETE FROM rev_attachments WHERE doc_key = ? AND rev_id IN (SELECT rev_id FROM revs WHERE doc_key = ? AND leaf = 0)
            """, .integer(docKey), .integer(docKey))
        try connection.run("UPDATE revs SET body = NULL WHERE doc_key = ? AND leaf = 0 AND body IS NOT NULL", .integer(docKey))
    }

    // MARK: - Local documents

    /// The ids of every `_local` document (checkpoints, among others), sorted.
    public func localDocumentIDs() throws -> [String] {
        try read { connection in try connection.query("SELECT doc_id FROM local_docs ORDER BY doc_id") { $0.text(0) } }
    }

    /// A `_local` document's revision (`0-N`) and body; nil if there is none.
    public func localDocument(withID id: String) throws -> (rev: String, body: JSONObject)? {
        try read { connection in
            try connection.query("SELECT rev, body FROM local_docs WHERE doc_id = ?", .text(id)) { row in
                (row.text(0), try Database.parseBody(row.bytes(1)))
            }.first
        }
    }

    /// Creates or replaces a `_local` document. When `rev` is given it must be the
    /// current one (`conflict` otherwise). Returns the new revision, `0-N`.
    @discardableResult
    public func putLocalDocument(_ id: String, body: JSONObject, rev: String? = nil) throws -> String {
        try DocumentID.validate(id)
        return try write { connection in
            let current = try connection.query("SELECT rev FROM local_docs WHERE doc_id = ?", .text(id)) { $0.text(0) }.first
            if let rev, rev != current {
                throw SofaError.conflict(docID: id, revID: rev, current: current ?? "(none)")
            }
            let count = current.flatMap { Int($0.split(separator: "-").last ?? "") } ?? 0
            let newRev = "0-\(count + 1)"
            try connection.run("INSERT OR REPLACE INTO local_docs (doc_id, rev, body) VALUES (?, ?, ?)",
                               .text(id), .text(newRev), .text(JSONValue.object(body).jsonString()))
            return newRev
        }
    }

    /// Stores a `_local` document the way CouchDB's HTTP API does: no conflict check,
    /// the new revision is `0-(N+1)` for a given `0-N`, and `0-1` without one.
    @discardableResult
    public func replaceLocalDocument(_ id: String, body: JSONObject, after rev: String?) throws -> String {
        try DocumentID.validate(id)
        let count = rev.flatMap { Int($0.split(separator: "-").last ?? "") } ?? 0
        let newRev = "0-\(count + 1)"
        try write { connection in
            try connection.run("INSERT OR REPLACE INTO local_docs (doc_id, rev, body) VALUES (?, ?, ?)",
                               .text(id), .text(newRev), .text(JSONValue.object(body).jsonString()))
        }
        return newRev
    }

    public func deleteLocalDocument(_ id: String, rev: String? = nil) throws {
        try write { connection in
            let current = try connection.query("SELECT rev FROM local_docs WHERE doc_id = ?", .text(id)) { $0.text(0) }.first
            guard let current else { throw SofaError.documentNotFound(id) }
            if let rev, rev != current { throw SofaError.conflict(docID: id, revID: rev, current: current) }
            try connection.run("DELETE FROM local_docs WHERE doc_id = ?", .text(id))
        }
    }

    // MARK: - Copies (Copies.swift)

    /// The private UUIDs this database had before it was copied, newest first: a copy's
    /// replications find the checkpoints its originals left (`Database.copy(to:)`).
    public var previousPrivateUUIDs: [String] {
        let text = (try? read { connection in
            try connection.query("SELECT value FROM meta WHERE key = 'previous_private_uuids'") { $0.text(0) }.first
        }) ?? nil
        return text.flatMap { try? JSONParser.parse(Array($0.utf8)) }?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    // MARK: - Info

    public func info() throws -> DatabaseInfo {
        let blobList = try blobs.allBlobs()
        return try read { connection in
            let counts = try connection.query("SELECT COALESCE(SUM(deleted = 0), 0), COALESCE(SUM(deleted), 0) FROM docs") { ($0.int(0), $0.int(1)) }[0]
            var missing = 0
            try connection.forEach("""
                SELECT a.blob_key FROM rev_attachments a JOIN docs d ON a.doc_key = d.doc_key AND a.rev_id = d.current_rev
                """) { row in
                guard let key = row.optionalText(0).flatMap(BlobKey.init(hex:)), blobs.contains(key) else {
                    missing += 1
                    return
                }
            }
            return DatabaseInfo(
                path: path, documentCount: counts.0, deletedCount: counts.1,
                lastSequence: try Database.lastSequence(in: connection),
                publicUUID: publicUUID, privateUUID: privateUUID, revsLimit: try Database.revsLimit(in: connection),
                databaseBytes: databaseFileBytes(), blobCount: blobList.count,
                blobBytes: blobList.reduce(0) { $0 + $1.size }, missingBodyCount: missing)
        }
    }

    func databaseFileBytes() -> Int64 {
        ["", "-wal"].reduce(Int64(0)) { total, suffix in
            var info = stat()
            return total + (stat(databaseFilePath + suffix, &info) == 0 ? Int64(info.st_size) : 0)
        }
    }

    // MARK: - Compaction

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
                    var referenced = Set(try connection.query("SELECT DISTINCT blob_key FROM rev_attachments WHERE blob_key IS NOT NULL") { $0.text(0) })
                    if hasStaging {
                        // Bodies a mount saved that wait to be folded into a revision.
                        referenced.formUnion(try connection.query("SELECT DISTINCT blob_key FROM staged_attachments") { $0.text(0) })
                    }
                    let cutoff = alone && noOtherProcess ? Double.infinity : Date().timeIntervalSince1970 - Tuning.blobGracePeriod
                    for blob in try blobs.allBlobs() where !referenced.contains(blob.key.hex) {
                        var info = stat()
                        guard stat(blobs.path(for: blob.key), &info) == 0 else { continue }
                        guard Double(info.st_mtim.tv_sec) < cutoff else {
                            report.recentBlobsKept += 1
                            continue
                        }
                        if !dryRun { try blobs.remove(blob.key) }
                        report.blobsDeleted += 1
                        report.blobBytesFreed += blob.size
                    }
                    if dryRun { throw RollBack() }
                    if hasBodyDigests {
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
        report.temporaryBytesFreed = blobs.removeAbandonedTemporaryFiles(dryRun: dryRun) + removeOrphanedPendingSaveFiles(dryRun: dryRun)
        // Partial downloads stay while some revision still waits for their body.
        let deferred = try read { try $0.query("SELECT DISTINCT digest FROM rev_attachments WHERE blob_key IS NULL") { $0.text(0) } }
        report.temporaryBytesFreed += blobs.removePartialBodies(except: Set(deferred), dryRun: dryRun)
        guard !dryRun else {
            report.databaseBytesAfter = report.databaseBytesBefore
            return report
        }
        // (write() above has already refused a read-only database.)
        try writeLock.withLock {
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
        try writeLock.withLock { try writer.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    /// Checks the SQLite file (`PRAGMA integrity_check`) and every blob's hash.
    /// Returns the problems found; empty means healthy.
    public func check() throws -> [String] {
        var problems = try read { connection in
            try connection.query("PRAGMA integrity_check") { $0.text(0) }.filter { $0 != "ok" }
        }
        for blob in try blobs.allBlobs() {
            do { try blobs.verify(blob.key) } catch { problems.append("\(error)") }
        }
        return problems
    }

    // MARK: - Row helpers

    struct DocumentRow {
        let key: Int64
        let current: RevisionID
        let deleted: Bool
    }

    static func documentRow(_ id: String, in connection: SQLiteConnection) throws -> DocumentRow? {
        try connection.query("SELECT doc_key, current_rev, deleted FROM docs WHERE doc_id = ?", .text(id)) { row in
            DocumentRow(key: row.int64(0), current: try revisionID(row.text(1)), deleted: row.bool(2))
        }.first
    }

    static func insertDocumentRow(_ id: String, revID: RevisionID, in connection: SQLiteConnection) throws -> Int64 {
        try connection.run("INSERT INTO docs (doc_id, current_rev, deleted, sequence) VALUES (?, ?, 0, NULL)",
                           .text(id), .text(revID.description))
        return try connection.query("SELECT last_insert_rowid()") { $0.int64(0) }[0]
    }

    static func loadTree(docKey: Int64, in connection: SQLiteConnection) throws -> RevisionTree {
        RevisionTree(try connection.query("SELECT rev_id, parent_id, deleted, leaf FROM revs WHERE doc_key = ?", .integer(docKey)) { row in
            RevisionNode(id: try revisionID(row.text(0)), parent: try row.optionalText(1).map(revisionID),
                         deleted: row.bool(2), isLeaf: row.bool(3))
        })
    }

    func loadRevision(docKey: Int64, docID: String, revID: RevisionID, in connection: SQLiteConnection) throws -> Revision? {
        let rows = try connection.query("""
            SELECT parent_id, deleted, body, sequence, saved_at FROM revs WHERE doc_key = ? AND rev_id = ? AND body IS NOT NULL
            """, .integer(docKey), .text(revID.description)
        ) { row in
            (parent: try row.optionalText(0).map(Database.revisionID), deleted: row.bool(1),
             body: try Database.parseBody(row.bytes(2)), sequence: row.int64(3), savedAt: row.double(4))
        }
        guard let row = rows.first else { return nil }
        return Revision(docID: docID, revID: revID, parentRevID: row.parent, deleted: row.deleted, properties: row.body,
                        attachments: try Database.loadAttachments(docKey: docKey, revID: revID, in: connection, blobs: blobs),
                        sequence: row.sequence, savedAt: Date(timeIntervalSince1970: row.savedAt))
    }

    /// Attachment rows of a revision; `contentAvailable` is checked against `blobs` when given.
    static func loadAttachments(docKey: Int64, revID: RevisionID, in connection: SQLiteConnection, blobs: BlobStore?) throws -> [Attachment] {
        try connection.query("""
            SELECT name, content_type, length, digest, blob_key, revpos FROM rev_attachments
            WHERE doc_key = ? AND rev_id = ? ORDER BY name
            """, .integer(docKey), .text(revID.description)
        ) { row in
            let key = row.optionalText(4).flatMap(BlobKey.init(hex:))
            return Attachment(name: row.text(0), contentType: row.text(1), length: row.int64(2), digest: row.text(3),
                              blobKey: key, revpos: row.int(5),
                              contentAvailable: key.map { blobs?.contains($0) ?? false } ?? false)
        }
    }

    static func deleteRevision(docKey: Int64, revID: RevisionID, in connection: SQLiteConnection) throws {
        try connection.run("DELETE FROM rev_attachments WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(revID.description))
        try connection.run("DELETE FROM revs WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(revID.description))
    }

    static func nextSequence(in connection: SQLiteConnection) throws -> Int64 {
        try connection.query("UPDATE meta SET value = value + 1 WHERE key = 'last_sequence' RETURNING value") { $0.int64(0) }[0]
    }

    static func lastSequence(in connection: SQLiteConnection) throws -> Int64 {
        try connection.query("SELECT value FROM meta WHERE key = 'last_sequence'") { $0.int64(0) }[0]
    }

    /// Generations of history kept per document (CouchDB's `_revs_limit`).
    public var revsLimit: Int {
        get throws { try read { try Database.revsLimit(in: $0) } }
    }

    /// Changes the history kept per document; later saves and compaction prune to it.
    public func setRevsLimit(_ limit: Int) throws {
        guard limit >= 1 else { throw SofaError.invalidArgument("the revs limit must be at least 1") }
        try write { try $0.run("UPDATE meta SET value = ? WHERE key = 'revs_limit'", SQLValue(limit)) }
    }

    static func revsLimit(in connection: SQLiteConnection) throws -> Int {
        try connection.query("SELECT value FROM meta WHERE key = 'revs_limit'") { $0.int(0) }[0]
    }

    static func revisionID(_ text: String) throws -> RevisionID {
        guard let rev = RevisionID(text) else { throw SofaError.sqlite(code: 0, message: "corrupt revision id \(text)", sql: nil) }
        return rev
    }

    static func parseBody(_ bytes: [UInt8]) throws -> JSONObject {
        guard case .object(let object) = try JSONValue(parsing: bytes) else {
            throw SofaError.invalidDocument(reason: "stored body is not an object")
        }
        return object
    }

    /// Top-level keys starting with `_` are CouchDB's, not the document's.
    /// The one kind of `_` field documents may hold, as in CouchDB: the state the replicator
    /// writes into `_replicator` documents (`_replication_state`, `_replication_stats`…).
    public static let replicationFieldPrefix = "_replication_"

    static func validateProperties(_ properties: JSONObject) throws {
        if let key = properties.keys.first(where: { $0.hasPrefix("_") && !$0.hasPrefix(replicationFieldPrefix) }) {
            throw SofaError.invalidDocument(reason: "top-level key \"\(key)\" is reserved (keys starting with '_' are not allowed)")
        }
    }
}
