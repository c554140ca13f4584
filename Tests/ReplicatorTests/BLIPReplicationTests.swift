import DocumentModel
import DocumentStore
import Foundation
import TestSupport
import Testing

/// Sofa's replicator with a Couchbase Lite endpoint (`sofa pull|push|sync DB ws://…`): the
/// same routine as with CouchDB, BLIP as the remote peer, against `sofa serve`'s `_blipsync`
/// and, through it, Couchbase Lite's own replicator.
@Suite(.serialized) struct BLIPReplicationTests {
    let directory = TemporaryDirectory()

    func made(_ name: String) throws -> String { try directory.newDatabase(name) }

    @Test func pullAndPushOverBLIPCarryRevisionsHistoriesBodiesAndDeletions() throws {
        let source = try Database.create(at: directory.appending("source.sofa"))
        let photo = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 17 &+ $0 >> 8) }
        var draft = try source.newRevision(of: "with-blob")
        draft.properties["title"] = "blob"
        try draft.setBlob(at: "/photo", blob: source.blobs.write(photo), contentType: "image/jpeg")
        _ = try source.save(draft)
        var attached = try source.newRevision(of: "with-attachment")
        try attached.setAttachment("notes.txt", blob: source.blobs.write(Array("hello".utf8)), contentType: "text/plain")
        _ = try source.save(attached)
        // More than the server keeps unanswered (32 revisions), in one batch of the replicator's.
        try source.inBatch { batch in
            for index in 0..<300 {
                var draft = try source.newRevision(of: "doc-\(index)")
                draft.properties = ["index": .integer(Int64(index)), "name": "Zoë"]
                try batch.save(draft)
            }
        }
        var edited = try source.newRevision(of: "doc-0")
        edited.properties["edited"] = true
        _ = try source.save(edited)
        _ = try source.deleteDocument("doc-1", revID: try #require(try source.currentRevision(of: "doc-1")).revID)
        let target = try made("target")
        let server = try ServedDatabases([source.path, target])
        let ws = "ws://127.0.0.1:\(server.port)"

        let local = try made("local")
        let pulled = try sofa("pull", local, "\(ws)/source", "--json")
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")
        let copy = try Database.open(at: local)
        for id in ["with-blob", "with-attachment", "doc-0", "doc-1", "doc-299"] {
            let mine = try copy.revisionTree(of: id)
            let theirs = try source.revisionTree(of: id)
            #expect(mine.leaves.map(\.id) == theirs.leaves.map(\.id), "\(id)")
            let winner = try #require(theirs.leaves.first?.id)
            #expect(mine.history(of: winner) == theirs.history(of: winner), "\(id)")
        }
        #expect(try copy.currentRevision(of: "doc-1")?.deleted == true)
        #expect(try copy.blobs.contents(of: BlobKey.of(photo)) == photo)
        let note = try #require(try copy.currentRevision(of: "with-attachment")?.attachments.first)
        #expect(try copy.blobs.contents(of: try #require(note.blobKey)) == Array("hello".utf8))
        // Some documents only (the server filters the subscription by id).
        let some = try made("some")
        #expect(try sofa("pull", some, "\(ws)/source", "--doc-ids", "doc-7,with-blob").succeeded)
        #expect(try Database.open(at: some).changes(since: 0).map(\.docID).sorted() == ["doc-7", "with-blob"])
        // Again: nothing new, nothing read.
        #expect(try sofa("pull", local, "\(ws)/source").stdout.contains("0 documents read"))

        // Pushed into an empty database over BLIP: the same, bodies asked of this side.
        let pushed = try sofa("push", local, "\(ws)/target")
        #expect(pushed.succeeded, "\(pushed.stdout)\(pushed.stderr)")
        let far = try Database.open(at: target)
        #expect(try far.currentRevision(of: "doc-0")?.properties["edited"] == true)
        #expect(try far.currentRevision(of: "doc-1")?.deleted == true)
        #expect(try far.blobs.contents(of: BlobKey.of(photo)) == photo)
        #expect(try far.revisionTree(of: "doc-0").leaves.map(\.id) == source.revisionTree(of: "doc-0").leaves.map(\.id))
        #expect(try sofa("push", local, "\(ws)/target").stdout.contains("0 documents read"))

        // And Couchbase Lite pulls what Sofa pushed.
        let app = directory.appending("app.cblite2")
        #expect(try CouchbaseLite.pull(app, from: "\(ws)/target").succeeded)
        #expect(try CouchbaseLite.documents(app).count == 301)  // 302 documents, one deleted
    }

    @Test func anEditOfARevisionThatIsNoLongerCurrentIsRefusedWithItsReason() throws {
        let served = try made("shared")
        let server = try ServedDatabases([served])
        let url = "ws://127.0.0.1:\(server.port)/shared"
        let http = try server.connect()
        #expect(try http.json("PUT", "/shared/note", ["v": 1]).status == 201)
        let local = try made("mine")
        #expect(try sofa("pull", local, url).succeeded)
        let db = try Database.open(at: local)
        var mine = try db.newRevision(of: "note")
        mine.properties["v"] = "mine"
        _ = try db.save(mine)
        let current = try #require(http.json("GET", "/shared/note").json?["_rev"]?.stringValue)
        #expect(try http.json("PUT", "/shared/note?rev=\(current)", ["v": "theirs"]).status == 201)

        let refused = try sofa("push", local, url, "--json")
        #expect(refused.stdout.contains("\"conflict\"") && refused.stdout.contains("pull, resolve"), "\(refused.stdout)\(refused.stderr)")
        #expect(try http.json("GET", "/shared/note").json?["v"] == "theirs")
        // The pull brings the conflict here, as CouchDB's replication would.
        #expect(try sofa("pull", local, url).succeeded)
        #expect(try db.revisionTree(of: "note").leaves.count == 2)
    }

    @Test func refusalsAreHTTPsAndAContinuousSyncFollowsBothSides() throws {
        let served = try made("guarded")
        try "secret\n".write(toFile: directory.appending("password"), atomically: true, encoding: .utf8)
        let server = try ServedDatabases([served, "--user", "admin", "--password-file", directory.appending("password")])
        let local = try made("follower")
        let anonymous = try sofa("pull", local, "ws://127.0.0.1:\(server.port)/guarded")
        #expect(!anonymous.succeeded && anonymous.stderr.contains("not authorized"), "\(anonymous.stderr)")
        let missing = try sofa("pull", local, "ws://admin:secret@127.0.0.1:\(server.port)/nowhere")
        #expect(!missing.succeeded && missing.stderr.contains("404"), "\(missing.stderr)")

        let url = "ws://admin:secret@127.0.0.1:\(server.port)/guarded"
        let follower = try ChildProcess([sofaBinary, "sync", "--continuous", local, url])
        defer { follower.kill(SIGINT); _ = follower.wait() }
        let http = try server.connect()
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        #expect(try http.json("PUT", "/guarded/from-server", ["n": 1], headers: admin).status == 201)
        let db = try Database.open(at: local)
        #expect(try waitUntil(20) { try db.currentRevision(of: "from-server") != nil })
        _ = try db.put("from-here", ["n": 2])
        #expect(try waitUntil(20) { try http.json("GET", "/guarded/from-here", headers: admin).status == 200 })
    }

    /// A conflict pulled over `ws://` and resolved here (its losing branch removed, with `sofa rm
    /// --rev` or `rm -r conflicts/REV` in the mount) is pushed to a server that takes only
    /// revisions following its current one, whichever side's content won: the resolution goes as
    /// a new revision on the server's branch, as Couchbase Lite's resolvers make it.
    @Test func aConflictResolvedHereIsPushedWhicheverSideWon() throws {
        let served = try made("agreed")
        let server = try ServedDatabases([served])
        let url = "ws://127.0.0.1:\(server.port)/agreed"
        let http = try server.connect()
        let ids = isRoot ? ["keep-mine", "keep-theirs", "in-mount"] : ["keep-mine", "keep-theirs"]
        for id in ids { #expect(try http.json("PUT", "/agreed/\(id)", ["v": 0]).status == 201) }
        let local = try made("resolver")
        #expect(try sofa("pull", local, url).succeeded)
        let db = try Database.open(at: local)
        var theirs: [String: String] = [:], mine: [String: String] = [:]
        for id in ids {
            var draft = try db.newRevision(of: id)
            draft.properties["v"] = "mine"
            mine[id] = try db.save(draft).revID.description
            let base = try #require(try http.json("GET", "/agreed/\(id)").json?["_rev"]?.stringValue)
            theirs[id] = try #require(try http.json("PUT", "/agreed/\(id)?rev=\(base)", ["v": "theirs"]).json?["rev"]?.stringValue)
        }
        #expect(try sofa("pull", local, url).succeeded)
        for id in ids { #expect(try db.revisionTree(of: id).leaves.filter { !$0.deleted }.count == 2, "\(id)") }

        let loser = try sofa("rm", local, "keep-mine", "--rev", try #require(theirs["keep-mine"]))
        #expect(loser.succeeded, "\(loser.stdout)\(loser.stderr)")
        #expect(try sofa("rm", local, "keep-theirs", "--rev", try #require(mine["keep-theirs"])).succeeded)
        if isRoot {
            let mount = try MountedDatabase(local)
            let branch = mount.path("docs/in-mount/conflicts/\(try #require(theirs["in-mount"]))")
            #expect(FileManager.default.fileExists(atPath: branch))
            #expect(try shell("rm -r '\(branch)'").succeeded)
            mount.unmount()
        }
        let pushed = try sofa("push", local, url, "--json")
        #expect(pushed.succeeded && pushed.stdout.contains("\"doc_write_failures\":0"), "\(pushed.stdout)\(pushed.stderr)")
        for id in ids {
            let answer = try http.json("GET", "/agreed/\(id)?conflicts=true").json
            #expect(answer?["v"] == (id == "keep-theirs" ? "theirs" : "mine"), "\(id): \(String(describing: answer))")
            #expect(answer?["_conflicts"] == nil, "\(id): \(String(describing: answer))")
            #expect(try db.currentRevision(of: id)?.revID.description == answer?["_rev"]?.stringValue, "\(id)")
            #expect(try db.revisionTree(of: id).leaves.filter { !$0.deleted }.count == 1, "\(id)")
        }
        // Nothing more to send; and Couchbase Lite pulls the documents without a conflict.
        #expect(try sofa("push", local, url).stdout.contains("0 documents read"))
        let app = directory.appending("agreed.cblite2")
        #expect(try CouchbaseLite.pull(app, from: url).succeeded)
        #expect(try CouchbaseLite.documents(app)["keep-mine"]?["v"] == "mine")
        #expect(!(try CouchbaseLite.revisions(app, "keep-mine")).contains("Conflicted"))
    }

    /// A document `sofa push ws://` cannot send is named with the reason, as over `http://`; and a
    /// database pulled over `http://` goes on from that checkpoint over `ws://` (one checkpoint).
    @Test func refusalsSayWhyAndOneCheckpointServesHTTPAndWebSockets() throws {
        let source = try Database.create(at: directory.appending("origin.sofa"))
        var draft = try source.newRevision(of: "big")
        try draft.setAttachment("big.bin", blob: source.blobs.write([UInt8](repeating: 7, count: 100_000)), contentType: "application/octet-stream")
        _ = try source.save(draft)
        for index in 0..<5 { _ = try source.put("small-\(index)", ["n": .integer(Int64(index))]) }
        let target = try made("destination")
        let server = try ServedDatabases([source.path, target])
        let local = try made("laptop")
        let overHTTP = try sofa("pull", local, "http://127.0.0.1:\(server.port)/origin", "--no-download-attachments")
        #expect(overHTTP.succeeded && overHTTP.stdout.contains("6 documents read"), "\(overHTTP.stdout)\(overHTTP.stderr)")
        let overWS = try sofa("pull", local, "ws://127.0.0.1:\(server.port)/origin", "--json")
        #expect(overWS.succeeded && overWS.stdout.contains("\"missing_checked\":0"), "\(overWS.stdout)\(overWS.stderr)")

        let pushed = try sofa("push", local, "ws://127.0.0.1:\(server.port)/destination", "--json")
        #expect(pushed.stdout.contains("body_not_here") && pushed.stdout.contains("sofa download fetches it"), "\(pushed.stdout)\(pushed.stderr)")
        #expect(try Database.open(at: target).currentRevision(of: "small-4") != nil)
        #expect(try Database.open(at: target).currentRevision(of: "big") == nil)
    }

    /// Bodies a pull leaves on a Couchbase Lite endpoint come when read, with `getAttachment`:
    /// `sofa download`, and a read through the mount.
    @Test func bodiesLeftOnTheServerComeWhenRead() throws {
        let source = try Database.create(at: directory.appending("bodies.sofa"))
        let big = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 29 &+ $0 >> 10) }
        let small = Array("a small body".utf8)
        var draft = try source.newRevision(of: "album")
        try draft.setBlob(at: "/cover", blob: source.blobs.write(big), contentType: "image/jpeg")
        try draft.setAttachment("note.txt", blob: source.blobs.write(small), contentType: "text/plain")
        _ = try source.save(draft)
        let server = try ServedDatabases([source.path])
        let url = "ws://127.0.0.1:\(server.port)/bodies"

        let local = try made("lazy")
        let pulled = try sofa("pull", local, url, "--no-download-attachments")
        #expect(pulled.succeeded && pulled.stdout.contains("2 deferred"), "\(pulled.stdout)\(pulled.stderr)")
        let db = try Database.open(at: local)
        #expect(try db.currentRevision(of: "album")?.attachments.allSatisfy { !$0.contentAvailable } == true)

        if isRoot {
            let mount = try MountedDatabase(local, arguments: ["--remote", url])
            #expect(try Array(Data(contentsOf: URL(fileURLWithPath: mount.path("docs/album/attachments/note.txt")))) == small)
            #expect(try Array(Data(contentsOf: URL(fileURLWithPath: mount.path("docs/album/blobs/cover")))) == big)
            mount.unmount()
        }
        let downloaded = try sofa("download", local)
        #expect(downloaded.succeeded, "\(downloaded.stdout)\(downloaded.stderr)")
        let after = try #require(try Database.open(at: local).currentRevision(of: "album"))
        #expect(after.attachments.allSatisfy { $0.contentAvailable })
        #expect(try db.blobs.contents(of: BlobKey.of(big)) == big)
    }

    /// `wss://`: TLS ended in front of the server (socat), verified against the CA given.
    @Test func wssIsVerifiedTLS() throws {
        let served = try made("secure")
        let server = try ServedDatabases([served])
        let db = try Database.open(at: served)
        _ = try db.put("secret", ["n": 1])
        let key = directory.appending("key.pem"), certificate = directory.appending("cert.pem")
        let generated = try shell("openssl req -x509 -newkey rsa:2048 -nodes -keyout \(key) -out \(certificate) -days 2 -subj /CN=localhost "
                             + "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>&1")
        #expect(generated.succeeded, "\(generated.stdout)")
        // A free port for socat: bound, read, released.
        let probe = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(probe, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(probe, $0, &length) } }
        let port = Int(UInt16(bigEndian: address.sin_port))
        close(probe)
        let tls = try ChildProcess(["/usr/bin/socat", "OPENSSL-LISTEN:\(port),bind=127.0.0.1,reuseaddr,fork,cert=\(certificate),key=\(key),verify=0",
                                    "TCP:127.0.0.1:\(server.port)"])
        defer { tls.kill(SIGTERM); _ = tls.wait() }
        #expect(waitUntil { (try? HTTPConnection(port: port)) != nil }, "socat listens")

        let local = try made("secure-copy")
        let untrusted = try sofa("pull", local, "wss://127.0.0.1:\(port)/secure")
        #expect(!untrusted.succeeded && untrusted.stderr.contains("not trusted"), "\(untrusted.stderr)")
        let trusted = try sofa("pull", local, "wss://127.0.0.1:\(port)/secure", "--cacert", certificate)
        #expect(trusted.succeeded, "\(trusted.stderr)")
        #expect(try Database.open(at: local).currentRevision(of: "secret") != nil)
        // Couchbase Lite's replicator the same way.
        let app = directory.appending("secure.cblite2")
        let pulled = try CouchbaseLite.pull(app, from: "wss://localhost:\(port)/secure", ["--cacert", certificate])
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")
        #expect(try CouchbaseLite.documents(app)["secret"] != nil)
    }
}
