import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// What a running replication is doing, for `/.sofa/status.json` and `--json` events.
public final class ReplicationStatus: @unchecked Sendable {
    // Sendable invariant: every field is guarded by `lock`.
    private let lock = NSLock()
    private var state = "idle"
    private var pulled = 0
    private var pushed = 0
    private var lastError: String?
    private var lastSync: Date?

    public init() {}

    /// An error that passed (the next pass succeeded): shown apart, so that `last_error` is
    /// only ever a problem of now.
    private var recoveredError: String?

    func set(_ state: String, error: String? = nil) {
        lock.withLock {
            self.state = state
            if let error { lastError = error }
            if state == "idle" {
                lastSync = Date()
                if let lastError { recoveredError = lastError }
                lastError = nil
            }
        }
    }

    func add(_ result: ReplicationResult, _ direction: Replicator.Direction) {
        lock.withLock {
            if direction == .pull { pulled += result.docsWritten } else { pushed += result.docsWritten }
        }
    }

    /// `idle`, `busy`, `offline` (the remote cannot be reached; retrying), `error` (stopped), `stopped`.
    public var currentState: String { lock.withLock { state } }

    public var json: JSONObject {
        lock.withLock {
            ["state": .string(state), "docs_pulled": .integer(Int64(pulled)), "docs_pushed": .integer(Int64(pushed)),
             "last_error": lastError.map { .string($0) } ?? .null,
             "recovered_error": recoveredError.map { .string($0) } ?? .null,
             "last_sync": lastSync.map { .double($0.timeIntervalSince1970) } ?? .null]
        }
    }
}

/// Pull, push or both, once or continuously, riding out an unreachable remote: while it
/// is away the state is `offline` and tries back off up to 30 s; local edits go out
/// when it returns. Each direction runs on its own thread.
public final class ReplicationSession: @unchecked Sendable {
    // Sendable invariant: `stopped` is guarded by `condition`; the rest is immutable.
    public let database: Database
    public let remote: RemoteDatabase
    public let directions: [Replicator.Direction]
    public let continuous: Bool
    public let status = ReplicationStatus()
    public var downloads = DownloadPolicy()
    public var retry = RetryPolicy()
    public var caFile: String?
    /// Sets filters (doc ids, selector, channels) on each pass's replicator.
    public var configure: (@Sendable (Replicator) -> Void)?
    /// Called after each pass that moved documents.
    public var onResult: (@Sendable (Replicator.Direction, ReplicationResult) -> Void)?
    /// Called after every pass.
    public var onPass: (@Sendable (Replicator.Direction, ReplicationResult) -> Void)?
    private let condition = NSCondition()
    private var stopped = false
    private let group = DispatchGroup()
    private let log = Logger(label: "sofa.replicate")
    /// How long a pull's longpoll waits for a remote change before asking again. The wait
    /// wakes nothing (`HTTPClient`), and `stop()` ends it at once; a remote that vanishes
    /// without closing the connection is found after this plus the stall time.
    static let longpollTimeout = ReplicatorTuning.longpollTimeout
    /// Ends a pull's wait for the remote at `stop()` (a pass under way finishes).
    private let waitCancellation = Cancellation()
    /// The passes under way, each direction's, ended by `stop()` after the page they write.
    private let passes = Locked<[ReplicationStop]>([])

    public init(database: Database, remote: RemoteDatabase, directions: [Replicator.Direction], continuous: Bool) {
        self.database = database
        self.remote = remote
        self.directions = directions
        self.continuous = continuous
    }

    public func start() {
        for direction in directions {
            group.enter()
            Thread.detachNewThread { [self] in
                loop(direction)
                group.leave()
            }
        }
    }

    public func stop() {
        condition.withLock { stopped = true }
        passes.withLock { $0 }.forEach { $0.stop() }
        condition.broadcast()
        database.changeStream.wakeWaiters()
        waitCancellation.cancel()
    }

    /// Waits for every direction to end (one-shot: after its pass; continuous: after `stop()`).
    public func wait() { group.wait() }

    private var isStopped: Bool { condition.withLock { stopped } }

    /// Sleeps up to `seconds`, less if stopped.
    private func pause(_ seconds: Double) {
        condition.withLock {
            let deadline = Date().addingTimeInterval(seconds)
            while !stopped && condition.wait(until: deadline) {}
        }
    }

    private func loop(_ direction: Replicator.Direction) {
        var backoff = retry.initialDelay
        while !isStopped {
            do {
                status.set("busy")
                let replicator = try Replicator(database: database, remote: remote, direction: direction, caFile: caFile, retry: retry)
                replicator.downloads = downloads
                configure?(replicator)
                passes.withLock { $0.append(replicator.stopping) }
                defer { passes.withLock { $0.removeAll { $0 === replicator.stopping } } }
                if isStopped { break }
                // The stream's position before the pass reads the changes: a commit after it
                // (from the mount, the CLI, a pull, another process) starts the next pass.
                let seen = database.changeStream.current
                let before = try database.lastSequence
                let result = try replicator.run()
                status.add(result, direction)
                onPass?(direction, result)
                if result.docsWritten > 0 || result.docWriteFailures > 0 { onResult?(direction, result) }
                status.set("idle")
                backoff = retry.initialDelay
                guard continuous else { return }
                if direction == .push {
                    try waitForLocalChange(after: seen, sequence: before)
                } else {
                    try waitForRemoteChange(since: result.lastSeq, replicator: replicator)
                }
            } catch ReplicationError.cancelled where isStopped {
                break  // a wait for the remote, ended by stop()
            } catch let error as ReplicationError where continuous && error.isTransient {
                status.set("offline", error: "\(error)")
                log.warning("\(direction.rawValue): \(error); trying again in \(backoff) s")
                pause(backoff)
                backoff = min(backoff * 2, retry.maximumDelay)
            } catch {
                status.set("error", error: "\(error)")
                log.error("\(direction.rawValue) stopped: \(error)")
                return
            }
        }
        status.set("stopped")
    }

    /// Waits for a local change past `sequence` (commits that change no document, such as the
    /// pass's own checkpoint, wake it but do not end it), or for `stop()`.
    private func waitForLocalChange(after seen: UInt64, sequence: Int64) throws {
        let stream = database.changeStream
        var position = seen
        while !isStopped && !stream.isClosed {
            let now = stream.wait(after: position, unless: { isStopped })
            guard now != position else { continue }
            position = now
            if try database.lastSequence > sequence { return }
        }
    }

    /// A longpoll on the remote: returns when something changed after `since`, after
    /// `longpollTimeout`, or at `stop()` (throwing `.cancelled`).
    private func waitForRemoteChange(since: JSONValue, replicator: Replicator) throws {
        if remote.isBLIP {
            return try replicator.waitForChangeOverBLIP(since: since) { [self] in isStopped }
        }
        if remote.filePath != nil { return try replicator.waitForChangeInFile(since: since) }
        let timeout = ReplicationSession.longpollTimeout
        let client = replicator.client
        let before = client.cancellation
        client.cancellation = waitCancellation
        defer { client.cancellation = before }
        _ = try client.json("GET", "_changes?feed=longpoll&limit=1&since=\(replicator.sequenceParameter(since))&timeout=\(timeout * 1000)",
                            quietFor: timeout)
    }
}
