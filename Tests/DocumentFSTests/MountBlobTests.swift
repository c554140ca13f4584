import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Blob properties (Couchbase Lite 3.x) in a real mount: `docs/<id>/blobs/<pointer>`.
@Suite struct MountBlobTests {
    let directory = TemporaryDirectory()
    let db: Database
    let photo = (0..<30_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "profile")
        draft.properties = ["name": "Ada", "album": []]
        try draft.setBlob(at: "/avatar", blob: db.blobs.write(photo), contentType: "image/jpeg")
        try draft.setBlob(at: "/album/0", blob: db.blobs.write(Array("first page\n".utf8)), contentType: "text/plain")
        try draft.setBlob(at: "/a~1b~0c", blob: db.blobs.write(Array("odd key\n".utf8)), contentType: "text/plain")
        try draft.setBlob(at: "/ünï", blob: db.blobs.write(photo), contentType: "image/jpeg")
        try draft.setAttachment("notes.txt", data: Array("legacy\n".utf8))
        _ = try db.save(draft)
    }

    func current() throws -> Revision { try #require(try db.currentRevision(of: "profile")) }

    @Test func blobsAreFilesAtTheirPointerBesideAttachments() throws {
        let mount = try MountedDatabase(db.path)
        let doc = mount.path("docs/profile")
        #expect(try sh("ls '\(doc)'") == "attachments\nblobs\nproperties.json\n")
        #expect(try sh("ls -A '\(doc)/attachments'") == "notes.txt\n", "stand-ins are not attachments")
        let files = try sh("cd '\(doc)/blobs' && find . -type f | LC_ALL=C sort")
        #expect(files == "./album/0\n./avatar\n./a~1b~0c\n./ünï\n")
        #expect(try sh("cmp '\(doc)/blobs/avatar' '\(db.blobs.path(for: BlobKey.of(photo)))' && stat -c %s '\(doc)/blobs/ünï'") == "30000\n")
        #expect(try sh("cat '\(doc)/blobs/album/0'") == "first page\n")
        #expect(try sh("getfattr --only-values -n user.mime_type '\(doc)/blobs/avatar'") == "image/jpeg")
        #expect(try sh("getfattr --only-values -n user.sofa.blob '\(doc)/blobs/a~1b~0c'") == "/a~1b~0c")
        #expect(try sh("getfattr --only-values -n user.sofa.available '\(doc)/blobs/avatar'") == "true")
        let shown = try JSONParser.parse(Array(try sh("cat '\(doc)/properties.json'").utf8))
        #expect(shown.objectValue == (try current().properties), "properties.json shows the blob dictionaries as stored")
        // attachments/ cannot reach a stand-in; a document without blobs lists no blobs/.
        #expect(try shell("cat '\(doc)/attachments/blob_/avatar'").status != 0)
        try db.put("plain", ["x": 1])
        #expect(try sh("ls '\(mount.path("docs/plain"))'") == "attachments\nproperties.json\n")
    }

    @Test func writingRemovingAndMovingFilesInBlobsChangesTheProperties() throws {
        let mount = try MountedDatabase(db.path)
        let doc = mount.path("docs/profile")
        let start = try current().revID.generation

        // A new file: one revision with a new blob property, its type from its name.
        let source = directory.appending("picture.png")
        #expect(FileManager.default.createFile(atPath: source, contents: Data(photo.reversed())))
        try sh("cp '\(source)' '\(doc)/blobs/picture.png'")
        var revision = try current()
        #expect(revision.revID.generation == start + 1)
        #expect(revision.properties["picture.png"] == .object(Blobs.dictionary(key: BlobKey.of(Array(photo.reversed())), length: 30_000,
                                                                               contentType: "image/png")))
        // An array element appended, a nested object made by mkdir -p and a write.
        try sh("printf 'second page\\n' > '\(doc)/blobs/album/1'")
        try sh("mkdir -p '\(doc)/blobs/profile/pictures' && printf 'deep\\n' > '\(doc)/blobs/profile/pictures/main'")
        revision = try current()
        #expect(revision.blobProperties.map(\.pointer).contains("/album/1"))
        #expect(JSONPointer.value(at: "/profile/pictures/main/length", in: revision.properties) == 5)
        #expect(try sh("cat '\(doc)/blobs/album/1'") == "second page\n")

        // sed -i writes a temporary file beside it and renames it over: one revision, the blob follows.
        let before = try current().revID.generation
        try sh("sed -i 's/first/1st/' '\(doc)/blobs/album/0'")
        revision = try current()
        #expect(revision.revID.generation == before + 1)
        #expect(Blobs.blob(at: "/album/0", in: revision.properties, docID: "profile")?.key == BlobKey.of(Array("1st page\n".utf8)))
        let listed = try sh("LC_ALL=C ls -A '\(doc)/blobs'")
        #expect(listed == "album\navatar\na~1b~0c\npicture.png\nprofile\nünï\n", "no temporary file is left")

        // rm removes the property; mv to attachments/ makes the blob a legacy attachment.
        try sh("rm '\(doc)/blobs/avatar'")
        try sh("mv '\(doc)/blobs/picture.png' '\(doc)/attachments/picture.png'")
        revision = try current()
        #expect(revision.properties["avatar"] == nil && revision.properties["picture.png"] == nil)
        #expect(revision.legacyAttachments.map(\.name).sorted() == ["notes.txt", "picture.png"])
        #expect(revision.attachment(named: "picture.png")?.blobKey == BlobKey.of(Array(photo.reversed())))
        // And back: an attachment moved into blobs/ becomes a blob property.
        try sh("mv '\(doc)/attachments/notes.txt' '\(doc)/blobs/notes'")
        revision = try current()
        #expect(Blobs.blob(at: "/notes", in: revision.properties, docID: "profile")?.contentType == "text/plain")
        #expect(revision.legacyAttachments.map(\.name) == ["picture.png"])

        // Editing properties.json to drop a blob removes its file.
        var properties = revision.properties
        properties["ünï"] = nil
        let edited = directory.appending("edited.json")
        #expect(FileManager.default.createFile(atPath: edited, contents: Data(JSONValue.object(properties).jsonString().utf8)))
        try sh("cp '\(edited)' '\(doc)/properties.json'")
        #expect(try sh("ls '\(doc)/blobs'").contains("ünï") == false)
        #expect(try current().attachment(named: "blob_/ünï") == nil)
    }

    @Test func aDocumentWithBlobsGoesToTheTrashComesBackAndIsRemovedWithRmR() throws {
        let mount = try MountedDatabase(db.path)
        let doc = mount.path("docs/profile")
        let before = try current()
        try sh("gio trash '\(doc)'")
        #expect(try db.currentRevision(of: "profile")?.deleted == true)
        let trashed = mount.path(".Trash-0/files/profile")
        #expect(try sh("cd '\(trashed)' && find . -type f | LC_ALL=C sort") ==
                "./attachments/notes.txt\n./blobs/album/0\n./blobs/avatar\n./blobs/a~1b~0c\n./blobs/ünï\n./properties.json\n")
        try sh("mv '\(trashed)' '\(doc)'")
        let restored = try current()
        #expect(restored.properties == before.properties)
        #expect(Set(restored.attachments.map { [$0.name, $0.contentType, $0.digest] }) == Set(before.attachments.map { [$0.name, $0.contentType, $0.digest] }))
        try sh("rm -r '\(doc)'")
        #expect(try db.currentRevision(of: "profile")?.deleted == true)
    }

    @Test func aConflictingBranchShowsItsBlobsReadOnly() throws {
        let base = try current()
        var draft = try db.newRevision(of: "profile", from: base.revID)
        try draft.setBlob(at: "/avatar", blob: db.blobs.write(Array("branch photo".utf8)))
        _ = try db.save(draft, allowConflict: true)
        draft = try db.newRevision(of: "profile", from: base.revID)
        draft.properties["name"] = "other branch"
        _ = try db.save(draft, allowConflict: true)
        let loser = try #require(try db.revisionTree(of: "profile").conflicts.first?.id.description)
        let mount = try MountedDatabase(db.path)
        let branch = mount.path("docs/profile/conflicts/\(loser)")
        #expect(try sh("ls '\(branch)'") == "attachments\nblobs\nproperties.json\n")
        #expect(try sh("ls '\(branch)/attachments'") == "notes.txt\n")
        #expect(try sh("cd '\(branch)/blobs' && find . -type f | LC_ALL=C sort") == "./album/0\n./avatar\n./a~1b~0c\n./ünï\n")
        let losing = try db.revision(try #require(RevisionID(loser)), of: "profile")
        let key = try #require(Blobs.blob(at: "/avatar", in: losing.properties, docID: "profile")?.key)
        #expect(try sh("sha1sum '\(branch)/blobs/avatar'").hasPrefix(key.hex))
        #expect(try shell("touch '\(branch)/blobs/new'").status != 0, "a conflict is read-only")
    }

    @Test func badWritesInBlobsAreRefusedWithAReason() throws {
        let mount = try MountedDatabase(db.path)
        let doc = mount.path("docs/profile")
        let start = try current()
        // A property that is not a blob is not replaced by one.
        let clash = try shell("printf 'x' | dd status=none of='\(doc)/blobs/name'")
        #expect(clash.status != 0)
        #expect(waitUntil(5) { mount.log.contains("blob at /name: a string that is not a blob is there") }, "\(mount.log)")
        // A ~ that RFC 6901 does not allow.
        let tilde = try shell("touch '\(doc)/blobs/bad~2'")
        #expect(tilde.status != 0 && tilde.stderr.contains("Invalid argument"), "\(tilde.stderr)")
        // Past the end of an array.
        #expect(try shell("printf 'x' | dd status=none of='\(doc)/blobs/album/5'").status != 0)
        // properties.json naming a body that is nowhere.
        var properties = start.properties
        properties["ghost"] = .object(Blobs.dictionary(key: BlobKey.of(Array("nowhere".utf8)), length: 7, contentType: "text/plain"))
        let edited = directory.appending("ghost.json")
        #expect(FileManager.default.createFile(atPath: edited, contents: Data(JSONValue.object(properties).jsonString().utf8)))
        #expect(try shell("cp '\(edited)' '\(doc)/properties.json'").status != 0)
        #expect(waitUntil(5) { mount.log.contains("blob at /ghost: no body with digest") }, "\(mount.log)")
        #expect(try current() == start, "nothing was saved")
    }
}
