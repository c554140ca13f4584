import DocumentModel
import DocumentStore
import Foundation

/// A design document's `_changes` filter with the request object it is called with.
struct FilterFunction: Sendable {
    let filter: DesignFilter
    let request: JSONValue

    /// Whether `revision` passes; a function that fails is a 500 with its error.
    func passes(_ revision: Revision, in db: Database) throws -> Bool {
        try filter.passes(revision, in: db, request: request)
    }
}

extension CouchServer {
    /// The filter function `filter=ddoc/name` names, answered as CouchDB answers a bad name
    /// (400), a missing design document or function (404).
    func filterFunction(_ name: String, _ request: Request, _ db: Database, body: JSONValue?, view: Bool = false) async throws -> FilterFunction {
        let filter: DesignFilter
        do {
            filter = try await blocking { try DesignFilter(named: name, view: view, in: db) }
        } catch let error as DesignFilter.LookupError {
            switch error {
            case .badName: throw HTTPError.badRequest("`filter` must be of the form `designname/filtername`")
            case .missingDesignDocument: throw HTTPError.notFound
            case .missingKey(let key): throw HTTPError(.notFound, "not_found", "missing json key: \(key)")
            }
        }
        let security = try await blocking { try db.securityObject }
        return FilterFunction(filter: filter, request: try await requestObject(request, db, body: body, security: security))
    }

    /// CouchDB's JSON request object, as design-document functions receive it.
    func requestObject(_ request: Request, _ db: Database, body: JSONValue?, security: JSONObject) async throws -> JSONValue {
        let user = CouchServer.user
        let name = request.segments.first ?? ""
        let (documents, _, lastSequence) = try await blocking { try db.counts() }
        var headers = JSONObject()
        for (header, value) in request.headers { headers[header] = .string(value) }
        return [
            "info": ["db_name": .string(name), "doc_count": .integer(Int64(documents)), "update_seq": CouchJSON.sequence(lastSequence)],
            "id": .null,
            "uuid": .string(UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")),
            "method": .string(request.method.rawValue),
            "requested_path": .array(request.segments.map(JSONValue.string)),
            "path": .array(request.segments.map(JSONValue.string)),
            "raw_path": .string(request.head.uri),
            "query": .object(JSONObject(request.target.query.sorted { $0.key < $1.key }.map { ($0.key, .string($0.value)) })),
            "headers": .object(headers),
            "body": body.map { .string($0.jsonString()) } ?? "undefined",
            "peer": "127.0.0.1",
            "form": [:],
            "cookie": [:],
            "userCtx": ["db": .string(name), "name": user.name.map(JSONValue.string) ?? .null, "roles": .array(user.roles.map(JSONValue.string))],
            "secObj": .object(security),
        ]
    }
}
