import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `_purge` and `_purged_infos_limit` of `sofa serve`, side by side with the live CouchDB.
extension CouchDBInteropTests {
    /// Runs the same requests against a server and returns what came back: status and body of each.
    func purgeScenario(_ request: (String, String, JSONValue?) throws -> HTTPResponse, _ db: String) throws -> [String] {
        var seen: [String] = []
        func record(_ label: String, _ response: HTTPResponse, keys: [String]? = nil) {
            var body = response.json ?? .null
            if let keys, case .object(let object) = body { body = .object(object.filter { keys.contains($0) }) }
            seen.append("\(label): \(response.status) \(body.jsonString(.canonical))")
        }
        record("create", try request("PUT", "/\(db)", nil), keys: ["ok"])
        record("branches", try request("POST", "/\(db)/_bulk_docs", ["new_edits": false, "docs": [
            ["_id": "doc", "_rev": "1-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "branch": "a"],
            ["_id": "doc", "_rev": "1-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", "branch": "b"],
            ["_id": "other", "_rev": "1-cccccccccccccccccccccccccccccccc", "n": 1],
        ]]))
        record("before", try request("GET", "/\(db)/doc?conflicts=true", nil))
        record("purge loser", try request("POST", "/\(db)/_purge", [
            "doc": ["1-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"], "missing": ["1-dddddddddddddddddddddddddddddddd"],
        ]))
        record("after", try request("GET", "/\(db)/doc?conflicts=true", nil))
        record("purge winner", try request("POST", "/\(db)/_purge", ["doc": ["1-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"]]))
        record("gone", try request("GET", "/\(db)/doc", nil), keys: ["error"])
        record("all_docs", try request("GET", "/\(db)/_all_docs", nil), keys: ["total_rows", "rows"])
        record("info", try request("GET", "/\(db)", nil), keys: ["doc_count", "doc_del_count"])
        record("limit", try request("GET", "/\(db)/_purged_infos_limit", nil))
        record("set limit", try request("PUT", "/\(db)/_purged_infos_limit", 2000))
        record("limit again", try request("GET", "/\(db)/_purged_infos_limit", nil))
        record("bad body", try request("POST", "/\(db)/_purge", [1]), keys: ["error"])
        record("bad revs", try request("POST", "/\(db)/_purge", ["other": "1-cccccccccccccccccccccccccccccccc"]), keys: ["error"])
        return seen
    }

    @Test func purgeAnswersAsCouchDBDoes() throws {
        let name = "purge-\(UUID().uuidString.prefix(8).lowercased())"
        let expected = try purgeScenario({ method, path, body in try couch.request(method, path, body) }, name)
        let server = try ServedDatabases(["--directory", directory.path])
        let connection = try server.connect()
        let actual = try purgeScenario({ method, path, body in try connection.json(method, path, body) }, name)
        #expect(actual.count == expected.count)
        for (mine, theirs) in zip(actual, expected) { #expect(mine == theirs) }
        // Nothing of the purged document is left to replicate.
        let db = try Database.open(at: directory.appending("\(name).sofa"))
        #expect(try db.currentRevision(of: "doc") == nil && db.changes().map(\.docID) == ["other"])
        #expect(try db.purgeSequence == 2)
    }
}

extension CouchDBInteropTests {
    @Test func dbsInfoAnswersAsCouchDBDoes() throws {
        let name = "infos-\(UUID().uuidString.prefix(8).lowercased())"
        func scenario(_ request: (String, String, JSONValue?) throws -> HTTPResponse) throws -> String {
            _ = try request("PUT", "/\(name)", nil)
            _ = try request("PUT", "/\(name)/one", ["n": 1])
            let answer = try request("POST", "/_dbs_info", ["keys": [.string(name), "no-such-db"]])
            let rows = (answer.json?.arrayValue ?? []).map { row -> JSONValue in
                var kept: JSONObject = ["key": row["key"] ?? .null]
                if let error = row["error"] { kept["error"] = error }
                if let info = row["info"] { kept["info"] = ["db_name": info["db_name"] ?? .null, "doc_count": info["doc_count"] ?? .null] }
                return .object(kept)
            }
            let missingKeys = try request("POST", "/_dbs_info", ["nokeys": true]).status
            return "\(answer.status) \(JSONValue.array(rows).jsonString(.canonical)) \(missingKeys)"
        }
        let expected = try scenario { method, path, body in try couch.request(method, path, body) }
        let server = try ServedDatabases(["--directory", directory.path])
        let connection = try server.connect()
        #expect(try scenario { method, path, body in try connection.json(method, path, body) } == expected)
        #expect(expected.hasPrefix("200 [{\"info\":{\"db_name\":\"\(name)\",\"doc_count\":1}"), "\(expected)")
    }
}

extension CouchDBInteropTests {
    /// `_security` is stored and shown as CouchDB does. A malformed one is refused with 400 and
    /// a reason, where CouchDB 3.4 answers 500 `no_majority`.
    @Test func securityObjectsAreStoredAsCouchDBStoresThem() throws {
        let name = "security-\(UUID().uuidString.prefix(8).lowercased())"
        let objects: [JSONValue] = [["admins": ["names": ["ada"], "roles": []], "members": ["names": [], "roles": ["readers"]]],
                                    ["other": 1], [:]]
        func scenario(_ request: (String, String, JSONValue?) throws -> HTTPResponse) throws -> [String] {
            _ = try request("PUT", "/\(name)", nil)
            var seen = ["fresh \(try request("GET", "/\(name)/_security", nil).json?.jsonString(.canonical) ?? "-")"]
            for object in objects {
                let put = try request("PUT", "/\(name)/_security", object)
                let shown = try request("GET", "/\(name)/_security", nil)
                seen.append("\(put.status) \(put.text.trimmingCharacters(in: .whitespacesAndNewlines)) \(shown.json?.jsonString(.canonical) ?? "-")")
            }
            return seen
        }
        let expected = try scenario { method, path, body in try couch.request(method, path, body) }
        let server = try ServedDatabases(["--directory", directory.path])
        let connection = try server.connect()
        let actual = try scenario { method, path, body in try connection.json(method, path, body) }
        #expect(actual == expected)
        for bad: JSONValue in [["admins": "x"], ["members": ["names": "bob"]], ["members": ["names": [1]]], [1]] {
            let refused = try connection.json("PUT", "/\(name)/_security", bad)
            #expect(refused.status == 400 && refused.json?["reason"]?.stringValue?.contains("must be") == true, "\(bad): \(refused.text)")
        }
        #expect(try connection.json("GET", "/\(name)/_security").json == [:], "a refused object changes nothing (the last one stored was {})")
    }
}
