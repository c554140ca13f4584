import DocumentModel
import Foundation

/// What a compaction would free now, and what the database takes in all.
public struct CompactionEstimate: Sendable, Equatable {
    /// Bodies of revisions that are no longer leaves (dropped by a compaction).
    public var oldRevisionBodyBytes: Int64 = 0
    /// Pages SQLite keeps free inside its file (given back by the VACUUM).
    public var freePageBytes: Int64 = 0
    /// Blob files no revision or staged file references, older than `Tuning.blobGracePeriod`
    /// (younger ones are kept by a compaction that is not alone: see `Database.compact`).
    public var unreferencedBlobBytes: Int64 = 0
    /// The SQLite file and its log, and every blob file.
    public var totalBytes: Int64 = 0

    public var reclaimableBytes: Int64 { oldRevisionBodyBytes + freePageBytes + unreferencedBlobBytes }

    public init(oldRevisionBodyBytes: Int64 = 0, freePageBytes: Int64 = 0, unreferencedBlobBytes: Int64 = 0, totalBytes: Int64 = 0) {
        (self.oldRevisionBodyBytes, self.freePageBytes) = (oldRevisionBodyBytes, freePageBytes)
        (self.unreferencedBlobBytes, self.totalBytes) = (unreferencedBlobBytes, totalBytes)
    }
}

extension Database {
    /// A mark that changes whenever the database is written: a revision saved (its sequence), a
    /// body fetched, purged or evicted (`body_events`), a mount's file staged. Equal marks some
    /// time apart mean nobody wrote in between.
    func activityMark() throws -> [Int64] {
        try read { connection in
            var mark = [try Database.lastSequence(in: connection)]
            if schema.has(Schema.bodyEvents) { mark += try connection.query("SELECT COALESCE(MAX(seq), 0) FROM body_events") { $0.int64(0) } }
            return mark + (try schema.activity(in: connection, folder: path))
        }
    }

    /// What `compact()` would free now, read without the write lock: the blob listing and the
    /// references are read apart, so a save meanwhile can make the figure a little off (the
    /// compaction itself decides under the lock).
    public func compactionEstimate() throws -> CompactionEstimate {
        var estimate = CompactionEstimate()
        let referenced = try read { connection -> Set<String> in
            estimate.oldRevisionBodyBytes = try connection.query("SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0) FROM revs WHERE leaf = 0 AND body IS NOT NULL") {
                $0.int64(0)
            }[0]
            let pageSize = try connection.query("PRAGMA page_size") { $0.int64(0) }[0]
            estimate.freePageBytes = try connection.query("PRAGMA freelist_count") { $0.int64(0) }[0] * pageSize
            // What a compaction keeps: the bodies of leaf revisions, however they name them.
            var keys = Set(try connection.query("""
                SELECT DISTINCT a.blob_key FROM rev_attachments a JOIN revs r ON r.doc_key = a.doc_key AND r.rev_id = a.rev_id
                    WHERE r.leaf = 1 AND a.blob_key IS NOT NULL
                """) { $0.text(0) }.compactMap(BlobKey.init(hex:)).map { blobs.fileName(for: $0) })
            keys.formUnion(try Database.blobKeysNamedInBodies(in: connection, leavesOnly: true).map { blobs.fileName(for: $0) })
            keys.formUnion(try heldBlobKeys(in: connection).compactMap(BlobKey.init(hex:)).map { blobs.fileName(for: $0) })
            return keys
        }
        let cutoff = Date().timeIntervalSince1970 - Tuning.blobGracePeriod
        estimate.totalBytes = databaseFileBytes()
        for blob in try blobs.allBlobs() {
            estimate.totalBytes += blob.size
            guard !referenced.contains(blob.name) else { continue }
            var info = stat()
            guard stat("\(blobs.directory)/\(blob.name)", &info) == 0, Double(info.st_mtim.tv_sec) < cutoff else { continue }
            estimate.unreferencedBlobBytes += blob.size
        }
        return estimate
    }
}

/// CouchDB's compaction daemon ("smoosh"), for the databases a long-running process holds open
/// (`sofa serve`, `sofa mount`): each is looked at every `interval`; one that nobody wrote
/// during a whole interval, and whose compaction would free enough, is compacted, as
/// `sofa compact` would (history bodies, revisions past the limit, unreferenced blobs, VACUUM),
/// but never alone: unreferenced blobs younger than `Tuning.blobGracePeriod` stay, as a save
/// under way may be about to reference them. "Enough" is smoosh's defaults: the database at
/// least twice the size of what it would keep (`ratio_dbs`, min_priority 2.0), or 512 MiB to
/// free whatever the ratio (`slack_dbs`), and never for less than 1 MiB (`min_size`).
///
/// A database that is written is never compacted while it is: its activity mark must stay the
/// same over an interval first, and a database estimated once is estimated again only after
/// it changed. The compaction holds the database's write lock while it runs (saves wait).
public final class AutoCompaction: @unchecked Sendable {
    // Sendable invariant: `state` and `stopped` are guarded by `condition`.
    public struct Policy: Sendable {
        public var interval: TimeInterval
        public var minimumBytes: Int64 = 1 << 20
        public var ratio: Double = 2
        public var slackBytes: Int64 = 512 << 20

        public init(interval: TimeInterval = Tuning.autoCompactionInterval) {
            self.interval = interval
        }

        /// Whether `estimate` is worth a compaction.
        public func wants(_ estimate: CompactionEstimate) -> Bool {
            let waste = estimate.reclaimableBytes
            guard waste >= minimumBytes else { return false }
            return waste >= slackBytes || Double(estimate.totalBytes) >= ratio * Double(max(1, estimate.totalBytes - waste))
        }
    }

    private struct Seen {
        var mark: [Int64]
        /// The mark at which the estimate was last made (nothing to look at until it changes).
        var estimated: [Int64]?
    }

    private let policy: Policy
    private let databases: @Sendable () -> [Database]
    private let report: @Sendable (Database, Result<CompactionReport, any Error>) -> Void
    private let condition = NSCondition()
    private var state: [String: Seen] = [:]
    private var stopped = false
    /// A pass is under way (`stop` waits for it: a compaction cut short by the process's end
    /// would have removed blob files of revisions whose removal then rolls back).
    private var passing = false

    /// `databases` are those to look after, asked at each pass; `report` hears of each
    /// compaction run (or failed).
    public init(policy: Policy = Policy(), databases: @escaping @Sendable () -> [Database],
                report: @escaping @Sendable (Database, Result<CompactionReport, any Error>) -> Void) {
        (self.policy, self.databases, self.report) = (policy, databases, report)
    }

    public func start() {
        Thread.detachNewThread { [self] in
            while waitForNextPass() {
                pass()
                condition.withLock {
                    passing = false
                    condition.broadcast()
                }
            }
        }
    }

    /// Ends the loop; returns once a pass under way (a compaction) has finished.
    public func stop() {
        condition.withLock {
            stopped = true
            condition.broadcast()
            while passing { condition.wait() }
        }
    }

    private func waitForNextPass() -> Bool {
        condition.withLock {
            let until = Date(timeIntervalSinceNow: policy.interval)
            while !stopped && condition.wait(until: until) {}
            passing = !stopped
            return !stopped
        }
    }

    /// Looks at each database once: what the loop does every interval (public for a caller
    /// that drives it itself).
    public func pass() {
        for database in databases() where !database.isReadOnly {
            do {
                let mark = try database.activityMark()
                let seen = condition.withLock { state[database.path] }
                guard let seen, seen.mark == mark else {
                    condition.withLock { state[database.path] = Seen(mark: mark, estimated: nil) }
                    continue  // written since the last look (or never looked at): not now
                }
                guard seen.estimated != mark else { continue }
                condition.withLock { state[database.path]?.estimated = mark }
                guard policy.wants(try database.compactionEstimate()) else { continue }
                let result = Result { try database.compact() }
                // What the compaction changed (body events) is its own doing, not a writer's.
                if let after = try? database.activityMark() { condition.withLock { state[database.path] = Seen(mark: after, estimated: after) } }
                report(database, result)
            } catch {
                report(database, .failure(error))
            }
        }
    }
}
