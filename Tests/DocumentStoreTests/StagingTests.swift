import DocumentModel
import DocumentStore
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
                                                   base: try db.currentRevision(of: "doc")?.revID, modified: 1_600_000_000.5))
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
        #expect(try db.attachmentTimes(of: saved)["b.txt"] == 1_600_000_000.5)
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
