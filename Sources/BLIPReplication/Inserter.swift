import BLIP
import DocumentModel
import DocumentStore

/// Saves received revisions in batches: the revisions that arrive while one transaction
/// commits go together into the next (one commit, one fsync, for up to
/// `BLIPTuning.insertionBatch` documents), as LiteCore's `Inserter` does. Each revision's
/// outcome is its own: one the database refuses (a validator, a conflict) is undone alone.
actor Inserter {
    private struct Job {
        let revision: ReplicatedRevision
        let noConflicts: Bool
        let bodies: [BlobKey]
        let done: CheckedContinuation<Bool, any Error>
    }

    private let database: Database
    private let pool: any BlockingPool
    private var queue: [Job] = []
    private var draining = false

    init(database: Database, pool: any BlockingPool) {
        self.database = database
        self.pool = pool
    }

    /// Saves `revision` with its history; false when it was here already. With `noConflicts`
    /// (a Couchbase Lite push), a revision that does not follow the current one is refused (409).
    /// `bodies`: the blobs received for it and not synced yet, made durable before it is saved.
    func insert(_ revision: ReplicatedRevision, noConflicts: Bool, bodies: [BlobKey]) async throws -> Bool {
        try await withCheckedThrowingContinuation { continuation in
            queue.append(Job(revision: revision, noConflicts: noConflicts, bodies: bodies, done: continuation))
            if !draining {
                draining = true
                Task { await drain() }
            }
        }
    }

    private func drain() async {
        while !queue.isEmpty {
            let jobs = Array(queue.prefix(BLIPTuning.insertionBatch))
            queue.removeFirst(jobs.count)
            let work = jobs.map { ($0.revision, $0.noConflicts) }
            let bodies = jobs.flatMap(\.bodies)
            let db = database
            do {
                let outcomes = try await pool.run { () -> [Result<Bool, any Error>] in
                    try db.blobs.sync(bodies)
                    return try db.inBatch { batch in
                        work.map { revision, noConflicts in Result { try Inserter.insert(revision, noConflicts: noConflicts, in: batch) } }
                    }
                }
                for (job, outcome) in zip(jobs, outcomes) { job.done.resume(with: outcome) }
            } catch {
                // The transaction itself failed (a full disk, an I/O error): nothing of it was saved.
                for job in jobs { job.done.resume(throwing: error) }
            }
        }
        draining = false
    }

    private static func insert(_ revision: ReplicatedRevision, noConflicts: Bool, in batch: Database.Batch) throws -> Bool {
        // Asked not to make a conflict: it must follow the current revision (or start a document
        // that is not here, or that is deleted).
        if noConflicts, let current = try batch.current(of: revision.docID), !current.deleted,
           current.revID != revision.revID, !revision.ancestors.contains(current.revID) {
            throw BLIPError(code: 409, message: "\(revision.docID): \(revision.revID) does not follow the current revision \(current.revID)")
        }
        return try batch.insertAlone(revision)
    }
}
