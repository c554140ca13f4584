import DocumentModel
import DocumentStore
import Foundation
import NIOCore
import NIOHTTP1

/// CouchDB's sequences as Sofa serves them.
enum CouchJSON {
    /// Sequences are decimal strings, opaque to clients as CouchDB's are.
    static func sequence(_ value: Int64) -> JSONValue { .string(String(value)) }

    /// Reads a `since` / sequence value: a number, a numeric string, `"now"` is handled by callers.
    static func parseSequence(_ text: String) throws -> Int64 {
        // Accept CouchDB-style "N-opaque" too, from clients that mix servers up.
        let digits = text.split(separator: "-").first.map(String.init) ?? text
        guard let value = Int64(digits), value >= 0 else {
            throw HTTPError(.badRequest, "bad_request", "Malformed sequence supplied in 'since' parameter.")
        }
        return value
    }
}

extension CouchServer {
    // MARK: - _changes

    private struct ChangesQuery {
        var feed = "normal"
        var since: Int64 = 0
        var limit = Int.max
        var descending = false
        var allLeaves = false
        var includeDocs = false
        var conflicts = false
        var docIDs: Set<String>?
        var designOnly = false
        var selector: Selector?
        var function: FilterFunction?
        var heartbeat: Double?
        var timeout: Double?
    }

    func changes(_ request: Request, _ db: Database) async throws {
        var query = ChangesQuery()
        var body: JSONValue?
        switch request.method {
        case .GET, .HEAD: break
        case .POST:
            let bytes = try await request.body.collect(limit: ServerTuning.jsonBody)
            if !bytes.isEmpty {
                do { body = try JSONParser.parse(bytes) } catch { throw HTTPError.invalidJSON }
            }
        default: throw HTTPError.methodNotAllowed
        }
        query.feed = request.query("feed") ?? "normal"
        guard ["normal", "longpoll", "continuous"].contains(query.feed) else {
            throw HTTPError.badRequest("Supported `feed` types: normal, continuous, longpoll")
        }
        // Last-Event-ID: where an EventSource client that reconnects left off; as a query
        // parameter it wins over `since`, as in CouchDB.
        if let since = request.query("last-event-id") ?? request.query("since") ?? body?["since"]?.stringValue
            ?? request.headers["Last-Event-ID"].first {
            query.since = since == "now" ? try await blocking { try db.lastSequence } : try CouchJSON.parseSequence(since)
        } else if let since = body?["since"]?.int64Value {
            query.since = since
        }
        query.limit = try request.intQuery("limit") ?? Int.max
        query.descending = request.flag("descending")
        query.allLeaves = request.query("style") == "all_docs"
        query.includeDocs = request.flag("include_docs")
        query.conflicts = request.flag("conflicts")
        if let heartbeat = request.query("heartbeat") {
            query.heartbeat = heartbeat == "true" ? 60 : (Double(heartbeat).map { max($0, 50) / 1000 })
        }
        query.timeout = request.query("timeout").flatMap(Double.init).map { min($0 / 1000, ServerTuning.maximumFeedTimeout) }
        switch request.query("filter") {
        case nil: break
        case "_doc_ids":
            let list = try request.jsonQuery("doc_ids")?.arrayValue ?? body?["doc_ids"]?.arrayValue
            guard let list else { throw HTTPError.badRequest("filter=_doc_ids needs doc_ids") }
            query.docIDs = Set(list.compactMap(\.stringValue))
        case "_design":
            query.designOnly = true
        case "_selector":
            guard let value = body?["selector"] else { throw HTTPError.badRequest("filter=_selector needs a selector in the body") }
            do { query.selector = try Selector(value) } catch { throw HTTPError(.badRequest, "bad_request", "\(error)") }
        case "_view":
            // A view's map as the filter: the documents it emits a row for (CouchDB's words).
            guard let view = request.query("view") ?? body?["view"]?.stringValue else {
                throw HTTPError.badRequest("`view` filter parameter is not provided.")
            }
            query.function = try await filterFunction(view, request, db, body: body, view: true)
        case let name?:
            query.function = try await filterFunction(name, request, db, body: body)
        }
        switch query.feed {
        case "continuous": try await continuousFeed(request, db, query)
        default: try await normalFeed(request, db, query)
        }
    }

    private func passes(_ change: Change, _ query: ChangesQuery, _ db: Database) throws -> Bool {
        if let ids = query.docIDs, !ids.contains(change.docID) { return false }
        if query.designOnly && !change.docID.hasPrefix(DocumentID.designPrefix) { return false }
        if let selector = query.selector {
            guard let revision = try db.revisionIfPresent(change.revID, of: change.docID) else { return false }  // replaced since
            return selector.matches(revision.selectable)
        }
        if let function = query.function {
            guard let revision = try db.revisionIfPresent(change.revID, of: change.docID) else { return false }  // replaced since
            return try function.passes(revision, in: db)
        }
        return true
    }

    /// Up to `limit` changes after `since` that pass the filter, and the sequence read up to.
    private func collectChanges(_ db: Database, since: Int64, limit: Int, _ query: ChangesQuery) throws -> (rows: [Change], readTo: Int64) {
        var rows: [Change] = []
        var cursor = since
        while rows.count < limit {
            let page = try db.changes(since: cursor, limit: ServerTuning.changesPage)
            guard let last = page.last else { break }
            for change in page where try passes(change, query, db) {
                rows.append(change)
                if rows.count == limit { return (rows, change.sequence) }
            }
            cursor = last.sequence
        }
        return (rows, cursor)
    }

    private func changeRow(_ change: Change, _ db: Database, _ query: ChangesQuery) throws -> JSONValue {
        var row: JSONObject = ["seq": CouchJSON.sequence(change.sequence), "id": .string(change.docID)]
        var revs: [RevisionID] = [change.revID]
        var tree: RevisionTree?
        if query.allLeaves || query.includeDocs {
            tree = try db.revisionTreeIfPresent(of: change.docID)
            if query.allLeaves, let leaves = tree?.leaves, !leaves.isEmpty { revs = leaves.map(\.id) }
        }
        row["changes"] = .array(revs.map { ["rev": .string($0.description)] })
        if change.deleted { row["deleted"] = true }
        if query.includeDocs {
            if let tree, let revision = try db.revisionIfPresent(change.revID, of: change.docID) {
                var options = CouchFormat.Options()
                options.conflicts = query.conflicts
                row["doc"] = .object(try CouchFormat.render(revision, tree: tree, options: options, readBody: { _ in [] }).json)
            } else {
                row["doc"] = .null
            }
        }
        return .object(row)
    }

    /// `feed=normal` and `feed=longpoll`, laid out byte for byte as CouchDB does.
    private func normalFeed(_ request: Request, _ db: Database, _ query: ChangesQuery) async throws {
        var since = query.since
        let response = request.response
        // Started before the first rows are written: a filter function that fails on the first
        // page is then an error answer (500), as CouchDB's, not a cut-off feed.
        var started = false
        func start() async throws {
            guard !started else { return }
            started = true
            try await response.start(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"])
            try await response.write("{\"results\":[\n")
        }
        if query.feed == "longpoll" {
            // Wait for a change that passes the filter, or for the timeout. With a heartbeat, as
            // CouchDB: the answer starts at once, a newline goes out at each beat, and only a
            // change (or the client leaving) ends the wait.
            let deadline = query.heartbeat == nil ? ContinuousClock.now + .seconds(query.timeout ?? ServerTuning.defaultFeedTimeout) : nil
            var lastBeat = ContinuousClock.now
            if query.heartbeat != nil { try await start() }
            while deadline.map({ ContinuousClock.now < $0 }) ?? true {
                let from = since
                // The stream's position before the read: a commit after it wakes the wait below.
                let (position, rows, readTo) = try await blocking { () -> (UInt64, [Change], Int64) in
                    let position = db.changeStream.current
                    let (rows, readTo) = try self.collectChanges(db, since: from, limit: 1, query)
                    return (position, rows, readTo)
                }
                if !rows.isEmpty { break }
                since = readTo
                if let heartbeat = query.heartbeat, ContinuousClock.now - lastBeat >= .seconds(heartbeat) {
                    try await response.write("\n")
                    lastBeat = ContinuousClock.now
                }
                let nextBeat = query.heartbeat.map { lastBeat + .seconds($0) }
                await db.changeStream.next(after: position, until: [deadline, nextBeat].compactMap { $0 }.min())
            }
        }
        var lastSeq = since
        var sent = 0
        var pendingDescending = 0
        if query.descending {
            // Rare: the filtered changes are listed newest first from memory. As CouchDB: the
            // last sequence is the last row's, and what the limit left out is pending.
            let (rows, last, left) = try await blocking { [since] () -> ([UInt8], Int64?, Int) in
                var all = try self.collectChanges(db, since: since, limit: Int.max, query).rows
                all.reverse()
                let shown = all.prefix(query.limit)
                let bytes = try shown.enumerated().reduce(into: [UInt8]()) { bytes, entry in
                    if entry.offset > 0 { bytes += Array(",\r\n".utf8) }
                    bytes += try self.changeRow(entry.element, db, query).serialized()
                }
                return (bytes, shown.last?.sequence, all.count - shown.count)
            }
            if let last { lastSeq = last }
            pendingDescending = left
            try await start()
            try await response.write(rows)
        } else {
            // Page by page, each page one chunk, so 100,000 changes never sit in memory at once.
            while sent < query.limit {
                let (from, count, first) = (lastSeq, min(500, query.limit - sent), sent == 0)
                let (bytes, rows, readTo) = try await blocking { () -> ([UInt8], Int, Int64) in
                    let (changes, readTo) = try self.collectChanges(db, since: from, limit: count, query)
                    var bytes: [UInt8] = []
                    for (index, change) in changes.enumerated() {
                        if index > 0 || !first { bytes += Array(",\r\n".utf8) }
                        bytes += try self.changeRow(change, db, query).serialized()
                    }
                    return (bytes, changes.count, readTo)
                }
                lastSeq = max(lastSeq, readTo)
                if rows == 0 { break }
                try await start()
                try await response.write(bytes)
                sent += rows
            }
        }
        let from = lastSeq
        let pending = query.descending ? pendingDescending : try await blocking { try db.changeCount(since: from) }
        try await start()
        try await response.write("\n],\n\"last_seq\":\"\(lastSeq)\",\"pending\":\(pending)}\n")
        try await response.finish()
    }

    /// `feed=continuous`: one change per line as it happens, blank lines as heartbeats,
    /// and a `last_seq` line when `timeout` passes with nothing new.
    private func continuousFeed(_ request: Request, _ db: Database, _ query: ChangesQuery) async throws {
        let response = request.response
        try await response.start(.ok, headers: ["Content-Type": "application/json"])
        var since = query.since
        var sent = 0
        let timeout = query.timeout ?? (query.heartbeat == nil ? ServerTuning.defaultFeedTimeout : nil)
        var lastActivity = ContinuousClock.now
        var lastHeartbeat = ContinuousClock.now
        while true {
            // The stream's position before the read: a commit after it wakes the wait below.
            let (position, current) = try await blocking { (db.changeStream.current, try db.lastSequence) }
            if current > since {
                let (from, remaining) = (since, query.limit - sent)
                let (lines, readTo, count) = try await blocking { () -> ([UInt8], Int64, Int) in
                    let (rows, readTo) = try self.collectChanges(db, since: from, limit: min(remaining, 500), query)
                    var lines: [UInt8] = []
                    for change in rows { lines += try self.changeRow(change, db, query).serialized() + [0x0A] }
                    return (lines, readTo, rows.count)
                }
                since = readTo
                if count > 0 {
                    try await response.write(lines)
                    sent += count
                    lastActivity = ContinuousClock.now
                    lastHeartbeat = lastActivity
                    if sent >= query.limit { break }
                    continue
                }
            }
            let now = ContinuousClock.now
            if let timeout, now - lastActivity >= .seconds(timeout) { break }
            if let heartbeat = query.heartbeat, now - lastHeartbeat >= .seconds(heartbeat) {
                try await response.write("\n")
                lastHeartbeat = now
            }
            let wakeAt = [timeout.map { lastActivity + .seconds($0) }, query.heartbeat.map { lastHeartbeat + .seconds($0) }]
            await db.changeStream.next(after: position, until: wakeAt.compactMap { $0 }.min())
        }
        try await response.write("{\"last_seq\":\"\(since)\",\"pending\":0}\n")
        try await response.finish()
    }

    // MARK: - _revs_diff

    func revsDiff(_ request: Request, _ db: Database) async throws {
        let differences = try await revisionsMissing(request, db)
        let result = JSONObject(differences.map { id, entry in
            var answer: JSONObject = ["missing": .array(entry.missing.map { .string($0.description) })]
            if !entry.possibleAncestors.isEmpty {
                answer["possible_ancestors"] = .array(entry.possibleAncestors.map { .string($0.description) })
            }
            return (id, .object(answer))
        })
        try await request.response.sendJSON(.ok, .object(result))
    }

    /// `POST /{db}/_missing_revs`: CouchDB's older form of `_revs_diff`, the missing revisions only.
    func missingRevs(_ request: Request, _ db: Database) async throws {
        guard request.method == .POST else { throw HTTPError(.methodNotAllowed, "method_not_allowed", "Only POST allowed") }
        let differences = try await revisionsMissing(request, db)
        let missing = JSONObject(differences.map { id, entry in (id, JSONValue.array(entry.missing.map { .string($0.description) })) })
        try await request.response.sendJSON(.ok, ["missing_revs": .object(missing)])
    }

    /// The revisions a body of `{id: [rev, …]}` names that this database lacks, by document.
    private func revisionsMissing(_ request: Request, _ db: Database) async throws -> [(id: String, missing: MissingRevisions)] {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        guard case .object(let asked) = try await request.body.json(limit: ServerTuning.jsonBody) else {
            throw HTTPError.badRequest("Request body must be a JSON object")
        }
        let revs = try asked.map { id, value -> (id: String, revs: [RevisionID]) in
            guard let list = value.arrayValue else { throw HTTPError.badRequest("revs for \(id) must be a list") }
            return (id, try list.map { item -> RevisionID in
                guard let text = item.stringValue, let rev = RevisionID(text) else { throw HTTPError.badRequest("Invalid rev format") }
                return rev
            })
        }
        return try await blocking { try db.revsDiff(revs) }
    }

    // MARK: - _bulk_docs

    func bulkDocs(_ request: Request, _ db: Database) async throws {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        try requireWritable(request)
        guard request.headers.mediaType == "application/json" || request.headers.mediaType == nil else {
            throw HTTPError(.unsupportedMediaType, "bad_content_type", "Content-Type must be application/json", closeConnection: true)
        }
        let body = try await request.body.json(limit: ServerTuning.jsonBody)
        guard let list = body["docs"]?.arrayValue else { throw HTTPError.badRequest("POST body must include `docs` parameter.") }
        let newEdits = body["new_edits"]?.boolValue ?? true
        var documents: [(id: String, document: IncomingDocument)] = []
        for value in list {
            var document = try IncomingDocument(value)
            let id = document.id ?? UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
            document.id = id
            documents.append((id, document))
        }
        if newEdits, body["all_or_nothing"]?.boolValue == true, !documents.isEmpty {
            // CouchDB 3 does not do all-or-nothing: it answers 417 for each document and writes
            // none (CouchDB-Python's suite expects that answer); not saving a part is what matters.
            let refused: [JSONValue] = documents.map { entry in
                ["id": .string(entry.id), "rev": .string(entry.document.rev?.description ?? "0-"),
                 "error": "not_implemented", "reason": "all_or_nothing is not supported"]
            }
            return try await request.response.sendJSON(.expectationFailed, .array(refused))
        }
        let results = try await storeDocuments(documents, received: [:], db: db, newEdits: newEdits)
        if !newEdits {
            // As CouchDB: nothing for what was stored, an entry for each revision refused.
            let refused: [JSONValue] = zip(documents, results).compactMap { entry, result in
                guard case .failure(let error) = result else { return nil }
                return ["id": .string(entry.id), "rev": entry.document.rev.map { .string($0.description) } ?? .null,
                        "error": .string(error.error), "reason": error.reasonJSON]
            }
            return try await request.response.sendJSON(.created, .array(refused))
        }
        let rows: [JSONValue] = zip(documents, results).map { entry, result in
            switch result {
            case .success(let rev): ["ok": true, "id": .string(entry.id), "rev": .string(rev.description)]
            case .failure(let error): ["id": .string(entry.id), "error": .string(error.error), "reason": error.reasonJSON]
            }
        }
        try await request.response.sendJSON(.created, .array(rows))
    }

    // MARK: - _bulk_get

    private struct BulkGetResult {
        let id: String
        var docs: [Result<CouchFormat.Rendered, OpenRevMissing>]
        /// The doc does not exist and no rev was asked for.
        var missingUndefined = false
    }

    func bulkGet(_ request: Request, _ db: Database) async throws {
        guard request.method == .POST else { throw HTTPError.methodNotAllowed }
        let body = try await request.body.json(limit: ServerTuning.jsonBody)
        guard let list = body["docs"]?.arrayValue else { throw HTTPError.badRequest("Missing JSON list of 'docs'.") }
        var base = try renderOptions(request)
        base.revisions = request.flag("revs") || body["revs"]?.boolValue == true
        let attachments = request.flag("attachments") || body["attachments"]?.boolValue == true
        let latest = request.flag("latest") || body["latest"]?.boolValue == true
        // CouchDB answers JSON whenever the client takes it (no Accept header, `*/*`), and
        // multipart only to one that takes multipart/mixed (or multipart/related) but not JSON.
        let mixed = request.acceptsContentType("multipart/mixed")
        let multipartType = mixed ? "multipart/mixed" : "multipart/related"
        let multipart = !request.acceptsContentType("application/json") && (mixed || request.acceptsContentType("multipart/related"))
        let results = try await blocking { [base] () -> [BulkGetResult] in
            try list.map { item in
                guard let id = item["id"]?.stringValue else { throw HTTPError.badRequest("Document id must be a string") }
                var options = base
                options.attsSince = item["atts_since"]?.arrayValue?.compactMap { $0.stringValue.flatMap(RevisionID.init) } ?? []
                options.bodies = attachments || !options.attsSince.isEmpty ? (multipart ? .follows : .inline) : .stubs
                let rev = item["rev"]?.stringValue
                guard let tree = try db.revisionTreeIfPresent(of: id) else {
                    if let rev, let parsed = RevisionID(rev) {
                        return BulkGetResult(id: id, docs: [.failure(OpenRevMissing(rev: parsed))])
                    }
                    return BulkGetResult(id: id, docs: [], missingUndefined: true)
                }
                var revs: [RevisionID]
                if let rev {
                    guard let parsed = RevisionID(rev) else { throw HTTPError.badRequest("Invalid rev format") }
                    revs = latest ? tree.latestLeaves(from: parsed) : [parsed]
                } else {
                    revs = tree.winner.map { [$0.id] } ?? []
                }
                return BulkGetResult(id: id, docs: try revs.map { rev in
                    guard let revision = try db.revisionIfPresent(rev, of: id) else { return .failure(OpenRevMissing(rev: rev)) }
                    return .success(try CouchFormat.render(revision, tree: tree, options: options) { try self.readWholeBody($0, db, id: id) })
                })
            }
        }
        let response = request.response
        if !multipart {
            let rows: [JSONValue] = results.map { result in
                let docs: [JSONValue] = result.missingUndefined
                    ? [["error": ["id": .string(result.id), "rev": "undefined", "error": "not_found", "reason": "missing"]]]
                    : result.docs.map { doc in
                        switch doc {
                        case .success(let rendered): ["ok": .object(rendered.json)]
                        case .failure(let missing):
                            ["error": ["id": .string(result.id), "rev": .string(missing.rev.description), "error": "not_found", "reason": "missing"]]
                        }
                    }
                return ["id": .string(result.id), "docs": .array(docs)]
            }
            return try await response.sendJSON(.ok, ["results": .array(rows)])
        }
        let boundary = makeBoundary()
        try await response.start(.ok, headers: ["Content-Type": "\(multipartType); boundary=\"\(boundary)\""])
        for result in results {
            if result.missingUndefined {
                let json = JSONValue.object(["rev": "undefined", "reason": "missing", "id": .string(result.id), "error": "not_found"]).jsonString()
                try await response.write("--\(boundary)\r\nContent-Type: application/json; error=\"true\"\r\n\r\n\(json)\r\n")
            }
            for doc in result.docs {
                switch doc {
                case .success(let rendered):
                    try await writeMixedPart(rendered, db: db, id: result.id, boundary: boundary, response: response)
                case .failure(let missing):
                    let json = JSONValue.object(["rev": .string(missing.rev.description), "error": "not_found", "reason": "missing"]).jsonString()
                    try await response.write("--\(boundary)\r\nContent-Type: application/json; error=\"true\"\r\n\r\n\(json)\r\n")
                }
            }
        }
        try await response.write("--\(boundary)--\r\n")
        try await response.finish()
    }
}

extension Revision {
    /// The document as a selector sees it: its properties with `_id`, `_rev` and `_deleted`.
    var selectable: JSONObject {
        var document = properties
        document["_id"] = .string(docID)
        document["_rev"] = .string(revID.description)
        if deleted { document["_deleted"] = true }
        return document
    }
}
