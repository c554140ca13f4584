import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Requests whose answers CouchDB defines, sent to the live CouchDB 3.4.3 and to `sofa serve`
/// with the same documents: the same status, and the same rows or the same error.
@Suite struct CouchDBAnswerTests {
    let directory = TemporaryDirectory()

    /// Both sides with three documents and a design document of a map view and a reduce view.
    func twoServers() throws -> (couch: LiveCouchDB, couchDB: String, sofa: HTTPConnection, server: ServedDatabases) {
        let couch = LiveCouchDB.shared
        let name = try couch.newDatabase("answers")
        _ = try directory.makeDatabase("db.sofa")
        let server = try ServedDatabases([directory.appending("db.sofa")])
        let sofa = try server.connect()
        let design: JSONValue = ["views": ["n": ["map": "function (d) { if (d.n) emit(d.n, d.n); }"],
                                           "sum": ["map": "function (d) { if (d.n) emit(d.kind, d.n); }", "reduce": "_sum"]]]
        for (id, body) in [("a", ["n": 1, "kind": "x"] as JSONValue), ("b", ["n": 2, "kind": "y"]), ("c", ["n": 3, "kind": "x"]),
                           ("_design/v", design)] {
            #expect(try couch.request("PUT", "/\(name)/\(id)", body).status == 201)
            #expect(try sofa.json("PUT", "/db/\(id)", body).status == 201)
        }
        return (couch, name, sofa, server)
    }

    /// CouchDB reads a view's and `_all_docs`' booleans as `true`/`false` in any case and refuses
    /// anything else (`1`, `yes`) with 400; Sofa read `True` and `1` as false on `_all_docs`
    /// (no docs, ascending order) and refused `True` on views.
    @Test func booleansInQueryStringsAreReadAsCouchDBReadsThem() throws {
        let (couch, name, sofa, server) = try twoServers()
        defer { withExtendedLifetime(server) {} }
        let queries = [
            "_all_docs?include_docs=True", "_all_docs?descending=TRUE", "_all_docs?include_docs=1", "_all_docs?descending=yes",
            "_all_docs?inclusive_end=False&endkey=%22b%22", "_all_docs?conflicts=true&include_docs=True",
            "_design/v/_view/n?descending=True", "_design/v/_view/n?include_docs=TRUE", "_design/v/_view/n?include_docs=1",
            "_design/v/_view/sum?group=True", "_design/v/_view/sum?reduce=FALSE", "_design/v/_view/sum?group=yes",
            "_design/v/_view/n?inclusive_end=false&endkey=2",
        ]
        for query in queries {
            let theirs = try couch.request("GET", "/\(name)/\(query)")
            let ours = try sofa.json("GET", "/db/\(query)")
            #expect(ours.status == theirs.status, "\(query): Sofa \(ours.status) \(ours.text), CouchDB \(theirs.status) \(theirs.text)")
            if theirs.status == 200 {
                #expect(Self.comparable(ours.json) == Self.comparable(theirs.json), "\(query): Sofa \(ours.text), CouchDB \(theirs.text)")
            } else {
                #expect(ours.json == theirs.json, "\(query)")
            }
        }
    }

    /// A descending `_changes` with a limit ends at the last row's sequence and counts what the
    /// limit left out (Sofa said `"0"` and 0); a design document's `_info` names its collator's
    /// version, as CouchDB's does (ICU's root collator on both sides).
    @Test func descendingChangesAndDesignInfoAnswerAsCouchDBDoes() throws {
        let (couch, name, sofa, server) = try twoServers()
        defer { withExtendedLifetime(server) {} }
        for limit in [1, 2, 10] {
            let theirs = try #require(try couch.request("GET", "/\(name)/_changes?descending=true&limit=\(limit)").json)
            let ours = try #require(try sofa.json("GET", "/db/_changes?descending=true&limit=\(limit)").json)
            #expect(ours["pending"] == theirs["pending"], "limit \(limit): Sofa \(ours), CouchDB \(theirs)")
            // (Which rows: CouchDB's shards interleave their sequences, so its order is its own.)
            #expect(ours["results"]?.arrayValue?.count == theirs["results"]?.arrayValue?.count)
            for answer in [ours, theirs] {
                #expect(answer["last_seq"] == answer["results"]?.arrayValue?.last?["seq"], "limit \(limit): \(answer)")
            }
        }
        let theirs = try #require(try couch.request("GET", "/\(name)/_design/v/_info").json)
        let ours = try #require(try sofa.json("GET", "/db/_design/v/_info").json)
        #expect(Set(ours["view_index"]?.objectValue?.keys ?? []) == Set(theirs["view_index"]?.objectValue?.keys ?? []), "Sofa \(ours), CouchDB \(theirs)")
        #expect(ours["view_index"]?["collator_versions"] == theirs["view_index"]?["collator_versions"])
    }

    /// `filter=_view&view=DDOC/NAME`: the documents the view's map emits a row for (a deletion
    /// is mapped as CouchDB renders it); a missing view, design document or parameter is refused
    /// as CouchDB refuses it. (Sofa answered 400 to every such request.)
    @Test func changesFilteredByAViewAnswerAsCouchDBDoes() throws {
        let (couch, name, sofa, server) = try twoServers()
        defer { withExtendedLifetime(server) {} }
        let design: JSONValue = ["views": ["big": ["map": "function (d) { if (d.n > 1) emit(d._id, null); }"]]]
        #expect(try couch.request("PUT", "/\(name)/_design/f", design).status == 201)
        #expect(try sofa.json("PUT", "/db/_design/f", design).status == 201)
        let theirRev = try #require(try couch.request("GET", "/\(name)/c").json?["_rev"]?.stringValue)
        let ourRev = try #require(try sofa.json("GET", "/db/c").json?["_rev"]?.stringValue)
        #expect(try couch.request("DELETE", "/\(name)/c?rev=\(theirRev)").status == 200)
        #expect(try sofa.json("DELETE", "/db/c?rev=\(ourRev)").status == 200)
        for query in ["filter=_view&view=f/big", "filter=_view&view=f/none", "filter=_view&view=g/big", "filter=_view"] {
            let theirs = try couch.request("GET", "/\(name)/_changes?\(query)")
            let ours = try sofa.json("GET", "/db/_changes?\(query)")
            #expect(ours.status == theirs.status, "\(query): Sofa \(ours.status) \(ours.text), CouchDB \(theirs.status) \(theirs.text)")
            if theirs.status == 200 {
                let ids = { (answer: HTTPResponse) in Set(answer.json?["results"]?.arrayValue?.compactMap { $0["id"]?.stringValue } ?? []) }
                #expect(ids(ours) == ids(theirs) && ids(ours) == ["b"], "\(query): Sofa \(ours.text), CouchDB \(theirs.text)")
            } else {
                #expect(ours.json == theirs.json, "\(query)")
            }
        }
    }

    /// A deleted document's tombstone cannot be edited (CouchDB 409; Sofa extended the deleted
    /// branch with 201), only made again without `_rev`; `_compact` is POST-only with a JSON
    /// body type, and `_compact/DDOC` names a design document that exists.
    @Test func tombstoneEditsAndCompactionRequestsAnswerAsCouchDBDoes() throws {
        let (couch, name, sofa, server) = try twoServers()
        defer { withExtendedLifetime(server) {} }
        func both(_ method: String, _ path: String, _ body: JSONValue? = nil, headers given: [(String, String)]? = nil) throws -> JSONValue? {
            // A request without a body says its type, as clients do for _compact.
            let headers = given ?? (body == nil ? [("Content-Type", "application/json")] : [])
            let theirs = try couch.request(method, "/\(name)/\(path)", body, headers: headers)
            let ours = try sofa.json(method, "/db/\(path)", body, headers: headers)
            #expect(ours.status == theirs.status, "\(method) \(path): Sofa \(ours.status) \(ours.text), CouchDB \(theirs.status) \(theirs.text)")
            #expect(ours.json == theirs.json, "\(method) \(path): Sofa \(ours.text), CouchDB \(theirs.text)")
            return theirs.json
        }
        let first = try #require(try both("PUT", "d", ["a": 1])?["rev"]?.stringValue)
        let tombstone = try #require(try both("DELETE", "d?rev=\(first)")?["rev"]?.stringValue)
        _ = try both("PUT", "d", ["_rev": .string(tombstone), "a": 2])
        _ = try both("PUT", "d?rev=\(tombstone)", ["a": 2])
        _ = try both("POST", "_bulk_docs", ["docs": [["_id": "d", "_rev": .string(tombstone), "a": 5]]])
        _ = try both("DELETE", "d?rev=\(tombstone)")
        _ = try both("DELETE", "d?rev=\(first)")
        _ = try both("PUT", "d", ["a": 3])
        _ = try both("GET", "_compact")
        _ = try both("POST", "_compact", headers: [("Content-Type", "text/plain")])
        _ = try both("POST", "_compact/nope")
        _ = try both("POST", "_compact/v")
        _ = try both("POST", "_compact")
        _ = try both("GET", "_view_cleanup")
        _ = try both("POST", "_view_cleanup")
    }

    /// What CouchDB refuses in a view query, Sofa refuses with the same words: a reduce over
    /// `keys` without a group, and a key range that runs against the order asked for.
    @Test func viewQueriesCouchDBRefusesAreRefused() throws {
        let (couch, name, sofa, server) = try twoServers()
        defer { withExtendedLifetime(server) {} }
        let queries = [
            "sum?keys=%5B%22x%22,%22y%22%5D", "sum?keys=%5B%22x%22,%22y%22%5D&group=true", "sum?keys=%5B%22x%22,%22y%22%5D&reduce=false",
            "sum?keys=%5B%22x%22,%22y%22%5D&group_level=1", "sum?keys=%5B%22x%22,%22y%22%5D&group_level=0", "sum?keys=%5B%22x%22%5D", "sum?keys=%5B%22x%22,%22y%22%5D&group=true&group_level=1",
            "n?startkey=3&endkey=1", "n?startkey=3&endkey=1&descending=true", "n?startkey=1&endkey=3&descending=true",
            "n?startkey=2&endkey=2", "sum?startkey=%22y%22&endkey=%22x%22", "n?keys=%5B1%5D&startkey=3&endkey=1",
        ]
        for query in queries {
            let theirs = try couch.request("GET", "/\(name)/_design/v/_view/\(query)")
            let ours = try sofa.json("GET", "/db/_design/v/_view/\(query)")
            #expect(ours.status == theirs.status, "\(query): Sofa \(ours.status) \(ours.text), CouchDB \(theirs.status) \(theirs.text)")
            // (CouchDB adds a "ref" to some errors: a hash of where it threw, for its own log.)
            #expect(Self.comparable(ours.json) == Self.comparable(theirs.json), "\(query): Sofa \(ours.text), CouchDB \(theirs.text)")
        }
    }

    /// `_replicate` between databases of the server itself uses the credentials each URL gives,
    /// as CouchDB does: a wrong password is 500 `replication_auth_error`, none on an admins-only
    /// database 401, and nothing is copied; the right ones copy. (Sofa used to copy whatever the
    /// URL said, as the server's admin.)
    @Test func replicationsWithinTheServerUseTheCredentialsTheirURLsGive() throws {
        let couch = LiveCouchDB.shared
        let passwordFile = directory.appending("password")
        try "secret".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        let sofa = try server.connect()
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        let source = try couch.newDatabase("auth-src")
        #expect(try sofa.json("PUT", "/\(source)", headers: admin).status == 201)
        for n in 0..<3 {
            #expect(try couch.request("PUT", "/\(source)/doc-\(n)", ["n": .integer(Int64(n))]).status == 201)
            #expect(try sofa.json("PUT", "/\(source)/doc-\(n)", ["n": .integer(Int64(n))], headers: admin).status == 201)
        }
        func url(_ port: Int, _ credentials: String, _ name: String) -> String { "http://\(credentials)127.0.0.1:\(port)/\(name)" }
        for (label, credentials) in [("wrong", "admin:wrong@"), ("none", ""), ("right", "admin:secret@")] {
            let target = "auth-copy-\(label)-\(UUID().uuidString.prefix(6).lowercased())"
            func body(_ port: Int) -> JSONValue {
                ["source": .string(url(port, credentials, source)), "target": .string(url(port, "admin:secret@", target)), "create_target": true]
            }
            let theirs = try couch.request("POST", "/_replicate", body(couch.port))
            let ours = try sofa.json("POST", "/_replicate", body(server.port), headers: admin)
            #expect(ours.status == theirs.status, "\(label): Sofa \(ours.status) \(ours.text), CouchDB \(theirs.status) \(theirs.text)")
            #expect(ours.json?["error"] == theirs.json?["error"], "\(label): Sofa \(ours.text), CouchDB \(theirs.text)")
            if theirs.status != 200 {
                let reason = { (answer: HTTPResponse, port: Int) in answer.json?["reason"]?.stringValue?.replacingOccurrences(of: ":\(port)/", with: ":PORT/") }
                #expect(reason(ours, server.port) == reason(theirs, couch.port), "\(label)")
            }
            let copied = try sofa.json("GET", "/\(target)", headers: admin)
            let theirCopy = try couch.request("GET", "/\(target)")
            #expect(copied.status == theirCopy.status, "\(label): the copy is \(copied.status) here, \(theirCopy.status) there")
            #expect(copied.json?["doc_count"] == theirCopy.json?["doc_count"], "\(label)")
        }
    }

    /// The rows, without what differs by design between two servers (sequences, error refs).
    static func comparable(_ answer: JSONValue?) -> JSONValue? {
        guard case .object(var object)? = answer else { return answer }
        object["update_seq"] = nil
        object["ref"] = nil
        return .object(object)
    }
}
