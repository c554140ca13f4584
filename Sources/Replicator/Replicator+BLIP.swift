import BLIP
import BLIPReplication
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// Replication with a Couchbase Lite endpoint (`ws[s]://`: Sync Gateway, Capella App Services,
/// `sofa serve`), run by `BLIPReplicator`'s active role. The checkpoints are this replicator's,
/// as with HTTP (the same ids and documents: the server keeps its copy under
/// `_local/checkpoint/ID`); the rest is the engine's.
extension Replicator {
    func runOverBLIP() throws -> ReplicationResult {
        guard selector == nil, filterFunction == nil else {
            throw SofaError.invalidArgument("\(remote): a Couchbase Lite endpoint takes no --selector or --filter (--doc-ids and --channels work)")
        }
        if direction == .pull { try database.rememberRemote(remote.url) }
        let downloads = self.downloads
        let replicator = WaitingCaller(self)
        return try Replicator.waitFor {
            let engine = try await replicator.value.connect(BLIPReplicator.Active(fetchesBody: { downloads.allows($0) }))
            do {
                let result = try await replicator.value.replicate(over: engine)
                await engine.close("replication done")
                return result
            } catch {
                await engine.close("replication stopped: \(error)")
                throw error
            }
        }
    }

    /// Waits on a Couchbase Lite endpoint for a change after `since`; throws `.cancelled` once
    /// `stopped` says so.
    func waitForChangeOverBLIP(since: JSONValue, stopped: @escaping @Sendable () -> Bool) throws {
        let replicator = WaitingCaller(self)
        try Replicator.waitFor {
            let engine = try await replicator.value.connect(BLIPReplicator.Active(watchOnly: true))
            defer { Task { await engine.close("a change came") } }
            try await engine.waitForChange(since: since, stopped: stopped)
        }
    }

    func connect(_ active: BLIPReplicator.Active) async throws -> BLIPReplicator {
        try await Replicator.connect(remote, caFile: client.caFile, database: database, active: active, log: log)
    }

    /// The engine's active side on a connection to `remote`; a refused upgrade throws as HTTP's.
    static func connect(_ remote: RemoteDatabase, caFile: String?, database: Database, active: BLIPReplicator.Active,
                        log: Logger) async throws -> BLIPReplicator {
        do {
            return try await BLIPReplicator.connect(url: remote.url, user: remote.user, password: remote.password, caFile: caFile,
                                                    database: database, active: active, pool: ThreadPoolWork(), log: log)
        } catch let failure as BLIPConnectFailure {
            switch failure {
            case .network(let why): throw ReplicationError.network(why)
            case .invalidURL(let why): throw SofaError.invalidArgument(why)
            case .http(let status, let error, let reason): throw ReplicationError.http(status: status, error: error, reason: reason, url: remote.url)
            }
        }
    }

    /// One run: from the checkpoint both sides agree on, to the end of the feed.
    private func replicate(over engine: BLIPReplicator) async throws -> ReplicationResult {
        let work = ThreadPoolWork()
        let local = LocalCheckpoints(database: database)
        let remoteRevs = Locked<[String: String]>([:])
        let database = self.database
        // The sequence both checkpoints agree on (a copied database also looks under its originals' ids).
        var agreed: JSONValue = 0
        for uuid in try [database.privateUUID] + database.previousPrivateUUIDs {
            let id = replicationID(privateUUID: uuid)
            guard let mine = try await work.run({ try local.checkpoint(id) }), let theirs = try await engine.remoteCheckpoint(id) else { continue }
            if uuid == database.privateUUID { remoteRevs.withLock { $0[id] = theirs.rev } }
            if let seq = Replicator.agreedSequence(mine, theirs.body) {
                if uuid != database.privateUUID { log.info("resuming from the checkpoint of the database this one was copied from") }
                agreed = seq
                break
            }
        }
        let startSeq = agreed
        let id = replicationID
        if remoteRevs.withLock({ $0[id] }) == nil, let theirs = try await engine.remoteCheckpoint(id) {
            remoteRevs.withLock { $0[id] = theirs.rev }
        }
        let session = UUID().uuidString.lowercased()
        let started = Date()
        let saved = Locked<JSONValue>(startSeq)
        let progress = WaitingCaller(self.progress)
        let direction = self.direction
        let stopping = self.stopping
        // Remote first: if it fails, the local checkpoint (which decides nothing alone) is untouched.
        let record: @Sendable (BLIPReplicator.Report) async throws -> ReplicationResult = { report in
            let result = Replicator.result(report, startSeq: startSeq, direction: direction)
            if let seq = report.checkpoint, seq != saved.withLock({ $0 }) {
                let body = Replicator.checkpointBody(existing: try await work.run { try local.checkpoint(id) }, session: session,
                                                     started: started, startSeq: startSeq, seq: seq, result: result)
                let rev = try await engine.saveRemoteCheckpoint(id, body, rev: remoteRevs.withLock { $0[id] })
                remoteRevs.withLock { $0[id] = rev }
                try await work.run { try local.save(id, body) }
                saved.withLock { $0 = seq }
            }
            progress.value?(result)
            return result
        }
        let report: BLIPReplicator.Report
        do {
            switch direction {
            case .pull:
                report = try await engine.pull(since: startSeq, docIDs: docIDs, channels: channels, batch: batchSize,
                                               interval: ReplicatorTuning.checkpointInterval, stopped: { stopping.isStopped },
                                               report: { _ = try await record($0) })
            case .push:
                guard channels == nil else { throw SofaError.invalidArgument("channels filter only pulls from a Sync Gateway") }
                let since = startSeq.int64Value ?? startSeq.stringValue.flatMap { Int64($0) } ?? 0
                report = try await engine.push(since: since, docIDs: docIDs, batch: batchSize, stopped: { stopping.isStopped },
                                               report: { _ = try await record($0) })
            }
        } catch is CancellationError {
            throw ReplicationError.cancelled
        } catch let error as BLIPSyncError {
            throw Replicator.replicationError(error, url: remote.url)
        }
        var result = Replicator.result(report, startSeq: startSeq, direction: direction)
        for failure in result.failures { log.warning("\(direction.rawValue): \(failure)") }
        if !result.failures.isEmpty { result.status = "incomplete" }
        return result
    }

    private static func result(_ report: BLIPReplicator.Report, startSeq: JSONValue, direction: Direction) -> ReplicationResult {
        var result = ReplicationResult()
        result.docsRead = report.revisionsRead
        result.docsWritten = report.revisionsWritten
        result.attachmentsDownloaded = report.bodiesFetched
        result.attachmentBytesDownloaded = report.bodyBytesFetched
        result.attachmentsDeferred = report.bodiesDeferred
        result.changesRead = report.changesRead
        result.failures = report.failures
        result.lastSeq = report.checkpoint ?? startSeq
        result.checkpointedSeq = report.checkpoint ?? startSeq
        return result
    }

    static func replicationError(_ error: BLIPSyncError, url: String) -> ReplicationError {
        switch error {
        case .protocolViolation(let what): .protocolError("\(url): \(what)")
        case .closed(let why): .network("\(url): the connection ended: \(why)")
        case .silent: .network("\(url): \(error)")
        case .refused(let refusal): .http(status: refusal.code, error: refusal.domain, reason: refusal.message, url: url)
        }
    }

    /// Runs the engine's async work from the replicator's thread (the command line and the
    /// mount call replication synchronously) and waits for it: the one place the two meet.
    static func waitFor<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) throws -> T {
        let outcome = Locked<Result<T, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let result: Result<T, any Error>
            do { result = .success(try await work()) } catch { result = .failure(error) }
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return try outcome.withLock { $0! }.get()
    }
}

/// What the replicator's waiting thread hands to the async work it waits for. Unchecked: that
/// thread is blocked in `waitFor` until the work ends, so the value is used by one side at a time.
private struct WaitingCaller<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// This database's copies of replication checkpoints (`_local/ID`), as `LocalPeer` keeps them.
private struct LocalCheckpoints: Sendable {
    let database: Database

    func checkpoint(_ id: String) throws -> JSONObject? {
        try database.localDocument(withID: "_local/\(id)")?.body
    }

    func save(_ id: String, _ body: JSONObject) throws {
        let current = try database.localDocument(withID: "_local/\(id)")?.rev
        _ = try database.replaceLocalDocument("_local/\(id)", body: body, after: current)
    }
}
