import BLIPReplication
import DocumentModel
import DocumentStore
import Foundation
import NIOHTTP1


extension CouchServer {
    /// Dispatches a request by its path, the way CouchDB lays out its API.
    func route(_ request: Request) async throws {
        // Credentials that are given must be right, wherever they are sent (CouchDB answers
        // 401 even on `/`): a client must be able to tell that its login failed.
        let user = try await userContext(request)
        try await CouchServer.$user.withValue(user) { try await routeAs(request) }
    }

    private func routeAs(_ request: Request) async throws {
        let segments = request.segments
        guard let first = segments.first else {
            return try await root(request)
        }
        switch first {
        case "_up":
            return try await request.response.sendJSON(.ok, ["status": "ok", "seeds": [:]])
        case "_session":
            return try await session(request)
        default:
            break
        }
        switch first {
        case "_all_dbs", "_dbs_info", "_active_tasks", "_scheduler", "_replicate", "_db_updates":
            try requireServerAdmin()
        default:
            break
        }
        switch first {
        case "_all_dbs":
            try await request.response.sendJSON(.ok, .array(registry.names.map { .string($0) }))
        case "_uuids":
            let count = min(try request.intQuery("count") ?? 1, 1000)
            let uuids = (0..<count).map { _ in JSONValue.string(makeBoundary()) }
            try await request.response.sendJSON(.ok, ["uuids": .array(uuids)])
        case "_replicate":
            try await replicate(request)
        case "_dbs_info":
            try await databasesInformation(request)
        case "_db_updates" where segments.count == 1:
            try await databaseUpdates(request)
        case "_active_tasks":
            try await activeTasks(request)
        case "_scheduler":
            switch segments.dropFirst().first {
            case "jobs" where segments.count == 2: try await schedulerJobs(request)
            case "docs" where segments.count == 2: try await schedulerDocs(request)
            default: throw HTTPError.notImplemented("/_scheduler/\(segments.dropFirst().joined(separator: "/")) (only jobs and docs)")
            }
        case CouchServer.usersDatabase, CouchServer.replicatorDatabase, CouchServer.globalChangesDatabase:
            // (`_global_changes` is made as CouchDB's setup makes it, a database like any other:
            // `_db_updates` answers from the server's own record with or without it.)
            try await routeDatabase(request, name: first, rest: Array(segments.dropFirst()))
        case _ where CouchServer.unimplementedServerEndpoints.contains(first):
            throw HTTPError.notImplemented("/\(first)")
        default:
            if first.hasPrefix("_") { throw HTTPError(.badRequest, "illegal_database_name", "Name: '\(first)'. Only lowercase characters (a-z), digits (0-9), and any of the characters _, $, (, ), +, and - are allowed. Must begin with a letter.") }
            try await routeDatabase(request, name: first, rest: Array(segments.dropFirst()))
        }
    }

    private func root(_ request: Request) async throws {
        try await request.response.sendJSON(.ok, [
            "couchdb": "Welcome",
            "version": "3.4.3",
            "vendor": ["name": "Sofa", "version": .string(SofaVersion.current)],
            "uuid": .string(uuid),
            "git_sha": "sofa",
            "features": [],
        ])
    }

    /// Refuses writes on a read-only server.
    func requireWritable(_ request: Request) throws {
        if configuration.readOnly { throw HTTPError.readOnly }
    }

    private func routeDatabase(_ request: Request, name: String, rest: [String]) async throws {
        try await CouchServer.$database.withValue(name) { try await routeDatabaseRequest(request, name: name, rest: rest) }
    }

    private func routeDatabaseRequest(_ request: Request, name: String, rest: [String]) async throws {
        if rest.isEmpty {
            switch request.method {
            case .GET, .HEAD:
                try requireMember(try await database(name))
                return try await databaseInfo(request, name: name)
            case .PUT:
                try requireServerAdmin()
                try requireWritable(request)
                // CouchDB's shard count: a positive integer, read back in the info (one file here).
                let shards = try request.query("q").map { text -> Int in
                    guard let count = Int(text), count >= 1 else { throw HTTPError.badRequest("The `q` value should be a positive integer.") }
                    return count
                }
                let created = try await blocking { try self.registry.create(name) }
                if let shards { try await blocking { try created.setShardCount(shards) } }
                return try await request.response.sendJSON(.created, ["ok": true],
                                                           headers: ["Location": location(request, [name])])
            case .DELETE:
                try requireServerAdmin()
                try requireWritable(request)
                try await blocking { try self.registry.delete(name) }
                return try await request.response.sendJSON(.ok, ["ok": true])
            case .POST:
                let db = try await database(name)
                try requireMember(db)
                return try await postDocument(request, database: db)
            default: throw HTTPError.methodNotAllowed
            }
        }
        let db = try await database(name)
        // Listing users is the server admin's, whatever `_users`' members are (CouchDB).
        if name == CouchServer.usersDatabase, ["_all_docs", "_changes"].contains(rest[0]) { try requireServerAdmin() }
        try requireMember(db)
        // What changes the database rather than its documents is its admins'.
        switch (rest[0], request.method) {
        case ("_compact", _), ("_view_cleanup", _), ("_purge", _), ("_index", .POST), ("_index", .DELETE),
             ("_security", .PUT), ("_revs_limit", .PUT), ("_purged_infos_limit", .PUT):
            try requireDatabaseAdmin(db)
        default:
            break
        }
        switch rest[0] {
        case "_all_docs": try await allDocs(request, db)
        case "_design_docs": try await allDocs(request, db, designOnly: true)
        case "_local_docs": try await localDocs(request, db)
        case "_changes": try await changes(request, db)
        case "_blipsync":
            // Here only when the WebSocket upgrade was not made: the access checks above passed.
            throw HTTPError(.badRequest, "bad_request",
                            "_blipsync is Couchbase Lite's replication endpoint: open a WebSocket to it with the subprotocol \(BLIPTuning.subprotocols.joined(separator: " or "))")
        case "_revs_diff": try await revsDiff(request, db)
        case "_missing_revs": try await missingRevs(request, db)
        case "_bulk_docs": try await bulkDocs(request, db)
        case "_bulk_get": try await bulkGet(request, db)
        case "_ensure_full_commit":
            guard request.method == .POST else { throw HTTPError.methodNotAllowed }
            try await request.response.sendJSON(.created, ["ok": true, "instance_start_time": .string(try await instanceStartTime(db))])
        case "_local":
            guard rest.count >= 2 else { throw HTTPError.notFound }
            try await localDocument(request, db, id: "_local/" + rest.dropFirst().joined(separator: "/"))
        case "_design":
            guard rest.count >= 2 else { throw HTTPError.notFound }
            if rest.count >= 3, rest[2].hasPrefix("_") {
                return try await designFunction(request, db, design: rest[1], path: Array(rest.dropFirst(2)))
            }
            try await documentOrAttachment(request, db, id: "_design/" + rest[1], attachment: Array(rest.dropFirst(2)))
        case _ where CouchServer.unimplementedDatabaseEndpoints.contains(rest[0]):
            throw HTTPError.notImplemented(rest[0])
        case "_view_cleanup":
            guard request.method == .POST else { throw HTTPError.onlyPOST }
            try requireWritable(request)
            _ = try await blocking { try db.cleanUpViewIndexes() }
            try await request.response.sendJSON(.accepted, ["ok": true])
        case "_compact":
            // As CouchDB: POST with a JSON content type; `_compact/DDOC` names a design document
            // that exists (its view indexes have no space of their own to give back here).
            guard request.method == .POST else { throw HTTPError.onlyPOST }
            guard request.headers.mediaType == "application/json" else {
                throw HTTPError(.unsupportedMediaType, "bad_content_type", "Content-Type must be application/json")
            }
            try requireWritable(request)
            if rest.count > 1, !rest[1].isEmpty {
                let design = "_design/" + rest[1]
                guard try await blocking({ try db.document(withID: design) }) != nil else { throw HTTPError(.notFound, "not_found", "missing") }
            } else {
                _ = try await blocking { try db.compact() }
            }
            try await request.response.sendJSON(.accepted, ["ok": true])
        case "_find": try await find(request, db)
        case "_explain": try await explain(request, db, name: name)
        case "_index": try await index(request, db, path: Array(rest.dropFirst()))
        case "_purge":
            guard request.method == .POST else { throw HTTPError.methodNotAllowed }
            try requireWritable(request)
            try await purge(request, db)
        case "_purged_infos_limit":
            try await limitSetting(request, reason: "`purged_infos_limit` must be positive integer",
                                   get: { try db.purgedInfosLimit }, set: { try db.setPurgedInfosLimit($0) })
        case "_revs_limit":
            // Stored with the database; saves prune history beyond it, as compaction does.
            try await limitSetting(request, reason: "_revs_limit must be a positive integer",
                                   get: { try db.revsLimit }, set: { try db.setRevsLimit($0) })
        case "_security":
            // Who may read and write the database (members) and change it (admins); see Security.swift.
            if request.method == .PUT {
                try requireWritable(request)
                guard case .object(let object) = try await request.body.json(limit: 64 * 1024) else {
                    throw HTTPError.badRequest("the security object must be a JSON object")
                }
                try await blocking { try db.setSecurityObject(object) }
                try await request.response.sendJSON(.ok, ["ok": true])
            } else {
                try await request.response.sendJSON(.ok, .object(try await blocking { try db.securityObject }))
            }
        default:
            let id = rest[0]
            if DocumentID.isLocal(id) {
                // `_local%2Fid`, as CouchDB writes it in Location headers.
                return try await localDocument(request, db, id: id)
            }
            if id.hasPrefix("_") && !id.hasPrefix(DocumentID.designPrefix) {
                throw HTTPError(.badRequest, "bad_request", "Only reserved document ids may start with underscore.")
            }
            try await documentOrAttachment(request, db, id: id, attachment: Array(rest.dropFirst()))
        }
    }

    /// CouchDB endpoints Sofa does not implement: answered 501 with their name, not with an
    /// error about database names or document ids that would send a client looking elsewhere.
    static let unimplementedServerEndpoints: Set<String> = [
        "_stats", "_node", "_membership", "_cluster_setup",
        "_config", "_utils", "_reshard", "_search_analyze", "_system", "_prometheus",
    ]
    static let unimplementedDatabaseEndpoints: Set<String> = [
        "_purged_infos",
        "_shards", "_sync_shards", "_partition", "_view_cleanup_all",
    ]


    /// A database's positive integer setting (`_revs_limit`, `_purged_infos_limit`): GET shows it,
    /// PUT of a bare number sets it.
    private func limitSetting(_ request: Request, reason: String, get: @escaping @Sendable () throws -> Int,
                              set: @escaping @Sendable (Int) throws -> Void) async throws {
        guard request.method == .PUT else {
            return try await request.response.sendJSON(.ok, .integer(Int64(try await blocking(get))))
        }
        try requireWritable(request)
        let body = try await request.body.collect(limit: 4096)
        // Not JSON, or not a number in range: the same 400 as CouchDB's.
        guard let limit = (try? JSONParser.parse(body))?.int64Value, limit >= 1, limit <= Int64(Int32.max) else {
            throw HTTPError.badRequest(reason)
        }
        try await blocking { try set(Int(limit)) }
        try await request.response.sendJSON(.ok, ["ok": true])
    }

    /// `POST /db/_purge`: `{"id": ["rev", …]}` → 201 `{"purge_seq": null, "purged": {"id": [purged revs]}}`,
    /// as CouchDB 3 answers (at most 100 documents and 1,000 revisions a request, as its defaults).
    private func purge(_ request: Request, _ db: Database) async throws {
        guard case .object(let body) = try await request.body.json(limit: 8 << 20) else {
            throw HTTPError.badRequest("Request body must be a JSON object")
        }
        guard body.count <= 100 else { throw HTTPError.badRequest("Exceeded maximum number of documents.") }
        var requested: [String: [RevisionID]] = [:]
        var total = 0
        for (id, value) in body {
            guard case .array(let revisions) = value else { throw HTTPError.badRequest("Document rev/s must be an array") }
            requested[id] = try revisions.map { revision in
                guard let text = revision.stringValue, let parsed = RevisionID(text) else { throw HTTPError.badRequest("Invalid rev format") }
                return parsed
            }
            total += revisions.count
        }
        guard total <= 1000 else { throw HTTPError.badRequest("Exceeded maximum number of revisions.") }
        let purging = requested
        let purged = try await blocking { try db.purge(purging) }
        let answer = JSONObject(body.map { id, _ in (id, JSONValue.array((purged[id] ?? []).map { .string($0.description) })) })
        try await request.response.sendJSON(.created, ["purge_seq": .null, "purged": .object(answer)])
    }

    /// `POST /db/_find`: a Mango query, through the index that fits it (`Database.find`).
    private func find(_ request: Request, _ db: Database) async throws {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        let query = try await mangoQuery(request)
        let started = DispatchTime.now()
        let result = try await blocking { try db.find(query) }
        var answer: JSONObject = ["docs": .array(result.documents.map { .object($0) }),
                                  "bookmark": .string(result.bookmark?.token ?? "nil")]
        if !result.warnings.isEmpty { answer["warning"] = .string(result.warnings.joined(separator: "\n")) }
        if query.executionStats {
            let elapsed = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e6
            answer["execution_stats"] = ["total_keys_examined": .integer(Int64(result.keysExamined)),
                                         "total_docs_examined": .integer(Int64(result.documentsExamined)),
                                         "total_quorum_docs_examined": 0, "results_returned": .integer(Int64(result.documents.count)),
                                         "execution_time_ms": .double(elapsed)]
        }
        try await request.response.sendJSON(.ok, .object(answer))
    }

    /// `POST /db/_explain`: the index a query would use, the range it would read, and why
    /// each other index was or was not chosen.
    private func explain(_ request: Request, _ db: Database, name: String) async throws {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        let query = try await mangoQuery(request)
        let plan = try await blocking { try query.plan(indexes: db.mangoIndexes()) }
        let fields: JSONValue = query.fields.map { .array($0.map { .string($0) }) } ?? []
        let sort = JSONObject(query.sort.map { ($0, .string(query.descending ? "desc" : "asc")) })
        var useIndex: [JSONValue] = []
        if let (ddoc, indexName) = query.useIndex { useIndex = [.string(ddoc)] + (indexName.map { [.string($0)] } ?? []) }
        let candidates: [JSONValue] = plan.candidates.filter { $0.index != plan.index }.map { candidate in
            ["index": .object(candidate.index?.listing ?? MangoIndex.allDocsListing),
             "analysis": ["usable": .bool(candidate.usable), "reasons": [["name": .string(candidate.reason)]], "covering": false]]
        }
        try await request.response.sendJSON(.ok, [
            "dbname": .string(name), "index": .object(plan.index?.listing ?? MangoIndex.allDocsListing), "partitioned": false,
            "selector": .object(SelectorNormalForm.normalize(query.selector.json)),
            "opts": ["use_index": .array(useIndex), "bookmark": .string(query.bookmark?.token ?? "nil"),
                     "limit": .integer(Int64(query.limit)), "skip": .integer(Int64(query.skip)), "sort": .object(sort),
                     "fields": fields, "partition": "", "r": 1, "conflicts": false, "stale": false, "update": true,
                     "stable": false, "execution_stats": .bool(query.executionStats), "allow_fallback": .bool(query.allowFallback)],
            "limit": .integer(Int64(query.limit)), "skip": .integer(Int64(query.skip)), "fields": fields,
            "index_candidates": .array(candidates),
            "mrargs": ["include_docs": true, "view_type": "map", "reduce": false, "start_key": .array(plan.startKey),
                       "end_key": .array(plan.endKey), "direction": .string(plan.descending ? "rev" : "fwd"),
                       "stable": false, "update": true, "conflicts": "undefined"],
            "covering": false,
        ])
    }

    /// `GET /db/_index` lists the indexes, `POST` defines one (in a design document, as
    /// CouchDB), `DELETE /db/_index/DDOC/json/NAME` removes one.
    private func index(_ request: Request, _ db: Database, path: [String]) async throws {
        switch (request.method, path.count) {
        case (.GET, 0), (.HEAD, 0):
            let indexes = try await blocking { try db.mangoIndexes() }
            let listed: [JSONValue] = [.object(MangoIndex.allDocsListing)] + indexes.map { .object($0.listing) }
            try await request.response.sendJSON(.ok, ["total_rows": .integer(Int64(listed.count)), "indexes": .array(listed)])
        case (.POST, 0):
            try requireWritable(request)
            let body = try await request.body.json(limit: ServerTuning.jsonBody)
            guard case .object(let object) = body else { throw HTTPError.badRequest("the index must be a JSON object") }
            let index = try MangoIndex(request: object)
            let created = try await blocking { try db.createIndex(index) }
            try await request.response.sendJSON(.ok, ["result": created ? "created" : "exists", "id": .string(index.designDocument),
                                                      "name": .string(index.name)])
        case (.DELETE, 3), (.DELETE, 4):
            // DDOC/json/NAME, the design document with or without its _design/ prefix.
            try requireWritable(request)
            let parts = path.count == 4 && path[0] == "_design" ? Array(path.dropFirst()) : path
            guard parts.count == 3, parts[1] == "json" else { throw HTTPError.notFound }
            let ddoc = parts[0].hasPrefix("_design/") ? parts[0] : "_design/" + parts[0]
            guard try await blocking({ try db.deleteIndex(designDocument: ddoc, name: parts[2]) }) else { throw HTTPError.notFound }
            try await request.response.sendJSON(.ok, ["ok": true])
        case (.GET, _), (.HEAD, _), (.POST, _), (.DELETE, _): throw HTTPError.notFound
        default: throw HTTPError.methodNotAllowed
        }
    }

    private func mangoQuery(_ request: Request) async throws -> MangoQuery {
        let body = try await request.body.json(limit: ServerTuning.jsonBody)
        guard case .object(let object) = body else { throw HTTPError.badRequest("the query must be a JSON object") }
        return try MangoQuery(object)
    }

    func database(_ name: String) async throws -> Database {
        try await blocking { try self.registry.database(name) }
    }

    /// CouchDB's `instance_start_time`: when the database was created, in seconds; constant
    /// for its life (CouchDB's replicator fails a checkpoint when it moves).
    func instanceStartTime(_ db: Database) async throws -> String {
        try await blocking { String(try db.instanceStartTime) }
    }

    private func databaseInfo(_ request: Request, name: String) async throws {
        try await request.response.sendJSON(.ok, .object(try await information(name)))
    }

    /// `GET /_dbs_info` (every database, `limit` and `skip`) and `POST /_dbs_info` with `keys`:
    /// each database's information, or `not_found`.
    func databasesInformation(_ request: Request) async throws {
        let names: [String]
        switch request.method {
        case .POST:
            guard let keys = try await request.body.json(limit: ServerTuning.jsonBody)["keys"]?.arrayValue else {
                throw HTTPError.badRequest("`keys` member must exist.")
            }
            names = keys.compactMap(\.stringValue)
        case .GET, .HEAD:
            let skip = Int(request.query("skip") ?? "") ?? 0, limit = Int(request.query("limit") ?? "") ?? Int.max
            names = Array(registry.names.dropFirst(skip).prefix(limit))
        default: throw HTTPError.methodNotAllowed
        }
        var rows: [JSONValue] = []
        for name in names {
            do {
                rows.append(["key": .string(name), "info": .object(try await information(name))])
            } catch let error as HTTPError where error.status == .notFound {
                rows.append(["key": .string(name), "error": "not_found"])
            }
        }
        try await request.response.sendJSON(.ok, .array(rows))
    }

    /// What `GET /{db}` answers.
    private func information(_ name: String) async throws -> JSONObject {
        let db = try await database(name)
        let counts = try await blocking { try db.counts() }
        var file = stat()
        let fileSize = stat(db.databaseFilePath, &file) == 0 ? Int64(file.st_size) : 0
        let start = try await instanceStartTime(db)
        return [
            "db_name": .string(name),
            "update_seq": CouchJSON.sequence(counts.lastSequence),
            "purge_seq": .string(String(try await blocking { try db.purgeSequence })),
            "doc_count": .integer(Int64(counts.documents)),
            "doc_del_count": .integer(Int64(counts.deleted)),
            "compact_running": false,
            "disk_format_version": 8,
            "sizes": ["file": .integer(fileSize), "external": .integer(fileSize), "active": .integer(fileSize)],
            "props": [:],
            "instance_start_time": .string(start),
            "cluster": ["q": .integer(Int64(try await blocking { try db.shardCount })), "n": 1, "w": 1, "r": 1],
            "sofa": ["public_uuid": .string(db.publicUUID), "read_only": .bool(db.isReadOnly || configuration.readOnly)],
        ]
    }

    /// An absolute URL for `Location`, from the request's Host header, every segment percent-encoded.
    func location(_ request: Request, _ segments: [String]) -> String {
        let host = request.headers["Host"].first ?? "\(configuration.host):\(configuration.port)"
        return "http://\(host)/" + segments.map(percentEncodedPathSegment).joined(separator: "/")
    }

    /// `GET /{db}/_all_docs`: live documents in id order.
    /// `GET /{db}/_local_docs` (and `POST` with `keys`): the `_local` documents, as CouchDB
    /// lists them (`total_rows` and `offset` null; `include_docs`, `startkey`/`endkey`,
    /// `descending`, `skip`, `limit`).
    private func localDocs(_ request: Request, _ db: Database) async throws {
        let query = try await ListingQuery(request)
        let (keys, includeDocs, descending, limit, skip) = (query.keys, query.includeDocs, query.descending, query.limit, query.skip)
        let (startKey, endKey, inclusiveEnd) = (query.startKey, query.endKey, query.inclusiveEnd)
        let rows = try await blocking { [keys] () -> [JSONValue] in
            var ids = try keys ?? db.localDocumentIDs().sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            if keys == nil {
                if descending { ids.reverse() }
                ids = ids.filter { id in
                    let afterStart = startKey.map { descending ? id <= $0 : id >= $0 } ?? true
                    let beforeEnd = endKey.map { descending ? (inclusiveEnd ? id >= $0 : id > $0) : (inclusiveEnd ? id <= $0 : id < $0) } ?? true
                    return afterStart && beforeEnd
                }
            } else if descending {
                ids.reverse()
            }
            return try ids.dropFirst(skip).prefix(limit).map { id in
                guard let document = try db.localDocument(withID: id) else { return ["key": .string(id), "error": "not_found"] }
                var row: JSONObject = ["id": .string(id), "key": .string(id), "value": ["rev": .string(document.rev)]]
                if includeDocs {
                    var doc: JSONObject = ["_id": .string(id), "_rev": .string(document.rev)]
                    for (key, value) in document.body { doc[key] = value }
                    row["doc"] = .object(doc)
                }
                return .object(row)
            }
        }
        let body = "{\"total_rows\":null,\"offset\":null,\"rows\":[\r\n" + rows.map { $0.jsonString() }.joined(separator: ",\r\n") + "\r\n]}\n"
        try await request.response.send(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"],
                                        body: Array(body.utf8))
    }

    /// `_all_docs`, or `_design_docs` (`designOnly`: the ids from `_design/` to `_design0`,
    /// counted among themselves), as CouchDB answers them.
    private func allDocs(_ request: Request, _ db: Database, designOnly: Bool = false) async throws {
        let query = try await ListingQuery(request)
        let (keys, includeDocs, conflicts, descending, limit, skip) = (query.keys, query.includeDocs, query.conflicts, query.descending,
                                                                       query.limit, query.skip)
        var startKey = query.startKey
        let (endKey, inclusiveEnd) = (query.endKey, query.inclusiveEnd)
        // The design documents' ids lie from `_design/` up to `_design0` ('0' follows '/').
        let range: (lower: String, upper: String)? = designOnly ? ("_design/", "_design0") : nil
        if let range, !descending, startKey.map({ $0 < range.lower }) ?? true { startKey = range.lower }
        func inRange(_ id: String) -> Bool { range.map { id >= $0.lower && id < $0.upper } ?? true }

        let response = request.response
        try await response.start(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"])
        let (total, before) = try await blocking { [startKey] () -> (Int, Int) in
            let total = try range.map { try db.liveDocumentCount(from: $0.lower, below: $0.upper) } ?? db.counts().documents
            // CouchDB's offset: the rows before the start in the listing's direction, then those skipped.
            guard let startKey else { return (total, 0) }
            let below = try db.liveDocumentCount(from: range?.lower, below: min(startKey, range?.upper ?? startKey))
            let upTo = try db.liveDocumentCount(from: range?.lower, below: range.map { min(startKey + "\u{0}", $0.upper) } ?? startKey + "\u{0}")
            return (total, descending ? total - upTo : below)
        }
        // As CouchDB: with `keys` there is no offset into the index.
        let offset = keys == nil ? String(before + skip) : "null"
        try await response.write("{\"total_rows\":\(total),\"offset\":\(offset),\"rows\":[\r\n")
        var first = true
        func emit(_ row: JSONValue) async throws {
            try await response.write((first ? "" : ",\r\n") + row.jsonString())
            first = false
        }
        @Sendable func row(_ id: String, _ rev: RevisionID) throws -> JSONValue {
            var row: JSONObject = ["id": .string(id), "key": .string(id), "value": ["rev": .string(rev.description)]]
            if includeDocs, let revision = try db.document(withID: id) {
                let tree = try db.revisionTree(of: id)
                var options = CouchFormat.Options()
                options.conflicts = conflicts
                row["doc"] = .object(try CouchFormat.render(revision, tree: tree, options: options, readBody: { _ in [] }).json)
            }
            return .object(row)
        }
        if let keys {
            // In the order given (reversed with `descending`), then `skip` and `limit`, as CouchDB.
            for key in (descending ? keys.reversed() : keys).dropFirst(skip).prefix(limit) {
                let value = try await blocking { () -> JSONValue in
                    guard let current = try db.currentRevision(of: key) else { return ["key": .string(key), "error": "not_found"] }
                    if current.deleted {
                        return ["id": .string(key), "key": .string(key),
                                "value": ["rev": .string(current.revID.description), "deleted": true], "doc": nil]
                    }
                    return try row(key, current.revID)
                }
                try await emit(value)
            }
        } else {
            // Pages of ids, so a huge database is never listed into memory at once.
            // (Descending order is rare: it collects the ids first, then streams rows.)
            var descendingRows: [DocumentSummary] = []
            if descending {
                var cursor: String?
                while true {
                    let page = try await blocking { [cursor] in try db.documents(after: cursor, limit: ServerTuning.descendingDocumentsPage) }
                    guard let last = page.last else { break }
                    descendingRows += page
                    cursor = last.docID
                }
                descendingRows.reverse()
            }
            var skipped = 0, sent = 0
            var cursor: String? = descending ? nil : startKey
            var inclusive = true
            pages: while sent < limit {
                let page: [DocumentSummary]
                if descending {
                    page = descendingRows
                    descendingRows = []
                } else {
                    let (from, including) = (cursor, inclusive)
                    page = try await blocking { try db.documents(after: from, including: including, limit: ServerTuning.documentsPage) }
                    inclusive = false
                }
                if page.isEmpty { break }
                cursor = page.last?.docID
                for summary in page {
                    if descending, let startKey, summary.docID > startKey { continue }
                    if !inRange(summary.docID) {
                        // Past the range in the listing's direction ends it; before it is passed over.
                        if let range, descending ? summary.docID < range.lower : summary.docID >= range.upper { break pages }
                        continue
                    }
                    if let endKey {
                        let beyond = descending
                            ? (inclusiveEnd ? summary.docID < endKey : summary.docID <= endKey)
                            : (inclusiveEnd ? summary.docID > endKey : summary.docID >= endKey)
                        if beyond { break pages }
                    }
                    if skipped < skip { skipped += 1; continue }
                    guard sent < limit else { break pages }
                    let value = try await blocking { try row(summary.docID, summary.revID) }
                    try await emit(value)
                    sent += 1
                }
            }
        }
        try await response.write("\r\n]}\n")
        try await response.finish()
    }
}

/// The parameters of a listing by document id (`_all_docs`, `_design_docs`, `_local_docs`), from
/// the query string, and `keys` from it or a POSTed body.
struct ListingQuery {
    let keys: [String]?
    let includeDocs: Bool
    let conflicts: Bool
    let descending: Bool
    let limit: Int
    let skip: Int
    let startKey: String?
    let endKey: String?
    let inclusiveEnd: Bool

    init(_ request: Request) async throws {
        switch request.method {
        case .GET, .HEAD: keys = try request.jsonQuery("keys")?.arrayValue?.compactMap(\.stringValue)
        case .POST: keys = try await request.body.json(limit: ServerTuning.jsonBody)["keys"]?.arrayValue?.compactMap(\.stringValue)
        default: throw HTTPError.methodNotAllowed
        }
        // CouchDB reads these as a view's (`true`/`True`…, else 400), not as a document's.
        includeDocs = try request.booleanQuery("include_docs") ?? false
        conflicts = try request.booleanQuery("conflicts") ?? false
        descending = try request.booleanQuery("descending") ?? false
        limit = try request.intQuery("limit") ?? Int.max
        skip = try request.intQuery("skip") ?? 0
        startKey = try (request.jsonQuery("startkey") ?? request.jsonQuery("start_key"))?.stringValue
        endKey = try (request.jsonQuery("endkey") ?? request.jsonQuery("end_key"))?.stringValue
        inclusiveEnd = try request.booleanQuery("inclusive_end") ?? true
    }
}
