import DocumentModel
import Foundation

/// One named change to `db.sqlite3`'s schema, applied once per file, in the order of
/// `Schema.steps`, as GRDB's `DatabaseMigrator` applies its migrations.
///
/// Each part that keeps tables declares its own step (`BodyCache.swift`, `MangoIndexes.swift`
/// beside their code; the MountTables module's in `Schema+MountTables.swift`, since every opener
/// must know them), and says what the rest of the store must know of them: which blobs and kept
/// files its rows hold (compaction and encryption keep those without naming the table), which
/// work of a stopped mount they hold (`sofa encrypt` waits for it), and how a purged document's
/// rows go. Nothing else branches on a version number.
///
/// Invariants: a step's `migrate` is idempotent (`IF NOT EXISTS`, columns checked first), since
/// a file from before steps had names runs every step once to be sure; steps are never renamed
/// or reordered once released; a new one goes at the end.
package struct SchemaStep: Sendable, Hashable {
    /// Its name in `schema_steps`, for good.
    let name: String
    /// The numbered version (1–8) that brought it, for files from before steps had names
    /// (`PRAGMA user_version`); nil for steps made since.
    let numberedVersion: Int?
    let migrate: @Sendable (SQLiteConnection) throws -> Void
    /// A query giving, in a column named `blob_key`, the blob keys (hex) its rows hold: bodies
    /// that no revision may name yet and that compaction and encryption must keep.
    let blobKeys: String?
    /// A query whose one row of integers changes whenever its rows do (automatic compaction
    /// waits for a database to be quiet).
    let activity: String?
    /// A statement forgetting a purged document's rows (`?`: its id).
    let forgetDocument: String?
    /// A statement a copy of the database runs (`sofa copy`, an installed snapshot): rows of
    /// work a mount of the original has not finished (staged files, fsynced saves), whose bodies
    /// the copy does not take; the original's next mount finishes them there.
    let forgetInCopies: String?
    /// A query giving, in a column named `file`, the kept files (`BlobStore.keptFilePath`) its
    /// rows name: compaction's sweep of the temporary folder leaves those.
    let keptFiles: String?
    /// Work a mount that stopped left in its rows, which only a mount finishes: a query giving
    /// one row, 1 when there is some, and what it is, for the message (`sofa encrypt` refuses
    /// to rewrite the database until a mount has finished it).
    let unfinishedWork: (query: String, description: String)?
    /// What it keeps in files in the database's folder instead of rows, asked the same questions.
    let files: StepFiles?

    init(_ name: String, numberedVersion: Int?, blobKeys: String? = nil, activity: String? = nil, forgetDocument: String? = nil,
         forgetInCopies: String? = nil, keptFiles: String? = nil, unfinishedWork: (query: String, description: String)? = nil,
         files: StepFiles? = nil, migrate: @escaping @Sendable (SQLiteConnection) throws -> Void) {
        (self.name, self.numberedVersion, self.blobKeys, self.activity, self.forgetDocument, self.migrate) =
            (name, numberedVersion, blobKeys, activity, forgetDocument, migrate)
        (self.forgetInCopies, self.keptFiles, self.unfinishedWork, self.files) = (forgetInCopies, keptFiles, unfinishedWork, files)
    }

    init(_ name: String, numberedVersion: Int?, blobKeys: String? = nil, activity: String? = nil, forgetDocument: String? = nil,
         forgetInCopies: String? = nil, keptFiles: String? = nil, unfinishedWork: (query: String, description: String)? = nil,
         files: StepFiles? = nil, sql: String) {
        self.init(name, numberedVersion: numberedVersion, blobKeys: blobKeys, activity: activity, forgetDocument: forgetDocument,
                  forgetInCopies: forgetInCopies, keptFiles: keptFiles, unfinishedWork: unfinishedWork, files: files) {
            try $0.execute(sql)
        }
    }

    package static func == (lhs: SchemaStep, rhs: SchemaStep) -> Bool { lhs.name == rhs.name }
    package func hash(into hasher: inout Hasher) { hasher.combine(name) }
}

/// What a step keeps in files in the database's folder rather than in rows (the mount's staging
/// logs, `StagingLogFiles`): the questions its row hooks answer, asked of the folder `folder`,
/// so compaction, automatic compaction and `sofa encrypt` ask them of every step alike.
package struct StepFiles: Sendable {
    /// The blob keys (hex) the files hold (as `SchemaStep.blobKeys`).
    let blobKeys: @Sendable (_ folder: String) throws -> Set<String>
    /// Changes whenever the files do (as `SchemaStep.activity`).
    let activity: @Sendable (_ folder: String) throws -> [Int64]
    /// Whether the files hold a stopped mount's unfinished work, and what it is (as
    /// `SchemaStep.unfinishedWork`).
    let unfinishedWork: (holds: @Sendable (_ folder: String) throws -> Bool, description: String)
}

/// The steps a file has: all of `Schema.steps` once opened for writing; a read-only file keeps
/// what it was made with (a read-only version 1 file has no `body_digests`).
package struct AppliedSchema: Sendable {
    let names: Set<String>

    package func has(_ step: SchemaStep) -> Bool { names.contains(step.name) }

    /// The applied steps' statements forgetting a purged document's rows.
    var forgetDocumentStatements: [String] { applied.compactMap(\.forgetDocument) }

    /// The applied steps' statements a copy runs (`SchemaStep.forgetInCopies`).
    var forgetInCopiesStatements: [String] { applied.compactMap(\.forgetInCopies) }

    /// The blob keys (hex) the applied steps' rows hold (`SchemaStep.blobKeys`) and their files
    /// in the database folder `folder` (`StepFiles.blobKeys`).
    func heldBlobKeys(in connection: SQLiteConnection, folder: String) throws -> Set<String> {
        var keys = Set<String>()
        for query in applied.compactMap(\.blobKeys) { keys.formUnion(try connection.query(query) { $0.text(0) }) }
        for files in applied.compactMap(\.files) { keys.formUnion(try files.blobKeys(folder)) }
        return keys
    }

    /// The kept files the applied steps' rows name (`SchemaStep.keptFiles`).
    func keptFiles(in connection: SQLiteConnection) throws -> Set<String> {
        var files = Set<String>()
        for query in applied.compactMap(\.keptFiles) { files.formUnion(try connection.query(query) { $0.text(0) }) }
        return files
    }

    /// What the applied steps' rows and files in `folder` hold of a stopped mount's unfinished
    /// work (`SchemaStep.unfinishedWork`, `StepFiles.unfinishedWork`): the descriptions of those
    /// that hold some.
    func unfinishedWork(in connection: SQLiteConnection, folder: String) throws -> [String] {
        let rows = try applied.compactMap(\.unfinishedWork).filter { work in
            try connection.query(work.query) { $0.bool(0) }.first ?? false
        }.map(\.description)
        return try rows + applied.compactMap(\.files?.unfinishedWork).filter { try $0.holds(folder) }.map(\.description)
    }

    /// The applied steps' activity rows and their files' marks, one after another
    /// (`SchemaStep.activity`, `StepFiles.activity`).
    func activity(in connection: SQLiteConnection, folder: String) throws -> [Int64] {
        let rows = try applied.compactMap(\.activity).flatMap { query in
            try connection.query(query) { row in (0..<row.columnCount).map { row.int64($0) } }.first ?? []
        }
        return try rows + applied.compactMap(\.files).flatMap { try $0.activity(folder) }
    }

    private var applied: [SchemaStep] { Schema.steps.filter(has) }
}

/// Applies `Schema.steps` to a file and says which it has.
enum SchemaMigrator {
    /// The table naming the steps a file has had. A file without it is from before steps had
    /// names: its `user_version` says which it has.
    static let table = "schema_steps"
    /// The last numbered version, which `user_version` stays at: a Sofa from before named steps
    /// opens a file of this one, and one that knows names reads `schema_steps`.
    static let lastNumberedVersion = 8

    /// What `migrate` did: the steps the file has now, and those it got just now (for the work
    /// that follows a step: digests worked out again, indexes built from design documents).
    struct Outcome {
        let schema: AppliedSchema
        let added: Set<String>
    }

    /// The steps a file has, read without writing.
    static func applied(_ connection: SQLiteConnection, path: String) throws -> (names: Set<String>, named: Bool) {
        let userVersion = try connection.query("PRAGMA user_version") { $0.int(0) }[0]
        guard (1...lastNumberedVersion).contains(userVersion) else {
            throw SofaError.notADatabase(path: path, reason: userVersion == 0
                ? "\(Database.databaseFileName) holds no Sofa schema"
                : "schema version \(userVersion) is not supported (expected \(lastNumberedVersion))")
        }
        let hasTable = try connection.query("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?", .text(table)) {
            $0.int(0)
        }[0] > 0
        guard hasTable else {
            return (Set(Schema.steps.filter { ($0.numberedVersion ?? .max) <= userVersion }.map(\.name)), false)
        }
        return (Set(try connection.query("SELECT name FROM \(table)") { $0.text(0) }), true)
    }

    /// Brings a writable file up to every step of `Schema.steps`, in one transaction, and
    /// refuses a file with steps this Sofa does not know (a newer one made them: its
    /// invariants are not this one's to keep). Read-only, it only reads. `creating` a new file,
    /// every step runs and `finish` writes what else it needs, in the same transaction.
    static func migrate(_ connection: SQLiteConnection, path: String, readOnly: Bool, creating: Bool = false,
                        finish: () throws -> Void = {}) throws -> Outcome {
        let (found, named) = creating ? ([], true) : try applied(connection, path: path)
        let unknown = found.subtracting(Schema.steps.map(\.name))
        if readOnly { return Outcome(schema: AppliedSchema(names: found), added: []) }
        guard unknown.isEmpty else {
            throw SofaError.notADatabase(path: path, reason: "a newer Sofa changed its schema (\(unknown.sorted().joined(separator: ", "))): "
                + "open it with that Sofa, or read-only")
        }
        let all = Set(Schema.steps.map(\.name))
        guard creating || !named || found != all else { return Outcome(schema: AppliedSchema(names: all), added: []) }
        try connection.execute("BEGIN IMMEDIATE")
        do {
            // Read again under the lock: another process may have just done it.
            let (before, namedNow) = creating ? ([], true) : try applied(connection, path: path)
            try connection.execute("CREATE TABLE IF NOT EXISTS \(table) (name TEXT PRIMARY KEY, applied_at REAL NOT NULL) WITHOUT ROWID")
            for step in Schema.steps where !(namedNow && before.contains(step.name)) {
                // A file without names runs every step (each is idempotent): one at the last
                // numbered version may still lack a table a step added to it later.
                try step.migrate(connection)
                try connection.run("INSERT OR IGNORE INTO \(table) (name, applied_at) VALUES (?, ?)",
                                   .text(step.name), .real(Date().timeIntervalSince1970))
            }
            try connection.execute("PRAGMA user_version = \(lastNumberedVersion)")
            try finish()
            try connection.execute("COMMIT")
            return Outcome(schema: AppliedSchema(names: all), added: all.subtracting(before))
        } catch {
            try? connection.execute("ROLLBACK")  // the error thrown below is the one that matters
            throw error
        }
    }
}
