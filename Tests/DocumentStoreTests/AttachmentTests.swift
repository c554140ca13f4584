import DocumentModel
@testable import DocumentStore
import Foundation
import Testing
import TestSupport

@Suite struct AttachmentTests {
    let directory = TemporaryDirectory()

    func blobFiles(_ db: Database) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).filter { $0.hasSuffix(".blob") }.sorted()
    }

    @Test func attachmentsHaveMetadataAndStreamableContent() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("notes/hello.txt", data: Array("hello\n".utf8))
        let rev = try db.save(draft)
        let attachment = try #require(rev.attachment(named: "notes/hello.txt"))
        #expect(attachment.contentType == "text/plain")
        #expect(attachment.length == 6)
        #expect(attachment.digest == "sha1-9XLTlvrpIGYocU+yzgD3LpTyJY8=")
        #expect(attachment.revpos == 1)
        #expect(attachment.contentAvailable)
        #expect(rev.attachmentNames == ["notes/hello.txt"])
        let path = try #require(db.contentPath(of: attachment))
        #expect(path.hasSuffix("/attachments/f572d396fae9206628714fb2ce00f72e94f2258f.blob"))
        var info = stat()
        #expect(stat(path, &info) == 0 && info.st_mode & 0o777 == 0o444)
        #expect(try db.blobs.contents(of: attachment.blobKey!) == Array("hello\n".utf8))
    }

    @Test func unchangedAttachmentsKeepRevposAndChangedOnesMove() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("a.txt", data: Array("a".utf8))
        try draft.setAttachment("b.bin", data: [1, 2, 3])
        _ = try db.save(draft)
        draft = try db.newRevision(of: "doc")
        try draft.setAttachment("b.bin", data: [4, 5, 6])
        let second = try db.save(draft)
        #expect(second.attachment(named: "a.txt")?.revpos == 1)
        #expect(second.attachment(named: "b.bin")?.revpos == 2)
        draft = try db.newRevision(of: "doc")
        try draft.removeAttachment("a.txt")
        try draft.renameAttachment("b.bin", to: "c.bin")
        let third = try db.save(draft)
        #expect(third.attachmentNames == ["c.bin"])
        #expect(third.attachment(named: "c.bin")?.blobKey == second.attachment(named: "b.bin")?.blobKey)
        #expect(throws: SofaError.attachmentNotFound(docID: "doc", name: "zzz")) { try draft.removeAttachment("zzz") }
    }

    @Test func identicalContentIsStoredOnce() throws {
        let db = try directory.makeDatabase()
        let bytes = [UInt8](repeating: 7, count: 100_000)
        for id in ["one", "two"] {
            var draft = try db.newRevision(of: id)
            try draft.setAttachment("same.bin", data: bytes)
            _ = try db.save(draft)
        }
        #expect(try blobFiles(db).count == 1)
        #expect(try db.info().blobCount == 1)
        // No temporary file is left behind either.
        #expect(try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory + "/tmp").isEmpty)
    }

    @Test func corruptBlobIsAnErrorNeverGoodData() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("x.bin", data: [UInt8](repeating: 1, count: 300_000))
        let attachment = try #require(try db.save(draft).attachment(named: "x.bin"))
        let path = try #require(db.contentPath(of: attachment))
        // Same length, one byte changed.
        let fd = open(path, O_WRONLY)
        #expect(pwrite(fd, [UInt8(2)], 1, 150_000) == 1)
        close(fd)
        #expect(throws: SofaError.blobCorrupted(key: attachment.blobKey!.hex, path: path)) {
            let reader = try db.openContent(of: attachment, docID: "doc")
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 8)
            defer { buffer.deallocate() }
            while try reader.read(into: buffer) > 0 {}
        }
        #expect(throws: SofaError.self) { try db.blobs.verify(attachment.blobKey!) }
        #expect(try db.check().count == 1)
        // A truncated blob is refused before any byte is read.
        #expect(truncate(path, 10) == 0)
        #expect(throws: SofaError.blobCorrupted(key: attachment.blobKey!.hex, path: path)) {
            try db.openContent(of: attachment, docID: "doc")
        }
    }

    @Test func bodiesKnownOnlyByMetadataAreANormalState() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment(Attachment(name: "remote.bin", contentType: "application/octet-stream", length: 3_145_728,
                                           digest: "md5-4Bvfm+Y1zjFxO0jQzMk0dA==", blobKey: nil, revpos: 1))
        let rev = try db.save(draft)
        let attachment = try #require(rev.attachment(named: "remote.bin"))
        #expect(!attachment.contentAvailable)
        #expect(attachment.length == 3_145_728)
        #expect(db.contentPath(of: attachment) == nil)
        #expect(throws: SofaError.bodyNotAvailable(docID: "doc", name: "remote.bin")) { try db.openContent(of: attachment, docID: "doc") }
        #expect(try db.info().missingBodyCount == 1)
    }

    @Test func streamsFromFilesAndPipes() throws {
        let db = try directory.makeDatabase()
        let source = directory.appending("source.bin")
        let key = try writePatternFile(source, count: 5_000_000)
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("big.bin", contentsOf: source)
        let rev = try db.save(draft)
        #expect(rev.attachment(named: "big.bin")?.blobKey == key)
        #expect(rev.attachment(named: "big.bin")?.length == 5_000_000)
        #expect(rev.attachment(named: "big.bin")?.contentType == "application/octet-stream")

        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let writeEnd = fds[1]
        let writer = Thread {
            _ = "streamed through a pipe".withCString { write(writeEnd, $0, strlen($0)) }
            close(writeEnd)
        }
        writer.start()
        let blob = try db.blobs.write(fromDescriptor: fds[0], name: "pipe")
        close(fds[0])
        #expect(try db.blobs.contents(of: blob.key) == Array("streamed through a pipe".utf8))
    }

    @Test func cancelledWriterLeavesNothing() throws {
        let db = try directory.makeDatabase()
        do {
            let writer = try db.blobs.makeWriter()
            try [UInt8](repeating: 9, count: 1000).withUnsafeBytes { try writer.write($0) }
            writer.cancel()
        }
        #expect(try blobFiles(db).isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory + "/tmp").isEmpty)
    }
}

@Suite struct CompactionTests {
    let directory = TemporaryDirectory()

    /// Makes every blob look older than the grace period that protects fresh blobs.
    @Test func removesOrphansAndOldBodiesButKeepsAbsentReferencedBodies() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("old.bin", data: [UInt8](repeating: 1, count: 10_000))
        try draft.setAttachment(Attachment(name: "deferred.bin", contentType: "application/octet-stream", length: 42,
                                           digest: "md5-AAAAAAAAAAAAAAAAAAAAAA==", blobKey: nil, revpos: 1))
        let first = try db.save(draft)
        draft = try db.newRevision(of: "doc")
        try draft.setAttachment("old.bin", data: [UInt8](repeating: 2, count: 20_000))
        draft.properties = ["v": 2]
        _ = try db.save(draft)
        // An orphan: stored, never saved in a revision.
        let orphan = try db.blobs.write([UInt8](repeating: 3, count: 5_000))
        // A fresh orphan survives: a save in another process may be about to use it.
        try ageBlobs(db)
        let fresh = try db.blobs.write([UInt8](repeating: 4, count: 5_000))

        let report = try db.compact()
        #expect(report.bodiesDropped == 1)
        #expect(report.blobsDeleted == 2)  // the old body of old.bin, and the orphan
        #expect(report.blobBytesFreed == 15_000)
        #expect(report.recentBlobsKept == 1)
        #expect(!db.blobs.contains(orphan.key))
        #expect(db.blobs.contains(fresh.key))
        #expect(!db.blobs.contains(first.attachment(named: "old.bin")!.blobKey!))
        let current = try #require(try db.document(withID: "doc"))
        #expect(current.attachment(named: "deferred.bin")?.length == 42)
        #expect(current.attachment(named: "deferred.bin")?.contentAvailable == false)
        #expect(try db.blobs.contents(of: current.attachment(named: "old.bin")!.blobKey!).count == 20_000)
        #expect(throws: SofaError.revisionNotFound(docID: "doc", revID: first.revID.description)) { try db.revision(first.revID, of: "doc") }
        #expect(try db.revisionTree(of: "doc").nodes.count == 2)
        #expect(try db.check().isEmpty)
    }

    /// A file adopted into the store (the mount's rename of rsync's temporary file, whose time
    /// rsync set to its source's) is as fresh as a written one: compaction running before the
    /// save that uses it keeps it.
    @Test func aBodyAdoptedFromAnOldFileIsFreshForCompaction() throws {
        let db = try directory.makeDatabase()
        let path = directory.appending("old-file")
        try Data(repeating: 5, count: 6_000).write(to: URL(fileURLWithPath: path))
        var times = [timespec(tv_sec: 978_307_200, tv_nsec: 0), timespec(tv_sec: 978_307_200, tv_nsec: 0)]  // 2001
        #expect(utimensat(AT_FDCWD, path, &times, 0) == 0)
        let adopted = try db.blobs.adopt(fileAt: path, keepingOriginal: true, durable: false)
        let report = try db.compact()
        #expect(report.recentBlobsKept == 1 && report.blobsDeleted == 0)
        #expect(db.blobs.contains(adopted.key))
    }

    /// A file adopted where it stays (rsync's temporary file, renamed into a document) is linked
    /// under its blob's name; when those bytes are stored already, the stored file is kept (made
    /// fresh) and the other is left alone.
    @Test func aFileAdoptedInPlaceIsLinkedUnderItsBlobsNameOrLeftWhenTheBytesAreStored() throws {
        let db = try directory.makeDatabase()
        let (path, again) = (directory.appending("kept"), directory.appending("again"))
        for file in [path, again] { try Data(repeating: 9, count: 5_000).write(to: URL(fileURLWithPath: file)) }
        let first = try db.blobs.adopt(fileAt: path, keepingOriginal: true)
        let blobPath = db.blobs.path(for: first.key)
        var original = stat(), blob = stat()
        #expect(stat(path, &original) == 0 && stat(blobPath, &blob) == 0)
        #expect(original.st_ino == blob.st_ino && blob.st_nlink == 2 && blob.st_mode & 0o777 == 0o444)

        var times = [timespec(tv_sec: 978_307_200, tv_nsec: 0), timespec(tv_sec: 978_307_200, tv_nsec: 0)]  // 2001
        #expect(utimensat(AT_FDCWD, blobPath, &times, 0) == 0)
        let second = try db.blobs.adopt(fileAt: again, keepingOriginal: true, durable: false)
        var other = stat()
        #expect(second.key == first.key && stat(blobPath, &blob) == 0 && stat(again, &other) == 0)
        #expect(blob.st_ino == original.st_ino && blob.st_mtim.tv_sec > 978_307_200, "the stored file, made fresh")
        #expect(other.st_nlink == 1, "the other file is not linked anywhere")
        #expect(try db.blobs.contents(of: first.key) == [UInt8](repeating: 9, count: 5_000))
    }

    /// A body written again is not renamed over the stored one (a rename that does not
    /// replace): the stored file stays, with its bytes, its time refreshed (for a compaction
    /// running before the save), and no temporary file is left.
    @Test func aBodyWrittenAgainKeepsTheStoredFileAndLeavesNoTemporaryFile() throws {
        let db = try directory.makeDatabase()
        let bytes = Array("the same bytes twice\n".utf8)
        func written() throws -> StoredBlob {
            let file = try db.blobs.makeTemporaryFile()
            try bytes.withUnsafeBytes { try file.write($0, at: 0) }
            return try file.commit(durable: false)
        }
        let first = try written()
        let path = db.blobs.path(for: first.key)
        var old = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, path, &old, 0) == 0)
        var before = stat()
        #expect(stat(path, &before) == 0)
        let second = try written()
        #expect(second.key == first.key)
        var after = stat()
        #expect(stat(path, &after) == 0)
        #expect(after.st_ino == before.st_ino, "the stored file was replaced")
        #expect(after.st_mtim.tv_sec > 1_000_000_000, "not touched")
        #expect(try db.blobs.contents(of: first.key) == bytes)
        let left = try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory + "/tmp")
        #expect(left.isEmpty, "\(left)")
    }

    /// A small body's MD5 is worked out as it is written or adopted (the mount's files), so a
    /// save need not read it again for the revision id: it is the MD5 of exactly the bytes
    /// stored, whatever order they came in, and none is given for a body hashed elsewhere.
    /// The revision id is the same with it as when the save reads the body.
    @Test func aSmallBodysMD5IsWorkedOutAsItIsWrittenAndGivesTheSameRevisionID() throws {
        let db = try directory.makeDatabase()
        let bytes = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let md5 = MessageDigest.hash(.md5, bytes)
        func written(_ pieces: [(Int, Int)], truncatingTo size: Int64? = nil) throws -> StoredBlob {
            let file = try db.blobs.makeTemporaryFile()
            for (start, end) in pieces { try bytes[start..<end].withUnsafeBytes { try file.write($0, at: Int64(start)) } }
            if let size { try file.truncate(to: size) }
            return try file.commit(durable: false)
        }
        #expect(try written([(0, 4_096), (4_096, 10_000)]).md5 == md5, "in order")
        #expect(try written([(4_096, 10_000), (0, 4_096)]).md5 == md5, "out of order: hashed again at the commit")
        #expect(try written([(0, 10_000), (0, 3)], truncatingTo: 10_000).md5 == md5, "rewritten in place")
        #expect(try written([(0, 10_000)], truncatingTo: 5_000).md5 == MessageDigest.hash(.md5, Array(bytes[0..<5_000])))
        let big = try db.blobs.makeTemporaryFile()
        for offset in stride(from: 0, to: 300 << 10, by: 10_000) {
            try bytes.withUnsafeBytes { try big.write($0, at: Int64(offset)) }
        }
        #expect(try big.commit(durable: false).md5 == nil, "past 128 KiB: hashed on another core, read at the save")

        let path = directory.appending("adopted")
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let adopted = try db.blobs.adopt(fileAt: path, keepingOriginal: true, durable: false)
        #expect(adopted.md5 == md5)

        // The same edit with the MD5 known and with the body read for it.
        try db.put("known", [:])
        try db.put("read", [:])
        var known = try db.newRevision(of: "known")
        try known.setAttachment("a.bin", blob: adopted)
        var read = try db.newRevision(of: "read")
        try read.setAttachment("a.bin", blob: StoredBlob(key: adopted.key, length: adopted.length))
        #expect(known.couchMD5sAhead.count == 1 && read.couchMD5sAhead.isEmpty)
        #expect(try db.save(known).revID == db.save(read).revID)
    }

    /// The MD5s of many new bodies, worked out ahead of a save on several cores, are the ones
    /// the save works out itself: the same revision id, text (gzip form) and binary alike.
    @Test func manyBodiesMD5sWorkedOutOnSeveralCoresGiveTheSameRevisionID() throws {
        let db = try directory.makeDatabase()
        try db.put("ahead", [:])
        try db.put("in-save", [:])
        var ahead = try db.newRevision(of: "ahead"), inSave = try db.newRevision(of: "in-save")
        for index in 0..<300 {
            let name = index % 2 == 0 ? "f\(index).txt" : "f\(index).bin"
            let bytes = Array(String(repeating: "line \(index) of some text\n", count: 1 + index % 40).utf8)
            let blob = try db.blobs.write(bytes)
            try ahead.setAttachment(name, blob: StoredBlob(key: blob.key, length: blob.length))
            try inSave.setAttachment(name, blob: StoredBlob(key: blob.key, length: blob.length))
        }
        db.workOutCouchMD5s(of: &ahead)
        #expect(ahead.couchMD5sAhead.count == 300 && inSave.couchMD5sAhead.isEmpty)
        #expect(try db.save(ahead).revID == db.save(inSave).revID)
    }

    /// Text bodies' CouchDB MD5s (of their gzip form) worked out in the background, as a mount
    /// does while a burst goes on: only the bodies still wanted, none for a body that is not
    /// there, each the one the save works out itself (the same revision id).
    @Test func textBodiesMD5sWorkedOutInTheBackgroundNameTheRevisionAsTheSaveWould() throws {
        let db = try directory.makeDatabase()
        var blobs: [StoredBlob] = []
        for index in 0..<200 {
            blobs.append(try db.blobs.write(Array(String(repeating: "text \(index) in the background\n", count: 1 + index % 50).utf8)))
        }
        let missing = BlobKey(digest: [UInt8](repeating: 7, count: 20))
        let unwanted = Set(blobs.prefix(20).map(\.key))
        let found = Locked<[BlobKey: [UInt8]]>([:])
        let asked = Locked<Set<BlobKey>>([])
        let background = CouchMD5sInBackground(blobs: db.blobs, wanted: { key in
            asked.withLock { _ = $0.insert(key) }
            return !unwanted.contains(key)
        }, found: { key, md5 in found.withLock { $0[key] = md5 } })
        for blob in blobs { background.add(blob.key) }
        background.add(missing)
        // Every body is asked about once, the missing one last: then nothing is left to find.
        let deadline = Date().addingTimeInterval(60)
        while asked.withLock({ $0.count }) < blobs.count + 1, Date() < deadline { usleep(2_000) }
        #expect(asked.withLock { $0.count } == blobs.count + 1)
        usleep(50_000)
        let md5s = found.withLock { $0 }
        #expect(md5s.count == blobs.count - unwanted.count && md5s[missing] == nil)
        for blob in blobs where !unwanted.contains(blob.key) {
            #expect(md5s[blob.key] == (try CouchAttachmentMD5.md5(of: blob.key, contentType: "text/plain", in: db.blobs)))
        }

        try db.put("ahead", [:])
        try db.put("in-save", [:])
        var ahead = try db.newRevision(of: "ahead"), inSave = try db.newRevision(of: "in-save")
        for (index, blob) in blobs.enumerated() {
            try ahead.setAttachment("f\(index).txt", blob: StoredBlob(key: blob.key, length: blob.length))
            try inSave.setAttachment("f\(index).txt", blob: StoredBlob(key: blob.key, length: blob.length))
            if let md5 = md5s[blob.key] { ahead.useBodyMD5(md5, of: blob.key, compressed: true) }
        }
        #expect(ahead.couchMD5sAhead.count == blobs.count - unwanted.count && inSave.couchMD5sAhead.isEmpty)
        #expect(try db.save(ahead).revID == db.save(inSave).revID)
    }

    /// Bodies stored without their fsync are synced file by file, or many at once by one
    /// `syncfs` when little else waits for the disks; either way a body that is not there
    /// fails the sync (a fold must not save a revision without it).
    @Test func manyBodiesAreSyncedAtOnceWhenLittleElseWaitsAndAMissingOneFailsEitherWay() throws {
        #expect(!BlobStore.syncsWholeFileSystem(bodies: 255, bytesWaiting: 0))
        #expect(BlobStore.syncsWholeFileSystem(bodies: 256, bytesWaiting: 256 * (40 << 10)))
        #expect(!BlobStore.syncsWholeFileSystem(bodies: 256, bytesWaiting: 256 * (40 << 10) + 1))
        #expect(BlobStore.syncsWholeFileSystem(bodies: 10_000, bytesWaiting: 300 << 20))
        #expect(!BlobStore.syncsWholeFileSystem(bodies: 10_000, bytesWaiting: nil), "unknown: file by file")
        #expect(bytesWaitingForDisks() != nil, "/proc/meminfo is read")

        let db = try directory.makeDatabase()
        for count in [3, 300] {
            var keys: [BlobKey] = []
            for index in 0..<count {
                let path = directory.appending("body-\(count)-\(index)")
                try Data("body \(count) \(index)".utf8).write(to: URL(fileURLWithPath: path))
                keys.append(try db.blobs.adopt(fileAt: path, durable: false).key)
            }
            let missing = BlobKey(digest: [UInt8](repeating: UInt8(count % 256), count: 20))
            for waiting: Int64? in [0, nil] {  // one syncfs for 300 bodies, or file by file
                try db.blobs.sync(keys, bytesWaiting: waiting)
                #expect(throws: SofaError.self) { try db.blobs.sync(keys + [missing], bytesWaiting: waiting) }
            }
            try db.blobs.sync(keys)
            #expect(keys.allSatisfy(db.blobs.contains))
        }
    }

    /// `sofa compact` right after a detach frees the body at once when no other process has
    /// the database open, and keeps it (saying why) while one has.
    @Test func compactionAloneFreesFreshOrphansAtOnceAndKeepsThemWhileAnotherProcessHasTheDatabase() throws {
        let db = try directory.makeDatabase()
        let orphan = try db.blobs.write([UInt8](repeating: 7, count: 9_000))
        // Another process with the database open: a sofa process holding it, killed afterwards.
        let holder = try ChildProcess([sofaBinary, "pull", db.path, "http://127.0.0.1:9/never", "--continuous", "--retry-delay", "5"])
        defer { holder.kill(); _ = holder.wait() }
        // Its flock on open.lock (its SQLite locks, POSIX ones, come first and are no sign of it).
        #expect(waitUntil(10) {
            (KernelFile.text("/proc/locks") ?? "").split(separator: "\n").contains {
                $0.contains("FLOCK") && $0.contains(" \(holder.pid) ")
            }
        })
        let shared = try db.compact(alone: true)
        #expect(shared.sharedWithOtherProcesses)
        #expect(shared.recentBlobsKept == 1 && db.blobs.contains(orphan.key))
        holder.kill()
        _ = holder.wait()
        let alone = try db.compact(alone: true)
        #expect(!alone.sharedWithOtherProcesses)
        #expect(alone.blobsDeleted == 1 && alone.recentBlobsKept == 0 && !db.blobs.contains(orphan.key))
    }

    @Test func sweepsTemporaryFilesOfDeadProcesses() throws {
        let db = try directory.makeDatabase()
        let dead = db.blobs.directory + "/tmp/999999-dead.tmp"
        let alive = db.blobs.directory + "/tmp/\(getpid())-alive.tmp"
        FileManager.default.createFile(atPath: dead, contents: Data(count: 1234))
        FileManager.default.createFile(atPath: alive, contents: Data(count: 10))
        let report = try db.compact()
        #expect(report.temporaryBytesFreed == 1234)
        #expect(!FileManager.default.fileExists(atPath: dead))
        #expect(FileManager.default.fileExists(atPath: alive))
    }
}

/// The MD5 a revision id takes for each body (CouchAttachmentMD5): CouchDB's, worked out from
/// the body up to its limit, and beyond it the same on every replica.
@Suite struct RevisionIDBodyTests {
    let directory = TemporaryDirectory()

    func save(_ db: Database, _ id: String, _ bytes: [UInt8], type: String) throws -> RevisionID {
        var draft = try db.newDocument(id)
        let name = "a"
        try draft.setAttachment(name, data: bytes, contentType: type)
        return try db.save(draft).revID
    }

    @Test func aBodyBeyondTheLimitIsNamedTheSameOnEveryReplica() throws {
        let one = try directory.makeDatabase("one.sofa")
        let two = try directory.makeDatabase("two.sofa")
        let text = Array((0..<40_000).map { "line \($0), \($0 * 31 % 977)\n" }.joined().utf8)  // ~0.6 MiB: worked out
        let big = Array((0..<120_000).map { "line \($0), \($0 * 31 % 977)\n" }.joined().utf8)  // ~1.9 MiB: past 1 MiB
        var ids: [RevisionID] = []
        for (index, (bytes, type)) in [(text, "text/plain"), (big, "text/plain"), (big, "application/octet-stream")].enumerated() {
            let id = try save(one, "doc\(index)", bytes, type: type)
            #expect(try save(two, "doc\(index)", bytes, type: type) == id)
            ids.append(id)
        }
        // The type still counts past the limit, and another body is another id.
        #expect(Set(ids).count == 3)
        #expect(try save(one, "other", big.reversed(), type: "text/plain") != ids[1])
    }

    /// A mount's fold works its drafts' new bodies' MD5s out before its transaction
    /// (`workOutCouchMD5s`): the revision id is the one the save works out itself, and one
    /// worked out for the other kind of type (gzipped or not) is not taken.
    @Test func md5sWorkedOutAheadNameTheRevisionAsTheSaveWould() throws {
        let plain = try directory.makeDatabase("plain.sofa")
        let ahead = try directory.makeDatabase("ahead.sofa")
        let cases = [("text/plain", "text/plain"), ("application/octet-stream", "application/octet-stream"),
                     ("application/octet-stream", "text/plain"), ("text/plain", "application/octet-stream")]
        for (index, (type, aheadType)) in cases.enumerated() {
            let bytes = Array("body \(index), which gzip and MD5 both see\n".utf8)  // a body of its own: none known from before
            func attachment(in db: Database, _ type: String) throws -> DocumentStore.Attachment {
                DocumentStore.Attachment(name: "a.txt", contentType: type, blob: try db.blobs.write(bytes), revpos: 0)
            }
            var one = try plain.newDocument("doc\(index)")
            try one.setAttachment(try attachment(in: plain, type))
            var two = try ahead.newDocument("doc\(index)")
            try two.setAttachment(try attachment(in: ahead, aheadType))
            ahead.workOutCouchMD5s(of: &two)
            try two.setAttachment(try attachment(in: ahead, type))
            #expect(try ahead.save(two).revID == plain.save(one).revID, "saved as \(type), worked out as \(aheadType)")
        }
    }
}
