import DocumentModel
import DocumentStore
import Foundation
import QueryServer

/// A design document's `_changes` filter (`filter=ddoc/name`), with the request object it is
/// called with, as CouchDB calls it: `filter(doc, req)`, truthy to pass.
struct FilterFunction: Sendable {
    let designID: String
    let revision: String
    let body: JSONObject
    let name: String
    let request: JSONValue

    /// Whether `revision` passes; a function that fails is a 500 with its error.
    func passes(_ revision: Revision, in db: Database) throws -> Bool {
        let tree = try db.revisionTree(of: revision.docID)
        let doc = try CouchFormat.render(revision, tree: tree, options: CouchFormat.Options(), readBody: { _ in [] }).json
        let answer: JSONValue
        do {
            answer = try QueryServerPool.shared.run(designDocument: designID, revision: self.revision, body: .object(body),
                                                    path: ["filters", name], arguments: [[.object(doc)], request])
        } catch let error as QueryServerError {
            switch error {
            case .function(let name, let reason): throw HTTPError(.internalServerError, name, reason)
            default: throw HTTPError(.internalServerError, "os_process_error", "\(designID): \(error)")
            }
        }
        guard case .array(let items) = answer, items.count == 2, case .array(let results) = items[1], results.count == 1 else {
            throw HTTPError(.internalServerError, "query_server_error", "\(designID)/\(name) answered \(answer.jsonString())")
        }
        return results[0].boolValue ?? false
    }
}

extension CouchServer {
    /// The filter function `filter=ddoc/name` names, answered as CouchDB answers a bad name
    /// (400), a missing design document or function (404).
    func filterFunction(_ name: String, _ request: Request, _ db: Database, body: JSONValue?) async throws -> FilterFunction {
        let parts = name.split(separator: "/", maxSplits: 1).map(String.init)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
            throw HTTPError.badRequest("`filter` must be of the form `designname/filtername`")
        }
        let designID = DocumentID.designPrefix + parts[0]
        guard let design = try await blocking({ try db.document(withID: designID) }) else { throw HTTPError.notFound }
        guard let filters = design.properties["filters"] else { throw HTTPError(.notFound, "not_found", "missing json key: filters") }
        guard filters[parts[1]]?.stringValue != nil else { throw HTTPError(.notFound, "not_found", "missing json key: \(parts[1])") }
        var document = design.properties
        document["_id"] = .string(designID)
        document["_rev"] = .string(design.revID.description)
        let security = try await blocking { try db.securityObject }
        return FilterFunction(designID: designID, revision: design.revID.description, body: document, name: parts[1],
                              request: try await requestObject(request, db, body: body, security: security))
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
