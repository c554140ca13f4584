import DocumentModel
import DocumentStore
import Foundation
import NIOHTTP1

/// A replication a client asks `sofa serve` for (`POST /_replicate`): between one of its
/// databases and a URL (another server, or this one).
public struct ReplicationRequest: Sendable {
    public enum Direction: String, Sendable { case pull, push }
    public let database: Database
    /// The served database's name.
    public let databaseName: String
    /// The other side, with credentials in its user part when it needs them.
    public let remote: String
    public let direction: Direction
    public let continuous: Bool
    public let createTarget: Bool
    public let docIDs: [String]?
    public let selector: JSONValue?
    /// A design document's filter function (`DDOC/NAME`) and its `query_params`.
    public let filter: String?
    public let queryParameters: [String: String]
}

/// A replication running for a client; `Configuration.replicator` starts them.
public protocol ReplicationJob: AnyObject, Sendable {
    /// Waits for a one-shot replication to end: `docs_read`, `docs_written`,
    /// `doc_write_failures` and `end_last_seq`, as CouchDB's history entries name them.
    func wait() throws -> JSONObject
    /// Stops it (a continuous one: after the pass it is in).
    func cancel()
    /// What it has done so far, for `/_active_tasks`: the same fields and `state`.
    var progress: JSONObject { get }
}

/// The continuous replications `POST /_replicate` started, by replication id.
final class ReplicationJobs: @unchecked Sendable {
    struct Entry {
        let job: any ReplicationJob
        let source: String
        let target: String
        let started: Date
        /// A replication a `_replicator` document describes: which one, at which revision.
        var docID: String? = nil
        var rev: RevisionID? = nil
    }
    // Sendable invariant: `entries` is guarded by `lock`.
    private let lock = NSLock()
    private var entries: [String: Entry] = [:]

    func add(_ id: String, _ entry: Entry) -> Bool {
        lock.withLock {
            guard entries[id] == nil else { return false }
            entries[id] = entry
            return true
        }
    }

    func remove(_ id: String) -> Entry? { lock.withLock { entries.removeValue(forKey: id) } }
    func entry(_ id: String) -> Entry? { lock.withLock { entries[id] } }
    var all: [(id: String, entry: Entry)] { lock.withLock { entries.map { ($0.key, $0.value) }.sorted { $0.id < $1.id } } }
}

extension CouchServer {
    /// `POST /_replicate`: `source` and `target` (names of databases served here, URLs, or
    /// `{"url": …}`), `continuous`, `cancel`, `create_target`, `doc_ids`, `selector`, `filter`
    /// with `query_params`. One side
    /// must be a database of this server; a one-shot answers when done, with CouchDB's history.
    func replicate(_ request: Request) async throws {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        guard let replicator = configuration.replicator else {
            throw HTTPError.notImplemented("/_replicate on this server (it was started without a replicator)")
        }
        guard case .object(let body) = try await request.body.json(limit: 1 << 20) else {
            throw HTTPError.badRequest("Request body must be a JSON object")
        }
        let source = try CouchServer.endpoint("source", body), target = try CouchServer.endpoint("target", body)
        let continuous = body["continuous"]?.boolValue ?? false
        let id = replicationID(source: source, target: target, continuous: continuous, body: body)
        if body["cancel"]?.boolValue == true {
            guard let running = replications.remove(id) else {
                throw HTTPError(.notFound, "not_found", "\(id) not found")
            }
            running.job.cancel()
            return try await request.response.sendJSON(.ok, ["ok": true, "_local_id": .string(id)])
        }
        let job = try await startReplication(body, requester: CouchServer.user, using: replicator)
        if continuous {
            if !replications.add(id, .init(job: job, source: redacted(source), target: redacted(target), started: Date())) {
                job.cancel()  // the same replication runs already: one is enough, as in CouchDB
            }
            return try await request.response.sendJSON(.accepted, ["ok": true, "_local_id": .string(id)])
        }
        let started = Date()
        let outcome = try await blocking { try job.wait() }
        let session = UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        var entry: JSONObject = ["session_id": .string(session), "start_time": .string(httpDate(started)),
                                 "end_time": .string(httpDate(Date())), "start_last_seq": 0, "missing_checked": 0, "missing_found": 0]
        for (key, value) in outcome { entry[key] = value }
        entry["recorded_seq"] = outcome["end_last_seq"] ?? 0
        try await request.response.sendJSON(.ok, ["ok": true, "session_id": .string(session), "source_last_seq": outcome["end_last_seq"] ?? 0,
                                                  "replication_id_version": 4, "history": [.object(entry)]])
    }

    /// `source` or `target` of a replication: a database name, a URL, or `{"url": …}` with
    /// credentials as CouchDB takes them (`"headers": {"Authorization": "Basic …"}` or
    /// `"auth": {"basic": {"username", "password"}}`), which are put in the URL.
    static func endpoint(_ key: String, _ body: JSONObject) throws -> String {
        switch body[key] {
        case .string(let text)?: return text
        case .object(let object)?:
            guard let url = object["url"]?.stringValue else { break }
            guard let (user, password) = credentials(object), var components = URLComponents(string: url), components.user == nil else {
                return url
            }
            components.user = user
            components.password = password
            return components.string ?? url
        default: break
        }
        throw HTTPError.badRequest("`\(key)` must be a database name, a URL or an object with a `url`")
    }

    /// The user and password an endpoint object carries, if any.
    private static func credentials(_ endpoint: JSONObject) -> (String, String)? {
        if let basic = endpoint["auth"]?["basic"], let user = basic["username"]?.stringValue {
            return (user, basic["password"]?.stringValue ?? "")
        }
        let headers = endpoint["headers"]?.objectValue.map { Array($0) } ?? []
        guard let authorization = headers.first(where: { $0.key.lowercased() == "authorization" })?.value.stringValue,
              authorization.lowercased().hasPrefix("basic "),
              let decoded = Data(base64Encoded: String(authorization.dropFirst(6)).trimmingCharacters(in: .whitespaces)),
              let text = String(data: decoded, encoding: .utf8), let colon = text.firstIndex(of: ":") else { return nil }
        return (String(text[..<colon]), String(text[text.index(after: colon)...]))
    }

    /// Starts the replication a `_replicate` body or a `_replicator` document describes: one
    /// side must be a database of this server.
    ///
    /// A side of this server is used directly, as the user its URL names (its password checked
    /// as a request's would be; no credentials: anonymous), or for a bare name as `requester`
    /// (`_replicate`'s user; nil for a `_replicator` job, whose writer was checked). A URL of
    /// this server on the other side goes over HTTP with its own credentials, never the
    /// server's. As CouchDB: wrong credentials are 500 `replication_auth_error`, a user who may
    /// not use the database 401.
    func startReplication(_ body: JSONObject, requester: UserContext? = nil,
                          using replicator: @Sendable (ReplicationRequest) throws -> any ReplicationJob) async throws -> any ReplicationJob {
        let source = try CouchServer.endpoint("source", body), target = try CouchServer.endpoint("target", body)
        let direction: ReplicationRequest.Direction
        let localName: String, remote: String, local: String
        if let name = localDatabaseName(source) {
            direction = .push
            (localName, local) = (name, source)
            if let targetName = localDatabaseName(target), !target.contains("://") {
                // A bare name: as the requester, who must be allowed there too.
                try await checkAccess(as: requester, to: targetName, through: target, creating: false)
                remote = selfURL(targetName)
            } else {
                remote = target
            }
        } else if let name = localDatabaseName(target) {
            direction = .pull
            (localName, local) = (name, target)
            remote = source
        } else {
            throw HTTPError.badRequest("Sofa replicates between one of the databases it serves and a URL; neither \(source) nor \(target) is served here")
        }
        let createTarget = body["create_target"]?.boolValue ?? false
        if direction == .pull, configuration.readOnly { throw HTTPError.readOnly }
        let creating = direction == .pull && createTarget && registry.path(of: localName) == nil
        try await checkAccess(as: requester, to: localName, through: local, creating: creating)
        if creating {
            _ = try await blocking { try self.registry.create(localName) }
        }
        let database = try await self.database(localName)
        let docIDs = body["doc_ids"]?.arrayValue?.compactMap(\.stringValue)
        let filter = body["filter"]?.stringValue
        if let filter, !filter.contains("/") { throw HTTPError.badRequest("`filter` must be of the form `designname/filtername`") }
        // query_params values are given to the function as strings, as in a URL.
        let parameters = (body["query_params"]?.objectValue).map { object in
            Dictionary(object.map { ($0.key, $0.value.stringValue ?? $0.value.jsonString()) }, uniquingKeysWith: { $1 })
        } ?? [:]
        return try replicator(ReplicationRequest(database: database, databaseName: localName, remote: remote, direction: direction,
                                                 continuous: body["continuous"]?.boolValue ?? false, createTarget: createTarget,
                                                 docIDs: docIDs, selector: body["selector"], filter: filter, queryParameters: parameters))
    }

    /// `GET /_active_tasks`: the continuous replications running, as CouchDB lists them.
    func activeTasks(_ request: Request) async throws {
        guard request.method == .GET || request.method == .HEAD else { throw HTTPError.methodNotAllowed }
        let tasks: [JSONValue] = replications.all.map { id, entry in
            var task: JSONObject = ["type": "replication", "replication_id": .string(id), "source": .string(entry.source),
                                    "target": .string(entry.target), "continuous": .bool(entry.docID == nil || entry.job.progress["state"] != "completed"),
                                    "started_on": .integer(Int64(entry.started.timeIntervalSince1970)),
                                    "updated_on": .integer(Int64(Date().timeIntervalSince1970)), "pid": .string("<sofa>")]
            for (key, value) in entry.job.progress { task[key] = value }
            return .object(task)
        }
        try await request.response.sendJSON(.ok, .array(tasks))
    }

    /// `GET /_scheduler/jobs`: the same replications, as the scheduler lists its jobs.
    func schedulerJobs(_ request: Request) async throws {
        guard request.method == .GET || request.method == .HEAD else { throw HTTPError.methodNotAllowed }
        let jobs: [JSONValue] = replications.all.map { id, entry in
            .object(["id": .string(id), "database": entry.docID == nil ? .null : .string(CouchServer.replicatorDatabase),
                     "doc_id": entry.docID.map(JSONValue.string) ?? .null, "source": .string(entry.source),
                     "target": .string(entry.target), "start_time": .string(iso8601(entry.started)),
                     "info": .object(entry.job.progress), "history": []])
        }
        try await request.response.sendJSON(.ok, ["total_rows": .integer(Int64(jobs.count)), "offset": 0, "jobs": .array(jobs)])
    }

    /// Refuses, as CouchDB does, a replication whose side `endpoint` (database `name` of this
    /// server) acts as a user who may not read and write it, or make it.
    private func checkAccess(as requester: UserContext?, to name: String, through endpoint: String, creating: Bool) async throws {
        guard requiresAuthentication else { return }
        let user: UserContext
        var shown = endpoint
        if endpoint.contains("://"), var url = URLComponents(string: endpoint) {
            if let given = url.user {
                let (name, password) = (given.removingPercentEncoding ?? given, url.password?.removingPercentEncoding ?? "")
                guard let known = try await authenticate(name: name, password: password) else {
                    throw HTTPError(.internalServerError, "replication_auth_error",
                                    "{session_request_unauthorized,\"http://127.0.0.1:\(boundPort ?? configuration.port)/_session\",\"\(name)\"}")
                }
                user = known
            } else {
                user = .anonymous
            }
            (url.user, url.password) = (nil, nil)
            shown = (url.string ?? endpoint) + (url.path.hasSuffix("/") ? "" : "/")
        } else {
            guard let requester else { return }
            user = requester
        }
        // Making a database is the server admin's; using one, its members'.
        var allowed = user.isServerAdmin
        if !allowed, !creating {
            let database = try await self.database(name)
            allowed = try await blocking { SecurityObject(try database.securityObject).isMember(user) }
        }
        guard allowed else { throw HTTPError(.unauthorized, "unauthorized", "unauthorized to access or create database \(shown)") }
    }

    /// The served database an endpoint names: a bare name, or a URL of this server.
    func localDatabaseName(_ endpoint: String) -> String? {
        guard endpoint.contains("://") else { return endpoint.removingPercentEncoding ?? endpoint }
        guard let url = URLComponents(string: endpoint), let host = url.host, ["127.0.0.1", "localhost", configuration.host].contains(host),
              url.port == boundPort else { return nil }
        let segments = url.percentEncodedPath.split(separator: "/").map { String($0).removingPercentEncoding ?? String($0) }
        return segments.count == 1 ? segments[0] : nil
    }

    /// A URL of this server for database `name`, with its credentials.
    private func selfURL(_ name: String) -> String {
        func encoded(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? text }
        let credentials = configuration.user.map { "\(encoded($0)):\(encoded(configuration.password ?? ""))@" } ?? ""
        return "http://\(credentials)127.0.0.1:\(boundPort ?? configuration.port)/" +
            (name.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? name)
    }

    /// A URL without its password, for listings.
    func redacted(_ endpoint: String) -> String {
        guard var url = URLComponents(string: endpoint), url.password != nil else { return endpoint }
        url.password = "*****"
        return url.string ?? endpoint
    }

    /// Names a replication as CouchDB's `_local_id` does: a hash of what defines it.
    func replicationID(source: String, target: String, continuous: Bool, body: JSONObject) -> String {
        let definition: JSONValue = ["source": .string(source), "target": .string(target), "doc_ids": body["doc_ids"] ?? .null,
                                     "selector": body["selector"] ?? .null, "create_target": body["create_target"] ?? false,
                                     "filter": body["filter"] ?? .null, "query_params": body["query_params"] ?? .null]
        let hash = BlobKey.hexString(MessageDigest.hash(.md5, Array(definition.jsonString(.canonical).utf8)))
        return hash + (continuous ? "+continuous" : "")
    }

    private func iso8601(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: date)
    }
}
