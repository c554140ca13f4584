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

    /// The rows, without what differs by design between two servers (sequences).
    static func comparable(_ answer: JSONValue?) -> JSONValue? {
        guard case .object(var object)? = answer else { return answer }
        object["update_seq"] = nil
        return .object(object)
    }
}
