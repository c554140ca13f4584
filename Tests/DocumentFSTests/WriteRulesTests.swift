import DocumentFS
import DocumentModel
import DocumentStore
import Foundation
import FuseKit
import Testing
import TestSupport

/// The mount's rules for files being written, asked of `DocumentFileSystem` directly: no
/// FUSE, no root, each step in the order the kernel sends it (a real SQLite database and
/// blob store underneath). The same behaviours are tried with real programs in `ProgramTests`.
@Suite struct WriteRulesTests {
    let directory = TemporaryDirectory()
    let db: Database
    let fs: DocumentFileSystem
    /// Callers: process ids no process has, so each is its own process.
    let shell: pid_t = 2_000_000_001
    let child: pid_t = 2_000_000_002

    init() throws {
        db = try directory.makeDatabase()
        try db.put("doc", [:], attachments: ["keep.txt": Array("kept".utf8)])
        fs = try DocumentFileSystem(store: db)
    }

    func generation() throws -> Int { try db.currentRevision(of: "doc")?.revID.generation ?? 0 }

    func write(_ handle: UInt64, _ text: String, at offset: Int64 = 0) throws {
        let bytes = Array(text.utf8)
        _ = try bytes.withUnsafeBytes { try fs.write(handle, $0, at: offset) }
    }

    func read(_ handle: UInt64) throws -> String {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = try buffer.withUnsafeMutableBytes { try fs.read(handle, into: $0, at: 0) }
        return String(decoding: buffer[0..<count], as: UTF8.self)
    }

    func errno(_ body: () throws -> Void) -> Int32? {
        do { try body() } catch let error as ErrnoConvertible { return error.errno } catch { return -1 }
        return nil
    }

    @Test func aCreatedEmptyFileCanBeUnlinkedBeforeItsLastCloseAndLeavesNothing() throws {
        let before = try generation()
        let path = "/docs/doc/attachments/empty"
        let file = try fs.create(path, permissions: 0o644, flags: O_WRONLY | O_CREAT | O_TRUNC, caller: shell)
        try fs.flush(file.handle, caller: shell)  // close(2): nothing written, the save waits for release
        #expect(try fs.attributes(of: path).size == 0)
        try fs.unlink(path)  // rm, before the kernel's release arrives
        #expect(errno { _ = try fs.attributes(of: path) } == ENOENT)
        fs.release(file.handle)
        #expect(try generation() == before, "nothing was saved")
        #expect(try document(db, "doc")?.attachment(named: "empty") == nil)
    }

    @Test func aFileBeingWrittenOpensByPathAndReadsWhatWasWritten() throws {
        let path = "/docs/doc/attachments/tmp_pack"
        let writer = try fs.create(path, permissions: 0o644, flags: O_RDWR | O_CREAT, caller: shell)
        try write(writer.handle, "packed bytes")
        let reader = try fs.open(path, flags: O_RDONLY, caller: child)
        #expect(try read(reader.handle) == "packed bytes")
        try write(writer.handle, "!", at: 12)
        #expect(try read(reader.handle) == "packed bytes!")
        fs.release(reader.handle)
        try fs.flush(writer.handle, caller: shell)
        fs.release(writer.handle)
        #expect(try document(db, "doc")?.attachment(named: "tmp_pack")?.length == 13)
    }

    @Test func anInheritedDescriptorClosedByAChildSavesNothingTheOpenersCloseSavesOnce() throws {
        let before = try generation()
        let path = "/docs/doc/attachments/group.txt"
        // { printf abc; cmd; printf ghi; } > group.txt
        let file = try fs.create(path, permissions: 0o644, flags: O_WRONLY | O_CREAT | O_TRUNC, caller: shell)
        try write(file.handle, "abc")
        try write(file.handle, "def", at: 3)
        try fs.flush(file.handle, caller: child)  // cmd exits: its copy closes
        #expect(try generation() == before)
        try write(file.handle, "ghi", at: 6)
        try fs.flush(file.handle, caller: shell)
        fs.release(file.handle)
        #expect(try generation() == before + 1)
        let body = try #require(try document(db, "doc")?.attachment(named: "group.txt"))
        #expect(body.length == 9)
    }

    @Test func twoDescriptorsOfOneFileShareItAndMakeNoConflict() throws {
        let path = "/docs/doc/attachments/w.db-shm"
        let first = try fs.create(path, permissions: 0o644, flags: O_RDWR | O_CREAT, caller: shell)
        let second = try fs.open(path, flags: O_RDWR, caller: child)
        for round in 0..<5 {
            try write(first.handle, "first \(round)")
            try fs.fsync(first.handle)
            try write(second.handle, "second \(round)")
            try fs.fsync(second.handle)
        }
        fs.release(first.handle)
        fs.release(second.handle)
        #expect(try db.revisionTree(of: "doc").conflicts.isEmpty)
    }

    @Test func renamingAFileBeingWrittenMovesItsLaterWritesToo() throws {
        let from = "/docs/doc/attachments/config.lock", to = "/docs/doc/attachments/config"
        let file = try fs.create(from, permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell)
        try write(file.handle, "one")
        try fs.rename(from, to: to, flags: 0)
        try write(file.handle, "two", at: 3)
        try fs.flush(file.handle, caller: shell)
        fs.release(file.handle)
        let document = try #require(try document(db, "doc"))
        #expect(document.attachment(named: "config.lock") == nil)
        #expect(document.attachment(named: "config")?.length == 6)
        #expect(try db.revisionTree(of: "doc").conflicts.isEmpty)
    }

    @Test func anUnlinkedOpenFileIsNotResurrectedByItsLaterWrites() throws {
        let path = "/docs/doc/attachments/keep.txt"
        let file = try fs.open(path, flags: O_WRONLY, caller: shell)
        try fs.unlink(path)
        try write(file.handle, "late")
        try fs.flush(file.handle, caller: shell)
        fs.release(file.handle)
        #expect(try document(db, "doc")?.attachment(named: "keep.txt") == nil)
    }

    @Test func truncateAnswersAtOnceEFBIGPastTheLimitAndNothingIsLeftLocked() throws {
        let path = "/docs/doc/attachments/keep.txt"
        #expect(errno { try fs.truncate(path, to: 1 << 40, handle: nil) } == EFBIG)
        // The file is still usable by path (the hang was a lock kept after that error).
        try fs.truncate(path, to: 2, handle: nil)
        #expect(try document(db, "doc")?.attachment(named: "keep.txt")?.length == 2)
        let grown = try fs.create("/docs/doc/attachments/sparse", permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell)
        try fs.truncate("/docs/doc/attachments/sparse", to: 64 << 20, handle: grown.handle)
        fs.release(grown.handle)
        let sparse = try #require(try document(db, "doc")?.attachment(named: "sparse"))
        #expect(sparse.length == 64 << 20)
        // Holes hash as the zeros they read as.
        #expect(sparse.digest == "sha1-" + Data(MessageDigest.hash(.sha1, [UInt8](repeating: 0, count: 64 << 20))).base64EncodedString())
    }

    func listing(_ path: String) throws -> [String] {
        var names: [String] = []
        try fs.readDirectory(path, after: 0) { entry in
            names.append(entry.name)
            return true
        }
        return names.filter { $0 != "." && $0 != ".." }.sorted()
    }

    @Test func emptyFoldersListAsFoldersAndFollowRmdirAndRenameRules() throws {
        let root = "/docs/doc/attachments"
        try fs.makeDirectory(root + "/a")
        try fs.makeDirectory(root + "/a/b")
        #expect(try listing(root) == ["a", "keep.txt"])
        #expect(try listing(root + "/a") == ["b"])
        #expect(try fs.attributes(of: root + "/a/b").kind == .directory)
        #expect(errno { try fs.removeDirectory(root + "/a") } == ENOTEMPTY)
        // rename(2) of a folder: onto a non-empty folder ENOTEMPTY, onto a file ENOTDIR, onto an empty folder it replaces it.
        try fs.makeDirectory(root + "/c")
        let file = try fs.create(root + "/c/f", permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell)
        try write(file.handle, "f")
        try fs.flush(file.handle, caller: shell)
        fs.release(file.handle)
        #expect(errno { try fs.rename(root + "/a", to: root + "/c", flags: 0) } == ENOTEMPTY)
        #expect(errno { try fs.rename(root + "/a", to: root + "/keep.txt", flags: 0) } == ENOTDIR)
        try fs.makeDirectory(root + "/e")
        try fs.rename(root + "/a", to: root + "/e", flags: 0)
        #expect(try listing(root) == ["c", "e", "keep.txt"])
        #expect(try listing(root + "/e") == ["b"])
        try fs.removeDirectory(root + "/e/b")
        try fs.removeDirectory(root + "/e")
        #expect(try listing(root) == ["c", "keep.txt"])
    }

    /// `gio copy -b`, emacs' first save, vim with backups: the attachment is renamed to a
    /// backup name, then a new file is written at its name. One revision, and none without it.
    @Test func renamingToABackupThenWritingTheNewFileIsOneRevision() throws {
        let before = try generation()
        let root = "/docs/doc/attachments"
        try fs.rename(root + "/keep.txt", to: root + "/keep.txt~", flags: 0)
        #expect(errno { _ = try fs.attributes(of: root + "/keep.txt") } == ENOENT, "gone from the view at once")
        #expect(try listing(root) == ["keep.txt~"])
        let file = try fs.create(root + "/keep.txt", permissions: 0o644, flags: O_WRONLY | O_CREAT | O_EXCL, caller: shell)
        try write(file.handle, "new text")
        try fs.flush(file.handle, caller: shell)
        fs.release(file.handle)
        #expect(try generation() == before + 1)
        let tree = try db.revisionTree(of: "doc")
        #expect(tree.conflicts.isEmpty)
        #expect(try document(db, "doc")?.attachment(named: "keep.txt")?.length == 8)
        #expect(try listing(root) == ["keep.txt", "keep.txt~"])
        Thread.sleep(forTimeInterval: Tuning.setAsideGrace + 0.5)
        #expect(try generation() == before + 1, "nothing more is saved when the grace ends")
    }

    @Test func anAttachmentRenamedToAScratchNameAloneIsRemovedWhenTheGraceEnds() throws {
        let before = try generation()
        let root = "/docs/doc/attachments"
        try fs.rename(root + "/keep.txt", to: root + "/keep.txt~", flags: 0)
        #expect(try generation() == before, "not yet")
        #expect(try waitUntil(Tuning.setAsideGrace + 5) { try generation() == before + 1 })
        #expect(try document(db, "doc")?.attachment(named: "keep.txt") == nil)
        #expect(try listing(root) == ["keep.txt~"])
        // Putting the backup back saves the attachment again.
        try fs.rename(root + "/keep.txt~", to: root + "/keep.txt", flags: 0)
        #expect(try document(db, "doc")?.attachment(named: "keep.txt")?.length == 4)
    }

    @Test func aBackupPutBackAtOnceSavesNothingAndAChangeByAnotherWriterIsNotRemoved() throws {
        let before = try generation()
        let root = "/docs/doc/attachments"
        try fs.rename(root + "/keep.txt", to: root + "/keep.txt~", flags: 0)
        try fs.rename(root + "/keep.txt~", to: root + "/keep.txt", flags: 0)
        #expect(try generation() == before, "the same bytes at the same name: no revision")
        fs.saveSetAsideRemovals()
        #expect(try generation() == before)

        // Set aside, then changed by another process (the CLI) before the grace ends: its body stays.
        try fs.rename(root + "/keep.txt", to: root + "/keep.txt~", flags: 0)
        try db.put("doc", [:], attachments: ["keep.txt": Array("from the CLI".utf8)])
        fs.documentChanged("doc")
        fs.saveSetAsideRemovals()
        #expect(try document(db, "doc")?.attachment(named: "keep.txt")?.length == 12)
    }

    /// A folder never vanishes for a moment while files come and go in it (a stat of it
    /// between a save and the cache's refresh answered ENOENT: unlink then failed in the kernel).
    @Test func aFolderStaysVisibleWhileFilesAreSavedAndRemovedInIt() throws {
        let folder = "/docs/doc/attachments/d"
        try fs.makeDirectory(folder)
        let done = Locked(false)
        let misses = Locked(0)
        let watcher = Thread { [fs] in
            while !done.withLock({ $0 }) {
                if (try? fs.attributes(of: folder)) == nil { misses.withLock { $0 += 1 } }
            }
        }
        watcher.start()
        for index in 0..<150 {
            let path = folder + "/e\(index)"
            let file = try fs.create(path, permissions: 0o644, flags: O_WRONLY | O_CREAT | O_TRUNC, caller: shell)
            try fs.flush(file.handle, caller: shell)
            fs.release(file.handle)
            try fs.unlink(path)
        }
        done.withLock { $0 = true }
        #expect(misses.withLock { $0 } == 0, "the folder was missing \(misses.withLock { $0 }) times")
        #expect(try listing(folder).isEmpty)
    }

    /// The mount's own saves are known as its own however soon the change watcher looks: it
    /// wakes at their commit. Noted after the save had returned, a save into a document of
    /// thousands of files (whose cached form takes a while to drop) was taken for another
    /// writer's change now and then, and the mount dropped and invalidated all it had of the
    /// document. Here a watcher's look runs at each commit, while files are saved one by one
    /// and in bursts.
    @Test func theMountsOwnSavesAreItsOwnWhenTheWatcherLooksAtTheirCommit() throws {
        var attachments: [String: [UInt8]] = [:]
        for index in 0..<3_000 { attachments["f\(index)"] = Array("\(index)".utf8) }
        try db.put("big", [:], attachments: attachments)
        let stream = db.changeStream
        let done = Locked(false)
        let taken = Locked<[String]>([]), foreign = Locked<[String]>([])
        let start = (try db.lastSequence, stream.lastDocumentChange)
        let watcher = Thread { [fs, db] in
            var (sequence, position) = start
            while !done.withLock({ $0 }) {
                position = stream.waitForDocuments(after: position, until: Date().addingTimeInterval(0.2))
                for change in (try? db.changes(since: sequence)) ?? [] {
                    sequence = change.sequence
                    let own = fs.madeHere(change)
                    (own ? taken : foreign).withLock { $0.append("\(change.docID) \(change.revID)") }
                }
            }
        }
        watcher.start()
        for index in 0..<40 {
            _ = try fs.attributes(of: "/docs/big/attachments/f\(index)")  // the document cached, to be dropped by the save
            let file = try fs.create("/docs/big/attachments/new\(index)", permissions: 0o644, flags: O_WRONLY | O_CREAT | O_TRUNC, caller: shell)
            try write(file.handle, "new \(index)")
            try fs.flush(file.handle, caller: shell)
            fs.release(file.handle)
            if index % 10 == 9 { fs.foldAllBursts() }
        }
        fs.foldAllBursts()
        let last = try db.currentRevision(of: "big")!.revID
        #expect(waitUntil(30) { taken.withLock { $0.contains("big \(last)") } || !foreign.withLock { $0.isEmpty } })
        done.withLock { $0 = true }
        #expect(foreign.withLock { $0 }.isEmpty, "own saves taken for another writer's: \(foreign.withLock { $0 })")
        #expect(taken.withLock { $0.count } >= 4, "a save per burst at least")
    }
}
