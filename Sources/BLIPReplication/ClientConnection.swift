import BLIP
import DocumentModel
import DocumentStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket

/// Why a client could not connect: the network or TLS, or the server's HTTP answer to the upgrade.
public enum BLIPConnectFailure: Error, Sendable {
    case network(String)
    /// The server answered the upgrade with HTTP (401, 403, 404…), CouchDB's `error` and `reason`.
    case http(status: Int, error: String, reason: String)
    case invalidURL(String)
}

extension BLIPReplicator {
    /// Connects to a Couchbase Lite endpoint's `_blipsync` (`ws://host:port/db`: Sync Gateway,
    /// Capella App Services, `sofa serve`) and starts the engine on it as the active side. TLS
    /// (`wss://`) is verified against the system's CAs, or `caFile`'s. The connection's end
    /// closes the engine.
    public static func connect(url: String, user: String?, password: String?, caFile: String?, database: Database,
                               active: Active, pool: any BlockingPool, log: Logger) async throws -> BLIPReplicator {
        let channel = try await webSocket(url: url, user: user, password: password, caFile: caFile)
        let engine = BLIPReplicator(database: database, role: .active(active), pool: pool, name: url, log: log)
        let connection = engine.connection
        Task {
            let reason = await WebSocketPump.run(channel, connection, side: .client)
            await engine.close(reason)
        }
        return engine
    }

    private enum Upgrade: Sendable {
        case webSocket(WebSocketChannel)
        case refused(NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>)
    }

    private static func webSocket(url: String, user: String?, password: String?, caFile: String?) async throws
        -> WebSocketChannel {
        guard let components = URLComponents(string: url), let host = components.host,
              let port = components.port ?? (url.hasPrefix("wss://") ? 443 : 80) as Int? else {
            throw BLIPConnectFailure.invalidURL("\(url): no host")
        }
        let tls: NIOSSLContext?
        if url.hasPrefix("wss://") {
            var configuration = TLSConfiguration.makeClientConfiguration()
            if let caFile { configuration.trustRoots = .file(caFile) }
            do { tls = try NIOSSLContext(configuration: configuration) } catch {
                throw BLIPConnectFailure.network("\(url): TLS cannot start: \(error)")
            }
        } else {
            tls = nil
        }
        // SNI takes names only; an address is checked against the certificate's IP entries.
        let serverName = host.allSatisfy { $0.isNumber || $0 == "." || $0 == ":" } ? nil : host
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "\(host):\(port)")
        headers.add(name: "Content-Length", value: "0")
        headers.add(name: "Sec-WebSocket-Protocol", value: BLIPTuning.subprotocols[0])
        if let user {
            headers.add(name: "Authorization", value: "Basic " + Data("\(user):\(password ?? "")".utf8).base64EncodedString())
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
                        let upgrader = NIOTypedWebSocketClientUpgrader<Upgrade>(maxFrameSize: BLIPTuning.maximumFrameSize,
                                                                                upgradePipelineHandler: { channel, _ in
                            channel.eventLoop.makeCompletedFuture {
                                try channel.pipeline.syncOperations.addHandler(
                                    NIOWebSocketFrameAggregator(minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 1 << 16,
                                                                maxAccumulatedFrameSize: BLIPTuning.maximumFrameSize))
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
            throw BLIPConnectFailure.network("\(url): \(error)")
        }
        let outcome: Upgrade
        do {
            outcome = try await upgrade.valueUnderLock()
        } catch let error as NIOSSLError {
            let why = "\(error)".contains("CERTIFICATE_VERIFY_FAILED")
                ? "its certificate is not trusted here (give the CA that signed it with --cacert)" : "\(error)"
            throw BLIPConnectFailure.network("\(url): the TLS handshake failed: \(why)")
        } catch {
            throw BLIPConnectFailure.network("\(url): \(error)")
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
            throw BLIPConnectFailure.http(status: status, error: json?["error"]?.stringValue ?? "refused",
                                          reason: json?["reason"]?.stringValue ?? "the server does not serve Couchbase Lite's replication here")
        }
    }
}

/// A pool of threads of the client's own for storage work (the server gives its own).
public struct ThreadPoolWork: BlockingPool {
    let pool: NIOThreadPool

    public init(_ pool: NIOThreadPool = .singleton) { self.pool = pool }

    public func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await pool.runIfActive(work)
    }
}
