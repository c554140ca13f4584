import DocumentModel
import DocumentStore
import Foundation
import TestSupport
import Testing

/// Where Couchbase Lite sync used to lose data, each tried with Couchbase Lite's own replicator
/// (LiteCore 3.2, `../shared/peers/cblite`) against `sofa serve`, or two Sofa ends over `ws://`.
@Suite(.serialized) struct CouchbaseLiteSeamTests {
    let directory = TemporaryDirectory()

    func made(_ name: String) throws -> String { try directory.newDatabase(name) }

    func bytes(_ count: Int, _ seed: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 &* (seed | 1) &+ $0 >> 9 &+ seed) }
    }

    /// An app edits a document and keeps its blob: LiteCore pushes that revision without
    /// `_attachments`. The blob is still a blob here, and compaction keeps its body.
    @Test func aBlobAnAppKeptWhileEditingStaysABlobAndCompactionKeepsItsBody() throws {
        let path = directory.appending("album.sofa")
        let db = try Database.create(at: path)
        let photo = bytes(293_000, 7)
        var draft = try db.newRevision(of: "trip")
        draft.properties["title"] = "the trip"
        try draft.setBlob(at: "/photo", blob: db.blobs.write(photo), contentType: "image/jpeg")
        let first = try db.save(draft)
        var server = try ServedDatabases([path])
        let app = directory.appending("album.cblite2")
        let pulled = try CouchbaseLite.pull(app, from: "ws://127.0.0.1:\(server.port)/album")
        #expect(pulled.succeeded, "\(pulled.stdout)\(pulled.stderr)")

        var edited = try #require(try CouchbaseLite.documents(app)["trip"])
        edited["_id"] = nil
        edited["_rev"] = nil
        edited["title"] = "the trip, edited on the phone"
        let put = try CouchbaseLite.run(["--writeable", "put", "--update", app, "trip", JSONValue.object(edited).jsonString()])
        #expect(put.succeeded, "\(put.stdout)\(put.stderr)")
        let pushed = try CouchbaseLite.push(app, to: "ws://127.0.0.1:\(server.port)/album")
        #expect(pushed.succeeded, "\(pushed.stdout)\(pushed.stderr)")

        let current = try #require(try Database.open(at: path).currentRevision(of: "trip"))
        #expect(current.revID != first.revID && current.properties["title"] == "the trip, edited on the phone")
        #expect(current.blobProperties.map(\.pointer) == ["/photo"])
        let standIn = try server.connect().request("GET", "/album/trip/blob_%2Fphoto")
        #expect(standIn.status == 200 && standIn.body == photo)
        let listed = try sofa("blob", "ls", path, "trip")
        #expect(listed.stdout.contains("/photo"), "\(listed.stdout)")

        // Compacted alone (no grace for recent bodies): the first revision's own row goes, the body stays.
        server.stop()
        let compacted = try sofa("compact", path, "--json")
        #expect(compacted.succeeded, "\(compacted.stdout)\(compacted.stderr)")
        #expect(try Database.open(at: path).blobs.contents(of: BlobKey.of(photo)) == photo)
        server = try ServedDatabases([path])
        let again = try server.connect().request("GET", "/album/trip/blob_%2Fphoto")
        #expect(again.status == 200 && again.body == photo)
    }

    /// A database whose bodies stayed on its own remote (the live CouchDB, behind a proxy) is
    /// served to Couchbase Lite while that remote answers 503: the document whose body cannot be
    /// fetched is not offered (nor anything after it), so the phone's checkpoint stays before
    /// it; once the remote is back, the next pull brings it and the rest.
    @Test func aDocumentWhoseBodyCouldNotBeFetchedReachesThePhoneOnceItCan() throws {
        let couch = LiveCouchDB.shared
        let name = try couch.newDatabase("held")
        for index in 0..<10 {
            #expect(try couch.request("PUT", "/\(name)/before-\(index)", ["n": .integer(Int64(index))]).status == 201)
        }
        let report = bytes(200_000, 3)
        #expect(try couch.upload("/\(name)/report/report.pdf", report, contentType: "application/pdf").status == 201)
        for index in 0..<11 {
            #expect(try couch.request("PUT", "/\(name)/after-\(index)", ["n": .integer(Int64(index))]).status == 201)
        }
        let proxy = try FaultProxy(upstreamPort: couch.port)
        defer { proxy.close() }
        let middle = try made("middle")
        let remote = "http://127.0.0.1:\(proxy.port)/\(name)"
        let deferred = try sofa("pull", middle, remote, "--user", couch.user, "--password-file", passwordFile(couch.password),
                                "--no-download-attachments")
        #expect(deferred.succeeded, "\(deferred.stdout)\(deferred.stderr)")
        proxy.refuseServiceNext(1_000_000)

        let served = try ServedDatabases([middle, "--remote-user", couch.user, "--remote-password-file", passwordFile(couch.password)])
        let url = "ws://127.0.0.1:\(served.port)/middle"
        let phone = directory.appending("phone.cblite2")
        let first = try CouchbaseLite.pull(phone, from: url)
        #expect(first.succeeded, "\(first.stdout)\(first.stderr)")
        let partly = try CouchbaseLite.documents(phone)
        #expect(partly["report"] == nil)
        // Everything the middle database holds before it arrived (CouchDB's feed is ordered by its shards).
        let feed = try Database.open(at: middle).changes(since: 0).map(\.docID)
        let before = Array(feed.prefix { $0 != "report" })
        #expect(Set(partly.keys) == Set(before), "\(partly.keys.sorted()) \(before)")

        proxy.behave()
        let second = try CouchbaseLite.pull(phone, from: url)
        #expect(second.succeeded, "\(second.stdout)\(second.stderr)")
        let all = try CouchbaseLite.documents(phone)
        #expect(all.count == 22, "\(all.keys.sorted())")
        #expect(all["report"]?["_attachments"]?["report.pdf"]?["digest"]?.stringValue == BlobKey.of(report).digestString)
        #expect(CouchbaseLite.documentsMoved(try CouchbaseLite.pull(phone, from: url)) == 0)
    }

    func passwordFile(_ password: String) throws -> String {
        let path = directory.appending("password")
        try "\(password)\n".write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// Deletions at the end of the feed, filtered out of a first (active-only) pull, are not
    /// read again by the next pull: the checkpoint covers them.
    @Test func deletionsAtTheEndOfAnActiveOnlyPullAreNotReadAgain() throws {
        let path = try made("tidy")
        let db = try Database.open(at: path)
        for index in 0..<10 { _ = try db.put("kept-\(index)", ["n": .integer(Int64(index))]) }
        for index in 0..<10 {
            let saved = try db.put("gone-\(index)", ["n": .integer(Int64(index))])
            _ = try db.deleteDocument("gone-\(index)", revID: saved.revID)
        }
        let server = try ServedDatabases([path])
        let url = "ws://127.0.0.1:\(server.port)/tidy"
        let app = directory.appending("tidy.cblite2")
        let first = try CouchbaseLite.pull(app, from: url)
        #expect(first.succeeded, "\(first.stdout)\(first.stderr)")
        #expect(try CouchbaseLite.documents(app).keys.sorted() == (0..<10).map { "kept-\($0)" }.sorted())
        let second = try CouchbaseLite.pull(app, from: url)
        #expect(second.succeeded && CouchbaseLite.documentsMoved(second) == 0, "\(second.stdout)\(second.stderr)")
        // A deletion made afterwards is news, and arrives.
        let kept = try #require(try db.currentRevision(of: "kept-0"))
        _ = try db.deleteDocument("kept-0", revID: kept.revID)
        let third = try CouchbaseLite.pull(app, from: url)
        #expect(third.succeeded && CouchbaseLite.documentsMoved(third) == 1, "\(third.stdout)\(third.stderr)")
        #expect(try CouchbaseLite.documents(app)["kept-0"] == nil)
    }

    /// A Couchbase Lite push killed while bodies are arriving leaves no half-written file once
    /// its connection is gone.
    @Test func aKilledPushLeavesNoTemporaryFiles() throws {
        let source = try Database.create(at: directory.appending("gallery.sofa"))
        try source.inBatch { batch in
            for index in 0..<30 {
                var draft = try source.newRevision(of: "photo-\(index)")
                draft.properties["n"] = .integer(Int64(index))
                try draft.setBlob(at: "/image", blob: source.blobs.write(bytes(1_500_000, index)), contentType: "image/png")
                try batch.save(draft)
            }
        }
        let target = try made("inbox")
        let server = try ServedDatabases([source.path, target])
        let app = directory.appending("gallery.cblite2")
        #expect(try CouchbaseLite.pull(app, from: "ws://127.0.0.1:\(server.port)/gallery").succeeded)
        let temporary = target + "/attachments/tmp"
        func halfWritten() -> Int { ((try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []).count }
        var cut = 0
        for _ in 0..<3 {
            // Pulled once first, as the tool needs before a push (see CouchbaseLite.push).
            _ = try CouchbaseLite.pull(app, from: "ws://127.0.0.1:\(server.port)/inbox")
            let pushing = try ChildProcess([CouchbaseLite.tool, "--writeable", "push", app, "ws://127.0.0.1:\(server.port)/inbox"])
            if waitUntil(30, { halfWritten() > 0 }) { cut += 1 }
            pushing.kill(SIGKILL)
            _ = pushing.wait()
            #expect(waitUntil(20) { halfWritten() == 0 }, "\(halfWritten()) files left in \(temporary)")
        }
        #expect(cut > 0, "no push was cut while a body was arriving")
        // A later complete push brings everything, and leaves nothing behind either.
        #expect(try CouchbaseLite.push(app, to: "ws://127.0.0.1:\(server.port)/inbox").succeeded)
        #expect(try Database.open(at: target).changes(since: 0).count == 30)
        #expect(halfWritten() == 0)
    }
}
