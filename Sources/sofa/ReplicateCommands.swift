import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Replicator

/// How to reach a remote: credentials, TLS trust and retries. Shared by pull, push, sync,
/// cp, download and mount.
struct ConnectionOptions: ParsableArguments {
    @Option(help: "User name for the remote (instead of user:password@ in the URL).")
    var user: String?

    @Option(help: "A file whose first line is the remote password.")
    var passwordFile: String?

    @Option(help: "CA certificates (PEM) to verify the remote with, instead of the system's.")
    var cacert: String?

    @Option(help: "Tries per request when the remote fails in a way that may pass (refused, reset, 5xx, bad digest).")
    var retries = 6

    @Option(help: "Seconds before the first retry; each next wait doubles, up to 30 s.")
    var retryDelay = 0.25

    @Option(help: "Seconds a request may receive nothing before it fails and is tried again (CouchDB's replicator waits 30).")
    var stallTimeout = HTTPTuning.stallTimeout

    var retryPolicy: RetryPolicy {
        var retry = RetryPolicy()
        retry.attempts = max(1, retries)
        retry.initialDelay = max(0, retryDelay)
        retry.stallTimeout = max(1, stallTimeout)
        return retry
    }

    func remote(_ url: String) throws -> RemoteDatabase {
        try remoteEndpoint(url, user: user, password: try passwordFile.map { try readPassword($0) })
    }

    /// These options as arguments again (paths made absolute), for a child process.
    var arguments: [String] {
        func absolute(_ path: String) -> String { URL(fileURLWithPath: path).standardizedFileURL.path }
        var arguments = ["--retries", String(retries), "--retry-delay", String(retryDelay), "--stall-timeout", String(stallTimeout)]
        if let user { arguments += ["--user", user] }
        if let passwordFile { arguments += ["--password-file", absolute(passwordFile)] }
        if let cacert { arguments += ["--cacert", absolute(cacert)] }
        return arguments
    }
}

/// What a replication's remote argument names: a server's database by URL, or a Couchbase
/// Lite database on this machine (a path), read in place.
func remoteEndpoint(_ text: String, user: String? = nil, password: String? = nil) throws -> RemoteDatabase {
    if !text.contains("://"), CouchbaseLiteDatabase.isCouchbaseLite(at: text) { return RemoteDatabase(file: text) }
    return try RemoteDatabase(text, user: user, password: password)
}

/// How to replicate with a remote: shared by pull, push, sync and cp.
struct RemoteOptions: ParsableArguments {
    @OptionGroup var connection: ConnectionOptions

    @Option(name: .customLong("doc-ids"), help: "Replicate only these documents (comma-separated ids).")
    var docIDs: String?

    @Option(help: "Replicate only documents matching this CouchDB Mango selector (JSON).")
    var selector: String?

    @Option(help: "Replicate only documents a design document's filter function passes (DDOC/NAME).")
    var filter: String?

    @Option(name: .customLong("query-param"), help: "A parameter for --filter's function (req.query), NAME=VALUE; repeatable.")
    var queryParameters: [String] = []

    @Flag(help: "Print JSON events and a final summary with PouchDB's result fields.")
    var json = false

    @Option(help: .hidden)
    var batchSize = 200

    /// What `--doc-ids`, `--selector`, `--filter` and `--channels` ask for.
    struct Filters: Sendable {
        let docIDs: [String]?
        let selector: Selector?
        let channels: [String]?
        let function: String?
        let queryParameters: [String: String]

        func apply(to replicator: Replicator) {
            replicator.docIDs = docIDs
            replicator.selector = selector
            replicator.channels = channels
            replicator.filterFunction = function
            replicator.queryParameters = queryParameters
        }
    }

    func filters(_ pulls: PullOptions?) throws -> Filters {
        let parsed = try selector.map { text in
            do { return try Selector(JSONParser.parse(Array(text.utf8))) } catch {
                throw SofaError.invalidArgument("--selector: \(error)")
            }
        }
        var parameters: [String: String] = [:]
        for pair in queryParameters {
            guard let equals = pair.firstIndex(of: "=") else { throw SofaError.invalidArgument("--query-param \(pair): expected NAME=VALUE") }
            parameters[String(pair[..<equals])] = String(pair[pair.index(after: equals)...])
        }
        if filter == nil && !parameters.isEmpty { throw SofaError.invalidArgument("--query-param goes with --filter") }
        if let filter, !filter.contains("/") { throw SofaError.invalidArgument("--filter \(filter): expected DDOC/NAME") }
        return Filters(docIDs: docIDs?.split(separator: ",").map(String.init), selector: parsed,
                       channels: pulls?.channels?.split(separator: ",").map(String.init), function: filter, queryParameters: parameters)
    }

    /// Runs the directions until a signal, printing what moves.
    func runContinuously(_ directions: [Replicator.Direction], database: Database, url: String, downloads: DownloadPolicy,
                         pulls: PullOptions?, pushes: PushOptions?) throws {
        let signals = SignalWatcher([SIGINT, SIGTERM])  // before the session's threads start
        let session = ReplicationSession(database: database, remote: try connection.remote(url), directions: directions, continuous: true)
        session.downloads = downloads
        session.retry = connection.retryPolicy
        session.caFile = connection.cacert
        let filters = try filters(pulls)
        let createTarget = pushes?.createTarget ?? false
        session.configure = { replicator in
            filters.apply(to: replicator)
            replicator.createTarget = createTarget
        }
        let json = self.json
        session.onResult = { direction, result in
            if json {
                var event = result.json.objectValue ?? [:]
                event["event"] = "replicated"
                event["direction"] = .string(direction.rawValue)
                Output.line(JSONValue.object(event).jsonString())
            } else {
                Output.line("\(direction.rawValue): \(counted(result.docsWritten, "document")) written")
                for failure in result.failures { Output.error("\(direction.rawValue): \(failure)") }
            }
        }
        signals.onSignal { session.stop() }
        session.start()
        session.wait()
        signals.cancel()
        if session.status.currentState == "error" {
            throw SofaError.invalidArgument("replication stopped: \(session.status.json["last_error"]?.stringValue ?? "error")")
        }
    }

    func makeReplicator(_ direction: Replicator.Direction, database: Database, url: String,
                        pulls: PullOptions?, pushes: PushOptions?) throws -> Replicator {
        let replicator = try Replicator(database: database, remote: try connection.remote(url), direction: direction,
                                        caFile: connection.cacert, retry: connection.retryPolicy)
        replicator.batchSize = max(1, batchSize)
        replicator.createTarget = direction == .push && pushes?.createTarget == true
        try filters(direction == .pull ? pulls : nil).apply(to: replicator)
        return replicator
    }
}

/// The arguments of pull, push and sync.
struct ReplicationOptions: ParsableArguments {
    @Argument(help: "The local database.", completion: .directory)
    var database: String

    @Argument(help: "The remote database, http(s)://[user:password@]host[:port]/db, or ws://… for a Couchbase Lite endpoint (Sync Gateway, sofa serve)")
    var url: String

    @OptionGroup var remote: RemoteOptions

    @Flag(help: "Keep replicating until Ctrl-C or SIGTERM; ride out the remote going away.")
    var continuous = false

    var json: Bool { remote.json }

    func runContinuously(_ directions: [Replicator.Direction], database: Database, downloads: DownloadPolicy,
                         pulls: PullOptions?, pushes: PushOptions?) throws {
        try remote.runContinuously(directions, database: database, url: url, downloads: downloads, pulls: pulls, pushes: pushes)
    }

    func makeReplicator(_ direction: Replicator.Direction, database: Database, pulls: PullOptions?, pushes: PushOptions?) throws -> Replicator {
        try remote.makeReplicator(direction, database: database, url: url, pulls: pulls, pushes: pushes)
    }
}

/// Options that only a pull has.
struct PullOptions: ParsableArguments {
    @Option(help: "Pull only these Sync Gateway channels (comma-separated).")
    var channels: String?
}

/// Options that only a push has.
struct PushOptions: ParsableArguments {
    @Flag(help: "Create the remote database if it does not exist.")
    var createTarget = false
}

/// Options of pulls: which attachment bodies to download now. Rules given are stored with
/// the database for the remote, and pulls, syncs and mounts that give none follow them.
struct DownloadOptions: ParsableArguments {
    @Flag(help: "Store attachment bodies as metadata only; they are fetched when read.")
    var noDownloadAttachments = false

    @Flag(help: "Download every body (the default, until other rules are given).")
    var downloadAttachments = false

    @Option(help: "Download only bodies up to this size (bytes, or with K, M, G).")
    var downloadAttachmentsMax: String?

    @Option(help: "Download only bodies of these types, e.g. 'image/*,text/*'.")
    var downloadAttachmentsTypes: String?

    func validate() throws {
        if noDownloadAttachments && (downloadAttachments || downloadAttachmentsMax != nil || downloadAttachmentsTypes != nil) {
            throw ValidationError("--no-download-attachments cannot go with other download rules")
        }
    }

    /// The rules given on this command line, if any.
    func given() throws -> DownloadPolicy? {
        guard noDownloadAttachments || downloadAttachments || downloadAttachmentsMax != nil || downloadAttachmentsTypes != nil else {
            return nil
        }
        var policy = DownloadPolicy()
        policy.enabled = !noDownloadAttachments
        if let text = downloadAttachmentsMax {
            guard let size = parseSize(text) else { throw SofaError.invalidArgument("not a size: \(text)") }
            policy.maximumSize = size
        }
        policy.types = downloadAttachmentsTypes?.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } ?? []
        return policy
    }

    /// The rules for pulls from `url`: the ones given (stored for next time), or the stored ones.
    func policy(for database: Database, url: String) throws -> DownloadPolicy {
        let key = try remoteEndpoint(url).url
        if let policy = try given() {
            if !database.isReadOnly { try database.setDownloadPolicy(policy, for: key) }
            return policy
        }
        return try database.downloadPolicy(for: key) ?? DownloadPolicy()
    }
}

func parseSize(_ text: String) -> Int64? {
    let units: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30]
    if let unit = text.uppercased().last.flatMap({ units[$0] }) { return Int64(text.dropLast()).map { $0 * unit } }
    return Int64(text)
}

/// Runs one direction and reports it.
func replicate(_ replicator: Replicator, json: Bool) throws -> ReplicationResult {
    let terminal = Verbosity.showsProgress
    let started = Date()
    let meter = TransferMeter()
    replicator.bodyProgress = { body in
        if json {
            Output.line(JSONValue.object(["event": "body_progress", "direction": .string(replicator.direction.rawValue),
                                          "id": .string(body.docID), "name": .string(body.name),
                                          "bytes": .integer(body.present), "length": .integer(body.length)]).jsonString())
        } else if terminal {
            Output.write(STDERR_FILENO, "\r\u{1B}[K\(replicator.direction.rawValue): " + meter.line(body))
        }
    }
    let lastProgress = Locked<ReplicationResult?>(nil)
    let timeLeft = Locked(TimeLeftEstimate())
    replicator.progress = { result in
        lastProgress.withLock { $0 = result }
        let seconds = max(Date().timeIntervalSince(started), 0.001)
        let secondsLeft = timeLeft.withLock { $0.update(pending: result.changesPending, elapsed: seconds) }
        if json {
            var event: JSONObject = ["event": "progress", "direction": .string(replicator.direction.rawValue),
                                     "docs_read": .integer(Int64(result.docsRead)), "docs_written": .integer(Int64(result.docsWritten)),
                                     "pending": result.changesPending.map { .integer(Int64($0)) } ?? .null]
            if let secondsLeft { event["seconds_left"] = .integer(Int64(secondsLeft.rounded(.up))) }
            Output.line(JSONValue.object(event).jsonString())
        } else if terminal {
            var line = "\r\u{1B}[K\(replicator.direction.rawValue): \(result.docsRead) read, \(result.docsWritten) written "
                + "(\(Int(Double(result.docsWritten) / seconds)) docs/s), \(result.attachmentBytesDownloaded >> 20) MiB "
                + String(format: "(%.1f MiB/s)", Double(result.attachmentBytesDownloaded) / 1_048_576 / seconds)
            if let pending = result.changesPending, pending > 0, let secondsLeft {
                let left = Int(secondsLeft.rounded(.up))
                line += ", \(pending) changes to go, about " + (left >= 60 ? "\(left / 60) min \(left % 60) s" : "\(left) s") + " left"
            }
            Output.write(STDERR_FILENO, line)
        }
    }
    // Ctrl-C or SIGTERM: the page being written is finished and the checkpoint saved, so the
    // next run goes on from there.
    let signals = SignalWatcher([SIGINT, SIGTERM])  // before the replicator's threads start
    defer { signals.cancel() }
    signals.onSignal { [stopping = replicator.stopping] in stopping.stop() }
    do {
        let result = try replicator.run()
        if terminal && !json { Output.write(STDERR_FILENO, "\n") }
        return result
    } catch let error as ReplicationError {
        if terminal && !json { Output.write(STDERR_FILENO, "\n") }
        let partial = lastProgress.withLock { $0 }
        if case .cancelled = error, replicator.stopping.isStopped {
            let written = partial.map { "; \(counted($0.docsWritten, "document")) written" } ?? ""
            Output.error("\(replicator.direction.rawValue) stopped by \(signals.reason)\(written), checkpoint saved: "
                         + "the same command again goes on from there")
            if json {
                // What was done, zeros included, and the bytes of bodies cut short, which the next run does not fetch again.
                var done = (partial ?? ReplicationResult()).json.objectValue ?? [:]
                done["partial_body_bytes"] = .integer(replicator.database.blobs.partialBodies().reduce(Int64(0)) { $0 + $1.length })
                Output.line(JSONValue.object(["ok": false, "error": "stopped", "reason": .string(signals.reason),
                                              "partial": .object(done)]).jsonString())
            }
            throw ExitCode(signals.exitStatus)
        }
        throw ReplicationFailure(job: replicator.direction.rawValue, cause: error, partial: partial)
    }
}

/// A pull, push or download that stopped, with what it had done (`partial`, a replication's
/// last progress counts) and what the user may want to know (`note`).
struct ReplicationFailure: Error, CustomStringConvertible {
    let job: String
    let cause: ReplicationError
    var partial: ReplicationResult?
    var note = ""

    var description: String { "\(job) failed: \(cause)\(note)" }

    /// The error's name for `--json`: the server's (`unauthorized`, `not_found`…), or what went wrong.
    var name: String {
        switch cause {
        case .network: "unreachable"
        case .http(_, let error, _, _): error.isEmpty ? "http_error" : error
        case .protocolError: "protocol_error"
        case .cancelled: "cancelled"
        }
    }
}

/// Prints what each direction did. A document that did not arrive is named on stderr with
/// the reason, and fails the command (exit 1) once everything is reported.
func report(_ results: [(String, ReplicationResult)], json: Bool) throws {
    for (direction, result) in results {
        if json {
            var summary = result.json
            if case .object(var object) = summary {
                object["direction"] = .string(direction)
                summary = .object(object)
            }
            Output.line(summary.jsonString())
        } else {
            var line = "\(direction): \(counted(result.docsRead, "document")) read, \(result.docsWritten) written, \(result.docWriteFailures) failed"
            if result.attachmentsDownloaded > 0 || result.attachmentsDeferred > 0 {
                line += "; \(counted(result.attachmentsDownloaded, "attachment body", "attachment bodies")) downloaded "
                    + "(\(result.attachmentBytesDownloaded) bytes), \(result.attachmentsDeferred) deferred"
            }
            Output.line(line + "; last sequence \(ReplicationResult.token(result.lastSeq))")
        }
    }
    let failed = results.filter { !$0.1.failures.isEmpty }
    guard !failed.isEmpty else { return }
    for (direction, result) in failed {
        for failure in result.failures { Output.error("\(direction): \(failure)") }
        Output.error("\(direction) incomplete: \(counted(result.failures.count, "document")) did not arrive; "
            + "the checkpoint stays before the first, so the next \(direction) tries again")
    }
    throw ExitCode(1)
}

struct Pull: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Pull changes from a CouchDB-compatible database (one-shot, resumable).")
    @OptionGroup var options: ReplicationOptions
    @OptionGroup var pulls: PullOptions
    @OptionGroup var downloads: DownloadOptions
    @OptionGroup(title: "Global options") var global: GlobalOptions

    var printsJSON: Bool { options.json }

    func execute() throws {
        let db = try Database.open(at: options.database)
        let policy = try downloads.policy(for: db, url: options.url)
        if options.continuous { return try options.runContinuously([.pull], database: db, downloads: policy, pulls: pulls, pushes: nil) }
        let replicator = try options.makeReplicator(.pull, database: db, pulls: pulls, pushes: nil)
        replicator.downloads = policy
        try report([("pull", try replicate(replicator, json: options.json))], json: options.json)
    }
}

struct Push: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Push changes to a CouchDB-compatible database (one-shot, resumable).")
    @OptionGroup var options: ReplicationOptions
    @OptionGroup var pushes: PushOptions
    @OptionGroup(title: "Global options") var global: GlobalOptions

    var printsJSON: Bool { options.json }

    func execute() throws {
        let db = try Database.open(at: options.database)
        if options.continuous {
            return try options.runContinuously([.push], database: db, downloads: DownloadPolicy(), pulls: nil, pushes: pushes)
        }
        let replicator = try options.makeReplicator(.push, database: db, pulls: nil, pushes: pushes)
        try report([("push", try replicate(replicator, json: options.json))], json: options.json)
    }
}

struct Sync: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Pull, then push: both databases end with every revision.")
    @OptionGroup var options: ReplicationOptions
    @OptionGroup var pulls: PullOptions
    @OptionGroup var pushes: PushOptions
    @OptionGroup var downloads: DownloadOptions
    @OptionGroup(title: "Global options") var global: GlobalOptions

    var printsJSON: Bool { options.json }

    func execute() throws {
        let db = try Database.open(at: options.database)
        let policy = try downloads.policy(for: db, url: options.url)
        if options.continuous {
            return try options.runContinuously([.pull, .push], database: db, downloads: policy, pulls: pulls, pushes: pushes)
        }
        let puller = try options.makeReplicator(.pull, database: db, pulls: pulls, pushes: nil)
        puller.downloads = policy
        let pulled = try replicate(puller, json: options.json)
        let pushed = try replicate(try options.makeReplicator(.push, database: db, pulls: nil, pushes: pushes), json: options.json)
        try report([("pull", pulled), ("push", pushed)], json: options.json)
    }
}

/// The first line of a password file.
func readPassword(_ path: String) throws -> String {
    let text: String
    do { text = try String(contentsOfFile: path, encoding: .utf8) } catch {
        throw SofaError.invalidArgument("cannot read a password from \(path): \(error.localizedDescription)")
    }
    guard let line = text.split(separator: "\n", omittingEmptySubsequences: false).first else {
        throw SofaError.invalidArgument("cannot read a password from \(path)")
    }
    return String(line)
}

struct Download: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download attachment bodies that a pull deferred (all, one document's, or one).",
        discussion: "Bodies come from --remote, or from where the database last pulled. An interrupted body resumes with an HTTP Range.")

    @Argument(help: "The database.", completion: .directory) var database: String
    @Argument(help: "Only this document.") var id: String?
    @Argument(help: "Only this attachment of it.") var name: String?
    @Option(help: "The remote database URL.") var remote: String?
    @Flag(help: "Print JSON events (progress of each body, each body done) and a final summary.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }
    @OptionGroup var connection: ConnectionOptions

    func execute() throws {
        let signals = SignalWatcher([SIGINT, SIGTERM])
        defer { signals.cancel() }
        let db = try Database.open(at: database)
        if let id {
            // A name that matches nothing is a mistake to report, not "0 bodies downloaded".
            if let name { _ = try db.currentAttachment(name, of: id) } else { _ = try db.revision(of: id, rev: nil) }
        }
        guard let url = try remote ?? db.rememberedRemote else {
            throw SofaError.invalidArgument("no remote known for \(database): give --remote URL")
        }
        let downloader = RemoteBodies(database: db, remote: try connection.remote(url), retry: connection.retryPolicy,
                                      caFile: connection.cacert)
        signals.onSignal { downloader.cancel() }
        let terminal = Verbosity.showsProgress
        do {
            let meter = TransferMeter()
            let json = self.json
            let (count, bytes) = try downloader.downloadMissing(docID: id, name: name, bodyProgress: { body in
                if json {
                    Output.line(JSONValue.object(["event": "progress", "id": .string(body.docID), "name": .string(body.name),
                                                  "bytes": .integer(body.present), "length": .integer(body.length)]).jsonString())
                } else if terminal {
                    Output.write(STDERR_FILENO, "\r\u{1B}[K" + meter.line(body))
                }
            }) { done, total, bytes in
                if json {
                    Output.line(JSONValue.object(["event": "downloaded", "bodies": .integer(Int64(done)), "of": .integer(Int64(total)),
                                                  "bytes": .integer(bytes)]).jsonString())
                } else if terminal {
                    Output.write(STDERR_FILENO, "\r\u{1B}[Kdownloaded \(done) of \(total) bodies, \(formatBytes(bytes))")
                }
            }
            if terminal && !json { Output.write(STDERR_FILENO, "\n") }
            if json {
                Output.line(JSONValue.object(["ok": true, "bodies_downloaded": .integer(Int64(count)), "bytes": .integer(bytes)]).jsonString())
            } else {
                Output.line("downloaded \(counted(count, "attachment body", "attachment bodies")) (\(bytes) bytes)")
            }
        } catch let error as ReplicationError {
            if terminal { Output.write(STDERR_FILENO, "\n") }
            let kept = db.blobs.partialBodies().reduce(0) { $0 + $1.length }
            let resume = kept > 0 ? "; \(formatBytes(kept)) already here will not travel again when you run sofa download again" : ""
            if case .cancelled = error {
                Output.error("download stopped by \(signals.reason)\(resume)")
                if json {
                    Output.line(JSONValue.object(["ok": false, "error": "stopped", "reason": .string(signals.reason),
                                                  "partial": ["partial_body_bytes": .integer(kept)]]).jsonString())
                }
                throw ExitCode(signals.exitStatus)
            }
            throw ReplicationFailure(job: "download", cause: error, note: resume)
        }
    }
}

struct DownloadRules: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "download-policy",
        abstract: "Show or change which attachment bodies pulls from a remote download (the others are fetched when read).",
        discussion: "The rules are stored with the database for the remote, and pulls, syncs and mounts that give none follow them.")

    @Argument(help: "The database.", completion: .directory) var database: String
    @Option(help: "The remote database URL (default: where the database last pulled from).") var remote: String?
    @OptionGroup var downloads: DownloadOptions
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let db = try Database.open(at: database)
        guard let url = try remote ?? db.rememberedRemote else {
            throw SofaError.invalidArgument("no remote known for \(database): give --remote URL")
        }
        let policy = try downloads.policy(for: db, url: url)
        Output.line("\(try RemoteDatabase(url).url): \(policy.description)")
    }
}

/// A progress line for one body: bytes done and total, rate, time left.
final class TransferMeter {
    private var started: (digest: String, time: Date, bytes: Int64)?

    func line(_ body: BodyProgress) -> String {
        let now = Date()
        if started?.digest != body.digest { started = (body.digest, now, body.present) }
        let elapsed = now.timeIntervalSince(started!.time)
        let rate = elapsed > 0.2 ? Double(body.present - started!.bytes) / elapsed : 0
        var line = "\(body.docID)/\(body.name): \(formatBytes(body.present)) of \(formatBytes(body.length))"
        if rate > 0 {
            line += ", \(formatBytes(Int64(rate)))/s, \(Int((Double(body.length - body.present) / rate).rounded(.up))) s left"
        }
        return line
    }
}

struct PurgeAttachment: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "purge-attachment",
        abstract: "Drop an attachment's local body, keeping its metadata: it becomes deferred again and is fetched when read.")

    @Argument(help: "The database.", completion: .directory) var database: String
    @Argument(help: "The document.") var id: String
    @Argument(help: "The attachment.") var name: String
    @Flag(help: "Say what would be purged; change nothing.") var dryRun = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let db = try Database.open(at: database)
        let attachment = try db.currentAttachment(name, of: id)
        if dryRun {
            let here = attachment.blobKey.map { db.blobs.contains($0) } ?? false
            Output.line(here ? "would purge the body of \(name) (\(attachment.length) bytes); its metadata would stay"
                             : "the body of \(name) is not here: nothing to purge")
            return
        }
        if try db.rememberedRemote == nil {
            Output.error("warning: \(database) has no remote it pulled from; give --remote when you download or mount")
        }
        let freed = try db.purgeBody(digest: attachment.digest)
        Output.line("purged the body of \(name) (\(freed) bytes freed); its metadata stays")
    }
}
