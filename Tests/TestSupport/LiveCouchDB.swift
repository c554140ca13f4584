import DocumentModel
import Foundation

/// A real Apache CouchDB 3.4.3 on 127.0.0.1 (`../shared/peers/couchdb`), one per test run.
///
/// `Scripts/test` starts it and passes `SOFA_COUCHDB_URL`; a test run started another way
/// starts its own node under /tmp and stops it when the run ends. Tests share the node and
/// make databases with unique names (`newDatabase`).
public final class LiveCouchDB: @unchecked Sendable {
    /// `http://127.0.0.1:PORT`, no credentials.
    public let url: String
    public let port: Int
    public let user = "admin"
    public let password = "secret"

    public static let shared: LiveCouchDB = {
        if let url = ProcessInfo.processInfo.environment["SOFA_COUCHDB_URL"], !url.isEmpty {
            return LiveCouchDB(url: url)
        }
        let directory = "/tmp/sofa-couchdb-\(getpid())"
        let script = packageRoot + "/../shared/peers/couchdb"
        guard let started = try? shell("'\(script)' start '\(directory)'"), started.succeeded else {
            fatalError("cannot start CouchDB with \(script): see \(directory)/couchdb.out")
        }
        startedDirectory = directory
        atexit {
            if let directory = LiveCouchDB.startedDirectory {
                _ = try? shell("'\(packageRoot)/../shared/peers/couchdb' stop '\(directory)'; rm -rf '\(directory)'")
            }
        }
        return LiveCouchDB(url: started.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
    }()

    nonisolated(unsafe) private static var startedDirectory: String?

    private init(url: String) {
        self.url = url
        port = Int(url.split(separator: ":").last ?? "") ?? 5984
    }

    /// The URL of database `name` with the admin's credentials, as `sofa` takes it.
    public func url(_ name: String) -> String {
        "http://\(user):\(password)@127.0.0.1:\(port)/\(percentEncoded(name))"
    }

    /// One request with the admin's basic auth; `path` is already percent-encoded.
    public func request(_ method: String, _ path: String, _ body: JSONValue? = nil,
                        headers: [(String, String)] = []) throws -> HTTPResponse {
        let connection = try HTTPConnection(port: port)
        defer { connection.close() }
        let auth = Data("\(user):\(password)".utf8).base64EncodedString()
        return try connection.json(method, path, body, headers: [("Authorization", "Basic \(auth)")] + headers)
    }

    /// A request whose body is given as bytes (an attachment upload).
    public func upload(_ path: String, _ bytes: [UInt8], contentType: String) throws -> HTTPResponse {
        let connection = try HTTPConnection(port: port)
        defer { connection.close() }
        let auth = Data("\(user):\(password)".utf8).base64EncodedString()
        return try connection.request("PUT", path, headers: [("Authorization", "Basic \(auth)"), ("Content-Type", contentType)],
                                      body: bytes)
    }

    /// Creates an empty database with a unique name starting with `label`.
    public func newDatabase(_ label: String) throws -> String {
        let name = "\(label)-\(UUID().uuidString.prefix(8).lowercased())"
        let answer = try request("PUT", "/\(name)")
        guard answer.status == 201 else { throw TestFailure("PUT /\(name): \(answer.status) \(answer.text)") }
        return name
    }

    /// A name made safe for a URL path segment.
    public func percentEncoded(_ segment: String) -> String {
        segment.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-_.~"))) ?? segment
    }
}

/// A failure in a test's own set-up, with what went wrong.
public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A real CouchDB 3.4.3 cluster of three nodes on 127.0.0.1 (`../shared/peers/couchdb
/// cluster`: q=8, n=3), started for the test run that asks for it and stopped when the run
/// ends. One node can be stopped and started again (`stop`, `start`).
public final class LiveCouchDBCluster: @unchecked Sendable {
    /// Each node's `http://127.0.0.1:PORT`, no credentials.
    public let nodes: [String]
    public let user = "admin"
    public let password = "secret"
    private let directory: String
    private static let script = packageRoot + "/../shared/peers/couchdb"

    public static let shared: LiveCouchDBCluster = {
        let directory = "/tmp/sofa-couchdb-cluster-\(getpid())"
        guard let started = try? shell("'\(script)' cluster '\(directory)' 3"), started.succeeded else {
            fatalError("cannot start a CouchDB cluster with \(script): see \(directory)/node*/couchdb.out")
        }
        atexit { _ = try? shell("'\(LiveCouchDBCluster.script)' stop '/tmp/sofa-couchdb-cluster-\(getpid())'; rm -rf '/tmp/sofa-couchdb-cluster-\(getpid())'") }
        return LiveCouchDBCluster(directory: directory,
                                  nodes: started.stdout.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) })
    }()

    private init(directory: String, nodes: [String]) {
        (self.directory, self.nodes) = (directory, nodes)
    }

    public func port(_ node: Int) -> Int { Int(nodes[node].split(separator: ":").last ?? "") ?? 0 }

    /// The URL of database `name` on `node` with the admin's credentials, as `sofa` takes it.
    public func url(_ name: String, node: Int) -> String { "http://\(user):\(password)@127.0.0.1:\(port(node))/\(name)" }

    /// Stops node `node` (0-based), as a crash would leave the others.
    public func stop(_ node: Int) throws {
        let result = try shell("'\(Self.script)' stop-node '\(directory)' \(node + 1)")
        guard result.succeeded else { throw TestFailure("stop-node \(node + 1): \(result.stderr)") }
    }

    /// Starts node `node` again; returns once it answers.
    public func start(_ node: Int) throws {
        let result = try shell("'\(Self.script)' start-node '\(directory)' \(node + 1)")
        guard result.succeeded else { throw TestFailure("start-node \(node + 1): \(result.stderr)") }
    }

    /// One request to `node` with the admin's basic auth; `path` is already percent-encoded.
    public func request(_ method: String, _ path: String, _ body: JSONValue? = nil, node: Int) throws -> HTTPResponse {
        let connection = try HTTPConnection(port: port(node))
        defer { connection.close() }
        let auth = Data("\(user):\(password)".utf8).base64EncodedString()
        return try connection.json(method, path, body, headers: [("Authorization", "Basic \(auth)")])
    }
}
