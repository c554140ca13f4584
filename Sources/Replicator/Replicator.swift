import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// The time a run has left, from the source's count of the changes left after each page
/// (CouchDB's `pending`) and the pace at which that count went down so far. The count covers
/// every change of the feed, let through by a filter or not, so a filtered pull (a few rows
/// of a long feed) is timed in the same changes it counts, not by the rows it read.
public struct TimeLeftEstimate: Sendable {
    private var first: (pending: Int, at: Double)?

    public init() {}

    /// The seconds left after a page with `pending` changes left, `elapsed` seconds into the
    /// run; nil until the count has gone down once.
    public mutating func update(pending: Int?, elapsed: Double) -> Double? {
        guard let pending else { return nil }
        guard let first else {
            first = (pending, elapsed)
            return nil
        }
        let gone = first.pending - pending
        guard gone > 0, elapsed > first.at else { return pending == 0 ? 0 : nil }
        return Double(pending) * (elapsed - first.at) / Double(gone)
    }
}

/// What a replication did, with PouchDB's result fields.
public struct ReplicationResult: Sendable {
    public var docsRead = 0
    public var docsWritten = 0
    public var attachmentsDownloaded = 0
    public var attachmentBytesDownloaded: Int64 = 0
    public var attachmentsDeferred = 0
    /// Changes of the source read so far, and those left after them when the source tells
    /// (for progress and its estimate of the time left).
    public var changesRead = 0
    public var changesPending: Int?
    /// The source's sequence read up to.
    public var lastSeq: JSONValue = 0
    /// The sequence the checkpoint holds: `lastSeq`, or the change before the first failure.
    public var checkpointedSeq: JSONValue = 0
    /// The documents that did not arrive, with the reason.
    public var failures: [DocumentFailure] = []
    public var docWriteFailures: Int { failures.count }
    /// `complete`, or `incomplete` when some document failed.
    public var status = "complete"

    /// Nothing done yet.
    public init() {}

    public var json: JSONValue {
        ["ok": .bool(status == "complete"), "status": .string(status), "docs_read": .integer(Int64(docsRead)),
         "docs_written": .integer(Int64(docsWritten)), "doc_write_failures": .integer(Int64(docWriteFailures)),
         // CouchDB's name for the changes a run looked at (every change read, wanted or not).
         "missing_checked": .integer(Int64(changesRead)),
         "attachments_downloaded": .integer(Int64(attachmentsDownloaded)),
         "attachment_bytes_downloaded": .integer(attachmentBytesDownloaded),
         "attachments_deferred": .integer(Int64(attachmentsDeferred)), "last_seq": .string(Self.token(lastSeq)),
         "checkpointed_seq": .string(Self.token(checkpointedSeq)), "failures": .array(failures.map(\.json))]
    }

    /// A sequence as one type whatever the source: an opaque string (CouchDB 2 and later send
    /// strings, CouchDB 1.x and Sofa numbers), so that scripts need not care which it was.
    public static func token(_ sequence: JSONValue) -> String {
        sequence.stringValue ?? sequence.jsonString()
    }
}

/// Which attachment bodies a pull downloads; the others are stored as metadata
/// only (`contentAvailable == false`) and fetched when read.
public struct DownloadPolicy: Sendable {
    public var enabled = true
    public var maximumSize: Int64?
    /// Patterns like `image/*` or `text/plain`; empty means all types.
    public var types: [String] = []

    public init() {}

    /// Downloads nothing: every body is fetched when read.
    public static var none: DownloadPolicy {
        var policy = DownloadPolicy()
        policy.enabled = false
        return policy
    }

    /// As stored with the database (`Database.downloadPolicy(for:)`).
    public var json: JSONValue {
        var object: JSONObject = ["enabled": .bool(enabled)]
        if let maximumSize { object["max"] = .integer(maximumSize) }
        if !types.isEmpty { object["types"] = .array(types.map { .string($0) }) }
        return .object(object)
    }

    public init(json: JSONValue) {
        enabled = json["enabled"]?.boolValue ?? true
        maximumSize = json["max"]?.int64Value
        types = json["types"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    /// In words, for `sofa download-policy`.
    public var description: String {
        guard enabled else { return "none: bodies are fetched when read" }
        var parts: [String] = []
        if let maximumSize { parts.append("up to \(maximumSize) bytes") }
        if !types.isEmpty { parts.append("of types \(types.joined(separator: ","))") }
        return parts.isEmpty ? "all bodies" : "bodies " + parts.joined(separator: " ") + "; the others when read"
    }

    public func allows(_ attachment: Attachment) -> Bool {
        guard enabled else { return false }
        if let maximumSize, attachment.length > maximumSize { return false }
        guard !types.isEmpty else { return true }
        let type = attachment.contentType.lowercased().split(separator: ";")[0].trimmingCharacters(in: .whitespaces)
        return types.contains { pattern in
            pattern.hasSuffix("/*") ? type.hasPrefix(pattern.dropLast()) : type == pattern.lowercased()
        }
    }
}

/// CouchDB's replication protocol between a local database and a remote one (a CouchDB,
/// or another `sofa serve`), one-shot. A pull and a push are the same routine (`replicate`)
/// over two `ReplicationPeer`s, the source and the target:
///
/// 1. read a page of the source's changes (every leaf of each document),
/// 2. ask the target which of those revisions it lacks (`_revs_diff`),
/// 3. read them from the source with their history and attachment metadata,
/// 4. write them to the target with `new_edits=false`, bodies as the target needs them,
/// 5. save the checkpoint on both sides.
///
/// Checkpoints live in `_local/<replication id>` on both sides; a run starts from the
/// checkpoint both agree on, and a checkpoint never passes a revision that did not arrive:
/// a document the target refused, or the source could not give, is named in the result
/// (`failures`) and holds the checkpoint before it, so the next run tries it again.
public final class Replicator {
    public enum Direction: String, Sendable { case pull, push }

    public let database: Database
    public let remote: RemoteDatabase
    public let direction: Direction
    public var downloads = DownloadPolicy()
    public var docIDs: [String]?
    /// A CouchDB Mango selector: pulls ask the remote to filter with it; pushes filter here.
    public var selector: Selector?
    /// Sync Gateway channels (pull only: `filter=sync_gateway/bychannel`).
    public var channels: [String]?
    /// A design document's filter function (`DDOC/NAME`): pulls ask the remote to run it;
    /// pushes run it here. `queryParameters` are its `req.query`.
    public var filterFunction: String?
    public var queryParameters: [String: String] = [:]
    /// Changes read per batch.
    public var batchSize = ReplicatorTuning.batchSize
    /// Pushes create the remote database when it does not exist (CouchDB's `create_target`).
    public var createTarget = false
    /// Called after each batch with the running totals.
    public var progress: ((ReplicationResult) -> Void)?
    /// Called every half second while a body a pull downloads is arriving (large ones, then).
    public var bodyProgress: ((BodyProgress) -> Void)?
    /// Ends a run under way, from any thread (Ctrl-C, a session's stop).
    public let stopping = ReplicationStop()
    let client: HTTPClient
    let log = Logger(label: "sofa.replicate")

    public init(database: Database, remote: RemoteDatabase, direction: Direction, caFile: String? = nil,
                retry: RetryPolicy = RetryPolicy()) throws {
        self.database = database
        self.remote = remote
        self.direction = direction
        self.client = try HTTPClient(remote: remote)
        client.caFile = caFile
        client.retry = retry
        client.onRetry = { [log] error, attempt in log.warning("retrying after attempt \(attempt): \(error)") }
    }

    /// The replication id: the local private UUID, the normalised remote URL (no
    /// credentials, default port explicit), the direction and the filter.
    public var replicationID: String { replicationID(privateUUID: database.privateUUID) }

    /// The id this replication had under another private UUID (before the database was copied).
    func replicationID(privateUUID: String) -> String {
        // A Couchbase Lite endpoint's `ws://` URL counts as its `http://` one: the same database
        // either way (`sofa serve`), so a database pulled over one goes on from there over the other.
        var url = remote.url
        if url.hasPrefix("ws://") || url.hasPrefix("wss://") { url = "http" + url.dropFirst(2) }
        var parts: [JSONValue] = [.string(privateUUID), .string(url), .string(direction.rawValue),
                                  docIDs.map { .array($0.sorted().map { .string($0) }) } ?? .null,
                                  selector.map { .object($0.json) } ?? .null,
                                  channels.map { .array($0.sorted().map { .string($0) }) } ?? .null]
        if let filterFunction {
            // Added only when given, so replications without one keep their ids (and checkpoints).
            let parameters = JSONObject(queryParameters.sorted { $0.key < $1.key }.map { ($0.key, JSONValue.string($0.value)) })
            parts += [.string(filterFunction), .object(parameters)]
        }
        let key = JSONValue.array(parts)
        return BlobKey.hexString(MessageDigest.hash(.md5, key.serialized(.canonical)))
    }

    public func run() throws -> ReplicationResult {
        if remote.isBLIP { return try runOverBLIP() }
        if let file = remote.filePath { return try runFromFile(file) }
        try client.logIn()
        var (status, info) = try client.json("GET", "", allow: direction == .push ? [404] : [])
        if status == 404 && !createTarget {
            throw ReplicationError.http(status: 404, error: "not_found",
                                        reason: "no database there (--create-target creates it)", url: remote.description)
        }
        if status == 404 {
            _ = try client.json("PUT", "", allow: [412])  // 412: someone created it meanwhile
            (_, info) = try client.json("GET", "")
        }
        guard info["db_name"] != nil || info["update_seq"] != nil else {
            throw ReplicationError.protocolError("\(remote) is not a CouchDB database")
        }
        let local = LocalPeer(database, downloads: downloads)
        let remotePeer = RemotePeer(client: client)
        // Bodies arrive on the reading threads too: their reports are told one at a time.
        let reporting = NSLock()
        let reportBody = bodyProgress.map { report in { (body: BodyProgress) in reporting.withLock { report(body) } } }
        remotePeer.bodyProgress = reportBody
        // The pages are read ahead on connections of their own: the changes on one, the
        // revisions (and `_revs_diff` pushing) on another.
        let cancellation = Cancellation()
        stopping.follow(cancellation)
        func readingRemote() throws -> RemotePeer {
            let reader = try client.sibling()
            reader.cancellation = cancellation
            let peer = RemotePeer(client: reader)
            peer.bodyProgress = reportBody
            return peer
        }
        let readingLocal = LocalPeer(database, downloads: downloads)
        switch direction {
        case .pull:
            try database.rememberRemote(remote.url)
            return try replicate(from: remotePeer, to: local,
                                 readAhead: ReadAheadPeers(changes: try readingRemote(), source: try readingRemote(), target: readingLocal,
                                                           cancellation: cancellation))
        case .push:
            return try replicate(from: local, to: remotePeer,
                                 readAhead: ReadAheadPeers(changes: LocalPeer(database), source: readingLocal, target: try readingRemote(),
                                                           cancellation: cancellation))
        }
    }

    /// A pull from, or a push into, a Couchbase Lite database file, read and written in place
    /// (`RemoteDatabase(file:)`). A push creates it with `createTarget`.
    private func runFromFile(_ path: String) throws -> ReplicationResult {
        switch direction {
        case .pull:
            let source = CouchbaseLitePeer(try CouchbaseLiteDatabase.open(at: path), checkpoints: LocalPeer(database))
            // Every body comes now: a file is no remote to fetch one from later.
            return try replicate(from: source, to: LocalPeer(database), readAhead: nil)
        case .push:
            let target = access(path, F_OK) != 0 && createTarget
                ? try CouchbaseLiteDatabase.create(at: path) : try CouchbaseLiteDatabase.open(at: path, writable: true)
            return try replicate(from: LocalPeer(database), to: CouchbaseLitePeer(target, checkpoints: LocalPeer(database)), readAhead: nil)
        }
    }

    /// Returns once the Couchbase Lite file has a change after `since` (its sequence), or
    /// throws `.cancelled` at `stopping.stop()`. LiteCore tells other processes nothing: inotify
    /// says when the file is written (`CouchbaseLiteDatabase.watch`), and without it the file
    /// is looked at every `ReplicatorTuning.filePollInterval`.
    func waitForChangeInFile(since: JSONValue) throws {
        guard let path = remote.filePath else { return }
        let file = try CouchbaseLiteDatabase.open(at: path)
        let uuid = try file.privateUUID
        let from = since.int64Value ?? 0
        let signal = DispatchSemaphore(value: 0)
        stopping.onStop { signal.signal() }
        let watch = CouchbaseLiteDatabase.watch(path) { signal.signal() }
        defer { watch?.stop() }
        while !stopping.isStopped {
            // Past the sequence, or another file in its place: a pass reads it.
            if try file.lastSequence > from || (try? CouchbaseLiteDatabase.open(at: path).privateUUID) != uuid { return }
            _ = signal.wait(timeout: .now() + (watch == nil ? ReplicatorTuning.filePollInterval : ReplicatorTuning.fileSafetyInterval))
        }
        throw ReplicationError.cancelled
    }

    /// `since=` as CouchDB wants it: numbers bare, opaque strings verbatim.
    func sequenceParameter(_ seq: JSONValue) -> String { RemotePeer.sequenceParameter(seq) }

    // MARK: - The routine

    /// Peers of their own for steps 1 to 3, which then run ahead of the writes (`PagesReadAhead`).
    struct ReadAheadPeers {
        let changes: ReplicationPeer
        let source: ReplicationPeer
        let target: ReplicationPeer
        let cancellation: Cancellation
    }

    /// `readAhead`: steps 1 to 3 run ahead of the writes; nil: all steps in turn on this thread.
    private func replicate(from source: ReplicationPeer, to target: ReplicationPeer, readAhead: ReadAheadPeers?) throws
        -> ReplicationResult {
        var result = ReplicationResult()
        let session = UUID().uuidString.lowercased()
        let started = Date()
        let startSeq = try startingSequence(source, target) ?? 0
        let filter = ReplicationFilter(docIDs: docIDs, selector: selector, channels: channels, function: filterFunction,
                                       queryParameters: queryParameters)
        let pages: PageSource = readAhead.map {
            PagesReadAhead(changesFrom: $0.changes, source: $0.source, target: $0.target, filter: filter, since: startSeq,
                           limit: batchSize, cancellation: $0.cancellation)
        } ?? PagesInTurn(source: source, target: target, filter: filter, since: startSeq, limit: batchSize)
        defer { pages.stop() }
        var since = startSeq
        /// Where the checkpoint stays once a document failed: just before it.
        var heldAt: JSONValue?
        result.lastSeq = since
        result.checkpointedSeq = since
        var lastSaved = Date()
        func saveCheckpointIfMoved() throws {
            let checkpoint = heldAt ?? since
            guard checkpoint != result.checkpointedSeq else { return }
            try saveCheckpoint(source, target, session: session, started: started, startSeq: startSeq, seq: checkpoint, result: result)
            result.checkpointedSeq = checkpoint
            lastSaved = Date()
        }
        do {
            while true {
                if stopping.isStopped { throw ReplicationError.cancelled }
                let page = try pages.next()
                let batch = page.batch
                let failures = try write(page, from: source, to: target, result: &result)
                result.changesRead += batch.changes.count
                result.changesPending = batch.pending
                if heldAt == nil, !failures.isEmpty {
                    let failed = Set(failures.map(\.docID))
                    let first = batch.changes.firstIndex { failed.contains($0.docID) } ?? 0
                    heldAt = first == 0 ? since : batch.changes[first - 1].sequence
                }
                result.failures += failures
                since = batch.lastSequence
                result.lastSeq = since
                if batch.isLast || Date().timeIntervalSince(lastSaved) >= ReplicatorTuning.checkpointInterval {
                    try saveCheckpointIfMoved()
                }
                progress?(result)
                if batch.isLast { break }
            }
        } catch {
            // What was written before the failure is kept, and the next run starts after it.
            do { try saveCheckpointIfMoved() } catch let failure {
                log.warning("\(remote): checkpoint not saved after the failure: \(failure)")
            }
            throw error
        }
        if !result.failures.isEmpty { result.status = "incomplete" }
        return result
    }

    /// Step 4 for one page: writes what the source gave; returns the documents that did not arrive.
    private func write(_ page: FetchedPage, from source: ReplicationPeer, to target: ReplicationPeer,
                       result: inout ReplicationResult) throws -> [DocumentFailure] {
        var failures: [DocumentFailure] = []
        var revisions: [ReplicatedRevision] = []
        for read in page.reads {
            switch read {
            case .success(let revision):
                result.docsRead += 1
                revisions.append(revision)
            case .failure(let failure):
                failures.append(failure)
            }
        }
        if !revisions.isEmpty {
            let byID = Dictionary(page.missing.map { ($0.id, $0.missing) }, uniquingKeysWith: { $1 })
            failures += try target.write(revisions, missing: byID, from: source, result: &result)
        }
        for failure in failures { log.warning("\(direction.rawValue): \(failure)") }
        return failures
    }

    // MARK: - Checkpoints

    /// The sequence both sides' checkpoints agree on (the source's), or nil. A copied
    /// database (`sofa copy`) also looks under the ids its originals replicated with.
    private func startingSequence(_ source: ReplicationPeer, _ target: ReplicationPeer) throws -> JSONValue? {
        let local: ReplicationPeer = direction == .pull ? target : source
        let remote: ReplicationPeer = direction == .pull ? source : target
        for uuid in try [database.privateUUID] + database.previousPrivateUUIDs {
            let id = replicationID(privateUUID: uuid)
            guard let mine = try local.checkpoint(id), let theirs = try remote.checkpoint(id) else { continue }
            if let seq = Replicator.agreedSequence(mine, theirs) {
                if uuid != database.privateUUID { log.info("resuming from the checkpoint of the database this one was copied from") }
                return seq
            }
        }
        return nil
    }

    /// The last sequence of the same session, or of the newest session both histories know.
    static func agreedSequence(_ local: JSONObject, _ remote: JSONObject) -> JSONValue? {
        if local["session_id"] == remote["session_id"], let seq = local["source_last_seq"] { return seq }
        let remoteSessions = Set((remote["history"]?.arrayValue ?? []).compactMap { $0["session_id"]?.stringValue })
        for entry in local["history"]?.arrayValue ?? [] {
            if let session = entry["session_id"]?.stringValue, remoteSessions.contains(session) { return entry["recorded_seq"] }
        }
        return nil
    }

    /// A checkpoint document as CouchDB's replicator writes it: this session's sequence, and a
    /// history of sessions (newest first, 50 at most) that another run can agree on.
    static func checkpointBody(existing: JSONObject?, session: String, started: Date, startSeq: JSONValue, seq: JSONValue,
                               result: ReplicationResult) -> JSONObject {
        let entry: JSONValue = ["session_id": .string(session), "start_time": .string(httpDate(started)),
                                "end_time": .string(httpDate(Date())), "start_last_seq": startSeq, "end_last_seq": seq,
                                "recorded_seq": seq, "docs_read": .integer(Int64(result.docsRead)),
                                "docs_written": .integer(Int64(result.docsWritten)),
                                "doc_write_failures": .integer(Int64(result.docWriteFailures))]
        var history = (existing?["history"]?.arrayValue ?? []).filter { $0["session_id"]?.stringValue != session }
        history.insert(entry, at: 0)
        return ["session_id": .string(session), "source_last_seq": seq, "replication_id_version": 1,
                "history": .array(Array(history.prefix(50)))]
    }

    private func saveCheckpoint(_ source: ReplicationPeer, _ target: ReplicationPeer, session: String, started: Date,
                                startSeq: JSONValue, seq: JSONValue, result: ReplicationResult) throws {
        let local: ReplicationPeer = direction == .pull ? target : source
        let remote: ReplicationPeer = direction == .pull ? source : target
        let body = Replicator.checkpointBody(existing: try local.checkpoint(replicationID), session: session, started: started,
                                             startSeq: startSeq, seq: seq, result: result)
        // Remote first: if it fails, the local checkpoint (which decides nothing alone) is untouched.
        try remote.saveCheckpoint(replicationID, body)
        try local.saveCheckpoint(replicationID, body)
    }
}

/// Ends a replication run under way from another thread (a signal handler, a session's
/// `stop()`): the page being written is finished and the checkpoint saved after it, requests
/// reading ahead are cancelled at once, and `run()` throws `ReplicationError.cancelled`. The
/// next run starts where this one stopped.
public final class ReplicationStop: Sendable {
    private let state = Locked<(stopped: Bool, readers: Cancellation?, waiter: (@Sendable () -> Void)?)>((false, nil, nil))

    public init() {}

    public func stop() {
        let (readers, waiter) = state.withLock { state in
            state.stopped = true
            return (state.readers, state.waiter)
        }
        readers?.cancel()
        waiter?()
    }

    /// `wake` is called by `stop()` (at once if it came already): a wait of the run's ends.
    func onStop(_ wake: @escaping @Sendable () -> Void) {
        let stopped = state.withLock { state -> Bool in
            state.waiter = wake
            return state.stopped
        }
        if stopped { wake() }
    }

    public var isStopped: Bool { state.withLock { $0.stopped } }

    /// `readers` (a run's requests reading ahead) is cancelled by `stop()`, at once if it came already.
    func follow(_ readers: Cancellation) {
        let stopped = state.withLock { state -> Bool in
            state.readers = readers
            return state.stopped
        }
        if stopped { readers.cancel() }
    }
}
