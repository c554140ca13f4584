import BLIP
import DocumentModel
import DocumentStore
import Foundation

/// A client's side: pulling what the server has, pushing what this database has, watching for
/// the server's next change. The caller keeps the checkpoints (their ids and format are the
/// replicator's, shared with HTTP); the engine says how far each run got.
extension BLIPReplicator {
    /// How far a run got and what it did.
    public struct Report: Sendable {
        /// The sequence the checkpoint may hold (the server's on a pull, this database's on a
        /// push): every change up to it arrived; nil while none did.
        public var checkpoint: JSONValue?
        public var changesRead = 0
        public var revisionsRead = 0
        public var revisionsWritten = 0
        public var bodiesFetched = 0
        public var bodyBytesFetched: Int64 = 0
        public var bodiesDeferred = 0
        public var failures: [DocumentFailure] = []
    }

    /// Pulls every change after `since` (the server's sequence), saving each revision with its
    /// history and the bodies the download rules take. `report` is called as the checkpoint
    /// moves, at most every `interval` seconds, and at the end; `stopped` ends the run early
    /// (throwing `CancellationError`).
    public func pull(since: JSONValue, docIDs: [String]?, channels: [String]?, batch: Int = BLIPTuning.changesBatch,
                     interval: Double, stopped: @escaping @Sendable () -> Bool,
                     report: @escaping @Sendable (Report) async throws -> Void) async throws -> Report {
        var properties: [(String, String)] = [("batch", String(batch))]
        if since != 0 && since != .string("0") { properties.append(("since", since.jsonString())) }
        if let channels { properties += [("filter", "sync_gateway/bychannel"), ("channels", channels.joined(separator: ","))] }
        let body: [UInt8] = docIDs.map { JSONValue.object(["docIDs": .array($0.map { .string($0) })]).serialized() } ?? []
        _ = try await request("subChanges", properties, body: body)
        var reported: JSONValue?
        var lastReport = Date()
        var lastNews = (version: -1, at: Date())
        while true {
            let now = pull.snapshot
            if let ended = now.ended { throw ended }
            let current = Self.report(now)
            if now.finished {
                try await report(current)
                return current
            }
            if stopped() { throw CancellationError() }
            if now.version != lastNews.version { lastNews = (now.version, Date()) }
            if Date().timeIntervalSince(lastNews.at) > BLIPTuning.silence { throw BLIPSyncError.silent("the server's changes") }
            if now.checkpoint != reported, Date().timeIntervalSince(lastReport) >= interval {
                try await report(current)
                (reported, lastReport) = (now.checkpoint, Date())
            }
            await pull.wait(after: now.version, atMost: 0.5)
        }
    }

    private static func report(_ snapshot: PullTracker.Snapshot) -> Report {
        var report = snapshot.counts
        report.checkpoint = snapshot.checkpoint
        return report
    }

    /// Pushes every change of this database after `since`: each proposed, sent if the server
    /// wants it. A resolved conflict whose losing branch is the server's current revision is
    /// moved onto that revision (see `Database.resolution(of:onto:)`). `report` is called after
    /// each batch; the checkpoint stops before the first change that failed.
    public func push(since: Int64, docIDs: [String]?, batch: Int = BLIPTuning.changesBatch,
                     stopped: @escaping @Sendable () -> Bool,
                     report: @escaping @Sendable (Report) async throws -> Void) async throws -> Report {
        let db = database
        let only = docIDs.map(Set.init)
        var position = since
        var held = false
        var result = Report(checkpoint: .integer(since))
        while true {
            if stopped() { throw CancellationError() }
            let from = position
            let page = try await pool.run { try db.changes(since: from, limit: batch) }
            let offered = page.filter { only?.contains($0.docID) ?? true }
            let outcomes = try await send(offered.map { Offered(change: $0) })
            let byDocument = Dictionary(zip(offered.map(\.sequence), outcomes), uniquingKeysWith: { first, _ in first })
            result.changesRead += page.count
            for change in page {
                switch byDocument[change.sequence] {
                case .sent?:
                    result.revisionsRead += 1
                    result.revisionsWritten += 1
                case .failed(let failure)?:
                    result.revisionsRead += 1
                    result.failures.append(failure)
                    held = true
                case .notWanted?, nil:
                    break
                }
                if !held { result.checkpoint = .integer(change.sequence) }
            }
            position = page.last?.sequence ?? from
            try await report(result)
            if page.count < batch { return result }
        }
    }

    /// Returns once the server has a change after `since` (a continuous subscription whose
    /// first `changes` with something in it ends the wait); the connection should be made with
    /// `Active(watchOnly: true)`. Throws `CancellationError` once `stopped` says so.
    public func waitForChange(since: JSONValue, stopped: @escaping @Sendable () -> Bool) async throws {
        var properties: [(String, String)] = [("batch", "1"), ("continuous", "true")]
        if since != 0 && since != .string("0") { properties.append(("since", since.jsonString())) }
        _ = try await request("subChanges", properties)
        while true {
            let now = pull.snapshot
            if let ended = now.ended { throw ended }
            if now.counts.changesRead > 0 { return }
            if stopped() { throw CancellationError() }
            await pull.wait(after: now.version, atMost: 0.5)
        }
    }
}
