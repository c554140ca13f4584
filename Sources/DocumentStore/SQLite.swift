import CSQLite3
import DocumentModel
import Foundation

/// A value bound to, or read from, an SQL statement.
package enum SQLValue {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
}

extension SQLValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByNilLiteral {
    package init(stringLiteral value: String) { self = .text(value) }
    package init(integerLiteral value: Int64) { self = .integer(value) }
    package init(nilLiteral: ()) { self = .null }
    package init(_ value: Int) { self = .integer(Int64(value)) }
    package init(_ value: Bool) { self = .integer(value ? 1 : 0) }
    package init(_ value: String?) { self = value.map { .text($0) } ?? .null }
    package init(_ value: Int64?) { self = value.map { .integer($0) } ?? .null }
}

/// One SQLite connection. Owns its handle and a cache of prepared statements.
///
/// Not thread-safe by itself: `Database` hands a connection to one thread at a
/// time (the writer behind `writeLock`, readers through the pool), which is the
/// invariant behind `@unchecked Sendable`.
package final class SQLiteConnection: @unchecked Sendable {
    let handle: OpaquePointer
    let path: String
    private var statements: [String: OpaquePointer] = [:]
    /// Set by a write that readers of the change stream look for: a new sequence (a document
    /// changed) or a body event. `Database.write` clears it before each transaction and tells
    /// the stream. Used only under the database's write lock.
    var wroteChanges = false

    /// How long a statement waits for another process's lock before failing with SQLITE_BUSY.
    static let busyTimeoutMilliseconds: Int32 = 30_000

    /// The seal of its pages, when the file is sealed: kept for as long as the connection.
    let sealed: SealedPages?

    /// Opens `path`. `immutable` opens it read-only without locks or a WAL index,
    /// for databases on read-only media (a WAL database cannot be opened otherwise there).
    /// `sealed`: the file's pages are sealed with that key (a new file is made so).
    /// `readOnly` opens it read-only with locks as usual (another program may be writing it).
    init(path: String, create: Bool, immutable: Bool = false, readOnly: Bool = false, sealed: SealedPages? = nil) throws {
        var handle: OpaquePointer?
        // URIs always: `sofa encrypt`/`decrypt` attach the other form of a database by a URI that
        // names its VFS (a plain path is a plain path all the same).
        var flags = (immutable || readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_URI
        if create { flags |= SQLITE_OPEN_CREATE }
        flags |= SQLITE_OPEN_NOMUTEX
        let name = immutable ? "file:" + path.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)! + "?immutable=1" : path
        let isNew = sealed != nil && create && ((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0) == 0
        let code = sqlite3_open_v2(name, &handle, flags, sealed?.vfsName)
        guard code == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(code))
            sqlite3_close_v2(handle)
            throw code == SQLITE_NOTADB
                ? SofaError.notADatabase(path: path, reason: message)
                : SofaError.sqlite(code: code, message: "cannot open \(path): \(message)", sql: nil)
        }
        self.handle = handle
        self.path = path
        self.sealed = sealed
        sqlite3_busy_timeout(handle, SQLiteConnection.busyTimeoutMilliseconds)
        sqlite3_extended_result_codes(handle, 1)
        if sealed != nil { try SealedPages.prepare(self, isNew: isNew) }
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(handle)
    }

    func error(_ code: Int32, sql: String?) -> SofaError {
        let message = String(cString: sqlite3_errmsg(handle))
        switch code & 0xFF {
        case SQLITE_NOTADB: return .notADatabase(path: path, reason: message)
        case SQLITE_FULL: return .diskFull(path: path)
        case SQLITE_READONLY: return .readOnlyFileSystem(path: path)
        default: return .sqlite(code: code, message: message, sql: sql)
        }
    }

    /// Runs one or more statements that take no arguments.
    package func execute(_ sql: String) throws {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        guard code == SQLITE_OK else { throw error(code, sql: sql) }
    }

    /// Runs a statement for its effect.
    package func run(_ sql: String, _ arguments: SQLValue...) throws {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_reset(statement) }
        var code: Int32
        repeat { code = sqlite3_step(statement) } while code == SQLITE_ROW
        guard code == SQLITE_DONE else { throw error(code, sql: sql) }
    }

    /// Runs a query and maps each row.
    package func query<T>(_ sql: String, _ arguments: SQLValue..., row transform: (SQLiteRow) throws -> T) throws -> [T] {
        try query(sql, arguments, row: transform)
    }

    package func query<T>(_ sql: String, _ arguments: [SQLValue], row transform: (SQLiteRow) throws -> T) throws -> [T] {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_reset(statement) }
        var results: [T] = []
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return results }
            guard code == SQLITE_ROW else { throw error(code, sql: sql) }
            results.append(try transform(SQLiteRow(statement: statement)))
        }
    }

    /// Like `query`, but visits rows one at a time without collecting them.
    package func forEach(_ sql: String, _ arguments: SQLValue..., row visit: (SQLiteRow) throws -> Void) throws {
        let statement = try prepare(sql, arguments)
        defer { sqlite3_reset(statement) }
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return }
            guard code == SQLITE_ROW else { throw error(code, sql: sql) }
            try visit(SQLiteRow(statement: statement))
        }
    }

    package var changes: Int { Int(sqlite3_changes(handle)) }

    /// The rowid of the last row inserted on this connection (no statement asked).
    package var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    private func prepare(_ sql: String, _ arguments: [SQLValue]) throws -> OpaquePointer {
        let statement: OpaquePointer
        if let cached = statements[sql] {
            statement = cached
        } else {
            var prepared: OpaquePointer?
            let code = sqlite3_prepare_v2(handle, sql, -1, &prepared, nil)
            guard code == SQLITE_OK, let prepared else { throw error(code, sql: sql) }
            statements[sql] = prepared
            statement = prepared
        }
        sqlite3_clear_bindings(statement)
        for (offset, argument) in arguments.enumerated() {
            let index = Int32(offset + 1)
            let code: Int32
            switch argument {
            case .null: code = sqlite3_bind_null(statement, index)
            case .integer(let value): code = sqlite3_bind_int64(statement, index, value)
            case .real(let value): code = sqlite3_bind_double(statement, index, value)
            case .text(let value):
                code = value.utf8CString.withUnsafeBufferPointer {
                    csqlite3_bind_text_transient(statement, index, $0.baseAddress, Int32($0.count - 1))
                }
            case .blob(let value):
                code = value.withUnsafeBytes { csqlite3_bind_blob_transient(statement, index, $0.baseAddress, Int32($0.count)) }
            }
            guard code == SQLITE_OK else { throw error(code, sql: sql) }
        }
        return statement
    }
}

/// The current row of a running query; valid only inside the row closure.
package struct SQLiteRow {
    let statement: OpaquePointer

    package var columnCount: Int32 { sqlite3_column_count(statement) }
    package func isNull(_ column: Int32) -> Bool { sqlite3_column_type(statement, column) == SQLITE_NULL }
    package func int(_ column: Int32) -> Int { Int(sqlite3_column_int64(statement, column)) }
    package func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(statement, column) }
    package func bool(_ column: Int32) -> Bool { sqlite3_column_int64(statement, column) != 0 }
    package func double(_ column: Int32) -> Double { sqlite3_column_double(statement, column) }
    package func optionalInt64(_ column: Int32) -> Int64? { isNull(column) ? nil : int64(column) }

    package func text(_ column: Int32) -> String { optionalText(column) ?? "" }

    package func optionalText(_ column: Int32) -> String? {
        guard let pointer = sqlite3_column_text(statement, column) else { return nil }
        let count = Int(sqlite3_column_bytes(statement, column))
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: count), as: UTF8.self)
    }

    package func blob(_ column: Int32) -> [UInt8] {
        guard let pointer = sqlite3_column_blob(statement, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: pointer, count: Int(sqlite3_column_bytes(statement, column))))
    }

    /// The raw UTF-8 bytes of a text column, without making a String.
    package func bytes(_ column: Int32) -> [UInt8] {
        guard let pointer = sqlite3_column_text(statement, column) else { return [] }
        let count = Int(sqlite3_column_bytes(statement, column))
        return Array(UnsafeRawBufferPointer(start: pointer, count: count))
    }
}
