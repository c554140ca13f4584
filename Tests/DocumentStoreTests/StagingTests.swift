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
        let saved = try #require(try db.save([(draft, false)], unstaging: [second]).first)
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

    /// A copy is a new database: a staged row or a pending save of the original names a body
    /// the copy did not take, and the copy's first mount would report it lost (or keep it for
    /// good while the original's mount runs). The original keeps them.
    @Test func aCopyAndAnInstalledSnapshotLeaveTheOriginalsUnfinishedMountWorkBehind() throws {
        _ = try staged("s.txt", "staged only")
        try db.recordPendingSave(PendingSave(id: "p", pid: getpid(), docID: "doc", name: "a.bin", base: nil, contentType: nil,
                                             file: db.blobs.keptFilePath("p")))
        let copy = try db.copy(to: directory.appending("copy.sofa"))
        #expect(try copy.stagedAttachments().isEmpty && copy.pendingSaves().isEmpty)
        #expect(try copy.document(withID: "doc")?.attachmentNames == ["a.txt"])
        let zip = directory.appending("snapshot.zip")
        _ = try db.writeSnapshot(to: zip)
        let installed = try Database.install(snapshot: zip, at: directory.appending("installed.sofa"))
        #expect(try installed.stagedAttachments().isEmpty && installed.pendingSaves().isEmpty)
        #expect(try db.stagedAttachments().map(\.name) == ["s.txt"] && db.pendingSaves().count == 1, "the original keeps them")
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

/// A mount's staging log (`StagingLog`): staged files without a SQLite commit each, folded in
/// the revision's transaction, taken in once after a kill, and kept by compaction.
@Suite struct StagingLogTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        db = try directory.makeDatabase()
        try db.put("doc", ["n": 1], attachments: ["a.txt": Array("a".utf8)])
    }

    func stage(_ name: String, _ text: String, in log: StagingLog, modified: Int64 = 1_600_000_000_000_000_007) throws -> StagedAttachment {
        let blob = try db.blobs.write(Array(text.utf8))
        let attachment = Attachment(name: name, contentType: "text/plain", blob: blob, revpos: 0)
        let draft = StagedAttachment.Draft(docID: "doc", attachment: attachment, expectedDigest: nil, base: try db.currentRevision(of: "doc")?.revID)
        return try log.stage(draft, shown: LocalAttributes(digest: attachment.digest, modified: modified))
    }

    func logFiles() throws -> [String] { try StagingLogFiles.paths(in: db.stagingLogDirectory) }

    func fileSize(_ path: String) -> Int {
        var info = stat()
        return stat(path, &info) == 0 ? Int(info.st_size) : -1
    }

    @Test func aFoldSavesTheFilesTimesAndEmptiesTheLogWhichTheUnmountRemoves() throws {
        let log = try #require(StagingLog.make(for: db))
        _ = try stage("b.txt", "first", in: log)
        let second = try stage("b.txt", "second", in: log)
        let renamed = try log.restage(try stage("tmp/.c.XYZ", "third", in: log), as: "c.txt", expectedDigest: nil)
        let given = try #require(try log.updateAttributes(of: renamed) { $0.modified = 42 })
        #expect(given.modified == 42)
        // What any opener sees: the latest of each name, under its last name, nothing in SQLite yet.
        #expect(try db.stagedAttachments().map(\.name).sorted() == ["b.txt", "c.txt"])
        #expect(try db.stagedAttachments(includingLogs: false).isEmpty)
        #expect(try db.localAttributes(ofDocument: "doc").isEmpty)
        let file = try #require(try logFiles().first)
        #expect(fileSize(file) > 0)

        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment(second.attachment)
        try draft.setAttachment(renamed.attachment)
        let saved = try #require(try db.save([(draft, false)], unstaging: [second, renamed], log: log).first)
        #expect(saved.attachmentNames.sorted() == ["a.txt", "b.txt", "c.txt"])
        #expect(try db.stagedAttachments().isEmpty)
        // Stored by the fold: as the mount showed them.
        let local = try db.localAttributes(ofDocument: "doc")
        #expect(local["c.txt"]?.modified == 42 && local["b.txt"]?.modified == 1_600_000_000_000_000_007, "\(local)")
        #expect(local["tmp/.c.XYZ"] == nil)
        #expect(fileSize(file) == 0, "nothing unfolded is left: the log is emptied")
        // A record folded already cannot be folded or renamed again.
        #expect(throws: SofaError.self) { try db.save([], unstaging: [second], log: log) }
        #expect(throws: SofaError.self) { try log.restage(second, as: "d.txt", expectedDigest: nil) }
        log.finish()
        #expect(try logFiles().isEmpty)
    }

    @Test func aStoppedMountsLogBecomesRowsOnceLessWhatItsFoldsSaved() throws {
        let log = try #require(StagingLog.make(for: db))
        let folded = try stage("folded.txt", "saved", in: log)
        let waiting = try stage("waiting.txt", "not saved yet", in: log, modified: 77)
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment(folded.attachment)
        try db.save([(draft, false)], unstaging: [folded], log: log)
        log.finish()  // as a kill leaves it: unfolded records, the lock let go
        let file = try #require(try logFiles().first, "a log with an unfolded record stays")
        // A power loss can tear the last record: the frames before it are read.
        try shell("printf '\\x30\\x00\\x00\\x00torn' >> '\(file)'")
        #expect(try db.stagedAttachments().map(\.name) == ["waiting.txt"])

        let imported = try StagingLog.importStopped(into: db, except: nil)
        let rows = try db.stagedAttachments()
        #expect(rows.map(\.name) == ["waiting.txt"] && rows.allSatisfy { $0.log == nil }, "\(rows)")
        #expect(imported == Set(rows.map(\.seq)))
        #expect(rows.first?.attachment.blobKey == waiting.attachment.blobKey)
        #expect(try db.localAttributes(docID: "doc", name: "waiting.txt")?.modified == 77)
        #expect(try logFiles().isEmpty)
        #expect(try StagingLog.importStopped(into: db, except: nil).isEmpty, "taken in once")
    }

    /// A mount that never has a quiet moment (new files staged while the oldest are folded)
    /// keeps a log of what is unfolded, not of everything it ever staged.
    @Test func aLogWrittenWithoutAQuietMomentStartsSegmentsAndRemovesThoseFolded() throws {
        let log = try #require(StagingLog.make(for: db, segmentBytes: 2_048))
        var files = try (0..<40).map { try stage("f\($0).txt", "body \($0)", in: log) }
        #expect(try logFiles().count >= 4)
        // Renamed and given a time in its old segment, after newer segments were started.
        files[3] = try log.restage(files[3], as: "renamed3.txt", expectedDigest: nil)
        _ = try #require(try log.updateAttributes(of: files[1]) { $0.modified = 11 })
        let first = try logFiles().first

        var draft = try db.newRevision(of: "doc")
        for file in files[0..<30] { try draft.setAttachment(file.attachment) }
        try db.save([(draft, false)], unstaging: Array(files[0..<30]), log: log)
        #expect(try db.localAttributes(docID: "doc", name: "f1.txt")?.modified == 11)
        #expect(try !logFiles().contains { $0 == first }, "a segment with nothing unfolded is removed")
        #expect(try logFiles().count <= 3)
        let waiting = Set((30..<40).map { "f\($0).txt" })
        #expect(Set(try db.stagedAttachments().map(\.name)) == waiting)

        log.finish()  // killed: the next mount reads every segment of it together
        _ = try StagingLog.importStopped(into: db, except: nil)
        #expect(Set(try db.stagedAttachments().map(\.name)) == waiting)
        #expect(try logFiles().isEmpty)
        #expect(try db.stagedAttachments().count == 10, "nothing taken in twice")
    }

    /// A fold does not hold the log through its transaction (here kept waiting for the
    /// database's write lock): a file closed meanwhile is staged at once; times given to a file
    /// being folded, and its rename, wait for the fold's end and then find it in the revision
    /// (the row of `local_attributes` is the one to change), so the fold loses neither; a file
    /// written again under its name waits too, and is refused: its mount saves it itself.
    /// On a busy machine a call may come before the fold has marked its files; each outcome is
    /// checked for the order it shows, and no order may lose or double anything.
    @Test func filesAreStagedWhileAFoldWaitsAndTimesGivenToAFoldingFileAreNotLost() throws {
        let log = try #require(StagingLog.make(for: db))
        let folded = try stage("folded.txt", "folded body", in: log)
        let renamed = try stage("renamed.txt", "renamed body", in: log)
        func draft(_ name: String, _ text: String) throws -> StagedAttachment.Draft {
            let attachment = Attachment(name: name, contentType: "text/plain", blob: try db.blobs.write(Array(text.utf8)), revpos: 0)
            return StagedAttachment.Draft(docID: "doc", attachment: attachment, expectedDigest: nil, base: try db.currentRevision(of: "doc")?.revID)
        }
        let (closedDraft, againDraft) = (try draft("closed.txt", "closed meanwhile"), try draft("folded.txt", "written again"))
        let holding = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let writer = DispatchSemaphore(value: 0)
        DispatchQueue.global().async { [db] in
            try? db.write { _ in
                holding.signal()
                release.wait()
            }
            writer.signal()
        }
        #expect(holding.wait(timeout: .now() + 60) == .success)
        defer { release.signal() }

        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment(folded.attachment)
        try draft.setAttachment(renamed.attachment)
        let fold = Outcome { [db, draft] in try db.save([(draft, false)], unstaging: [folded, renamed], log: log) }
        usleep(200_000)  // for the fold to mark its files and reach the database (the checks below hold in any order)

        let closed = Outcome { try log.stage(closedDraft, shown: LocalAttributes()) }
        #expect(closed.wait(60), "a file closed while a fold waits for the database is staged at once")
        let touched = Outcome { try log.updateAttributes(of: folded) { $0.modified = 42 } }
        let moved = Outcome { try log.restage(renamed, as: "moved.txt", expectedDigest: nil) }
        let again = Outcome { try log.stage(againDraft, shown: LocalAttributes()) }
        _ = touched.wait(0.2)

        release.signal()
        #expect(writer.wait(timeout: .now() + 60) == .success)
        #expect(fold.wait(60) && touched.wait(60) && moved.wait(60) && again.wait(60))
        let touchedRecord = try touched.result?.get() ?? nil
        let stored = try db.localAttributes(docID: "doc", name: "folded.txt")?.modified
        if let saved = try? fold.result?.get().first {
            #expect(saved.attachment(named: "folded.txt") != nil && saved.attachment(named: "renamed.txt") != nil)
            // Folded first: the rename and the file written again were refused, not staged beside it.
            #expect(throws: SofaError.self) { try moved.result?.get() }
            #expect(throws: SofaError.self) { try again.result?.get() }
            // Given before the fold marked it, the time went with the fold; after, the row takes it.
            #expect(stored == (touchedRecord == nil ? 1_600_000_000_000_000_007 : 42), "no time lost to the fold")
            #expect(log.attributes(in: "doc").keys.sorted() == ["closed.txt"])
            #expect(Set(try db.stagedAttachments().map(\.name)) == ["closed.txt"])
        } else {
            // Renamed or written again before the fold marked its files: the fold found them
            // gone and saved nothing, for its caller to look again.
            #expect(throws: SofaError.self) { try fold.result?.get() }
            #expect((try? moved.result?.get()) != nil || (try? again.result?.get()) != nil)
            #expect(log.attributes(in: "doc")["closed.txt"] != nil)
        }
    }

    @Test func aLogStillWrittenIsLeftToItsMount() throws {
        let log = try #require(StagingLog.make(for: db))
        _ = try stage("b.txt", "live", in: log)
        // Its mount holds its lock: another mount's start leaves it.
        #expect(try StagingLog.importStopped(into: db, except: nil).isEmpty)
        #expect(try logFiles().count == 1)
        #expect(try db.stagedAttachments().map(\.name) == ["b.txt"])
    }

    @Test func compactionAndEncryptionKeepTheBodiesALogHolds() throws {
        let log = try #require(StagingLog.make(for: db))
        let file = try stage("c.txt", "staged body", in: log)
        let key = try #require(file.attachment.blobKey)
        let report = try db.compact(alone: true)
        #expect(report.blobsDeleted == 0, "\(report)")
        #expect(try db.blobs.contents(of: key) == Array("staged body".utf8))
        log.finish()  // a stopped mount's log
        #expect(try db.compact(alone: true).blobsDeleted == 0)
        #expect(try db.blobs.contents(of: key) == Array("staged body".utf8))
        // A pull's failed save removes the bodies it wrote at once, but not one a log holds.
        try db.removeUnreferencedBlobs([key], writtenSince: .distantPast)
        #expect(try db.blobs.contents(of: key) == Array("staged body".utf8))
    }

    @Test func encryptionWaitsForAStoppedMountsLogToBeTakenIn() throws {
        let path = directory.appending("plain.sofa")
        do {  // a mount that stopped: its database closed, its log left
            let plain = try Database.create(at: path)
            try plain.put("doc", [:])
            let log = try #require(StagingLog.make(for: plain))
            let attachment = Attachment(name: "b.txt", contentType: "text/plain", blob: try plain.blobs.write(Array("staged".utf8)), revpos: 0)
            _ = try log.stage(StagedAttachment.Draft(docID: "doc", attachment: attachment, expectedDigest: nil, base: nil), shown: LocalAttributes())
            log.finish()
        }
        let secret = try DatabaseSecret.newKeyFile()
        // Its records name documents and files in clear: not carried into an encrypted database.
        let refusal = #expect(throws: SofaError.self) { try Database.convert(at: path, current: nil, to: (secret, .keyFile)) }
        #expect(refusal.map { "\($0)" }?.contains("files a stopped mount wrote") == true, "\(String(describing: refusal))")
        #expect(try StagingLogFiles.paths(in: StagingLogFiles.directory(ofDatabaseAt: path)).count == 1, "left as it was")
        do { _ = try StagingLog.importStopped(into: try Database.open(at: path), except: nil) }  // what the next mount does first
        try Database.convert(at: path, current: nil, to: (secret, .keyFile))
        let encrypted = try Database.open(at: path, secret: secret)
        #expect(encrypted.isEncrypted)
        #expect(try encrypted.stagedAttachments().map(\.name) == ["b.txt"], "the file is a row of the encrypted database")
    }

    @Test func anEncryptedDatabaseKeepsItsStagedFilesInSQLite() throws {
        let secret = try DatabaseSecret.newKeyFile()
        let encrypted = try Database.create(at: directory.appending("sealed.sofa"), encryptedWith: (secret, .keyFile))
        #expect(StagingLog.make(for: encrypted) == nil)
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

@Suite struct PendingSaveTests {
    let directory = TemporaryDirectory()

    @Test func compactionKeepsRecordedPendingBytesAndSweepsOldOrphans() throws {
        let db = try directory.makeDatabase()
        func keep(_ id: String, age: Double) throws -> String {
            let path = db.blobs.keptFilePath(id)
            try Data("bytes of \(id)".utf8).write(to: URL(fileURLWithPath: path))
            let time = timespec(tv_sec: Int(Date().timeIntervalSince1970 - age), tv_nsec: 0)
            var times = [time, time]
            #expect(utimensat(AT_FDCWD, path, &times, 0) == 0)
            return path
        }
        let recorded = try keep("recorded", age: 3600)
        try db.recordPendingSave(PendingSave(id: "recorded", pid: 1, docID: "doc", name: "a.bin", base: nil, contentType: nil, file: recorded))
        let orphan = try keep("orphan", age: 3600)
        let fresh = try keep("fresh", age: 0)  // a mount may be about to record it
        _ = try db.compact()
        #expect(FileManager.default.fileExists(atPath: recorded))
        #expect(!FileManager.default.fileExists(atPath: orphan))
        #expect(FileManager.default.fileExists(atPath: fresh))
        db.removePendingSave("recorded")
        #expect(!FileManager.default.fileExists(atPath: recorded))
        #expect(try db.pendingSaves().isEmpty)
    }

    @Test func encryptionWaitsForAStoppedMountsPendingSave() throws {
        let path = directory.appending("durable.sofa")
        do {  // a mount that stopped after a program's fsync, before the close saved it
            let plain = try Database.create(at: path)
            let keep = plain.blobs.keptFilePath("p")
            try plain.blobs.writeKeptFile(Array(#"{"a": 1}"#.utf8), to: keep)
            try plain.recordPendingSave(PendingSave(id: "p", pid: 1, docID: "doc", name: nil, base: nil, contentType: nil, file: keep))
        }
        let secret = try DatabaseSecret.newKeyFile()
        let refusal = #expect(throws: SofaError.self) { try Database.convert(at: path, current: nil, to: (secret, .keyFile)) }
        #expect(refusal.map { "\($0)" }?.contains("saves a stopped mount made durable") == true, "\(String(describing: refusal))")
        do {  // what the next mount does once it has saved it
            let plain = try Database.open(at: path)
            #expect(try plain.pendingSaves().map(\.id) == ["p"], "left as it was")
            plain.removePendingSave("p")
        }
        try Database.convert(at: path, current: nil, to: (secret, .keyFile))
        #expect(try Database.open(at: path, secret: secret).isEncrypted)
    }

    @Test func aKeptFileIsSealedInAnEncryptedStoreAndReadBackWithinItsLimit() throws {
        let secret = try DatabaseSecret.newKeyFile()
        let db = try Database.create(at: directory.appending("sealed.sofa"), encryptedWith: (secret, .keyFile))
        let keep = db.blobs.keptFilePath("k")
        let text = Array(#"{"secret words": "in clear nowhere"}"#.utf8)
        try db.blobs.writeKeptFile(text, to: keep)
        let stored = try Array(Data(contentsOf: URL(fileURLWithPath: keep)))
        #expect(stored.count > text.count && !String(decoding: stored, as: UTF8.self).contains("secret words"), "sealed on disk")
        #expect(try db.blobs.readKeptFile(keep, limit: 1000) == text)
        #expect(throws: SofaError.self) { try db.blobs.readKeptFile(keep, limit: text.count - 1) }
    }
}

/// A call made on a thread of its own (a pool's threads can all be waiting), and what it ended
/// with, once it has.
final class Outcome<T: Sendable>: @unchecked Sendable {
    private let done = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var ended: Result<T, any Error>?

    init(_ body: @escaping @Sendable () throws -> T) {
        Thread { [self] in
            let result = Result { try body() }
            lock.withLock { ended = result }
            done.signal()
        }.start()
    }

    /// Whether it ended within `seconds` (a wait that succeeds is not repeated).
    func wait(_ seconds: Double) -> Bool {
        guard lock.withLock({ ended == nil }) else { return true }
        return done.wait(timeout: .now() + seconds) == .success
    }

    var result: Result<T, any Error>? { lock.withLock { ended } }
}
