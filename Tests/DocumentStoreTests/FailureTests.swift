import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Real file-system failures: a full disk (a small tmpfs) and a directory that
/// turns read-only in the middle of a blob write (a read-only bind mount laid
/// over the database). These need root, as CI has; without it they fail.
@Suite(.serialized) struct FailureTests {
    let directory = TemporaryDirectory()

    func mount(_ command: String) throws {
        let result = try shell(command)
        #expect(result.succeeded, "\(command): \(result.stderr)")
    }

    func blobNames(_ db: Database) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).filter { $0.hasSuffix(".blob") }
    }

    @Test func fullDiskDuringABlobWriteLeavesTheDatabaseUnchanged() throws {
        #expect(isRoot, "this test mounts a tmpfs and needs root")
        let mountPoint = directory.appending("small")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
        try mount("mount -t tmpfs -o size=2m tmpfs \(mountPoint)")
        defer { _ = try? shell("umount -l \(mountPoint)") }

        let db = try Database.create(at: mountPoint + "/full.sofa")
        var draft = try db.newRevision(of: "doc")
        draft.properties = ["v": 1]
        let saved = try db.save(draft)
        let source = directory.appending("big.bin")
        try writePatternFile(source, count: 4 << 20)

        draft = try db.newRevision(of: "doc")
        #expect(throws: SofaError.diskFull(path: "")) {
            do { try draft.setAttachment("big.bin", contentsOf: source) } catch SofaError.diskFull { throw SofaError.diskFull(path: "") }
        }
        #expect(try blobNames(db).isEmpty, "no half blob under a real name")
        #expect(try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory + "/tmp").isEmpty, "temporary file removed")
        #expect(try db.document(withID: "doc") == saved)
        #expect(try db.check().isEmpty)
        // Once there is room again, work goes on.
        try draft.setAttachment("small.txt", data: Array("fits".utf8))
        #expect(try db.save(draft).attachmentNames == ["small.txt"])
    }

    @Test func directoryTurningReadOnlyDuringABlobWriteLeavesNoHalfBlob() throws {
        #expect(isRoot, "this test uses a bind mount and needs root")
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        draft.properties = ["v": 1]
        let saved = try db.save(draft)

        let writer = try db.blobs.makeWriter()
        let chunk = [UInt8](repeating: 0xAB, count: 1 << 20)
        try chunk.withUnsafeBytes { try writer.write($0) }
        // The database directory turns read-only while the blob is half written.
        try mount("mount --bind \(db.path) \(db.path) && mount -o remount,bind,ro \(db.path)")
        var unmounted = false
        defer { if !unmounted { _ = try? shell("umount -l \(db.path)") } }
        try chunk.withUnsafeBytes { try writer.write($0) }
        #expect(throws: SofaError.readOnlyFileSystem(path: "")) {
            do { _ = try writer.finish() } catch SofaError.readOnlyFileSystem { throw SofaError.readOnlyFileSystem(path: "") }
        }
        // Another process cannot save to the read-only database, and says why.
        let put = try sofa("put", db.path, "doc", #"{"v":2}"#)
        #expect(put.status == 1)
        #expect(put.stderr.contains("read-only"), "\(put.stderr)")
        try mount("umount \(db.path)")
        unmounted = true

        // A database on read-only media (checkpointed, as compaction leaves it) can still be read.
        _ = try db.compact()
        try mount("mount --bind \(db.path) \(db.path) && mount -o remount,bind,ro \(db.path)")
        unmounted = false
        let cat = try sofa("cat", db.path, "doc", "--properties")
        #expect(cat.succeeded && cat.stdout == "{\n  \"v\": 1\n}\n", "\(cat.stderr)")
        let refused = try sofa("put", db.path, "doc", #"{"v":3}"#)
        #expect(refused.status == 1 && refused.stderr.contains("read-only file system"), "\(refused.stderr)")
        try mount("umount \(db.path)")
        unmounted = true

        #expect(try blobNames(db).isEmpty, "no half blob under a real name")
        let reopened = try Database.open(at: db.path)
        #expect(try reopened.document(withID: "doc") == saved)
        #expect(try reopened.check().isEmpty)
    }
}

extension FailureTests {
    /// A pre-built database on a read-only medium answers its views from the index it was
    /// shipped with, and says why it cannot build one it lacks.
    @Test func aReadOnlyDatabaseAnswersFromTheViewIndexItHas() throws {
        #expect(isRoot, "this test uses a bind mount and needs root")
        let db = try directory.makeDatabase()
        for i in 0..<5 {
            var draft = try db.newRevision(of: "d\(i)")
            draft.properties = ["n": .integer(Int64(i))]
            try db.save(draft)
        }
        var design = try db.newRevision(of: "_design/shipped")
        design.properties = ["views": ["n": ["map": "function (doc) { emit(doc.n, null); }"]]]
        try db.save(design)
        var other = try db.newRevision(of: "_design/unbuilt")
        other.properties = ["views": ["m": ["map": "function (doc) { emit(doc._id, null); }"]]]
        try db.save(other)
        let shipped = try #require(try db.viewDefinition("_design/shipped"))
        let built = try db.updateViewIndex(shipped)
        _ = try db.compact()
        try mount("mount --bind \(db.path) \(db.path) && mount -o remount,bind,ro \(db.path)")
        // Lazily: the databases opened on it are still open when this runs (a plain umount
        // failed "target is busy" and left the bind mount behind after every run).
        defer { _ = try? shell("umount -l \(db.path)") }
        let readOnly = try Database.open(at: db.path)
        #expect(readOnly.isReadOnly)
        let state = try readOnly.updateViewIndex(try #require(try readOnly.viewDefinition("_design/shipped")))
        #expect(state.sequence == built.sequence)
        #expect(try readOnly.viewRows(index: state.id, view: 0, range: ViewRange(), skip: 0, limit: 10).rows.map(\.docID)
                == ["d0", "d1", "d2", "d3", "d4"])
        #expect(throws: SofaError.readOnlyFileSystem(path: readOnly.path)) {
            try readOnly.updateViewIndex(try #require(try readOnly.viewDefinition("_design/unbuilt")))
        }
    }
}

extension FailureTests {
    /// On a full disk SQLite cannot make the WAL's shared-memory file, and every command failed
    /// with "SQLite error 4874: disk I/O error (in PRAGMA user_version)" (#30). A database whose
    /// commits are all in its main file now opens for reading: `info`, `check`, `cat`, `ls` work,
    /// and a write says the disk is full. With room again, everything works as before.
    @Test func aFullDiskLeavesReadingCommandsWorkingAndWritesSayWhy() throws {
        #expect(isRoot, "this test mounts a tmpfs and needs root")
        let mountPoint = directory.appending("full")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
        try mount("mount -t tmpfs -o size=2m tmpfs \(mountPoint)")
        defer { _ = try? shell("umount -l \(mountPoint)") }
        let path = mountPoint + "/full.sofa"
        do {
            let db = try Database.create(at: path)
            try db.put("doc", ["n": 1], attachments: ["note.txt": Array("hello".utf8)])
        }  // closed: its commits are in the main file
        let filler = mountPoint + "/filler"
        _ = try shell("dd if=/dev/zero of=\(filler) bs=64k 2>/dev/null")
        for arguments in [["info", path], ["check", path], ["cat", path, "doc"], ["ls", path], ["cat-attachment", path, "doc", "note.txt"]] {
            let result = try sofa(arguments)
            #expect(result.status == 0, "\(arguments): \(result.stderr)")
            #expect(!result.stderr.contains("4874"), "\(arguments): \(result.stderr)")
        }
        #expect(try sofa(["cat-attachment", path, "doc", "note.txt"]).stdout == "hello")
        let put = try sofa(["put", path, "other", #"{"n":2}"#])
        #expect(put.status != 0 && put.stderr.contains("no space left on device"), "\(put.stderr)")
        let db = try Database.open(at: path)
        #expect(db.openedOnAFullDisk && db.isReadOnly)
        #expect(try db.document(withID: "doc")?.properties == ["n": 1])
        #expect(throws: SofaError.diskFull(path: path + "/db.sqlite3")) { try db.put("other", ["n": 2]) }
        // Room again: a normal open, and writes work.
        try FileManager.default.removeItem(atPath: filler)
        let again = try Database.open(at: path)
        #expect(!again.isReadOnly)
        try again.put("other", ["n": 2])
        #expect(try again.check().isEmpty)
    }
}
