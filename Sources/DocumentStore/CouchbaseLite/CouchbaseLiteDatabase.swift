import DocumentModel
import Foundation

/// A Couchbase Lite 3 database (`NAME.cblite2/`, LiteCore 3.x with revision trees), read in
/// place: `db.sqlite3` opened read-only with SQLite's usual locks, so an app that has it open
/// meanwhile goes on writing and every read sees one committed state.
///
/// What LiteCore keeps there: documents of the default collection in `kv_default`
/// (`key`, `sequence`, `flags`, `version` — the current revision id in binary —, `body` — its
/// Fleece —, `extra` — the revision tree), deleted ones in `kv_del_default`; the shared keys
/// Fleece dictionaries name by number in `kv_info`'s `SharedKeys`; blobs in
/// `Attachments/<base64 of the SHA-1, '/' as '_'>.blob`. Other collections are tables
/// `kv_.<scope>.<name>`; only the default one is read.
public final class CouchbaseLiteDatabase {
    public let path: String
    let connection: SQLiteConnection
    /// The shared keys as last read or written.
    public internal(set) var sharedKeys: [String]
    /// Opened for writing (`open(at:writable:)`, `create(at:)`).
    public let writable: Bool

    /// `kv_default`'s `flags`: LiteCore's document flags.
    public struct DocumentFlags: OptionSet, Sendable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }
        public static let deleted = DocumentFlags(rawValue: 0x01)
        public static let conflicted = DocumentFlags(rawValue: 0x02)
        public static let hasAttachments = DocumentFlags(rawValue: 0x04)
    }

    /// Whether `path` is a Couchbase Lite database: a `.cblite2` folder, or a folder whose
    /// `db.sqlite3` has LiteCore's tables.
    public static func isCouchbaseLite(at path: String) -> Bool {
        var trimmed = path
        while trimmed.count > 1, trimmed.hasSuffix("/") { trimmed.removeLast() }
        if trimmed.lowercased().hasSuffix(".cblite2") { return true }
        let file = "\(trimmed)/db.sqlite3"
        guard access(file, R_OK) == 0, let connection = try? SQLiteConnection(path: file, create: false, readOnly: true) else { return false }
        return (try? connection.query("SELECT 1 FROM sqlite_master WHERE name = 'kv_info'") { $0.int(0) })?.isEmpty == false
    }

    /// Opens the database at `path` for reading. A folder that is no Couchbase Lite 3
    /// database, an encrypted one (Enterprise Edition), one of Couchbase Lite 2 (not upgraded)
    /// or 4 (version vectors) is refused by name.
    /// `writable`: for writing too, which is refused for a database with query indexes (an
    /// app's, kept by LiteCore's own SQL functions).
    public static func open(at path: String, writable: Bool = false) throws -> CouchbaseLiteDatabase {
        var trimmed = path
        while trimmed.count > 1, trimmed.hasSuffix("/") { trimmed.removeLast() }
        let file = "\(trimmed)/db.sqlite3"
        var info = stat()
        guard stat(trimmed, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw SofaError.notADatabase(path: trimmed, reason: "no such Couchbase Lite database (a NAME.cblite2 folder)")
        }
        let fd = Foundation.open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw SofaError.notADatabase(path: trimmed, reason: "it has no db.sqlite3 (\(String(cString: strerror(errno))))")
        }
        var header = [UInt8](repeating: 0, count: 16)
        let count = read(fd, &header, 16)
        close(fd)
        guard count == 16, header == Array("SQLite format 3\0".utf8) else {
            throw SofaError.notADatabase(path: trimmed, reason: count == 0 ? "its db.sqlite3 is empty"
                : "its db.sqlite3 is not an SQLite file: an encrypted Couchbase Lite database (Enterprise Edition), which Sofa cannot open")
        }
        let connection = try SQLiteConnection(path: file, create: false, readOnly: !writable)
        let tables = Set(try connection.query("SELECT name FROM sqlite_master WHERE type = 'table'") { $0.text(0) })
        guard tables.contains("kv_info"), tables.contains("kv_default") else {
            throw SofaError.notADatabase(path: trimmed, reason: "its db.sqlite3 has no Couchbase Lite tables (kv_default, kv_info)")
        }
        let database = try CouchbaseLiteDatabase(path: trimmed, connection: connection,
                                             sharedKeys: try Self.sharedKeys(connection, path: trimmed), writable: writable)
        try database.checkVersioning()
        if writable, case let indexes = try database.queryIndexes, !indexes.isEmpty {
            throw SofaError.invalidArgument("""
                \(trimmed) has query indexes (\(indexes.prefix(3).joined(separator: ", "))\(indexes.count > 3 ? ", …" : "")), which Couchbase Lite \
                keeps with its own SQL functions and Sofa cannot: Sofa reads it but does not write it
                """)
        }
        return database
    }

    private let hasDeletedTable: Bool

    private init(path: String, connection: SQLiteConnection, sharedKeys: [String], writable: Bool) throws {
        self.path = path
        self.connection = connection
        self.sharedKeys = sharedKeys
        self.writable = writable
        hasDeletedTable = try !connection.query("SELECT 1 FROM sqlite_master WHERE name = 'kv_del_default'") { $0.int(0) }.isEmpty
    }

    static func sharedKeys(_ connection: SQLiteConnection, path: String) throws -> [String] {
        guard let body = try connection.query("SELECT body FROM kv_info WHERE key = 'SharedKeys'", row: { $0.blob(0) }).first,
              !body.isEmpty else { return [] }
        let value: JSONValue
        do { value = try FleeceReader.decode(body) } catch {
            throw SofaError.notADatabase(path: path, reason: "its shared keys are \(error)")
        }
        guard let keys = value.arrayValue?.compactMap(\.stringValue), keys.count == value.arrayValue?.count else {
            throw SofaError.notADatabase(path: path, reason: "its shared keys are not a list of strings")
        }
        return keys
    }

    /// Couchbase Lite 3 keeps revision trees (`versioning` 1); 2.x bodies are revision trees
    /// themselves, 4.x keeps version vectors.
    private func checkVersioning() throws {
        let raw = try connection.query("SELECT body FROM kv_info WHERE key = 'versioning'") { $0.blob(0) }.first ?? []
        let versioning = raw.reduce(0) { $0 << 8 | Int($1) }
        switch versioning {
        case 1: return
        case 2, 3:
            throw SofaError.notADatabase(path: path, reason: "it keeps version vectors (Couchbase Lite 4), which Sofa does not read yet")
        default:
            throw SofaError.notADatabase(path: path, reason: raw.isEmpty
                ? "it is a Couchbase Lite 2 database: open it once with Couchbase Lite 3 (or `cblite --upgrade`), which upgrades it"
                : "its versioning \(versioning) is not Couchbase Lite 3's")
        }
    }

    // MARK: - What it holds

    public struct Info: Sendable {
        public let publicUUID: String
        public let privateUUID: String
        public let documentCount: Int
        public let deletedCount: Int
        public let lastSequence: Int64
        /// Collections besides the default one (`scope.name`), which Sofa does not read.
        public let otherCollections: [String]
        public let blobCount: Int
        public let blobBytes: Int64
    }

    /// The query indexes an app made (value, full-text, vector): expressions over LiteCore's own
    /// SQL functions, full-text ones kept by triggers. A row Sofa wrote could not be indexed,
    /// so a database with any is read only here.
    public var queryIndexes: [String] {
        get throws {
            let call = try NSRegularExpression(pattern: "[A-Za-z_][A-Za-z0-9_]*\\(")
            return try connection.query("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND type IN ('trigger', 'index')") { row in
                (row.text(0), row.text(1), row.text(2))
            }.compactMap { type, name, sql in
                if type == "trigger" { return name }
                // LiteCore's own indexes are on columns (sequence, flags, expiration); an app's call
                // its functions (`array_of(`, `fl_value(`) after the table's name.
                guard let on = sql.range(of: " ON "), let open = sql[on.upperBound...].firstIndex(of: "(") else { return nil }
                let columns = String(sql[sql.index(after: open)...])
                return call.firstMatch(in: columns, range: NSRange(columns.startIndex..., in: columns)) == nil ? nil : name
            }
        }
    }

    /// Follows the database at `path` for commits of other processes (an app, `cblite`):
    /// inotify on its folder, and its last sequence read once the files were written
    /// (`ForeignCommits`, as Sofa's own databases are followed). `onChange` runs on the watching
    /// thread. Nil when inotify or the database cannot be opened (look at it yourself).
    public static func watch(_ path: String, onChange: @escaping @Sendable () -> Void) -> Watch? {
        guard let reader = try? open(at: path) else { return nil }
        var seen = try? reader.lastSequence
        guard let commits = ForeignCommits(directory: reader.path, names: ["db.sqlite3", "db.sqlite3-wal"], changed: {
            // A read that fails counts as a change: the pass it starts says what is wrong.
            let now = try? reader.lastSequence
            defer { seen = now }
            return now == nil || now != seen
        }, publish: onChange) else { return nil }
        return Watch(commits)
    }

    /// A running `watch`; `stop()` ends it.
    public final class Watch: Sendable {
        private let commits: ForeignCommits
        init(_ commits: ForeignCommits) { self.commits = commits }
        public func stop() { commits.stop() }
    }

    /// The default collection's last sequence.
    public var lastSequence: Int64 {
        get throws { try connection.query("SELECT lastSeq FROM kvmeta WHERE name = 'default'") { $0.int64(0) }.first ?? 0 }
    }

    /// Its private UUID (one indexed read): what tells this file from another put in its place.
    public var privateUUID: String { get throws { try uuid("privateUUID") } }

    private func uuid(_ key: String) throws -> String {
        BlobKey.hexString(try connection.query("SELECT body FROM kv_info WHERE key = ?", .text(key)) { $0.blob(0) }.first ?? [])
    }

    public func info() throws -> Info {
        let tables = try connection.query("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'kv\\_.%' ESCAPE '\\'") {
            String($0.text(0).dropFirst(4))
        }
        var blobCount = 0
        var blobBytes: Int64 = 0
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "\(path)/Attachments")) ?? [] where name.hasSuffix(".blob") {
            var info = stat()
            if stat("\(path)/Attachments/\(name)", &info) == 0 { blobCount += 1; blobBytes += Int64(info.st_size) }
        }
        return Info(publicUUID: try uuid("publicUUID"), privateUUID: try uuid("privateUUID"),
                    documentCount: try connection.query("SELECT count(*) FROM kv_default") { $0.int(0) }[0],
                    deletedCount: hasDeletedTable ? try connection.query("SELECT count(*) FROM kv_del_default") { $0.int(0) }[0] : 0,
                    lastSequence: try lastSequence,
                    otherCollections: tables.sorted(), blobCount: blobCount, blobBytes: blobBytes)
    }

    /// One document's current state, as its row says.
    public struct Document: Sendable {
        public let id: String
        public let sequence: Int64
        public let flags: DocumentFlags
        public let revID: RevisionID
        /// The current revision's Fleece body.
        let body: [UInt8]
        let extra: [UInt8]
        public var deleted: Bool { flags.contains(.deleted) }
    }

    /// The tables a document may be in: live documents, then deleted ones (LiteCore 3.1 and
    /// later keep those apart).
    private var documentTables: [String] { hasDeletedTable ? ["kv_default", "kv_del_default"] : ["kv_default"] }

    public func document(_ id: String) throws -> Document? {
        for table in documentTables {
            let rows = try connection.query("SELECT sequence, flags, version, body, extra FROM \(table) WHERE key = ?", .text(id)) { row in
                (row.int64(0), row.int(1), row.blob(2), row.blob(3), row.blob(4))
            }
            if let (sequence, flags, version, body, extra) = rows.first {
                return Document(id: id, sequence: sequence, flags: DocumentFlags(rawValue: flags),
                                revID: try LiteCoreRevisionTree.revisionID(version, docID: id), body: body, extra: extra)
            }
        }
        return nil
    }

    /// Document ids in order; deleted ones too with `deleted`.
    public func documentIDs(deleted: Bool = false) throws -> [String] {
        try (deleted ? documentTables : ["kv_default"]).flatMap { table in
            try connection.query("SELECT key FROM \(table)") { $0.text(0) }
        }.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
    }

    /// Every document with its sequence, in sequence order (live and deleted).
    public func sequences(after since: Int64) throws -> [(sequence: Int64, id: String)] {
        try documentTables.flatMap { table in
            try connection.query("SELECT sequence, key FROM \(table) WHERE sequence > ?", .integer(since)) { ($0.int64(0), $0.text(1)) }
        }.sorted { $0.0 < $1.0 }
    }

    /// The document's revision tree. A document without one (never edited since an import) is
    /// its one current revision.
    public func revisionTree(of document: Document) throws -> LiteCoreRevisionTree {
        guard !document.extra.isEmpty else {
            let flags = LiteCoreRevisionTree.leaf | (document.deleted ? LiteCoreRevisionTree.deleted : 0)
            return LiteCoreRevisionTree(revisions: [.init(id: document.revID, parent: nil, flags: flags, sequence: document.sequence, body: nil)])
        }
        return try LiteCoreRevisionTree(decoding: document.extra, docID: document.id)
    }

    /// A revision's properties as JSON (with `_attachments` when it has them), and whether it
    /// is deleted; nil when the tree has it without a body (an ancestor LiteCore pruned).
    public func body(of revision: RevisionID, in document: Document, tree: LiteCoreRevisionTree) throws -> (properties: JSONObject, deleted: Bool)? {
        let fleece: [UInt8]
        let deleted: Bool
        if revision == document.revID {
            (fleece, deleted) = (document.body, document.deleted)
        } else {
            guard let index = tree.index(of: revision) else { return nil }
            let kept = tree.revisions[index]
            // A tombstone needs no body: LiteCore may keep none for one that is not current.
            guard let body = kept.body ?? (kept.deleted ? [] : nil) else { return nil }
            (fleece, deleted) = (body, kept.deleted)
        }
        guard !fleece.isEmpty else { return (JSONObject(), deleted) }
        let value: JSONValue
        do { value = try FleeceReader.decode(fleece, sharedKeys: sharedKeys) } catch {
            throw SofaError.invalidDocument(reason: "\(document.id) (\(revision)) in \(path): its body is \(error)")
        }
        guard let object = value.objectValue else {
            throw SofaError.invalidDocument(reason: "\(document.id) (\(revision)) in \(path): its body is \(value.kindName), not an object")
        }
        return (object, deleted)
    }

    /// The file holding the blob with SHA-1 `key`, whether or not it exists.
    public func blobPath(_ key: BlobKey) -> String {
        let name = Data(key.digestBytes).base64EncodedString().replacingOccurrences(of: "/", with: "_")
        return "\(path)/Attachments/\(name).blob"
    }
}

extension CouchbaseLiteDatabase {
    /// A document's revision tree in Sofa's model; `documentNotFound` when it is not here.
    public func revisionTree(of id: String) throws -> RevisionTree {
        guard let document = try document(id) else { throw SofaError.documentNotFound(id) }
        return try revisionTree(of: document).tree
    }

    /// The revision Couchbase Lite shows as current.
    public func currentRevision(of id: String) throws -> RevisionID {
        guard let document = try document(id) else { throw SofaError.documentNotFound(id) }
        return document.revID
    }

    /// A revision (the current one without `rev`) as CouchDB shows a document: `_id`, `_rev`,
    /// `_deleted` when deleted, and the properties (`_attachments` as Couchbase Lite keeps it);
    /// with the document's conflicts: its live leaves other than Couchbase Lite's current
    /// revision (which stays its own until the app resolves them, whatever CouchDB's rule says).
    public func couchJSON(of id: String, rev: RevisionID? = nil) throws -> (document: JSONObject, conflicts: [RevisionID]) {
        guard let document = try document(id) else { throw SofaError.documentNotFound(id) }
        let tree = try revisionTree(of: document)
        let wanted = rev ?? document.revID
        guard tree.index(of: wanted) != nil else { throw SofaError.revisionNotFound(docID: id, revID: wanted.description) }
        guard let (properties, deleted) = try body(of: wanted, in: document, tree: tree) else {
            throw SofaError.invalidArgument("\(path) keeps no body of \(id) \(wanted) (Couchbase Lite keeps the bodies of leaves only)")
        }
        var object: JSONObject = ["_id": .string(id), "_rev": .string(wanted.description)]
        if deleted { object["_deleted"] = true }
        for (key, value) in properties where key != "_id" && key != "_rev" { object[key] = value }
        return (object, tree.tree.leaves.filter { !$0.deleted && $0.id != document.revID }.map(\.id))
    }
}
