import DocumentModel
import DocumentStore
import Foundation
import NIOHTTP1
import QueryServer

/// `_show`, `_list` and `_update` functions of design documents, run by the query server as
/// CouchDB runs them: `shows.NAME(doc, req)` answers a response (a string is its body);
/// `lists.NAME(head, req)` reads a view's rows with `getRow()` and answers with `send`,
/// `start` and what it returns; `updates.NAME(doc, req)` answers `[doc, response]`, the
/// document (when not null) saved as an edit, with `X-Couch-Id` and `X-Couch-Update-NewRev`.
extension CouchServer {
    /// `…/_list/{list}/{view}` or `…/_list/{list}/{ddoc}/{view}`: the view queried with the
    /// request's parameters (or a POST body's `keys`), its rows given to the list function.
    func list(_ request: Request, _ db: Database, designID: String, path: [String]) async throws {
        guard path.count == 3 || path.count == 4 else { throw HTTPError.notFound }
        guard request.method == .GET || request.method == .POST else { throw HTTPError.methodNotAllowed }
        guard let design = try await blocking({ try db.document(withID: designID) }), !design.deleted else {
            throw HTTPError(.notFound, "not_found", "missing")
        }
        let name = path[1]
        guard design.properties["lists"]?[name]?.stringValue != nil else {
            throw HTTPError(.notFound, "not_found", "missing json key: \(name)")
        }
        var parameters = JSONObject()
        if request.method == .POST, request.headers.mediaType == "application/json",
           case .object(let object) = try await request.body.json(limit: ServerTuning.jsonBody) {
            parameters = object
        }
        let viewDesignID = path.count == 4 ? "_design/" + path[2] : designID
        let answer = try await viewAnswer(request, db, designID: viewDesignID, view: path[path.count - 1],
                                          query: ViewQuery(request, body: parameters))
        var head = answer.objectValue ?? [:]
        let rows = head["rows"]?.arrayValue ?? []
        head["rows"] = nil
        let security = try await blocking { try db.securityObject }
        var req = try await requestObject(request, db, body: nil, security: security).objectValue ?? [:]
        req["body"] = parameters.isEmpty ? "undefined" : .string(JSONValue.object(parameters).jsonString())
        var body = design.properties
        body["_id"] = .string(designID)
        body["_rev"] = .string(design.revID.description)
        let (start, chunks): (JSONObject, [String]) = try await blocking { [body, head, req] in
            do {
                return try QueryServerPool.shared.withDesignDocument(designID, revision: design.revID.description, body: .object(body)) { process in
                    let timeout = QueryServerPool.shared.timeout
                    func strings(_ value: JSONValue?) -> [String] { (value?.arrayValue ?? []).map { $0.stringValue ?? $0.jsonString() } }
                    let first = try process.call(["ddoc", .string(designID), ["lists", .string(name)], [.object(head), .object(req)]],
                                                 timeout: timeout)
                    guard first[0] == "start" else { throw HTTPError(.internalServerError, "list_error", "the list did not start: \(first.jsonString())") }
                    var chunks = strings(first[1])
                    var ended = false
                    for row in rows {
                        let next = try process.call(["list_row", row], timeout: timeout)
                        chunks += strings(next[1])
                        if next[0] == "end" { ended = true; break }
                    }
                    if !ended { chunks += strings(try process.call(["list_end"], timeout: timeout)[1]) }
                    return (first[2]?.objectValue ?? [:], chunks)
                }
            } catch let error as QueryServerError {
                switch error {
                case .function(let name, let reason): throw HTTPError(CouchServer.status(ofFunctionError: name), name, reason)
                default: throw HTTPError(.internalServerError, "os_process_error", "\(designID): \(error)")
                }
            }
        }
        let text = chunks.joined()
        var headers = HTTPHeaders()
        for (header, value) in start["headers"]?.objectValue ?? [:] { headers.add(name: header, value: value.stringValue ?? value.jsonString()) }
        // CouchDB's: JSON unless the list says otherwise, and no type at all for an empty answer.
        if headers["Content-Type"].isEmpty, !text.isEmpty || !start.isEmpty { headers.add(name: "Content-Type", value: "application/json") }
        let code = start["code"]?.int64Value.map(Int.init) ?? 200
        try await request.response.send(HTTPResponseStatus(statusCode: code), headers: headers, body: Array(text.utf8))
    }

    func showOrUpdate(_ request: Request, _ db: Database, designID: String, path: [String]) async throws {
        guard path.count >= 2 else { throw HTTPError.notFound }
        let kind = path[0] == "_show" ? "shows" : "updates"
        let name = path[1]
        let docID = path.count > 2 ? path.dropFirst(2).joined(separator: "/") : nil
        if kind == "updates" {
            guard request.method == .PUT || request.method == .POST else {
                if request.method == .GET {
                    throw HTTPError(.methodNotAllowed, "method_not_allowed", "Update functions do not allow GET")
                }
                throw HTTPError.methodNotAllowed
            }
            try requireWritable(request)
        }
        guard let design = try await blocking({ try db.document(withID: designID) }), !design.deleted else {
            throw HTTPError(.notFound, "not_found", "missing")
        }
        guard design.properties[kind]?[name]?.stringValue != nil else {
            throw HTTPError(.notFound, "not_found", "missing json key: \(name)")
        }
        let bytes = try await request.body.collect(limit: ServerTuning.jsonBody)
        let document: JSONValue = try await blocking {
            guard let docID, let revision = try db.document(withID: docID), !revision.deleted,
                  let tree = try db.revisionTreeIfPresent(of: docID) else { return .null }
            var options = CouchFormat.Options()
            options.revisions = true
            return .object(try CouchFormat.render(revision, tree: tree, options: options, readBody: { _ in [] }).json)
        }
        let security = try await blocking { try db.securityObject }
        var req = try await requestObject(request, db, body: nil, security: security).objectValue ?? [:]
        req["id"] = docID.map(JSONValue.string) ?? .null
        req["body"] = bytes.isEmpty ? "undefined" : .string(String(decoding: bytes, as: UTF8.self))
        if request.headers.mediaType == "application/x-www-form-urlencoded" {
            req["form"] = .object(JSONObject(String(decoding: bytes, as: UTF8.self).split(separator: "&").map { pair in
                let parts = pair.split(separator: "=", maxSplits: 1).map {
                    String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String($0)
                }
                return (parts[0], .string(parts.count > 1 ? parts[1] : ""))
            }))
        }
        var body = design.properties
        body["_id"] = .string(designID)
        body["_rev"] = .string(design.revID.description)
        let arguments: [JSONValue] = [document, .object(req)]
        let answer: JSONValue = try await blocking { [body] in
            do {
                return try QueryServerPool.shared.run(designDocument: designID, revision: design.revID.description, body: .object(body),
                                                      path: [kind, name], arguments: arguments)
            } catch let error as QueryServerError {
                switch error {
                case .function(let name, let reason): throw HTTPError(CouchServer.status(ofFunctionError: name), name, reason)
                default: throw HTTPError(.internalServerError, "os_process_error", "\(designID): \(error)")
                }
            }
        }
        guard case .array(let parts) = answer, let tag = parts.first?.stringValue else {
            throw HTTPError(.internalServerError, "render_error", "the query server answered \(answer.jsonString())")
        }
        if tag == "resp", parts.count == 2, case .object(let response) = parts[1] {
            return try await sendFunctionResponse(request, response, status: .ok)
        }
        guard tag == "up", parts.count == 3, case .object(let response) = parts[2] else {
            throw HTTPError(.internalServerError, "render_error", "the query server answered \(answer.jsonString())")
        }
        guard case .object(let saved) = parts[1] else { return try await sendFunctionResponse(request, response, status: .ok) }
        var incoming = try IncomingDocument(.object(saved))
        guard let id = incoming.id else { throw HTTPError.badRequest("Document id must be a string") }
        if incoming.history != nil { incoming.history = nil }  // the _revisions it was given, not a history to graft
        let rev = try await storeDocuments([(id, incoming)], received: [id: [:]], db: db, newEdits: true)[0].get()
        try await sendFunctionResponse(request, response, status: .created,
                                       extra: ["X-Couch-Id": id.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? id,
                                               "X-Couch-Update-NewRev": rev.description])
    }

    /// CouchDB's status for an error a function throws by name.
    static func status(ofFunctionError name: String) -> HTTPResponseStatus {
        switch name {
        case "not_found": .notFound
        case "forbidden": .forbidden
        case "unauthorized": .unauthorized
        case "method_not_allowed": .methodNotAllowed
        case "not_acceptable": .notAcceptable  // provides() has no rendering for the Accept header or ?format
        case "bad_request": .badRequest
        case "conflict": .conflict
        default: .internalServerError
        }
    }

    /// A function's response object: `code`, `headers`, and `body` (text), `json` or `base64`;
    /// CouchDB's content types when the function sets none.
    private func sendFunctionResponse(_ request: Request, _ response: JSONObject, status: HTTPResponseStatus,
                                      extra: [String: String] = [:]) async throws {
        var headers = HTTPHeaders()
        var bytes: [UInt8] = []
        var type = "application/json"
        if let json = response["json"] {
            bytes = json.serialized()
        } else if let base64 = response["base64"]?.stringValue {
            bytes = [UInt8](Data(base64Encoded: base64) ?? Data())
            type = "application/binary"
        } else if let body = response["body"] {
            bytes = Array((body.stringValue ?? body.jsonString()).utf8)
            type = "text/html; charset=utf-8"
        }
        var hasType = false
        for (name, value) in response["headers"]?.objectValue ?? [:] {
            if name.lowercased() == "content-type" { hasType = true }
            headers.add(name: name, value: value.stringValue ?? value.jsonString())
        }
        if !hasType { headers.add(name: "Content-Type", value: type) }
        for (name, value) in extra { headers.add(name: name, value: value) }
        // CouchDB: the code a save answers (201) wins over the function's.
        let code = status == .created ? 201 : (response["code"]?.int64Value.map(Int.init) ?? 200)
        try await request.response.send(HTTPResponseStatus(statusCode: code), headers: headers, body: bytes)
    }
}
