import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport

/// A page of changes with what the target lacks of it (`_revs_diff`) and the revisions the
/// source gave for that (with their bodies, where they come along): steps 1 to 3 of the
/// routine, ready to be written.
struct FetchedPage {
    let batch: ChangeBatch
    let missing: [(id: String, missing: MissingRevisions)]
    let reads: [Result<ReplicatedRevision, DocumentFailure>]

    /// Steps 2 and 3 for one page of changes.
    static func fetch(_ batch: ChangeBatch, from source: ReplicationPeer, to target: ReplicationPeer) throws -> FetchedPage {
        let asked = batch.changes.map { (id: $0.docID, revs: $0.revs) }.filter { !$0.revs.isEmpty }
        guard !asked.isEmpty else { return FetchedPage(batch: batch, missing: [], reads: []) }
        let missing = try target.revsDiff(asked)
        guard !missing.isEmpty else { return FetchedPage(batch: batch, missing: [], reads: []) }
        let wanted = missing.flatMap { id, entry in entry.missing.map { (id: id, rev: $0) } }
        return FetchedPage(batch: batch, missing: missing, reads: try source.revisions(wanted, bodies: target.bodyRequest(for: missing)))
    }
}

/// Where the routine takes its pages from.
protocol PageSource {
    /// The next page; after one that `isLast`, none is asked for.
    func next() throws -> FetchedPage
    /// Ends what reads ahead, if anything does (also after an error).
    func stop()
}

/// Pages read when asked for, on the routine's thread (a BLIP peer is one conversation).
final class PagesInTurn: PageSource {
    private let source: ReplicationPeer
    private let target: ReplicationPeer
    private let filter: ReplicationFilter
    private let limit: Int
    private var since: JSONValue

    init(source: ReplicationPeer, target: ReplicationPeer, filter: ReplicationFilter, since: JSONValue, limit: Int) {
        (self.source, self.target, self.filter, self.since, self.limit) = (source, target, filter, since, limit)
    }

    func next() throws -> FetchedPage {
        let page = try FetchedPage.fetch(try source.changes(since: since, limit: limit, filter: filter), from: source, to: target)
        since = page.batch.lastSequence
        return page
    }

    func stop() {}
}

/// Pages read ahead of the writes, on a thread of their own with peers of their own (their
/// own HTTP connection): the source's next page of changes, the target's `_revs_diff` and the
/// revisions with their bodies travel while the target writes the page before, so a
/// replication takes about the longer of the two rather than their sum.
/// `ReplicatorTuning.pagesAhead` pages wait at most (memory: their JSON; bodies are on disk).
final class PagesReadAhead: PageSource, @unchecked Sendable {
    // Sendable invariant: `source`, `target` and `filter` are used only by the reading
    // thread once it starts; `pending`, `stopped` and `running` are guarded by `condition`.
    private let source: ReplicationPeer
    private let target: ReplicationPeer
    private let filter: ReplicationFilter
    private let limit: Int
    private let cancellation: Cancellation
    private let condition = NSCondition()
    private var pending: [Result<FetchedPage, any Error>] = []
    private var stopped = false
    private var running = true

    /// `cancellation`: stops the readers' requests in flight when the routine ends early.
    init(source: ReplicationPeer, target: ReplicationPeer, filter: ReplicationFilter, since: JSONValue, limit: Int,
         cancellation: Cancellation) {
        (self.source, self.target, self.filter, self.limit, self.cancellation) = (source, target, filter, limit, cancellation)
        let thread = Thread { [self] in read(from: since) }
        thread.name = "sofa-read-ahead"
        thread.start()
    }

    private func read(from start: JSONValue) {
        var since = start
        while true {
            let item = Result { try FetchedPage.fetch(try source.changes(since: since, limit: limit, filter: filter), from: source, to: target) }
            let kept = condition.withLock { () -> Bool in
                while pending.count >= ReplicatorTuning.pagesAhead && !stopped { condition.wait() }
                guard !stopped else { return false }
                pending.append(item)
                condition.broadcast()
                return true
            }
            guard kept, case .success(let page) = item, !page.batch.isLast else { break }
            since = page.batch.lastSequence
        }
        condition.withLock {
            running = false
            condition.broadcast()
        }
    }

    func next() throws -> FetchedPage {
        try condition.withLock {
            while pending.isEmpty {
                guard running else { throw ReplicationError.protocolError("read past the last page of changes") }
                condition.wait()
            }
            condition.broadcast()
            return pending.removeFirst()
        }.get()
    }

    func stop() {
        condition.withLock {
            stopped = true
            condition.broadcast()
        }
        cancellation.cancel()
        condition.withLock { while running { condition.wait() } }
    }
}
