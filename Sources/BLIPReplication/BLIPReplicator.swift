import BLIP
import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Couchbase Lite's replication protocol (BLIP sync, version 3 of Sync Gateway's) over one BLIP
/// connection, for one Sofa database, in either role. As couchbase-lite-core runs one
/// `Replicator` for its client and its listener, one engine serves both here:
///
/// - **passive** (`sofa serve`'s `/{db}/_blipsync`): keeps the client's checkpoints
///   (`getCheckpoint`, `setCheckpoint`), sends this database's changes when the client
///   subscribes (`subChanges`), takes the revisions it pushes (`proposeChanges`/`changes`, `rev`);
/// - **active** (`sofa pull|push|sync ws[s]://`): subscribes to the server's changes and takes
///   its revisions (`pull`), proposes this database's changes and sends them (`push`).
///
/// Both roles send revisions with the same code (`+Sending`: `changes`/`proposeChanges`, then a
/// `rev` for each revision wanted, at most `BLIPTuning.revsInFlight` unanswered), take them with
/// the same code (`+Receiving`: the revisions wanted, their bodies asked for with
/// `getAttachment`, saves batched by `Inserter`), and answer for bodies the same way
/// (`+Bodies`). A message that cannot be read is a `BLIPSyncError.protocolViolation`: answered
/// with an error, and the connection ends with its reason; it never reads as "nothing".
///
/// Storage work runs on the `BlockingPool` the owner gives (the server's, or a pool of the
/// client's own), never on the concurrency runtime's few threads.
public final class BLIPReplicator: Sendable {
    public enum Role: Sendable {
        case passive(Passive)
        case active(Active)
    }

    /// What a server's side needs to know.
    public struct Passive: Sendable {
        /// Pushes are refused (`sofa serve --read-only`).
        public var readOnly: Bool
        /// Fetches the bodies a pull from this database's own remote left there, so that a
        /// client pulling from here gets them (nil: this database has no remote).
        public var bodySource: (any BodySource)?

        public init(readOnly: Bool = false, bodySource: (any BodySource)? = nil) {
            self.readOnly = readOnly
            self.bodySource = bodySource
        }
    }

    /// What a client's side needs to know.
    public struct Active: Sendable {
        /// Which attachment bodies a pull fetches as it goes; the others stay on the server,
        /// fetched when read (`sofa pull --no-download-attachments`).
        public var fetchesBody: @Sendable (Attachment) -> Bool
        /// Only watches for a change on the server (a continuous sync between passes): the
        /// changes it is sent are noted and none is asked for.
        public var watchOnly: Bool

        public init(fetchesBody: @escaping @Sendable (Attachment) -> Bool = { _ in true }, watchOnly: Bool = false) {
            self.fetchesBody = fetchesBody
            self.watchOnly = watchOnly
        }
    }

    public let database: Database
    public let connection: BLIPConnection
    let role: Role
    let pool: any BlockingPool
    let log: Logger
    /// For log lines: the database's name on a server, the remote's URL on a client.
    let name: String
    /// Turns a storage or validation error into the error reply the other side gets.
    let replyError: @Sendable (any Error) -> BLIPError
    /// The parts that hold state, each behind its own lock or actor.
    let incoming: IncomingBodies
    let inserter: Inserter
    let pull: PullTracker
    let subscriptions = Locked<[Task<Void, Never>]>([])
    let bodyPermits = Permits(BLIPTuning.bodiesInFlight)

    public init(database: Database, role: Role, pool: any BlockingPool, name: String, log: Logger,
                replyError: (@Sendable (any Error) -> BLIPError)? = nil) {
        let box = HandlerBox()
        self.database = database
        self.connection = BLIPConnection(handler: { _, message in await box.engine?.handle(message) },
                                         arrival: { message in box.engine?.arrived(message) })
        self.role = role
        self.pool = pool
        self.name = name
        self.log = log
        self.replyError = replyError ?? BLIPReplicator.defaultReplyError
        self.incoming = IncomingBodies()
        self.inserter = Inserter(database: database, pool: pool)
        self.pull = PullTracker()
        box.engine = self
    }

    var isPassive: Bool { if case .passive = role { true } else { false } }

    /// Ends the replication: the connection closes (waiting requests fail), subscriptions stop,
    /// and bodies half-received are dropped from the blob store's temporary folder.
    public func close(_ reason: String) async {
        await connection.close(reason)
        subscriptions.withLock { $0 }.forEach { $0.cancel() }
        incoming.cancelAll()
        pull.fail(.closed(reason))
    }

    // MARK: - Dispatch

    func handle(_ message: BLIPMessage) async {
        let profile = message.profile ?? ""
        log.trace("\(name) BLIP #\(message.number) \(profile) \(message.properties.map { "\($0.0)=\($0.1)" }.joined(separator: " ")) \(message.body.count)B")
        do {
            switch (profile, role) {
            case ("getCheckpoint", .passive): try await getCheckpoint(message)
            case ("setCheckpoint", .passive(let passive)): try await setCheckpoint(message, readOnly: passive.readOnly)
            case ("subChanges", .passive(let passive)): try await subscribe(message, passive)
            case ("changes", _), ("proposeChanges", _): try await receiveChanges(message)
            case ("rev", _): try await receiveRevision(message)
            case ("norev", _): await receiveNoRevision(message)
            case ("getAttachment", _): try await sendBody(message)
            case ("proveAttachment", _): try await proveBody(message)
            default:
                throw BLIPError(domain: "BLIP", code: 404, message: "no handler for message \(profile.isEmpty ? "without a Profile" : profile)")
            }
        } catch let violation as BLIPSyncError {
            // Unreadable: said to the other side, then the replication stops with the reason.
            log.warning("\(name): \(violation)")
            await connection.replyError(to: message, BLIPError(domain: "BLIP", code: 400, message: "\(violation)"))
            await connection.fail("\(violation)")
            await close("\(violation)")
        } catch {
            let failure = replyError(error)
            if failure.code >= 500 { log.error("\(name): \(profile) failed: \(failure)") }
            await connection.replyError(to: message, failure)
        }
    }

    /// A client's default: HTTP's codes for the store's errors, as `sofa serve` answers them.
    static func defaultReplyError(_ error: any Error) -> BLIPError {
        switch error {
        case let error as BLIPError: error
        case let error as SofaError:
            switch error {
            case .documentNotFound, .revisionNotFound, .bodyNotAvailable: BLIPError(code: 404, message: "\(error)")
            case .conflict: BLIPError(code: 409, message: "\(error)")
            case .forbidden: BLIPError(code: 403, message: "\(error)")
            case .unauthorized: BLIPError(code: 401, message: "\(error)")
            case .diskFull, .readOnlyFileSystem, .io, .sqlite, .blobCorrupted: BLIPError(code: 500, message: "\(error)")
            default: BLIPError(code: 400, message: "\(error)")
            }
        default: BLIPError(code: 500, message: "\(error)")
        }
    }

    /// The JSON body of a message that must have one.
    static func json(_ message: BLIPMessage, _ what: String) throws(BLIPSyncError) -> JSONValue {
        do { return try JSONParser.parse(message.body) } catch {
            throw .protocolViolation("\(what): the body is not JSON (\(error))")
        }
    }

    static func required(_ message: BLIPMessage, _ property: String) throws -> String {
        guard let value = message[property], !value.isEmpty else {
            throw BLIPError(domain: "BLIP", code: 400, message: "\(message.profile ?? "?"): missing property \(property)")
        }
        return value
    }
}

/// Why a replication over BLIP ended or could not go on.
public enum BLIPSyncError: Error, Sendable, CustomStringConvertible {
    /// A message of the other side's could not be read as the protocol says.
    case protocolViolation(String)
    /// The connection ended (the reason it gave).
    case closed(String)
    /// The other side answered with an error (`Error-Code`, its message).
    case refused(BLIPError)
    /// Nothing came for `BLIPTuning.silence` seconds while this side waited.
    case silent(String)

    public var description: String {
        switch self {
        case .protocolViolation(let what): "protocol error: \(what)"
        case .closed(let why): "the connection ended: \(why)"
        case .refused(let error): "refused: \(error)"
        case .silent(let what): "the other side sent nothing for \(Int(BLIPTuning.silence)) s while this side waited for \(what)"
        }
    }
}

/// Runs storage work (SQLite, files) off the concurrency runtime's threads.
public protocol BlockingPool: Sendable {
    func run<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T
}

/// Lets the connection's handler, made before the engine, reach it.
private final class HandlerBox: @unchecked Sendable {
    // Sendable invariant: `reference` is only touched under `lock`.
    private let lock = NSLock()
    private weak var reference: BLIPReplicator?

    var engine: BLIPReplicator? {
        get { lock.withLock { reference } }
        set { lock.withLock { reference = newValue } }
    }
}
