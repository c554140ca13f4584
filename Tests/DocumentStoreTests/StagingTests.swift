import DocumentModel
import DocumentStore
import MountTables
import Foundation
import Testing
import TestSupport

/// Staged attachments (files a mount saved that wait for their document's fold) and the
/// pruning of history that keeps a document of many files small.
@Suite struct StagingTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        db = try directory.makeDatabase()
        try db.put("doc", ["n": 1], attachments: ["a.txt": Array("a".utf8)])
    }

    func staged(_ name: String, _ text: String) throws -> StagedAttachment {
        let blob = try db.blobs.write(Array(text.utf8))
        let attachment = Attachment(name: name, contentType: "text/plain", blob: blob, revpos: 0)
        return try db.stage(StagedAttachment.Draft(docID: "doc", attachment: attachment, expectedDigest: nil,
                                                   base: try db.currentRevision(of: "doc")?.revID,
                                                   given: LocalAttributes(modified: 1_600_000_000_500_000_001)))
    }

    @Test func aNameStagedAgainReplacesItsRowAndASaveUnstagesInTheSameTransaction() throws {
        _ = try staged("b.txt", "first")
        let second = try staged("b.txt", "second")
        let rows = try db.stagedAttachments()
        #expect(rows.map(\.seq) == [second.seq], "one row per name")
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment(second.attachment)
        let saved = try #require(try db.save(draft, unstaging: [second.seq]))
        #expect(try db.stagedAttachments().isEmpty)
        #expect(try db.blobs.contents(of: try #require(saved.attachment(named: "b.txt")?.blobKey)) == Array("second".utf8))
        #expect(saved.attachment(named: "b.txt")?.revpos == 2)
        // The time given at staging is the attachment's.
        let given = try db.localAttributes(ofDocument: "doc")["b.txt"]
        #expect(given?.modified == 1_600_000_000_500_000_001 && given?.digest == saved.attachment(named: "b.txt")?.digest)
    }

    /// Each staged file drops the older row of its name; without an index that looked at every
    /// row of the burst, so a burst of N files cost N² row visits (10,000 files: 7.8 s → 4.7 s).
    @Test func aRowStagedAgainIsFoundByItsIndexNotByScanningTheBurst() throws {
        _ = try staged("b.txt", "first")
        let plan = try shell("""
            sqlite3 \(db.path)/db.sqlite3 "EXPLAIN QUERY PLAN DELETE FROM staged_attachments \
            WHERE doc_id = 'doc' AND name = 'b.txt' AND pid = 1 AND seq < 5"
            """)
        #expect(plan.succeeded, "\(plan.stderr)")
        #expect(plan.stdout.contains("USING INDEX staged_attachments_by_name"), "\(plan.stdout)")
    }

    @Test func compactionKeepsTheBodiesOfStagedFiles() throws {
        let file = try staged("c.txt", "staged body")
        let report = try db.compact(alone: true)
        #expect(report.blobsDeleted == 0, "\(report)")
        #expect(try db.blobs.contents(of: try #require(file.attachment.blobKey)) == Array("staged body".utf8))
    }

    @Test func aDocumentOfManyFilesKeepsOneListPerLeafAndASmallOneKeepsItsHistory() throws {
        let small = try #require(try db.currentRevision(of: "doc"))
        var edit = try db.newRevision(of: "doc")
        edit.properties = ["n": 2]
        try db.save(edit)
        #expect(try db.revision(small.revID, of: "doc").properties == ["n": 1], "a small document keeps its history's bodies")

        var big = try db.newRevision(of: "big")
        for i in 0..<Tuning.historyAttachmentRows + 100 { try big.setAttachment("f\(i)", data: Array("\(i)".utf8)) }
        let first = try db.save(big)
        for round in 0..<3 {
            var next = try db.newRevision(of: "big")
            try next.setAttachment("more\(round)", data: Array("more".utf8))
            try db.save(next)
        }
        #expect(throws: SofaError.self) { try db.revision(first.revID, of: "big") }
        let rows = try shell("python3 -c \"import sqlite3; print(sqlite3.connect('\(db.path)/db.sqlite3').execute('SELECT COUNT(*) FROM rev_attachments a JOIN docs d ON d.doc_key = a.doc_key WHERE d.doc_id = \\\"big\\\"').fetchone()[0])\"").stdout
        // The leaf's list, plus at most the history allowance (the parent's list before the next save prunes it).
        #expect(Int(rows.trimmingCharacters(in: .whitespacesAndNewlines))! <= 2 * (Tuning.historyAttachmentRows + 103), "\(rows)")
        #expect(try db.revisionTree(of: "big").nodes.count == 4, "revision ids stay for replication")
        #expect(try db.document(withID: "big")?.attachments.count == Tuning.historyAttachmentRows + 103)
    }
}

/// Times and modes a mount gives to files and folders (`local_attributes`, schema 7).
@Suite struct LocalAttributesTests {
    let directory = TemporaryDirectory()

    @Test func timesOfAVersionSixDatabaseMoveToNanosecondsWhenOpened() throws {
        let path = directory.appending("six.sofa")
        let digest: String
        do {
            let db = try Database.create(at: path)
            digest = try #require(try db.put("doc", [:], attachments: ["a.txt": Array("a".utf8)]).attachment(named: "a.txt")?.digest)
        }
        // What version 6 kept: seconds as REAL in attachment_times.
        let downgrade = try shell("""
            python3 -c "import sqlite3; c = sqlite3.connect('\(path)/db.sqlite3'); c.execute('DROP TABLE local_attributes'); c.execute('DROP TABLE schema_steps'); \
            c.execute('CREATE TABLE attachment_times (doc_id TEXT NOT NULL, name TEXT NOT NULL, digest TEXT NOT NULL, modified REAL NOT NULL, PRIMARY KEY (doc_id, name)) WITHOUT ROWID'); \
            c.execute(\\"INSERT INTO attachment_times VALUES ('doc', 'a.txt', '\(digest)', 946684799.25)\\"); \
            c.execute('PRAGMA user_version = 6'); c.commit()"
            """)
        #expect(downgrade.succeeded, "\(downgrade.stderr)")
        let db = try Database.open(at: path)
        #expect(try db.localAttributes(ofDocument: "doc")["a.txt"] == LocalAttributes(digest: digest, modified: 946_684_799_250_000_000))
        let tables = try shell("python3 -c \"import sqlite3; print(sqlite3.connect('\(path)/db.sqlite3').execute(\\\"SELECT count(*) FROM sqlite_master WHERE name = 'attachment_times'\\\").fetchone()[0])\"")
        #expect(tables.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "attachment_times is gone")
    }

    @Test func renamesMoveRowsAndEmptyRowsGo() throws {
        let db = try directory.makeDatabase()
        try db.updateLocalAttributes(docID: "doc", name: "bin/tool") { $0.mode = 0o755 }
        try db.updateLocalAttributes(docID: "doc", name: "bin/") { $0.modified = 1 }
        try db.updateLocalAttributes(docID: "doc", name: "old") { $0.modified = 2 }
        try db.moveLocalAttributes(docID: "doc", moves: [("bin/tool", "sbin/tool"), ("bin/", "sbin/")], toDocument: "other", removing: ["old"])
        #expect(try db.localAttributes(ofDocument: "doc").isEmpty)
        #expect(try db.localAttributes(ofDocument: "other") == ["sbin/tool": LocalAttributes(mode: 0o755), "sbin/": LocalAttributes(modified: 1)])
        try db.updateLocalAttributes(docID: "other", name: "sbin/tool") { $0.mode = nil }
        #expect(try db.localAttributes(ofDocument: "other").keys.sorted() == ["sbin/"], "a row with nothing left goes")
    }
}
