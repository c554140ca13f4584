import ArgumentParser
import CouchServer
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import NIOCore
import Logging
import Replicator

/// `sofa serve DB…`: share databases over the CouchDB HTTP API.
struct Serve: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve databases over the CouchDB HTTP API (for replication, PouchDB, curl).",
        discussion: """
            Each database is served under its folder name without .sofa: `sofa serve notes.sofa` \
            answers at http://127.0.0.1:5984/notes. New databases (PUT /name) are created in \
            --directory, which defaults to the folder of the first database. \
            Stop with Ctrl-C or SIGTERM; requests in progress finish first.
            """
    )

    @Argument(help: "Databases to serve.", completion: .directory)
    var databases: [String] = []

    @Option(help: "The address to listen on. Anything but 127.0.0.1 exposes the databases to the network.")
    var host = "127.0.0.1"

    @Option(help: "The TCP port; 0 picks a free one (printed at start).")
    var port = 5984

    @Option(help: "Serve every NAME.sofa in this folder, and create new databases there.")
    var directory: String?

    @Option(help: "Require this user name (with --password-file) on every request.")
    var user: String?

    @Option(help: "A file whose first line is the password for --user.")
    var passwordFile: String?

    @Flag(help: "Refuse every write with 403.")
    var readOnly = false

    @Flag(help: "Encrypt the databases PUT /{db} creates, with the key of --key-file or --key-fd (or --passphrase, asked once).")
    var encrypt = false

    @Option(help: "User name for the remotes deferred bodies are fetched from (where each database last pulled).")
    var remoteUser: String?

    @Option(help: "A file whose first line is the password for --remote-user.")
    var remotePasswordFile: String?

    @Option(help: "CA certificates (PEM) to verify those remotes with, instead of the system's.")
    var remoteCacert: String?

    @Option(help: "Seconds a connection may take to send a request's headers (counted from the previous answer); an idle connection closes after it.")
    var headerTimeout = 60.0

    @Option(help: "Seconds a request's body may pause before the connection closes.")
    var bodyTimeout = 60.0

    @Option(help: "Open connections at most; past it the longest idle one closes to make room (default: the descriptor limit, less a reserve).")
    var maxConnections: Int?
    @OptionGroup var compaction: AutoCompactionOption
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func validate() throws {
        if (user == nil) != (passwordFile == nil) {
            throw ValidationError("--user and --password-file go together")
        }
        if remotePasswordFile != nil && remoteUser == nil {
            throw ValidationError("--remote-password-file needs --remote-user")
        }
        if databases.isEmpty && directory == nil {
            throw ValidationError("give at least one database, or --directory")
        }
        // (A port past 65535 used to be cut to 16 bits: --port 70000 served on 4464.)
        guard (0...65535).contains(port) else {
            throw ValidationError("--port \(port) is not a TCP port: give 1–65535, or 0 for a free one")
        }
    }

    func execute() throws {
        let signals = SignalWatcher([SIGINT, SIGTERM])  // before any thread starts
        var served: [String: String] = [:]
        for path in databases {
            let database = try Database.open(at: path)  // a clear error now rather than a 404 later
            let name = CouchServer.databaseName(ofFolder: database.path)
            guard served[name] == nil else { throw SofaError.invalidArgument("two databases are named \(name)") }
            served[name] = database.path
        }
        var configuration = CouchServer.Configuration(
            databases: served,
            directory: directory ?? databases.first.map { URL(fileURLWithPath: $0).deletingLastPathComponent().path })
        configuration.host = host
        configuration.port = port
        configuration.readOnly = readOnly
        configuration.headerTimeout = .nanoseconds(Int64(headerTimeout * 1e9))
        configuration.bodyTimeout = .nanoseconds(Int64(bodyTimeout * 1e9))
        configuration.maximumConnections = maxConnections
        if encrypt {
            configuration.newDatabaseKey = try KeyOptions.newDatabaseKey(for: configuration.directory ?? "new databases", encrypt: true)
        }
        configuration.replicator = { [remoteCacert] request in try ServedReplication(request, caFile: remoteCacert) }
        raiseDescriptorLimit()
        // Bodies a database defers are fetched from where it last pulled, when a client asks.
        let remotePassword = try remotePasswordFile.map { try readPassword($0) }
        configuration.bodySource = { [remoteUser, remoteCacert] database in
            do {
                return try database.rememberedRemote.map { try RemoteDatabase($0, user: remoteUser, password: remotePassword) }.map {
                    RemoteBodies(database: database, remote: $0, caFile: remoteCacert)
                }
            } catch {
                log.error("\(database.path): deferred bodies cannot be fetched: \(error)")
                return nil
            }
        }
        if let user, let passwordFile {
            let password = try readPassword(passwordFile)
            guard !password.isEmpty else { throw SofaError.invalidArgument("\(passwordFile) holds no password") }
            configuration.user = user
            configuration.password = password
        }
        let server: CouchServer
        do {
            server = try CouchServer(configuration: configuration, logger: Logger(label: "sofa.serve"))
        } catch {
            throw SofaError.invalidArgument("\(error)")
        }

        let done = DispatchSemaphore(value: 0)
        let outcome = ServeOutcome()
        Task {
            do {
                let port = try await server.start()
                let names = served.keys.sorted().joined(separator: ", ")
                Output.line("sofa: serving \(names.isEmpty ? "no databases yet" : names) at http://\(host):\(port)/")
                try await server.run()
            } catch {
                outcome.error = error
            }
            await server.shutdown()
            done.signal()
        }
        signals.onSignal { server.stop() }
        // A read-only server writes nothing, compactions included.
        let compactor = readOnly ? nil : try compaction.start { server.openDatabases }
        done.wait()
        compactor?.stop()
        signals.cancel()
        if let error = outcome.error {
            throw SofaError.invalidArgument("cannot serve on \(host):\(port): \(Serve.explain(error))")
        }
    }
}

extension Serve {
    /// A listening socket's failure in words, with what to do (NIO's own text names its calls).
    static func explain(_ error: any Error) -> String {
        guard let error = error as? IOError else { return "\(error)" }
        let reason = String(cString: strerror(error.errnoCode))
        switch error.errnoCode {
        case EADDRNOTAVAIL: return "\(reason) (no network interface of this machine has that address; 127.0.0.1 or 0.0.0.0?)"
        case EADDRINUSE: return "\(reason) (another program listens there; --port chooses another)"
        case EACCES: return "\(reason) (ports below 1024 need root)"
        default: return reason
        }
    }
}

/// What the server task ended with, read after it signalled.
private final class ServeOutcome: @unchecked Sendable {
    var error: (any Error)?
}

/// A replication `sofa serve` runs for a client (`POST /_replicate`), with Sofa's replicator.
final class ServedReplication: ReplicationJob, @unchecked Sendable {
    // Sendable invariant: `totals` is guarded by its lock; the session is thread-safe.
    private let session: ReplicationSession
    private let totals = Locked((read: 0, written: 0, failures: 0, lastSeq: JSONValue.integer(0)))

    init(_ request: ReplicationRequest, caFile: String?) throws {
        let remote = try RemoteDatabase(request.remote)
        session = ReplicationSession(database: request.database, remote: remote,
                                     directions: [request.direction == .pull ? .pull : .push], continuous: request.continuous)
        session.caFile = caFile
        let selector = try request.selector.map { try Selector($0) }
        session.configure = { [request] replicator in
            replicator.docIDs = request.docIDs
            replicator.selector = selector
            replicator.filterFunction = request.filter
            replicator.queryParameters = request.queryParameters
            replicator.createTarget = request.createTarget
        }
        session.onPass = { [totals] _, result in
            totals.withLock { totals in
                totals.read += result.docsRead
                totals.written += result.docsWritten
                totals.failures += result.docWriteFailures
                totals.lastSeq = result.lastSeq
            }
        }
        session.start()
    }

    private var counts: JSONObject {
        totals.withLock { totals in
            ["docs_read": .integer(Int64(totals.read)), "docs_written": .integer(Int64(totals.written)),
             "doc_write_failures": .integer(Int64(totals.failures)), "end_last_seq": totals.lastSeq]
        }
    }

    func wait() throws -> JSONObject {
        session.wait()
        let status = session.status.json
        if session.status.currentState == "error", let reason = status["last_error"]?.stringValue {
            throw SofaError.invalidArgument("the replication failed: \(reason)")
        }
        return counts
    }

    func cancel() { session.stop() }

    var progress: JSONObject {
        var progress = counts
        progress["state"] = .string(session.status.currentState)
        return progress
    }
}
