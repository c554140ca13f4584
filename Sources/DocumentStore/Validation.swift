import DocumentModel
import Foundation
import QueryServer

/// Who makes a change, as a design document's `validate_doc_update` sees it (CouchDB's
/// `userCtx`). The owner of the file (the CLI, the mount, a replication run here) is an admin
/// with no name, as CouchDB's own processes are.
public struct Author: Sendable, Hashable {
    public var name: String?
    public var roles: [String]

    public init(name: String?, roles: [String]) {
        self.name = name
        self.roles = roles
    }

    public static let owner = Author(name: nil, roles: ["_admin"])

    /// The author of the saves made inside `Author.$current.withValue(…) { … }` on this thread
    /// or task: `sofa serve` runs each request's storage work as the user who sent it.
    @TaskLocal public static var current = Author.owner
}

/// A design document's `validate_doc_update`, known by the revision it came from.
struct Validator {
    let designID: String
    let revision: String
    let body: JSONObject
}

/// The validators of a database, read again only when a design document changed.
final class Validators: @unchecked Sendable {
    // Sendable invariant: `cached` is guarded by `lock`.
    private let lock = NSLock()
    private var cached: (signature: [String], validators: [Validator])?

    /// Whether the last look found any validator (true before the first look): a hint that
    /// lets a save skip validating outside the lock, never a reason to skip validating.
    var mayHaveAny: Bool { lock.withLock { cached.map { !$0.validators.isEmpty } ?? true } }

    /// The validators of the design documents live in `connection`'s view of the database.
    func current(in connection: SQLiteConnection, load: (String, RevisionID) throws -> JSONObject?) throws -> [Validator] {
        let rows = try connection.query("""
            SELECT doc_id, current_rev FROM docs WHERE doc_id >= '_design/' AND doc_id < '_design0' AND deleted = 0 ORDER BY doc_id
            """) { (id: $0.text(0), rev: $0.text(1)) }
        let signature = rows.map { "\($0.id) \($0.rev)" }
        if let cached = lock.withLock({ cached }), cached.signature == signature { return cached.validators }
        var validators: [Validator] = []
        for row in rows {
            guard let body = try load(row.id, RevisionID.parse(row.rev)), body["validate_doc_update"]?.stringValue != nil else { continue }
            var document = body
            document["_id"] = .string(row.id)
            document["_rev"] = .string(row.rev)
            validators.append(Validator(designID: row.id, revision: row.rev, body: document))
        }
        lock.withLock { cached = (signature, validators) }
        return validators
    }
}

extension Database {
    /// The design documents that hold a `validate_doc_update`, with their revisions, in
    /// `connection`'s view: what a validation ran with (empty: none to run).
    func validatorSignature(in connection: SQLiteConnection) throws -> [String] {
        try currentValidators(in: connection).map { "\($0.designID) \($0.revision)" }
    }

    /// The validators in `connection`'s view of the database.
    private func currentValidators(in connection: SQLiteConnection) throws -> [Validator] {
        try validators.current(in: connection) { id, rev in
            guard let row = try Database.documentRow(id, in: connection) else { return nil }
            return try loadRevision(docKey: row.key, docID: id, revID: rev, in: connection)?.properties
        }
    }

    /// The database's name as `userCtx.db` shows it: the file's name without `.sofa`.
    public var validationName: String {
        let file = (path as NSString).lastPathComponent
        return file.hasSuffix(".sofa") ? String(file.dropLast(5)) : file
    }

    /// Runs every design document's `validate_doc_update` on a change, in the order of their
    /// ids, as CouchDB does; throws `.forbidden` or `.unauthorized` when one refuses, and
    /// `.designFunctionFailed` when one fails. Design documents themselves and `_local`
    /// documents are not validated (CouchDB checks only that an admin writes them).
    func validate(docID: String, newDocument: () -> JSONObject, oldDocument: () throws -> JSONObject?, author: Author,
                  in connection: SQLiteConnection) throws {
        guard !docID.hasPrefix("_design/"), !DocumentID.isLocal(docID) else { return }
        let validators = try currentValidators(in: connection)
        guard !validators.isEmpty else { return }
        let arguments: [JSONValue] = [
            .object(newDocument()), try oldDocument().map(JSONValue.object) ?? .null,
            ["db": .string(validationName), "name": author.name.map(JSONValue.string) ?? .null, "roles": .array(author.roles.map(JSONValue.string))],
            .object(try securityObject),
        ]
        for validator in validators {
            let answer = try runDesignFunction(validator.designID, revision: validator.revision, body: validator.body,
                                               path: ["validate_doc_update"], arguments: arguments)
            switch answer {
            case .integer(1): continue
            case .object(let object) where object.count == 1:
                let (key, value) = Array(object)[0]
                switch key {
                case "forbidden": throw SofaError.forbidden(reason: value)
                case "unauthorized": throw SofaError.unauthorized(reason: value)
                default: throw SofaError.designFunctionFailed(error: "unknown_error", reason: value.stringValue ?? value.jsonString())
                }
            case .string(let text): throw SofaError.designFunctionFailed(error: "unknown_error", reason: text)
            default: throw SofaError.designFunctionFailed(error: "unknown_error", reason: answer.jsonString())
            }
        }
    }

    /// A revision as `validate_doc_update` sees it: `_id`, `_rev`, the properties, `_deleted`,
    /// `_revisions` and attachment stubs, in CouchDB's order.
    static func validationJSON(docID: String, rev: RevisionID?, history: [RevisionID], deleted: Bool, properties: JSONObject,
                               attachments: [Attachment]) -> JSONObject {
        var json: JSONObject = ["_id": .string(docID)]
        if let rev { json["_rev"] = .string(rev.description) }
        for (key, value) in properties where !key.hasPrefix("_") { json[key] = value }
        if deleted { json["_deleted"] = true }
        if !history.isEmpty { json["_revisions"] = CouchFormat.revisions(history) }
        if !attachments.isEmpty {
            json["_attachments"] = .object(JSONObject(attachments.map { ($0.name, .object(CouchFormat.stub($0))) }))
        }
        return json
    }
}

/// Runs a design document's function in the pool's query server; its failures become
/// `.designFunctionFailed` (the function's own error name, else `os_process_error`).
func runDesignFunction(_ designID: String, revision: String, body: JSONObject, path: [String], arguments: [JSONValue]) throws -> JSONValue {
    do {
        return try QueryServerPool.shared.run(designDocument: designID, revision: revision, body: .object(body), path: path,
                                              arguments: arguments)
    } catch let error as QueryServerError {
        switch error {
        case .function(let name, let reason): throw SofaError.designFunctionFailed(error: name, reason: reason)
        default: throw SofaError.designFunctionFailed(error: "os_process_error", reason: "\(designID): \(error)")
        }
    }
}

/// A design document's `_changes` filter (`filters.NAME` of `_design/DDOC`, named
/// `DDOC/NAME`), called as CouchDB calls it: `filter(doc, req)`, a truthy answer passes.
/// `sofa serve` runs it for `_changes?filter=`; a push with `--filter` runs it here.
public struct DesignFilter: Sendable {
    /// Why a filter name finds no function, as CouchDB tells them apart.
    public enum LookupError: Error, Sendable, CustomStringConvertible {
        /// Not `DDOC/NAME`.
        case badName
        /// No live `_design/DDOC`.
        case missingDesignDocument(String)
        /// The design document has no `filters`, or no such member in it: the missing key.
        case missingKey(String)

        public var description: String {
            switch self {
            case .badName: "a filter is named DDOC/NAME"
            case .missingDesignDocument(let id): "no design document \(id)"
            case .missingKey(let key): "the design document has no filter function \(key)"
            }
        }
    }

    public let designID: String
    public let name: String
    /// A view's map function used as a filter (`filter=_view&view=DDOC/NAME`): a document
    /// passes when it emits at least one row.
    public let isView: Bool
    let revision: String
    let body: JSONObject

    /// The filter function `filter` (`DDOC/NAME`) names, or with `view` the view of that name.
    public init(named filter: String, view: Bool = false, in db: Database) throws {
        let parts = filter.split(separator: "/", maxSplits: 1).map(String.init)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { throw LookupError.badName }
        designID = DocumentID.designPrefix + parts[0]
        name = parts[1]
        isView = view
        guard let design = try db.document(withID: designID) else { throw LookupError.missingDesignDocument(designID) }
        if view {
            guard design.properties["views"]?[name]?["map"]?.stringValue != nil else { throw LookupError.missingKey(name) }
        } else {
            guard let filters = design.properties["filters"] else { throw LookupError.missingKey("filters") }
            guard filters[name]?.stringValue != nil else { throw LookupError.missingKey(name) }
        }
        revision = design.revID.description
        var document = design.properties
        document["_id"] = .string(designID)
        document["_rev"] = .string(revision)
        body = document
    }

    /// Whether `revision` of a document of `db` passes, given as CouchDB renders it (stubs for
    /// attachments); a function that fails throws `.designFunctionFailed`.
    public func passes(_ revision: Revision, in db: Database, request: JSONValue) throws -> Bool {
        let tree = try db.revisionTree(of: revision.docID)
        let doc = try CouchFormat.render(revision, tree: tree, options: CouchFormat.Options(), readBody: { _ in [] }).json
        let answer = isView
            ? try runDesignFunction(designID, revision: self.revision, body: body, path: ["views", name, "map"], arguments: [[.object(doc)]])
            : try runDesignFunction(designID, revision: self.revision, body: body, path: ["filters", name],
                                    arguments: [[.object(doc)], request])
        guard case .array(let items) = answer, items.count == 2, case .array(let results) = items[1], results.count == 1 else {
            throw SofaError.designFunctionFailed(error: "query_server_error", reason: "\(designID)/\(name) answered \(answer.jsonString())")
        }
        return results[0].boolValue ?? false
    }

    /// The request object a filter run outside a server sees: the query parameters given and
    /// the file's owner as the user.
    public static func localRequest(databaseName: String, query: [String: String]) -> JSONValue {
        ["info": ["db_name": .string(databaseName)], "id": .null, "method": "GET", "path": [.string(databaseName), "_changes"],
         "query": .object(JSONObject(query.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) })), "headers": [:],
         "body": "undefined", "peer": "127.0.0.1", "form": [:], "cookie": [:],
         "userCtx": ["db": .string(databaseName), "name": .null, "roles": ["_admin"]], "secObj": [:]]
    }
}
