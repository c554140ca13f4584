import DocumentModel
import DocumentStore
import Foundation
@testable import HTTPTransport
import Testing
import TestSupport

/// Replication with a live Apache CouchDB 3.4.3 (`LiveCouchDB`), both ways and with
/// CouchDB's own replicator, on a scenario that covers CouchDB's defaults: text and JSON
/// attachments it stores gzip-encoded, inline attachments with revpos 0, bodies of 0 B,
/// 1 B and 3 MiB, conflicts, a deleted branch, tombstones, a design document, `_local`
/// documents, 100 revisions, and odd ids and attachment names.
@Suite struct CouchDBInteropTests {
    let couch = LiveCouchDB.shared
    let directory = TemporaryDirectory()

    static let oddIDs = ["unicode-é😀", "a/b", "a+b", "with space", "100%"]

    /// Builds the scenario in CouchDB database `db`.
    func makeScenario(_ db: String) throws {
        func check(_ response: HTTPResponse, _ what: String) throws {
            guard response.status < 300 else { throw TestFailure("\(what): \(response.status) \(response.text)") }
        }
        func path(_ id: String, _ attachment: String? = nil) -> String {
            "/\(db)/" + couch.percentEncoded(id)
                + (attachment.map { "/" + $0.split(separator: "/").map { couch.percentEncoded(String($0)) }.joined(separator: "/") } ?? "")
        }
        // Attachments CouchDB stores gzip-encoded (text/*, JSON), made the way clients do.
        try check(couch.upload(path("text-doc", "notes.txt"), Array(String(repeating: "hello, text body\n", count: 200).utf8),
                               contentType: "text/plain"), "text attachment")
        try check(couch.upload(path("json-doc", "data.json"), Array(#"{"list":[1,2,3],"name":"json attachment"}"#.utf8),
                               contentType: "application/json"), "json attachment")
        // Bodies of 0 B, 1 B and 3 MiB on one document, one revision each.
        var rev = try #require(try couch.upload(path("sizes", "empty.bin"), [], contentType: "application/octet-stream").json?["rev"]?.stringValue)
        rev = try #require(try couch.upload(path("sizes", "one.bin") + "?rev=\(rev)", [7], contentType: "application/octet-stream").json?["rev"]?.stringValue)
        var generator = SystemRandomNumberGenerator()
        let big = (0..<(3 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try check(couch.upload(path("sizes", "big.bin") + "?rev=\(rev)", big, contentType: "application/octet-stream"), "3 MiB body")
        // Inline attachments through _bulk_docs with new_edits=false: CouchDB gives them revpos 0.
        let inline = Data("inline body\n".utf8).base64EncodedString()
        try check(couch.request("POST", "/\(db)/_bulk_docs", [
            "new_edits": false,
            "docs": [
                ["_id": "inline-doc", "_rev": "1-0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a", "kind": "inline",
                 "_attachments": ["dir/sub file é.txt": ["content_type": "text/plain", "data": .string(inline)],
                                  "raw.bin": ["content_type": "application/octet-stream", "data": "AAECAw=="]]],
                // Three conflicting branches of one document.
                ["_id": "conflicted", "_rev": "2-b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1", "branch": 1,
                 "_revisions": ["start": 2, "ids": ["b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1", "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"]]],
                ["_id": "conflicted", "_rev": "2-b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2", "branch": 2,
                 "_revisions": ["start": 2, "ids": ["b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2", "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"]]],
                ["_id": "conflicted", "_rev": "2-b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3", "branch": 3,
                 "_revisions": ["start": 2, "ids": ["b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3b3", "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"]]],
                // A document with a live branch and a deleted one.
                ["_id": "half-deleted", "_rev": "2-c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1", "alive": true,
                 "_revisions": ["start": 2, "ids": ["c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1", "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0"]]],
                ["_id": "half-deleted", "_rev": "2-c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2", "_deleted": true,
                 "_revisions": ["start": 2, "ids": ["c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2", "c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0c0"]]],
            ],
        ]), "_bulk_docs new_edits=false")
        // A tombstone, a design document, a _local document.
        let gone = try #require(try couch.request("PUT", path("gone"), ["soon": "deleted"]).json?["rev"]?.stringValue)
        try check(couch.request("DELETE", path("gone") + "?rev=\(gone)"), "delete")
        try check(couch.request("PUT", "/\(db)/_design/app", ["language": "javascript", "views": ["all": ["map": "function(doc){emit(doc._id)}"]]]), "design")
        try check(couch.request("PUT", "/\(db)/_local/private", ["never": "replicated"]), "_local")
        // One hundred revisions.
        var long = try #require(try couch.request("PUT", path("long"), ["n": 0]).json?["rev"]?.stringValue)
        for n in 1..<100 {
            long = try #require(try couch.request("PUT", path("long"), ["n": .integer(Int64(n)), "_rev": .string(long)]).json?["rev"]?.stringValue)
        }
        // Ids and attachment names that need escaping.
        for id in CouchDBInteropTests.oddIDs {
            try check(couch.request("PUT", path(id), ["id": .string(id)]), "odd id \(id)")
        }
        try check(couch.upload(path("names", "dir/sub dir/ünï cödé.bin"), Array("nested".utf8), contentType: "application/octet-stream"), "odd name")
    }

    /// What must survive replication, document by document, read over HTTP from any server
    /// with CouchDB's API: every leaf with its `_revisions`, deletion, properties, and each
    /// attachment's type, length, revpos and the MD5 of its bytes as served; and the winner.
    /// With `digests`, each attachment's digest as the server names it too (between two
    /// CouchDB databases, where both compute it the same way).
    func describe(port: Int, _ db: String, digests: Bool = false) throws -> [String: String] {
        let connection = try HTTPConnection(port: port)
        defer { connection.close() }
        let auth = [("Authorization", "Basic " + Data("\(couch.user):\(couch.password)".utf8).base64EncodedString())]
        func get(_ path: String, accept: String = "application/json") throws -> HTTPResponse {
            let answer = try connection.request("GET", "/\(db)/\(path)", headers: auth + [("Accept", accept)])
            guard answer.status == 200 else { throw TestFailure("GET /\(db)/\(path): \(answer.status) \(answer.text)") }
            return answer
        }
        var result: [String: String] = [:]
        let changes = try #require(try get("_changes?style=all_docs").json?["results"]?.arrayValue)
        for row in changes {
            let id = try #require(row["id"]?.stringValue)
            let segment = couch.percentEncoded(id).replacingOccurrences(of: "_design%2F", with: "_design/")
            let leaves = try #require(try get("\(segment)?open_revs=all&revs=true").json?.arrayValue)
            var lines: [String] = []
            for leaf in leaves {
                guard case .object(let doc) = leaf["ok"] ?? .null else { continue }
                let rev = doc["_rev"]?.stringValue ?? "?"
                var line = "\(rev) \(doc["_deleted"]?.boolValue == true ? "deleted " : "")"
                line += JSONValue.object(JSONObject(doc.filter { !$0.key.hasPrefix("_") }.map { ($0.key, $0.value) })).jsonString(.canonical)
                line += " history=" + (doc["_revisions"]?["ids"]?.arrayValue ?? []).compactMap(\.stringValue).joined(separator: ",")
                for (name, meta) in (doc["_attachments"]?.objectValue ?? [:]).sorted(by: { $0.key < $1.key }) {
                    let namePath = name.split(separator: "/").map { couch.percentEncoded(String($0)) }.joined(separator: "/")
                    let body = try get("\(segment)/\(namePath)?rev=\(rev)", accept: "*/*").body
                    line += " [\(name) \(meta["content_type"]?.stringValue ?? "?") \(meta["length"]?.int64Value ?? -1) "
                        + "revpos=\(meta["revpos"]?.int64Value ?? -1) md5=\(BlobKey.hexString(MessageDigest.hash(.md5, body))) served=\(body.count)"
                        + (digests ? " digest=\(meta["digest"]?.stringValue ?? "none")]" : "]")
                }
                lines.append(line)
            }
            result[id] = lines.sorted().joined(separator: "\n")
        }
        let all = try #require(try get("_all_docs").json?["rows"]?.arrayValue)
        for row in all {
            if let id = row["id"]?.stringValue, let rev = row["value"]?["rev"]?.stringValue { result[id, default: ""] += "\nwinner \(rev)" }
        }
        return result
    }

    /// Compares two descriptions, naming the first documents that differ.
    func expectSame(_ expected: [String: String], _ actual: [String: String], _ what: String) {
        #expect(expected.count >= 15, "\(what): the scenario is missing documents: \(expected.keys.sorted())")
        #expect(Set(expected.keys) == Set(actual.keys), "\(what): documents differ")
        for (id, description) in expected.sorted(by: { $0.key < $1.key }) where actual[id] != description {
            Issue.record("\(what): \(id) differs\nexpected: \(description)\nactual:   \(actual[id] ?? "missing")")
        }
    }

    func summary(_ result: ProcessResult) throws -> JSONValue {
        let line = try #require(result.stdout.split(separator: "\n").last, "no summary: \(result.stderr)")
        return try JSONParser.parse(Array(line.utf8))
    }

    /// The key arguments of an encrypted database (#32: the interop scenarios run once more on
    /// one), none for a plain one; `create` makes the database either way.
    func keyArguments(_ encrypted: Bool) -> [String] { encrypted ? ["--key-file", directory.appending("interop.key")] : [] }

    func create(_ path: String, encrypted: Bool) throws {
        let made = try sofa(["create", path] + (encrypted ? ["--encrypt"] : []) + keyArguments(encrypted))
        #expect(made.succeeded, "\(made.stderr)")
    }

    func open(_ path: String, encrypted: Bool) throws -> Database {
        try Database.open(at: path, secret: encrypted
            ? DatabaseSecret([UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.appending("interop.key"))))) : nil)
    }

    @Test(arguments: [false, true])
    func pullAndPushRoundTripTheScenarioAndUnchangedBodiesNeverTravelAgain(encrypted: Bool) throws {
        let source = try couch.newDatabase("scenario")
        try makeScenario(source)
        let local = directory.appending("local.sofa")
        try create(local, encrypted: encrypted)
        let keys = keyArguments(encrypted)
        let pulled = try sofa(["pull", local, couch.url(source), "--json"] + keys)
        #expect(pulled.succeeded, "\(pulled.stderr)")
        // The _local document stays behind; everything else arrives.
        #expect(try open(local, encrypted: encrypted).localDocument(withID: "_local/private") == nil)

        let copy = try couch.newDatabase("copy")
        let pushed = try sofa(["push", local, couch.url(copy), "--json"] + keys)
        #expect(pushed.succeeded, "\(pushed.stderr)")
        #expect(try summary(pushed)["doc_write_failures"]?.int64Value == 0)
        // Digests too: CouchDB gzips the text bodies again and names them as the source did.
        expectSame(try describe(port: couch.port, source, digests: true), try describe(port: couch.port, copy, digests: true),
                   "CouchDB → Sofa → CouchDB")

        // Edits on the server that keep the attachments (stubs): pulling them moves no body.
        for id in ["text-doc", "sizes", "inline-doc"] {
            var doc = try #require(try couch.request("GET", "/\(copy)/\(id)").json?.objectValue)
            doc["edited"] = true
            #expect(try couch.request("PUT", "/\(copy)/\(id)", .object(doc)).status == 201)
        }
        let again = try sofa(["pull", local, couch.url(copy), "--json"] + keys)
        #expect(again.succeeded, "\(again.stderr)")
        let totals = try summary(again)
        #expect(totals["docs_written"]?.int64Value == 3)
        #expect(totals["attachments_downloaded"]?.int64Value == 0)
        #expect(totals["attachment_bytes_downloaded"]?.int64Value == 0)
    }

    /// #30: documents with 0, 1 and 50 attachments (text CouchDB stores gzip, and binary)
    /// pulled through a proxy that refuses connections, answers 503 and resets answers
    /// halfway (the bodies come in `_bulk_get` answers, so a reset cuts a batch of them), and
    /// pushed back through 503s and a server gone silent: both end as clean runs end.
    @Test func aPullAndAPushThroughFaultsEndAsCleanRunsDo() throws {
        let source = try couch.newDatabase("faults")
        var generator = SystemRandomNumberGenerator()
        var docs: [JSONValue] = []
        for i in 0..<36 {
            var doc: JSONObject = ["_id": .string(String(format: "doc-%02d", i)), "n": .integer(Int64(i))]
            let count = [0, 1, 50][i % 3]
            var attachments = JSONObject()
            for a in 0..<count {
                let text = a % 2 == 0
                let size = count == 1 ? 150_000 + i * 1000 : 500 + a * 37
                let bytes: [UInt8] = text ? Array(String(repeating: "line \(i) \(a)\n", count: size / 10).utf8)
                    : (0..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }
                attachments["\(text ? "notes" : "blob")-\(a).\(text ? "txt" : "bin")"] =
                    ["content_type": .string(text ? "text/plain" : "application/octet-stream"), "data": .string(Data(bytes).base64EncodedString())]
            }
            if count > 0 { doc["_attachments"] = .object(attachments) }
            docs.append(.object(doc))
        }
        #expect(try couch.request("POST", "/\(source)/_bulk_docs", ["docs": .array(docs)]).status == 201)

        let clean = directory.appending("clean.sofa")
        #expect(try sofa("create", clean).succeeded)
        let cleanPull = try sofa("pull", clean, couch.url(source), "--json")
        #expect(cleanPull.succeeded, "\(cleanPull.stderr)")
        #expect(try summary(cleanPull)["attachments_downloaded"]?.int64Value == 12 * 50 + 12)

        let proxy = try FaultProxy(upstreamPort: couch.port)
        func viaProxy(_ db: String) -> String { couch.url(db).replacingOccurrences(of: ":\(couch.port)/", with: ":\(proxy.port)/") }
        let faulted = directory.appending("faulted.sofa")
        #expect(try sofa("create", faulted).succeeded)
        proxy.refuseNext(1)
        proxy.refuseServiceNext(2)
        proxy.resetNext(3, afterBytes: 400_000)
        let pulled = try ChildProcess([sofaBinary, "pull", faulted, viaProxy(source), "--json", "--retries", "8", "--retry-delay", "0.05"]).wait()
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(pulled.stderr.contains("retrying"), "the faults happened: \(pulled.stderr)")
        #expect(try ReplicationTests().snapshot(Database.open(at: faulted)) == ReplicationTests().snapshot(Database.open(at: clean)))
        #expect(try Database.open(at: faulted).check().isEmpty)

        // A server that answers _bulk_get only in JSON (CouchDB asked for JSON: bodies inline in
        // base64): the pull takes the revisions without bodies, then each body by itself.
        proxy.behave()
        proxy.replaceInRequests("Accept: multipart/mixed", with: "Accept: application/json")
        let jsonOnly = directory.appending("json-only.sofa")
        #expect(try sofa("create", jsonOnly).succeeded)
        let jsonPull = try ChildProcess([sofaBinary, "pull", jsonOnly, viaProxy(source), "--json", "-v"]).wait()
        #expect(jsonPull.succeeded, "\(jsonPull.stderr)")
        #expect(jsonPull.stderr.contains("answers _bulk_get in JSON only"), "\(jsonPull.stderr)")
        #expect(try summary(jsonPull)["attachments_downloaded"]?.int64Value == 12 * 50 + 12)
        #expect(try ReplicationTests().snapshot(Database.open(at: jsonOnly)) == ReplicationTests().snapshot(Database.open(at: clean)))
        #expect(try Database.open(at: jsonOnly).check().isEmpty)

        // Back through 503s and a server that goes silent after taking a request (the proxy
        // then drops that connection, as a restarting server would).
        proxy.behave()
        let copy = try couch.newDatabase("faults-copy")
        proxy.refuseServiceNext(2)
        let stallFrom = proxy.connections + 2
        proxy.stallNext(1, afterBytes: 0)
        let push = try ChildProcess([sofaBinary, "push", faulted, viaProxy(copy), "--json", "--retries", "8", "--retry-delay", "0.05"])
        #expect(waitUntil(30) { proxy.connections > stallFrom })
        Thread.sleep(forTimeInterval: 1)
        proxy.behave()
        let pushed = push.wait()
        #expect(pushed.succeeded, "\(pushed.stderr)")
        #expect(try summary(pushed)["doc_write_failures"]?.int64Value == 0)
        expectSame(try describe(port: couch.port, source, digests: true), try describe(port: couch.port, copy, digests: true),
                   "CouchDB → Sofa (through faults) → CouchDB")
    }

    /// After edits on both sides, the pull's `_revs_diff` has no possible ancestor (the leaf
    /// here is as new as CouchDB's), yet both descend from a revision whose attachment this
    /// database holds: CouchDB is told so (`atts_since`) and sends a stub, not the body again.
    @Test func editsOnBothSidesDoNotBringTheCommonAttachmentAgain() throws {
        let source = try couch.newDatabase("both-sides")
        var random = SystemRandomNumberGenerator()
        let photo = (0..<1_000_000).map { _ in UInt8.random(in: 0...255, using: &random) }
        #expect(try couch.request("PUT", "/\(source)/shared", ["v": 0, "_attachments": ["photo.bin": [
            "content_type": "application/octet-stream", "data": .string(Data(photo).base64EncodedString())]]]).status == 201)
        let local = directory.appending("both-sides.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(source)).succeeded)

        var theirs = try #require(try couch.request("GET", "/\(source)/shared").json?.objectValue)
        theirs["v"] = "couchdb"
        #expect(try couch.request("PUT", "/\(source)/shared", .object(theirs)).status == 201)
        let db = try Database.open(at: local)
        var mine = try db.newRevision(of: "shared")
        mine.properties["v"] = "sofa"
        try db.save(mine)

        let proxy = try FaultProxy(upstreamPort: couch.port)
        let viaProxy = couch.url(source).replacingOccurrences(of: ":\(couch.port)/", with: ":\(proxy.port)/")
        let pulled = try sofa("pull", local, viaProxy, "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(proxy.bytesFromServer < 100_000, "the pull moved \(proxy.bytesFromServer) bytes for a 1 MB body this database has")
        // CouchDB's edit is here as a conflict, its attachment the same body.
        let tree = try db.revisionTree(of: "shared")
        #expect(tree.leaves.count == 2)
        let couchLeaf = try #require(try couch.request("GET", "/\(source)/shared").json?["_rev"]?.stringValue)
        let pulledRevision = try db.revision(try #require(RevisionID(couchLeaf)), of: "shared")
        #expect(pulledRevision.properties["v"] == "couchdb")
        #expect(try db.blobs.contents(of: try #require(pulledRevision.attachments.first?.blobKey)) == photo)
        #expect(try db.check().isEmpty)
    }

    /// A session ends on CouchDB's clock (`[chttpd_auth] timeout`, 10 minutes): a push of
    /// 1,000,000 documents failed at 600 s, "not authorized" on its checkpoint. A request met
    /// by 401 with a session cookie logs in again and is asked again, once.
    @Test func aSessionThatEndedLogsInAgain() throws {
        let db = try couch.newDatabase("session")
        let client = try HTTPClient(remote: RemoteDatabase(couch.url(db)))
        try client.logIn()
        let first = try #require(client.cookie)
        // A cookie CouchDB no longer takes: the request is then anonymous, which an admin-only
        // database refuses with 401, as it refused the expired one.
        client.cookie = "AuthSession=ZW5kZWQ6MDowMA"
        let (status, json) = try client.json("PUT", "_local/checkpoint", ["n": 1])
        #expect(status == 201 && json["ok"] == true)
        #expect(client.cookie?.hasPrefix("AuthSession=") == true && client.cookie != "AuthSession=ZW5kZWQ6MDowMA" && first.hasPrefix("AuthSession="))
        // Wrong credentials still fail, after one login.
        let stranger = try HTTPClient(remote: RemoteDatabase(couch.url(db).replacingOccurrences(of: "\(couch.user):\(couch.password)@", with: "nobody:wrong@")))
        #expect(throws: ReplicationError.self) { try stranger.json("GET", "") }
    }

    @Test func aDeferredPullKeepsMetadataAndPushesOnceDownloaded() throws {
        let source = try couch.newDatabase("deferred")
        try makeScenario(source)
        let local = directory.appending("deferred.sofa")
        #expect(try sofa("create", local).succeeded)
        let pulled = try sofa("pull", local, couch.url(source), "--no-download-attachments", "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(try summary(pulled)["attachments_downloaded"]?.int64Value == 0)

        // Served by sofa serve, the deferred copy shows the same documents and metadata.
        // Pushing bodies that are not here names each document and fails.
        let early = try couch.newDatabase("early")
        let refused = try sofa("push", local, couch.url(early))
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("body_not_here") && refused.stderr.contains("sizes"), "\(refused.stderr)")

        #expect(try sofa("download", local, "--remote", couch.url(source)).succeeded)
        let copy = try couch.newDatabase("after-download")
        let pushed = try sofa("push", local, couch.url(copy))
        #expect(pushed.succeeded, "\(pushed.stderr)")
        expectSame(try describe(port: couch.port, source), try describe(port: couch.port, copy), "deferred, downloaded, pushed")
        // The push that failed did not move its checkpoint: it sends everything now.
        let retried = try sofa("push", local, couch.url(early))
        #expect(retried.succeeded, "\(retried.stderr)")
        expectSame(try describe(port: couch.port, source), try describe(port: couch.port, early), "the retried push")
    }

    /// Reads through a mount of a deferred copy: CouchDB answers ranges of the bodies it keeps
    /// as they are, and the whole gzip stream for the ones it compressed.
    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func aMountOfADeferredCopyReadsCouchDBsBodiesByRangeOrWhole() throws {
        let source = try couch.newDatabase("deferred-mount")
        try makeScenario(source)
        let local = directory.appending("deferred-mount.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(source), "--no-download-attachments").succeeded)
        let mount = try MountedDatabase(local, arguments: ["--remote", couch.url(source)])
        let big = mount.path("docs/sizes/attachments/big.bin")
        let served = try couch.request("GET", "/\(source)/sizes/big.bin")
        #expect(served.status == 200 && served.body.count == 3 << 20)
        // A few bytes from the middle: a ranged read, the body stays deferred.
        let middle = try shell("dd if='\(big)' bs=4096 skip=300 count=1 2>/dev/null | od -An -tx1")
        let expected = Array(served.body[(300 * 4096)..<(301 * 4096)])
        #expect(middle.stdout.split(whereSeparator: \.isWhitespace).map { UInt8($0, radix: 16)! } == expected)
        #expect(try shell("getfattr --only-values -n user.sofa.available '\(big)'").stdout == "false")
        // The whole of it, and a text body CouchDB serves only whole (gzip).
        #expect(try shell("sha1sum '\(big)'").stdout.hasPrefix(MessageDigest.hash(.sha1, served.body).map { String(format: "%02x", $0) }.joined()))
        let text = try shell("cat '\(mount.path("docs/text-doc/attachments/notes.txt"))'")
        #expect(text.stdout == String(repeating: "hello, text body\n", count: 200), "\(text.stderr)")
        #expect(mount.unmount().succeeded)
        #expect(try sofa("check", local).succeeded)
        // Fetched this way, the bodies push back as CouchDB had them.
        #expect(try sofa("download", local, "--remote", couch.url(source)).succeeded)
        // Evicted from the cache (CouchDB still has them: HEADs answer with their digests as ETags)
        // and fetched again, the bodies CouchDB gzips included (named by CouchDB's MD5 digests).
        let evicted = try sofa("cache", local, "--limit", "0", "--remote", couch.url(source))
        #expect(evicted.succeeded && evicted.stdout.contains("Cache:         0 B of 0 B"), "\(evicted.stdout)\(evicted.stderr)")
        let afterEviction = try Database.open(at: local)
        #expect(try afterEviction.missingBodies().count >= 2)
        let textAttachment = try #require(try afterEviction.document(withID: "text-doc")?.attachment(named: "notes.txt"))
        let couchDigest = try couch.request("GET", "/\(source)/text-doc").json?["_attachments"]?["notes.txt"]?["digest"]?.stringValue
        #expect(!textAttachment.contentAvailable && textAttachment.digest == couchDigest, "\(textAttachment.digest) vs \(couchDigest ?? "-")")
        #expect(try sofa("cache", local, "--limit", "none").succeeded)
        #expect(try sofa("download", local, "--remote", couch.url(source)).succeeded)
        #expect(try afterEviction.missingBodies().isEmpty)
        let copy = try couch.newDatabase("after-mount")
        #expect(try sofa("push", local, couch.url(copy)).succeeded)
        expectSame(try describe(port: couch.port, source), try describe(port: couch.port, copy), "read through the mount, pushed")
    }

    /// A copy of a copy keeps the digests it was given: CouchDB's scenario pulled into one Sofa
    /// database (`md5-` digests, of the bytes as stored), then pushed to another through `sofa
    /// serve` (inline bodies in `_bulk_docs`), shows the same digests on every attachment.
    /// (They came out as Sofa's `sha1-`, 500 of 500 in one `_replicate`.)
    @Test func aCopyOfACopyKeepsTheDigestsItWasGiven() throws {
        let source = try couch.newDatabase("digests")
        try makeScenario(source)
        let first = directory.appending("first.sofa"), second = directory.appending("second.sofa")
        #expect(try sofa("create", first).succeeded && sofa("create", second).succeeded)
        #expect(try sofa("pull", first, couch.url(source)).succeeded)
        let server = try ServedDatabases([second])
        #expect(try sofa("push", first, "http://127.0.0.1:\(server.port)/second").succeeded)
        let original = try Database.open(at: first), copy = try Database.open(at: second)
        var compared = 0
        for summary in try original.documents() {
            guard let given = try original.document(withID: summary.docID) else { continue }
            for attachment in given.attachments {
                #expect(attachment.digest.hasPrefix("md5-"), "\(summary.docID)/\(attachment.name): \(attachment.digest)")
                #expect(try copy.document(withID: summary.docID)?.attachment(named: attachment.name)?.digest == attachment.digest,
                        "\(summary.docID)/\(attachment.name)")
                compared += 1
            }
        }
        #expect(compared >= 5)
    }

    @Test func aPurgedBodyThatCouchDBGzipsIsFetchedAgainByCouchDBsDigest() throws {
        let source = try couch.newDatabase("purged")
        try makeScenario(source)
        let local = directory.appending("purged.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(source)).succeeded)
        // Pulled decoded and named by its own digest; purged, it goes back to the name CouchDB knows.
        #expect(try sofa("purge-attachment", local, "text-doc", "notes.txt").succeeded)
        let couchDigest = try couch.request("GET", "/\(source)/text-doc").json?["_attachments"]?["notes.txt"]?["digest"]?.stringValue
        #expect(try Database.open(at: local).document(withID: "text-doc")?.attachment(named: "notes.txt")?.digest == couchDigest)
        let fetched = try sofa("download", local, "--remote", couch.url(source))
        #expect(fetched.succeeded && fetched.stdout.contains("downloaded 1 attachment body"), "\(fetched.stdout)\(fetched.stderr)")
        #expect(try sofa("cat-attachment", local, "text-doc", "notes.txt").stdout == String(repeating: "hello, text body\n", count: 200))
        #expect(try sofa("check", local).succeeded)
    }

    @Test func sofaServeFetchesDeferredBodiesFromCouchDBWithTheRemoteCredentialsItIsGiven() throws {
        let source = try couch.newDatabase("serve-deferred")
        try makeScenario(source)
        let local = directory.appending("serve-deferred.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(source), "--no-download-attachments").succeeded)
        let expected = try couch.request("GET", "/\(source)/sizes/big.bin").body
        // The database remembers where it pulled from, never the password: without one, CouchDB says no.
        let anonymous = try ServedDatabases([local])
        let refused = try anonymous.connect().request("GET", "/serve-deferred/sizes/big.bin")
        #expect(refused.status == 502, "\(refused.status)")
        _ = anonymous.stop()
        let passwordFile = directory.appending("couch-password")
        try couch.password.write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases([local, "--remote-user", couch.user, "--remote-password-file", passwordFile])
        let served = try server.connect().request("GET", "/serve-deferred/sizes/big.bin")
        #expect(served.status == 200 && served.body == expected, "\(served.status)")
    }

    @Test(arguments: [false, true])
    func couchDBsReplicatorPushesIntoAndPullsFromSofaServe(encrypted: Bool) throws {
        let source = try couch.newDatabase("for-serve")
        try makeScenario(source)
        let served = directory.appending("served.sofa")
        try create(served, encrypted: encrypted)
        let server = try ServedDatabases([served] + keyArguments(encrypted))
        let sofaURL = "http://127.0.0.1:\(server.port)/served"
        let auth = "http://\(couch.user):\(couch.password)@127.0.0.1:\(couch.port)"

        // CouchDB's replicator pushes the scenario into sofa serve.
        let push = try couch.request("POST", "/_replicate", ["source": .string("\(auth)/\(source)"), "target": .string(sofaURL)])
        #expect(push.status == 200, "\(push.text)")
        #expect(push.json?["history"]?[0]?["doc_write_failures"]?.int64Value == 0, "\(push.text)")
        let expected = try describe(port: couch.port, source)
        expectSame(expected, try describe(port: server.port, "served"), "CouchDB's replicator → sofa serve")

        // And pulls it back out into a new database.
        let back = "back-\(UUID().uuidString.prefix(8).lowercased())"
        let pull = try couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(back)"),
                                                              "create_target": true])
        #expect(pull.status == 200, "\(pull.text)")
        #expect(pull.json?["history"]?[0]?["doc_write_failures"]?.int64Value == 0, "\(pull.text)")
        expectSame(expected, try describe(port: couch.port, back), "sofa serve → CouchDB's replicator")

        // Continuous: a document saved in Sofa reaches CouchDB while the replication runs.
        let live = "live-\(UUID().uuidString.prefix(8).lowercased())"
        let started = try couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(live)"),
                                                                 "create_target": true, "continuous": true])
        #expect(started.status == 202, "\(started.text)")
        defer {
            _ = try? couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(live)"),
                                                           "create_target": true, "continuous": true, "cancel": true])
        }
        let connection = try server.connect()
        #expect(try connection.json("PUT", "/served/arrives-later", ["late": true]).status == 201)
        #expect(try waitUntil(30) { try couch.request("GET", "/\(live)/arrives-later").status == 200 })
    }

    @Test func aDocumentCouchDBRefusesFailsThePushByNameAndIsTriedAgain() throws {
        let target = try couch.newDatabase("validated")
        let validation = "function(newDoc, oldDoc, userCtx) { if (newDoc.bad) { throw({forbidden: 'bad documents are refused'}); } }"
        #expect(try couch.request("PUT", "/\(target)/_design/guard", ["validate_doc_update": .string(validation)]).status == 201)
        let local = directory.appending("refused.sofa")
        #expect(try sofa("create", local).succeeded)
        for (id, body) in [("good-1", #"{"n":1}"#), ("the-bad-one", #"{"bad":true}"#), ("good-2", #"{"n":2}"#)] {
            #expect(try sofa("put", local, id, body).succeeded)
        }
        for _ in 0..<2 {
            let pushed = try sofa("push", local, couch.url(target))
            #expect(pushed.status == 1)
            #expect(pushed.stderr.contains("the-bad-one") && pushed.stderr.contains("forbidden")
                    && pushed.stderr.contains("bad documents are refused"), "\(pushed.stderr)")
            #expect(!pushed.stderr.contains("good-"), "\(pushed.stderr)")
        }
        #expect(try couch.request("GET", "/\(target)/good-1").status == 200)
        #expect(try couch.request("GET", "/\(target)/good-2").status == 200)
        #expect(try couch.request("GET", "/\(target)/the-bad-one").status == 404)
    }

    @Test func syncWithConcurrentEditsEndsWithTheSameWinnerOnBothSides() throws {
        let remote = try couch.newDatabase("sync")
        try makeScenario(remote)
        let local = directory.appending("sync.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(remote)).succeeded)
        // The same documents edited on both sides.
        for id in ["text-doc", "long"] {
            var doc = try #require(try couch.request("GET", "/\(remote)/\(id)").json?.objectValue)
            doc["side"] = "couchdb"
            #expect(try couch.request("PUT", "/\(remote)/\(id)", .object(doc)).status == 201)
            #expect(try sofa("put", local, id, #"{"side":"sofa"}"#).succeeded)
        }
        let synced = try sofa("sync", local, couch.url(remote))
        #expect(synced.succeeded, "\(synced.stderr)")
        let server = try ServedDatabases([local])
        expectSame(try describe(port: couch.port, remote), try describe(port: server.port, "sync"), "after sync")
    }

    /// Fills CouchDB database `db` with `count` small documents named `prefix-N`.
    func fill(_ db: String, count: Int, prefix: String) throws {
        for start in stride(from: 0, to: count, by: 5_000) {
            let docs = (start..<min(count, start + 5_000)).map { n -> JSONValue in
                ["_id": .string("\(prefix)-\(n)"), "n": .integer(Int64(n)), "text": "a small document"]
            }
            let answer = try couch.request("POST", "/\(db)/_bulk_docs", ["docs": .array(docs)])
            guard answer.status == 201 else { throw TestFailure("_bulk_docs: \(answer.status) \(answer.text)") }
        }
    }

    /// #28 item 1: CouchDB's replicator checkpoints against a database it is writing (its
    /// `instance_start_time` must not move), one-shot both ways and continuous both ways.
    @Test func couchDBsReplicatorCheckpointsAgainstSofaServeAndResumesFromThem() throws {
        let source = try couch.newDatabase("many")
        try fill(source, count: 20_000, prefix: "doc")
        let served = directory.appending("checkpointed.sofa")
        #expect(try sofa("create", served).succeeded)
        let passwordFile = directory.appending("serve-password")
        try "pw".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases([served, "--user", "admin", "--password-file", passwordFile])
        let sofaURL = "http://admin:pw@127.0.0.1:\(server.port)/checkpointed"
        let auth = "http://\(couch.user):\(couch.password)@127.0.0.1:\(couch.port)"

        // One-shot into sofa serve: every document, a checkpoint, and nothing to do the second time.
        let push = try couch.request("POST", "/_replicate", ["source": .string("\(auth)/\(source)"), "target": .string(sofaURL)])
        #expect(push.status == 200 && push.json?["ok"]?.boolValue == true, "\(push.text.prefix(400))")
        #expect(push.json?["history"]?[0]?["docs_written"]?.int64Value == 20_000, "\(push.text.prefix(400))")
        #expect(push.json?["history"]?[0]?["recorded_seq"]?.stringValue != nil, "\(push.text.prefix(400))")
        let again = try couch.request("POST", "/_replicate", ["source": .string("\(auth)/\(source)"), "target": .string(sofaURL)])
        #expect(again.json?["no_changes"]?.boolValue == true, "\(again.text.prefix(400))")

        // One-shot out of sofa serve, then nothing to do the second time.
        let back = "back-\(UUID().uuidString.prefix(8).lowercased())"
        let pull = try couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(back)"),
                                                              "create_target": true])
        #expect(pull.status == 200 && pull.json?["history"]?[0]?["docs_written"]?.int64Value == 20_000, "\(pull.text.prefix(400))")
        let pullAgain = try couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(back)")])
        #expect(pullAgain.json?["no_changes"]?.boolValue == true, "\(pullAgain.text.prefix(400))")

        // Continuous both ways (_replicator documents, a checkpoint every second) while both sides are written.
        #expect(try couch.request("PUT", "/_replicator").status < 500)
        let jobs = ["to-sofa-\(UUID().uuidString.prefix(8).lowercased())": (source: "\(auth)/\(source)", target: sofaURL),
                    "from-sofa-\(UUID().uuidString.prefix(8).lowercased())": (source: sofaURL, target: "\(auth)/\(source)")]
        for (id, job) in jobs {
            let made = try couch.request("PUT", "/_replicator/\(id)", ["source": .string(job.source), "target": .string(job.target),
                                                                       "continuous": true, "checkpoint_interval": 1000])
            #expect(made.status == 201, "\(made.text)")
        }
        defer {
            for id in jobs.keys {
                if let rev = try? couch.request("GET", "/_replicator/\(id)").json?["_rev"]?.stringValue {
                    _ = try? couch.request("DELETE", "/_replicator/\(id)?rev=\(rev)")
                }
            }
        }
        let connection = try server.connect()
        let auth64 = Data("admin:pw".utf8).base64EncodedString()
        for round in 0..<8 {
            #expect(try connection.json("PUT", "/checkpointed/sofa-\(round)", ["round": .integer(Int64(round))],
                                        headers: [("Authorization", "Basic \(auth64)")]).status == 201)
            #expect(try couch.request("PUT", "/\(source)/couch-\(round)", ["round": .integer(Int64(round))]).status == 201)
            usleep(500_000)
        }
        // Both arrive on the other side, and each job has checkpointed past them without crashing.
        #expect(try waitUntil(30) {
            try couch.request("GET", "/\(source)/sofa-7").status == 200
                && connection.json("GET", "/checkpointed/couch-7", headers: [("Authorization", "Basic \(auth64)")]).status == 200
        })
        usleep(3_000_000)
        for id in jobs.keys {
            let state = try couch.request("GET", "/_scheduler/docs/_replicator/\(id)")
            #expect(state.json?["state"]?.stringValue == "running", "\(id): \(state.text)")
            #expect(state.json?["error_count"]?.int64Value ?? 0 == 0, "\(id): \(state.text)")
            #expect(state.json?["info"]?["checkpointed_source_seq"]?.stringValue != nil, "\(id): \(state.text)")
        }
        let couchCount = try couch.request("GET", "/\(source)").json?["doc_count"]?.int64Value
        let sofaCount = try connection.json("GET", "/checkpointed", headers: [("Authorization", "Basic \(auth64)")]).json?["doc_count"]?.int64Value
        #expect(couchCount == 20_016 && sofaCount == 20_016, "CouchDB \(String(describing: couchCount)), Sofa \(String(describing: sofaCount))")
    }
}
