import BLIP
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket

/// A Couchbase Lite endpoint (`ws://host:port/db`: Sync Gateway, Capella App Services, another
/// `sofa serve`) as a replication peer, over one BLIP connection to its `_blipsync`.
///
/// The protocol is the server's to drive on a pull: `subChanges` asks for the feed, the server
/// sends `changes` messages (answered with the revisions wanted) and then a `rev` for each;
/// bodies are asked for with `getAttachment`. A push proposes its revisions (`proposeChanges`
/// with the revision each follows, or `changes`), sends a `rev` for each wanted, and answers
/// the server's `getAttachment` from the local database. The Replicator's calls map onto that:
/// `changes` returns the next `changes` message, `revisions` answers it and collects the `rev`
/// messages. Everything waits on one condition that the connection's handler signals.
final class BLIPPeer: ReplicationPeer, @unchecked Sendable {
    // Sendable invariant: `condition` guards the inboxes and `closed`; the rest is set in init.
    let remote: RemoteDatabase
    let local: Database
    private let blip: BLIPConnection
    private let runner: Task<Void, Never>
    private let log = Logger(label: "sofa.replicate.blip")
    private let condition = NSCondition()
    /// `changes` messages from the server not yet returned by `changes()`.
    private var changeMessages: [BLIPMessage] = []
    /// `rev` and `norev` messages by "docID rev".
    private var revMessages: [String: BLIPMessage] = [:]
    private var closed: String?
    /// The `changes` message returned last, until `revisions` answers it.
    private var unanswered: BLIPMessage?
    private var subscribed = false
    private var checkpointRevs: [String: String] = [:]
    /// How long the server may stay silent while this side waits for it.
    static let silence: TimeInterval = 120

    var name: String { remote.url }

    /// Connects and upgrades (`wss://`: TLS verified against the system's CAs, or `caFile`'s);
    /// a refusal (401, 403, 404…) throws as HTTP's.
    init(remote: RemoteDatabase, local: Database, caFile: String? = nil) throws {
        self.remote = remote
        self.local = local
        let box = PeerBox()
        let blip = BLIPConnection { connection, message in await box.peer?.received(message, on: connection) }
        self.blip = blip
        let channel = try BLIPPeer.waitFor { try await BLIPPeer.connect(remote, caFile: caFile) }
        self.runner = Task { await BLIPPeer.run(channel, blip) }
        box.peer = self
        // The connection's end wakes every wait.
        Task { [weak self] in
            _ = await self?.runner.value
            self?.markClosed("the connection to \(remote) ended")
        }
    }

    deinit { runner.cancel() }

    /// Ends the connection.
    func close() {
        let blip = self.blip
        _ = try? BLIPPeer.waitFor { await blip.close("replication done") }
        runner.cancel()
    }

    private func markClosed(_ reason: String) {
        condition.withLock {
            if closed == nil { closed = reason }
            condition.broadcast()
        }
    }

    // MARK: - The connection

    private enum Upgrade: Sendable {
        case webSocket(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>)
        case refused(NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>)
    }

    private static func connect(_ remote: RemoteDatabase, caFile: String?) async throws -> NIOAsyncChannel<WebSocketFrame, WebSocketFrame> {
        guard let components = URLComponents(string: remote.url), let host = components.host, let port = components.port else {
            throw SofaError.invalidArgument("\(remote): no host")
        }
        let tls: NIOSSLContext?
        if remote.url.hasPrefix("wss://") {
            var configuration = TLSConfiguration.makeClientConfiguration()
            if let caFile { configuration.trustRoots = .file(caFile) }
            do { tls = try NIOSSLContext(configuration: configuration) } catch {
                throw SofaError.invalidArgument("\(remote): TLS cannot start: \(error)")
            }
        } else {
            tls = nil
        }
        // SNI takes names only; an address is checked against the certificate's IP entries.
        let serverName = host.allSatisfy { $0.isNumber || $0 == "." || $0 == ":" } ? nil : host
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "\(host):\(port)")
        headers.add(name: "Content-Length", value: "0")
        headers.add(name: "Sec-WebSocket-Protocol", value: "BLIP_3+CBMobile_3")
        if let user = remote.user {
            headers.add(name: "Authorization", value: "Basic " + Data("\(user):\(remote.password ?? "")".utf8).base64EncodedString())
        }
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: components.percentEncodedPath + "/_blipsync", headers: headers)
        let upgrade: EventLoopFuture<Upgrade>
        do {
            upgrade = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .connectTimeout(.seconds(30))
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let tls {
                            try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: serverName))
                        }
                        let upgrader = NIOTypedWebSocketClientUpgrader<Upgrade>(maxFrameSize: 1 << 20, upgradePipelineHandler: { channel, _ in
                            channel.eventLoop.makeCompletedFuture {
                                try channel.pipeline.syncOperations.addHandler(
                                    NIOWebSocketFrameAggregator(minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 1 << 16,
                                                                maxAccumulatedFrameSize: 1 << 20))
                                try channel.pipeline.syncOperations.addHandler(InboundFrameCopier())
                                return .webSocket(try NIOAsyncChannel(wrappingChannelSynchronously: channel))
                            }
                        })
                        let configuration = NIOTypedHTTPClientUpgradeConfiguration<Upgrade>(
                            upgradeRequestHead: head, upgraders: [upgrader],
                            notUpgradingCompletionHandler: { channel in
                                channel.eventLoop.makeCompletedFuture { .refused(try NIOAsyncChannel(wrappingChannelSynchronously: channel)) }
                            })
                        return try channel.pipeline.syncOperations.configureUpgradableHTTPClientPipeline(
                            configuration: .init(upgradeConfiguration: configuration))
                    }
                }
        } catch {
            throw ReplicationError.network("\(remote): \(error)")
        }
        let outcome: Upgrade
        do {
            outcome = try await upgrade.valueUnderLock()
        } catch let error as NIOSSLError {
            let why = "\(error)".contains("CERTIFICATE_VERIFY_FAILED")
                ? "its certificate is not trusted here (give the CA that signed it with --cacert)" : "\(error)"
            throw ReplicationError.network("\(remote): the TLS handshake failed: \(why)")
        } catch {
            throw ReplicationError.network("\(remote): \(error)")
        }
        switch outcome {
        case .webSocket(let channel):
            return channel
        case .refused(let channel):
            // HTTP's answer: the status and CouchDB's reason, as an HTTP remote's would be reported.
            let (status, body) = try await channel.executeThenClose { inbound, _ in
                var status = 0
                var body: [UInt8] = []
                for try await part in inbound {
                    switch part {
                    case .head(let head): status = Int(head.status.code)
                    case .body(let buffer): body += Array(buffer: buffer)
                    case .end: return (status, body)
                    }
                }
                return (status, body)
            }
            let json = try? JSONParser.parse(body)
            throw ReplicationError.http(status: status, error: json?["error"]?.stringValue ?? "refused",
                                        reason: json?["reason"]?.stringValue ?? "the server does not serve Couchbase Lite's replication here",
                                        url: remote.url)
        }
    }

    /// Carries frames both ways until either side closes.
    private static func run(_ channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, _ blip: BLIPConnection) async {
        try? await channel.executeThenClose { inbound, outbound in
            await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    while let frame = await blip.nextFrame() {
                        try await outbound.write(WebSocketFrame(fin: true, opcode: .binary, maskKey: .random(), data: ByteBuffer(bytes: frame)))
                    }
                    try? await outbound.write(WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: .random(),
                                                             data: ByteBuffer(integer: UInt16(1000))))
                }
                group.addTask {
                    for try await frame in inbound {
                        switch frame.opcode {
                        case .binary: try await blip.receive(Array(buffer: frame.unmaskedData))
                        case .ping: try await outbound.write(WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData))
                        case .connectionClose: return
                        default: continue
                        }
                    }
                }
                _ = try? await group.next()
                await blip.close("the connection ended")
                group.cancelAll()
            }
        }
    }

    /// Runs async work from the replicator's thread and waits for it.
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

    private func request(_ profile: String, _ properties: [(String, String)] = [], body: [UInt8] = [],
                         sink: (any BLIPBodySink)? = nil) throws -> BLIPMessage {
        let blip = self.blip
        do {
            return try BLIPPeer.waitFor { try await blip.request(profile, properties: properties, body: body, sink: sink) }
        } catch let error as BLIPError {
            throw ReplicationError.http(status: error.code, error: error.domain, reason: error.message, url: remote.url)
        } catch let error as BLIPProtocolError {
            throw ReplicationError.network("\(remote): \(error)")
        }
    }

    // MARK: - What the server sends

    private func received(_ message: BLIPMessage, on connection: BLIPConnection) async {
        switch message.profile {
        case "changes", "proposeChanges":
            condition.withLock {
                changeMessages.append(message)
                condition.broadcast()
            }
        case "rev", "norev":
            let key = "\(message["id"] ?? "") \(message["rev"] ?? "")"
            condition.withLock {
                revMessages[key] = message
                condition.broadcast()
            }
            // Acknowledged as it arrives, not once written: a server keeps a window of revisions
            // unanswered (sofa serve 32, Sync Gateway its own) and would wait for this side, which
            // waits for the whole batch. What makes the pull safe is the checkpoint, saved only
            // after the batch is written.
            await connection.reply(to: message)
        case "getAttachment":
            do {
                let reader = try openLocalBody(digest: message["digest"] ?? "")
                await connection.reply(to: message, source: { maximum in try reader.read(maximum) })
            } catch {
                await connection.replyError(to: message, BLIPError(code: 404, message: "\(error)"))
            }
        case "proveAttachment":
            do {
                let reader = try openLocalBody(digest: message["digest"] ?? "")
                await connection.reply(to: message, body: Array(try reader.proof(nonce: message.body).utf8))
            } catch {
                await connection.replyError(to: message, BLIPError(code: 404, message: "\(error)"))
            }
        default:
            await connection.replyError(to: message, BLIPError(domain: "BLIP", code: 404, message: "no handler for \(message.profile ?? "?")"))
        }
    }

    private func openLocalBody(digest: String) throws -> BlobChunks {
        guard let body = try local.openBody(digest: digest) else { throw SofaError.invalidArgument("no body with digest \(digest) is here") }
        return body
    }


    /// Waits until `ready` finds something (under the lock), the connection ends, or the server
    /// is silent too long; with `stopped`, for as long as it takes, until it says so.
    private func wait<T>(for what: String, stopped: (() -> Bool)? = nil, _ ready: () -> T?) throws -> T {
        condition.lock()
        defer { condition.unlock() }
        var deadline = Date().addingTimeInterval(BLIPPeer.silence)
        var seen = changeMessages.count + revMessages.count
        while true {
            if let found = ready() { return found }
            if let closed { throw ReplicationError.network("\(closed) while waiting for \(what)") }
            if let stopped {
                if stopped() { throw ReplicationError.cancelled }
                _ = condition.wait(until: Date().addingTimeInterval(0.5))
                continue
            }
            if !condition.wait(until: deadline) {
                let now = changeMessages.count + revMessages.count
                guard now != seen else {
                    throw ReplicationError.network("\(remote) sent nothing for \(Int(BLIPPeer.silence)) s while this side waited for \(what)")
                }
                seen = now
                deadline = Date().addingTimeInterval(BLIPPeer.silence)
            }
        }
    }

    // MARK: - As a source (pull)

    func changes(since: JSONValue, limit: Int, filter: ReplicationFilter) throws -> ChangeBatch {
        guard filter.selector == nil, filter.function == nil else {
            throw SofaError.invalidArgument("a Couchbase Lite endpoint takes no Mango or JavaScript filter; --doc-ids and --channels work")
        }
        if let left = condition.withLock({ () -> BLIPMessage? in defer { unanswered = nil }; return unanswered }) {
            // Nothing of it was wanted (the target has it all).
            let blip = self.blip
            _ = try BLIPPeer.waitFor { await blip.reply(to: left, body: Array("[]".utf8)) }
        }
        if !subscribed {
            var properties: [(String, String)] = [("batch", String(limit))]
            if since != 0 && since != .string("0") { properties.append(("since", since.jsonString())) }
            if let channels = filter.channels {
                properties += [("filter", "sync_gateway/bychannel"), ("channels", channels.joined(separator: ","))]
            }
            let body: [UInt8] = filter.docIDs.map { JSONValue.object(["docIDs": .array($0.map { .string($0) })]).serialized() } ?? []
            _ = try request("subChanges", properties, body: body)
            subscribed = true
        }
        let message = try wait(for: "the server's changes") { changeMessages.isEmpty ? nil : changeMessages.removeFirst() }
        let items = (try? JSONParser.parse(message.body))?.arrayValue ?? []
        guard !items.isEmpty else {
            // Caught up.
            let blip = self.blip
            _ = try BLIPPeer.waitFor { await blip.reply(to: message, body: Array("[]".utf8)) }
            return ChangeBatch(changes: [], lastSequence: since, isLast: true)
        }
        var changes: [PeerChange] = []
        for item in items {
            guard let fields = item.arrayValue, fields.count >= 3, let id = fields[1].stringValue,
                  let rev = fields[2].stringValue.flatMap(RevisionID.init) else {
                throw ReplicationError.protocolError("a changes entry is not [sequence, id, rev]: \(item.jsonString())")
            }
            changes.append(PeerChange(sequence: fields[0], docID: id, revs: [rev]))
        }
        condition.withLock { unanswered = message }
        return ChangeBatch(changes: changes, lastSequence: changes.last?.sequence ?? since, isLast: false)
    }

    /// Returns once the server has a change after `since`: a continuous subscription whose first
    /// `changes` message with something in it ends the wait (the pass that follows reads it all).
    /// Throws `.cancelled` once `stopped` says so.
    func waitForChange(since: JSONValue, stopped: @escaping () -> Bool) throws {
        var properties: [(String, String)] = [("batch", "1"), ("continuous", "true")]
        if since != 0 && since != .string("0") { properties.append(("since", since.jsonString())) }
        _ = try request("subChanges", properties)
        while true {
            let message = try wait(for: "a change on the server", stopped: stopped) {
                changeMessages.isEmpty ? nil : changeMessages.removeFirst()
            }
            let blip = self.blip
            let empty = (try? JSONParser.parse(message.body))?.arrayValue?.isEmpty ?? true
            _ = try BLIPPeer.waitFor { await blip.reply(to: message, body: Array("[]".utf8)) }
            if !empty { return }
        }
    }

    func revisions(_ wanted: [(id: String, rev: RevisionID)], bodies: BodyRequest?) throws
        -> [Result<ReplicatedRevision, DocumentFailure>] {
        guard let message = condition.withLock({ () -> BLIPMessage? in defer { unanswered = nil }; return unanswered }) else {
            throw ReplicationError.protocolError("revisions asked of \(remote) outside a changes message")
        }
        let items = (try? JSONParser.parse(message.body))?.arrayValue ?? []
        let wantedKeys = Set(wanted.map { "\($0.id) \($0.rev)" })
        // For each entry: [] wanted (the whole history, please), 0 not.
        let answer: [JSONValue] = items.map { item in
            let key = "\(item[1]?.stringValue ?? "") \(item[2]?.stringValue ?? "")"
            return wantedKeys.contains(key) ? .array([]) : .integer(0)
        }
        let blip = self.blip
        _ = try BLIPPeer.waitFor { await blip.reply(to: message, body: JSONValue.array(answer).serialized()) }
        var results: [Result<ReplicatedRevision, DocumentFailure>] = []
        for (id, rev) in wanted {
            let key = "\(id) \(rev)"
            let revMessage = try wait(for: "revision \(rev) of \(id)") { revMessages.removeValue(forKey: key) }
            if revMessage.profile == "norev" {
                results.append(.failure(DocumentFailure(docID: id, rev: rev.description, error: revMessage["error"] ?? "not_found",
                                                        reason: revMessage["reason"] ?? "the server no longer has it")))
                continue
            }
            do {
                results.append(.success(try BLIPPeer.revision(from: revMessage)))
            } catch {
                results.append(.failure(DocumentFailure(docID: id, rev: rev.description, error: "bad_request", reason: "\(error)")))
            }
        }
        return results
    }

    /// A `rev` message as a revision with its history; its attachments' bodies stay on the server.
    static func revision(from message: BLIPMessage) throws -> ReplicatedRevision {
        let read = try RevMessage(body: message.body, property: { message[$0] })
        let attachments = try read.attachments.map { named in
            guard let length = named.length else {
                throw ReplicationError.protocolError("attachment \(named.name) of \(read.docID) has no length")
            }
            return Attachment(name: named.name, contentType: named.contentType, length: length, digest: named.digest, blobKey: nil,
                              revpos: named.revpos)
        }
        return ReplicatedRevision(docID: read.docID, revID: read.revID, ancestors: read.history, deleted: read.deleted,
                                  properties: read.properties, attachments: attachments)
    }

    func fetchBody(of attachment: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String) {
        guard let key = BlobKey(digestString: attachment.digest) else {
            throw SofaError.invalidArgument("\(docID)/\(attachment.name): the digest \(attachment.digest) is not SHA-1")
        }
        let writer = try blobs.makeWriter()
        let sink = WriterSink(writer)
        do {
            _ = try request("getAttachment", [("digest", attachment.digest), ("docID", docID)], sink: sink)
            return (try writer.finish(expecting: key), attachment.digest)
        } catch {
            writer.cancel()
            throw error
        }
    }

    /// A body's bytes as they arrive, handed to `received` (on the connection's actor: it must not wait on this peer).
    func getAttachment(digest: String, docID: String, _ received: @escaping @Sendable ([UInt8]) throws -> Void) throws {
        _ = try request("getAttachment", [("digest", digest), ("docID", docID)], sink: ClosureSink(received))
    }

    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader {
        throw SofaError.invalidArgument("bodies are read from a Couchbase Lite endpoint only into a local database")
    }

    // MARK: - As a target (push)

    /// Blobs are asked for one by one with `getAttachment` (a `rev` message carries none).
    func bodyRequest(for missing: [(id: String, missing: MissingRevisions)]) -> BodyRequest? { nil }

    func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        // What a Couchbase Lite client proposes: each revision with the one it follows (its
        // parent here, which the server has when this side synced it last).
        var entries: [(id: String, rev: RevisionID, parent: RevisionID?)] = []
        for (id, leaves) in revs {
            let tree = try local.revisionTree(of: id)
            for rev in leaves { entries.append((id, rev, tree.history(of: rev).dropFirst().first)) }
        }
        let body = JSONValue.array(entries.map { entry in
            var item: [JSONValue] = [.string(entry.id), .string(entry.rev.description)]
            if let parent = entry.parent { item.append(.string(parent.description)) }
            return .array(item)
        }).serialized()
        let reply = try request("proposeChanges", [("conflictIncludesRev", "true")], body: body)
        let statuses = (try? JSONParser.parse(reply.body))?.arrayValue ?? []
        var missing: [String: [RevisionID]] = [:]
        var order: [String] = []
        for (index, entry) in entries.enumerated() {
            let status = index < statuses.count ? (statuses[index].int64Value ?? statuses[index]["status"]?.int64Value ?? 0) : 0
            switch status {
            case 0:
                if missing[entry.id] == nil { order.append(entry.id) }
                missing[entry.id, default: []].append(entry.rev)
            case 304:
                continue  // the server has it
            default:
                // 409: the server's current revision is not this one's parent: pull, resolve, push
                // again. Listed as missing all the same, so that `write` names it as a failure (which
                // holds the checkpoint before it) instead of it passing unseen.
                if missing[entry.id] == nil { order.append(entry.id) }
                missing[entry.id, default: []].append(entry.rev)
                refused["\(entry.id) \(entry.rev)"] = DocumentFailure(docID: entry.id, rev: entry.rev.description,
                                                 error: status == 409 ? "conflict" : "refused",
                                                 reason: status == 409
                                                    ? "the server has \(statuses[index]["rev"]?.stringValue ?? "another revision"): pull, resolve the conflict, push again"
                                                    : "the server answered \(status)")
            }
        }
        return order.map { ($0, MissingRevisions(missing: missing[$0]!, possibleAncestors: [])) }
    }

    /// Revisions `proposeChanges` refused, by "docID rev": `write` reports them instead of sending them.
    private var refused: [String: DocumentFailure] = [:]

    func write(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions], from source: ReplicationPeer,
               result: inout ReplicationResult) throws -> [DocumentFailure] {
        var failures: [DocumentFailure] = []
        let sendable = revisions.filter { revision in
            guard let failure = refused.removeValue(forKey: "\(revision.docID) \(revision.revID)") else { return true }
            failures.append(failure)
            return false
        }
        let blip = self.blip
        let messages: [(ReplicatedRevision, [(String, String)], [UInt8])] = sendable.map { revision in
            var body = revision.properties
            if !revision.attachments.isEmpty {
                var attachments = JSONObject()
                for attachment in revision.attachments {
                    attachments[attachment.name] = .object(CouchFormat.stub(attachment, bySHA1: true))
                }
                body["_attachments"] = .object(attachments)
            }
            var properties = [("id", revision.docID), ("rev", revision.revID.description), ("noconflicts", "true")]
            if revision.deleted { properties.append(("deleted", "1")) }
            if !revision.ancestors.isEmpty { properties.append(("history", revision.ancestors.map(\.description).joined(separator: ","))) }
            return (revision, properties, JSONValue.object(body).serialized())
        }
        let outcomes = try BLIPPeer.waitFor { () -> [DocumentFailure?] in
            try await withThrowingTaskGroup(of: (Int, DocumentFailure?).self) { group in
                var outcomes = [DocumentFailure?](repeating: nil, count: messages.count)
                var next = 0
                func start(_ index: Int) {
                    let (revision, properties, body) = messages[index]
                    group.addTask {
                        do {
                            _ = try await blip.request("rev", properties: properties, body: body)
                            return (index, nil)
                        } catch let error as BLIPError {
                            let name = error.code == 409 ? "conflict" : error.code == 403 ? "forbidden" : "refused"
                            return (index, DocumentFailure(docID: revision.docID, rev: revision.revID.description, error: name,
                                                           reason: error.message))
                        }
                    }
                }
                while next < messages.count && next < 32 { start(next); next += 1 }
                while let (index, failure) = try await group.next() {
                    outcomes[index] = failure
                    if next < messages.count { start(next); next += 1 }
                }
                return outcomes
            }
        }
        for (index, failure) in outcomes.enumerated() {
            if let failure { failures.append(failure) } else if index < messages.count { result.docsWritten += 1 }
        }
        return failures
    }

    // MARK: - Checkpoints

    func checkpoint(_ id: String) throws -> JSONObject? {
        do {
            let reply = try request("getCheckpoint", [("client", id)])
            checkpointRevs[id] = reply["rev"]
            return try JSONParser.parse(reply.body).objectValue
        } catch ReplicationError.http(status: 404, _, _, _) {
            checkpointRevs[id] = nil
            return nil
        }
    }

    func saveCheckpoint(_ id: String, _ body: JSONObject) throws {
        var properties = [("client", id)]
        if let rev = checkpointRevs[id] { properties.append(("rev", rev)) }
        let reply = try request("setCheckpoint", properties, body: JSONValue.object(body).serialized())
        checkpointRevs[id] = reply["rev"]
    }
}

/// Lets the connection's handler, made before the peer, reach it.
private final class PeerBox: @unchecked Sendable {
    // Sendable invariant: `reference` is only touched under `lock`.
    private let lock = NSLock()
    private weak var reference: BLIPPeer?

    var peer: BLIPPeer? {
        get { lock.withLock { reference } }
        set { lock.withLock { reference = newValue } }
    }
}

/// A body arriving in a reply, into the blob store.
private final class WriterSink: BLIPBodySink, @unchecked Sendable {
    // Sendable invariant: written by the connection's actor, finished after the reply.
    private let writer: BlobWriter

    init(_ writer: BlobWriter) { self.writer = writer }

    func write(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try writer.write($0) } }
}

/// A body arriving in a reply, handed over chunk by chunk.
private final class ClosureSink: BLIPBodySink, @unchecked Sendable {
    // Sendable invariant: called by the connection's actor only.
    private let received: @Sendable ([UInt8]) throws -> Void

    init(_ received: @escaping @Sendable ([UInt8]) throws -> Void) { self.received = received }

    func write(_ bytes: [UInt8]) throws { try received(bytes) }
}
