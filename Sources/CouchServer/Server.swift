import DocumentModel
import DocumentStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOWebSocket
import BLIP
import BLIPReplication

/// `sofa serve`: the CouchDB 3.x HTTP API over Sofa databases, on SwiftNIO.
///
/// Every connection is a task that reads one request at a time; storage calls,
/// which block, run on a thread pool; attachment bodies stream in both directions
/// with the channel's back-pressure.
///
/// ```swift
/// let server = try CouchServer(configuration: .init(databases: ["notes": "/data/notes.sofa"]))
/// let port = try await server.start()
/// try await server.run()   // until stop()
/// ```
public final class CouchServer: @unchecked Sendable {
    /// The name a database folder is served under: `notes.sofa` → `notes`, `team%2Fnotes.sofa` → `team/notes`.
    public static func databaseName(ofFolder path: String) -> String {
        var folder = URL(fileURLWithPath: path).lastPathComponent
        if folder.hasSuffix(".sofa") { folder.removeLast(5) }
        return DatabaseRegistry.name(ofFolder: folder)
    }

    public struct Configuration: Sendable {
        public var host = "127.0.0.1"
        /// 0 picks a free port.
        public var port = 5984
        /// Served databases: name → path of the `.sofa` directory.
        public var databases: [String: String]
        /// Where `PUT /{db}` creates new databases (`NAME.sofa`); nil refuses creation.
        public var directory: String?
        /// The key `PUT /{db}` encrypts the databases it creates with; nil: they are plain.
        public var newDatabaseKey: (secret: DatabaseSecret, unlock: KeyUnlock)?
        /// With a user, every request but `/`, `/_up` and `/_session` needs credentials.
        public var user: String?
        public var password: String?
        public var readOnly = false
        /// Where a database's deferred bodies come from when asked for (`sofa serve`: its
        /// remembered remote); called once per database. Nil: such bodies answer 404.
        public var bodySource: (@Sendable (Database) -> (any BodySource)?)?
        /// How long a connection may take to send a request's head, counted from the end of the
        /// previous response (or the connection's start): an idle keep-alive connection, or one
        /// sending its headers a byte at a time (slowloris), is closed after it.
        public var headerTimeout = ServerTuning.headerTimeout
        /// How long a request's body may pause: one that stops mid-way (shorter than its
        /// `Content-Length`, a chunked body without its last chunk) is closed after it.
        public var bodyTimeout = ServerTuning.bodyTimeout
        /// Open connections at most; past it the longest idle one is closed for a new one (or, with
        /// none idle, the new one). Nil: as many as the descriptor limit allows, less a reserve.
        public var maximumConnections: Int?
        /// Starts the replications clients ask for (`POST /_replicate`); nil answers 501.
        public var replicator: (@Sendable (ReplicationRequest) throws -> any ReplicationJob)?

        public init(databases: [String: String], directory: String? = nil) {
            self.databases = databases
            self.directory = directory
        }
    }

    let configuration: Configuration
    let log: Logger
    let registry: DatabaseRegistry
    let sessions: SessionKeys
    let passwords = Passwords()
    let uuid = UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
    let pool: NIOThreadPool
    /// At most all but one of `pool`'s threads for one database's work.
    let slots: DatabaseSlots
    /// The index updates `update=lazy` queries leave behind.
    let lazyViewUpdates = LazyViewUpdates()
    /// The continuous replications clients started.
    let replications = ReplicationJobs()
    /// The port listened on, once `start()` bound it.
    private(set) var boundPort: Int?
    private let group: MultiThreadedEventLoopGroup
    private var serverChannel: NIOAsyncChannel<AcceptedConnection, Never>?
    /// Closed by `stop()`.
    private let stopLock = NSLock()
    private var stopped = false

    public init(configuration: Configuration, logger: Logger = Logger(label: "sofa.serve")) throws {
        self.configuration = configuration
        self.log = logger
        self.registry = try DatabaseRegistry(databases: configuration.databases, directory: configuration.directory,
                                             newDatabaseKey: configuration.newDatabaseKey)
        // With users to check, the directory gets CouchDB's system databases (admins only, as CouchDB 3
        // makes them); without, `PUT /_replicator` makes that one.
        if configuration.user != nil, configuration.directory != nil, !configuration.readOnly {
            for name in [CouchServer.usersDatabase, CouchServer.replicatorDatabase] where registry.path(of: name) == nil {
                _ = try registry.create(name)
            }
        }
        self.sessions = SessionKeys()
        let threads = max(4, System.coreCount * 2)
        self.pool = NIOThreadPool(numberOfThreads: threads)
        slots = DatabaseSlots(limit: threads - 1)
        self.group = MultiThreadedEventLoopGroup(numberOfThreads: max(1, System.coreCount))
    }

    /// The databases this server has opened so far (for `AutoCompaction`): one is opened at its
    /// first request; a deleted one leaves.
    public var openDatabases: [Database] { registry.openDatabases }

    /// Binds the socket; returns the port (useful with port 0).
    public func start() async throws -> Int {
        pool.start()
        let channel: NIOAsyncChannel<AcceptedConnection, Never>
        do {
            channel = try await bind()
        } catch let error as IOError where error.errnoCode == EADDRINUSE {
            // NIO's message names the system call; say what it means and what to do instead.
            throw SofaError.invalidArgument("the port is in use (another sofa serve, or CouchDB?): choose another with --port, or --port 0 for a free one")
        } catch let error as IOError where error.errnoCode == EACCES {
            throw SofaError.invalidArgument("permission denied (ports below 1024 need root): choose another with --port")
        }
        serverChannel = channel
        boundPort = channel.channel.localAddress?.port ?? configuration.port
        return boundPort!
    }

    private func bind() async throws -> NIOAsyncChannel<AcceptedConnection, Never> {
        try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // (`.socketOption(.tcp_nodelay)` sets SOL_SOCKET's option 1, SO_DEBUG: this is TCP's.)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 4)
            // A client that sends its request and then closes its side still gets the answer.
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .bind(host: configuration.host, port: configuration.port) { [configuration] channel in
                channel.eventLoop.makeCompletedFuture {
                    self.accepted(channel)
                    let closer = LingeringClose()
                    let watcher = ParseErrorWatcher(closer)
                    let deadlines = RequestDeadlines(header: configuration.headerTimeout, body: configuration.bodyTimeout)
                    let firstHead = FirstRequestHead()
                    try channel.pipeline.syncOperations.addHandler(closer)
                    // The first request may turn the connection into a WebSocket (Couchbase Lite's
                    // replicator at /{db}/_blipsync); any other is HTTP from then on.
                    let webSocket = NIOTypedWebSocketServerUpgrader<ConnectionKind>(
                        maxFrameSize: BLIPTuning.maximumFrameSize,
                        shouldUpgrade: { channel, head in self.blipUpgradeHeaders(channel, head) },
                        upgradePipelineHandler: { channel, head in
                            // The HTTP handlers of this server's own go too (NIO removes its own).
                            return channel.pipeline.removeHandler(deadlines).and(channel.pipeline.removeHandler(watcher))
                                .and(channel.pipeline.removeHandler(firstHead)).flatMapThrowing { _ -> ConnectionKind in
                                try channel.pipeline.syncOperations.addHandler(
                                    NIOWebSocketFrameAggregator(minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 1 << 16,
                                                                maxAccumulatedFrameSize: BLIPTuning.maximumFrameSize))
                                try channel.pipeline.syncOperations.addHandler(InboundFrameCopier())
                                let wrapped = try WebSocketChannel(wrappingChannelSynchronously: channel)
                                return .webSocket(wrapped, head)
                            }
                        })
                    let upgrade = try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(
                        configuration: .init(upgradeConfiguration: NIOTypedHTTPServerUpgradeConfiguration(
                            upgraders: [webSocket],
                            notUpgradingCompletionHandler: { channel in
                                channel.eventLoop.makeCompletedFuture {
                                    try channel.pipeline.syncOperations.addHandler(DroppedHeadRestorer(firstHead))
                                    try channel.pipeline.syncOperations.addHandler(InboundCopier())
                                    return .http(try HTTPChannel(wrappingChannelSynchronously: channel))
                                }
                            })))
                    // Before NIO's error handler (which answers 400), after the decoder.
                    let decoder = try channel.pipeline.syncOperations.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
                    try channel.pipeline.syncOperations.addHandler(watcher, position: .after(decoder))
                    try channel.pipeline.syncOperations.addHandler(deadlines, position: .after(decoder))
                    try channel.pipeline.syncOperations.addHandler(firstHead, position: .after(decoder))
                    let accepted = AcceptedConnection(channel: channel, kind: upgrade)
                    self.stopLock.withLock { self.unserved[ObjectIdentifier(channel)] = accepted }
                    return accepted
                }
            }
    }

    /// Serves connections until `stop()`.
    public func run() async throws {
        guard let serverChannel else { preconditionFailure("start() first") }
        let replicatorDatabase = Task { await self.runReplicatorDatabase() }
        defer { replicatorDatabase.cancel() }
        try await withThrowingDiscardingTaskGroup { group in
            try await serverChannel.executeThenClose { connections in
                for try await connection in connections {
                    group.addTask { await self.serve(connection) }
                }
            }
            // Connections accepted as the server stopped, which the loop above never received.
            for loop in self.group.makeIterator() { try? await loop.submit {}.get() }  // their setup has run
            for connection in stopLock.withLock({ unserved.values }) {
                group.addTask { await self.serve(connection) }
            }
        }
        // Deferred bodies being fetched for clients end before the process does; so do replications.
        registry.shutDownBodySources()
        for (_, running) in replications.all { running.job.cancel() }
        registry.checkpointAll(logging: log)
    }

    /// Open connections, whether each is handling a request, and since when it is idle (the
    /// longest idle goes first when the connections run out). Guarded by `stopLock`.
    private var connections: [ObjectIdentifier: Connection] = [:]

    /// An open connection: whether it is handling a request, and since when it is idle (from
    /// its accept, or the end of its last request).
    private struct Connection {
        let channel: Channel
        var busy: Bool
        var since: DispatchTime
    }
    /// Connections set up and not yet handed to `serve`. An NIOAsyncChannel dropped without its
    /// `executeThenClose` traps in its writer's deinit (SIGILL in `channelActive`: a SIGTERM
    /// right after a burst of connections did it, 1 run in 3), and the accept loop drops the
    /// ones that arrive as it ends; this keeps them until they are served. Guarded by `stopLock`.
    private var unserved: [ObjectIdentifier: AcceptedConnection] = [:]
    static let stopGracePeriod = ServerTuning.stopGracePeriod

    /// Stops accepting connections, closes idle ones, and lets requests in progress
    /// finish (for at most `stopGracePeriod`).
    public func stop() {
        let (idle, syncing) = stopLock.withLock { () -> ([Channel]?, [BLIPConnection]) in
            guard !stopped else { return (nil, []) }
            stopped = true
            return (connections.values.filter { !$0.busy }.map(\.channel), Array(syncConnections.values))
        }
        guard let idle else { return }
        for connection in syncing { Task { await connection.close("the server is stopping") } }
        // Scheduled before anything closes: once the server channel is closed, run() may
        // return and the event loops shut down, after which nothing can be scheduled.
        let forced = group.any().scheduleTask(in: CouchServer.stopGracePeriod) {
            self.stopLock.withLock { self.connections.values.map(\.channel) }.forEach { $0.close(promise: nil) }
        }
        stopLock.withLock { forcedClose = forced }
        serverChannel?.channel.close(promise: nil)
        idle.forEach { $0.close(promise: nil) }
    }

    /// Marks a connection busy or idle; false when the server is stopping and the connection should end.
    /// A connection's idle time counts from its accept or the end of its last request: its task
    /// starting later (a burst queues them) must not make it look fresher than one accepted
    /// since, or the room made for a new client is taken from that client.
    func setBusy(_ channel: Channel, _ busy: Bool) -> Bool {
        stopLock.withLock {
            let id = ObjectIdentifier(channel)
            // Closed meanwhile (made room for another): not counted again.
            if var known = connections[id] {
                if busy || known.busy { known.since = .now() }
                known.busy = busy
                connections[id] = known
            }
            return !stopped
        }
    }

    /// Couchbase Lite replicators connected, closed at once by `stop()` (a continuous pull would
    /// otherwise hold the server for its grace period). Guarded by `stopLock`.
    private var syncConnections: [ObjectIdentifier: BLIPConnection] = [:]

    /// Records a sync connection; false when the server is stopping (the connection ends).
    func registerSync(_ connection: BLIPConnection, _ id: ObjectIdentifier) -> Bool {
        stopLock.withLock {
            guard !stopped else { return false }
            syncConnections[id] = connection
            return true
        }
    }

    func unregisterSync(_ id: ObjectIdentifier) {
        _ = stopLock.withLock { syncConnections.removeValue(forKey: id) }
    }

    /// The forced close of connections still busy after `stopGracePeriod`. Guarded by `stopLock`.
    private var forcedClose: Scheduled<Void>?

    /// Releases threads; call after `run()` returned.
    public func shutdown() async {
        stopLock.withLock { forcedClose }?.cancel()
        // Ending: a loop that fails to stop has nothing left to serve.
        try? await group.shutdownGracefully()
        try? await pool.shutdownGracefully()
    }

    // MARK: - Connections

    /// Connections at most (`Configuration.maximumConnections`, else the descriptor limit less a
    /// reserve for database files, blobs and the listening socket).
    private lazy var connectionLimit: Int = {
        if let maximum = configuration.maximumConnections { return maximum }
        var files = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &files)
        return max(16, Int(min(files.rlim_cur, 1 << 20)) - ServerTuning.descriptorReserve)
    }()

    /// Connections at most counting the young ones that may exceed `connectionLimit` for a
    /// moment: half the descriptors' reserve above it (or half the limit given).
    private lazy var hardConnectionLimit: Int = connectionLimit
        + (configuration.maximumConnections.map { max(2, $0 / 2) } ?? ServerTuning.descriptorReserve / 2)

    /// Counts a connection as it is accepted, on its event loop, before its task runs: a burst
    /// of clients is counted at once, so the accepted sockets stay within the limits and
    /// accepting never runs out of descriptors (it did: 400 idle clients at a limit of 256
    /// descriptors filled them all, accepting stopped, and new clients waited for the 60 s
    /// header timeout). Past `connectionLimit` the longest idle connection closes to make room,
    /// if it has been idle for `ServerTuning.idleBeforeClosing` (one that just connected or just
    /// got its answer is about to send). Connections active that recently may take the room up
    /// to `hardConnectionLimit`; past it the new one is refused.
    private func accepted(_ channel: Channel) {
        let id = ObjectIdentifier(channel)
        let (shed, refused, limit) = stopLock.withLock { () -> (Channel?, Bool, Int) in
            let now = DispatchTime.now()
            connections[id] = Connection(channel: channel, busy: false, since: now)
            guard connections.count > connectionLimit else { return (nil, false, connectionLimit) }
            let settled = UInt64(ServerTuning.idleBeforeClosing * 1e9)
            let victim = connections.filter {
                $0.key != id && !$0.value.busy && now.uptimeNanoseconds - $0.value.since.uptimeNanoseconds >= settled
            }.min { $0.value.since < $1.value.since }
            guard victim != nil || connections.count > hardConnectionLimit else { return (nil, false, connectionLimit) }
            // Forgotten now, not when its close completes on its own loop: the next accept,
            // maybe a moment later, must neither count it nor pick it again.
            connections.removeValue(forKey: victim?.key ?? id)
            return (victim?.value.channel ?? channel, victim == nil, connectionLimit)
        }
        channel.closeFuture.whenComplete { [weak self] _ in
            self?.stopLock.withLock { _ = self?.connections.removeValue(forKey: id) }
        }
        guard let shed else { return }
        if refused {
            log.notice("refused a connection: \(limit) are open, and none has been idle for \(ServerTuning.idleBeforeClosing) s")
        } else {
            log.info("closed an idle connection to make room: \(limit) are open")
        }
        shed.close(promise: nil)
    }

    /// Serves one connection. Every connection goes through `executeThenClose`, even one closed
    /// before its turn (to make room, refused, or the server stopping): an NIOAsyncChannel
    /// dropped without it traps in its writer's deinit (SIGILL in `channelActive`, which is what
    /// a SIGTERM right after a burst of connections did).
    private func serve(_ accepted: AcceptedConnection) async {
        let channel = accepted.channel
        // Handed over once: the stragglers' pass after the accept loop takes only those left.
        guard stopLock.withLock({ unserved.removeValue(forKey: ObjectIdentifier(channel)) != nil }) else { return }
        let kind: ConnectionKind
        do {
            kind = try await accepted.kind.valueUnderLock()
        } catch {
            log.debug("connection ended before its first request: \(error)")
            return
        }
        switch kind {
        case .http(let connection): await serveHTTP(connection)
        case .webSocket(let connection, let head): await serveBLIP(connection, head: head)
        }
    }

    private func serveHTTP(_ connection: HTTPChannel) async {
        let channel = connection.channel
        // (Its entry in `connections` goes with the channel's close: see `accepted`.)
        do {
            try await connection.executeThenClose { inbound, outbound in
                // The server is stopping, or the channel was closed since it was accepted (its
                // pipeline is gone; a closed channel's inbound also just ends): nothing to serve.
                // (Not `isActive`: the task may run before the channel's activation on its loop.)
                guard setBusy(channel, false),
                      let closer = try? await channel.pipeline.handler(type: LingeringClose.self).get() else { return }
                let parts = InboundParts(inbound)
                while let head = try await parts.nextHead() {
                    _ = setBusy(channel, true)
                    let keepAlive = try await handle(head, parts: parts, outbound: outbound) {
                        // The connection ends with the body unread: drop what still comes for a while.
                        channel.eventLoop.execute { closer.lingerOnClose = true }
                    }
                    guard setBusy(channel, false), keepAlive else { break }
                }
            }
        } catch {
            log.debug("connection ended: \(error)")
        }
    }

    /// Handles one request; returns whether the connection can carry another.
    private func handle(_ head: HTTPRequestHead, parts: InboundParts,
                        outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>,
                        lingerOnClose: () -> Void) async throws -> Bool {
        let started = DispatchTime.now()
        let range = head.headers["Range"].first.map { " (\($0))" } ?? ""
        let body = RequestBody(parts, declaredLength: head.headers["Content-Length"].first.flatMap(Int.init))
        let response = ResponseWriter(outbound: outbound, isHead: head.method == .HEAD, keepAlive: head.isKeepAlive,
                                      announceKeepAlive: head.version == .http1_0)
        var cut = ""
        // Every request is logged at debug level, one cut short too (a client that went away).
        defer {
            let elapsed = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e6
            log.debug("\(head.method) \(head.uri)\(range) \(response.status.code) \(response.bytesSent)B\(cut) \(String(format: "%.1f", elapsed))ms")
        }
        // A request that asked for an upgrade not made ends its connection: NIO's decoder reads
        // nothing after it.
        var keepAlive = head.isKeepAlive && head.headers["Upgrade"].isEmpty
        if !keepAlive { response.keepAlive = false }
        if head.headers["Expect"].contains(where: { $0.lowercased() == "100-continue" }) {
            try await outbound.write(.head(HTTPResponseHead(version: .http1_1, status: .continue)))
        }
        do {
            let request = try Request(head: head, body: body, response: response)
            try await route(request)
        } catch where CouchServer.clientWentAway(error) {
            // Not a server error: nobody is left to answer (or NIO answered a malformed body with 400).
            cut = " (the client went away or sent a malformed body: \(error))"
            return false
        } catch {
            let failure = HTTPError.from(error)
            if failure.status.code >= 500 { log.error("\(head.method) \(head.uri): \(failure)") }
            if response.headSent {
                // Too late for an error response: end the connection so the client sees a truncated body.
                log.warning("\(head.method) \(head.uri) failed mid-response: \(failure)")
                cut = " (cut short)"
                return false
            }
            // A refused request whose body was not read (a 401 on a big upload, say) ends the
            // connection rather than reading the rest of the body for nothing.
            let hasBody = head.headers["Content-Length"].contains { $0 != "0" }
                || head.headers["Transfer-Encoding"].contains { $0.lowercased().contains("chunked") }
            if failure.closeConnection || (hasBody && !body.finished) {
                keepAlive = false
                response.keepAlive = false
                // A small unread body is read first: closing with unread bytes makes the kernel
                // reset the connection, and the client may lose the answer.
                if hasBody && !body.finished, let length = head.headers["Content-Length"].first.flatMap(Int.init), length <= 64 * 1024 {
                    try? await body.drain()  // best effort before the close; lingerOnClose covers the rest
                }
                if hasBody && !body.finished { lingerOnClose() }
            }
            try await response.sendError(failure)
        }
        guard keepAlive else { return false }
        // Whatever the handler left unread is skipped so the next request starts cleanly.
        try await body.drain()
        return true
    }

    /// Whether `error` means the connection cannot carry an answer: the client closed it or reset
    /// it, a deadline closed it, or the body could not be parsed (NIO has answered 400 already).
    static func clientWentAway(_ error: any Error) -> Bool {
        if error is HTTPParserError { return true }
        if let error = error as? ChannelError {
            switch error {
            case .ioOnClosedChannel, .alreadyClosed, .eof, .outputClosed: return true
            default: return false
            }
        }
        if let error = error as? IOError { return [EPIPE, ECONNRESET, ETIMEDOUT].contains(error.errnoCode) }
        return false
    }

    /// Runs blocking storage work off the event loops; for a request to a database, once one
    /// of that database's slots is free (`DatabaseSlots`).
    func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        // Saves made by the work are the request's user's, as validate_doc_update sees them.
        let user = CouchServer.user
        let author = Author(name: user.name, roles: user.roles)
        guard let database = CouchServer.database else {
            return try await pool.runIfActive { try Author.$current.withValue(author) { try work() } }
        }
        return try await slots.withSlot(database) {
            try await pool.runIfActive { try Author.$current.withValue(author) { try work() } }
        }
    }

    /// The database the request being answered is for, if any.
    @TaskLocal static var database: String?
}

/// A connection as accepted: what its first request made of it comes later.
struct AcceptedConnection: Sendable {
    let channel: Channel
    let kind: EventLoopFuture<ConnectionKind>
}

/// HTTP, or a WebSocket carrying BLIP (Couchbase Lite's replication) after an upgrade.
enum ConnectionKind: Sendable {
    case http(HTTPChannel)
    case webSocket(WebSocketChannel, HTTPRequestHead)
}

/// One request being handled.
struct Request {
    let head: HTTPRequestHead
    let target: RequestTarget
    let body: RequestBody
    let response: ResponseWriter

    init(head: HTTPRequestHead, body: RequestBody, response: ResponseWriter) throws {
        self.head = head
        self.target = try RequestTarget(head.uri)
        self.body = body
        self.response = response
    }

    var method: HTTPMethod { head.method }
    var headers: HTTPHeaders { head.headers }
    var segments: [String] { target.segments }

    func query(_ name: String) -> String? { target.query[name] }

    /// A boolean query parameter as CouchDB reads a document's or a feed's: `true` sets it,
    /// anything else leaves it unset.
    func flag(_ name: String, default value: Bool = false) -> Bool {
        guard let text = target.query[name] else { return value }
        return text == "true"
    }

    /// A boolean query parameter as CouchDB reads a view's or `_all_docs`' (`parse_boolean`):
    /// `true` or `false` in any case; anything else is a 400.
    func booleanQuery(_ name: String) throws -> Bool? {
        guard let text = target.query[name] else { return nil }
        return try Request.parseBoolean(text)
    }

    static func parseBoolean(_ text: String) throws -> Bool {
        switch text.lowercased() {
        case "true": return true
        case "false": return false
        default: throw HTTPError(.badRequest, "query_parse_error", "Invalid boolean parameter: \"\(text)\"")
        }
    }

    /// A JSON-valued query parameter (`open_revs=["1-a"]`, `startkey="x"`).
    func jsonQuery(_ name: String) throws -> JSONValue? {
        guard let text = target.query[name] else { return nil }
        do {
            return try JSONParser.parse(Array(text.utf8))
        } catch {
            throw HTTPError.badRequest("\(name) is not valid JSON")
        }
    }

    func intQuery(_ name: String) throws -> Int? {
        guard let text = target.query[name] else { return nil }
        guard let value = Int(text), value >= 0 else { throw HTTPError(.badRequest, "query_parse_error", "Invalid value for \(name): \"\(text)\"") }
        return value
    }

    /// Whether the Accept header admits `type` (`multipart/mixed`), as CouchDB decides it
    /// (mochiweb's `accepts_content_type`): no Accept header is `*/*`; a range admits the type
    /// itself, its main type's `/*` or `*/*` with a q above 0, unless the type or its `/*` has
    /// q=0; a q that is not a number admits nothing. So curl's `*/*` gets CouchDB's multipart
    /// answers, and a client that wants JSON says `application/json`.
    func acceptsContentType(_ type: String) -> Bool {
        let values = headers["Accept"]
        let ranges = values.isEmpty ? ["*/*"] : values.flatMap { $0.split(separator: ",").map(String.init) }
        var qualities: [(range: String, q: Double)] = []
        for item in ranges {
            let parts = item.split(separator: ";").map { $0.filter { !$0.isWhitespace }.lowercased() }
            guard let range = parts.first, !range.isEmpty else { continue }
            var q = 1.0
            for parameter in parts.dropFirst() where parameter.hasPrefix("q=") {
                guard let value = Double(parameter.dropFirst(2)) else { return false }
                q = value
            }
            qualities.append((range, q))
        }
        let wanted = type.lowercased()
        let superType = String(wanted.prefix { $0 != "/" }) + "/*"
        let admitted = qualities.contains { $0.q > 0 && ($0.range == "*/*" || $0.range == wanted || $0.range == superType) }
        let refused = qualities.contains { $0.q == 0 && ($0.range == wanted || $0.range == superType) }
        return admitted && !refused
    }
}

/// The databases a server serves, by name. Thread-safe.
final class DatabaseRegistry: @unchecked Sendable {
    private let lock = NSLock()
    private var paths: [String: String]
    private var open: [String: Database] = [:]
    let directory: String?
    /// What new databases are encrypted with, if anything.
    let newDatabaseKey: (secret: DatabaseSecret, unlock: KeyUnlock)?
    /// Published when a database is created or deleted.
    let namesChanged = ChangeStream()
    /// What `_db_updates` lists.
    let updates = DatabaseUpdates()

    /// Body sources by database path, made on first need. Guarded by `lock`.
    private var bodySources: [String: (any BodySource)?] = [:]

    /// Ends the fetches of every body source (before the process exits).
    func shutDownBodySources() {
        let sources = lock.withLock { bodySources.values.compactMap { $0 } }
        for source in sources { source.shutDown(waitingAtMost: 30) }
    }

    /// Empties the write-ahead log of every open database (the server is ending: see
    /// `Database.checkpoint`). A failure is logged: the log stays, and nothing is lost.
    func checkpointAll(logging log: Logger) {
        for database in lock.withLock({ Array(open.values) }) {
            do { try database.checkpoint() } catch {
                log.warning("\(database.path): the write-ahead log was not moved into the database file: \(error)")
            }
        }
    }

    /// Where `database`'s deferred bodies come from, if anywhere: `make` is asked once.
    func bodySource(for database: Database, make: ((Database) -> (any BodySource)?)?) -> (any BodySource)? {
        lock.withLock {
            if let known = bodySources[database.path] { return known }
            let source = make?(database)
            bodySources[database.path] = .some(source)
            return source
        }
    }

    init(databases: [String: String], directory: String?, newDatabaseKey: (secret: DatabaseSecret, unlock: KeyUnlock)? = nil) throws {
        for name in databases.keys { try DatabaseRegistry.validate(name) }
        self.paths = databases
        self.directory = directory
        self.newDatabaseKey = newDatabaseKey
        lookInDirectory(announcing: false)
    }

    /// Adds the databases in `directory` that are not served yet: those there at the start, and
    /// those another process made since (`sofa create`, a `sofa pull` or `sofa copy` into a new
    /// database). Under `lock`, or from `init` (which announces nothing: they were there).
    private func lookInDirectory(announcing: Bool = true) {
        guard let directory, let entries = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        for entry in entries where entry.hasSuffix(".sofa") {
            _ = serveIfMade(DatabaseRegistry.name(ofFolder: String(entry.dropLast(5))), announcing: announcing)
        }
    }

    /// The path of database `name` in `directory`, served from now on, if it is there and not
    /// served yet: a folder whose name CouchDB would refuse is not, nor one still being made (no
    /// SQLite file yet). `_db_updates` and the `_replicator` watcher are told. Under `lock`.
    private func serveIfMade(_ name: String, announcing: Bool = true) -> String? {
        guard paths[name] == nil, let directory, (try? DatabaseRegistry.validate(name)) != nil else { return nil }
        let path = "\(directory)/\(DatabaseRegistry.folder(of: name)).sofa"
        guard FileManager.default.fileExists(atPath: path + "/db.sqlite3") else { return nil }
        paths[name] = path
        if announcing {
            updates.record(name, .created)
            namesChanged.publish()
        }
        return path
    }

    /// CouchDB's rule for database names (at most 238 characters, as CouchDB's); `_users` and
    /// `_replicator` are the system databases Sofa has.
    static func validate(_ name: String) throws {
        if [CouchServer.usersDatabase, CouchServer.replicatorDatabase, CouchServer.globalChangesDatabase].contains(name) { return }
        let allowed = Set("abcdefghijklmnopqrstuvwxyz0123456789_$()+-/")
        guard let first = name.first, first.isLetter, first.isLowercase, first.isASCII, name.allSatisfy(allowed.contains),
              name.utf8.count <= 238 else {
            throw HTTPError(.badRequest, "illegal_database_name",
                            "Name: '\(name)'. Only lowercase characters (a-z), digits (0-9), and any of the characters _, $, (, ), +, -, and / are allowed. Must begin with a letter.")
        }
    }

    /// A name's folder (`NAME.sofa` without the suffix): `/` becomes `%2F`, which no name
    /// can hold otherwise (`%` is not allowed), so the way back is exact.
    static func folder(of name: String) -> String { name.replacingOccurrences(of: "/", with: "%2F") }
    static func name(ofFolder folder: String) -> String { folder.replacingOccurrences(of: "%2F", with: "/") }

    /// Every database served, the directory looked through again (`_all_dbs`).
    var names: [String] {
        lock.withLock {
            lookInDirectory()
            return paths.keys.sorted()
        }
    }

    func path(of name: String) -> String? { lock.withLock { paths[name] ?? serveIfMade(name) } }

    /// The databases opened so far (a database is opened at its first request).
    var openDatabases: [Database] { lock.withLock { Array(open.values) } }

    func database(_ name: String) throws -> Database {
        try lock.withLock {
            if let database = open[name] { return database }
            guard let path = paths[name] ?? serveIfMade(name) else { throw HTTPError.databaseNotFound }
            let database = try Database.open(at: path)
            open[name] = database
            updates.follow(database, as: name)
            return database
        }
    }

    func create(_ name: String) throws -> Database {
        try DatabaseRegistry.validate(name)
        return try lock.withLock {
            if paths[name] != nil || serveIfMade(name) != nil { throw SofaError.databaseExists(path: name) }
            guard let directory else {
                throw HTTPError(.forbidden, "forbidden", "this server was started without a directory for new databases")
            }
            let path = "\(directory)/\(DatabaseRegistry.folder(of: name)).sofa"
            let database = try Database.create(at: path, encryptedWith: newDatabaseKey.map { ($0.secret, $0.unlock) })
            paths[name] = path
            open[name] = database
            updates.record(name, .created)
            updates.follow(database, as: name)
            namesChanged.publish()
            return database
        }
    }

    func delete(_ name: String) throws {
        let (path, database) = try lock.withLock { () -> (String, Database?) in
            guard let path = paths.removeValue(forKey: name) else { throw HTTPError.databaseNotFound }
            return (path, open.removeValue(forKey: name))
        }
        // Whoever still follows it (a feed, `_replicator`) stops waiting.
        database?.changeStream.close()
        updates.record(name, .deleted)
        namesChanged.publish()
        try FileManager.default.removeItem(atPath: path)
    }
}
