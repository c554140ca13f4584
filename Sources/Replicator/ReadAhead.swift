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

/// Pages read ahead of the writes by two threads with peers of their own (their own HTTP
/// connections): one reads the source's changes, page after page; the other asks the target's
/// `_revs_diff` about each and fetches the revisions with their bodies. So the changes, the
/// fetch and the target's writes of three successive pages travel at once, and a replication
/// takes about the longest of the three rather than their sum. `ReplicatorTuning.pagesAhead`
/// pages wait at most between two steps (memory: their JSON; bodies are on disk).
final class PagesReadAhead: PageSource, @unchecked Sendable {
    // Sendable invariant: each peer is used by one thread only (`changesSource` by the
    // changes reader, `source` and `target` by the fetcher); the queues lock themselves.
    private let changesSource: ReplicationPeer
    private let source: ReplicationPeer
    private let target: ReplicationPeer
    private let filter: ReplicationFilter
    private let limit: Int
    private let cancellation: Cancellation
    private let batches = HandOff<ChangeBatch>(capacity: ReplicatorTuning.pagesAhead)
    private let pages = HandOff<FetchedPage>(capacity: ReplicatorTuning.pagesAhead)
    private let running = DispatchGroup()

    /// `cancellation`: stops the readers' requests in flight when the routine ends early.
    init(changesFrom changesSource: ReplicationPeer, source: ReplicationPeer, target: ReplicationPeer, filter: ReplicationFilter,
         since: JSONValue, limit: Int, cancellation: Cancellation) {
        (self.changesSource, self.source, self.target) = (changesSource, source, target)
        (self.filter, self.limit, self.cancellation) = (filter, limit, cancellation)
        for (name, changes) in [("sofa-changes", true), ("sofa-fetch", false)] {
            running.enter()
            let thread = Thread { [self] in
                if changes { readChanges(from: since) } else { fetchPages() }
                running.leave()
            }
            thread.name = name
            thread.start()
        }
    }

    private func readChanges(from start: JSONValue) {
        var since = start
        while true {
            let read = Result { try changesSource.changes(since: since, limit: limit * ReplicatorTuning.pagesPerChangesRequest, filter: filter) }
            guard case .success(let changes) = read else { _ = batches.put(read); return }
            for page in changes.pages(of: limit) {
                guard batches.put(.success(page)) else { return }
            }
            if changes.isLast { return }
            since = changes.lastSequence
        }
    }

    private func fetchPages() {
        while let batch = batches.take() {
            let page = batch.flatMap { batch in Result { try FetchedPage.fetch(batch, from: source, to: target) } }
            guard pages.put(page), case .success(let fetched) = page, !fetched.batch.isLast else { return }
        }
    }

    func next() throws -> FetchedPage {
        guard let page = pages.take() else { throw ReplicationError.cancelled }
        return try page.get()
    }

    func stop() {
        batches.stop()
        pages.stop()
        cancellation.cancel()
        running.wait()
    }
}

/// Results handed from one thread to the next, at most `capacity` waiting.
final class HandOff<Value>: @unchecked Sendable {
    // Sendable invariant: `items` and `stopped` are guarded by `condition`.
    private let condition = NSCondition()
    private var items: [Result<Value, any Error>] = []
    private var stopped = false
    private let capacity: Int

    init(capacity: Int) { self.capacity = max(1, capacity) }

    /// Waits for room; false once stopped (the item is dropped).
    func put(_ item: Result<Value, any Error>) -> Bool {
        condition.withLock {
            while items.count >= capacity && !stopped { condition.wait() }
            guard !stopped else { return false }
            items.append(item)
            condition.broadcast()
            return true
        }
    }

    /// Waits for an item; nil once stopped.
    func take() -> Result<Value, any Error>? {
        condition.withLock {
            while items.isEmpty && !stopped { condition.wait() }
            guard !stopped else { return nil }
            condition.broadcast()
            return items.removeFirst()
        }
    }

    func stop() {
        condition.withLock {
            stopped = true
            condition.broadcast()
        }
    }
}
