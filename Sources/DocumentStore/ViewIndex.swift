import DocumentModel
import Foundation
import QueryServer

/// A design document's map/reduce views, as CouchDB defines them: `views.NAME.map` (and
/// `reduce`), `views.lib` for `require`, `language` (JavaScript), `options.include_design`.
public struct ViewDefinition: Sendable {
    public struct View: Sendable {
        public let name: String
        public let map: String
        public let reduce: String?
    }

    public let designID: String
    public let views: [View]
    let library: JSONValue
    let includeDesign: Bool
    /// What the index depends on: the rows are made again when it changes.
    public let signature: String

    /// The views of `_design/…` `designID` with the properties `body`; nil when it has none.
    public init?(designID: String, body: JSONObject) {
        guard case .object(let views)? = body["views"] else { return nil }
        var found: [View] = []
        for (name, value) in views where name != "lib" {
            guard let map = value["map"]?.stringValue else { continue }
            found.append(View(name: name, map: map, reduce: value["reduce"]?.stringValue))
        }
        found.sort { $0.name < $1.name }
        self.designID = designID
        self.views = found
        library = views["lib"] ?? .object([:])
        includeDesign = body["options"]?["include_design"]?.boolValue ?? false
        // `format`: how rows are laid out (2: a document's rows of one key by value); a change rebuilds.
        let signed: JSONValue = ["format": 2, "language": body["language"] ?? "javascript", "views": .object(views),
                                 "include_design": .bool(includeDesign)]
        signature = BlobKey.hexString(MessageDigest.hash(.md5, signed.serialized(.canonical)))
    }

    public func view(named name: String) -> View? { views.first { $0.name == name } }
    public func position(of name: String) -> Int? { views.firstIndex { $0.name == name } }
}

/// One row of a view: what a map function emitted for a document.
public struct ViewRow: Sendable {
    public let key: JSONValue
    public let docID: String
    public let value: JSONValue
}

/// Where a view query starts and ends, in CouchDB's terms (already in the query's direction).
public struct ViewRange: Sendable {
    public var startKey: JSONValue?
    public var startDocID: String?
    public var endKey: JSONValue?
    public var endDocID: String?
    public var inclusiveEnd = true
    public var descending = false

    public init() {}

    /// The rows of one key, in `descending` order of document id.
    public static func key(_ key: JSONValue, descending: Bool) -> ViewRange {
        var range = ViewRange()
        range.startKey = key
        range.endKey = key
        range.descending = descending
        return range
    }
}

/// Views' indexes: rows in SQLite (`view_indexes`, `view_rows`), keyed by CouchDB's collation
/// (`Collation.key`) then the document id's bytes, as CouchDB orders them; brought up to date
/// from the database's sequence when queried (`update`), by the JavaScript query server's
/// `map_doc`; made again from nothing when the design document's views change. Readers share
/// them; one updater at a time per design document (others wait for it, then find nothing to do).
extension Database {
    static let viewTables = """
        CREATE TABLE IF NOT EXISTS view_indexes (
            index_id INTEGER PRIMARY KEY,
            ddoc TEXT NOT NULL UNIQUE,
            signature TEXT NOT NULL,
            update_seq INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS view_rows (
            index_id INTEGER NOT NULL,
            view INTEGER NOT NULL,
            key BLOB NOT NULL,
            doc_id TEXT NOT NULL,
            emit INTEGER NOT NULL,
            key_json TEXT NOT NULL,
            value_json TEXT NOT NULL,
            PRIMARY KEY (index_id, view, key, doc_id, emit)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS view_rows_by_doc ON view_rows (index_id, doc_id);
        """

    /// The views of the live design document `designID` (`_design/…`); nil when it is missing
    /// or deleted, or defines no views.
    public func viewDefinition(_ designID: String) throws -> ViewDefinition? {
        guard let revision = try document(withID: designID) else { return nil }
        return ViewDefinition(designID: designID, body: revision.properties)
    }

    /// Brings the index of `definition` up to the database's current sequence; returns its
    /// id and the sequence it reflects.
    /// A database on a read-only medium (a pre-built one shipped with an application) answers
    /// from the index it was shipped with, and cannot build one it lacks.
    @discardableResult
    public func updateViewIndex(_ definition: ViewDefinition) throws -> (id: Int64, sequence: Int64) {
        // An index that is current is answered from a read: no write lock for a query.
        if let state = try viewIndexState(definition), try isReadOnly || state.sequence >= lastSequence { return state }
        if isReadOnly { throw SofaError.readOnlyFileSystem(path: path) }
        let lock = viewLocks.withLock { locks in
            if let lock = locks[definition.designID] { return lock }
            let lock = NSLock()
            locks[definition.designID] = lock
            return lock
        }
        return try lock.withLock {
            var (indexID, sequence) = try write { connection -> (Int64, Int64) in
                try connection.execute(Database.viewTables)
                let found = try connection.query("SELECT index_id, signature, update_seq FROM view_indexes WHERE ddoc = ?",
                                                 .text(definition.designID)) { ($0.int64(0), $0.text(1), $0.int64(2)) }.first
                if let found, found.1 == definition.signature { return (found.0, found.2) }
                if let found {
                    try connection.run("DELETE FROM view_rows WHERE index_id = ?", .integer(found.0))
                    try connection.run("UPDATE view_indexes SET signature = ?, update_seq = 0 WHERE index_id = ?",
                                       .text(definition.signature), .integer(found.0))
                    return (found.0, 0)
                }
                try connection.run("INSERT INTO view_indexes (ddoc, signature, update_seq) VALUES (?, ?, 0)",
                                   .text(definition.designID), .text(definition.signature))
                return (try connection.query("SELECT last_insert_rowid()") { $0.int64(0) }[0], 0)
            }
            guard try lastSequence > sequence else { return (indexID, sequence) }
            // The batches' documents, answers and rows are freed by now: give the memory back.
            defer { ReturnedMemory.trim() }
            try QueryServerPool.shared.withProcess { process in
                let timeout = QueryServerPool.shared.timeout
                do {
                    _ = try process.call(["reset", [:]], timeout: timeout)
                    _ = try process.call(["add_lib", definition.library], timeout: timeout)
                    for view in definition.views { _ = try process.call(["add_fun", .string(view.map)], timeout: timeout) }
                    while true {
                        let batch = try read { try self.mapBatch(after: sequence, in: $0) }
                        guard let last = batch.last else { break }
                        var rows: [(docID: String, emitted: [[(key: JSONValue, value: JSONValue)]])] = []
                        var commands: [[UInt8]] = []
                        var mapped: [Int] = []  // the batch's entries that were sent, in order
                        for (index, entry) in batch.enumerated() {
                            guard let document = entry.document, definition.includeDesign || !DocumentID.isDesign(entry.docID) else { continue }
                            commands.append(Array(#"["map_doc","#.utf8) + document + [UInt8(ascii: "]")])
                            mapped.append(index)
                        }
                        var answers = [JSONValue?](repeating: nil, count: batch.count)
                        for (index, answer) in zip(mapped, try process.callPipelined(commands, timeout: timeout)) { answers[index] = answer }
                        for (entry, answer) in zip(batch, answers) {
                            let perView = (answer?.arrayValue ?? []).map { emitted in
                                (emitted.arrayValue ?? []).compactMap { pair -> (key: JSONValue, value: JSONValue)? in
                                    guard case .array(let parts) = pair, parts.count == 2 else { return nil }
                                    return (parts[0], parts[1])
                                }
                            }
                            rows.append((entry.docID, perView))
                        }
                        let fresh = sequence == 0  // nothing to remove from an index being built from nothing
                        let moved = try write { connection -> Bool in
                            let stored = try connection.query("SELECT update_seq FROM view_indexes WHERE index_id = ?", .integer(indexID)) {
                                $0.int64(0)
                            }.first
                            guard stored == sequence else { return true }  // another process moved it: read again
                            for (docID, perView) in rows {
                                if !fresh {
                                    try connection.run("DELETE FROM view_rows WHERE index_id = ? AND doc_id = ?", .integer(indexID), .text(docID))
                                }
                                for (view, emitted) in perView.enumerated() {
                                    // One document's rows of one key are in CouchDB's order: by
                                    // value, as Erlang orders terms, in either direction.
                                    let ordered = emitted.map { (collation: Collation.key($0.key), row: $0) }.enumerated().sorted { a, b in
                                        if a.element.collation != b.element.collation { return a.element.collation.lexicographicallyPrecedes(b.element.collation) }
                                        if a.element.row.value.erlangTermPrecedes(b.element.row.value) { return true }
                                        if b.element.row.value.erlangTermPrecedes(a.element.row.value) { return false }
                                        return a.offset < b.offset
                                    }.map(\.element)
                                    for (emit, (collation, row)) in ordered.enumerated() {
                                        try connection.run("""
                                            INSERT OR REPLACE INTO view_rows (index_id, view, key, doc_id, emit, key_json, value_json)
                                            VALUES (?, ?, ?, ?, ?, ?, ?)
                                            """, .integer(indexID), SQLValue(view), .blob(collation), .text(docID),
                                            SQLValue(emit), .text(row.key.jsonString()), .text(row.value.jsonString()))
                                    }
                                }
                            }
                            try connection.run("UPDATE view_indexes SET update_seq = ? WHERE index_id = ?", .integer(last.sequence), .integer(indexID))
                            return false
                        }
                        if moved {
                            let now = try read { connection in
                                try connection.query("SELECT index_id, update_seq FROM view_indexes WHERE ddoc = ?",
                                                     .text(definition.designID)) { ($0.int64(0), $0.int64(1)) }.first
                            }
                            guard let now else { break }
                            (indexID, sequence) = now
                        } else {
                            sequence = last.sequence
                        }
                    }
                } catch let error as QueryServerError {
                    // The process's map functions are this index's: it must not serve another caller's.
                    process.stop()
                    switch error {
                    case .function(let name, let reason): throw SofaError.designFunctionFailed(error: name, reason: reason)
                    default: throw SofaError.designFunctionFailed(error: "os_process_error", reason: "\(definition.designID): \(error)")
                    }
                }
                // Leave the process as a validator or filter expects it: no map functions loaded.
                _ = try? process.call(["reset", [:]], timeout: timeout)  // a failure stops the process; the next caller starts one
            }
            return (indexID, sequence)
        }
    }

    /// The next changes after `sequence` with each live document as a map function gets it
    /// (`_id`, `_rev`, its properties, attachment stubs), as JSON text spliced from the stored
    /// body: a document is neither parsed nor written again on its way to the query server.
    /// A deleted document (or one whose body is gone) has none: its rows just go.
    private func mapBatch(after sequence: Int64, in connection: SQLiteConnection) throws
        -> [(docID: String, sequence: Int64, document: [UInt8]?)] {
        let rows = try connection.query("""
            SELECT d.doc_id, d.current_rev, d.deleted, d.sequence, r.body, d.doc_key,
                   EXISTS (SELECT 1 FROM rev_attachments a WHERE a.doc_key = d.doc_key AND a.rev_id = d.current_rev)
            FROM docs d LEFT JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev
            WHERE d.sequence > ? ORDER BY d.sequence LIMIT ?
            """, .integer(sequence), SQLValue(ViewTuning.updateBatch)) { row in
            (docID: row.text(0), rev: row.text(1), deleted: row.bool(2), sequence: row.int64(3),
             body: row.isNull(4) ? nil : row.bytes(4), docKey: row.int64(5), hasAttachments: row.bool(6))
        }
        return try rows.map { row in
            guard !row.deleted, var body = row.body, body.first == UInt8(ascii: "{"), body.last == UInt8(ascii: "}") else {
                return (row.docID, row.sequence, nil)
            }
            var document = Array("{\"_id\":".utf8) + JSONValue.string(row.docID).serialized()
                + Array(",\"_rev\":".utf8) + JSONValue.string(row.rev).serialized()
            // The properties without their braces (nothing for `{}`), then the stubs.
            body.removeFirst()
            body.removeLast()
            if !body.isEmpty { document += [UInt8(ascii: ",")] + body }
            if row.hasAttachments {
                let attachments = try loadAttachments(docKey: row.docKey, revID: try Database.revisionID(row.rev), in: connection, blobs: blobs)
                document += Array(",\"_attachments\":".utf8)
                    + JSONValue.object(JSONObject(attachments.map { ($0.name, .object(CouchFormat.stub($0))) })).serialized()
            }
            document.append(UInt8(ascii: "}"))
            return (row.docID, row.sequence, document)
        }
    }

    /// CouchDB's check of a design document's views as it is written: each `map` and each
    /// JavaScript `reduce` must compile (`compilation_error`, naming the view), a built-in
    /// reduce must be one CouchDB has (`invalid_design_doc`). Other languages (Mango's `query`)
    /// are not checked here.
    static func checkViews(ofDesign docID: String, properties: JSONObject) throws {
        guard DocumentID.isDesign(docID), (properties["language"]?.stringValue ?? "javascript") == "javascript",
              case .object(let views)? = properties["views"] else { return }
        var sources: [(view: String, kind: String, source: String)] = []
        for (name, value) in views where name != "lib" {
            guard case .object(let view) = value else {
                throw SofaError.invalidQuery(error: "invalid_design_doc", reason: "View \(name) must be an object")
            }
            if let map = view["map"] {
                guard let source = map.stringValue else {
                    throw SofaError.invalidQuery(error: "invalid_design_doc", reason: "View \(name) must have a string `map`")
                }
                sources.append((name, "map", source))
            }
            if let reduce = view["reduce"] {
                guard let source = reduce.stringValue else {
                    throw SofaError.invalidQuery(error: "invalid_design_doc", reason: "View \(name) must have a string `reduce`")
                }
                let trimmed = source.trimmingCharacters(in: .whitespacesAndNewlines)
                if trimmed.hasPrefix("_") {
                    guard ["_sum", "_count", "_stats", "_approx_count_distinct"].contains(trimmed) else {
                        throw SofaError.invalidQuery(error: "invalid_design_doc", reason: "`\(trimmed)` is not a supported reduce function.")
                    }
                } else {
                    sources.append((name, "reduce", source))
                }
            }
        }
        guard !sources.isEmpty else { return }
        do {
            try QueryServerPool.shared.withProcess { process in
                let timeout = QueryServerPool.shared.timeout
                defer { _ = try? process.call(["reset", [:]], timeout: timeout) }  // a failure stops the process; the next caller starts one
                _ = try process.call(["reset", [:]], timeout: timeout)
                for (view, kind, source) in sources {
                    do {
                        _ = try process.call(["add_fun", .string(source)], timeout: timeout)
                    } catch QueryServerError.function(_, let reason) {
                        throw SofaError.invalidQuery(error: "compilation_error",
                                                     reason: "Compilation of the \(kind) function in the '\(view)' view failed: \(reason)")
                    }
                }
            }
        } catch let error as QueryServerError {
            throw SofaError.designFunctionFailed(error: "os_process_error", reason: "\(docID): \(error)")
        }
    }

    /// Whether the view tables exist (made by the first view built).
    static func hasViewIndexes(_ connection: SQLiteConnection) throws -> Bool {
        try connection.query("SELECT count(*) FROM sqlite_master WHERE name = 'view_indexes'", row: { $0.int(0) })[0] > 0
    }

    /// Removes a purged document's rows from every view index: no change is left to tell
    /// an index's update that it went.
    static func forgetInViews(_ docID: String, in connection: SQLiteConnection) throws {
        guard try Database.hasViewIndexes(connection) else { return }
        try connection.run("DELETE FROM view_rows WHERE index_id IN (SELECT index_id FROM view_indexes) AND doc_id = ?", .text(docID))
    }

    /// The index's state without updating it: its id and sequence, or nil when it was never built
    /// or its design document changed since.
    public func viewIndexState(_ definition: ViewDefinition) throws -> (id: Int64, sequence: Int64)? {
        try read { connection in
            guard try Database.hasViewIndexes(connection) else { return nil }
            return try connection.query("SELECT index_id, update_seq FROM view_indexes WHERE ddoc = ? AND signature = ?",
                                        .text(definition.designID), .text(definition.signature)) { ($0.int64(0), $0.int64(1)) }.first
        }
    }

    /// The number of rows of view `view` (its position) of index `indexID`.
    public func viewRowCount(index indexID: Int64, view: Int) throws -> Int {
        try read { try viewRanks(index: indexID, view: view, in: $0).total }
    }

    /// Rows of a view in `range`, in its direction, after skipping `skip`, at most `limit`; and
    /// the offset of the first (rows before it in that direction), unless `countingOffset` is
    /// false (a reduce needs none, and counting reads the range twice more).
    public func viewRows(index indexID: Int64, view: Int, range: ViewRange, skip: Int, limit: Int,
                         countingOffset: Bool = true) throws -> (offset: Int, rows: [ViewRow]) {
        try read { connection in
            var conditions: [String] = []
            var arguments: [SQLValue] = [.integer(indexID), SQLValue(view)]
            // (key, doc_id) against a bound, in the query's direction: `after` for the start.
            func bound(_ key: JSONValue, _ docID: String?, isStart: Bool, inclusive: Bool) {
                let forward = range.descending ? !isStart : isStart
                let op = forward ? (inclusive ? ">=" : ">") : (inclusive ? "<=" : "<")
                if let docID {
                    conditions.append("(key, doc_id) \(op) (?, ?)")
                    arguments += [.blob(Collation.key(key)), .text(docID)]
                } else {
                    // No document id: every row of that key is inside an inclusive bound, none of an exclusive one.
                    conditions.append("key \(op) ?")
                    arguments.append(.blob(Collation.key(key)))
                }
            }
            if let start = range.startKey { bound(start, range.startDocID, isStart: true, inclusive: true) }
            if let end = range.endKey { bound(end, range.endDocID, isStart: false, inclusive: range.inclusiveEnd) }
            // One document's rows of one key keep their order (`emit`: by value, as CouchDB sorts
            // them) either way: CouchDB keeps them as one entry.
            let direction = range.descending ? "DESC" : "ASC"
            let filter = conditions.isEmpty ? "" : " AND " + conditions.joined(separator: " AND ")
            let rows = try connection.query("""
                SELECT key_json, doc_id, value_json FROM view_rows WHERE index_id = ? AND view = ?\(filter)
                ORDER BY key \(direction), doc_id \(direction), emit LIMIT ? OFFSET ?
                """, arguments + [SQLValue(min(limit, Int(Int64.max))), SQLValue(skip)]) { row in
                ViewRow(key: try JSONParser.parse(row.bytes(0)), docID: row.text(1), value: try JSONParser.parse(row.bytes(2)))
            }
            guard countingOffset else { return (0, rows) }
            // The offset: rows before the range's start in this direction, plus those skipped.
            var before = 0
            if let start = range.startKey {
                let ranks = try viewRanks(index: indexID, view: view, in: connection)
                let key = Collation.key(start)
                before = range.descending
                    ? ranks.total - (try ranks.rows(before: key, range.startDocID, including: true, index: indexID, view: view, in: connection))
                    : try ranks.rows(before: key, range.startDocID, including: false, index: indexID, view: view, in: connection)
            }
            guard skip > 0 else { return (before, rows) }
            let inRange = try connection.query("SELECT count(*) FROM view_rows WHERE index_id = ? AND view = ?\(filter)", arguments) { $0.int(0) }[0]
            return (before + min(skip, inRange), rows)
        }
    }

    /// The distinct keys of a view, in CouchDB's order, from the first above the collation key
    /// `after` (nil: from the start), at most `limit`: how the mount lists a view's folder, a
    /// page at a time through the index, at any size. Keys that collate equal (1 and 1.0) are
    /// one key, shown as one of their JSON forms.
    public func viewKeys(index indexID: Int64, view: Int, after: [UInt8]?, limit: Int) throws -> [(collation: [UInt8], key: JSONValue)] {
        try read { connection in
            try connection.query("""
                SELECT key, MIN(key_json) FROM view_rows WHERE index_id = ? AND view = ? AND key > ?
                GROUP BY key ORDER BY key LIMIT ?
                """, .integer(indexID), SQLValue(view), .blob(after ?? []), SQLValue(limit)) { row in
                (row.bytes(0), try JSONParser.parse(row.bytes(1)))
            }
        }
    }

    /// The documents with rows of `key` in a view, by id, from the first after `after`, at most `limit`.
    public func viewDocuments(index indexID: Int64, view: Int, key: JSONValue, after: String?, limit: Int) throws -> [String] {
        try read { connection in
            try connection.query("""
                SELECT DISTINCT doc_id FROM view_rows WHERE index_id = ? AND view = ? AND key = ? AND doc_id > ?
                ORDER BY doc_id LIMIT ?
                """, .integer(indexID), SQLValue(view), .blob(Collation.key(key)), .text(after ?? ""), SQLValue(limit)) { $0.text(0) }
        }
    }

    /// The key of a view that collates as `key`, in the JSON form the view's folder shows it
    /// (`viewKeys`), or nil when the view has no row of it.
    public func viewKey(index indexID: Int64, view: Int, collatingAs key: JSONValue) throws -> JSONValue? {
        try read { connection in
            try connection.query("SELECT MIN(key_json) FROM view_rows WHERE index_id = ? AND view = ? AND key = ?",
                                 .integer(indexID), SQLValue(view), .blob(Collation.key(key))) { row in
                row.isNull(0) ? nil : try JSONParser.parse(row.bytes(0))
            }.first ?? nil
        }
    }

    /// Whether a view has a row of `key` (of document `docID`, when given).
    public func viewHasRow(index indexID: Int64, view: Int, key: JSONValue, docID: String? = nil) throws -> Bool {
        try read { connection in
            try connection.query("""
                SELECT EXISTS (SELECT 1 FROM view_rows WHERE index_id = ? AND view = ? AND key = ? AND (? OR doc_id = ?))
                """, .integer(indexID), SQLValue(view), .blob(Collation.key(key)), SQLValue(docID == nil), .text(docID ?? "")) { $0.bool(0) }[0]
        }
    }

    /// Drops the indexes of design documents that are gone or whose views changed
    /// (`_view_cleanup`). Returns how many were dropped.
    @discardableResult
    public func cleanUpViewIndexes() throws -> Int {
        let indexes = try read { connection -> [(Int64, String, String)] in
            guard try Database.hasViewIndexes(connection) else { return [] }
            return try connection.query("SELECT index_id, ddoc, signature FROM view_indexes") { ($0.int64(0), $0.text(1), $0.text(2)) }
        }
        var dropped = 0
        for (indexID, designID, signature) in indexes where try viewDefinition(designID)?.signature != signature {
            try write { connection in
                try connection.run("DELETE FROM view_rows WHERE index_id = ?", .integer(indexID))
                try connection.run("DELETE FROM view_indexes WHERE index_id = ?", .integer(indexID))
            }
            dropped += 1
        }
        return dropped
    }
}

/// Where a view's rows stand in its order, so that `total_rows` and `offset` cost no pass over
/// the index (a count of the rows before a key read 50,000 index entries on average in a view
/// of 100,000 rows: 12 ms a query). Every `sampleEvery`th row is kept with its rank; a count of
/// the rows before a bound starts at the last sample before it and reads at most that many
/// rows. Made once per state of the index (its sequence and the database's purge count) in one
/// pass that SQLite makes itself (a window function), and kept while the index stays so.
struct ViewRanks: Sendable {
    struct Sample: Sendable {
        let key: [UInt8]
        let docID: [UInt8]
        let emit: Int64
        let rank: Int
    }

    static let sampleEvery = 512

    /// The index's update sequence and the database's purge count when made.
    let version: [Int64]
    let total: Int
    let samples: [Sample]

    /// The rows that come before (key, docID) in ascending order (nil docID: before every row
    /// of the key), or up to it `including` it.
    func rows(before key: [UInt8], _ docID: String?, including: Bool, index indexID: Int64, view: Int,
              in connection: SQLiteConnection) throws -> Int {
        let id = docID.map { Array($0.utf8) }
        // Whether a sample lies within the bound: (key, docID) < bound, or <= with `including`.
        func within(_ sample: Sample) -> Bool {
            if sample.key != key { return sample.key.lexicographicallyPrecedes(key) }
            guard let id else { return including }
            if sample.docID != id { return sample.docID.lexicographicallyPrecedes(id) }
            return including
        }
        var low = 0, high = samples.count  // the first sample not within the bound
        while low < high {
            let middle = (low + high) / 2
            if within(samples[middle]) { low = middle + 1 } else { high = middle }
        }
        guard low > 0 else { return 0 }  // the first row is not within it: none is
        let from = samples[low - 1]
        let op = including ? "<=" : "<"
        var condition = "key \(op) ?"
        var arguments: [SQLValue] = [.integer(indexID), SQLValue(view), .blob(from.key), .text(String(decoding: from.docID, as: UTF8.self)),
                                     .integer(from.emit), .blob(key)]
        if let docID {
            condition = "(key, doc_id) \(op) (?, ?)"
            arguments.append(.text(docID))
        }
        let after = try connection.query("""
            SELECT count(*) FROM view_rows WHERE index_id = ? AND view = ? AND (key, doc_id, emit) >= (?, ?, ?) AND \(condition)
            """, arguments) { $0.int(0) }[0]
        return from.rank + after
    }
}

extension Database {
    /// The ranks of a view's rows as the index stands (see `ViewRanks`).
    func viewRanks(index indexID: Int64, view: Int, in connection: SQLiteConnection) throws -> ViewRanks {
        let version = try connection.query("""
            SELECT update_seq, (SELECT value FROM meta WHERE key = 'purge_seq') FROM view_indexes WHERE index_id = ?
            """, .integer(indexID)) { [$0.int64(0), $0.isNull(1) ? 0 : $0.int64(1)] }.first ?? []
        let key = "\(indexID)/\(view)"
        if let known = viewRankCache.withLock({ $0[key] }), known.version == version { return known }
        let total = try connection.query("SELECT count(*) FROM view_rows WHERE index_id = ? AND view = ?", .integer(indexID), SQLValue(view)) {
            $0.int(0)
        }[0]
        let samples = try connection.query("""
            SELECT key, doc_id, emit, rank FROM (
                SELECT key, doc_id, emit, row_number() OVER (ORDER BY key, doc_id, emit) - 1 AS rank
                FROM view_rows WHERE index_id = ? AND view = ?)
            WHERE rank % ? = 0 ORDER BY rank
            """, .integer(indexID), SQLValue(view), SQLValue(ViewRanks.sampleEvery)) { row in
            ViewRanks.Sample(key: row.bytes(0), docID: row.bytes(1), emit: row.int64(2), rank: row.int(3))
        }
        let ranks = ViewRanks(version: version, total: total, samples: samples)
        viewRankCache.withLock { cache in
            if cache.count >= 64 { cache.removeAll() }
            cache[key] = ranks
        }
        return ranks
    }
}

/// The views' tunables.
enum ViewTuning {
    /// Changes mapped between two commits of an index: large enough that a commit's cost
    /// (its fsync) is spread over many documents, small enough that a reader waiting for the
    /// write lock waits for one batch only.
    static let updateBatch = 500
}
