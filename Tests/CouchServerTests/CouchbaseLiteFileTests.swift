import DocumentModel
import DocumentStore
import Foundation
import TestSupport
import Testing

/// Couchbase Lite's own database files (`NAME.cblite2`, made by LiteCore 3.2's `cblite`) read in
/// place: `sofa cp app.cblite2 x.sofa`, `sofa pull x.sofa app.cblite2`, and `sofa info|ls|cat|revs`.
@Suite(.serialized) struct CouchbaseLiteFileTests {
    let directory = TemporaryDirectory()

    func sortedKeys(_ value: JSONValue?) -> JSONValue? { value?.sortedKeys }

    /// The SHA-1 of every byte of the database's SQLite file, its WAL and its blobs.
    func fingerprint(_ app: String) throws -> [String: BlobKey] {
        var prints: [String: BlobKey] = [:]
        for name in ["db.sqlite3", "db.sqlite3-wal"] where access("\(app)/\(name)", F_OK) == 0 {
            prints[name] = BlobKey.of(try Data(contentsOf: URL(fileURLWithPath: "\(app)/\(name)")))
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "\(app)/Attachments")) ?? [] {
            prints[name] = BlobKey.of(try Data(contentsOf: URL(fileURLWithPath: "\(app)/Attachments/\(name)")))
        }
        return prints
    }

    /// A document with a title and a JPEG blob at `/photo`.
    func saveBlob(_ photo: [UInt8], in db: Database, id: String, title: String) throws {
        var draft = try db.newRevision(of: id)
        draft.properties["title"] = .string(title)
        try draft.setBlob(at: "/photo", blob: db.blobs.write(photo), contentType: "image/jpeg")
        _ = try db.save(draft)
    }

    /// A `.cblite2` holding what Couchbase Lite apps hold: values of every Fleece width, long
    /// strings, big collections (wide slots, long counts, shared keys), unicode ids, a 3-deep
    /// history, a deletion, a blob and an attachment (pulled from `sofa serve`, as cblite
    /// cannot add them), and a conflict between Sofa's edit and Couchbase Lite's.
    func appDatabase() throws -> (app: String, photo: [UInt8], report: [UInt8], conflict: (local: String, remote: String)) {
        let app = directory.appending("app.cblite2")
        var values = JSONObject()
        values["ints"] = .array([0, 1, -1, 2047, -2048, 2048, -2049, 32767, -32769, 8_388_608, 2_147_483_648, -2_147_483_649,
                                 549_755_813_887, 36_028_797_018_963_967, .integer(Int64.max), .integer(Int64.min)]
                                + [.bigInteger("18446744073709551615")])
        values["floats"] = [1.5, -0.25, 3.141592653589793, 1e300, -1e-300, 0.1, 2.5e-5]
        values["strings"] = ["", "a", "exactly15chars!", "sixteen chars!!!", .string(String(repeating: "x", count: 300)), "Zoë ☕ 日本語 𝄞"]
        values["specials"] = [true, false, nil]
        values["nested"] = ["a": ["b": ["c": [[], [:], [[1]], ["d": nil]]]]]
        values["long"] = .array((0..<3000).map { .integer(Int64($0)) })
        values["dict"] = .object(JSONObject((0..<2100).map { ("k\($0)", JSONValue.integer(Int64($0))) }))
        values["text"] = .string(String(repeating: "y", count: 70_000))  // past a narrow pointer's reach
        try CouchbaseLite.put(app, "values", JSONValue.object(values).jsonString())
        try CouchbaseLite.put(app, "Zoë/ünï:code id", #"{"é":"ü","emoji":"🛋️"}"#)
        for version in 1...3 { try CouchbaseLite.put(app, "edited", "{\"v\":\(version)}") }
        try CouchbaseLite.put(app, "gone", #"{"soon":"deleted"}"#)
        try CouchbaseLite.remove(app, "gone")
        try CouchbaseLite.put(app, "shared", #"{"v":0}"#)

        // Bodies and a conflict, through sofa serve.
        let path = directory.appending("served.sofa")
        let db = try Database.create(at: path)
        let photo = (0..<150_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 7) }
        let report = (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }
        try saveBlob(photo, in: db, id: "with-blob", title: "a blob")
        var second = try db.newRevision(of: "with-attachment")
        try second.setAttachment("report.pdf", blob: db.blobs.write(report), contentType: "application/pdf")
        _ = try db.save(second)
        let server = try ServedDatabases([path])
        let url = "ws://127.0.0.1:\(server.port)/served"
        #expect(try CouchbaseLite.push(app, to: url).succeeded)
        let base = try #require(try db.currentRevision(of: "shared")).revID
        let sofaEdit = try server.connect().json("PUT", "/served/shared?rev=\(base)", ["v": "edited in Sofa"])
        let remote = try #require(sofaEdit.json?["rev"]?.stringValue)
        try CouchbaseLite.put(app, "shared", #"{"v":"edited in Couchbase Lite"}"#)
        let local = try #require(try CouchbaseLite.documents(app)["shared"]?["_rev"]?.stringValue)
        let pulled = try CouchbaseLite.pull(app, from: url)
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")
        #expect(try CouchbaseLite.revisions(app, "shared").contains("Conflicted"))
        return (app, photo, report, (local, remote))
    }

    @Test func aCouchbaseLiteDatabaseIsCopiedWithItsRevisionsHistoriesDeletionsConflictsAndBlobs() throws {
        let (app, photo, report, conflict) = try appDatabase()
        let theirs = try CouchbaseLite.documents(app)
        let before = try fingerprint(app)
        let copy = directory.appending("copy.sofa")
        let result = try sofa("cp", app, copy)
        #expect(result.succeeded, "\(result.stdout)\(result.stderr)")

        let db = try Database.open(at: copy)
        #expect(try db.counts().documents == theirs.count)
        for (id, document) in theirs {
            // A conflict's revision is Couchbase Lite's current one until its app resolves it;
            // here, as in CouchDB and every replica, the winner is CouchDB's (both are kept).
            let rev = try RevisionID.parse(try #require(document["_rev"]?.stringValue))
            let revision = try db.revision(rev, of: id)
            #expect(revision.revID.description == document["_rev"]?.stringValue, "\(id)")
            var properties = document
            for key in ["_id", "_rev", "_attachments"] { properties[key] = nil }
            #expect(sortedKeys(.object(revision.properties)) == sortedKeys(.object(properties)), "\(id)")
        }
        // Histories as Couchbase Lite keeps them.
        let edited = try db.revisionTree(of: "edited")
        let history = edited.history(of: try #require(edited.winner).id)
        #expect(history.count == 3)
        let drawn = try CouchbaseLite.revisions(app, "edited")
        for rev in history { #expect(drawn.contains(rev.description), "\(rev) in \(drawn)") }
        // The deletion a tombstone under Couchbase Lite's revision.
        let gone = try db.revisionTree(of: "gone")
        #expect(gone.winner?.deleted == true && gone.winner?.id.generation == 2)
        #expect(try CouchbaseLite.run(["revs", app, "gone"]).stdout.contains(try #require(gone.winner).id.description))
        // The conflict: both leaves, each with its body; the winner CouchDB's.
        let shared = try db.revisionTree(of: "shared")
        #expect(Set(shared.leaves.map(\.id.description)) == [conflict.local, conflict.remote])
        #expect(shared.winner?.id == [conflict.local, conflict.remote].compactMap(RevisionID.init).max())
        #expect(try db.revision(RevisionID.parse(conflict.remote), of: "shared").properties["v"] == "edited in Sofa")
        // The blob and the attachment, byte for byte, as a blob and an attachment here.
        #expect(try db.blobs.contents(of: BlobKey.of(photo)) == photo)
        #expect(try db.blobs.contents(of: BlobKey.of(report)) == report)
        let blobDocument = try #require(try db.currentRevision(of: "with-blob"))
        #expect(blobDocument.attachment(named: "blob_/photo")?.contentAvailable == true)
        #expect(try #require(try db.currentRevision(of: "with-attachment")).attachment(named: "report.pdf")?.length == Int64(report.count))

        // Nothing written into the Couchbase Lite database.
        #expect(try fingerprint(app) == before)
        // Again, into the same database: nothing new.
        let again = try sofa("pull", copy, app, "--json")
        #expect(again.succeeded, "\(again.stdout)\(again.stderr)")
        let summary = try JSONParser.parse(Array((again.stdout.split(separator: "\n").last ?? "").utf8))
        // From the checkpoint the first run left (kept beside the target's, under the file's UUID).
        #expect(summary["docs_written"] == 0 && summary["missing_checked"] == 0, "\(again.stdout)")
        // And Couchbase Lite's replicator agrees with what Sofa read: the copy, served, pulled
        // by cblite into a new database, holds the same documents.
        let server = try ServedDatabases([copy])
        let back = directory.appending("back.cblite2")
        #expect(try CouchbaseLite.pull(back, from: "ws://127.0.0.1:\(server.port)/copy").succeeded)
        var served = try CouchbaseLite.documents(back).mapValues { sortedKeys(.object($0)) }
        var read = theirs.mapValues { sortedKeys(.object($0)) }
        (served["shared"], read["shared"]) = (nil, nil)  // the winner: above
        #expect(served == read)
    }

    @Test func infoLsCatAndRevsReadACouchbaseLiteDatabaseInPlace() throws {
        let app = directory.appending("read.cblite2")
        for version in 1...3 { try CouchbaseLite.put(app, "a", "{\"n\":\(version),\"name\":\"Ann\"}") }
        try CouchbaseLite.put(app, "b\u{9B}2", #"{"x":1}"#)
        try CouchbaseLite.put(app, "c", #"{"x":1}"#)
        try CouchbaseLite.remove(app, "c")
        let theirs = try CouchbaseLite.documents(app)

        let info = try sofa("info", "--json", app)
        #expect(info.succeeded, "\(info.stderr)")
        let json = try JSONParser.parse(Array(info.stdout.utf8))
        #expect(json["documents"] == 2 && json["deleted_documents"] == 1 && json["last_sequence"] == 6, "\(info.stdout)")
        #expect(json["kind"] == "couchbase-lite")

        #expect(try sofa("ls", app).stdout == "a\n\"b\\u009b2\"\n")
        #expect(try sofa("ls", "--deleted", app).stdout.hasSuffix("\nc\n"))

        let cat = try sofa("cat", app, "a")
        #expect(cat.succeeded, "\(cat.stderr)")
        #expect(try JSONParser.parse(Array(cat.stdout.utf8)).objectValue == theirs["a"])
        #expect(try sofa("cat", app, "missing").stderr.contains("no document \"missing\""))

        let revs = try sofa("revs", "--json", app, "a")
        let tree = try JSONParser.parse(Array(revs.stdout.utf8))
        #expect(tree["current"]?.stringValue == theirs["a"]?["_rev"]?.stringValue)
        #expect(tree["revisions"]?.arrayValue?.count == 3)
        let drawn = try CouchbaseLite.revisions(app, "a")
        for revision in tree["revisions"]?.arrayValue ?? [] {
            #expect(drawn.contains(try #require(revision["rev"]?.stringValue)))
        }
    }

    @Test func whatSofaCannotReadIsRefusedByNameAndNothingIsWritten() throws {
        let app = directory.appending("damaged.cblite2")
        try CouchbaseLite.put(app, "good", #"{"fine":true}"#)
        try CouchbaseLite.put(app, "bad", #"{"broken":"soon, a body that is not Fleece"}"#)
        let sql = { (statement: String) throws in
            let result = try CouchbaseLite.run(["--writeable", "sql", app, statement])
            #expect(result.succeeded, "\(result.stdout)\(result.stderr)")
        }
        // A body whose pointer leads outside it: that document is named, the other copied.
        try sql("UPDATE kv_default SET body = x'80ff' WHERE key = 'bad'")
        let copy = directory.appending("partial.sofa")
        let result = try sofa("cp", app, copy)
        #expect(!result.succeeded)
        #expect(result.stderr.contains("bad") && result.stderr.contains("damaged Fleece"), "\(result.stderr)")
        #expect(try Database.open(at: copy).currentRevision(of: "good")?.properties["fine"] == true)
        #expect(try Database.open(at: copy).currentRevision(of: "bad") == nil)
        #expect(try sofa("cat", app, "bad").stderr.contains("damaged Fleece"))

        // A damaged revision tree.
        try sql("UPDATE kv_default SET extra = x'0000000500' WHERE key = 'good'")
        #expect(try sofa("cat", app, "good").stderr.contains("revision tree is damaged"))

        // A shared key the table lacks.
        try sql("UPDATE kv_default SET body = x'7001003f00038003' WHERE key = 'bad'")  // {key 63: 3}
        #expect(try sofa("cat", app, "bad").stderr.contains("shared key"))

        // A blob whose file is missing from Attachments/.
        let withBlob = directory.appending("blobless.cblite2")
        let path = directory.appending("blobs.sofa")
        let db = try Database.create(at: path)
        var draft = try db.newRevision(of: "photo")
        try draft.setBlob(at: "/image", blob: db.blobs.write(Array("not really a photo".utf8)), contentType: "image/jpeg")
        _ = try db.save(draft)
        _ = try db.put("plain", ["n": 1])
        let server = try ServedDatabases([path])
        #expect(try CouchbaseLite.pull(withBlob, from: "ws://127.0.0.1:\(server.port)/blobs").succeeded)
        for name in try FileManager.default.contentsOfDirectory(atPath: "\(withBlob)/Attachments") {
            try FileManager.default.removeItem(atPath: "\(withBlob)/Attachments/\(name)")
        }
        let blobless = try sofa("cp", withBlob, directory.appending("blobless.sofa"))
        #expect(!blobless.succeeded)
        #expect(blobless.stderr.contains("photo") && blobless.stderr.contains("missing from"), "\(blobless.stderr)")
        #expect(try Database.open(at: directory.appending("blobless.sofa")).currentRevision(of: "plain") != nil)

        // Version vectors (Couchbase Lite 4), Couchbase Lite 2 and encryption are named.
        let vectors = directory.appending("vectors.cblite2")
        try CouchbaseLite.put(vectors, "x", "{}")
        _ = try CouchbaseLite.run(["--writeable", "sql", vectors, "UPDATE kv_info SET body = x'0000000000000002' WHERE key = 'versioning'"])
        #expect(try sofa("info", vectors).stderr.contains("version vectors"))
        _ = try CouchbaseLite.run(["--writeable", "sql", vectors, "DELETE FROM kv_info WHERE key = 'versioning'"])
        #expect(try sofa("info", vectors).stderr.contains("Couchbase Lite 2"))
        let encrypted = directory.appending("secret.cblite2")
        try FileManager.default.createDirectory(atPath: encrypted, withIntermediateDirectories: true)
        try Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 131) }).write(to: URL(fileURLWithPath: "\(encrypted)/db.sqlite3"))
        let refused = try sofa("cp", encrypted, directory.appending("secret.sofa"))
        #expect(!refused.succeeded && refused.stderr.contains("encrypted"), "\(refused.stderr)")
        #expect(access(directory.appending("secret.sofa"), F_OK) != 0)

        // Commands that need a Sofa database name the ones that read Couchbase Lite's.
        let mounted = try sofa("compact", app)
        #expect(mounted.stderr.contains("Couchbase Lite database") && mounted.stderr.contains("sofa cp"), "\(mounted.stderr)")
        // cp does not write into an existing one (push does), the file untouched.
        let before = try fingerprint(app)
        let into = try sofa("cp", copy, app)
        #expect(!into.succeeded && into.stderr.contains("sofa push"), "\(into.stderr)")
        #expect(try fingerprint(app) == before)
    }

    /// What LiteCore says of a database: `cblite check`'s verdict.
    func checked(_ app: String) throws -> Bool {
        let result = try CouchbaseLite.run(["check", app])
        return result.succeeded && result.stdout.contains("everything looks OK")
    }

    @Test func aSofaDatabaseBecomesACouchbaseLiteDatabaseThatCouchbaseLiteChecksEditsAndSyncs() throws {
        let (app, photo, report, conflict) = try appDatabase()
        let theirs = try CouchbaseLite.documents(app)
        let copy = directory.appending("round.sofa")
        #expect(try sofa("cp", app, copy).succeeded)

        // Sofa → a new .cblite2: LiteCore finds nothing wrong, and every document, revision,
        // history, deletion, blob and attachment is there.
        let made = directory.appending("made.cblite2")
        let result = try sofa("cp", copy, made)
        #expect(result.succeeded, "\(result.stdout)\(result.stderr)")
        #expect(try checked(made))
        let ours = try CouchbaseLite.documents(made)
        #expect(Set(ours.keys) == Set(theirs.keys))
        for (id, document) in theirs where id != "shared" {
            #expect(sortedKeys(.object(ours[id] ?? [:])) == sortedKeys(.object(document)), "\(id)")
        }
        // The conflict: CouchDB's winner is current, the other kept as Couchbase Lite's conflict.
        let winner = try #require([conflict.local, conflict.remote].compactMap(RevisionID.init).max()).description
        #expect(ours["shared"]?["_rev"]?.stringValue == winner)
        let shared = try CouchbaseLite.revisions(made, "shared")
        #expect(shared.contains("Conflicted") && shared.contains(conflict.local) && shared.contains(conflict.remote), "\(shared)")
        let edited = try CouchbaseLite.revisions(made, "edited")
        for rev in try CouchbaseLite.revisions(app, "edited").split(separator: "\n").compactMap({ $0.split(separator: " ").first { $0.contains("-") } }) {
            #expect(edited.contains(rev), "\(rev) in \(edited)")
        }
        #expect(try CouchbaseLite.run(["revs", made, "gone"]).stdout.contains("Deleted"))
        let blob = try Data(contentsOf: URL(fileURLWithPath: made + "/Attachments/" + Data(BlobKey.of(photo).digestBytes).base64EncodedString().replacingOccurrences(of: "/", with: "_") + ".blob"))
        #expect(Array(blob) == photo)
        #expect(try CouchbaseLite.run(["--writeable", "compact", made]).succeeded)  // LiteCore keeps every body a document names
        #expect((try FileManager.default.contentsOfDirectory(atPath: made + "/Attachments")).count == 2)

        // Back again: the same trees as the first copy.
        let back = directory.appending("back.sofa")
        #expect(try sofa("cp", made, back).succeeded)
        let first = try Database.open(at: copy)
        let second = try Database.open(at: back)
        for id in theirs.keys + ["gone"] {
            #expect(Set(try first.revisionTree(of: id).nodes.keys) == Set(try second.revisionTree(of: id).nodes.keys), "\(id)")
        }
        #expect(try second.blobs.contents(of: BlobKey.of(report)) == report)

        // LiteCore edits it and pushes it into sofa serve; Sofa pushes its own edits into it.
        try CouchbaseLite.put(made, "edited", #"{"v":"edited by Couchbase Lite"}"#)
        #expect(try checked(made))
        let served = directory.appending("served-empty.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served])
        let pushed = try CouchbaseLite.push(made, to: "ws://127.0.0.1:\(server.port)/served-empty")
        #expect(pushed.succeeded, "\(pushed.stdout)\(pushed.stderr)")
        #expect(try Database.open(at: served).currentRevision(of: "edited")?.properties["v"] == "edited by Couchbase Lite")
        let db = try Database.open(at: copy)
        _ = try db.put("from-sofa", ["added": "later", "newKeyNeverSeen": 1])
        let push = try sofa("push", copy, made)
        #expect(push.succeeded, "\(push.stdout)\(push.stderr)")
        #expect(try checked(made))
        #expect(try CouchbaseLite.documents(made)["from-sofa"]?["newKeyNeverSeen"] == 1)
        // Sofa's old "edited" conflicts with Couchbase Lite's edit of it: Couchbase Lite's stays current.
        #expect(try CouchbaseLite.documents(made)["edited"]?["v"] == "edited by Couchbase Lite")
    }

    @Test func whatCouchbaseLiteCannotHoldIsRefusedByNameTheRestWritten() throws {
        let path = directory.appending("odd.sofa")
        let db = try Database.create(at: path)
        _ = try db.put("fine", ["ok": true])
        // A revision id LiteCore cannot store (not hex), as a replica may bring.
        try db.inBatch { batch in
            _ = try batch.insert(ReplicatedRevision(docID: "odd", revID: RevisionID("1-not-hex")!, ancestors: [], properties: ["a": 1]))
        }
        let made = directory.appending("odd.cblite2")
        let result = try sofa("cp", path, made)
        #expect(!result.succeeded)
        #expect(result.stderr.contains("odd") && result.stderr.contains("cannot be stored by Couchbase Lite"), "\(result.stderr)")
        #expect(try checked(made))
        #expect(try CouchbaseLite.documents(made).keys.sorted() == ["fine"])
    }

    /// The bytes of a file, or nil.
    func contents(_ path: String) -> [UInt8]? { FileManager.default.contents(atPath: path).map(Array.init) }

    @Test func aMountedCouchbaseLiteDatabaseShowsItsDocumentsAndItsEditsBecomeRevisionsCouchbaseLiteAccepts() throws {
        // A .cblite2 with a blob, an attachment and a history (made by Sofa), and a document
        // LiteCore itself wrote.
        let source = directory.appending("mount-source.sofa")
        let db = try Database.create(at: source)
        let photo = (0..<90_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ $0 >> 9) }
        try saveBlob(photo, in: db, id: "with-blob", title: "a photo")
        var second = try db.newRevision(of: "with-attachment")
        try second.setAttachment("notes.txt", data: Array("attached".utf8), contentType: "text/plain")
        _ = try db.save(second)
        let app = directory.appending("mounted.cblite2")
        #expect(try sofa("cp", source, app).succeeded)
        try CouchbaseLite.put(app, "by-litecore", #"{"made":"by LiteCore","n":[1,2,3]}"#)
        let cache = directory.appending("cache")
        let mount = try MountedDatabase(app, environment: ["XDG_CACHE_HOME": cache])

        // Reads: the documents, their properties, the blob and the attachment, the revision.
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: mount.path("docs"))) == ["with-blob", "with-attachment", "by-litecore"])
        let properties = try JSONParser.parse(try #require(contents(mount.path("docs/by-litecore/properties.json"))))
        #expect(properties == ["made": "by LiteCore", "n": [1, 2, 3]])
        #expect(contents(mount.path("docs/with-blob/blobs/photo")) == photo)
        #expect(contents(mount.path("docs/with-attachment/attachments/notes.txt")) == Array("attached".utf8))
        let rev = try shell("getfattr --only-values -n user.sofa.rev \(mount.path("docs/by-litecore"))").stdout
        #expect(rev == (try CouchbaseLite.documents(app))["by-litecore"]?["_rev"]?.stringValue)

        // Writes become revisions in the file, on top of the ones there.
        let before = try #require(try CouchbaseLite.documents(app)["by-litecore"]?["_rev"]?.stringValue)
        try Data(#"{"made":"by LiteCore","edited":"in the mount"}"#.utf8).write(to: URL(fileURLWithPath: mount.path("docs/by-litecore/properties.json")))
        #expect(try waitUntil(30) { try CouchbaseLite.documents(app)["by-litecore"]?["edited"] == "in the mount" })
        let revs = try CouchbaseLite.revisions(app, "by-litecore")
        #expect(revs.contains(before) && revs.contains("2-"), "\(revs)")
        let newPhoto = Array("a new photo".utf8)
        try Data(newPhoto).write(to: URL(fileURLWithPath: mount.path("docs/with-blob/blobs/photo")))
        #expect(try waitUntil(30) { try CouchbaseLite.documents(app)["with-blob"]?["photo"]?["digest"]?.stringValue == BlobKey.of(newPhoto).digestString })
        #expect(contents(try CouchbaseLiteDatabase.open(at: app).blobPath(BlobKey.of(newPhoto))) == newPhoto)
        try FileManager.default.removeItem(atPath: mount.path("docs/with-attachment"))
        #expect(try waitUntil(30) { try CouchbaseLite.documents(app)["with-attachment"] == nil })
        #expect(try CouchbaseLite.run(["revs", app, "with-attachment"]).stdout.contains("Deleted"))

        // LiteCore's own edits show in the mount.
        try CouchbaseLite.put(app, "by-litecore", #"{"edited":"by LiteCore again"}"#)
        #expect(try waitUntil(30) {
            (try? JSONParser.parse(contents(mount.path("docs/by-litecore/properties.json")) ?? []))?["edited"] == "by LiteCore again"
        })
        #expect(mount.unmount().succeeded)
        #expect(try checked(app))
        // Nothing but the database and its blobs in the app's folder; the companion in the cache.
        #expect(Set(try FileManager.default.contentsOfDirectory(atPath: app)).isSubset(of: ["db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm", "Attachments"]))
        #expect((try FileManager.default.contentsOfDirectory(atPath: cache + "/sofa/couchbase-lite")).contains { $0.hasSuffix(".sofa") })

        // Another database in its place (an app reinstalled): the first one's companion is set
        // aside and nothing of it goes into the new one.
        try FileManager.default.removeItem(atPath: app)
        try CouchbaseLite.put(app, "fresh", #"{"new":true}"#)
        let again = try MountedDatabase(app, environment: ["XDG_CACHE_HOME": cache])
        #expect(try FileManager.default.contentsOfDirectory(atPath: again.path("docs")) == ["fresh"])
        #expect(again.unmount().succeeded)
        #expect(try CouchbaseLite.documents(app).keys.sorted() == ["fresh"])
        #expect((try FileManager.default.contentsOfDirectory(atPath: cache + "/sofa/couchbase-lite")).contains { $0.contains(".replaced-") })
    }

    @Test func aCouchbaseLiteDatabaseWithQueryIndexesMountsReadOnly() throws {
        let app = directory.appending("indexed.cblite2")
        try CouchbaseLite.put(app, "a", #"{"name":"Ann"}"#)
        #expect(try CouchbaseLite.run(["--writeable", "mkindex", app, "byname", "[[\".name\"]]"]).succeeded)
        let mount = try MountedDatabase(app, environment: ["XDG_CACHE_HOME": directory.appending("cache-ro")])
        #expect(contents(mount.path("docs/a/properties.json")).map { try? JSONParser.parse($0) } == ["name": "Ann"])
        let fd = open(mount.path("docs/a/properties.json"), O_WRONLY | O_TRUNC)
        #expect(fd < 0 && errno == EROFS)
        if fd >= 0 { close(fd) }
        #expect(mount.unmount().stderr.contains("query indexes"))
        let other = directory.appending("pusher.sofa")
        _ = try Database.create(at: other).put("b", ["name": "Bob"])
        let push = try sofa("push", other, app)
        #expect(!push.succeeded && push.stderr.contains("query indexes"), "\(push.stderr)")
        #expect(try CouchbaseLite.documents(app).keys.sorted() == ["a"])
        let into = try sofa("cp", app, directory.appending("indexed-copy.sofa"))
        #expect(into.succeeded, "\(into.stderr)")  // reading it is fine
    }

    @Test func aConflictResolvedInTheMountIsResolvedInCouchbaseLite() throws {
        let source = directory.appending("conflicted.sofa")
        let db = try Database.create(at: source)
        let (winner, loser) = (RevisionID("2-bbbb")!, RevisionID("2-aaaa")!)
        try db.inBatch { batch in
            _ = try batch.insert(ReplicatedRevision(docID: "doc", revID: winner, ancestors: [RevisionID("1-11")!], properties: ["side": "B"]))
            _ = try batch.insert(ReplicatedRevision(docID: "doc", revID: loser, ancestors: [RevisionID("1-11")!], properties: ["side": "A"]))
        }
        let app = directory.appending("conflicted.cblite2")
        #expect(try sofa("cp", source, app).succeeded)
        #expect(try CouchbaseLite.revisions(app, "doc").contains("Conflicted"))
        #expect(try CouchbaseLite.documents(app)["doc"]?["side"] == "B")

        let mount = try MountedDatabase(app, environment: ["XDG_CACHE_HOME": directory.appending("cache-conflict")])
        #expect(try FileManager.default.contentsOfDirectory(atPath: mount.path("docs/doc/conflicts")) == [loser.description])
        try FileManager.default.removeItem(atPath: mount.path("docs/doc/conflicts/\(loser)"))
        let resolved = try waitUntil(30) { !(try CouchbaseLite.revisions(app, "doc")).contains("Conflicted") }
        #expect(resolved, "\((try? CouchbaseLite.revisions(app, "doc")) ?? "")")
        #expect(try CouchbaseLite.documents(app)["doc"]?["side"] == "B")
        #expect(mount.unmount().succeeded)
        #expect(try checked(app))
    }

    @Test func blobsOfEverySizeAndTenThousandDocumentsGoBothWays() throws {
        let source = directory.appending("sizes.sofa")
        let db = try Database.create(at: source)
        let sizes = [0, 1, 5 << 20]
        var bodies: [[UInt8]] = []
        for (index, size) in sizes.enumerated() {
            let body = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ index &+ $0 >> 13) }
            bodies.append(body)
            var draft = try db.newRevision(of: "blob-\(size)")
            try draft.setBlob(at: "/file", blob: db.blobs.write(body), contentType: "application/octet-stream")
            _ = try db.save(draft)
        }
        let lines = (0..<10_000).map { "{\"_id\":\"doc-\(String(format: "%05d", $0))\",\"n\":\($0)}" }.joined(separator: "\n")
        let jsonl = directory.appending("many.jsonl")
        try Data(lines.utf8).write(to: URL(fileURLWithPath: jsonl))
        let many = directory.appending("many.sofa")
        #expect(try sofa("cp", jsonl, many).succeeded)
        #expect(try sofa("push", many, directory.appending("unused.cblite2")).stderr.contains("no such Couchbase Lite database"))

        let app = directory.appending("sizes.cblite2")
        #expect(try sofa("cp", source, app).succeeded)
        let pushed = try sofa("push", many, app)
        #expect(pushed.succeeded, "\(pushed.stderr)")
        #expect(try checked(app))
        let info = try CouchbaseLite.run(["info", app]).stdout
        #expect(info.contains("10003 documents"), "\(info)")
        let file = try CouchbaseLiteDatabase.open(at: app)
        for body in bodies {
            #expect(contents(file.blobPath(BlobKey.of(body))) == body)
        }
        let back = directory.appending("sizes-back.sofa")
        #expect(try sofa("cp", app, back).succeeded)
        let copy = try Database.open(at: back)
        #expect(try copy.counts().documents == 10_003)
        for body in bodies { #expect(try copy.blobs.contents(of: BlobKey.of(body)) == body) }
        // On one file system the three databases share each body (hard links), none copies it.
        func inode(_ path: String) -> UInt64? {
            var info = stat()
            return stat(path, &info) == 0 ? UInt64(info.st_ino) : nil
        }
        let big = BlobKey.of(bodies[2])
        #expect(inode(file.blobPath(big)) != nil)
        #expect(inode(file.blobPath(big)) == inode(db.blobs.path(for: big)))
        #expect(inode(file.blobPath(big)) == inode(copy.blobs.path(for: big)))
    }
}
