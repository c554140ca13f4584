import BLIP
import DocumentModel
import DocumentStore
import Foundation

/// A server's side of a pull: `subChanges` starts sending this database's changes after
/// `since`, with `continuous` as they happen until the connection ends.
///
/// Two rules keep a client from passing a change it never got:
/// - **A document whose bodies cannot be produced holds the feed.** Before a change is offered,
///   the bodies of its revision that this database left on its own remote are fetched; when that
///   fails, neither it nor anything after it is offered (Couchbase Lite's checkpoint moves past
///   every change it was offered, fetched or not). It is tried again with backoff; a one-shot
///   pull is then told it caught up, so it ends with everything before it, and its next pull
///   starts there.
/// - **An active-only pull's checkpoint covers the deletions it filtered out.** Deletions at the
///   end of the feed are never offered, so the client's checkpoint would stop before them and
///   its next pull would read them again: the last one is offered, and answered `norev` if asked.
extension BLIPReplicator {
    struct Feed: Sendable {
        let since: Int64
        let continuous: Bool
        let batch: Int
        let activeOnly: Bool
        let docIDs: Set<String>?
    }

    func subscribe(_ request: BLIPMessage, _ passive: Passive) async throws {
        if let filter = request["filter"] {
            throw BLIPError.badRequest("filter \(filter): Sofa has no Sync Gateway channels or filters; pull everything, or name documents (docIDs)")
        }
        var since: Int64 = 0
        if let text = request["since"], !text.isEmpty {
            let value = try? JSONParser.parse(Array(text.utf8))
            guard let sequence = value?.int64Value ?? value?.stringValue.flatMap({ Int64($0) }) ?? Int64(text) else {
                throw BLIPError.badRequest("since: \(text) is not a sequence of this database")
            }
            since = sequence
        }
        var docIDs: Set<String>?
        if !request.body.isEmpty {
            guard let object = try Self.json(request, "subChanges").objectValue else {
                throw BLIPSyncError.protocolViolation("subChanges: the body is not a JSON object")
            }
            docIDs = object["docIDs"]?.arrayValue.map { Set($0.compactMap(\.stringValue)) }
        }
        let feed = Feed(since: since, continuous: request.flag("continuous"),
                        batch: max(1, Int(request["batch"] ?? "") ?? BLIPTuning.changesBatch),
                        activeOnly: request.flag("activeOnly"), docIDs: docIDs)
        await connection.reply(to: request)
        let task = Task {
            do {
                try await self.serve(feed, passive)
            } catch is CancellationError {
            } catch BLIPSyncError.closed {
            } catch {
                self.log.warning("\(self.name): sending changes to a Couchbase Lite replicator stopped: \(error)")
                await self.close("sending changes failed: \(error)")
            }
        }
        subscriptions.withLock { $0.append(task) }
    }

    private func serve(_ feed: Feed, _ passive: Passive) async throws {
        let db = database
        var since = feed.since
        var activeOnly = feed.activeOnly
        var caughtUp = false
        var heldTries = 0
        try await withThrowingTaskGroup(of: Void.self) { group in
            var inFlight = 0
            func drain() async throws {
                while inFlight > 0 {
                    try await group.next()
                    inFlight -= 1
                }
            }
            while !Task.isCancelled {
                let position = db.changeStream.current
                let from = since
                let page = try await pool.run { try db.changes(since: from, limit: feed.batch) }
                let atEnd = page.count < feed.batch
                var offered: [Offered] = []
                var filteredAtEnd: Change?
                for change in page where feed.docIDs?.contains(change.docID) ?? true {
                    if activeOnly && change.deleted {
                        filteredAtEnd = change
                    } else {
                        offered.append(Offered(change: change))
                        filteredAtEnd = nil
                    }
                }
                // Read before they are offered: the revisions go out as soon as the answer comes.
                var loaded = try await load(offered.map(\.change))
                let (held, fetched) = try await heldChange(in: offered, loaded, passive)
                if fetched { loaded = try await load(offered.map(\.change)) }  // bodies fetched since are here, named by SHA-1
                if let held {
                    offered = Array(offered.prefix { $0.change.sequence < held.change.sequence })
                    since = held.change.sequence - 1
                } else {
                    if atEnd, let filteredAtEnd { offered.append(Offered(change: filteredAtEnd, coverOnly: true)) }
                    since = page.last?.sequence ?? from
                }
                if !offered.isEmpty {
                    if inFlight >= BLIPTuning.changesInFlight {
                        try await group.next()
                        inFlight -= 1
                    }
                    inFlight += 1
                    let (batch, preloaded) = (offered, loaded)
                    group.addTask { _ = try await self.send(batch, preloaded: preloaded) }
                }
                if let held {
                    try await drain()
                    heldTries += 1
                    log.warning("\(name): \(held.change.docID) holds the changes feed (try \(heldTries)): \(held.reason)")
                    if !feed.continuous && heldTries > BLIPTuning.heldRetries {
                        // Everything before it went: the client ends there, and starts there next time.
                        _ = try await request("changes", body: Array("[]".utf8))
                        return
                    }
                    let delay = min(BLIPTuning.heldRetryDelay * Double(1 << min(heldTries - 1, 16)), BLIPTuning.heldRetryMaximum)
                    try await Task.sleep(nanoseconds: UInt64(delay * 1e9))
                    continue
                }
                heldTries = 0
                guard atEnd else { continue }
                if !caughtUp {
                    // Everything there was is offered: an empty `changes` says so. From then on a
                    // deletion is news, also to an active-only pull (LiteCore stops skipping them).
                    try await drain()
                    _ = try await request("changes", body: Array("[]".utf8))
                    caughtUp = true
                    activeOnly = false
                }
                guard feed.continuous else { break }
                _ = await db.changeStream.next(after: position, until: nil)
            }
            try await group.waitForAll()
        }
    }

    /// The first change whose revision has a body that is not here and cannot be fetched now,
    /// with the reason; the bodies of the changes before it are here once this returns.
    /// `fetched`: some body was (or was tried to be) fetched.
    private func heldChange(in offered: [Offered], _ loaded: Loaded, _ passive: Passive) async throws
        -> (held: (change: Change, reason: String)?, fetched: Bool) {
        let waiting = offered.compactMap { item -> (Change, [Attachment])? in
            guard !item.change.deleted, let (revision, _) = loaded[BLIPReplicator.key(item.change.docID, item.change.revID)] else { return nil }
            let absent = revision.attachments.filter { !$0.contentAvailable }
            return absent.isEmpty ? nil : (item.change, absent)
        }
        guard !waiting.isEmpty else { return (nil, false) }
        let source = passive.bodySource
        let held = try await pool.run { () -> (Change, String)? in
            for (change, absent) in waiting {
                for attachment in absent {
                    guard let source else {
                        return (change, "the body of \(attachment.name) is not here, and this database knows no remote to fetch it from")
                    }
                    do { try source.fetch(attachment, docID: change.docID, revID: change.revID) } catch {
                        return (change, "the body of \(attachment.name) cannot be fetched from the remote: \(error)")
                    }
                }
            }
            return nil
        }
        return (held.map { (change: $0.0, reason: $0.1) }, true)
    }
}
