import DocumentModel
@testable import DocumentStore
import Foundation
import Testing
import TestSupport

/// SQLite files sealed by the VFS shim (#32, the first piece): a real SQLite file and its WAL
/// on disk, read back through SQLite. Not yet reached from `Database.open`.
@Suite struct SealedPagesTests {
    let directory = TemporaryDirectory()
    let marker = "sofa-plaintext-marker-7f3a"
    let keyBytes = [UInt8]((0..<32).map { UInt8($0 * 7 + 1) })
    var key: SealingKey { try! SealingKey(keyBytes) }

    /// A file with 2,000 rows holding the marker, written through the WAL; the connection
    /// is left open with the rows in the WAL unless `checkpoint`.
    func fill(_ path: String, sealed: SealedPages?, checkpoint: Bool) throws -> SQLiteConnection {
        let connection = try SQLiteConnection(path: path, create: true, sealed: sealed)
        try connection.execute("PRAGMA journal_mode = WAL")
        try connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        try connection.execute("BEGIN")
        for index in 0..<2_000 { try connection.run("INSERT INTO notes (body) VALUES (?)", .text("\(marker) number \(index)")) }
        try connection.execute("COMMIT")
        if checkpoint { try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        return connection
    }

    func bytes(_ path: String) -> [UInt8] { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? [] }

    func contains(_ haystack: [UInt8], _ needle: String) -> Bool {
        let needle = Array(needle.utf8)
        guard haystack.count >= needle.count else { return false }
        return (0...(haystack.count - needle.count)).contains { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
    }

    func rows(_ connection: SQLiteConnection) throws -> [String] {
        try connection.query("SELECT body FROM notes ORDER BY id") { $0.text(0) }
    }

    @Test func noPageReachesTheDiskInTheClearAndAllComeBack() throws {
        // The same rows unsealed: the marker is there to be found, in the WAL and in the file.
        let plainPath = directory.appending("plain.sqlite3")
        let plain = try fill(plainPath, sealed: nil, checkpoint: false)
        #expect(contains(bytes(plainPath + "-wal"), marker))
        try plain.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        #expect(contains(bytes(plainPath), marker))

        let path = directory.appending("sealed.sqlite3")
        let sealed = try fill(path, sealed: try SealedPages(key: key), checkpoint: false)
        let wal = bytes(path + "-wal")
        #expect(wal.count > 100_000, "the rows are in the WAL: \(wal.count) bytes")
        #expect(!contains(wal, marker), "no page of the WAL in the clear")
        #expect(!contains(bytes(path), marker))
        #expect(!contains(bytes(path), "SQLite format 3"), "not even the file's header")
        try sealed.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        #expect(!contains(bytes(path), marker), "nor of the file after a checkpoint")
        #expect(bytes(path).count > 100_000)
        let expected = (0..<2_000).map { "\(marker) number \($0)" }
        #expect(try rows(sealed) == expected)

        // Opened again with the same key, by a new VFS: the same rows; a sort of them spills
        // nothing to a temporary file.
        let again = try SQLiteConnection(path: path, create: false, sealed: try SealedPages(key: key))
        #expect(try rows(again) == expected)
        #expect(try again.query("SELECT body FROM notes ORDER BY body DESC LIMIT 1") { $0.text(0) } == ["\(marker) number 999"])
        #expect(try again.query("PRAGMA integrity_check") { $0.text(0) } == ["ok"])
    }

    @Test func aWrongKeyOrAFlippedByteIsAnErrorNeverOtherRows() throws {
        let path = directory.appending("sealed.sqlite3")
        _ = try fill(path, sealed: try SealedPages(key: key), checkpoint: true)

        var wrong = keyBytes
        wrong[0] ^= 1
        // A wrong key fails at the open or the first read (SQLite reads the header when it can).
        let wrongSeal = try SealedPages(key: try SealingKey(wrong))
        #expect(throws: SofaError.self) { _ = try rows(try SQLiteConnection(path: path, create: false, sealed: wrongSeal)) }
        // Unsealed, the file is not a database at all.
        #expect(throws: SofaError.self) { _ = try rows(try SQLiteConnection(path: path, create: false)) }

        // One byte of a page in the middle of the file flipped: reading it fails; the rows on
        // other pages still read.
        let handle = try #require(FileHandle(forUpdatingAtPath: path))
        try handle.seek(toOffset: 5 * 4096 + 1000)
        let byte = try #require(try handle.read(upToCount: 1)).first!
        try handle.seek(toOffset: 5 * 4096 + 1000)
        try handle.write(contentsOf: [byte ^ 0x20])
        try handle.close()
        let reader = try SQLiteConnection(path: path, create: false, sealed: try SealedPages(key: key))
        var failure: SofaError?
        do { _ = try rows(reader) } catch let error as SofaError { failure = error }
        guard case .sqlite(let code, _, _) = failure else {
            Issue.record("a damaged page must fail the read: \(String(describing: failure))")
            return
        }
        #expect(code == 10 | (32 << 8), "SQLITE_IOERR_DATA, the VFS's answer to a page that fails its tag: \(code)")
        #expect(try reader.query("SELECT body FROM notes WHERE id = 1") { $0.text(0) } == ["\(marker) number 0"])
    }

    /// A process killed with committed transactions only in the WAL: the copy of its files
    /// taken then opens with every committed row (SQLite's recovery of the log reads the
    /// sealed frames and checks their checksums), and an uncommitted one is not there.
    @Test func theLogOfAKilledProcessIsRecoveredWithEveryCommittedRow() throws {
        let path = directory.appending("sealed.sqlite3")
        let sealed = try SealedPages(key: key)
        let connection = try fill(path, sealed: sealed, checkpoint: false)
        for round in 0..<20 {
            try connection.run("UPDATE notes SET body = ? WHERE id = ?", .text("round \(round)"), .integer(Int64(round + 1)))
        }
        try connection.execute("BEGIN")
        try connection.run("UPDATE notes SET body = 'never committed' WHERE id = 100")
        // The files as a SIGKILL would leave them (no checkpoint, no close): copied aside.
        let copy = directory.appending("copy.sqlite3")
        for suffix in ["", "-wal"] { try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + suffix) }
        #expect(bytes(copy + "-wal").count > 100_000)
        let recovered = try SQLiteConnection(path: copy, create: false, sealed: try SealedPages(key: key))
        let bodies = try rows(recovered)
        #expect(bodies.count == 2_000)
        #expect(Array(bodies.prefix(20)) == (0..<20).map { "round \($0)" })
        #expect(bodies[99] == "\(marker) number 99", "the open transaction is not in the copy")
        #expect(try recovered.query("PRAGMA integrity_check") { $0.text(0) } == ["ok"])
        try connection.execute("ROLLBACK")
    }
}
