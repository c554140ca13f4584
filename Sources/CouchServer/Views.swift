import DocumentModel
import DocumentStore
import Foundation
import QueryServer

/// A view query's parameters, as CouchDB 3.4 reads them from the query string (and, for
/// `POST`, the JSON body).
struct ViewQuery {
    var keys: [JSONValue]?
    var range = ViewRange()
    var limit = Int.max
    var skip = 0
    var reduce: Bool?
    var group = false
    var groupLevel: Int?
    var includeDocs = false
    var conflicts = false
    var updateSeq = false
    var update = "true"

    init(_ request: Request, body: JSONObject) throws {
        func value(_ names: String...) throws -> JSONValue? {
            for name in names {
                if let given = body[name] { return given }
                if let text = request.query(name) {
                    do { return try JSONParser.parse(Array(text.utf8)) } catch {
                        throw HTTPError(.badRequest, "bad_request", "invalid UTF-8 JSON")
                    }
                }
            }
            return nil
        }
        func text(_ names: String...) -> String? {
            for name in names {
                if let given = body[name] { return given.stringValue ?? given.jsonString() }
                if let given = request.query(name) { return given }
            }
            return nil
        }
        func boolean(_ name: String) throws -> Bool? {
            guard let given = text(name) else { return nil }
            return try Request.parseBoolean(given)
        }
        func integer(_ name: String) throws -> Int? {
            guard let given = text(name) else { return nil }
            guard let number = Int(given) else { throw HTTPError(.badRequest, "query_parse_error", "Invalid integer parameter: \"\(given)\"") }
            return number
        }
        if case .array(let list)? = try value("keys") { keys = list } else if try value("keys") != nil {
            throw HTTPError(.badRequest, "bad_request", "`keys` member must be an array.")
        }
        let key = try value("key")
        range.startKey = try key ?? value("startkey", "start_key")
        range.endKey = try key ?? value("endkey", "end_key")
        range.startDocID = text("startkey_docid", "start_key_doc_id")
        range.endDocID = text("endkey_docid", "end_key_doc_id")
        range.descending = try boolean("descending") ?? false
        range.inclusiveEnd = try boolean("inclusive_end") ?? true
        if let limit = try integer("limit") {
            guard limit >= 0 else { throw HTTPError(.badRequest, "query_parse_error", "Invalid value for positive int: \"\(limit)\"") }
            self.limit = limit
        }
        if let skip = try integer("skip") {
            guard skip >= 0 else { throw HTTPError(.badRequest, "query_parse_error", "Invalid value for positive int: \"\(skip)\"") }
            self.skip = skip
        }
        reduce = try boolean("reduce")
        group = try boolean("group") ?? false
        if let level = try integer("group_level") {
            guard level >= 0 else { throw HTTPError(.badRequest, "query_parse_error", "Invalid value for positive int: \"\(level)\"") }
            groupLevel = level
        }
        includeDocs = try boolean("include_docs") ?? false
        conflicts = try boolean("conflicts") ?? false
        updateSeq = try boolean("update_seq") ?? false
        if let update = text("update") {
            guard ["true", "false", "lazy"].contains(update) else {
                throw HTTPError(.badRequest, "query_parse_error", "Invalid value for `update`: \"\(update)\"")
            }
            self.update = update
        }
        if try boolean("stable") == true, text("update") == nil { self.update = "false" }
    }
}

extension CouchServer {
    /// `/{db}/_design/{ddoc}/_view/{view}` (GET, or POST with `keys`), `…/_view/{view}/queries`
    /// (POST with `queries`), `/{db}/_design/{ddoc}/_info`, `_show`, `_list` and `_update`; other
    /// design functions (`_rewrite`) answer 501.
    func designFunction(_ request: Request, _ db: Database, design: String, path: [String]) async throws {
        let designID = "_design/" + design
        switch path.first {
        case "_view" where path.count == 2 || (path.count == 3 && path[2] == "queries"):
            guard request.method == .GET || request.method == .POST else { throw HTTPError.methodNotAllowed }
            var body = JSONObject()
            if request.method == .POST {
                guard request.headers.mediaType == "application/json" else {
                    throw HTTPError(.unsupportedMediaType, "bad_content_type", "Content-Type must be application/json")
                }
                guard case .object(let object) = try await request.body.json(limit: ServerTuning.jsonBody) else {
                    throw HTTPError.badRequest("Request body must be a JSON object")
                }
                body = object
            }
            if path.count == 3 {
                guard request.method == .POST, case .array(let queries)? = body["queries"] else {
                    throw HTTPError.badRequest("Request body must contain a `queries` array")
                }
                var results: [JSONValue] = []
                for query in queries {
                    guard case .object(let object) = query else { throw HTTPError.badRequest("Each query must be a JSON object") }
                    results.append(try await viewAnswer(request, db, designID: designID, view: path[1], query: ViewQuery(request, body: object)))
                }
                return try await request.response.sendJSON(.ok, ["results": .array(results)])
            }
            let answer = try await viewAnswer(request, db, designID: designID, view: path[1], query: ViewQuery(request, body: body))
            try await sendViewAnswer(request, answer)
        case "_info" where path.count == 1:
            guard request.method == .GET else { throw HTTPError.methodNotAllowed }
            guard let designDocument = try await blocking({ try db.document(withID: designID) }) else { throw HTTPError(.notFound, "not_found", "missing") }
            let definition = ViewDefinition(designID: designID, body: designDocument.properties)
                ?? ViewDefinition(designID: designID, body: ["views": [:]])!
            let state = try await blocking { try db.viewIndexState(definition) }
            try await request.response.sendJSON(.ok, [
                "name": .string(design),
                "view_index": [
                    "updates_pending": ["minimum": 0, "preferred": 0, "total": 0],
                    "waiting_commit": false, "waiting_clients": 0, "updater_running": false, "update_seq": .integer(state?.sequence ?? 0),
                    "sizes": ["file": 0, "external": 0, "active": 0], "signature": .string(definition.signature),
                    "purge_seq": 0, "language": "javascript", "compact_running": false,
                    "collator_versions": [.string(Collation.collatorVersion)],
                ],
            ])
        case "_show", "_update":
            try await showOrUpdate(request, db, designID: designID, path: path)
        case "_list":
            try await list(request, db, designID: designID, path: path)
        default:
            throw HTTPError.notImplemented("\(path.first ?? "") (design document functions other than views, shows, lists and updates)")
        }
    }

    /// A view's answer as CouchDB lays it out.
    private func sendViewAnswer(_ request: Request, _ answer: JSONValue) async throws {
        let response = request.response
        try await response.start(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"])
        var head = "{"
        for (key, value) in answer.objectValue ?? [:] where key != "rows" {
            head += "\"\(key)\":" + value.jsonString() + ","
        }
        head += "\"rows\":[\r\n"
        let rows = (answer["rows"]?.arrayValue ?? []).map { $0.jsonString() }.joined(separator: ",\r\n")
        try await response.write(head + rows + "\r\n]}\n")
        try await response.finish()
    }

    /// Runs one view query: `total_rows`, `offset` and `rows` (map), or `rows` (reduce).
    func viewAnswer(_ request: Request, _ db: Database, designID: String, view name: String, query: ViewQuery) async throws -> JSONValue {
        guard let design = try await blocking({ try db.document(withID: designID) }) else {
            throw HTTPError(.notFound, "not_found", "missing")
        }
        guard let definition = ViewDefinition(designID: designID, body: design.properties), let view = definition.view(named: name),
              let position = definition.views.firstIndex(where: { $0.name == name }) else {
            throw HTTPError(.notFound, "not_found", "missing_named_view")
        }
        let reducing = query.reduce ?? (view.reduce != nil)
        if reducing, view.reduce == nil { throw HTTPError(.badRequest, "query_parse_error", "Reduce is invalid for map-only views.") }
        if reducing, query.includeDocs { throw HTTPError(.badRequest, "query_parse_error", "`include_docs` is invalid for reduce") }
        if !reducing, query.group || query.groupLevel != nil, view.reduce == nil {
            throw HTTPError(.badRequest, "query_parse_error", "Invalid use of grouping on a map view.")
        }
        // As CouchDB's `validate_args`: a reduce over several given keys needs a group, and a key
        // range that runs against the order asked for can match nothing. (CouchDB reads one key
        // in `keys` as `key`, so neither rule stops it.)
        if reducing, let keys = query.keys, keys.count > 1, !query.group || query.groupLevel != nil {
            throw HTTPError(.badRequest, "query_parse_error", "Multi-key fetches for reduce views must use `group=true`")
        }
        if (query.keys?.count ?? 1) == 1, let start = query.range.startKey, let end = query.range.endKey {
            let order = Collation.compare(start, end)
            if !query.range.descending, order > 0 {
                throw HTTPError(.badRequest, "query_parse_error",
                                "No rows can match your key range, reverse your start_key and end_key or set descending=true")
            }
            if query.range.descending, order < 0 {
                throw HTTPError(.badRequest, "query_parse_error",
                                "No rows can match your key range, reverse your start_key and end_key or set descending=false")
            }
        }
        let state: (id: Int64, sequence: Int64)? = try await blocking {
            switch query.update {
            case "false": return try db.viewIndexState(definition)
            case "lazy":
                let state = try db.viewIndexState(definition)
                // A failure shows at the next query that updates the index.
                self.lazyViewUpdates.request("\(db.path)\u{0}\(definition.signature)") { _ = try? db.updateViewIndex(definition) }
                return state
            default: return try db.updateViewIndex(definition)
            }
        }
        var answer = JSONObject()
        guard let state else {
            // update=false on an index never built: nothing, as an empty index answers.
            if !reducing { answer["total_rows"] = 0; answer["offset"] = 0 }
            if query.updateSeq { answer["update_seq"] = CouchJSON.sequence(0) }
            answer["rows"] = []
            return .object(answer)
        }
        if reducing {
            let rows = try await blocking { try self.reducedRows(db, state.id, position, view, query) }
            if query.updateSeq { answer["update_seq"] = CouchJSON.sequence(state.sequence) }
            answer["rows"] = .array(rows)
            return .object(answer)
        }
        let (total, offset, rows) = try await blocking { () -> (Int, Int, [ViewRow]) in
            let total = try db.viewRowCount(index: state.id, view: position)
            guard let keys = query.keys else {
                let (offset, rows) = try db.viewRows(index: state.id, view: position, range: query.range, skip: query.skip, limit: query.limit)
                return (total, offset, rows)
            }
            var all: [ViewRow] = []
            var offset = 0
            for (index, key) in keys.enumerated() {
                let (before, rows) = try db.viewRows(index: state.id, view: position, range: .key(key, descending: query.range.descending),
                                                     skip: 0, limit: Int.max,
                                                     countingOffset: index == 0)
                if index == 0 { offset = before }  // CouchDB's: the rows before the first key
                all += rows
            }
            return (total, offset, Array(all.dropFirst(query.skip).prefix(query.limit)))
        }
        answer["total_rows"] = .integer(Int64(total))
        answer["offset"] = .integer(Int64(offset))
        if query.updateSeq { answer["update_seq"] = CouchJSON.sequence(state.sequence) }
        var rendered: [JSONValue] = []
        for row in rows {
            var object: JSONObject = ["id": .string(row.docID), "key": row.key, "value": row.value]
            if query.includeDocs {
                object["doc"] = try await blocking { try self.linkedDocument(db, row, conflicts: query.conflicts) }
            }
            rendered.append(.object(object))
        }
        answer["rows"] = .array(rendered)
        return .object(answer)
    }

    /// The document a row leads to (`include_docs`): the one its value names with `_id` (and
    /// `_rev`), else the one that emitted it; null when deleted or missing.
    private func linkedDocument(_ db: Database, _ row: ViewRow, conflicts: Bool) throws -> JSONValue {
        var id = row.docID
        var revision: Revision?
        if case .object(let value) = row.value, let linked = value["_id"]?.stringValue {
            id = linked
            if let rev = value["_rev"]?.stringValue.flatMap(RevisionID.init) { revision = try db.revisionIfPresent(rev, of: id) }
        }
        if revision == nil { revision = try db.document(withID: id) }
        guard let revision, !revision.deleted, let tree = try db.revisionTreeIfPresent(of: id) else { return .null }
        var options = CouchFormat.Options()
        options.conflicts = conflicts
        return .object(try CouchFormat.render(revision, tree: tree, options: options, readBody: { _ in [] }).json)
    }

    /// The reduce rows of a query: one per group (by the whole key with `group`, by its first
    /// `group_level` elements, or one for all), in the query's order, after `skip`, at most `limit`.
    private func reducedRows(_ db: Database, _ indexID: Int64, _ position: Int, _ view: ViewDefinition.View, _ query: ViewQuery) throws -> [JSONValue] {
        // group_level=0 is one group, as no grouping is.
        let level: Int? = (query.groupLevel ?? (query.group ? Int.max : nil)).flatMap { $0 == 0 ? nil : $0 }
        var groups: [(key: JSONValue, rows: [ViewRow])] = []
        func add(_ rows: [ViewRow]) {
            for row in rows {
                let key: JSONValue
                if let level {
                    if case .array(let parts) = row.key, level != Int.max { key = .array(Array(parts.prefix(level))) } else { key = row.key }
                } else {
                    key = .null
                }
                if let last = groups.last, level == nil || Collation.compare(last.key, key) == 0 {
                    groups[groups.count - 1].rows.append(row)
                } else {
                    groups.append((key, [row]))
                }
            }
        }
        if let keys = query.keys {
            for key in keys {
                let rows = try db.viewRows(index: indexID, view: position, range: .key(key, descending: query.range.descending),
                                           skip: 0, limit: Int.max, countingOffset: false).rows
                if level == nil {
                    add(rows)  // without grouping, one row for all the keys' rows
                } else if !rows.isEmpty {
                    groups.append((key, rows))
                }
            }
        } else {
            add(try db.viewRows(index: indexID, view: position, range: query.range, skip: 0, limit: Int.max, countingOffset: false).rows)
        }
        let source = view.reduce ?? "_count"
        return try groups.dropFirst(query.skip).prefix(query.limit).map { group in
            ["key": level == nil ? .null : group.key, "value": try ViewReduce.reduce(source, group.rows)]
        }
    }
}
