import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `sofa serve` as a client sees it: a real child process, real HTTP on 127.0.0.1.
@Suite struct ServerTests {
    let directory = TemporaryDirectory()

    /// A served database `name` (with a document `seed`), and a connection to it.
    func serve(_ name: String = "db", extra: [String] = [], logLevel: String = "warning") throws -> (ServedDatabases, HTTPConnection) {
        let db = try directory.makeDatabase("\(name).sofa")
        var draft = try db.newRevision(of: "seed")
        draft.properties["n"] = 1
        try db.save(draft)
        let server = try ServedDatabases([directory.appending("\(name).sofa")] + extra, logLevel: logLevel)
        return (server, try server.connect())
    }

    /// What Sofa does not implement is named as such (501), not blamed on a database name or
    /// a document id; CouchDB's system databases are absent (404), HEAD included.
    @Test func endpointsSofaLacksAreNamedHonestly() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        for (method, path, named) in [("GET", "/db/_purged_infos", "_purged_infos"),
                                      ("GET", "/_stats", "/_stats"), ("GET", "/_membership", "/_membership"),
                                      ("GET", "/_node/_local/_config", "/_node"), ("GET", "/_scheduler/foo", "/_scheduler/foo"),
                                      ("GET", "/db/_design/d/_rewrite/x", "_rewrite")] {
            let answer = try http.request(method, path)
            #expect(answer.status == 501 && answer.json?["error"] == "not_implemented", "\(method) \(path): \(answer.status)")
            #expect(answer.json?["reason"]?.stringValue?.contains(named) == true, "\(path): \(answer.json ?? .null)")
        }
        #expect(try http.request("HEAD", "/_users").status == 404, "no _users without --user")
        #expect(try http.request("GET", "/_replicator").json == ["error": "not_found", "reason": "Database does not exist."])
        #expect(try http.request("GET", "/_nonsense").json?["error"] == "illegal_database_name")
    }

    /// CouchDB allows `/` in database names (`team/notes`); here they become `team%2Fnotes.sofa`.
    /// Mango `_find` as PouchDB and CouchDB's clients call it, `_explain` and the `_index` list.
    @Test func findAnswersMangoQueries() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        for (id, kind, n) in [("a", "note", 3), ("b", "note", 7), ("c", "task", 5), ("d", "note", 9)] {
            #expect(try http.json("PUT", "/db/\(id)", ["kind": .string(kind), "n": .integer(Int64(n)), "meta": ["by": .string(id)]]).status == 201)
        }
        let query: JSONValue = ["selector": ["kind": "note", "n": ["$gt": 4]], "fields": ["_id", "n", "meta.by"], "execution_stats": true]
        let scanned = try http.json("POST", "/db/_find", query)
        #expect(scanned.json?["docs"] == [["_id": "b", "n": 7, "meta": ["by": "b"]], ["_id": "d", "n": 9, "meta": ["by": "d"]]])
        #expect(scanned.json?["warning"]?.stringValue?.contains("No matching index found") == true)
        #expect(scanned.json?["execution_stats"]?["results_returned"] == 2 && scanned.json?["execution_stats"]?["total_docs_examined"] == 5)
        let created = try http.json("POST", "/db/_index", ["index": ["fields": ["kind", "n"]], "ddoc": "kn", "name": "kind-n"])
        #expect(created.status == 200 && created.json == ["result": "created", "id": "_design/kn", "name": "kind-n"])
        var sorted = query.objectValue!
        sorted["sort"] = [["n": "desc"]]
        let found = try http.json("POST", "/db/_find", .object(sorted))
        #expect(found.status == 200, "\(found.json ?? .null)")
        #expect(found.json?["docs"] == [["_id": "d", "n": 9, "meta": ["by": "d"]], ["_id": "b", "n": 7, "meta": ["by": "b"]]])
        #expect(found.json?["warning"] == nil)
        #expect(found.json?["execution_stats"]?["results_returned"] == 2 && found.json?["execution_stats"]?["total_docs_examined"] == 2)
        // Pages follow the bookmark.
        let first = try #require(try http.json("POST", "/db/_find", ["selector": ["kind": "note"], "limit": 2]).json)
        #expect(first["docs"]?.arrayValue?.compactMap { $0["_id"]?.stringValue } == ["a", "b"])
        let next = try http.json("POST", "/db/_find", ["selector": ["kind": "note"], "limit": 2, "bookmark": try #require(first["bookmark"])]).json
        #expect(next?["docs"]?.arrayValue?.compactMap { $0["_id"]?.stringValue } == ["d"])
        // Bad queries are 400 with the reason.
        let bad = try http.json("POST", "/db/_find", ["selector": ["n": ["$near": 1]]])
        #expect(bad.status == 400 && bad.json?["reason"]?.stringValue?.contains("$near") == true, "\(bad.json ?? .null)")
        #expect(try http.json("POST", "/db/_find", ["limit": 1]).status == 400)
        #expect(try http.json("POST", "/db/_explain", ["selector": ["kind": "note"]]).json?["index"]?["name"] == "_all_docs")
        #expect(try http.json("POST", "/db/_explain", ["selector": ["kind": "note", "n": 1]]).json?["index"]?["name"] == "kind-n")
        #expect(try http.request("GET", "/db/_index").json?["total_rows"] == 2)
    }

    @Test func databaseNamesWithSlashes() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        #expect(try http.request("PUT", "/team%2Fnotes").status == 201)
        #expect(FileManager.default.fileExists(atPath: directory.appending("team%2Fnotes.sofa")))
        #expect(try http.request("GET", "/_all_dbs").json == ["db", "team/notes"])
        #expect(try http.json("PUT", "/team%2Fnotes/doc", ["n": 1]).status == 201)
        #expect(try http.request("GET", "/team%2Fnotes/doc").json?["n"] == 1)
        #expect(try http.request("GET", "/team%2Fnotes").json?["db_name"] == "team/notes")
        #expect(try http.request("PUT", "/%2Fleading").status == 400)
        // A server started on the same folder finds it under its name.
        let again = try ServedDatabases([directory.appending("db.sofa")])
        #expect(try again.connect().request("GET", "/team%2Fnotes/doc").json?["n"] == 1)
    }

    @Test func copyMakesANewDocumentWithTheSameBodies() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let rev = try #require(try http.request("GET", "/db/seed").json?["_rev"]?.stringValue)
        #expect(try http.request("PUT", "/db/seed/a.txt?rev=\(rev)", headers: [("Content-Type", "text/plain")], body: Array("body".utf8)).status == 201)
        let copied = try http.request("COPY", "/db/seed", headers: [("Destination", "twin")])
        #expect(copied.status == 201 && copied.json?["id"] == "twin", "\(copied.json ?? .null)")
        let twin = try #require(try http.request("GET", "/db/twin").json)
        #expect(twin["n"] == 1 && twin["_attachments"]?["a.txt"]?["length"] == 4)
        #expect(try http.request("GET", "/db/twin/a.txt").body == Array("body".utf8))
        // An existing destination needs its revision.
        #expect(try http.request("COPY", "/db/seed", headers: [("Destination", "twin")]).status == 409)
        let twinRev = try #require(twin["_rev"]?.stringValue)
        #expect(try http.request("COPY", "/db/seed", headers: [("Destination", "twin?rev=\(twinRev)")]).status == 201)
        #expect(try http.request("COPY", "/db/seed").status == 400)
        #expect(try http.request("COPY", "/db/absent", headers: [("Destination", "x")]).status == 404)
    }

    @Test func batchOkRevsLimitAndLastEventID() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let batched = try http.json("PUT", "/db/later?batch=ok", ["n": 1])
        #expect(batched.status == 202 && batched.json == ["ok": true, "id": "later"], "\(batched.json ?? .null)")
        #expect(try http.request("GET", "/db/later").json?["n"] == 1, "saved, as CouchDB saves a batch soon after")
        let posted = try http.json("POST", "/db?batch=ok", ["_id": "posted"])
        #expect(posted.status == 202 && posted.json?["rev"] == nil)

        #expect(try http.request("GET", "/db/_revs_limit").json == 1000)
        #expect(try http.request("PUT", "/db/_revs_limit", body: Array("3".utf8)).status == 200)
        #expect(try http.request("GET", "/db/_revs_limit").json == 3)
        #expect(try http.request("PUT", "/db/_revs_limit", body: Array("0".utf8)).status == 400)
        var rev = try #require(try http.request("GET", "/db/later").json?["_rev"]?.stringValue)
        for n in 2...6 {
            rev = try #require(try http.json("PUT", "/db/later", ["_rev": .string(rev), "n": .integer(Int64(n))]).json?["rev"]?.stringValue)
        }
        let history = try http.request("GET", "/db/later?revs=true").json?["_revisions"]?["ids"]?.arrayValue
        #expect(history?.count == 3, "history pruned to the stored limit: \(history ?? [])")

        // An EventSource client reconnecting says where it left off in Last-Event-ID.
        let all = try #require(try http.request("GET", "/db/_changes").json?["results"]?.arrayValue)
        let second = try #require(all[1]["seq"]?.stringValue)
        let resumed = try http.request("GET", "/db/_changes", headers: [("Last-Event-ID", second)]).json?["results"]?.arrayValue
        #expect(resumed?.count == all.count - 2)
    }

    @Test func serverAndDatabaseEndpoints() throws {
        let (server, http) = try serve()
        let root = try http.request("GET", "/")
        #expect(root.status == 200)
        #expect(root.json?["couchdb"]?.stringValue == "Welcome")
        #expect(root.json?["uuid"]?.stringValue?.count == 32)
        #expect(root.body.last == 0x0A, "JSON bodies end with a newline, as CouchDB's do")
        #expect(try http.request("GET", "/_up").json?["status"]?.stringValue == "ok")
        #expect(try http.request("GET", "/_all_dbs").json == ["db"])

        let info = try http.request("GET", "/db/")
        #expect(info.status == 200)
        #expect(info.json?["doc_count"] == 1)
        #expect(info.json?["update_seq"]?.stringValue == "1")
        #expect(info.json?["instance_start_time"]?.stringValue?.isEmpty == false)
        // Constant for the database's life: writes a second apart do not move it (CouchDB's
        // replicator fails its checkpoint when it moves), nor does _ensure_full_commit answer another.
        let start = info.json?["instance_start_time"]?.stringValue
        #expect(try http.json("PUT", "/db/later-1", ["n": 1]).status == 201)
        usleep(1_100_000)
        #expect(try http.json("PUT", "/db/later-2", ["n": 2]).status == 201)
        // As after many writes: the WAL is checkpointed into db.sqlite3, whose times then move.
        #expect(try shell("python3 -c \"import sqlite3; sqlite3.connect('\(directory.appending("db.sofa/db.sqlite3"))').execute('PRAGMA wal_checkpoint(TRUNCATE)')\"").succeeded)
        #expect(try http.request("GET", "/db").json?["instance_start_time"]?.stringValue == start)
        #expect(try http.json("POST", "/db/_ensure_full_commit", [:]).json?["instance_start_time"]?.stringValue == start)

        #expect(try http.request("PUT", "/fresh").status == 201)
        #expect(try http.request("PUT", "/fresh").status == 412)
        #expect(try http.request("PUT", "/Bad%20Name").status == 400)
        #expect(FileManager.default.fileExists(atPath: directory.appending("fresh.sofa/db.sqlite3")))
        #expect(try http.request("GET", "/_all_dbs").json == ["db", "fresh"])
        #expect(try http.request("DELETE", "/fresh").status == 200)
        #expect(!FileManager.default.fileExists(atPath: directory.appending("fresh.sofa")))
        let missing = try http.request("GET", "/nope")
        #expect(missing.status == 404)
        #expect(missing.reason == "Object Not Found")
        #expect(missing.json == ["error": "not_found", "reason": "Database does not exist."])
        #expect(server.stop().succeeded, "SIGTERM ends the server cleanly")
    }

    @Test func documentLifecycleAndErrors() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let created = try http.json("PUT", "/db/note", ["title": "hello", "big": .bigInteger("18446744073709551615")])
        #expect(created.status == 201)
        let rev1 = try #require(created.json?["rev"]?.stringValue)
        #expect(created.header("ETag") == "\"\(rev1)\"")
        #expect(created.header("Location")?.hasSuffix("/db/note") == true)

        let got = try http.request("GET", "/db/note")
        #expect(got.text == #"{"_id":"note","_rev":"\#(rev1)","title":"hello","big":18446744073709551615}"# + "\n")

        // Stale and missing revisions conflict; bad revs and bad JSON are 400.
        #expect(try http.json("PUT", "/db/note", ["title": "again"]).status == 409)
        let updated = try http.json("PUT", "/db/note", ["_rev": .string(rev1), "title": "updated"])
        #expect(updated.status == 201)
        let rev2 = try #require(updated.json?["rev"]?.stringValue)
        #expect(try http.json("PUT", "/db/note", ["_rev": .string(rev1), "title": "stale"]).json?["error"] == "conflict")
        #expect(try http.json("PUT", "/db/note", ["_rev": "bogus"]).status == 400)
        let badJSON = try http.request("PUT", "/db/note", headers: [("Content-Type", "application/json")], body: Array("{\"a\":".utf8))
        #expect(badJSON.status == 400)
        #expect(badJSON.json == ["error": "bad_request", "reason": "invalid UTF-8 JSON"])
        #expect(try http.json("PUT", "/db/note", ["_bogus": 1]).json?["error"] == "doc_validation")
        #expect(try http.json("PUT", "/db/_weird", ["a": 1]).status == 400)

        // Old revisions stay readable; revs and revs_info show the history.
        #expect(try http.request("GET", "/db/note?rev=\(rev1)").json?["title"] == "hello")
        let history = try http.request("GET", "/db/note?revs=true&revs_info=true").json
        #expect(history?["_revisions"]?["ids"]?.arrayValue?.count == 2)
        #expect(history?["_revs_info"]?.arrayValue?.count == 2)

        // POST makes an id; DELETE needs the current rev and leaves a tombstone.
        let posted = try http.json("POST", "/db", ["kind": "posted"])
        #expect(posted.status == 201)
        #expect(posted.json?["id"]?.stringValue?.count == 32)
        #expect(try http.request("DELETE", "/db/note").status == 409)
        #expect(try http.request("DELETE", "/db/note?rev=\(rev1)").status == 409)
        let deleted = try http.request("DELETE", "/db/note?rev=\(rev2)")
        #expect(deleted.status == 200)
        #expect(deleted.json?["rev"]?.stringValue?.hasPrefix("3-") == true)
        #expect(try http.request("GET", "/db/note").json == ["error": "not_found", "reason": "deleted"])
        #expect(try http.request("GET", "/db/never").json == ["error": "not_found", "reason": "missing"])

        // Ids with '/' travel as %2F; design documents keep their literal slash.
        #expect(try http.json("PUT", "/db/folder%2Fsub", ["a": 1]).status == 201)
        #expect(try http.request("GET", "/db/folder%2Fsub").json?["_id"] == "folder/sub")
        #expect(try http.json("PUT", "/db/_design/app", ["views": [:]]).status == 201)
        #expect(try http.request("GET", "/db/_design/app").json?["_id"] == "_design/app")
    }

    @Test func allDocsWithKeysRangesAndLimits() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        for id in ["a", "b", "c", "d"] { #expect(try http.json("PUT", "/db/\(id)", ["id": .string(id)]).status == 201) }
        let all = try http.request("GET", "/db/_all_docs")
        #expect(all.json?["total_rows"] == 5)
        #expect(all.json?["rows"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == ["a", "b", "c", "d", "seed"])
        let range = try http.request("GET", "/db/_all_docs?startkey=%22b%22&endkey=%22c%22&include_docs=true")
        #expect(range.json?["rows"]?.arrayValue?.compactMap { $0["doc"]?["id"]?.stringValue } == ["b", "c"])
        let limited = try http.request("GET", "/db/_all_docs?limit=2&skip=1&descending=true")
        #expect(limited.json?["rows"]?.arrayValue?.compactMap { $0["id"]?.stringValue } == ["d", "c"])
        let keys = try http.json("POST", "/db/_all_docs", ["keys": ["c", "zz"]])
        #expect(keys.json?["rows"]?[0]?["id"] == "c")
        #expect(keys.json?["rows"]?[1]?["error"] == "not_found")
    }

    @Test func attachmentsStreamWithRangesAndETags() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let rev = try #require(try http.request("GET", "/db/seed").json?["_rev"]?.stringValue)
        let bytes = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let put = try http.request("PUT", "/db/seed/sub/dir/data.bin?rev=\(rev)", headers: [("Content-Type", "application/x-test")], body: bytes)
        #expect(put.status == 201)
        let full = try http.request("GET", "/db/seed/sub/dir/data.bin")
        #expect(full.status == 200)
        #expect(full.body == bytes)
        #expect(full.header("Content-Type") == "application/x-test")
        #expect(full.header("Accept-Ranges") == "bytes")
        let etag = try #require(full.header("ETag"))
        #expect(try http.request("GET", "/db/seed/sub%2Fdir%2Fdata.bin").body == bytes)
        #expect(try http.request("GET", "/db/seed/sub/dir/data.bin", headers: [("If-None-Match", etag)]).status == 304)
        let head = try http.request("HEAD", "/db/seed/sub/dir/data.bin")
        #expect(head.header("Content-Length") == "100000")
        #expect(head.body.isEmpty)

        let part = try http.request("GET", "/db/seed/sub/dir/data.bin", headers: [("Range", "bytes=100-199")])
        #expect(part.status == 206)
        #expect(part.header("Content-Range") == "bytes 100-199/100000")
        #expect(part.body == Array(bytes[100...199]))
        #expect(try http.request("GET", "/db/seed/sub/dir/data.bin", headers: [("Range", "bytes=-10")]).body == Array(bytes.suffix(10)))
        #expect(try http.request("GET", "/db/seed/sub/dir/data.bin", headers: [("Range", "bytes=99990-")]).body == Array(bytes.suffix(10)))
        let beyond = try http.request("GET", "/db/seed/sub/dir/data.bin", headers: [("Range", "bytes=200000-")])
        #expect(beyond.status == 416)
        #expect(beyond.json?["error"] == "requested_range_not_satisfiable")

        // The document shows a stub; attachments=true inlines base64.
        let doc = try #require(try http.request("GET", "/db/seed").json)
        #expect(doc["_attachments"]?["sub/dir/data.bin"]?["stub"] == true)
        #expect(doc["_attachments"]?["sub/dir/data.bin"]?["length"] == 100_000)
        // (as JSON when asked for: without an Accept header, as from CouchDB, it comes as multipart/related)
        let inline = try http.request("GET", "/db/seed?attachments=true", headers: [("Accept", "application/json")]).json
        #expect(inline?["_attachments"]?["sub/dir/data.bin"]?["data"]?.stringValue == Data(bytes).base64EncodedString())

        // A gzip-encoded upload is stored decoded.
        let rev2 = try #require(doc["_rev"]?.stringValue)
        let gzipped = try shell("printf 'hello gzip world' | gzip -c > \(directory.appending("g.gz"))")
        #expect(gzipped.succeeded)
        let gz = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.appending("g.gz"))))
        let putGzip = try http.request("PUT", "/db/seed/hello.txt?rev=\(rev2)",
                                       headers: [("Content-Type", "text/plain"), ("Content-Encoding", "gzip")], body: gz)
        #expect(putGzip.status == 201)
        #expect(try http.request("GET", "/db/seed/hello.txt").text == "hello gzip world")

        // Deleting needs the current rev; a missing attachment is 404 with CouchDB's reason.
        let rev3 = try #require(putGzip.json?["rev"]?.stringValue)
        #expect(try http.request("DELETE", "/db/seed/hello.txt?rev=\(rev2)").status == 409)
        #expect(try http.request("DELETE", "/db/seed/hello.txt?rev=\(rev3)").status == 200)
        #expect(try http.request("GET", "/db/seed/hello.txt").json?["reason"] == "Document is missing attachment")
    }

    @Test func changesFeeds() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        for id in ["a", "b"] { _ = try http.json("PUT", "/db/\(id)", ["v": 1]) }
        let normal = try http.request("GET", "/db/_changes?style=all_docs")
        #expect(normal.text.hasPrefix("{\"results\":[\n"))
        #expect(normal.text.hasSuffix("\n],\n\"last_seq\":\"3\",\"pending\":0}\n"))
        #expect(normal.json?["results"]?.arrayValue?.map { $0["id"]?.stringValue } == ["seed", "a", "b"])
        let limited = try http.request("GET", "/db/_changes?since=1&limit=1").json
        #expect(limited?["results"]?.arrayValue?.count == 1)
        #expect(limited?["pending"] == 1)
        #expect(limited?["last_seq"] == "2")
        let ids = try http.json("POST", "/db/_changes?filter=_doc_ids", ["doc_ids": ["b", "unknown"]]).json
        #expect(ids?["results"]?.arrayValue?.map { $0["id"]?.stringValue } == ["b"])
        let viaGet = try http.request("GET", "/db/_changes?filter=_doc_ids&doc_ids=%5B%22a%22%5D&include_docs=true").json
        #expect(viaGet?["results"]?[0]?["doc"]?["v"] == 1)
        // A filter function of a design document that is not there: 404, as CouchDB (the rest: ValidationTests).
        #expect(try http.request("GET", "/db/_changes?filter=app/by_type").status == 404)
        #expect(try http.request("GET", "/db/_changes?filter=by_type").status == 400)

        // Longpoll with nothing new waits for its timeout, then returns no rows.
        let idle = try http.request("GET", "/db/_changes?feed=longpoll&since=3&timeout=300")
        #expect(idle.json?["results"]?.arrayValue?.isEmpty == true)

        // A longpoll returns as soon as a change arrives; a continuous feed sees live writes.
        let port = try http.request("GET", "/_all_dbs").status == 200 ? servedPort(http) : 0
        let feed = try HTTPConnection(port: port)
        try feed.send("GET /db/_changes?feed=continuous&since=now&heartbeat=200&timeout=4000 HTTP/1.1\r\nHost: x\r\n\r\n")
        // The write goes in once the feed has sent something (its first heartbeat), so the feed is
        // surely listening however slow the machine is.
        let writer = try HTTPConnection(port: port)
        var text: [UInt8] = []
        var written: Int?
        let response = try feed.readResponse { bytes in
            text.append(contentsOf: bytes)
            if written == nil { written = (try? writer.json("PUT", "/db/live", ["v": 2]))?.status ?? 0 }
        }
        #expect(written == 201)
        let lines = String(decoding: text, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        let rows = lines.filter { !$0.isEmpty }.compactMap { try? JSONParser.parse(Array($0.utf8)) }
        #expect(rows.first?["id"] == "live", "\(String(decoding: text, as: UTF8.self))")
        #expect(rows.last?["last_seq"] == "4")
        #expect(lines.contains(""), "blank heartbeat lines")
        #expect(response.chunkSizes.count >= 3)
    }

    /// The port of a connection's peer.
    private func servedPort(_ http: HTTPConnection) -> Int {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(http.fd, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    @Test func replicationEndpoints() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        // _bulk_docs new_edits=false stores given histories, conflicts included.
        let docs: JSONValue = ["new_edits": false, "docs": [
            ["_id": "c", "_rev": "2-aaa", "_revisions": ["start": 2, "ids": ["aaa", "root"]], "side": "A"],
            ["_id": "c", "_rev": "3-bbb", "_revisions": ["start": 3, "ids": ["bbb", "mid", "root"]], "side": "B",
             "_attachments": ["x.txt": ["content_type": "text/plain", "data": .string(Data("xx".utf8).base64EncodedString())]]],
        ]]
        let bulk = try http.json("POST", "/db/_bulk_docs", docs)
        #expect(bulk.status == 201)
        #expect(bulk.json == [])
        let current = try http.request("GET", "/db/c?conflicts=true").json
        #expect(current?["_rev"] == "3-bbb")
        #expect(current?["_conflicts"] == ["2-aaa"])

        // _revs_diff: known revs (leaves and history) are not missing; possible ancestors are leaves below.
        let diff = try http.json("POST", "/db/_revs_diff", ["c": ["2-aaa", "1-root", "4-ccc"], "new": ["1-x"]]).json
        #expect(diff == ["c": ["missing": ["4-ccc"], "possible_ancestors": ["2-aaa", "3-bbb"]], "new": ["missing": ["1-x"]]])
        #expect(try http.json("POST", "/db/_revs_diff", ["c": ["3-bbb"]]).json == [:])

        // A stub the server lacks fails the whole request with 412, and nothing is written.
        let stub: JSONValue = ["new_edits": false, "docs": [
            ["_id": "ok1", "_rev": "1-a", "v": 1],
            ["_id": "s", "_rev": "1-s", "_attachments": ["gone.bin": ["stub": true, "revpos": 1, "digest": "md5-AAAA"]]],
        ]]
        let refused = try http.json("POST", "/db/_bulk_docs", stub)
        #expect(refused.status == 412)
        #expect(refused.json == ["error": "missing_stub", "reason": "Invalid attachment stub in s for gone.bin"])
        #expect(try http.request("GET", "/db/ok1").status == 404)
        // A stub of an attachment an ancestor has is resolved.
        let child: JSONValue = ["new_edits": false, "docs": [
            ["_id": "c", "_rev": "4-ddd", "_revisions": ["start": 4, "ids": ["ddd", "bbb"]],
             "_attachments": ["x.txt": ["stub": true, "revpos": 3, "content_type": "text/plain"]]],
        ]]
        #expect(try http.json("POST", "/db/_bulk_docs", child).status == 201)
        #expect(try http.request("GET", "/db/c/x.txt").text == "xx")

        // new_edits=true: per-document results, conflicts reported per document.
        let edits = try http.json("POST", "/db/_bulk_docs", ["docs": [["_id": "n1", "v": 1], ["_id": "c", "v": 2]]]).json
        #expect(edits?[0]?["ok"] == true)
        #expect(edits?[1]?["error"] == "conflict")

        // _bulk_get: latest, revs, atts_since, missing docs and revs.
        let got = try http.json("POST", "/db/_bulk_get?revs=true&latest=true", ["docs": [
            ["id": "c", "rev": "3-bbb"], ["id": "c", "rev": "2-aaa", "atts_since": ["2-aaa"]],
            ["id": "nope"], ["id": "c", "rev": "9-zzz"],
        ]]).json
        let results = try #require(got?["results"]?.arrayValue)
        #expect(results[0]["docs"]?[0]?["ok"]?["_rev"] == "4-ddd", "latest=true follows 3-bbb to its leaf")
        #expect(results[0]["docs"]?[0]?["ok"]?["_revisions"]?["ids"] == ["ddd", "bbb", "mid", "root"])
        #expect(results[0]["docs"]?[0]?["ok"]?["_attachments"]?["x.txt"]?["stub"] == true)
        #expect(results[1]["docs"]?[0]?["ok"]?["_rev"] == "2-aaa")
        #expect(results[2]["docs"]?[0]?["error"]?["rev"] == "undefined")
        #expect(results[3]["docs"]?[0]?["error"]?["error"] == "not_found")

        // open_revs as JSON and as multipart/mixed (bodies included).
        let open = try http.request("GET", "/db/c?open_revs=all&revs=true", headers: [("Accept", "application/json")]).json
        #expect(open?.arrayValue?.count == 2)
        let someRevs = try http.request("GET", "/db/c?open_revs=%5B%222-aaa%22,%225-nope%22%5D", headers: [("Accept", "application/json")]).json
        #expect(someRevs?[1]?["missing"] == "5-nope")
        let mixed = try http.request("GET", "/db/c?open_revs=%5B%224-ddd%22%5D&revs=true&latest=true",
                                     headers: [("Accept", "multipart/mixed")])
        #expect(mixed.header("Content-Type")?.hasPrefix("multipart/mixed; boundary=") == true)
        #expect(mixed.text.contains("Content-Type: multipart/related"))
        #expect(mixed.text.contains("\"follows\":true"))
        #expect(mixed.text.contains("Content-Disposition: attachment; filename=\"x.txt\"\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nxx\r\n"))

        // _local documents: no conflict check, 0-N revisions, never in _changes.
        #expect(try http.json("PUT", "/db/_local/ck", ["seq": 1]).json?["rev"] == "0-1")
        #expect(try http.json("PUT", "/db/_local/ck", ["_rev": "0-1", "seq": 2]).json?["rev"] == "0-2")
        #expect(try http.json("PUT", "/db/_local/ck", ["_rev": "0-1", "seq": 3]).json?["rev"] == "0-2")
        #expect(try http.request("GET", "/db/_local%2Fck").json?["seq"] == 3)
        #expect(try http.request("GET", "/db/_local/missing").status == 404)
        let changes = try http.request("GET", "/db/_changes").json?["results"]?.arrayValue ?? []
        #expect(!changes.contains { $0["id"]?.stringValue?.hasPrefix("_local") == true })
        #expect(try http.request("POST", "/db/_ensure_full_commit").status == 201)
    }

    @Test func multipartPutWithNewEditsFalse() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let boundary = "abc123"
        let json = #"{"_id":"m","_rev":"2-two","_revisions":{"start":2,"ids":["two","one"]},"v":1,"_attachments":{"#
            + #""a.bin":{"content_type":"application/octet-stream","revpos":2,"digest":"md5-\#(md5("AAAA"))","length":4,"follows":true},"#
            + #""b.txt":{"content_type":"text/plain","revpos":1,"length":2,"follows":true}}}"#
        // The second part has no headers at all, as CouchDB accepts.
        let body = "--\(boundary)\r\nContent-Type: application/json\r\n\r\n\(json)\r\n--\(boundary)\r\n"
            + "Content-Disposition: attachment; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\nContent-Length: 4\r\n\r\nAAAA\r\n"
            + "--\(boundary)\r\n\r\nhi\r\n--\(boundary)--"
        let put = try http.request("PUT", "/db/m?new_edits=false", headers: [("Content-Type", "multipart/related; boundary=\"\(boundary)\"")],
                                   body: Array(body.utf8))
        #expect(put.status == 201, "\(put.text)")
        #expect(put.json?["rev"] == "2-two")
        #expect(try http.request("GET", "/db/m/a.bin").text == "AAAA")
        #expect(try http.request("GET", "/db/m/b.txt").text == "hi")

        // A body that does not match its md5 digest is refused, and the revision is not stored.
        let lying = body.replacingOccurrences(of: "\r\nAAAA\r\n", with: "\r\nBBBB\r\n").replacingOccurrences(of: "\"_id\":\"m\"", with: "\"_id\":\"m2\"")
        let refused = try http.request("PUT", "/db/m2?new_edits=false",
                                       headers: [("Content-Type", "multipart/related; boundary=\"\(boundary)\"")], body: Array(lying.utf8))
        #expect(refused.status == 400)
        #expect(try http.request("GET", "/db/m2").status == 404)
        // Truncated multipart: 400, nothing stored.
        let truncated = String(body.prefix(body.count - 20)).replacingOccurrences(of: "\"_id\":\"m\"", with: "\"_id\":\"m3\"")
        let cut = try http.request("PUT", "/db/m3?new_edits=false",
                                   headers: [("Content-Type", "multipart/related; boundary=\"\(boundary)\"")], body: Array(truncated.utf8))
        #expect(cut.status == 400)
        #expect(try HTTPConnection(port: servedPort(http)).request("GET", "/db/m3").status == 404)
    }

    private func md5(_ text: String) -> String {
        Data(MessageDigest.hash(.md5, Array(text.utf8))).base64EncodedString()
    }

    @Test func authenticationAndReadOnly() throws {
        let passwordFile = directory.appending("pw")
        try "s3cret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        // Debug logging, so that every request is logged and the password check below means something.
        let (server, http) = try serve(extra: ["--user", "admin", "--password-file", passwordFile, "--read-only"], logLevel: "debug")
        let anonymous = try http.request("GET", "/db/seed")
        #expect(anonymous.status == 401)
        #expect(anonymous.json == ["error": "unauthorized", "reason": "You are not authorized to access this db."])
        #expect(anonymous.header("WWW-Authenticate") == nil)
        #expect(try http.request("GET", "/").status == 200)
        // A refused upload is answered at once, without reading its body, and the connection closes.
        let uploader = try server.connect()
        try uploader.send("PUT /db/seed/big.bin HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        let early = try uploader.readResponse()
        #expect(early.status == 401)
        #expect(early.header("Connection") == "close")
        let basic = "Basic " + Data("admin:s3cret".utf8).base64EncodedString()
        let wrong = "Basic " + Data("admin:nope".utf8).base64EncodedString()
        #expect(try http.request("GET", "/db/seed", headers: [("Authorization", basic)]).status == 200)
        #expect(try http.request("GET", "/db/seed", headers: [("Authorization", wrong)]).json?["reason"] == "Name or password is incorrect.")
        // Wrong credentials are refused wherever they are sent, so a client can tell its login failed.
        for path in ["/", "/_session", "/_up"] {
            let refused = try http.request("GET", path, headers: [("Authorization", wrong)])
            #expect(refused.status == 401 && refused.json?["error"] == "unauthorized", "\(path): \(refused.status)")
        }
        #expect(try http.request("GET", "/_session", headers: [("Authorization", basic)]).json?["userCtx"]?["name"] == "admin")

        let badLogin = try http.request("POST", "/_session", headers: [("Content-Type", "application/x-www-form-urlencoded")],
                                        body: Array("name=admin&password=x".utf8))
        #expect(badLogin.status == 401)
        let login = try http.request("POST", "/_session", headers: [("Content-Type", "application/x-www-form-urlencoded")],
                                     body: Array("name=admin&password=s3cret".utf8))
        #expect(login.status == 200)
        let cookie = try #require(login.header("Set-Cookie")?.split(separator: ";").first.map(String.init))
        #expect(try http.request("GET", "/db/seed", headers: [("Cookie", cookie)]).status == 200)
        #expect(try http.request("GET", "/_session", headers: [("Cookie", cookie)]).json?["userCtx"]?["name"] == "admin")
        #expect(try http.request("GET", "/db/seed", headers: [("Cookie", cookie + "x")]).status == 401)

        // Read-only: writes are 403 even when authenticated.
        let write = try http.json("PUT", "/db/new", ["a": 1], headers: [("Cookie", cookie)])
        #expect(write.status == 403)
        #expect(try http.request("PUT", "/other", headers: [("Cookie", cookie)]).status == 403)
        let result = server.stop()
        #expect(result.stderr.contains("GET /db/seed"), "requests are logged at debug level")
        #expect(!result.stderr.contains("s3cret"), "passwords are never logged")
        #expect(!result.stderr.contains(Data("admin:s3cret".utf8).base64EncodedString()), "nor credentials in headers")
    }

    @Test func fiftyConcurrentClients() async throws {
        let (server, _) = try serve()
        let port = server.port
        try await withThrowingTaskGroup(of: Int.self) { group in
            for client in 0..<50 {
                group.addTask {
                    let http = try HTTPConnection(port: port)
                    var ok = 0
                    for round in 0..<10 {
                        let id = "c\(client)-\(round)"
                        if try http.json("PUT", "/db/\(id)", ["client": .integer(Int64(client))]).status == 201 { ok += 1 }
                        if try http.request("GET", "/db/\(id)").json?["client"] == .integer(Int64(client)) { ok += 1 }
                    }
                    return ok
                }
            }
            var total = 0
            for try await ok in group { total += ok }
            #expect(total == 50 * 10 * 2)
        }
        let http = try server.connect()
        #expect(try http.request("GET", "/db").json?["doc_count"] == 501)
        #expect(try http.request("GET", "/db/_changes").json?["results"]?.arrayValue?.count == 501)
    }

    /// Runs `body`, naming `what` in the error it throws.
    func step<T>(_ what: String, _ body: () throws -> T) throws -> T {
        do { return try body() } catch { throw SofaError.invalidArgument("\(what): \(error)") }
    }

    @Test func badInputIsRefusedAndTheConnectionSurvives() throws {
        let (server, http) = try serve()
        // Oversized headers: the HTTP stack refuses them with 400, and the server reads the rest
        // before closing (a close with unread bytes resets the connection, and can lose the 400).
        let huge = String(repeating: "x", count: 32 << 20)  // more than socket buffers hold
        let oversized = try server.connect()
        try step("sending oversized headers") { try oversized.send("GET /db HTTP/1.1\r\nHost: x\r\nX-Big: \(huge)\r\n\r\n") }
        #expect(try step("oversized headers") { try oversized.readResponse().status } == 400)
        oversized.close()
        // An oversized JSON body (one byte over 64 MiB) is refused with 413 as soon as its
        // Content-Length says so; what the client still sends is read and dropped for a while, so
        // that closing does not reset the connection and lose the answer.
        let flood = try server.connect()
        try flood.send("POST /db/_bulk_docs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \((64 << 20) + 1)\r\n\r\n")
        try flood.send([UInt8](repeating: 0x20, count: 1 << 20))
        let tooLarge = try step("oversized body") { try flood.readResponse() }
        #expect(tooLarge.status == 413)
        #expect(tooLarge.header("Connection") == "close")
        // A non-JSON bulk request is 415 and closes, as CouchDB does.
        let wrongType = try http.request("POST", "/db/_bulk_docs", headers: [("Content-Type", "text/plain")], body: Array("{}".utf8))
        #expect(wrongType.status == 415)
        let fresh = try server.connect()
        #expect(try fresh.request("POST", "/db/_bulk_docs", headers: [("Content-Type", "application/json")], body: Array("[1,".utf8)).status == 400)
        #expect(try fresh.request("GET", "/db/seed").status == 200, "keep-alive continues after a 400")
        #expect(try fresh.request("GET", "/db/seed?open_revs=%5Bbad").status == 400)
        #expect(try fresh.request("GET", "/db/_changes?feed=bogus").status == 400)
        #expect(try fresh.request("GET", "/db/../../etc/passwd").status == 404)
        #expect(try fresh.request("PATCH", "/db/seed").status == 405)

        // A client that disconnects mid-upload leaves no revision and no temporary file behind.
        let rev = try #require(try fresh.request("GET", "/db/seed").json?["_rev"]?.stringValue)
        let quitter = try server.connect()
        try quitter.send("PUT /db/seed/big.bin?rev=\(rev) HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + String(repeating: "z", count: 100_000))
        quitter.close()
        // The server notices the disconnect on its own schedule (a loaded CI machine can take
        // more than a moment), so the temporary file is waited for, with a generous bound.
        let temporaryDirectory = directory.appending("db.sofa/attachments/tmp")
        var temporaries: [String] = []
        let cleaned = waitUntil(20) {
            temporaries = (try? FileManager.default.contentsOfDirectory(atPath: temporaryDirectory)) ?? []
            return temporaries.isEmpty
        }
        #expect(cleaned, "temporary files left by an abandoned upload: \(temporaries)")
        #expect(try fresh.request("GET", "/db/seed").json?["_rev"]?.stringValue == rev, "an abandoned upload made a revision")
    }
}

/// A 2 GiB attachment up and down through `sofa serve`, with the server's memory flat.
@Suite struct ServerStreamingTests {
    @Test func twoGibibyteAttachmentStreamsWithFlatMemory() throws {
        let directory = TemporaryDirectory()
        _ = try directory.makeDatabase("big.sofa")
        let source = directory.appending("big.bin")
        let size: Int64 = 2 << 30
        let key = try writePatternFile(source, count: size)
        let server = try ServedDatabases([directory.appending("big.sofa")])
        let http = try server.connect()

        // Upload: headers, then the file in 1 MiB pieces, never whole in this process either.
        try http.send("PUT /big/doc/big.bin HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: \(size)\r\n\r\n")
        let fd = open(source, O_RDONLY)
        defer { close(fd) }
        var piece = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = piece.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            try http.send(Array(piece[..<count]))
        }
        let put = try http.readResponse()
        #expect(put.status == 201, "\(put.text)")

        // Download: hash as it arrives.
        let digest = MessageDigest(.sha1)
        var received: Int64 = 0
        let get = try http.request("GET", "/big/doc/big.bin") { bytes in
            bytes.withUnsafeBytes { digest.update($0) }
            received += Int64(bytes.count)
        }
        #expect(get.status == 200)
        #expect(received == size)
        #expect(BlobKey(digest: digest.finalize()) == key)
        let stub = try http.request("GET", "/big/doc").json?["_attachments"]?["big.bin"]
        #expect(stub?["length"] == .integer(size))
        #expect(stub?["digest"] == .string(key.digestString))

        let result = server.stop()
        #expect(result.succeeded)
        #expect(result.maxRSS > 0 && result.maxRSS < 150 << 20, "server peak RSS \(result.maxRSS >> 20) MiB for a 2 GiB body")
        print("sofa serve peak RSS with a 2 GiB attachment up and down: \(result.maxRSS >> 20) MiB")
    }
}

/// Blob properties (Couchbase Lite 3.x) written by clients of `sofa serve`.
extension ServerTests {
    @Test func blobsWrittenByClientsKeepTheirStandInsInStep() throws {
        let (server, http) = try serve()
        defer { withExtendedLifetime(server) {} }
        let photo = Array("photo bytes".utf8)
        let digest = BlobKey.of(photo).digestString
        // As Couchbase Lite sends it: the blob and its stand-in with the body.
        let put = try http.json("PUT", "/db/profile", [
            "avatar": ["@type": "blob", "content_type": "image/jpeg", "digest": .string(digest), "length": 11],
            "_attachments": ["blob_/avatar": ["content_type": "image/jpeg", "data": .string(Data(photo).base64EncodedString())]],
        ])
        #expect(put.status == 201, "\(put.text)")
        let doc = try #require(try http.json("GET", "/db/profile").json)
        #expect(doc["avatar"]?["digest"]?.stringValue == digest)
        #expect(doc["_attachments"]?["blob_/avatar"]?["digest"]?.stringValue == digest)
        #expect(try http.request("GET", "/db/profile/blob_/avatar").body == photo)

        // A new body through the stand-in's own URL: the blob takes its digest and length.
        let rev = try #require(doc["_rev"]?.stringValue)
        let newer = Array("a larger photo".utf8)
        let upload = try http.request("PUT", "/db/profile/blob_/avatar?rev=\(rev)", headers: [("Content-Type", "image/png")], body: newer)
        #expect(upload.status == 201, "\(upload.text)")
        let updated = try #require(try http.json("GET", "/db/profile").json)
        #expect(updated["avatar"] == .object(Blobs.dictionary(key: BlobKey.of(newer), length: 14, contentType: "image/png")))

        // A blob whose body is nowhere, or with a wrong length, is refused (400) and nothing is saved.
        let missing = try http.json("PUT", "/db/other", ["p": ["@type": "blob", "digest": .string(BlobKey.of([1]).digestString)]])
        #expect(missing.status == 400 && missing.json?["reason"]?.stringValue?.contains("blob at /p: no body with digest") == true,
                "\(missing.text)")
        let wrong = try http.json("PUT", "/db/other", ["p": ["@type": "blob", "digest": .string(digest), "length": 99]])
        #expect(wrong.status == 400 && wrong.json?["reason"]?.stringValue?.contains("its length is 99") == true, "\(wrong.text)")
        #expect(try http.request("GET", "/db/other").status == 404)
        // Deleting the stand-in removes the blob property.
        let current = try #require(updated["_rev"]?.stringValue)
        #expect(try http.request("DELETE", "/db/profile/blob_/avatar?rev=\(current)").status == 200)
        #expect(try http.json("GET", "/db/profile").json?["avatar"] == nil)
    }
}

/// Slow, idle, half-closed, malformed and vanishing clients, and too many of them.
extension ServerTests {
    /// What the server sends until it closes the connection (nil if it is still open after `seconds`).
    func untilClosed(_ connection: HTTPConnection, within seconds: Double) -> [UInt8]? {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            var poller = pollfd(fd: connection.fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 100) > 0 else { continue }
            let count = recv(connection.fd, &buffer, buffer.count, 0)
            if count <= 0 { return received }
            received += buffer[0..<count]
        }
        return nil
    }

    /// A request on a new connection, and the connection. The header timeout runs from the
    /// accept, so a server stalled past it by a busy machine may close a fresh connection before
    /// reading its request (a reset); a new connection is tried then, a few times.
    func answered(_ server: ServedDatabases, _ target: String) throws -> (HTTPConnection, HTTPResponse) {
        var failures: [String] = []
        for _ in 0..<5 {
            let connection = try server.connect()
            do {
                return (connection, try connection.request("GET", target))
            } catch {
                failures.append("\(error)")
            }
        }
        throw SofaError.invalidArgument("GET \(target) was never answered: \(failures)")
    }

    /// The timeouts: with 1 s for headers and bodies, idle, slow and stalled clients are cut off.
    /// (Every wait is generous: each ends as soon as the server closes.)
    @Test func slowIdleAndStalledClientsAreCutOffByTheTimeouts() throws {
        let (server, _) = try serve(extra: ["--header-timeout", "1", "--body-timeout", "1"], logLevel: "debug")
        // An idle keep-alive connection closes once the header timeout passes.
        let (kept, first) = try answered(server, "/db")
        #expect(first.status == 200)
        #expect(untilClosed(kept, within: 30) == [], "an idle connection was kept")
        // Headers a byte at a time (slowloris) do not keep a connection forever.
        let slow = try server.connect()
        var closedWhileSending = (try? slow.send("GET /db HTTP/1.1\r\n")) == nil
        for byte in "X-Slow: 1234567890\r\n".utf8 where !closedWhileSending {
            usleep(200_000)
            if (try? slow.send([byte])) == nil { closedWhileSending = true }
        }
        #expect(closedWhileSending || untilClosed(slow, within: 30) != nil, "a slowloris connection stayed open")
        // A body shorter than its Content-Length, and a chunked body without its last chunk.
        let short = try server.connect()
        try short.send("PUT /db/short HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\":")
        #expect(untilClosed(short, within: 30) != nil, "a stalled body kept its connection")
        let unfinished = try server.connect()
        try unfinished.send("PUT /db/chunks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n")
        #expect(untilClosed(unfinished, within: 30) != nil, "a chunked body without its end kept its connection")
        // Neither stalled write saved anything.
        #expect(try answered(server, "/db/short").1.status == 404)
        let log = server.stop().stderr
        #expect(!log.contains(" 500 ") && !log.contains("error"), "\(log.suffix(2000))")
    }

    /// Half-closed, malformed, oversized and vanishing clients, and more of them than allowed,
    /// each get a clear ending. (The timeouts are the default here: nothing below depends on
    /// how fast a busy machine answers.)
    @Test func halfClosedMalformedAndTooManyClientsGetClearEndings() throws {
        let (server, http) = try serve(extra: ["--max-connections", "12"], logLevel: "debug")
        #expect(try http.request("GET", "/db").status == 200)
        // A request followed by a half-close gets its answer.
        let halfClosed = try server.connect()
        try halfClosed.send("GET /db/seed HTTP/1.1\r\nHost: x\r\n\r\n")
        shutdown(halfClosed.fd, Int32(SHUT_WR))
        let answer = String(decoding: untilClosed(halfClosed, within: 60) ?? [], as: UTF8.self)
        #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer)")
        // HTTP/1.0 with keep-alive is told so, and the connection carries a second request.
        let old = try server.connect()
        try old.send("GET /db HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        let first = try old.readResponse()
        #expect(first.status == 200 && first.header("Connection")?.lowercased() == "keep-alive")
        try old.send("GET /db/seed HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        #expect(try old.readResponse().status == 200)
        // A bad chunk size gets one answer, 400, and the connection ends.
        let badChunk = try server.connect()
        try badChunk.send("PUT /db/bad HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
        let answers = String(decoding: untilClosed(badChunk, within: 60) ?? [], as: UTF8.self)
        #expect(answers.components(separatedBy: "HTTP/1.1 ").count == 2 && answers.hasPrefix("HTTP/1.1 400"), "\(answers)")
        // A declared length over the limit is refused before the body is sent.
        let huge = try server.connect()
        try huge.send("POST /db/_bulk_docs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
        #expect(try huge.readResponse().status == 413)
        // JSON nested too deep is named as such.
        let deep = String(repeating: "[", count: 300) + String(repeating: "]", count: 300)
        let nested = try server.connect().request("PUT", "/db/deep", headers: [("Content-Type", "application/json")],
                                                   body: Array("{\"a\":\(deep)}".utf8))
        #expect(nested.status == 400 && nested.json?["reason"] == "JSON nested deeper than 256 levels", "\(nested.text)")

        // More connections than allowed: idle ones make room, and requests keep being answered.
        // Each asks at once, so only connections that already got their answer are idle. (The
        // ones above are closed first: past 12 + 6 connections, none idle for half a second, the
        // server refuses the next, as it should.)
        for done in [http, old, huge] { done.close() }
        var idle: [HTTPConnection] = []
        for _ in 0..<15 {
            let connection = try server.connect()
            try connection.send("GET /db HTTP/1.1\r\nHost: x\r\n\r\n")
            _ = try connection.readResponse()
            idle.append(connection)
        }
        usleep(700_000)  // at least idle long enough to be closed for room (ServerTuning.idleBeforeClosing)
        #expect(try server.connect().request("GET", "/db/seed").status == 200)
        // A client that goes away is no server error.
        let quitter = try server.connect()
        try quitter.send("GET /db/_changes?feed=continuous&heartbeat=100 HTTP/1.1\r\nHost: x\r\n\r\n")
        usleep(300_000)
        quitter.close()
        usleep(500_000)
        withExtendedLifetime(idle) {}
        let log = server.stop().stderr
        #expect(!log.contains(" 500 ") && !log.contains("error"), "\(log.suffix(2000))")
        #expect(log.contains("closed an idle connection to make room"), "\(log.suffix(2000))")
    }
}

/// A database that fails to read is a server error, never "not found" (#27): a table taken away
/// under a running `sofa serve` (as a damaged file would) makes document reads, feeds and views
/// answer 500 with SQLite's reason, and a write fail without saving; a listing already streaming
/// is cut off, so the client sees a broken answer rather than a short one. Put back, all is there.
@Suite struct ServerFailureTests {
    let directory = TemporaryDirectory()

    @Test func aDatabaseThatCannotBeReadAnswers500NeverNotFound() throws {
        let path = try directory.makeDatabase("db.sofa").path
        let server = try ServedDatabases([path])
        let http = try server.connect()
        for n in 0..<3 { #expect(try http.json("PUT", "/db/doc\(n)", ["n": .integer(Int64(n))]).status == 201) }
        #expect(try http.json("PUT", "/db/_design/v", ["views": ["n": ["map": "function (d) { emit(d.n, null); }"]]]).status == 201)
        #expect(try shell("sqlite3 '\(path)/db.sqlite3' 'ALTER TABLE revs RENAME TO revs_away'").succeeded)
        for target in ["/db/doc1", "/db/doc1?revs_info=true", "/db/_changes?include_docs=true", "/db/_design/v/_view/n"] {
            let answer = try http.json("GET", target)
            #expect(answer.status == 500, "\(target): \(answer.status) \(answer.text)")
            #expect(answer.json?["reason"]?.stringValue?.contains("no such table: revs") == true, "\(target): \(answer.text)")
        }
        #expect(try http.json("PUT", "/db/new", ["n": 9]).status == 500)
        let listing = try shell("curl -sS 'http://127.0.0.1:\(server.port)/db/_all_docs' 2>&1")
        #expect(!listing.succeeded && listing.stdout.contains("transfer closed"), "\(listing.stdout)")
        #expect(try shell("sqlite3 '\(path)/db.sqlite3' 'ALTER TABLE revs_away RENAME TO revs'").succeeded)
        let again = try server.connect()
        #expect(try again.json("GET", "/db/doc1").json?["n"] == 1)
        #expect(try again.json("GET", "/db/new").status == 404, "the failed write saved nothing")
        #expect(try again.json("GET", "/db/_all_docs").json?["total_rows"] == 4)
    }
}

/// `update=lazy` answers from the index as it is and updates it afterwards. A burst of such
/// queries used to start a thread each (300 queries: 313 threads), all but one waiting for the
/// index's lock; now each index has at most one update running and one more asked for.
@Suite struct LazyViewUpdateTests {
    let directory = TemporaryDirectory()

    @Test func aBurstOfLazyQueriesStartsNoThreadEachAndTheIndexCatchesUp() throws {
        let db = try directory.makeDatabase("db.sofa")
        try db.inBatch { batch in
            for n in 0..<2_000 {
                var draft = try db.newRevision(of: String(format: "doc-%04d", n))
                draft.properties["n"] = .integer(Int64(n))
                try batch.save(draft)
            }
        }
        let server = try ServedDatabases([db.path])
        let http = try server.connect()
        // A map function with some work in it, so that an update takes a while.
        let map = "function (d) { var s = 0; for (var i = 0; i < 20000; i++) { s += i; } emit(d.n, s); }"
        #expect(try http.json("PUT", "/db/_design/v", ["views": ["n": ["map": .string(map)]]]).status == 201)
        func threads() -> Int {
            let status = (try? String(contentsOfFile: "/proc/\(server.process.pid)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("Threads:") } ?? ""
            return Int(line.split(separator: "\t").last ?? "") ?? 0
        }
        #expect(try http.json("GET", "/db/_all_docs?limit=1").status == 200)
        let before = threads()
        // 60 lazy queries at once while the index is built, and the server's threads counted meanwhile.
        let url = "http://127.0.0.1:\(server.port)/db/_design/v/_view/n?update=lazy&limit=1"
        let burst = try ChildProcess(["/bin/sh", "-c", "seq 60 | xargs -P 60 -I{} curl -s -o /dev/null -w '%{http_code}\\n' '\(url)'"])
        var peak = before
        while !burst.hasEnded {
            peak = max(peak, threads())
            usleep(5_000)
        }
        let codes = burst.wait().stdout.split(separator: "\n")
        #expect(codes.count == 60 && codes.allSatisfy { $0 == "200" }, "\(codes)")
        #expect(peak - before <= 16, "threads before the burst: \(before), at its peak: \(peak)")
        func rows() throws -> JSONValue? { try http.json("GET", "/db/_design/v/_view/n?update=false&limit=0").json?["total_rows"] }
        #expect(try waitUntil(120) { try rows() == 2_000 }, "the index caught up after the lazy queries: \((try? rows()) ?? nil)")
        // A lazy query answers from the index as it is, then updates it. (Asked of a view nobody
        // queried yet: `v` may still have the burst's second update coming, which could take in
        // documents saved now before the query below, on a busy machine.)
        for n in 0..<10 { #expect(try http.json("PUT", "/db/late-\(n)", ["n": .integer(Int64(5_000 + n))]).status == 201) }
        #expect(try http.json("PUT", "/db/_design/w", ["views": ["n": ["map": "function (d) { emit(d.n, 1); }"]]]).status == 201)
        #expect(try http.json("GET", "/db/_design/w/_view/n?update=lazy&limit=0").json?["total_rows"] == 0, "answered before the update")
        func laterRows() throws -> JSONValue? { try http.json("GET", "/db/_design/w/_view/n?update=false&limit=0").json?["total_rows"] }
        #expect(try waitUntil(120) { try laterRows() == 2_010 }, "\((try? laterRows()) ?? nil)")
    }
}

/// One database's slow work never holds the threads another database's requests need.
@Suite struct DatabaseIsolationTests {
    let directory = TemporaryDirectory()

    /// Validators run before the write lock: a save whose validation takes long holds up no
    /// other save of the same database (before, the second waited for the first's lock, and
    /// 8 writers on a 1.5 s validator took 12 s where CouchDB took 1.6 s).
    @Test func aSlowValidationHoldsUpNoOtherSaveOfTheSameDatabase() throws {
        let path = directory.appending("db.sofa")
        #expect(try sofa("create", path).succeeded)
        let rule = "function(n) { if (n.slow) { var t = Date.now(); while (Date.now() - t < 8000) {} } if (n.refuse) throw({forbidden: 'no'}); }"
        _ = try Database.open(at: path).put("_design/rules", ["validate_doc_update": .string(rule)])
        let server = try ServedDatabases([path], environment: ["SOFA_QUERY_SERVER_TIMEOUT": "120"])
        let slowDone = Locked<Int?>(nil)
        let group = DispatchGroup()
        group.enter()
        Thread.detachNewThread {
            defer { group.leave() }
            let status = (try? server.connect().json("PUT", "/db/slow", ["slow": true]).status) ?? 0
            slowDone.withLock { $0 = status }
        }
        usleep(500_000)  // (its validation under way; the order below is what is checked)
        let fast = try server.connect().json("PUT", "/db/fast", ["slow": false])
        #expect(fast.status == 201, "\(fast.json ?? .null)")
        #expect(slowDone.withLock { $0 } == nil, "the fast save waited for the slow one")
        // Refused as before, and a save that lost its base meanwhile is still a conflict.
        #expect(try server.connect().json("PUT", "/db/no", ["refuse": true]).status == 403)
        let rev = try #require(fast.json?["rev"]?.stringValue)
        #expect(try server.connect().json("PUT", "/db/fast", ["_rev": .string(rev), "n": 2]).status == 201)
        #expect(try server.connect().json("PUT", "/db/fast", ["_rev": .string(rev), "n": 3]).status == 409)
        group.wait()
        #expect(slowDone.withLock { $0 } == 201)
    }

    @Test func writersQueuedBehindASlowValidatorLeaveOtherDatabasesAnswered() throws {
        let slow = directory.appending("slow.sofa"), other = directory.appending("other.sofa")
        for path in [slow, other] { #expect(try sofa("create", path).succeeded) }
        _ = try Database.open(at: other).put("x", ["here": true])
        // A legal validator that takes its time (within the query server's 5 s limit).
        let rule = "function(n) { var t = Date.now(); while (Date.now() - t < 1500) {} }"
        _ = try Database.open(at: slow).put("_design/slow", ["validate_doc_update": .string(rule)])
        let server = try ServedDatabases([slow, other])

        // Twice as many writers as the server has blocking threads: before, they took every one
        // (one validating, the others waiting for the database's write lock), and the other
        // database's read queued behind the rest of them.
        let writers = 2 * max(4, ProcessInfo.processInfo.activeProcessorCount * 2)
        let finished = Locked<[Int]>([])
        let group = DispatchGroup()
        for index in 0..<writers {
            group.enter()
            // A thread each (the global queue runs about as many blocks at once as there are cores).
            Thread.detachNewThread {
                defer { group.leave() }
                let status = (try? server.connect().json("PUT", "/slow/doc-\(index)", ["n": .integer(Int64(index))]).status) ?? 0
                finished.withLock { $0.append(status) }
            }
        }
        usleep(500_000)  // (the writers' requests on their way; the order below is what is checked)
        let read = try server.connect().request("GET", "/other/x")
        let writesDoneWhenRead = finished.withLock { $0.count }
        #expect(read.status == 200)
        // Answered while the first validation still ran (at most that one finishing meanwhile).
        #expect(writesDoneWhenRead <= 1, "the other database's read waited for \(writesDoneWhenRead) slow writes")
        group.wait()
        #expect(finished.withLock { $0 }.allSatisfy { $0 == 201 }, "\(finished.withLock { $0 })")
    }
}
