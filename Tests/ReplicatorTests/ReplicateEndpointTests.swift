import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `POST /_replicate`, `/_active_tasks` and `/_scheduler/jobs` of `sofa serve`, replicating
/// with the live CouchDB.
extension CouchDBInteropTests {
    @Test func sofaServeReplicatesWhenAClientAsksAndListsWhatRuns() throws {
        let source = try couch.newDatabase("asked")
        try makeScenario(source)
        let served = directory.appending("served.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served])
        let http = try server.connect()

        // One-shot pull from CouchDB into a served database, answered with CouchDB's history.
        let pulled = try http.json("POST", "/_replicate", ["source": .string(couch.url(source)), "target": "served"])
        #expect(pulled.status == 200, "\(pulled.text)")
        let history = try #require(pulled.json?["history"]?[0])
        #expect(history["doc_write_failures"] == 0 && (history["docs_written"]?.int64Value ?? 0) >= 15, "\(pulled.text)")
        for key in ["session_id", "start_time", "end_time", "docs_read", "recorded_seq"] { #expect(history[key] != nil, "\(key)") }
        let expected = try describe(port: couch.port, source)
        expectSame(expected, try describe(port: server.port, "served"), "POST /_replicate pull")

        // One-shot push into a new CouchDB database it creates.
        let copy = "asked-copy-\(UUID().uuidString.prefix(8).lowercased())"
        let pushed = try http.json("POST", "/_replicate", ["source": "served", "target": .string(couch.url(copy)), "create_target": true])
        #expect(pushed.status == 200 && pushed.json?["history"]?[0]?["doc_write_failures"] == 0, "\(pushed.text)")
        expectSame(expected, try describe(port: couch.port, copy), "POST /_replicate push")

        // Continuous: listed while it runs, carries a new document, and cancelled.
        let live = "asked-live-\(UUID().uuidString.prefix(8).lowercased())"
        let definition: JSONObject = ["source": "served", "target": .string(couch.url(live)), "create_target": true, "continuous": true]
        let started = try http.json("POST", "/_replicate", .object(definition))
        #expect(started.status == 202, "\(started.text)")
        let id = try #require(started.json?["_local_id"]?.stringValue)
        #expect(id.hasSuffix("+continuous"))
        let tasks = try #require(try http.json("GET", "/_active_tasks").json?.arrayValue)
        #expect(tasks.count == 1 && tasks[0]["type"] == "replication" && tasks[0]["replication_id"] == .string(id))
        #expect(tasks[0]["target"]?.stringValue?.contains("secret") == false, "the password is not shown")
        #expect(try http.json("GET", "/_scheduler/jobs").json?["total_rows"] == 1)
        #expect(try http.json("PUT", "/served/arrives-later", ["late": true]).status == 201)
        #expect(try waitUntil(30) { try couch.request("GET", "/\(live)/arrives-later").status == 200 })
        var cancel = definition
        cancel["cancel"] = true
        let cancelled = try http.json("POST", "/_replicate", .object(cancel))
        #expect(cancelled.status == 200 && cancelled.json?["_local_id"] == .string(id), "\(cancelled.text)")
        #expect(try http.json("GET", "/_active_tasks").json == [])

        // Mistakes are named.
        #expect(try http.json("POST", "/_replicate", .object(cancel)).status == 404, "nothing left to cancel")
        let neither = try http.json("POST", "/_replicate", ["source": .string(couch.url(source)), "target": .string(couch.url(copy))])
        #expect(neither.status == 400 && neither.json?["reason"]?.stringValue?.contains("neither") == true, "\(neither.text)")
        #expect(try http.json("POST", "/_replicate", ["target": "served"]).status == 400)
        let unreachable = try http.json("POST", "/_replicate", ["source": "http://127.0.0.1:9/nothing", "target": "served"])
        #expect(unreachable.status >= 400 && unreachable.json?["reason"]?.stringValue?.contains("failed") == true, "\(unreachable.text)")
    }
}

extension CouchDBInteropTests {
    /// `_replicator` documents start replications, record how one-shot ones ended, and a
    /// continuous one stops when its document goes.
    @Test func replicatorDocumentsDriveReplications() throws {
        let served = directory.appending("served.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served, "--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("PUT", "/_replicator").status == 201)
        for n in 0..<5 { #expect(try http.json("PUT", "/served/doc-\(n)", ["n": .integer(Int64(n))]).status == 201) }

        // One-shot: done, and the document says so.
        let copy = "rdoc-\(UUID().uuidString.prefix(8).lowercased())"
        #expect(try http.json("PUT", "/_replicator/once", ["source": "served", "target": .string(couch.url(copy)), "create_target": true]).status == 201)
        var once: JSONValue?
        #expect(try waitUntil(60) {
            once = try http.json("GET", "/_replicator/once").json
            return once?["_replication_state"] != nil
        })
        #expect(once?["_replication_state"] == "completed" && once?["_replication_stats"]?["docs_written"] == 5, "\(once ?? .null)")
        #expect(try couch.request("GET", "/\(copy)").json?["doc_count"] == 5)

        // Continuous: running, carries what comes later, stops with its document.
        let live = "rdoc-live-\(UUID().uuidString.prefix(8).lowercased())"
        let created = try http.json("PUT", "/_replicator/live", ["source": "served", "target": .string(couch.url(live)), "create_target": true,
                                                                 "continuous": true])
        #expect(created.status == 201)
        #expect(try waitUntil(30) { try http.json("GET", "/_active_tasks").json?.arrayValue?.count == 1 })
        let docs = try http.json("GET", "/_scheduler/docs").json?["docs"]?.arrayValue ?? []
        #expect(Set(docs.compactMap { doc in doc["doc_id"]?.stringValue.map { "\($0):\(doc["state"]?.stringValue ?? "")" } })
                == ["once:completed", "live:running"], "\(docs)")
        #expect(try http.json("PUT", "/served/later", ["late": true]).status == 201)
        #expect(try waitUntil(30) { try couch.request("GET", "/\(live)/later").status == 200 })
        // The pass that carried it has ended (a pass under way finishes after a stop, and takes
        // what was written meanwhile: "after" below would race it).
        #expect(try waitUntil(30) { try http.json("GET", "/_active_tasks").json?[0]?["state"] == "idle" })
        let rev = try #require(created.json?["rev"]?.stringValue)
        #expect(try http.json("DELETE", "/_replicator/live?rev=\(rev)").status == 200)
        #expect(try waitUntil(30) { try http.json("GET", "/_active_tasks").json == [] })
        #expect(try http.json("PUT", "/served/after", ["late": true]).status == 201)
        Thread.sleep(forTimeInterval: 1)
        #expect(try couch.request("GET", "/\(live)/after").status == 404, "stopped with its document")

        // One that cannot run fails, with the reason in its document.
        #expect(try http.json("PUT", "/_replicator/neither", ["source": "http://127.0.0.1:9/a", "target": "http://127.0.0.1:9/b"]).status == 201)
        var failed: JSONValue?
        #expect(try waitUntil(30) {
            failed = try http.json("GET", "/_replicator/neither").json
            return failed?["_replication_state"] != nil
        })
        #expect(failed?["_replication_state"] == "failed" && failed?["_replication_state_reason"]?.stringValue?.contains("neither") == true,
                "\(failed ?? .null)")
    }
}

extension CouchDBInteropTests {
    /// #28 item 2: replication inside a server that requires a login: between two of its own
    /// databases by name and by URL with credentials, and to CouchDB with the credentials in a
    /// `_replicator` document's `Authorization` header or `auth` object, as clients send them.
    @Test func replicationInsideAServerThatRequiresALogin() throws {
        let passwordFile = directory.appending("serve-password")
        try "p@ss:word".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        let http = try server.connect()
        let login = [("Authorization", "Basic \(Data("admin:p@ss:word".utf8).base64EncodedString())")]
        for name in ["a", "b", "c"] { #expect(try http.json("PUT", "/\(name)", headers: login).status == 201) }
        _ = try http.json("PUT", "/_replicator", headers: login)  // made already with --directory: 412, as CouchDB
        for n in 0..<3 { #expect(try http.json("PUT", "/a/doc-\(n)", ["n": .integer(Int64(n))], headers: login).status == 201) }

        let byName = try http.json("POST", "/_replicate", ["source": "a", "target": "b"], headers: login)
        #expect(byName.status == 200 && byName.json?["history"]?[0]?["docs_written"] == 3, "\(byName.text)")
        let withCredentials = "http://admin:p%40ss%3Aword@127.0.0.1:\(server.port)"
        let byURL = try http.json("POST", "/_replicate", ["source": .string("\(withCredentials)/a"), "target": .string("\(withCredentials)/c")],
                                  headers: login)
        #expect(byURL.status == 200 && byURL.json?["history"]?[0]?["docs_written"] == 3, "\(byURL.text)")
        // Without a login the server still says no.
        #expect(try http.json("POST", "/_replicate", ["source": "a", "target": "b"]).status == 401)

        // Credentials for CouchDB in an Authorization header, and in CouchDB 3's `auth` object.
        let couchHeader = "Basic \(Data("\(couch.user):\(couch.password)".utf8).base64EncodedString())"
        let plain = "http://127.0.0.1:\(couch.port)"
        let targets = ["hdr-\(UUID().uuidString.prefix(8).lowercased())", "auth-\(UUID().uuidString.prefix(8).lowercased())"]
        let endpoints: [JSONValue] = [["url": .string("\(plain)/\(targets[0])"), "headers": ["Authorization": .string(couchHeader)]],
                                      ["url": .string("\(plain)/\(targets[1])"),
                                       "auth": ["basic": ["username": .string(couch.user), "password": .string(couch.password)]]]]
        for (n, target) in endpoints.enumerated() {
            #expect(try http.json("PUT", "/_replicator/job-\(n)", ["source": "a", "target": target, "create_target": true],
                                  headers: login).status == 201)
        }
        for (n, name) in targets.enumerated() {
            var state: JSONValue?
            #expect(try waitUntil(60) {
                state = try http.json("GET", "/_replicator/job-\(n)", headers: login).json?["_replication_state"]
                return state != nil
            })
            let document = try http.json("GET", "/_replicator/job-\(n)", headers: login).text
            #expect(state == "completed", "job-\(n): \(document)")
            #expect(try couch.request("GET", "/\(name)").json?["doc_count"] == 3, "\(name)")
        }
    }
}
