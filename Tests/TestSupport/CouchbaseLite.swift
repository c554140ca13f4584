import DocumentModel
import Foundation

/// Couchbase Lite's own tool over its engine, LiteCore 3.2 (`../shared/peers/cblite`): real
/// `.cblite2` databases and Couchbase Lite's own replicator, BLIP over a WebSocket.
public enum CouchbaseLite {
    public static let tool = packageRoot + "/../shared/peers/cblite"

    /// Runs the tool; `--writeable` comes first, as it must.
    @discardableResult
    public static func run(_ arguments: [String]) throws -> ProcessResult {
        try ChildProcess([tool] + arguments).wait()
    }

    /// Creates or updates a document (the database too, if new).
    public static func put(_ database: String, _ id: String, _ json: String) throws {
        let result = try run(["--create", "--upgrade", "put", database, id, json])
        guard result.succeeded else { throw SofaError.invalidArgument("cblite put \(id): \(result.stdout) \(result.stderr)") }
    }

    public static func remove(_ database: String, _ id: String) throws {
        let result = try run(["--writeable", "rm", database, id])
        guard result.succeeded else { throw SofaError.invalidArgument("cblite rm \(id): \(result.stdout) \(result.stderr)") }
    }

    /// Couchbase Lite's replicator pulling `url` into `database` (made if new).
    public static func pull(_ database: String, from url: String, _ extra: [String] = []) throws -> ProcessResult {
        try run(["--create", "--upgrade", "pull"] + extra + [database, url])
    }

    /// Couchbase Lite's replicator pushing `database` to `url`. The tool's `push` fails at this
    /// LiteCore commit, before it opens a socket ("not found (/7)", even against a bare
    /// listener), unless the database has replicated with that URL before: a pull goes first
    /// (it moves nothing from an empty database, and what a later push would meet anyway).
    public static func push(_ database: String, to url: String, _ extra: [String] = []) throws -> ProcessResult {
        let first = try run(["--writeable", "push"] + extra + [database, url])
        guard !first.succeeded, (first.stdout + first.stderr).contains("not found (\u{01}/7)") else { return first }
        let introduced = try pull(database, from: url)
        guard introduced.succeeded else { return introduced }
        return try run(["--writeable", "push"] + extra + [database, url])
    }

    /// Both ways at once (`--bidi`).
    public static func sync(_ database: String, with url: String, _ extra: [String] = []) throws -> ProcessResult {
        try run(["--writeable", "pull", "--bidi"] + extra + [database, url])
    }

    /// "Completed N docs" of a replication's output: the documents it moved.
    public static func documentsMoved(_ result: ProcessResult) -> Int? {
        let text = result.stdout + result.stderr
        guard let range = text.range(of: #"Completed (\d+) docs"#, options: .regularExpression) else { return nil }
        return Int(text[range].split(separator: " ")[1])
    }

    /// Every live document, by id, with `_rev` (as `cblite cat --raw --rev` shows it).
    public static func documents(_ database: String) throws -> [String: JSONObject] {
        let result = try run(["cat", "--raw", "--rev", database, "*"])
        guard result.succeeded else { throw SofaError.invalidArgument("cblite cat: \(result.stdout) \(result.stderr)") }
        var documents: [String: JSONObject] = [:]
        for line in result.stdout.split(separator: "\n") where line.hasPrefix("{") {
            guard let object = try JSONParser.parse(Array(line.utf8)).objectValue, let id = object["_id"]?.stringValue else { continue }
            documents[id] = object
        }
        return documents
    }

    /// A document's revision tree as `cblite revs` draws it.
    public static func revisions(_ database: String, _ id: String) throws -> String {
        try run(["revs", database, id]).stdout
    }
}

extension JSONValue {
    /// The value with every object's keys sorted: Couchbase Lite keeps a document's keys sorted
    /// (Fleece), Sofa as they came, and both are the same document.
    public var sortedKeys: JSONValue {
        switch self {
        case .object(let object): .object(JSONObject(object.entries.sorted { $0.key < $1.key }.map { ($0.key, $0.value.sortedKeys) }))
        case .array(let items): .array(items.map(\.sortedKeys))
        default: self
        }
    }
}
