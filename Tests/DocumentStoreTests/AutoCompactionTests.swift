import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Automatic compaction (`AutoCompaction`), driven a pass at a time as its loop drives it: a
/// database is compacted only after it went a whole pass unwritten, only when that frees enough,
/// once per state, and never frees a body a kept revision names, however it names it.
@Suite struct AutoCompactionTests {
    let directory = TemporaryDirectory()

    @Test func aQuietWastefulDatabaseIsCompactedOnceAndKeepsEveryKeptBody() throws {
        let (db, current, named) = try makeWastefulDatabase(in: directory)
        #expect(try blobFiles(db) == 11)
        let estimate = try db.compactionEstimate()
        #expect(estimate.unreferencedBlobBytes == 9 * 300_000)
        #expect(AutoCompaction.Policy().wants(estimate))

        let reports = Locked<[Result<CompactionReport, any Error>]>([])
        let daemon = AutoCompaction(databases: { [db] }) { _, result in reports.withLock { $0.append(result) } }
        daemon.pass()  // the first look: nothing known of it yet
        #expect(reports.withLock { $0.isEmpty })
        daemon.pass()  // unwritten since: compacted
        let report = try #require(try reports.withLock { $0 }.first?.get())
        #expect(report.blobsDeleted == 9 && report.blobBytesFreed == 9 * 300_000)
        #expect(try blobFiles(db) == 2)
        let photo = try #require(try db.document(withID: "photo")?.attachment(named: "photo.jpg")?.blobKey)
        #expect(try db.blobs.contents(of: photo) == current)
        #expect(try db.blobs.contents(of: BlobKey.of(named)) == named)
        #expect(try db.check().isEmpty)
        daemon.pass()
        daemon.pass()  // nothing changed since it was compacted: not looked at again
        #expect(reports.withLock { $0.count } == 1)
    }

    @Test func aDatabaseWrittenBetweenTwoLooksIsLeftAlone() throws {
        let (db, _, _) = try makeWastefulDatabase(in: directory)
        let reports = Locked(0)
        let daemon = AutoCompaction(databases: { [db] }) { _, _ in reports.withLock { $0 += 1 } }
        daemon.pass()
        for round in 0..<3 {
            try db.put("busy", ["round": .integer(Int64(round))])  // written during every interval
            daemon.pass()
            #expect(reports.withLock { $0 } == 0)
        }
        #expect(try blobFiles(db) == 11)
        daemon.pass()  // then a quiet interval
        #expect(reports.withLock { $0 } == 1)
        #expect(try blobFiles(db) == 2)
    }

    @Test func littleWasteIsNotWorthACompaction() throws {
        let db = try directory.makeDatabase()
        for version in 0..<3 {
            var draft = try db.newRevision(of: "note")
            try draft.setAttachment("n.txt", data: [UInt8](repeating: UInt8(version), count: 100_000))
            _ = try db.save(draft)
        }
        try ageBlobs(db)
        let estimate = try db.compactionEstimate()
        #expect(estimate.unreferencedBlobBytes == 200_000)
        #expect(!AutoCompaction.Policy().wants(estimate))  // under 1 MiB
        let daemon = AutoCompaction(databases: { [db] }) { _, _ in Issue.record("compacted for 200 KB") }
        daemon.pass()
        daemon.pass()
        #expect(try blobFiles(db) == 3)
        // Half of a large database, or 512 MiB of any: the ratio and the slack of CouchDB's smoosh.
        #expect(AutoCompaction.Policy().wants(CompactionEstimate(unreferencedBlobBytes: 2 << 20, totalBytes: 4 << 20)))
        #expect(!AutoCompaction.Policy().wants(CompactionEstimate(unreferencedBlobBytes: 2 << 20, totalBytes: 5 << 20)))
        #expect(AutoCompaction.Policy().wants(CompactionEstimate(unreferencedBlobBytes: 512 << 20, totalBytes: 100 << 30)))
    }
}
