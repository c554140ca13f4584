import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `validate_doc_update` on Sofa's own write paths and its limits (#29): the CLI, a pull from
/// CouchDB, a function that loops or eats memory, and an external query server.
extension CouchDBInteropTests {
    static let addressRule = "function(n) { if (!n._deleted && !n.address) throw({forbidden: 'Document must have an address.'}); }"

    @Test func theCLIAndAPullAreValidated() throws {
        let local = directory.appending("guarded.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("put", local, "_design/rules", JSONValue.object(["validate_doc_update": .string(Self.addressRule)]).jsonString()).succeeded)
        let refused = try sofa("put", local, "a", #"{"name":"x"}"#)
        #expect(refused.status == 1 && refused.stderr.contains("Document must have an address."), "\(refused.stderr)")
        #expect(try sofa("cat", local, "a").status == 1)
        #expect(try sofa("put", local, "a", #"{"address":"here"}"#).succeeded)

        // A pull from CouchDB stores what the validator allows and names what it refuses.
        let remote = try couch.newDatabase("to-guard")
        #expect(try couch.request("PUT", "/\(remote)/good", ["address": "x"]).status == 201)
        #expect(try couch.request("PUT", "/\(remote)/bad", ["name": "y"]).status == 201)
        let pulled = try sofa("pull", local, couch.url(remote))
        #expect(pulled.stderr.contains("bad") && pulled.stderr.contains("Document must have an address."), "\(pulled.stderr)")
        #expect(try sofa("cat", local, "good").succeeded)
        #expect(try sofa("cat", local, "bad").status == 1)
    }

    @Test func aFunctionThatLoopsOrEatsMemoryFailsTheSaveAndTheNextSaveWorks() throws {
        let local = directory.appending("limits.sofa")
        #expect(try sofa("create", local).succeeded)
        let rule = """
            function(n) {
              if (n.loop) { while (true) {} }
              if (n.eat) { const all = []; while (true) all.push(new Array(1e6).fill(1)); }
              if (!n.address) throw({forbidden: 'Document must have an address.'});
            }
            """
        #expect(try sofa("put", local, "_design/rules", JSONValue.object(["validate_doc_update": .string(rule)]).jsonString()).succeeded)
        let environment = ["SOFA_QUERY_SERVER_TIMEOUT": "1"]
        let looped = try ChildProcess([sofaBinary, "put", local, "a", #"{"address":"x","loop":true}"#], environment: environment).wait()
        #expect(looped.status == 1 && looped.stderr.contains("did not return within 1"), "\(looped.stderr)")
        // The memory cap ends it, not the clock: time enough for a loaded machine to fill 320 MiB.
        let ate = try ChildProcess([sofaBinary, "put", local, "a", #"{"address":"x","eat":true}"#],
                                   environment: ["SOFA_QUERY_SERVER_TIMEOUT": "60"]).wait()
        #expect(ate.status == 1 && ate.stderr.contains("out of memory"), "\(ate.stderr)")
        #expect(try sofa("cat", local, "a").status == 1, "nothing was saved")
        // The server keeps answering after a function it had to kill, and a query server that
        // ran out of memory is ended, not lent again with its heap full.
        let patient = try ServedDatabases([local], environment: ["SOFA_QUERY_SERVER_TIMEOUT": "60"])
        let greedy = try patient.connect().json("PUT", "/limits/e", ["address": "x", "eat": true])
        #expect(greedy.status == 500 && greedy.json?["error"] == "os_process_error" && greedy.text.contains("out of memory"), "\(greedy.text)")
        #expect(try patient.connect().json("PUT", "/limits/f", ["address": "x"]).status == 201)
        let children = try shell("pgrep -P \(patient.process.pid) sofa-js").stdout.split(separator: "\n").compactMap { Int32($0) }
        #expect(!children.isEmpty)
        for child in children {
            let rss = (try? String(contentsOfFile: "/proc/\(child)/status", encoding: .utf8))?.split(separator: "\n")
                .first { $0.hasPrefix("VmRSS:") }.flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true)[1]) } ?? 0
            #expect(rss * 1024 <= 64 << 20, "sofa-js \(child) kept at \(rss) kB")
        }
        _ = patient.stop()
        let server = try ServedDatabases([local])
        let http = try server.connect()
        let killed = try http.json("PUT", "/limits/b", ["address": "x", "loop": true])
        #expect(killed.status == 500, "\(killed.text)")
        #expect(try http.json("PUT", "/limits/b", ["address": "x"]).status == 201)
        #expect(try http.json("PUT", "/limits/c", ["nothing": true]).status == 403)
    }

    /// CouchDB's replicator pushing into sofa serve: what the validator refuses is counted in
    /// `doc_write_failures`, as a CouchDB target with the same validator counts it.
    @Test func couchDBsReplicatorMeetsTheValidatorAsItWouldInCouchDB() throws {
        let source = try couch.newDatabase("unguarded")
        for (id, body) in [("good-1", ["address": "x"]), ("bad", ["name": "y"]), ("good-2", ["address": "z"])] as [(String, JSONObject)] {
            #expect(try couch.request("PUT", "/\(source)/\(id)", .object(body)).status == 201)
        }
        let guarded = try couch.newDatabase("guarded")
        #expect(try couch.request("PUT", "/\(guarded)/_design/rules", ["validate_doc_update": .string(Self.addressRule)]).status == 201)
        let local = directory.appending("guarded.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("put", local, "_design/rules", JSONValue.object(["validate_doc_update": .string(Self.addressRule)]).jsonString()).succeeded)
        let server = try ServedDatabases([local])
        let auth = "http://\(couch.user):\(couch.password)@127.0.0.1:\(couch.port)"
        var outcomes: [String] = []
        for target in ["\(auth)/\(guarded)", "http://127.0.0.1:\(server.port)/guarded"] {
            let pushed = try couch.request("POST", "/_replicate", ["source": .string("\(auth)/\(source)"), "target": .string(target)])
            let history = pushed.json?["history"]?[0]
            outcomes.append("\(pushed.status) written \(history?["docs_written"] ?? .null) failures \(history?["doc_write_failures"] ?? .null)")
        }
        #expect(outcomes[0] == "200 written 2 failures 1", "\(outcomes)")
        #expect(outcomes[1] == outcomes[0], "\(outcomes)")
        #expect(try server.connect().json("GET", "/guarded/bad").status == 404)
        #expect(try server.connect().json("GET", "/guarded/good-2").status == 200)
    }

    /// `sofa pull --filter` asks CouchDB to run its filter; `sofa push --filter` runs the local one.
    @Test func pullAndPushWithAFilterFunction() throws {
        let filters: JSONObject = ["filters": ["typed": "function(doc, req) { return doc.type === req.query.type; }"]]
        let remote = try couch.newDatabase("filtered")
        #expect(try couch.request("PUT", "/\(remote)/_design/f", .object(filters)).status == 201)
        for (id, type) in [("a1", "a"), ("b1", "b"), ("a2", "a")] {
            #expect(try couch.request("PUT", "/\(remote)/\(id)", ["type": .string(type)]).status == 201)
        }
        let local = directory.appending("filtered.sofa")
        #expect(try sofa("create", local).succeeded)
        let pulled = try sofa("pull", local, couch.url(remote), "--filter", "f/typed", "--query-param", "type=a")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(try sofa("cat", local, "a1").succeeded && sofa("cat", local, "a2").succeeded)
        #expect(try sofa("cat", local, "b1").status == 1, "filtered out")

        // Pushing: the local design document's filter, run here.
        #expect(try sofa("put", local, "_design/f", JSONValue.object(filters).jsonString()).succeeded)
        #expect(try sofa("put", local, "b2", #"{"type":"b"}"#).succeeded)
        let target = try couch.newDatabase("pushed-filtered")
        let pushed = try sofa("push", local, couch.url(target), "--filter", "f/typed", "--query-param", "type=b")
        #expect(pushed.succeeded, "\(pushed.stderr)")
        let ids = try couch.request("GET", "/\(target)/_all_docs").json?["rows"]?.arrayValue?.compactMap { $0["id"]?.stringValue }
        #expect(ids == ["b2"], "\(String(describing: ids))")
        let missing = try sofa("push", local, couch.url(target), "--filter", "f/nope")
        #expect(missing.status == 1 && missing.stderr.contains("nope"), "\(missing.stderr)")
    }

    @Test func anExternalQueryServerCanBeNamed() throws {
        // A query server in Python speaking CouchDB's protocol, as [query_servers] allows.
        let script = directory.appending("query_server.py")
        try """
            import json, sys
            for line in sys.stdin:
                command = json.loads(line)
                if command[0] == "ddoc" and command[1] == "new":
                    answer = True
                elif command[0] == "ddoc" and command[2] == ["validate_doc_update"]:
                    new_doc = command[3][0]
                    answer = 1 if new_doc.get("python") else {"forbidden": "python says no"}
                else:
                    answer = ["error", "unknown_command", command[0]]
                print(json.dumps(answer), flush=True)
            """.write(toFile: script, atomically: true, encoding: .utf8)
        let local = directory.appending("external.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("put", local, "_design/rules", #"{"validate_doc_update":"not JavaScript at all"}"#).succeeded)
        let environment = ["SOFA_QUERY_SERVER_JAVASCRIPT": "python3 \(script)"]
        let refused = try ChildProcess([sofaBinary, "put", local, "a", #"{"n":1}"#], environment: environment).wait()
        #expect(refused.status == 1 && refused.stderr.contains("python says no"), "\(refused.stderr)")
        let allowed = try ChildProcess([sofaBinary, "put", local, "a", #"{"python":true}"#], environment: environment).wait()
        #expect(allowed.succeeded, "\(allowed.stderr)")
    }
}
