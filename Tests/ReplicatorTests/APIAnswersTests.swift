import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// #28 item 3: answers client libraries' suites found different from CouchDB's, side by side.
extension CouchDBInteropTests {
    func apiScenario(_ send: Send, db: String) throws -> [String] {
        var seen: [String] = []
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        func request(_ method: String, _ path: String, _ body: JSONValue? = nil) throws -> HTTPResponse { try send(method, path, body, admin) }
        // Revision ids included: they are CouchDB's (#28 item 4).
        func record(_ label: String, _ response: HTTPResponse) {
            seen.append("\(label): \(response.status) " + (response.json ?? .null).jsonString(.canonical))
        }
        _ = try request("PUT", "/\(db)")
        var revs: [String: String] = [:]
        for id in ["a", "b", "c", "d"] { revs[id] = try request("PUT", "/\(db)/\(id)", [:]).json?["rev"]?.stringValue }
        // _all_docs with keys: skip, limit and descending apply; there is no offset.
        record("keys skip limit", try request("POST", "/\(db)/_all_docs?limit=2&skip=1", ["keys": ["d", "a", "zz", "b"]]))
        record("keys descending", try request("POST", "/\(db)/_all_docs?descending=true", ["keys": ["d", "a"]]))
        record("keys GET limit", try request("GET", "/\(db)/_all_docs?keys=%5B%22d%22,%22a%22,%22b%22%5D&limit=2"))
        // _missing_revs, CouchDB's older _revs_diff.
        record("missing revs", try request("POST", "/\(db)/_missing_revs", ["a": [.string(revs["a"]!), "2-abc"], "zz": ["1-x"], "b": []]))
        record("missing revs bad rev", try request("POST", "/\(db)/_missing_revs", ["a": ["bad"]]))
        record("missing revs GET", try request("GET", "/\(db)/_missing_revs"))
        // The shard count a database is made with is read back from its info; a bad one is refused.
        func cluster(_ name: String) throws -> String {
            let info = try request("GET", "/\(name)")
            return "\(info.status) " + (info.json?["cluster"] ?? .null).jsonString(.canonical)
        }
        seen.append("default cluster: " + (try cluster(db)))
        record("PUT q=16", try request("PUT", "/\(db)-q16?q=16"))
        seen.append("q=16 cluster: " + (try cluster("\(db)-q16")))
        record("PUT q=1", try request("PUT", "/\(db)-q1?q=1"))
        seen.append("q=1 cluster: " + (try cluster("\(db)-q1")))
        // _explain shows the selector in CouchDB's normal form.
        let selectors = [#"{"a":1}"#, #"{"b":2,"a":{"$gt":1}}"#, #"{"a":{"b":1,"$gt":2}}"#, #"{"$not":{"a":1,"b":2}}"#,
                         #"{"$nor":[{"a":1},{"b":{"$gt":2}}]}"#, #"{"a":{"$not":{"$gt":1,"$lt":3}}}"#,
                         #"{"$not":{"a":{"$exists":true}}}"#, #"{"a":{"$not":{"$regex":"x"}}}"#, #"{"$not":{"$not":{"a":[1,2]}}}"#,
                         #"{"a":{"$elemMatch":{"$gt":1}}}"#, #"{"a":{"$or":[1,{"$in":[2]}]}}"#, #"{"$and":[{"a":1},{"$and":[{"b":2}]}]}"#,
                         #"{"$or":[{"a":1,"b":2}]}"#, #"{"a":{}}"#, #"{}"#, #"{"a":{"$allMatch":{"b":{"c":1}}}}"#]
        for selector in selectors {
            let explained = try request("POST", "/\(db)/_explain", ["selector": try JSONParser.parse(Array(selector.utf8))])
            seen.append("explain \(selector): \(explained.status) " + (explained.json?["selector"] ?? .null).jsonString(.canonical))
        }
        // _all_docs' offset (the rows before the start key, then those skipped) and _design_docs,
        // in a one-shard database (a clustered CouchDB's _design_docs offset depends on its shards).
        let listed = "\(db)-listed"
        _ = try request("PUT", "/\(listed)?q=1")
        _ = try request("POST", "/\(listed)/_bulk_docs", ["docs": [["_id": "a"], ["_id": "b"], ["_id": "c"], ["_id": "d"],
                                                                  ["_id": "_design/x"], ["_id": "_design/y"], ["_id": "gone"]]])
        let gone = try request("GET", "/\(listed)/gone").json?["_rev"]?.stringValue ?? ""
        _ = try request("DELETE", "/\(listed)/gone?rev=\(gone)")
        for query in ["startkey=%22c%22", "startkey=%22c%22&skip=1", "descending=true&startkey=%22b%22", "endkey=%22b%22",
                      "skip=2&limit=1", "startkey=%22bb%22&limit=1", "descending=true&startkey=%22zz%22&limit=1"] {
            record("_all_docs \(query)", try request("GET", "/\(listed)/_all_docs?\(query)"))
        }
        for query in ["", "skip=1", "limit=1", "include_docs=true", "startkey=%22_design/y%22", "endkey=%22_design/x%22"] {
            record("_design_docs \(query)", try request("GET", "/\(listed)/_design_docs?\(query)"))
        }
        for (id, body) in [("_local/b", ["n": 1]), ("_local/a", ["n": 2]), ("_local/c", [:])] as [(String, JSONValue)] {
            _ = try request("PUT", "/\(listed)/\(id)", body)
        }
        for query in ["", "include_docs=true", "descending=true", "skip=1&limit=1", "startkey=%22_local/b%22", "endkey=%22_local/b%22&inclusive_end=false"] {
            seen.append("_local_docs \(query): " + (try request("GET", "/\(listed)/_local_docs?\(query)")).text)
        }
        record("_local_docs keys", try request("POST", "/\(listed)/_local_docs", ["keys": ["_local/c", "_local/none", "_local/a"]]))
        // all_or_nothing: CouchDB 3 refuses each document with 417 and writes none (with
        // new_edits=false, or no documents, it goes on as without it).
        let first = try request("PUT", "/\(db)/aon", ["n": 1]).json?["rev"]?.stringValue ?? ""
        _ = try request("PUT", "/\(db)/aon?rev=\(first)", ["n": 2])
        record("all_or_nothing", try request("POST", "/\(db)/_bulk_docs", ["all_or_nothing": true, "docs": [
            ["_id": "aon", "_rev": .string(first), "n": 3], ["_id": "aon-new"], ["_id": "_local/aon"]]]))
        record("all_or_nothing wrote nothing", try request("GET", "/\(db)/aon-new"))
        record("all_or_nothing empty", try request("POST", "/\(db)/_bulk_docs", ["all_or_nothing": true, "docs": []]))
        record("all_or_nothing replicated", try request("POST", "/\(db)/_bulk_docs", ["all_or_nothing": true, "new_edits": false,
                                                                                        "docs": [["_id": "aon-r", "_rev": "1-abc"]]]))
        record("all_or_nothing replicated stored", try request("GET", "/\(db)/aon-r"))
        record("all_or_nothing not true", try request("POST", "/\(db)/_bulk_docs", ["all_or_nothing": "yes", "docs": [["_id": "aon-yes"]]]))
        for bad in ["0", "-1", "1.5", "abc"] {
            record("PUT q=\(bad)", try request("PUT", "/\(db)-bad?q=\(bad)"))
            seen.append("q=\(bad) made nothing: \(try request("GET", "/\(db)-bad").status)")
        }
        return seen
    }

    @Test func apiAnswersMatchCouchDB() throws {
        let name = "api-\(UUID().uuidString.prefix(8).lowercased())"
        let (expected, _) = try sideBySide { try apiScenario($0, db: name) }
        #expect(expected.first?.contains("\"offset\":null") == true, "\(expected)")
    }

    /// A longpoll feed with a heartbeat sends newlines while it waits (python-cloudant's feed
    /// reads them), then the change that ends it; `last-event-id` is where a feed resumes.
    @Test func longpollHeartbeatsAndLastEventID() throws {
        let served = directory.appending("beats.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served])
        let couchDB = try couch.newDatabase("beats")
        let auth = [("Authorization", "Basic " + Data("\(couch.user):\(couch.password)".utf8).base64EncodedString())]
        for (port, db, headers) in [(couch.port, couchDB, auth), (server.port, "beats", [])] {
            let chunks = Locked<[String]>([])
            let done = DispatchSemaphore(value: 0)
            let answer = Locked<HTTPResponse?>(nil)
            Thread.detachNewThread {
                let response = try? HTTPConnection(port: port).request("GET", "/\(db)/_changes?feed=longpoll&since=now&heartbeat=200", headers: headers) { chunk in
                    chunks.withLock { $0.append(String(decoding: chunk, as: UTF8.self)) }
                }
                answer.withLock { $0 = response }
                done.signal()
            }
            Thread.sleep(forTimeInterval: 1.5)
            let beforeChange = chunks.withLock { $0.joined() }
            let writer = try HTTPConnection(port: port)
            #expect(try writer.json("PUT", "/\(db)/wakes", ["n": 1], headers: headers).status == 201)
            #expect(done.wait(timeout: .now() + 20) == .success, "the change ends the longpoll (port \(port))")
            #expect(beforeChange.hasPrefix("{\"results\":[\n"), "\(port): \(beforeChange.debugDescription)")
            #expect(beforeChange.filter { $0 == "\n" }.count >= 4, "\(port): heartbeats while waiting: \(beforeChange.debugDescription)")
            #expect(answer.withLock { $0?.status } == 200)
            let body = try JSONParser.parse(Array(chunks.withLock { $0.joined() }.utf8))
            let ids = body["results"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
            #expect(ids == ["wakes"], "\(port): \(String(describing: ids))")
        }
        // last-event-id resumes after the sequence given, and wins over since.
        let http = try server.connect()
        #expect(try http.json("PUT", "/beats/later", ["n": 2]).status == 201)
        let resumed = try http.json("GET", "/beats/_changes?since=0&last-event-id=1")
        #expect(resumed.json?["results"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == ["later"], "\(resumed.text)")
    }
}
