import CCrypto
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
    /// An encrypted database's keys (nil for a plain one); its connections' pages are sealed
    /// by `sealedPages`, its bodies by `blobs`.
    let encryption: DatabaseKey?
    let sealedPages: SealedPages?
    /// Whether the database is encrypted at rest (`key.json`; docs/encryption.md).
    public var isEncrypted: Bool { encryption != nil }
    public let publicUUID: String
    public let privateUUID: String
    /// True when the database sits on a read-only file system: it is opened
    /// immutable, reads work, and every write fails with `readOnlyFileSystem`.
    public let isReadOnly: Bool
    /// Opened for reading because the disk was full (`open(at:)`): writes say so.
    public let openedOnAFullDisk: Bool
    /// The schema steps the file has: every one, unless it was opened read-only as an older
    /// Sofa left it (a version 1 file has no `body_digests`).
    package let schema: AppliedSchema
    /// Every commit, this process's and others' (see `ChangeStream`).
    public let changeStream = ChangeStream()
    /// The design documents' `validate_doc_update` functions, read again when one changes.
    let validators = Validators()
    /// One updater at a time per design document's view index (`updateViewIndex`).
    let viewLocks = Locked<[String: NSLock]>([:])
    /// Each view's `ViewRanks`, by "index id/view position".
    let viewRankCache = Locked<[String: ViewRanks]>([:])
    /// Reads of bodies not recorded yet (`noteRead`). Guarded by `readNotesLock`.
    var readNotes = ReadNotes()
    let readNotesLock = Lock()

    /// The one connection that writes. Guarded by `writeLock`.
    private let writer: SQLiteConnection
    /// Serialises this process's writes. Lock order (docs/internals.md, Locks): 2, before `readersLock`.
    private let writeLock = Lock()
    /// The writer's `PRAGMA data_version` when last asked (`otherConnectionCommitted`). Guarded by `writeLock`.
    private var lastDataVersion: Int64?
    /// Connections ready for reading. Guarded by `readersLock`.
    private var idleReaders: [SQLiteConnection] = []
    /// Guards `idleReaders`. Lock order: 3 (nothing is locked while it is held).
    private let readersLock = Lock()

    /// Every process that opens the database writable holds a shared `flock` on this file
    /// (not on the SQLite file: closing any descriptor of that would drop SQLite's own
    /// locks), so compaction can tell whether it is alone. -1 when read-only.
    private let openLock: Int32
    static let openLockFileName = "open.lock"

    public static let databaseFileName = "db.sqlite3"
    static let attachmentsDirectoryName = "attachments"

    public var databaseFilePath: String { "\(path)/\(Database.databaseFileName)" }

    /// When the database last committed, by any process: the later modification time of its
    /// file and its write-ahead log (a log not there yet gives none; the file's stands), nil
    /// when neither can be read.
    public func lastCommitTime() -> Double? {
        [databaseFilePath, databaseFilePath + "-wal"].compactMap { file -> Double? in
            var info = stat()
            guard stat(file, &info) == 0 else { return nil }
            return Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9
        }.max()
    }

    private init(path: String, writer: SQLiteConnection, readOnly: Bool = false, fullDisk: Bool = false,
                 schema: AppliedSchema = AppliedSchema(names: Set(Schema.steps.map(\.name))), encryption: DatabaseKey? = nil) throws {
        self.path = path
        self.writer = writer
        self.encryption = encryption
        self.sealedPages = writer.sealed
        self.isReadOnly = readOnly
        self.openedOnAFullDisk = fullDisk
        self.schema = schema
        self.blobs = BlobStore(directory: "\(path)/\(Database.attachmentsDirectoryName)", key: encryption)
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

    /// Creates a new, empty database directory at `path`. With `encryptedWith`, everything in
    /// it is encrypted under a new random key, wrapped in `key.json` under what the secret
    /// unlocks (a key file's key, or a passphrase through scrypt).
    public static func create(at path: String, revsLimit: Int = Tuning.defaultRevsLimit,
                              encryptedWith secret: (DatabaseSecret, KeyUnlock)? = nil) throws -> Database {
        let path = normalize(path)
        guard mkdir(path, 0o755) == 0 else {
            throw errno == EEXIST ? SofaError.databaseExists(path: path) : SofaError.system("create directory", path: path, errno: errno)
        }
        do {
            let encryption = try secret.map { try DatabaseKey.makeNew(in: path, wrappedWith: $0.0, unlock: $0.1) }
            try BlobStore(directory: "\(path)/\(attachmentsDirectoryName)").createDirectories()
            let connection = try SQLiteConnection(path: "\(path)/\(databaseFileName)", create: true,
                                                  sealed: try encryption.map { try SealedPages(key: $0.pages) })
            try Schema.create(connection, revsLimit: revsLimit)
            return try Database(path: path, writer: connection, encryption: encryption)
        } catch {
            // Leave nothing half-made (as far as it goes: the error thrown is the one that matters).
            try? FileManager.default.removeItem(atPath: path)
            throw error
        }
    }

    /// Opens an existing database directory. An encrypted one is opened with `secret`, or the
    /// one `DatabaseSecrets` finds for it; without one, or with a wrong one, it is
    /// `keyRejected` before anything is read.
    public static func open(at path: String, secret: DatabaseSecret? = nil) throws -> Database {
        try open(at: path, secret: secret, unlocked: nil)
    }

    /// `open(at:secret:)`, or with the keys of an encrypted database already unlocked (a copy's).
    static func open(at path: String, secret: DatabaseSecret?, unlocked: DatabaseKey?) throws -> Database {
        let path = normalize(path)
        // What a killed copy, encrypt or decrypt of this database left beside it (a decrypt's is
        // plaintext) goes with the next command that opens it; a database a kill left set aside
        // mid-replacement comes back.
        let staging = stagingLocation(for: path)
        StagedDirectory.removeAbandoned(in: staging.directory, prefix: staging.prefix)
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
        let walIsEmpty = stat(file + "-wal", &wal) != 0 || wal.st_size == 0
        var readOnly = statvfs(path, &fileSystem) == 0 && fileSystem.f_flag & UInt(ST_RDONLY) != 0 && walIsEmpty
        let encryption = try unlocked ?? unlock(path, secret: secret)
        let pages = try encryption.map { try SealedPages(key: $0.pages) }
        var connection = try SQLiteConnection(path: file, create: false, immutable: readOnly, sealed: pages)
        var found: SchemaMigrator.Outcome
        do {
            found = try Schema.check(connection, path: path, readOnly: readOnly)
        } catch SofaError.sqlite(let code, _, _) where code & 0xFF == 10 /* SQLITE_IOERR */ && Database.diskIsFull(path) {
            // A full disk: SQLite cannot make the WAL's shared-memory file, so nothing opens.
            // With every commit in the main file it opens immutable, for reading (`sofa info`,
            // `check`, `cat`, a read-only mount); writes then say the disk is full.
            guard walIsEmpty else { throw SofaError.diskFull(path: file + "-shm") }
            readOnly = true
            connection = try SQLiteConnection(path: file, create: false, immutable: true, sealed: pages)
            found = try Schema.check(connection, path: path, readOnly: true)
        } catch SofaError.notADatabase where CouchbaseLiteDatabase.isCouchbaseLite(at: path) {
            throw SofaError.notADatabase(path: path, reason: "it is a Couchbase Lite database: `sofa info|ls|cat|revs` read it in place, "
                + "`sofa mount` mounts it, and `sofa cp \(path) NEW.sofa` copies it into a Sofa database (which serves and syncs)")
        }
        let database = try Database(path: path, writer: connection, readOnly: readOnly,
                                    fullDisk: readOnly && fileSystem.f_flag & UInt(ST_RDONLY) == 0,
                                    schema: found.schema, encryption: encryption)
        if !readOnly {
            try database.blobs.createDirectories()
            // What killed writers left (an attach, import or pull cut short) goes on the next open.
            _ = database.blobs.removeAbandonedTemporaryFiles()
        }
        // The work that follows a step the file got just now.
        if found.added.contains(Schema.bodyDigests.name) { try database.upgradeDigestsFromVersion1() }
        if found.added.contains(MangoIndex.schemaStep.name) { try database.buildMangoIndexesFromDesignDocuments() }
        return database
    }

    /// Gives the encrypted database at `path` a new key: its data key, unwrapped with `current`,
    /// is wrapped again under `new` and `key.json` replaced by a rename. Nothing else changes, so
    /// a kill at any moment leaves the database opening with the old key or the new one.
    /// Copies made before keep the key they had.
    public static func rekey(at path: String, current: DatabaseSecret, to new: DatabaseSecret, unlock: KeyUnlock) throws {
        let path = normalize(path)
        guard let file = try KeyFile.read(database: path) else {
            throw SofaError.invalidArgument("\(path) is not encrypted: nothing to re-key")
        }
        var dataKey = try file.unwrap(with: current, database: path)
        defer { dataKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        let rewrapped = try KeyFile.wrapping(dataKey, with: new, unlock: unlock, database: path)
        // The new wrapping must open before it replaces the old one.
        var check = try rewrapped.unwrap(with: new, database: path)
        defer { check.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        guard check == dataKey else { throw SofaError.keyRejected(path: path, reason: "the new key did not unwrap what it wrapped") }
        try rewrapped.write(database: path)
    }

    /// How the database at `path` is unlocked when it is encrypted; nil for a plain one.
    public static func encryptionUnlock(at path: String) throws -> KeyUnlock? {
        try KeyFile.read(database: normalize(path))?.unlock
    }

    /// The keys of the database at `path` when it is encrypted (nil when it is not): its
    /// `key.json` unwrapped with `secret` or the one `DatabaseSecrets` gives.
    static func unlock(_ path: String, secret: DatabaseSecret?) throws -> DatabaseKey? {
        guard let file = try KeyFile.read(database: path) else { return nil }
        guard let secret = try secret ?? DatabaseSecrets.secret(for: path, unlock: file.unlock) else {
            throw SofaError.keyRejected(path: path, reason: file.unlock == .passphrase
                ? "no passphrase given (run it on a terminal, or give --key-file or --key-fd)"
                : "no key given (--key-file or --key-fd)")
        }
        var dataKey = try file.unwrap(with: secret, database: path)
        defer { dataKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        return try DatabaseKey(dataKey: dataKey)
    }

    /// Whether the file system holding `path` has no room left for an ordinary user.
    static func diskIsFull(_ path: String) -> Bool {
        var fileSystem = statvfs()
        return statvfs(path, &fileSystem) == 0 && UInt64(fileSystem.f_bavail) * UInt64(fileSystem.f_frsize) < 64 << 10
    }

    static func normalize(_ path: String) -> String {
        var path = path
        while path.count > 1 && path.hasSuffix("/") { path.removeLast() }
        return path
    }

    // MARK: - Transactions

    /// Runs `body` in a read transaction on a pooled connection: one consistent snapshot.
    package func read<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        let connection = try readersLock.withLock { idleReaders.popLast() }
            ?? SQLiteConnection(path: databaseFilePath, create: false, immutable: isReadOnly, sealed: sealedPages)
        defer { readersLock.withLock { idleReaders.append(connection) } }
        try connection.execute("BEGIN")
        defer { try? connection.execute("COMMIT") }  // ends a read: nothing to lose if it fails
        return try body(connection)
    }

    /// Runs `body` in an IMMEDIATE write transaction; rolls back if it throws. Each commit
    /// is published on `changeStream`.
    package func write<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        guard !isReadOnly else {
            throw openedOnAFullDisk ? SofaError.diskFull(path: databaseFilePath) : SofaError.readOnlyFileSystem(path: databaseFilePath)
        }
        let (result, changed) = try writeLock.withLock {
            writer.wroteChanges = false
            try writer.execute("BEGIN IMMEDIATE")
            do {
                let result = try body(writer)
                try writer.execute("COMMIT")
                return (result, writer.wroteChanges)
            } catch {
                try? writer.execute("ROLLBACK")  // the error thrown below is the one that matters
                throw error
            }
        }
        changeStream.publish(documents: changed)
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
        public func save(_ draft: RevisionDraft, allowConflict: Bool = false, validated: Validated? = nil) throws -> Revision {
            try database.save(draft, allowConflict: allowConflict, validated: validated, in: connection)
        }

        @discardableResult
        public func insert(_ revision: ReplicatedRevision) throws -> Bool {
            try database.insert(revision, in: connection)
        }

        /// `insert`, undone alone when it throws: the batch's other revisions stay (a savepoint).
        @discardableResult
        public func insertAlone(_ revision: ReplicatedRevision) throws -> Bool {
            try connection.execute("SAVEPOINT one_revision")
            do {
                let inserted = try database.insert(revision, in: connection)
                try connection.execute("RELEASE one_revision")
                return inserted
            } catch {
                try connection.execute("ROLLBACK TO one_revision")
                try connection.execute("RELEASE one_revision")
                throw error
            }
        }

        /// The winning revision of `id` as this transaction sees it (its own inserts included),
        /// or nil for a document never here.
        public func current(of id: String) throws -> (revID: RevisionID, deleted: Bool)? {
            try Database.documentRow(id, in: connection).map { ($0.current, $0.deleted) }
        }
    }


    /// Runs `body` on the writing connection outside any transaction (VACUUM and checkpoints
    /// cannot run inside one), holding this process's write lock.
    func withWriter<T>(_ body: (SQLiteConnection) throws -> T) throws -> T {
        try writeLock.withLock { try body(writer) }
    }
}
