import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Couchbase Lite 3.x blobs through the live CouchDB, Sofa's replicator and `sofa serve`.
extension CouchDBInteropTests {
    static let photo = (0..<40_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
    static let thumb = Array("tiny thumbnail".utf8)

    static func blob(_ bytes: [UInt8], _ type: String) -> JSONValue {
        .object(Blobs.dictionary(key: BlobKey.of(bytes), length: Int64(bytes.count), contentType: type))
    }

    /// A document as Couchbase Lite 3.x pushes it to a CouchDB-protocol server: blob
    /// properties in the body (nested, in an array, under keys JSON pointers escape, twice the
    /// same body), a stand-in per blob in `_attachments`, and one legacy attachment.
    static var couchbaseLiteDocument: JSONObject {
        [
            "_id": "cbl-profile",
            "_rev": "1-cb1cb1cb1cb1cb1cb1cb1cb1cb1cb1cb",
            "name": "Ada",
            "avatar": blob(photo, "image/jpeg"),
            "album": ["pages": [["cover": blob(thumb, "text/plain")], "caption"]],
            "a/b~c": blob(thumb, "text/plain"),
            "ünï": blob(photo, "image/jpeg"),
            "_attachments": [
                "blob_/avatar": ["content_type": "image/jpeg", "data": .string(Data(photo).base64EncodedString())],
                "blob_/album/pages/0/cover": ["content_type": "text/plain", "data": .string(Data(thumb).base64EncodedString())],
                "blob_/a~1b~0c": ["content_type": "text/plain", "data": .string(Data(thumb).base64EncodedString())],
                "blob_/ünï": ["content_type": "image/jpeg", "data": .string(Data(photo).base64EncodedString())],
                "notes.txt": ["content_type": "text/plain", "data": .string(Data("legacy attachment".utf8).base64EncodedString())],
            ],
        ]
    }

    func properties(_ doc: JSONObject) -> JSONObject { doc.filter { !$0.hasPrefix("_") } }

    @Test func aCouchbaseLiteDocumentFromCouchDBKeepsItsBlobsAndGoesBackUnchanged() throws {
        let source = try couch.newDatabase("cbl")
        let original = CouchDBInteropTests.couchbaseLiteDocument
        let stored = try couch.request("POST", "/\(source)/_bulk_docs", ["new_edits": false, "docs": [.object(original)]])
        #expect(stored.status == 201, "\(stored.text)")

        // A deferred pull: blobs keep their dictionaries, stand-ins are not attachments.
        let local = directory.appending("cbl.sofa")
        #expect(try sofa("create", local).succeeded)
        let pulled = try sofa("pull", local, couch.url(source), "--no-download-attachments")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        var revision = try #require(try Database.open(at: local).currentRevision(of: "cbl-profile"))
        #expect(revision.revID.description == "1-cb1cb1cb1cb1cb1cb1cb1cb1cb1cb1cb")
        #expect(revision.properties == properties(original))
        #expect(revision.legacyAttachments.map(\.name) == ["notes.txt"])
        #expect(revision.blobAttachments.map(\.blob.pointer) == ["/avatar", "/album/pages/0/cover", "/a~1b~0c", "/ünï"])
        #expect(revision.blobAttachments.allSatisfy { !$0.attachment.contentAvailable })

        // Downloaded, each body is the one its blob names.
        #expect(try sofa("download", local, "--remote", couch.url(source)).succeeded)
        let db = try Database.open(at: local)
        revision = try #require(try db.currentRevision(of: "cbl-profile"))
        for (blob, attachment) in revision.blobAttachments {
            #expect(attachment.blobKey == blob.key, "\(blob.pointer)")
            #expect(try db.blobs.contents(of: blob.key) == (blob.key == BlobKey.of(CouchDBInteropTests.photo)
                ? CouchDBInteropTests.photo : CouchDBInteropTests.thumb))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).filter { $0.hasSuffix(".blob") }.count == 3)

        // Pushed to a new CouchDB database it is the same document, stand-ins and all.
        let copy = try couch.newDatabase("cbl-copy")
        let pushed = try sofa("push", local, couch.url(copy))
        #expect(pushed.succeeded, "\(pushed.stderr)")
        let before = try describe(port: couch.port, source, digests: true)
        #expect(before["cbl-profile"]?.contains("[blob_/avatar image/jpeg 40000") == true)
        #expect(try describe(port: couch.port, copy, digests: true) == before)

        // An edit here goes back with the blobs' stand-ins unchanged (stubs: revpos stays).
        var draft = try db.newRevision(of: "cbl-profile")
        draft.properties["name"] = "Ada Lovelace"
        let edited = try db.save(draft)
        #expect(edited.attachments.map(\.revpos) == revision.attachments.map(\.revpos))
        let again = try sofa("push", local, couch.url(source))
        #expect(again.succeeded, "\(again.stderr)")
        let onServer = try #require(try couch.request("GET", "/\(source)/cbl-profile").json?.objectValue)
        #expect(onServer["_rev"]?.stringValue == edited.revID.description)
        #expect(onServer["avatar"] == original["avatar"])
        #expect(Set(onServer["_attachments"]?.objectValue?.keys ?? []) == Set(original["_attachments"]?.objectValue?.keys ?? []))
        let firstStubs = try #require(try couch.request("GET", "/\(copy)/cbl-profile").json?["_attachments"]?.objectValue)
        for (name, stub) in firstStubs {
            #expect(onServer["_attachments"]?[name]?["revpos"] == stub["revpos"], "\(name)")
            #expect(onServer["_attachments"]?[name]?["digest"] == stub["digest"], "\(name)")
        }
    }

    @Test func aBlobMadeHereReachesCouchDBAsCouchbaseLiteSendsItAndComesBack() throws {
        let local = directory.appending("made.sofa")
        let db = try Database.create(at: local)
        var draft = try db.newRevision(of: "made-here")
        draft.properties["title"] = "two blobs, one body"
        draft.properties["gallery"] = []
        try draft.setBlob(at: "/gallery/0", blob: db.blobs.write(CouchDBInteropTests.photo), contentType: "image/jpeg")
        try draft.setBlob(at: "/cover", blob: db.blobs.write(CouchDBInteropTests.photo), contentType: "image/jpeg")
        let saved = try db.save(draft)

        let target = try couch.newDatabase("made")
        let pushed = try sofa("push", local, couch.url(target))
        #expect(pushed.succeeded, "\(pushed.stderr)")
        let doc = try #require(try couch.request("GET", "/\(target)/made-here?attachments=true", headers: [("Accept", "application/json")])
            .json?.objectValue)
        #expect(properties(doc) == saved.properties)
        for name in ["blob_/gallery/0", "blob_/cover"] {
            let entry = doc["_attachments"]?[name]
            #expect(entry?["content_type"] == "image/jpeg", "\(name)")
            #expect(entry?["data"]?.stringValue.flatMap { Data(base64Encoded: $0) }.map(Array.init) == CouchDBInteropTests.photo, "\(name)")
        }

        let stubs = try #require(try couch.request("GET", "/\(target)/made-here").json?["_attachments"])
        #expect(stubs["blob_/cover"]?["length"]?.int64Value == 40_000 && stubs["blob_/gallery/0"]?["length"]?.int64Value == 40_000)

        // Pulled into another database: the same revision, the same properties, the bodies.
        let other = directory.appending("other.sofa")
        #expect(try sofa("create", other).succeeded)
        #expect(try sofa("pull", other, couch.url(target)).succeeded)
        let back = try #require(try Database.open(at: other).currentRevision(of: "made-here"))
        #expect(back.revID == saved.revID)
        #expect(back.properties == saved.properties)
        #expect(back.blobAttachments.allSatisfy { $0.attachment.contentAvailable && $0.attachment.blobKey == $0.blob.key })
        #expect(back.legacyAttachments.isEmpty)

        // Sofa to sofa serve and back, with Sofa's replicator.
        let served = directory.appending("served-blobs.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served])
        let url = "http://127.0.0.1:\(server.port)/served-blobs"
        #expect(try sofa("push", local, url).succeeded)
        let third = directory.appending("third.sofa")
        #expect(try sofa("create", third).succeeded)
        #expect(try sofa("pull", third, url).succeeded)
        let viaServe = try #require(try Database.open(at: third).currentRevision(of: "made-here"))
        #expect(viaServe.revID == saved.revID && viaServe.properties == saved.properties)
        #expect(viaServe.attachments.map { [$0.name, $0.digest] } == saved.attachments.map { [$0.name, $0.digest] })
        #expect(viaServe.blobAttachments.count == 2 && viaServe.blobAttachments.allSatisfy(\.attachment.contentAvailable))
    }

    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func aDeferredBlobIsFetchedWhenItsFileIsRead() throws {
        let source = try couch.newDatabase("cbl-mount")
        #expect(try couch.request("POST", "/\(source)/_bulk_docs",
                                  ["new_edits": false, "docs": [.object(CouchDBInteropTests.couchbaseLiteDocument)]]).status == 201)
        let local = directory.appending("cbl-mount.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("pull", local, couch.url(source), "--no-download-attachments").succeeded)
        let mount = try MountedDatabase(local, arguments: ["--remote", couch.url(source)])
        let avatar = mount.path("docs/cbl-profile/blobs/avatar")
        #expect(try shell("getfattr --only-values -n user.sofa.available '\(avatar)'").stdout == "false")
        #expect(try shell("stat -c %s '\(avatar)'").stdout == "40000\n")
        let read = try shell("sha1sum '\(avatar)'")
        #expect(read.stdout.hasPrefix(BlobKey.of(CouchDBInteropTests.photo).hex), "\(read.stderr)")
        #expect(try shell("getfattr --only-values -n user.sofa.available '\(avatar)'").stdout == "true")
        #expect(try shell("cat '\(mount.path("docs/cbl-profile/blobs/a~1b~0c"))'").stdout == "tiny thumbnail")
        #expect(try shell("ls '\(mount.path("docs/cbl-profile/attachments"))'").stdout == "notes.txt\n")
    }

    @Test func sofaServeHandsBlobsToCouchDBsReplicatorWithTheirStandIns() throws {
        let source = try couch.newDatabase("cbl-serve")
        #expect(try couch.request("POST", "/\(source)/_bulk_docs",
                                  ["new_edits": false, "docs": [.object(CouchDBInteropTests.couchbaseLiteDocument)]]).status == 201)
        let served = directory.appending("served.sofa")
        #expect(try sofa("create", served).succeeded)
        let server = try ServedDatabases([served])
        let sofaURL = "http://127.0.0.1:\(server.port)/served"
        let auth = "http://\(couch.user):\(couch.password)@127.0.0.1:\(couch.port)"
        let into = try couch.request("POST", "/_replicate", ["source": .string("\(auth)/\(source)"), "target": .string(sofaURL)])
        #expect(into.status == 200, "\(into.text)")
        let back = "cbl-back-\(UUID().uuidString.prefix(8).lowercased())"
        let out = try couch.request("POST", "/_replicate", ["source": .string(sofaURL), "target": .string("\(auth)/\(back)"),
                                                             "create_target": true])
        #expect(out.status == 200, "\(out.text)")
        #expect(try describe(port: couch.port, back, digests: true) == (try describe(port: couch.port, source, digests: true)))
        // sofa serve shows the document as CouchDB does: blob dictionaries and stand-ins.
        let shown = try #require(try server.connect().json("GET", "/served/cbl-profile").json?.objectValue)
        #expect(properties(shown) == properties(CouchDBInteropTests.couchbaseLiteDocument))
        #expect(shown["_attachments"]?["blob_/avatar"]?["stub"] == true)
    }
}
