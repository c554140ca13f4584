import BLIP
import DocumentModel
import DocumentStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOWebSocket

/// Couchbase Lite's replication, as Sync Gateway serves it: a WebSocket at `/{db}/_blipsync`
/// carrying BLIP, over which a Couchbase Lite 2.x/3.x replicator pushes and pulls.
enum BLIPSync {
    /// The subprotocols accepted, preferred first (Sync Gateway's: Couchbase Lite 3 offers both).
    static let protocols = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"]
    /// The largest WebSocket message taken: a BLIP frame is 16 KiB of data and a few bytes.
    static let maximumFrameSize = 1 << 20
    /// `changes` messages sent and not yet answered, at most.
    static let changesInFlight = 4
    /// `rev` messages sent and not yet answered, at most.
    static let revsInFlight = 32
    /// Changes per `changes` message when the client does not say (`batch`).
    static let defaultBatch = 200
    /// Where a client's checkpoints are kept (`_local/checkpoint/CLIENT`, Sync Gateway's name).
    static func checkpointID(_ client: String) -> String { "_local/checkpoint/\(client)" }
}

extension CouchServer {
    /// The headers of a WebSocket upgrade to BLIP, or nil to let the request go on as HTTP
    /// (where `_blipsync` answers why: no credentials, no such database, no subprotocol).
    func blipUpgradeHeaders(_ channel: Channel, _ head: HTTPRequestHead) -> EventLoopFuture<HTTPHeaders?> {
        guard head.method == .GET, let target = try? RequestTarget(head.uri), target.segments.count == 2,
              target.segments[1] == "_blipsync" else { return channel.eventLoop.makeSucceededFuture(nil) }
        let offered = head.headers["Sec-WebSocket-Protocol"].flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        guard let chosen = BLIPSync.protocols.first(where: offered.contains) else { return channel.eventLoop.makeSucceededFuture(nil) }
        let promise = channel.eventLoop.makePromise(of: HTTPHeaders?.self)
        promise.completeWithTask {
            guard (try? await self.blipAccess(head, name: target.segments[0])) != nil else { return nil }
            // Busy before its 101 goes out: a stop from then on tells it why rather than closing
            // it as an idle connection (and a sync connection is never shed as idle).
            _ = self.setBusy(channel, true)
            return HTTPHeaders([("Sec-WebSocket-Protocol", chosen)])
        }
        return promise.futureResult
    }

    /// The user and the database of a `_blipsync` request: its credentials are right and the
    /// user is one of the database's members.
    func blipAccess(_ head: HTTPRequestHead, name: String) async throws -> (UserContext, Database) {
        let user = try await userContext(headers: head.headers)
        let db = try await database(name)
        try CouchServer.$user.withValue(user) { try requireMember(db) }
        return (user, db)
    }

    /// Serves one Couchbase Lite replicator over an upgraded connection until either side closes.
    func serveBLIP(_ connection: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, head: HTTPRequestHead) async {
        let channel = connection.channel
        // (Busy since its upgrade: a sync connection is never shed as idle.)
        let name = (try? RequestTarget(head.uri).segments.first) ?? ""
        let peer = channel.remoteAddress.map { "\($0)" } ?? "?"
        do {
            try await connection.executeThenClose { inbound, outbound in
                // Checked again: the upgrade's check ran before the switch, credentials may have gone since.
                let (user, db) = try await blipAccess(head, name: name)
                let session = BLIPSyncSession(server: self, database: db, name: name, user: user, log: log)
                let blip = BLIPConnection { connection, message in await session.handle(message, on: connection) }
                let id = ObjectIdentifier(channel)
                guard registerSync(blip, id) else {
                    try? await outbound.write(Self.closeFrame(.goingAway, "the server is stopping"))
                    return
                }
                defer { unregisterSync(id) }
                log.info("Couchbase Lite replicator connected to \(name) from \(peer) as \(user.name ?? "admin")")
                let reason: String = try await withThrowingTaskGroup(of: String.self) { group in
                    group.addTask {
                        while let frame = await blip.nextFrame() {
                            try await outbound.write(WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer(bytes: frame)))
                        }
                        return Self.closedHere
                    }
                    group.addTask {
                        for try await frame in inbound {
                            switch frame.opcode {
                            case .binary:
                                do {
                                    try await blip.receive(Array(buffer: frame.unmaskedData))
                                } catch {
                                    return "\(error)"  // the close frame says why, below
                                }
                            case .ping:
                                try await outbound.write(WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData))
                            case .connectionClose:
                                var data = frame.unmaskedData
                                let code = data.readInteger(as: UInt16.self)
                                try? await outbound.write(WebSocketFrame(fin: true, opcode: .connectionClose,
                                                                         data: ByteBuffer(integer: code ?? 1000)))
                                return "the client closed the connection (\(code.map(String.init) ?? "no code"))"
                            case .text:
                                try? await outbound.write(Self.closeFrame(.unacceptableData, "BLIP takes binary messages only"))
                                return "the client sent a text message: BLIP takes binary messages only"
                            default:
                                continue
                            }
                        }
                        return "the connection ended"
                    }
                    let first = try await group.next() ?? "the connection ended"
                    if let failure = await blip.protocolFailure {
                        try? await outbound.write(Self.closeFrame(.protocolError, failure))
                    } else if first == Self.closedHere {
                        // This side ended it (the server stopping, a pull that failed): the client is told why.
                        try? await outbound.write(Self.closeFrame(.goingAway, await blip.closeReason ?? "closed"))
                    }
                    await blip.close(first)
                    session.stop()
                    group.cancelAll()
                    return first
                }
                log.info("Couchbase Lite replicator of \(name) from \(peer) done: \(reason)")
            }
        } catch {
            log.info("Couchbase Lite replicator of \(name) from \(peer) ended: \(error)")
        }
    }

    private static let closedHere = "closed by this side"

    private static func closeFrame(_ code: WebSocketErrorCode, _ reason: String) -> WebSocketFrame {
        var data = ByteBuffer()
        data.write(webSocketErrorCode: code)
        data.writeString(String(reason.prefix(120)))
        return WebSocketFrame(fin: true, opcode: .connectionClose, data: data)
    }
}

/// What the server does for one connected Couchbase Lite replicator: its checkpoints, the
/// changes it pushes (`changes`/`proposeChanges`, `rev`, the bodies it is asked for), and the
/// changes it pulls (`subChanges`, then `changes` and `rev` from here).
final class BLIPSyncSession: @unchecked Sendable {
    // Sendable invariant: `lock` guards `pulls`; the rest is immutable.
    let server: CouchServer
    let db: Database
    let name: String
    let user: UserContext
    let log: Logger
    private let lock = NSLock()
    private var pulls: [Task<Void, Never>] = []

    init(server: CouchServer, database: Database, name: String, user: UserContext, log: Logger) {
        self.server = server
        self.db = database
        self.name = name
        self.user = user
        self.log = log
    }

    /// Ends the pulls in progress (the connection is gone).
    func stop() {
        lock.withLock { pulls }.forEach { $0.cancel() }
    }

    func handle(_ request: BLIPMessage, on connection: BLIPConnection) async {
        log.debug("\(name) BLIP #\(request.number) \(request.properties.map { "\($0.0)=\($0.1)" }.joined(separator: " ")) \(request.body.count)B")
        do {
            try await CouchServer.$user.withValue(user) {
                switch request.profile {
                case "getCheckpoint": try await getCheckpoint(request, connection)
                case "setCheckpoint": try await setCheckpoint(request, connection)
                case "changes": try await changes(request, connection)
                case "proposeChanges": try await proposeChanges(request, connection)
                case "rev": try await revision(request, connection)
                case "subChanges": try await subscribe(request, connection)
                case "getAttachment": try await getAttachment(request, connection)
                case "proveAttachment": try await proveAttachment(request, connection)
                default:
                    throw BLIPError(domain: "BLIP", code: 404, message: "no handler for message \(request.profile ?? "without a Profile")")
                }
            }
        } catch {
            let failure = BLIPSyncSession.blipError(error)
            if failure.code >= 500 { log.error("\(name): \(request.profile ?? "?") failed: \(failure)") }
            await connection.replyError(to: request, failure)
        }
    }

    static func blipError(_ error: any Error) -> BLIPError {
        if let error = error as? BLIPError { return error }
        if let error = error as? BLIPProtocolError { return BLIPError(domain: "BLIP", code: 503, message: "\(error)") }
        let failure = HTTPError.from(error)
        return BLIPError(domain: "HTTP", code: Int(failure.status.code), message: failure.reason)
    }

    private func blocking<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await server.blocking(work)
    }

    private func required(_ request: BLIPMessage, _ property: String) throws -> String {
        guard let value = request[property], !value.isEmpty else { throw BLIPError.badRequest("missing property \(property)") }
        return value
    }

    private func jsonBody(_ request: BLIPMessage) throws -> JSONValue {
        do { return try JSONParser.parse(request.body) } catch { throw BLIPError.badRequest("the body is not JSON: \(error)") }
    }

    private func requireWritable() throws {
        if server.configuration.readOnly { throw HTTPError.readOnly }
    }

    // MARK: - Checkpoints

    private func getCheckpoint(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        let id = BLIPSync.checkpointID(try required(request, "client"))
        guard let (rev, body) = try await blocking({ try self.db.localDocument(withID: id) }) else {
            throw BLIPError.notFound("missing")
        }
        await connection.reply(to: request, properties: [("rev", rev)], body: JSONValue.object(body).serialized())
    }

    private func setCheckpoint(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        try requireWritable()
        let id = BLIPSync.checkpointID(try required(request, "client"))
        guard let body = try jsonBody(request).objectValue else { throw BLIPError.badRequest("a checkpoint is a JSON object") }
        let rev = request["rev"].flatMap { $0.isEmpty ? nil : $0 }
        let saved = try await blocking { () -> String in
            do { return try self.db.replaceLocalDocument(id, body: body, ifRevisionIs: rev) } catch SofaError.conflict {
                throw BLIPError(code: 409, message: "the checkpoint has changed since revision \(rev ?? "(none)")")
            }
        }
        await connection.reply(to: request, properties: [("rev", saved)])
    }

    // MARK: - Push: the client's changes and revisions

    /// `changes`: `[[sequence, docID, revID, deleted?, size?], …]`; the answer names, for each,
    /// the revisions here it may follow (it is wanted) or 0 (it is here).
    private func changes(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        guard let items = try jsonBody(request).arrayValue else { throw BLIPError.badRequest("changes: the body is not an array") }
        guard !items.isEmpty else { return await connection.reply(to: request, body: Array("[]".utf8)) }
        try requireWritable()
        let asked = try items.map { item -> (String, RevisionID) in
            guard let fields = item.arrayValue, fields.count >= 3, let id = fields[1].stringValue,
                  let rev = fields[2].stringValue.flatMap(RevisionID.init) else {
                throw BLIPError.badRequest("changes: malformed entry \(String(decoding: item.serialized(), as: UTF8.self))")
            }
            return (id, rev)
        }
        // `_revs_diff`'s answer, one entry at a time: the leaves here it may follow, or 0 (here).
        let answer = try await blocking { () -> [JSONValue] in
            try asked.map { id, rev in
                guard let missing = try self.db.revsDiff([(id, [rev])]).first?.missing else { return .integer(0) }
                return .array(missing.possibleAncestors.map { .string($0.description) })
            }
        }
        await connection.reply(to: request, body: JSONValue.array(answer).serialized())
    }

    /// `proposeChanges`: `[[docID, revID, serverRevID?], …]`, what Couchbase Lite 3 pushes with
    /// (it never pushes conflicts: an edit made on a revision that is no longer current here is
    /// refused, pulled, resolved by the app, and pushed again). The answer is a status for each:
    /// 0 send it, 304 it is here, 409 it would conflict (with `conflictIncludesRev`, as
    /// `{"status": 409, "rev": CURRENT}`).
    private func proposeChanges(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        guard let items = try jsonBody(request).arrayValue else { throw BLIPError.badRequest("proposeChanges: the body is not an array") }
        try requireWritable()
        let includeRev = request.flag("conflictIncludesRev")
        let answer = try await blocking { () -> [JSONValue] in
            try items.map { item in
                guard let fields = item.arrayValue, fields.count >= 2, let id = fields[0].stringValue,
                      let rev = fields[1].stringValue.flatMap(RevisionID.init) else { return .integer(400) }
                let known = fields.count > 2 ? fields[2].stringValue ?? "" : ""
                guard let tree = try self.db.revisionTreeIfAny(of: id) else { return .integer(0) }
                if tree.contains(rev) { return .integer(304) }
                guard let current = try self.db.currentRevision(of: id) else { return .integer(0) }
                if current.revID.description == known || (current.deleted && known.isEmpty) { return .integer(0) }
                return includeRev ? ["status": 409, "rev": .string(current.revID.description)] : .integer(409)
            }
        }
        // Trailing zeros may go: an empty answer sends everything.
        var trimmed = answer
        while trimmed.last == .integer(0) { trimmed.removeLast() }
        await connection.reply(to: request, body: JSONValue.array(trimmed).serialized())
    }

    /// `rev`: one revision with its history; the bodies of its attachments and blobs that are
    /// not here are asked of the client (`getAttachment`) before it is saved.
    private func revision(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        try requireWritable()
        let read: RevMessage
        do { read = try RevMessage(body: request.body, property: { request[$0] }) } catch { throw BLIPError.badRequest("\(error)") }
        let (id, rev, history, body) = (read.docID, read.revID, read.history, read.properties)

        // The bodies it names: each attachment's digest, and each blob's.
        var attachments: [Attachment] = []
        for named in read.attachments {
            let blob = try await bodyHere(digest: named.digest, docID: id, connection)
            attachments.append(Attachment(name: named.name, contentType: named.contentType, length: blob.length, digest: named.digest,
                                          blobKey: blob.key, revpos: named.revpos, contentAvailable: true))
        }
        let blobs = try Blobs.find(in: body, docID: id, lenient: true)
        for blob in blobs where !attachments.contains(where: { $0.blobKey == blob.key }) {
            _ = try await bodyHere(digest: blob.key.digestString, docID: id, connection)
        }
        let replicated = ReplicatedRevision(docID: id, revID: rev, ancestors: history, deleted: read.deleted,
                                            properties: body, attachments: attachments)
        let noConflicts = request.flag("noconflicts")
        let ancestors = history
        try await blocking {
            try self.db.inBatch { batch in
                // Asked not to make a conflict: it must follow the current revision (or start a
                // document that is not here, or is deleted).
                if noConflicts, let current = try self.db.currentRevision(of: id), !current.deleted,
                   !ancestors.contains(current.revID), current.revID != rev {
                    throw BLIPError(code: 409, message: "\(id): \(rev) does not follow the current revision \(current.revID)")
                }
                _ = try batch.insert(replicated)
            }
        }
        await connection.reply(to: request)
    }

    /// The body with `digest`: here already, or asked of the client and checked against it.
    private func bodyHere(digest: String, docID: String, _ connection: BLIPConnection) async throws -> StoredBlob {
        if let known = try await blocking({ try self.db.storedBody(digest: digest) }) { return known }
        if let key = BlobKey(digestString: digest), let length = db.blobs.size(of: key) { return StoredBlob(key: key, length: length) }
        guard let key = BlobKey(digestString: digest) else {
            throw BLIPError.badRequest("\(docID): the digest \(digest) is not a SHA-1 digest (sha1-…), which is what Couchbase Lite sends")
        }
        let sink = try BlobSink(db.blobs.makeWriter())
        do {
            _ = try await connection.request("getAttachment", properties: [("digest", digest), ("docID", docID)], sink: sink)
            return try sink.finish(expecting: key)
        } catch {
            sink.cancel()
            throw error
        }
    }

    // MARK: - Pull: changes and revisions to the client

    /// `subChanges`: starts sending this database's changes after `since`; with `continuous`,
    /// goes on as they happen until the connection ends.
    private func subscribe(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        if let filter = request["filter"] {
            throw BLIPError.badRequest("filter \(filter): Sofa has no Sync Gateway channels or filters; pull everything, or name documents (docIDs)")
        }
        var since: Int64 = 0
        if let text = request["since"], !text.isEmpty {
            let value = try? JSONParser.parse(Array(text.utf8))
            guard let sequence = value?.int64Value ?? value?.stringValue.flatMap({ Int64($0) }) ?? Int64(text) else {
                throw BLIPError.badRequest("since: \(text) is not a sequence of this database")
            }
            since = sequence
        }
        let docIDs = request.body.isEmpty ? nil
            : try jsonBody(request)["docIDs"]?.arrayValue.map { Set($0.compactMap(\.stringValue)) }
        let pull = Pull(since: since, continuous: request.flag("continuous"),
                        batch: max(1, Int(request["batch"] ?? "") ?? BLIPSync.defaultBatch),
                        activeOnly: request.flag("activeOnly"), docIDs: docIDs)
        await connection.reply(to: request)
        let user = self.user
        let task = Task {
            await CouchServer.$user.withValue(user) {
                do {
                    try await self.send(pull, on: connection)
                } catch is CancellationError {
                } catch {
                    self.log.warning("\(self.name): sending changes to a Couchbase Lite replicator stopped: \(error)")
                    await connection.close("sending changes failed: \(error)")
                }
            }
        }
        lock.withLock { pulls.append(task) }
    }

    private struct Pull: Sendable {
        var since: Int64
        let continuous: Bool
        let batch: Int
        let activeOnly: Bool
        let docIDs: Set<String>?
    }

    private func send(_ pull: Pull, on connection: BLIPConnection) async throws {
        var since = pull.since
        var caughtUp = false
        try await withThrowingTaskGroup(of: Void.self) { group in
            var inFlight = 0
            while !Task.isCancelled {
                let position = db.changeStream.current
                let from = since
                let page = try await blocking { try self.db.changes(since: from, limit: pull.batch) }
                let changes = page.filter { change in
                    (pull.docIDs?.contains(change.docID) ?? true) && !(pull.activeOnly && change.deleted)
                }
                if let last = page.last { since = last.sequence }
                if !changes.isEmpty {
                    if inFlight >= BLIPSync.changesInFlight {
                        try await group.next()
                        inFlight -= 1
                    }
                    inFlight += 1
                    group.addTask { try await self.offer(changes, on: connection) }
                }
                guard page.count < pull.batch else { continue }
                if !caughtUp {
                    // Everything there was is offered: an empty `changes` says so.
                    while inFlight > 0 {
                        try await group.next()
                        inFlight -= 1
                    }
                    _ = try await connection.request("changes", body: Array("[]".utf8))
                    caughtUp = true
                }
                guard pull.continuous else { break }
                _ = await db.changeStream.next(after: position, until: nil)
            }
            try await group.waitForAll()
        }
    }

    /// One `changes` message, then a `rev` for each revision the client wants.
    private func offer(_ changes: [Change], on connection: BLIPConnection) async throws {
        let items: [JSONValue] = changes.map { change in
            var item: [JSONValue] = [.integer(change.sequence), .string(change.docID), .string(change.revID.description)]
            if change.deleted { item.append(true) }
            return .array(item)
        }
        let reply = try await connection.request("changes", body: JSONValue.array(items).serialized())
        let answers = (try? JSONParser.parse(reply.body))?.arrayValue ?? []
        let maxHistory = Int(reply["maxHistory"] ?? "") ?? Int.max
        try await withThrowingTaskGroup(of: Void.self) { group in
            var inFlight = 0
            for (index, change) in changes.enumerated() where index < answers.count {
                guard let known = answers[index].arrayValue else { continue }  // 0 or null: not wanted
                if inFlight >= BLIPSync.revsInFlight {
                    try await group.next()
                    inFlight -= 1
                }
                inFlight += 1
                let knownRevs = Set(known.compactMap(\.stringValue))
                group.addTask { try await self.sendRevision(change, knownRevs: knownRevs, maxHistory: maxHistory, on: connection) }
            }
            try await group.waitForAll()
        }
    }

    private func sendRevision(_ change: Change, knownRevs: Set<String>, maxHistory: Int, on connection: BLIPConnection) async throws {
        let loaded = try await blocking { () -> (Revision, [RevisionID])? in
            do {
                let revision = try self.db.revision(change.revID, of: change.docID)
                let tree = try self.db.revisionTree(of: change.docID)
                return (revision, Array(tree.history(of: change.revID).dropFirst()))
            } catch SofaError.revisionNotFound, SofaError.documentNotFound {
                return nil  // replaced since the changes were read: the newer change is sent too
            }
        }
        guard let (revision, ancestors) = loaded else {
            // (No reply wanted, as the protocol says of `norev`.)
            await connection.send("norev", properties: [("id", change.docID), ("rev", change.revID.description),
                                                        ("sequence", String(change.sequence)), ("error", "404"),
                                                        ("reason", "the revision is no longer here")])
            return
        }
        // The history stops at the first revision the client has, or at its limit.
        var history: [String] = []
        for ancestor in ancestors.prefix(max(0, maxHistory - 1)) {
            history.append(ancestor.description)
            if knownRevs.contains(ancestor.description) { break }
        }
        var body = revision.properties
        if !revision.attachments.isEmpty {
            var attachments = JSONObject()
            for attachment in revision.attachments {
                attachments[attachment.name] = .object(CouchFormat.stub(attachment, bySHA1: true))
            }
            body["_attachments"] = .object(attachments)
        }
        var properties = [("id", change.docID), ("rev", change.revID.description), ("sequence", String(change.sequence))]
        if revision.deleted { properties.append(("deleted", "1")) }
        if !history.isEmpty { properties.append(("history", history.joined(separator: ","))) }
        do {
            _ = try await connection.request("rev", properties: properties, body: JSONValue.object(body).serialized())
        } catch let error as BLIPError {
            // The client refused this revision (its own validation, a conflict it keeps): the others go on.
            log.info("\(name): Couchbase Lite refused \(change.docID) \(change.revID): \(error)")
        }
    }

    /// `getAttachment`: the body with `digest`, streamed from the blob store.
    private func getAttachment(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        let digest = try required(request, "digest")
        let reader = try await openBody(digest: digest)
        await connection.reply(to: request, source: { maximum in try reader.read(maximum) })
    }

    /// `proveAttachment`: the SHA-1 of the nonce's length, the nonce and the body, as a digest,
    /// to show that this side has the body without sending it.
    private func proveAttachment(_ request: BLIPMessage, _ connection: BLIPConnection) async throws {
        let digest = try required(request, "digest")
        guard (16...255).contains(request.body.count) else { throw BLIPError.badRequest("proveAttachment: the nonce must have 16 to 255 bytes") }
        let reader = try await openBody(digest: digest)
        let proof = try await blocking { try reader.proof(nonce: request.body) }
        await connection.reply(to: request, body: Array(proof.utf8))
    }

    private func openBody(digest: String) async throws -> BlobChunks {
        try await blocking { () -> BlobChunks in
            guard let body = try self.db.openBody(digest: digest) else {
                throw BLIPError.notFound("no attachment body with digest \(digest) is here")
            }
            return body
        }
    }
}

/// A streamed reply's body into the blob store.
final class BlobSink: BLIPBodySink, @unchecked Sendable {
    // Sendable invariant: written by the connection's actor only, then finished by the one waiting for it.
    private let writer: BlobWriter

    init(_ writer: BlobWriter) { self.writer = writer }

    func write(_ bytes: [UInt8]) throws {
        try bytes.withUnsafeBytes { try writer.write($0) }
    }

    func finish(expecting key: BlobKey) throws -> StoredBlob {
        try writer.finish(expecting: key)
    }

    func cancel() { writer.cancel() }
}
