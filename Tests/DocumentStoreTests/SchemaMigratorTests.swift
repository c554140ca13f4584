import DocumentModel
@testable import DocumentStore
import MountTables
import Foundation
import Testing
import TestSupport

/// The schema as named steps (`SchemaMigrator`): a file records the steps it has had by name,
/// one from before names gets them (and any table it lacked), one a newer Sofa changed is left
/// alone, and the parts' hooks (blobs their rows hold, rows a purge forgets) are what
/// compaction and purge follow.
@Suite struct SchemaMigratorTests {
    let directory = TemporaryDirectory()

    /// Runs statements on a database's file with Python's sqlite3 module; the rows of all, a line each.
    @discardableResult
    func sql(_ path: String, _ statements: String...) throws -> [String] {
        let script = """
            import sqlite3, sys
            c = sqlite3.connect(sys.argv[1]); rows = []
            for s in sys.argv[2:]: rows += c.execute(s).fetchall()
            c.commit(); print("\\n".join("|".join(map(str, r)) for r in rows))
            """
        let result = try ChildProcess(["/usr/bin/python3", "-c", script, "\(path)/db.sqlite3"] + statements).wait()
        #expect(result.succeeded, "\(result.stderr)")
        return result.stdout.split(separator: "\n").map(String.init)
    }

    @Test func aNewDatabaseRecordsEveryStepByName() throws {
        let db = try directory.makeDatabase()
        #expect(try sql(db.path, "SELECT name FROM schema_steps ORDER BY name") == Schema.steps.map(\.name).sorted())
        #expect(try sql(db.path, "PRAGMA user_version") == ["8"], "the last numbered version, which Sofas from before names open")
        #expect(Schema.steps.count == Set(Schema.steps.map(\.name)).count, "names are unique")
    }

    /// A file of the last numbered version, without `schema_steps`, and without two tables a
    /// build of that version could lack: opened, it has every step by name and every table.
    @Test func aFileFromBeforeNamedStepsGetsThemAndTheTablesItLacked() throws {
        let path: String
        do {
            let db = try directory.makeDatabase()
            try db.put("doc", ["n": 1])
            path = db.path
        }
        try sql(path, "DROP TABLE schema_steps", "DROP TABLE staged_attachments", "DROP TABLE local_attributes")
        let db = try Database.open(at: path)
        #expect(try sql(path, "SELECT name FROM schema_steps ORDER BY name") == Schema.steps.map(\.name).sorted())
        #expect(try sql(path, "SELECT name FROM sqlite_master WHERE name IN ('staged_attachments', 'local_attributes') ORDER BY name")
                == ["local_attributes", "staged_attachments"])
        #expect(try db.document(withID: "doc")?.properties["n"] == 1)
        try db.updateLocalAttributes(docID: "doc", name: "a") { $0.mode = 0o644 }
        #expect(try db.localAttributes(ofDocument: "doc")["a"]?.mode == 0o644)
    }

    /// Steps a newer Sofa added are not this one's to keep: opening for writing is refused with
    /// the reason, and the file is as it was.
    @Test func aFileANewerSofaChangedIsRefusedAndLeftAsItWas() throws {
        let path: String
        do {
            let db = try directory.makeDatabase()
            try db.put("doc", ["n": 1])
            path = db.path
        }
        try sql(path, "INSERT INTO schema_steps (name, applied_at) VALUES ('a step from the future', 0)")
        #expect {
            try Database.open(at: path)
        } throws: { error in
            "\(error)".contains("a newer Sofa changed its schema (a step from the future)")
        }
        #expect(try sql(path, "SELECT count(*) FROM schema_steps WHERE name = 'a step from the future'") == ["1"])
        #expect(try sql(path, "SELECT count(*) FROM docs") == ["1"])
    }

    /// Compaction keeps what a part's rows hold without naming its table, and a purge forgets a
    /// document's rows in the parts that say how.
    @Test func compactionAndPurgeFollowThePartsHooks() throws {
        let db = try directory.makeDatabase()
        let body = try db.blobs.write(Array("held by a staged row only".utf8))
        let rev = try db.put("doc", ["n": 1]).revID
        _ = try db.stage(StagedAttachment.Draft(docID: "doc", attachment: Attachment(name: "f.txt", contentType: "text/plain", blob: body, revpos: 0),
                                                expectedDigest: nil, base: rev))
        try db.updateLocalAttributes(docID: "doc", name: "f.txt") { $0.mode = 0o600 }
        #expect(try db.compact(alone: true).blobsDeleted == 0)
        #expect(try db.blobs.contents(of: body.key) == Array("held by a staged row only".utf8))
        #expect(try db.read { try db.schema.heldBlobKeys(in: $0, folder: db.path) } == [body.key.hex])

        _ = try db.purge(["doc": [rev]])
        #expect(try db.localAttributes(ofDocument: "doc").isEmpty, "the purged document's attributes went with it")
    }
}
