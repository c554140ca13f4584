import DocumentModel
import DocumentStore
import Foundation
import TestSupport
import Testing

/// Couchbase Lite's own replicator (LiteCore 3.2, `../shared/peers/cblite`) against
/// `sofa serve`'s `/{db}/_blipsync`: pushes, pulls, bodies, conflicts, the pre-built flow.
@Suite(.serialized) struct CouchbaseLiteSyncTests {
    let directory = TemporaryDirectory()

    /// A served empty database, and its `ws://` URL.
    func servedEmpty(_ name: String, _ extra: [String] = []) throws -> (ServedDatabases, String, String) {
        let path = directory.appending("\(name).sofa")
        #expect(try sofa("create", path).succeeded)
        let server = try ServedDatabases([path] + extra)
        return (server, "ws://127.0.0.1:\(server.port)/\(name)", path)
    }

    /// A document's body without `_id`/`_rev`/`_attachments`, as both sides should agree on it.
    func body(_ document: JSONObject?) -> JSONObject? {
        guard var document else { return nil }
        for key in ["_id", "_rev", "_attachments", "_revisions"] { document[key] = nil }
        return document
    }

    func sortedKeys(_ value: JSONValue?) -> JSONValue? { value?.sortedKeys }

    @Test func aCouchbaseLiteDatabasePushedIntoSofaServeIsPulledBackTheSame() throws {
        let app = directory.appending("app.cblite2")
        try CouchbaseLite.put(app, "unicode", #"{"name":"Zoë ☕ 日本語","emoji":"🛋️","escaped":"tab\tquote\"back\\slash"}"#)
        try CouchbaseLite.put(app, "nested", #"{"a":{"b":[1,2.5,{"c":null,"d":[true,false]}],"e":{}},"big":12345678901}"#)
        try CouchbaseLite.put(app, "edited", #"{"v":1}"#)
        try CouchbaseLite.put(app, "edited", #"{"v":2}"#)
        try CouchbaseLite.put(app, "edited", #"{"v":3,"final":true}"#)
        try CouchbaseLite.put(app, "gone", #"{"soon":"deleted"}"#)
        try CouchbaseLite.remove(app, "gone")
        for index in 0..<250 { try CouchbaseLite.put(app, String(format: "many-%03d", index), "{\"index\":\(index)}") }
        let local = try CouchbaseLite.documents(app)
        #expect(local.count == 253)

        let (server, url, path) = try servedEmpty("pushed")
        let pushed = try CouchbaseLite.push(app, to: url)
        #expect(pushed.succeeded, "\(pushed.stdout)\(pushed.stderr)")

        // In Sofa: every document under Couchbase Lite's own revision ids, the history kept,
        // the deletion a tombstone.
        let db = try Database.open(at: path)
        for (id, document) in local {
            let revision = try #require(try db.currentRevision(of: id), "\(id)")
            #expect(revision.revID.description == document["_rev"]?.stringValue, "\(id)")
            #expect(sortedKeys(.object(revision.properties)) == sortedKeys(body(document).map(JSONValue.object)), "\(id)")
        }
        let edited = try db.revisionTree(of: "edited")
        #expect(edited.history(of: try #require(try db.currentRevision(of: "edited")).revID).count == 3)
        #expect(try db.currentRevision(of: "gone")?.deleted == true)
        #expect(try server.connect().request("GET", "/pushed/gone").status == 404)

        // Pulled by Couchbase Lite into a new database: the same documents and revisions.
        let copy = directory.appending("copy.cblite2")
        let pulled = try CouchbaseLite.pull(copy, from: url)
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")
        #expect(try CouchbaseLite.documents(copy).mapValues { sortedKeys(.object($0)) } == local.mapValues { sortedKeys(.object($0)) })
        let tree = try CouchbaseLite.revisions(copy, "edited")
        for rev in edited.history(of: try #require(try db.currentRevision(of: "edited")).revID) {
            #expect(tree.contains(rev.description), "\(rev) in \(tree)")
        }

        // The same again moves nothing: both checkpoints hold.
        #expect(CouchbaseLite.documentsMoved(try CouchbaseLite.push(app, to: url)) == 0)
        #expect(CouchbaseLite.documentsMoved(try CouchbaseLite.pull(copy, from: url)) == 0)
    }

    @Test func attachmentsAndBlobsReachCouchbaseLiteAndComeBackByteForByte() throws {
        let path = directory.appending("bodies.sofa")
        let db = try Database.create(at: path)
        let photo = (0..<150_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 7) }
        let report = (0..<700_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 11) }  // many frames, acknowledged
        var draft = try db.newRevision(of: "with-blob")
        draft.properties["title"] = "a Couchbase Lite blob"
        try draft.setBlob(at: "/photo", blob: db.blobs.write(photo), contentType: "image/jpeg")
        let blobRevision = try db.save(draft)
        var second = try db.newRevision(of: "with-attachment")
        second.properties["kind"] = "report"
        try second.setAttachment("report.pdf", blob: db.blobs.write(report), contentType: "application/pdf")
        _ = try db.save(second)
        let empty = directory.appending("back.sofa")
        #expect(try sofa("create", empty).succeeded)
        let server = try ServedDatabases([path, empty])

        let app = directory.appending("bodies.cblite2")
        let pulled = try CouchbaseLite.pull(app, from: "ws://127.0.0.1:\(server.port)/bodies")
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")
        let documents = try CouchbaseLite.documents(app)
        // The blob property as Couchbase Lite keeps it; the attachment under its SHA-1.
        #expect(documents["with-blob"]?["photo"] == blobRevision.properties["photo"])
        #expect(documents["with-blob"]?["_rev"]?.stringValue == blobRevision.revID.description)
        #expect(documents["with-attachment"]?["_attachments"]?["report.pdf"]?["digest"]?.stringValue == BlobKey.of(report).digestString)

        // Pushed from Couchbase Lite into an empty database: the bodies come from LiteCore's
        // own blob store (getAttachment), checked against their digests.
        let pushed = try CouchbaseLite.push(app, to: "ws://127.0.0.1:\(server.port)/back")
        #expect(pushed.succeeded, "\(pushed.stdout)\(pushed.stderr)")
        let back = try Database.open(at: empty)
        let blobDocument = try #require(try back.currentRevision(of: "with-blob"))
        #expect(blobDocument.revID == blobRevision.revID)
        #expect(sortedKeys(.object(blobDocument.properties)) == sortedKeys(.object(blobRevision.properties)))
        #expect(try back.blobs.contents(of: BlobKey.of(photo)) == photo)
        let attachment = try #require(try server.connect().request("GET", "/back/with-attachment/report.pdf"))
        #expect(attachment.status == 200 && attachment.body == report)
        #expect(attachment.header("Content-Type") == "application/pdf")
    }

    /// Couchbase Lite 3 pushes without making conflicts (`proposeChanges`, `noconflicts`), as
    /// with Sync Gateway: an edit of a revision that is no longer current here is refused, the
    /// pull brings the other edit, and both stay in Couchbase Lite for the app's resolver.
    @Test func editsOnBothSidesLoseNothingAndCouchbaseLiteGetsTheConflict() throws {
        let app = directory.appending("conflict.cblite2")
        try CouchbaseLite.put(app, "shared", #"{"v":0}"#)
        let (server, url, path) = try servedEmpty("conflict")
        #expect(try CouchbaseLite.push(app, to: url).succeeded)
        try CouchbaseLite.put(app, "shared", #"{"v":"edited in Couchbase Lite"}"#)
        try CouchbaseLite.put(app, "unrelated", #"{"n":1}"#)
        let base = try #require(try Database.open(at: path).currentRevision(of: "shared")).revID
        let sofaEdit = try server.connect().json("PUT", "/conflict/shared?rev=\(base)", ["v": "edited in Sofa", "more": 1])
        #expect(sofaEdit.status == 201)
        let sofaRev = try #require(sofaEdit.json?["rev"]?.stringValue)
        let local = try #require(try CouchbaseLite.documents(app)["shared"]?["_rev"]?.stringValue)

        // The push: the unrelated document goes, the conflicting edit does not.
        _ = try CouchbaseLite.push(app, to: url)
        let db = try Database.open(at: path)
        #expect(try db.currentRevision(of: "unrelated") != nil)
        #expect(try db.revisionTree(of: "shared").leaves.map(\.id.description) == [sofaRev])

        // The pull: Couchbase Lite keeps both, Sofa's as the conflict of its own.
        #expect(try CouchbaseLite.pull(app, from: url).succeeded)
        let tree = try CouchbaseLite.revisions(app, "shared")
        #expect(tree.contains("Conflicted") && tree.contains(local) && tree.contains(sofaRev), "\(tree)")
        // Unresolved, it is still refused (its history does not hold Sofa's revision).
        try CouchbaseLite.put(app, "shared", #"{"v":"edited again, unresolved"}"#)
        _ = try CouchbaseLite.push(app, to: url)
        #expect(try db.revisionTree(of: "shared").leaves.map(\.id.description) == [sofaRev])
        #expect(try db.currentRevision(of: "shared")?.properties["v"] == "edited in Sofa")
    }

    @Test func aPrebuiltDatabaseGetsOnlyTheNewChangesOnItsNextPull() throws {
        let path = directory.appending("catalog.sofa")
        let db = try Database.create(at: path)
        for index in 0..<40 { _ = try db.put("item-\(index)", ["index": .integer(Int64(index))]) }
        let server = try ServedDatabases([path])
        let url = "ws://127.0.0.1:\(server.port)/catalog"
        // What an application ships: a copy made from the server it will sync with.
        let shipped = directory.appending("shipped.cblite2")
        let first = try CouchbaseLite.pull(shipped, from: url)
        #expect(first.succeeded && CouchbaseLite.documentsMoved(first) == 40, "\(first.stdout)")
        let http = try server.connect()
        for index in 40..<43 { #expect(try http.json("PUT", "/catalog/item-\(index)", ["index": .integer(Int64(index))]).status == 201) }
        #expect(try http.json("PUT", "/catalog/item-0?rev=\(try #require(try db.currentRevision(of: "item-0")).revID)",
                              ["index": 0, "edited": true]).status == 201)
        let next = try CouchbaseLite.pull(shipped, from: url)
        #expect(next.succeeded && CouchbaseLite.documentsMoved(next) == 4, "\(next.stdout)")
        #expect(try CouchbaseLite.documents(shipped)["item-0"]?["edited"] == true)
    }

    @Test func aContinuousPullReceivesChangesAsTheyAreMade() throws {
        let (server, url, _) = try servedEmpty("live")
        let app = directory.appending("live.cblite2")
        try CouchbaseLite.put(app, "seed", "{}")
        let replicator = try ChildProcess([CouchbaseLite.tool, "pull", "--continuous", app, url])
        defer { replicator.kill(SIGTERM); _ = replicator.wait() }
        let http = try server.connect()
        #expect(try http.json("PUT", "/live/later", ["made": "after the replicator started"]).status == 201)
        #expect(try waitUntil(20) { try CouchbaseLite.documents(app)["later"] != nil })
        #expect(try http.json("PUT", "/live/later-still", ["n": 2]).status == 201)
        #expect(try waitUntil(20) { try CouchbaseLite.documents(app)["later-still"] != nil })
    }

    /// The database's members only, each with the rights HTTP gives them; the validator sees
    /// every pushed revision with its user.
    @Test func usersSecurityAndTheValidatorApplyToCouchbaseLite() throws {
        let path = directory.appending("guarded.sofa")
        #expect(try sofa("create", path).succeeded)
        try "secret\n".write(toFile: directory.appending("password"), atomically: true, encoding: .utf8)
        let server = try ServedDatabases([path, "--user", "admin", "--password-file", directory.appending("password")])
        let http = try server.connect()
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        for name in ["anna", "bob"] {
            #expect(try http.json("PUT", "/_users/org.couchdb.user:\(name)",
                                  ["name": .string(name), "password": .string("pw-\(name)"), "type": "user", "roles": []], headers: admin).status == 201)
        }
        #expect(try http.json("PUT", "/guarded/_security", ["members": ["names": ["anna"]]], headers: admin).status == 200)
        let validator = "function(doc, old, user) { if (!doc._deleted && !doc.address) throw({forbidden: 'Document must have an address (' + user.name + ').'}); }"
        #expect(try http.json("PUT", "/guarded/_design/rules", ["validate_doc_update": .string(validator)], headers: admin).status == 201)

        let app = directory.appending("guarded.cblite2")
        try CouchbaseLite.put(app, "good", #"{"address":"1 Main St"}"#)
        try CouchbaseLite.put(app, "bad", #"{"name":"no address"}"#)
        let url = "ws://127.0.0.1:\(server.port)/guarded"
        let nobody = try CouchbaseLite.pull(app, from: url)
        #expect(!nobody.succeeded && (nobody.stdout + nobody.stderr).contains("401"), "\(nobody.stdout)\(nobody.stderr)")
        let bob = try CouchbaseLite.pull(app, from: url, ["--user", "bob:pw-bob"])
        #expect(!bob.succeeded && (bob.stdout + bob.stderr).contains("403"), "\(bob.stdout)\(bob.stderr)")
        let wrong = try CouchbaseLite.pull(app, from: url, ["--user", "anna:nope"])
        #expect(!wrong.succeeded && (wrong.stdout + wrong.stderr).contains("401"))

        _ = try CouchbaseLite.push(app, to: url, ["--user", "anna:pw-anna"])
        let db = try Database.open(at: path)
        #expect(try db.currentRevision(of: "good")?.properties["address"] == "1 Main St")
        #expect(try db.currentRevision(of: "bad") == nil)
        // The refused document stays in the app, for it to mend.
        #expect(try CouchbaseLite.documents(app)["bad"] != nil)
    }
}
