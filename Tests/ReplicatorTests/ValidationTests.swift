import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `validate_doc_update` (#29), side by side with the live CouchDB: the same design document,
/// the same writes from the admin, a user with a role and one without, the same answers; and
/// the same validator on Sofa's own write paths (CLI, replication, the mount).
extension CouchDBInteropTests {
    static let validator = """
        function(newDoc, oldDoc, userCtx, secObj) {
          if (newDoc._deleted) {
            if (userCtx.roles.indexOf('_admin') === -1) throw({unauthorized: 'Only admins delete.'});
            return;
          }
          if (!newDoc.address) throw({forbidden: 'Document must have an address.'});
          if (newDoc.owner && newDoc.owner !== userCtx.name && userCtx.roles.indexOf('_admin') === -1) {
            throw({forbidden: 'Only ' + newDoc.owner + ' may write this.'});
          }
          if (newDoc.editorsOnly && userCtx.roles.indexOf('editor') === -1) throw({unauthorized: 'Editors only.'});
          if (oldDoc && oldDoc.locked) throw({forbidden: {locked: true, by: oldDoc.lockedBy || null}});
          if (newDoc._attachments && newDoc._attachments['forbidden.txt']) throw({forbidden: 'No forbidden.txt.'});
          if (newDoc.db) { if (userCtx.db !== newDoc.db) throw({forbidden: 'Wrong db: ' + userCtx.db}); }
          if (newDoc.security && !(secObj.members && secObj.admins)) throw({forbidden: 'No security object.'});
          if (newDoc.crash) return newDoc.nothing.here;
          if (newDoc.throwString) throw 'just a string';
          const modern = [1, 2, 3].map((n) => n * 2).includes(6);
          if (!modern) throw({forbidden: 'ES2015 missing'});
        }
        """

    func validationScenario(_ send: Send, db: String, tag: String) throws -> [String] {
        var seen: [String] = []
        let (editor, plain) = ("ed-\(tag)", "pat-\(tag)")
        func request(_ method: String, _ path: String, _ body: JSONValue? = nil, as who: String?) throws -> HTTPResponse {
            let pair = who.map { "\($0):pw-\($0)" } ?? "admin:secret"
            return try send(method, path, body, [("Authorization", "Basic " + Data(pair.utf8).base64EncodedString())])
        }
        func record(_ label: String, _ response: HTTPResponse, keys: Set<String> = ["ok", "error", "reason", "id"]) {
            var body = response.json ?? .null
            if case .object(let object) = body { body = .object(object.filter { keys.contains($0) }) }
            if case .array(let rows) = body {
                body = .array(rows.map { row in .object((row.objectValue ?? [:]).filter { ["ok", "error", "reason", "id"].contains($0) }) })
            }
            seen.append("\(label): \(response.status) \(body.jsonString(.canonical))")
        }
        func rev(_ id: String) throws -> String { try request("GET", "/\(db)/\(id)", as: nil).json?["_rev"]?.stringValue ?? "" }

        record("create db", try request("PUT", "/\(db)", as: nil))
        for (name, roles) in [(editor, ["editor"]), (plain, [])] {
            _ = try request("PUT", "/_users/org.couchdb.user:\(name)", ["name": .string(name), "password": .string("pw-\(name)"), "type": "user",
                                                                          "roles": .array(roles.map { .string($0) })], as: nil)
        }
        record("public", try request("PUT", "/\(db)/_security", [:], as: nil))
        record("design doc", try request("PUT", "/\(db)/_design/rules", ["validate_doc_update": .string(Self.validator)], as: nil))
        record("no address", try request("PUT", "/\(db)/a", ["name": "x"], as: nil))
        record("address", try request("PUT", "/\(db)/a", ["address": "here"], as: nil))
        record("owner other user", try request("PUT", "/\(db)/b", ["address": "here", "owner": .string(editor)], as: plain))
        record("owner self", try request("PUT", "/\(db)/b", ["address": "here", "owner": .string(plain)], as: plain))
        record("editors only as plain", try request("PUT", "/\(db)/c", ["address": "here", "editorsOnly": true], as: plain))
        record("editors only as editor", try request("PUT", "/\(db)/c", ["address": "here", "editorsOnly": true], as: editor))
        record("db name", try request("PUT", "/\(db)/d", ["address": "here", "db": .string(db)], as: nil))
        record("security", try request("PUT", "/\(db)/d2", ["address": "here", "security": true], as: nil))
        record("lock", try request("PUT", "/\(db)/e", ["address": "here", "locked": true, "lockedBy": "me"], as: nil))
        record("locked update", try request("PUT", "/\(db)/e?rev=\(try rev("e"))", ["address": "there"], as: nil))
        // An exception: CouchDB's reason is "{[]}", Sofa's the exception's message; the status and error agree.
        record("crash", try request("PUT", "/\(db)/f", ["address": "here", "crash": true], as: nil), keys: ["error"])
        record("string thrown", try request("PUT", "/\(db)/g", ["address": "here", "throwString": true], as: nil))
        record("delete as plain", try request("DELETE", "/\(db)/a?rev=\(try rev("a"))", as: plain))
        record("delete as admin", try request("DELETE", "/\(db)/a?rev=\(try rev("a"))", as: nil))
        record("bulk", try request("POST", "/\(db)/_bulk_docs", ["docs": [["_id": "h1", "address": "x"], ["_id": "h2"],
                                                                          ["_id": "h3", "address": "y", "editorsOnly": true]]], as: plain))
        record("replicated", try request("POST", "/\(db)/_bulk_docs", [
            "new_edits": false,
            "docs": [["_id": "r1", "_rev": "2-aaaa", "address": "x", "_revisions": ["start": 2, "ids": ["aaaa", "bbbb"]]],
                     ["_id": "r2", "_rev": "1-cccc", "nothing": true]]], as: nil))
        record("replicated stored", try request("GET", "/\(db)/r1", as: nil))
        record("replicated refused", try request("GET", "/\(db)/r2", as: nil))
        // Attachments: a standalone upload and an inline one go through the validator too.
        let attached = try send("PUT", "/\(db)/b/forbidden.txt?rev=\(try rev("b"))", nil,
                                [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString()), ("Content-Type", "text/plain")])
        record("attachment refused", attached)
        record("inline refused", try request("PUT", "/\(db)/i", ["address": "x", "_attachments": ["forbidden.txt": ["content_type": "text/plain", "data": "aGk="]]],
                                             as: nil))
        record("inline allowed", try request("PUT", "/\(db)/i", ["address": "x", "_attachments": ["fine.txt": ["content_type": "text/plain", "data": "aGk="]]],
                                             as: nil))
        // Design documents are not validated (only their author's rights are checked).
        record("design doc update", try request("PUT", "/\(db)/_design/other", ["views": [:]], as: nil))
        // A validator replaced takes effect at once.
        record("replace validator", try request("PUT", "/\(db)/_design/rules?rev=\(try rev("_design/rules"))",
                                                ["validate_doc_update": "function(n) { throw({forbidden: 'closed'}); }"], as: nil))
        // CouchDB takes a replaced validator into its cache a moment later (seconds on a busy
        // machine): until then it may still accept with the old one. Throwaway ids until the new
        // one answers (Sofa's at the first).
        for probe in 0..<100 {
            guard try request("PUT", "/\(db)/probe-\(probe)", ["address": "here"], as: nil).status != 403 else { break }
            usleep(50_000)
        }
        record("closed", try request("PUT", "/\(db)/j", ["address": "here"], as: nil))
        record("remove validator", try request("DELETE", "/\(db)/_design/rules?rev=\(try rev("_design/rules"))", as: nil))
        // CouchDB drops a deleted validator from its cache a moment later: until then it may
        // still refuse with it. Asked again, it answers as the design documents now say.
        var open = try request("PUT", "/\(db)/j", ["nothing": true], as: nil)
        for _ in 0..<40 where open.status == 403 && open.json?["reason"] == "closed" {
            usleep(50_000)
            open = try request("PUT", "/\(db)/j", ["nothing": true], as: nil)
        }
        record("open again", open)
        return seen
    }

    @Test func validateDocUpdateAnswersAsCouchDBDoes() throws {
        try waitForCouchDBUsersValidation()
        let tag = UUID().uuidString.prefix(8).lowercased()
        let (expected, _) = try sideBySide { try validationScenario($0, db: "val-\(tag)", tag: tag) }
        #expect(expected.contains("no address: 403 {\"error\":\"forbidden\",\"reason\":\"Document must have an address.\"}"), "\(expected)")
    }
}

extension CouchDBInteropTests {
    static let filters: JSONObject = [
        "typed": "function(doc, req) { return doc.type === req.query.type; }",
        "mine": "function(doc, req) { return doc.owner === req.userCtx.name; }",
        "deletedToo": "(doc) => doc._deleted === true || doc.type === 'a'",
        "withAttachments": "function(doc) { return !!doc._attachments; }",
        "broken": "function(doc) { return doc.missing.field; }",
    ]

    func filterScenario(_ send: Send, db: String) throws -> [String] {
        var seen: [String] = []
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        func request(_ method: String, _ path: String, _ body: JSONValue? = nil) throws -> HTTPResponse {
            try send(method, path, body, admin)
        }
        // CouchDB's feed comes from several shards, so its order is not the order of writes: ids are compared sorted.
        func record(_ label: String, _ response: HTTPResponse) {
            let ids = response.json?["results"]?.arrayValue?.compactMap { $0["id"]?.stringValue }.sorted()
            let error = response.json?["error"].map { "\($0.stringValue ?? "") \(response.json?["reason"]?.stringValue ?? "")" }
            seen.append("\(label): \(response.status) \(ids.map { $0.joined(separator: ",") } ?? error ?? response.text)")
        }
        _ = try request("PUT", "/\(db)")
        _ = try request("PUT", "/\(db)/_design/f", ["filters": .object(Self.filters)])
        for (id, body) in [("a1", ["type": "a", "owner": "admin"]), ("b1", ["type": "b"]), ("a2", ["type": "a"]), ("gone", ["type": "c"])] as [(String, JSONObject)] {
            _ = try request("PUT", "/\(db)/\(id)", .object(body))
        }
        let gone = try request("GET", "/\(db)/gone").json?["_rev"]?.stringValue ?? ""
        _ = try request("DELETE", "/\(db)/gone?rev=\(gone)")
        _ = try send("PUT", "/\(db)/files/x.txt", nil, admin + [("Content-Type", "text/plain")])
        record("typed a", try request("GET", "/\(db)/_changes?filter=f/typed&type=a"))
        record("typed b", try request("GET", "/\(db)/_changes?filter=f/typed&type=b"))
        record("typed POST", try request("POST", "/\(db)/_changes?filter=f/typed&type=a", [:]))
        record("typed longpoll", try request("GET", "/\(db)/_changes?filter=f/typed&type=b&feed=longpoll"))
        let limited = try request("GET", "/\(db)/_changes?filter=f/typed&type=a&limit=1")
        seen.append("typed limit: \(limited.status) \(limited.json?["results"]?.arrayValue?.count ?? -1)")
        record("mine", try request("GET", "/\(db)/_changes?filter=f/mine"))
        record("deleted too", try request("GET", "/\(db)/_changes?filter=f/deletedToo"))
        record("attachments", try request("GET", "/\(db)/_changes?filter=f/withAttachments"))
        record("missing design", try request("GET", "/\(db)/_changes?filter=nope/typed"))
        record("missing function", try request("GET", "/\(db)/_changes?filter=f/nope"))
        record("bad name", try request("GET", "/\(db)/_changes?filter=bogus"))
        let broken = try request("GET", "/\(db)/_changes?filter=f/broken")
        seen.append("broken: \(broken.status)")
        return seen
    }

    @Test func filterFunctionsAnswerAsCouchDBDoes() throws {
        let name = "filt-\(UUID().uuidString.prefix(8).lowercased())"
        let (expected, server) = try sideBySide { try filterScenario($0, db: name) }
        #expect(expected.first == "typed a: 200 a1,a2", "the scenario filters something: \(expected)")

        // CouchDB's replicator with a filter, reading sofa serve: only what passes arrives.
        let target = "filtered-\(UUID().uuidString.prefix(8).lowercased())"
        let auth = "http://\(couch.user):\(couch.password)@127.0.0.1:\(couch.port)"
        let replicated = try couch.request("POST", "/_replicate", ["source": .string("http://admin:secret@127.0.0.1:\(server.port)/\(name)"),
                                                                   "target": .string("\(auth)/\(target)"), "create_target": true,
                                                                   "filter": "f/typed", "query_params": ["type": "a"]])
        #expect(replicated.status == 200, "\(replicated.text)")
        let ids = try couch.request("GET", "/\(target)/_all_docs").json?["rows"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(ids == ["a1", "a2"], "\(String(describing: ids))")

        // And sofa serve's own replicator, asked with POST /_replicate, runs the filter here.
        let pushedTarget = "filtered-push-\(UUID().uuidString.prefix(8).lowercased())"
        let login = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        let pushed = try server.connect().json("POST", "/_replicate", ["source": .string(name), "target": .string("\(auth)/\(pushedTarget)"),
                                                                      "create_target": true, "filter": "f/typed", "query_params": ["type": "b"]],
                                               headers: login)
        #expect(pushed.status == 200, "\(pushed.text)")
        let pushedIDs = try couch.request("GET", "/\(pushedTarget)/_all_docs").json?["rows"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(pushedIDs == ["b1"], "\(String(describing: pushedIDs))")
    }
}
