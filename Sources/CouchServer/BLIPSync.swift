import BLIP
import BLIPReplication
import DocumentModel
import DocumentStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOWebSocket

/// Couchbase Lite's replication, as Sync Gateway serves it: a WebSocket at `/{db}/_blipsync`
/// carrying BLIP, over which a Couchbase Lite 2.x/3.x replicator pushes and pulls. The protocol
/// is `BLIPReplicator`'s passive role; this file only admits the connection and hands it over.
extension CouchServer {
    /// The headers of a WebSocket upgrade to BLIP, or nil to let the request go on as HTTP
    /// (where `_blipsync` answers why: no credentials, no such database, no subprotocol).
    func blipUpgradeHeaders(_ channel: Channel, _ head: HTTPRequestHead) -> EventLoopFuture<HTTPHeaders?> {
        guard head.method == .GET, let target = try? RequestTarget(head.uri), target.segments.count == 2,
              target.segments[1] == "_blipsync" else { return channel.eventLoop.makeSucceededFuture(nil) }
        let offered = head.headers["Sec-WebSocket-Protocol"].flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        guard let chosen = BLIPTuning.subprotocols.first(where: offered.contains) else { return channel.eventLoop.makeSucceededFuture(nil) }
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
    func serveBLIP(_ connection: WebSocketChannel, head: HTTPRequestHead) async {
        let channel = connection.channel
        let name = (try? RequestTarget(head.uri).segments.first) ?? ""
        let peer = channel.remoteAddress.map { "\($0)" } ?? "?"
        let user: UserContext
        let db: Database
        do {
            // Checked again: the upgrade's check ran before the switch, credentials may have gone since.
            (user, db) = try await blipAccess(head, name: name)
        } catch {
            log.info("Couchbase Lite replicator of \(name) from \(peer) refused: \(error)")
            try? await connection.channel.close()
            return
        }
        let passive = BLIPReplicator.Passive(readOnly: configuration.readOnly,
                                             bodySource: registry.bodySource(for: db, make: configuration.bodySource))
        let engine = BLIPReplicator(database: db, role: .passive(passive), pool: ServerWork(server: self, user: user), name: name,
                                    log: log, replyError: { error in
                                        if let error = error as? BLIPError { return error }
                                        let failure = HTTPError.from(error)
                                        return BLIPError(domain: "HTTP", code: Int(failure.status.code), message: failure.reason)
                                    })
        let id = ObjectIdentifier(channel)
        guard registerSync(engine.connection, id) else {
            await engine.connection.close("the server is stopping")
            _ = await WebSocketPump.run(connection, engine.connection, side: .server)
            return
        }
        defer { unregisterSync(id) }
        log.info("Couchbase Lite replicator connected to \(name) from \(peer) as \(user.name ?? "admin")")
        let reason = await WebSocketPump.run(connection, engine.connection, side: .server)
        await engine.close(reason)
        log.info("Couchbase Lite replicator of \(name) from \(peer) done: \(reason)")
    }
}

/// The server's blocking pool, with the saves made as the connection's user (what
/// `validate_doc_update` sees).
private struct ServerWork: BlockingPool {
    let server: CouchServer
    let user: UserContext

    func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await CouchServer.$user.withValue(user) { try await server.blocking(work) }
    }
}
