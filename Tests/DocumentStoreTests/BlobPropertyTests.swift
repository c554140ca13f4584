import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Couchbase Lite 3.x blob properties: stored, checked, kept by compaction.
@Suite struct BlobPropertyTests {
    let directory = TemporaryDirectory()

    func blobDictionary(_ bytes: [UInt8], type: String = "image/jpeg") -> JSONValue {
        .object(Blobs.dictionary(key: BlobKey.of(bytes), length: Int64(bytes.count), contentType: type))
    }

    @Test func pointersEscapeAndResolveAsRFC6901Says() throws {
        #expect(JSONPointer.escape("a/b~c") == "a~1b~0c")
        #expect(JSONPointer.segments("/a~1b~0c/0") == ["a/b~c", "0"])
        #expect(JSONPointer.segments("/x~2") == nil)
        #expect(JSONPointer.segments("x") == nil)
        #expect(JSONPointer.segments("/") == [""])
        let properties: JSONObject = ["a/b": ["list": [1, ["deep": true]]], "ü": "x"]
        #expect(JSONPointer.value(at: "/a~1b/list/1/deep", in: properties) == .bool(true))
        #expect(JSONPointer.value(at: "/a~1b/list/01", in: properties) == nil)
        #expect(JSONPointer.value(at: "/ü", in: properties) == "x")
        let appended = try JSONPointer.setting(3, at: "/a~1b/list/2", in: properties)
        #expect(JSONPointer.value(at: "/a~1b/list", in: appended) == [1, ["deep": true], 3])
        #expect(throws: SofaError.self) { try JSONPointer.setting(3, at: "/a~1b/list/5", in: properties) }
        #expect(throws: SofaError.self) { try JSONPointer.setting(3, at: "/ü/x", in: properties) }
        let removed = JSONPointer.removing("/a~1b/list/0", from: properties)
        #expect(JSONPointer.value(at: "/a~1b/list", in: removed) == [["deep": true]])
    }

    @Test func blobsAreFoundAnywhereAndInvalidOnesAreNamed() throws {
        let photo = Array("jpeg bytes".utf8)
        let properties: JSONObject = [
            "avatar": blobDictionary(photo),
            "album": ["pages": [["cover": blobDictionary(photo)], "text"]],
            "a/b~c": blobDictionary(photo),
            "ünïcode": blobDictionary(photo),
            "lookalike": ["@type": "Blob", "digest": "sha1-nope"],
        ]
        let found = try Blobs.find(in: properties, docID: "d")
        #expect(found.map(\.pointer) == ["/avatar", "/album/pages/0/cover", "/a~1b~0c", "/ünïcode"])
        #expect(found.map(\.standInName) == ["blob_/avatar", "blob_/album/pages/0/cover", "blob_/a~1b~0c", "blob_/ünïcode"])
        #expect(Set(found.map(\.key)) == [BlobKey.of(photo)])

        func reason(_ blob: JSONValue) -> String? {
            do { _ = try Blobs.find(in: ["x": ["y": blob]], docID: "d"); return nil } catch { return "\(error)" }
        }
        #expect(reason(["@type": "blob", "length": 3]) == "document \"d\", blob at /x/y: it has no digest")
        #expect(reason(["@type": "blob", "digest": "md5-abc"])?.contains("is not sha1-") == true)
        #expect(reason(["@type": "blob", "digest": "sha1-AAAA"])?.contains("is not sha1-") == true)
        #expect(reason(["@type": "blob", "digest": .string(BlobKey.of(photo).digestString), "length": -1])?
            .contains("length -1 is not a whole number") == true)
        #expect(reason(["@type": "blob", "digest": .string(BlobKey.of(photo).digestString), "length": 1.5])?
            .contains("length 1.5") == true)
        #expect(try Blobs.find(in: ["x": ["@type": "blob"]], docID: "d", lenient: true).isEmpty)
    }

    @Test func aBlobPropertyIsStoredWithItsStandInAndSharedBodiesOnce() throws {
        let db = try directory.makeDatabase()
        let photo = [UInt8](repeating: 42, count: 50_000)
        var draft = try db.newRevision(of: "profile")
        draft.properties["name"] = "Ada"
        try draft.setBlob(at: "/avatar", blob: db.blobs.write(photo), contentType: "image/png")
        try draft.setBlob(at: "/album/0", blob: db.blobs.write(photo))
        let saved = try db.save(draft)
        #expect(saved.properties["avatar"] == .object(["@type": "blob", "content_type": "image/png",
                                                        "digest": .string(BlobKey.of(photo).digestString), "length": 50_000]))
        #expect(saved.attachmentNames == ["blob_/album/0", "blob_/avatar"])
        #expect(saved.legacyAttachments.isEmpty)
        #expect(saved.blobAttachments.map(\.blob.pointer) == ["/avatar", "/album/0"])
        #expect(saved.attachment(named: "blob_/album/0")?.contentType == "application/octet-stream")
        #expect(try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).filter { $0.hasSuffix(".blob") }.count == 1)

        // A second property naming the same body, written into properties: the body is here.
        draft = try db.newRevision(of: "profile")
        draft.properties["copy"] = saved.properties["avatar"]
        let copied = try db.save(draft)
        #expect(copied.attachment(named: "blob_/copy")?.blobKey == BlobKey.of(photo))
        #expect(copied.attachment(named: "blob_/avatar")?.revpos == 1)
        #expect(copied.attachment(named: "blob_/copy")?.revpos == 2)

        // Compaction keeps a body only blob properties use.
        _ = try db.compact(alone: true)
        #expect(db.blobs.contains(BlobKey.of(photo)))
        let reopened = try Database.open(at: db.path)
        #expect(try reopened.blobs.contents(of: BlobKey.of(photo)) == photo)
    }

    @Test func removingOrMovingABlobPropertyTakesItsStandInAlong() throws {
        let db = try directory.makeDatabase()
        let one = Array("one".utf8), two = Array("two".utf8)
        var draft = try db.newRevision(of: "d")
        draft.properties["list"] = []
        try draft.setBlob(at: "/list/0", blob: db.blobs.write(one))
        try draft.setBlob(at: "/list/1", blob: db.blobs.write(two))
        try draft.setBlob(at: "/solo", blob: db.blobs.write(one))
        _ = try db.save(draft)

        // Taking out the first element moves the second up: its stand-in follows.
        draft = try db.newRevision(of: "d")
        try draft.removeAttachment("blob_/list/0")
        var saved = try db.save(draft)
        #expect(saved.attachmentNames == ["blob_/list/0", "blob_/solo"])
        #expect(saved.attachment(named: "blob_/list/0")?.blobKey == BlobKey.of(two))

        // Editing the properties alone: a moved blob keeps its body, a removed one loses its stand-in.
        draft = try db.newRevision(of: "d")
        draft.properties["moved"] = draft.properties["solo"]
        draft.properties["solo"] = nil
        draft.properties["list"] = nil
        saved = try db.save(draft)
        #expect(saved.attachmentNames == ["blob_/moved"])
        #expect(saved.attachment(named: "blob_/moved")?.blobKey == BlobKey.of(one))

        // Renaming the stand-in moves the property; renaming it away from blob_/ makes an attachment.
        draft = try db.newRevision(of: "d")
        try draft.renameAttachment("blob_/moved", to: "blob_/nested/place")
        saved = try db.save(draft)
        #expect(JSONPointer.value(at: "/nested/place/digest", in: saved.properties) == .string(BlobKey.of(one).digestString))
        #expect(saved.properties["moved"] == nil)
        draft = try db.newRevision(of: "d")
        try draft.renameAttachment("blob_/nested/place", to: "one.txt")
        saved = try db.save(draft)
        #expect(saved.attachmentNames == ["one.txt"])
        #expect(saved.properties["nested"] == .object([:]))
        #expect(saved.blobProperties.isEmpty)
    }

    @Test func badBlobsAreRefusedWithTheirPlaceAndNothingIsSaved() throws {
        let db = try directory.makeDatabase()
        let bytes = Array("body".utf8)
        let missing = BlobKey.of(Array("never stored".utf8))
        _ = try db.put("d", ["title": "kept"])

        func refusal(_ properties: JSONObject) -> String? {
            do {
                var draft = try db.newRevision(of: "d")
                draft.properties = properties
                _ = try db.save(draft)
                return nil
            } catch { return "\(error)" }
        }
        #expect(refusal(["pic": .object(Blobs.dictionary(key: missing, length: 12, contentType: "text/plain"))])?
            .contains("blob at /pic: no body with digest \(missing.digestString) is here") == true)
        #expect(refusal(["pic": ["@type": "blob"]]) == "document \"d\", blob at /pic: it has no digest")
        _ = try db.blobs.write(bytes)
        #expect(refusal(["pic": .object(Blobs.dictionary(key: BlobKey.of(bytes), length: 99, contentType: "text/plain"))]) ==
                "document \"d\", blob at /pic: its length is 99 but its body has 4 bytes")
        #expect(try db.currentRevision(of: "d")?.properties == ["title": "kept"])

        // Spelled differently, it is plain JSON, nothing behind it.
        var draft = try db.newRevision(of: "d")
        draft.properties["pic"] = ["@type": "Blob", "digest": .string(missing.digestString)]
        let plain = try db.save(draft)
        #expect(plain.attachments.isEmpty && plain.blobProperties.isEmpty)

        // A body already here can be named by properties alone; the stand-in is made for it.
        draft = try db.newRevision(of: "d")
        draft.properties["pic"] = .object(Blobs.dictionary(key: BlobKey.of(bytes), length: 4, contentType: "text/plain"))
        let linked = try db.save(draft)
        #expect(linked.attachment(named: "blob_/pic")?.blobKey == BlobKey.of(bytes))

        // A stand-in cannot replace a property that is not a blob.
        draft = try db.newRevision(of: "d")
        #expect(throws: SofaError.invalidBlob(docID: "d", pointer: "/title", reason: "a string that is not a blob is there")) {
            try draft.setBlob(at: "/title", blob: db.blobs.write(bytes))
        }
        #expect(throws: SofaError.self) { try draft.setAttachment("blob_/x~9", data: bytes) }
    }

    @Test func anAttachmentAndABlobOfTheSameNameAreTwoThings() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "d")
        try draft.setAttachment("avatar", data: Array("attachment".utf8))
        try draft.setBlob(at: "/avatar", blob: db.blobs.write(Array("blob".utf8)))
        let saved = try db.save(draft)
        #expect(saved.legacyAttachments.map(\.name) == ["avatar"])
        #expect(saved.blobAttachments.map(\.attachment.name) == ["blob_/avatar"])
        #expect(try db.blobs.contents(of: try #require(saved.attachment(named: "avatar")?.blobKey)) == Array("attachment".utf8))
        draft = try db.newRevision(of: "d")
        try draft.removeAttachment("avatar")
        let after = try db.save(draft)
        #expect(after.attachmentNames == ["blob_/avatar"] && after.properties["avatar"] != nil, "removing the attachment keeps the blob")
    }

    @Test func aLegacyAttachmentNamedLikeAStandInStaysUntilItsNameIsABlob() throws {
        let db = try directory.makeDatabase()
        // As another replica may send it: an attachment named blob_/… with no blob behind it.
        let body = try db.blobs.write(Array("legacy".utf8))
        _ = try db.insert(ReplicatedRevision(docID: "d", revID: try #require(RevisionID("1-aaaa")), ancestors: [],
                                             properties: ["title": "t"],
                                             attachments: [Attachment(name: "blob_/old", contentType: "text/plain", blob: body, revpos: 1)]))
        var draft = try db.newRevision(of: "d")
        draft.properties["title"] = "edited"
        let edited = try db.save(draft)
        #expect(edited.attachmentNames == ["blob_/old"])
        #expect(edited.legacyAttachments.map(\.name) == ["blob_/old"])
        #expect(edited.blobProperties.isEmpty)
    }
}
