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
