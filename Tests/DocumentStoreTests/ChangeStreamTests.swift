import DocumentModel
import DocumentStore
import MountTables
import Foundation
import Testing
import TestSupport

/// `Database.changeStream`: every commit, this process's and others', wakes its waiters; an
/// idle database wakes nobody.
@Suite struct ChangeStreamTests {
    let directory = TemporaryDirectory()

    @Test func ownCommitsMoveTheStreamAndWakeAWaiter() throws {
        let db = try directory.makeDatabase()
        let stream = db.changeStream
        let start = stream.current
        // Nothing happens: a wait ends at its deadline with the position unchanged.
        #expect(stream.wait(after: start, until: Date().addingTimeInterval(0.2)) == start)
        let woken = DispatchSemaphore(value: 0)
        let seen = Locked<UInt64>(start)
        Thread.detachNewThread {
            let now = stream.wait(after: start)
            seen.withLock { $0 = now }
            woken.signal()
        }
        usleep(50_000)
        try db.put("a", ["n": 1])
        #expect(woken.wait(timeout: .now() + 10) == .success)
        #expect(seen.withLock { $0 } != start)
        // A commit made before the wait is not lost: the wait returns at once.
        let before = stream.current
        try db.put("b", ["n": 2])
        #expect(stream.wait(after: before, until: Date().addingTimeInterval(10)) != before)
    }

    /// The stream says which commits may have changed documents or bodies: a mount's watcher
    /// passes over the others (a staged file commits once per closed file in a burst).
    @Test func commitsThatChangeNoDocumentAreToldApart() throws {
        let db = try directory.makeDatabase()
        let stream = db.changeStream
        try db.put("doc", ["n": 1])
        let afterSave = stream.lastDocumentChange
        #expect(afterSave == stream.current, "a save changes a document")
        let blob = try db.blobs.write(Array("staged".utf8))
        _ = try db.stage(StagedAttachment.Draft(docID: "doc", attachment: Attachment(name: "s.txt", contentType: "text/plain", blob: blob, revpos: 0),
                                                expectedDigest: nil, base: try db.currentRevision(of: "doc")?.revID, given: LocalAttributes()))
        _ = try db.replaceLocalDocument("_local/x", body: ["a": 1], after: nil)
        #expect(stream.current != afterSave, "those commits are published")
        #expect(stream.lastDocumentChange == afterSave, "but change no document")
        let second = try db.put("other", ["n": 2])
        #expect(stream.lastDocumentChange == stream.current && stream.lastDocumentChange != afterSave)
        try db.purge(["other": [second.revID]])
        #expect(stream.lastDocumentChange == stream.current, "a document purged away counts")
    }

    /// Another connection's commit (another `Database` on the file, then another process) is
    /// found through inotify, long before the slow look (`Tuning.foreignChangeSafetyInterval`,
    /// 5 s) would find it: each wait here allows 2 s.
    @Test func anotherConnectionsAndAnotherProcesssCommitsWakeAWaiter() throws {
        let db = try directory.makeDatabase()
        let stream = db.changeStream
        var position = stream.current
        let other = try Database.open(at: db.path)
        for n in 0..<5 {
            try other.put("from-other-\(n)", ["n": .integer(Int64(n))])
            let now = stream.wait(after: position, until: Date().addingTimeInterval(2))
            #expect(now != position, "commit \(n) of another connection not seen within 2 s")
            position = now
            #expect(try db.document(withID: "from-other-\(n)") != nil)
        }
        for n in 0..<3 {
            #expect(try sofa("put", db.path, "from-cli-\(n)", #"{"cli":true}"#).succeeded)
            // The CLI has exited: its commit happened. Wait for the stream to say so.
            let deadline = Date().addingTimeInterval(2)
            var found = false
            while !found && Date() < deadline {
                position = stream.wait(after: position, until: deadline)
                found = try db.document(withID: "from-cli-\(n)") != nil && db.lastSequence == (try other.lastSequence)
            }
            #expect(found, "the CLI's commit \(n) not seen within 2 s")
        }
        // An idle database moves nothing (this process's reads included).
        _ = try db.changes(since: 0)
        let idle = stream.current
        #expect(stream.wait(after: idle, until: Date().addingTimeInterval(0.5)) == idle)
    }

    @Test func aWaiterToldToStopReturnsAndAClosedStreamNeverBlocks() throws {
        let db = try directory.makeDatabase()
        let stream = db.changeStream
        let stopped = Locked(false)
        let done = DispatchSemaphore(value: 0)
        let position = stream.current
        Thread.detachNewThread {
            // The loop a subscriber runs: wait until stopped.
            var seen = position
            while !stopped.withLock({ $0 }) { seen = stream.wait(after: seen, unless: { stopped.withLock { $0 } }) }
            done.signal()
        }
        usleep(50_000)
        stopped.withLock { $0 = true }
        stream.wakeWaiters()
        #expect(done.wait(timeout: .now() + 10) == .success)

        let signal = ChangeStream()
        signal.close()
        #expect(signal.isClosed)
        let start = Date()
        signal.wait(after: signal.current)
        #expect(Date().timeIntervalSince(start) < 5)
    }

    @Test func anAsyncWaitEndsAtACommitAtItsDeadlineAndWhenCancelled() async throws {
        let db = try directory.makeDatabase()
        let stream = db.changeStream
        let start = stream.current
        // At its deadline, unchanged.
        let quiet = await stream.next(after: start, until: .now + .milliseconds(100))
        #expect(quiet == start)
        // At a commit.
        let waiting = Task { await stream.next(after: start) }
        try await Task.sleep(for: .milliseconds(50))
        try db.put("a", ["n": 1])
        #expect(await waiting.value != start)
        // When cancelled, though nothing changed.
        let now = stream.current
        let cancelled = Task { await stream.next(after: now) }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        #expect(await cancelled.value == now)
    }
}
