import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

@Suite struct DatabaseTests {
    let directory = TemporaryDirectory()

    func save(_ db: Database, _ id: String, _ properties: JSONObject) throws -> Revision {
        var draft = try db.newRevision(of: id)
        draft.properties = properties
        return try db.save(draft)
    }

    @Test func createsAndReopens() throws {
        let db = try directory.makeDatabase()
        let rev = try save(db, "a", ["x": 1])
        let reopened = try Database.open(at: db.path)
        #expect(try reopened.document(withID: "a") == rev)
        #expect(reopened.publicUUID == db.publicUUID && reopened.privateUUID == db.privateUUID)
        #expect(db.publicUUID != db.privateUUID && db.publicUUID.count == 32)
        #expect(throws: SofaError.databaseExists(path: db.path)) { try Database.create(at: db.path) }
    }

    @Test func refusesPathsThatAreNotDatabases() throws {
        let missing = directory.appending("missing.sofa")
        #expect(throws: SofaError.notADatabase(path: missing, reason: "no such file or directory")) { try Database.open(at: missing) }
        let file = directory.appending("file")
        FileManager.default.createFile(atPath: file, contents: Data("x".utf8))
        #expect(throws: SofaError.notADatabase(path: file, reason: "it is not a directory")) { try Database.open(at: file) }
        let empty = directory.appending("empty.sofa")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        #expect(throws: SofaError.notADatabase(path: empty, reason: "it has no db.sqlite3")) { try Database.open(at: empty) }
        let garbage = directory.appending("garbage.sofa")
        try FileManager.default.createDirectory(atPath: garbage, withIntermediateDirectories: false)
        FileManager.default.createFile(atPath: garbage + "/db.sqlite3", contents: Data(repeating: 0x42, count: 8192))
        do {
            _ = try Database.open(at: garbage)
            Issue.record("opened a garbage file")
        } catch let error as SofaError {
            guard case .notADatabase = error else { Issue.record("wrong error \(error)"); return }
        }
    }

    @Test func updatesFollowTheCurrentRevision() throws {
        let db = try directory.makeDatabase()
        let first = try save(db, "doc", ["n": 1])
        let second = try save(db, "doc", ["n": 2])
        #expect(first.revID.generation == 1 && second.revID.generation == 2)
        #expect(second.parentRevID == first.revID)
        #expect(try db.document(withID: "doc")?.properties == ["n": 2])
        #expect(try db.revision(first.revID, of: "doc").properties == ["n": 1])
    }

    @Test func staleSaveIsAConflictUnlessAllowed() throws {
        let db = try directory.makeDatabase()
        _ = try save(db, "doc", ["n": 1])
        var stale = try db.newRevision(of: "doc")
        let winner = try save(db, "doc", ["n": 2])
        stale.properties = ["n": 3]
        #expect(throws: SofaError.conflict(docID: "doc", revID: stale.parent!.description, current: winner.revID.description)) {
            try db.save(stale)
        }
        #expect(try db.document(withID: "doc") == winner)
        // Allowed: the stale edit becomes a branch; nothing is lost.
        let branch = try db.save(stale, allowConflict: true)
        let tree = try db.revisionTree(of: "doc")
        #expect(tree.leaves.count == 2)
        #expect(tree.contains(branch.revID) && tree.contains(winner.revID))
        #expect(tree.conflicts.count == 1)
        // Two creators racing: the second new document is a conflict too.
        var early = try db.newRevision(of: "new")
        let created = try save(db, "new", ["by": "first"])
        early.properties = ["by": "second"]
        #expect(throws: SofaError.conflict(docID: "new", revID: nil, current: created.revID.description)) { try db.save(early) }
    }

    @Test func identicalEditsAreIdempotent() throws {
        let db = try directory.makeDatabase()
        let base = try save(db, "doc", ["n": 1])
        var a = try db.newRevision(of: "doc")
        a.properties = ["n": 2]
        let first = try db.save(a)
        let again = try db.save(a, allowConflict: true)
        #expect(first == again)
        #expect(try db.revisionTree(of: "doc").nodes.count == 2)
        _ = base
    }

    @Test func deletionIsATombstoneAndRecreationContinuesIt() throws {
        let db = try directory.makeDatabase()
        let created = try save(db, "doc", ["n": 1])
        let tombstone = try db.deleteDocument("doc")
        #expect(tombstone.deleted && tombstone.revID.generation == 2 && tombstone.properties.isEmpty)
        #expect(try db.document(withID: "doc") == nil)
        #expect(try db.currentRevision(of: "doc")?.deleted == true)
        #expect(throws: SofaError.documentNotFound("doc")) { try db.deleteDocument("doc") }
        let recreated = try save(db, "doc", ["n": 2])
        #expect(recreated.revID.generation == 3 && recreated.parentRevID == tombstone.revID)
        #expect(try db.revision(created.revID, of: "doc").properties == ["n": 1])
        #expect(throws: SofaError.documentNotFound("never")) { try db.deleteDocument("never") }
    }

    @Test func aStorageKeyNamesOneDocumentForTheDatabasesLife() throws {
        let db = try directory.makeDatabase()
        _ = try save(db, "a", ["n": 1])
        let last = try save(db, "b", ["n": 2])
        let (a, b) = (try #require(try db.storageKey(of: "a")), try #require(try db.storageKey(of: "b")))
        #expect(b > a)
        // Deleted, its key stays; purged, it is gone, and not given to the next document,
        // although it was the largest (SQLite alone would give it again).
        _ = try db.deleteDocument("a")
        #expect(try db.storageKey(of: "a") == a && db.documentID(storageKey: a) == "a")
        try db.purge(["b": [last.revID]])
        #expect(try db.storageKey(of: "b") == nil && db.documentID(storageKey: b) == nil)
        _ = try save(db, "c", ["n": 3])
        #expect(try #require(try db.storageKey(of: "c")) > b)
        _ = try save(db, "b", ["n": 4])
        #expect(try #require(try db.storageKey(of: "b")) > b, "a purged id saved again is a new document")
        // Reopened, the same.
        let reopened = try Database.open(at: db.path)
        _ = try save(reopened, "d", ["n": 5])
        #expect(try #require(try reopened.storageKey(of: "d")) > b + 2)
    }

    @Test func insertWithHistoryGraftsBranchesAndPicksCouchDBsWinner() throws {
        let db = try directory.makeDatabase()
        let root = RevisionID("1-aaa")!
        #expect(try db.insert(ReplicatedRevision(docID: "c", revID: RevisionID("2-ced")!, ancestors: [root], properties: ["side": "A"])))
        #expect(try db.insert(ReplicatedRevision(docID: "c", revID: RevisionID("3-764")!, ancestors: [RevisionID("2-bbb")!, root],
                                                  properties: ["side": "B"])))
        // Already known: a no-op.
        #expect(try !db.insert(ReplicatedRevision(docID: "c", revID: RevisionID("2-ced")!, ancestors: [root], properties: ["side": "A"])))
        let tree = try db.revisionTree(of: "c")
        #expect(tree.nodes.count == 4)
        #expect(tree.winner?.id == RevisionID("3-764"))
        #expect(tree.conflicts.map(\.id) == [RevisionID("2-ced")!])
        #expect(try db.document(withID: "c")?.properties == ["side": "B"])
        // History revisions have no body.
        #expect(throws: SofaError.revisionNotFound(docID: "c", revID: "1-aaa")) { try db.revision(root, of: "c") }

        // Deleting the winning branch makes the other one win.
        #expect(try db.insert(ReplicatedRevision(docID: "c", revID: RevisionID("4-ddd")!, ancestors: [RevisionID("3-764")!],
                                                  deleted: true, properties: [:])))
        #expect(try db.document(withID: "c")?.properties == ["side": "A"])
        #expect(try db.revisionTree(of: "c").conflicts.isEmpty)
    }

    @Test func graftingOntoALeafThroughMissingRevisionsLeavesNoPhantomConflict() throws {
        let db = try directory.makeDatabase()
        let first = try db.save({ var d = try db.newRevision(of: "doc"); d.properties = ["v": 1]; return d }())
        let third = RevisionID(generation: 3, suffix: "ccc")
        #expect(try db.insert(ReplicatedRevision(docID: "doc", revID: third, ancestors: [RevisionID("2-bbb")!, first.revID],
                                                  properties: ["v": 3])))
        let reopened = try Database.open(at: db.path)
        let tree = try reopened.revisionTree(of: "doc")
        #expect(tree.leaves.map(\.id) == [third])
        #expect(tree.conflicts.isEmpty)
        #expect(tree.history(of: third) == [third, RevisionID("2-bbb")!, first.revID])
    }

    @Test func twoReplicasAgreeOnTheWinnerWhateverTheOrder() throws {
        let revisions = [
            ReplicatedRevision(docID: "d", revID: RevisionID("2-b")!, ancestors: [RevisionID("1-a")!], properties: ["v": 1]),
            ReplicatedRevision(docID: "d", revID: RevisionID("2-c")!, ancestors: [RevisionID("1-a")!], properties: ["v": 2]),
            ReplicatedRevision(docID: "d", revID: RevisionID("3-a")!, ancestors: [RevisionID("2-b")!, RevisionID("1-a")!],
                               deleted: true, properties: [:]),
        ]
        let one = try directory.makeDatabase("one.sofa")
        let two = try directory.makeDatabase("two.sofa")
        for revision in revisions { try one.insert(revision) }
        for revision in revisions.reversed() { try two.insert(revision) }
        #expect(try one.document(withID: "d")?.revID == RevisionID("2-c"))
        #expect(try two.document(withID: "d")?.revID == RevisionID("2-c"))
    }

    @Test func insertRefusesABrokenHistory() throws {
        let db = try directory.makeDatabase()
        #expect(throws: SofaError.self) {
            try db.insert(ReplicatedRevision(docID: "x", revID: RevisionID("3-a")!, ancestors: [RevisionID("1-a")!], properties: [:]))
        }
        #expect(throws: SofaError.self) {
            try db.insert(ReplicatedRevision(docID: "_local/x", revID: RevisionID("1-a")!, ancestors: [], properties: [:]))
        }
    }

    @Test func revsLimitPrunesOldAncestors() throws {
        let db = try directory.makeDatabase(revsLimit: 5)
        for n in 1...12 { _ = try save(db, "doc", ["n": .integer(Int64(n))]) }
        let tree = try db.revisionTree(of: "doc")
        #expect(tree.nodes.count == 5)
        #expect(tree.winner?.id.generation == 12)
        #expect(tree.nodes.keys.map(\.generation).min() == 8)
    }

    @Test func changesListEachDocumentOnceAtItsLatestChange() throws {
        let db = try directory.makeDatabase()
        _ = try save(db, "a", ["n": 1])
        _ = try save(db, "b", ["n": 1])
        _ = try save(db, "a", ["n": 2])
        _ = try db.deleteDocument("b")
        let changes = try db.changes()
        #expect(changes.map(\.docID) == ["a", "b"])
        #expect(changes.map(\.sequence) == [3, 4])
        #expect(changes[1].deleted)
        #expect(try db.changes(since: 3).map(\.docID) == ["b"])
        #expect(try db.changes(since: 4).isEmpty)
        #expect(try db.lastSequence == 4)
        #expect(try db.changes(limit: 1).map(\.docID) == ["a"])
    }

    @Test func localDocumentsStayOutOfChangesAndRevisions() throws {
        let db = try directory.makeDatabase()
        let rev = try db.putLocalDocument("_local/ckpt", body: ["seq": 5])
        #expect(rev == "0-1")
        #expect(try db.putLocalDocument("_local/ckpt", body: ["seq": 6], rev: "0-1") == "0-2")
        #expect(throws: SofaError.conflict(docID: "_local/ckpt", revID: "0-1", current: "0-2")) {
            try db.putLocalDocument("_local/ckpt", body: ["seq": 7], rev: "0-1")
        }
        #expect(try db.localDocument(withID: "_local/ckpt")?.body == ["seq": 6])
        #expect(try db.changes().isEmpty)
        #expect(try db.documents().isEmpty)
        try db.deleteLocalDocument("_local/ckpt")
        #expect(try db.localDocument(withID: "_local/ckpt") == nil)
        var draft = try db.newRevision(of: "_local/x")
        draft.properties = [:]
        #expect(throws: SofaError.self) { try db.save(draft) }
    }

    @Test func refusesBadIDsNamesAndReservedKeys() throws {
        let db = try directory.makeDatabase()
        #expect(throws: SofaError.invalidDocumentID("", reason: "it is empty")) { try db.newRevision(of: "") }
        #expect(throws: SofaError.self) { try db.newRevision(of: "_secret") }
        var draft = try db.newRevision(of: "ok")
        #expect(throws: SofaError.invalidAttachmentName("", reason: "it is empty")) { try draft.setAttachment("", data: [1]) }
        #expect(throws: SofaError.self) { try draft.setAttachment("_x", data: [1]) }
        draft.properties = ["_rev": "1-x"]
        #expect(throws: SofaError.self) { try db.save(draft) }
        #expect(try db.document(withID: "ok") == nil)
        #expect(try db.lastSequence == 0)
    }

    @Test func listsDocumentsPageByPage() throws {
        let db = try directory.makeDatabase()
        try db.inBatch { batch in
            for n in 0..<250 {
                var draft = try db.newRevision(of: String(format: "doc-%03d", n))
                draft.properties = ["n": .integer(Int64(n))]
                try batch.save(draft)
            }
        }
        var seen: [String] = []
        var after: String?
        while case let page = try db.documents(after: after, limit: 100), let last = page.last {
            seen += page.map(\.docID)
            after = last.docID
        }
        #expect(seen.count == 250 && seen == seen.sorted())
        #expect(try db.documents(offset: 10, limit: 5).map(\.docID) == ["doc-010", "doc-011", "doc-012", "doc-013", "doc-014"])
    }

    @Test func aFailedBatchSavesNothing() throws {
        let db = try directory.makeDatabase()
        #expect(throws: SofaError.self) {
            try db.inBatch { batch in
                var good = try db.newRevision(of: "good")
                good.properties = ["ok": true]
                try batch.save(good)
                var bad = try db.newRevision(of: "bad")
                bad.properties = ["_bad": true]
                try batch.save(bad)
            }
        }
        #expect(try db.document(withID: "good") == nil)
        #expect(try db.lastSequence == 0)
    }
}


/// What a mount keeps for fsynced writes not saved yet (`pending_saves`) survives compaction;
/// bytes no row names any more go once they are old.
/// What a killed copy, `encrypt` or `decrypt` left beside a database.
@Suite struct AbandonedCopyTests {
    let directory = TemporaryDirectory()

    /// A process id that no longer runs.
    func deadPID() throws -> pid_t {
        let child = try ChildProcess(["/bin/true"])
        _ = child.wait()
        return child.pid
    }

    @Test func aHalfMadeCopyGoesWhenTheDatabaseIsOpened() throws {
        let path = directory.appending("x.sofa")
        _ = try Database.create(at: path).put("kept", ["a": 1])
        let half = directory.appending(".x.sofa.partial-\(try deadPID())")
        try FileManager.default.createDirectory(atPath: half + "/attachments", withIntermediateDirectories: true)
        try Data("plaintext".utf8).write(to: URL(fileURLWithPath: half + "/db.sqlite3"))
        let running = directory.appending(".x.sofa.partial-\(getpid())")  // a copy under way: left alone
        try FileManager.default.createDirectory(atPath: running, withIntermediateDirectories: true)
        #expect(try Database.open(at: path).currentRevision(of: "kept") != nil)
        #expect(access(half, F_OK) != 0)
        #expect(access(running, F_OK) == 0)
    }

    /// Killed between moving the old database aside and renaming the new one into place: the
    /// old one comes back when its path is opened, and the half-installed one goes.
    @Test func aDatabaseSetAsideByAKilledReplacementComesBack() throws {
        let path = directory.appending("y.sofa")
        _ = try Database.create(at: path).put("kept", ["a": 1])
        let pid = try deadPID()
        #expect(rename(path, directory.appending(".y.sofa.partial-\(pid).replaced")) == 0)
        _ = try Database.create(at: directory.appending(".y.sofa.partial-\(pid)"))
        #expect(try Database.open(at: path).currentRevision(of: "kept") != nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["y.sofa"])
    }
}
