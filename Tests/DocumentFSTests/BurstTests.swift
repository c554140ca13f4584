import DocumentModel
@testable import DocumentFS
import DocumentStore
import MountTables
import Foundation
import Testing
import TestSupport

/// Folders of many files written into one document through a real mount: few revisions,
/// storage that grows with the files, nothing lost to a kill.
@Suite struct BurstTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        try db.put("doc", ["title": "files"], attachments: ["first.txt": Array("first".utf8)])
    }

    /// Rows and bytes the database holds for attachments, counted in SQLite.
    func storedRows() throws -> (rows: Int, bytes: Int) {
        let rows = try shell("python3 -c \"import sqlite3; c = sqlite3.connect('\(db.path)/db.sqlite3'); " +
                             "print(c.execute('SELECT COUNT(*) FROM rev_attachments').fetchone()[0]); " +
                             "print(c.execute('SELECT COALESCE(SUM(LENGTH(body)), 0) FROM revs').fetchone()[0])\"").stdout
            .split(separator: "\n").compactMap { Int($0) }
        return (rows[0], rows[1])
    }

    /// A tree of `count` small files in `folders` folders under `root`.
    func makeTree(_ root: String, count: Int, folders: Int = 10, from start: Int = 0) throws {
        for i in start..<start + count {
            let folder = "\(root)/d\(i % folders)"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try Data("file \(i)\n".utf8).write(to: URL(fileURLWithPath: "\(folder)/f\(i).txt"))
        }
    }

    @Test func twoThousandFilesMakeFewRevisionsAndStorageGrowsLinearly() throws {
        let mount = try MountedDatabase(db.path)
        let first = directory.appending("first"), second = directory.appending("second")
        try makeTree(first, count: 1_000)
        try makeTree(second, count: 1_000, from: 1_000)
        try sh("cp -r \(first)/. \(mount.path("docs/doc/attachments/"))")
        // Every file is there through the mount at once, before any fold.
        #expect(try sh("find \(mount.path("docs/doc/attachments")) -type f | wc -l").trimmingCharacters(in: .whitespacesAndNewlines) == "1001")
        #expect(try sh("cat \(mount.path("docs/doc/attachments/d7/f997.txt"))") == "file 997\n")
        try settled(db)
        let afterFirst = try storedRows()
        try sh("cp -r \(second)/. \(mount.path("docs/doc/attachments/"))")
        try settled(db)
        let afterSecond = try storedRows()
        let revision = try #require(try db.document(withID: "doc"))
        #expect(revision.attachments.count == 2_001)
        #expect(try db.blobs.contents(of: try #require(revision.attachment(named: "d3/f1993.txt")?.blobKey)) == Array("file 1993\n".utf8))
        // One revision per burst window, not one per file.
        #expect(revision.revID.generation < 100, "\(revision.revID)")
        // Rows: the leaf's list, plus at most the history allowance; twice the files, about twice the rows.
        #expect(afterSecond.rows <= 2_001 + Tuning.historyAttachmentRows + 2_001, "\(afterSecond)")
        #expect(Double(afterSecond.rows) <= 2.5 * Double(afterFirst.rows), "first \(afterFirst), second \(afterSecond)")
        mount.unmount()
        // What the mount showed is what the database holds after it is gone.
        #expect(try db.document(withID: "doc")?.attachments.count == 2_001)
        #expect(try db.stagedAttachments().isEmpty)
        // The mount moved its write-ahead log into the database file as it ended: no log of
        // several MB left beside it (it was, and the benchmark counted it as the database's size).
        var log = stat()
        let logSize = stat(db.path + "/db.sqlite3-wal", &log) == 0 ? Int(log.st_size) : 0
        #expect(logSize == 0, "db.sqlite3-wal is \(logSize) bytes after the unmount")
    }

    /// Text files written in a burst have their CouchDB MD5s (of their gzip form, level 8)
    /// worked out in the background while the burst goes on: the revision keeps for each the
    /// MD5 zlib gives here, worked out again by Python from the files copied.
    @Test func aBurstOfTextFilesKeepsCouchDBsMD5OfEachFilesGzipForm() throws {
        let mount = try MountedDatabase(db.path)
        let tree = directory.appending("texts")
        try makeTree(tree, count: 600)
        try sh("cp -r \(tree)/. \(mount.path("docs/doc/attachments/"))")
        try settled(db)
        let revision = try #require(try db.document(withID: "doc"))
        #expect(revision.attachments.count == 601)
        let check = try shell("""
            python3 -c "
            import sqlite3, zlib, hashlib, os
            c = sqlite3.connect('\(db.path)/db.sqlite3')
            rows = c.execute('SELECT name, couch_md5 FROM rev_attachments WHERE rev_id = ? AND name LIKE \\'d%\\'', ('\(revision.revID)',)).fetchall()
            def gz(path):
                z = zlib.compressobj(8, zlib.DEFLATED, 31)
                return hashlib.md5(z.compress(open(path, 'rb').read()) + z.flush()).digest()
            print(len(rows), sum(1 for name, md5 in rows if md5 == gz(os.path.join('\(tree)', name))))
            "
            """)
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "600 600", "rows, and rows with the right MD5: \(check.stdout) \(check.stderr)")
        #expect(mount.unmount().succeeded)
    }

    @Test func rsyncRenamingItsTemporaryFilesMakesFewRevisionsAndLeavesNoTemporaryName() throws {
        let mount = try MountedDatabase(db.path)
        let tree = directory.appending("tree")
        try makeTree(tree, count: 500)
        // rsync writes each file as .NAME.XXXXXX, gives it its time, and renames it.
        try sh("rsync -a \(tree)/ \(mount.path("docs/doc/attachments/"))")
        #expect(try sh("rsync -ai \(tree)/ \(mount.path("docs/doc/attachments/"))").isEmpty)
        try settled(db)
        let revision = try #require(try db.document(withID: "doc"))
        #expect(revision.attachments.count == 501)
        #expect(!revision.attachments.contains { $0.name.split(separator: "/").last?.hasPrefix(".") == true }, "a temporary name was saved")
        #expect(revision.revID.generation < 50, "one revision per file renamed: \(revision.revID)")
        #expect(try db.blobs.contents(of: try #require(revision.attachment(named: "d9/f499.txt")?.blobKey)) == Array("file 499\n".utf8))
        // The temporary files' times went with their names.
        let given = try db.localAttributes(ofDocument: "doc")
        #expect(given.count >= 500 && !given.keys.contains { $0.contains("/.") }, "\(given.count) rows")
        #expect(mount.unmount().succeeded)
        #expect(try db.stagedAttachments().isEmpty)
    }

    @Test func aKilledMountLosesNoClosedFileOfABurst() throws {
        let tree = directory.appending("tree")
        try makeTree(tree, count: 300)
        do {
            let mount = try MountedDatabase(db.path)
            try sh("cd \(tree) && tar cf - . | tar xf - -C \(mount.path("docs/doc/attachments"))")
            // Killed right after the last close: most files are staged, not yet a revision.
            #expect(try !db.stagedAttachments().isEmpty, "the files were folded before the kill; the test proves nothing")
            let pid = try #require(Int32(try sh("pgrep -f 'sofa mount \(db.path) \(mount.mountPoint)'").split(separator: "\n").first ?? ""))
            kill(pid, SIGKILL)
            _ = mount.unmount()
        }
        // The next mount takes them in when it starts.
        let again = try MountedDatabase(db.path)
        let revision = try #require(try db.document(withID: "doc"))
        #expect(revision.attachments.count == 301)
        #expect(try db.stagedAttachments().isEmpty)
        #expect(try sh("cat \(again.path("docs/doc/attachments/d5/f295.txt"))") == "file 295\n")
    }

    /// A kill leaves the mount's staging log: the next mount takes in every document's files,
    /// with the times `tar` gave them after their close and the names rsync renamed them to.
    @Test func aKilledMountsFilesInEveryDocumentAreSavedWithTheirTimesAtTheNextMount() throws {
        try db.put("other", [:])
        let tree = directory.appending("tree")
        try makeTree(tree, count: 200)
        try sh("touch -d @981173106 \(tree)/d3/f13.txt")
        do {
            let mount = try MountedDatabase(db.path)
            let pid = try #require(Int32(try sh("pgrep -f 'sofa mount \(db.path) \(mount.mountPoint)'").split(separator: "\n").first ?? ""))
            try sh("cd \(tree) && tar cf - . | tar xf - -C \(mount.path("docs/doc/attachments"))")
            try sh("rsync -a \(tree)/ \(mount.path("docs/other/attachments/"))")
            // The last files of both documents, a time given to each after its close, rsync's
            // renames, and the kill in the same breath: staged in both, not folded yet.
            var last = ""
            for i in 1...3 {
                for id in ["doc", "other"] {
                    let file = mount.path("docs/\(id)/attachments/last\(i).txt")
                    last += "printf 'last \(i)' > \(file) && touch -d @981173106 \(file) && "
                }
            }
            try sh(last + "mkdir \(mount.path("docs/other/attachments/late")) && rsync -a \(tree)/d3/f13.txt \(mount.path("docs/other/attachments/late/")) && kill -9 \(pid)")
            _ = mount.unmount()
        }
        // What the dead mount's log holds, read by another process.
        let staged = try db.stagedAttachments()
        #expect(Set(staged.map(\.docID)) == ["doc", "other"], "\(staged.map(\.name)): the files were folded before the kill; the test proves nothing")
        #expect(staged.allSatisfy { $0.log != nil }, "staged in the mount's log")
        #expect(staged.contains { $0.docID == "other" && $0.name == "late/f13.txt" }, "rsync's rename is in the log")

        let again = try MountedDatabase(db.path)
        for id in ["doc", "other"] {
            let revision = try #require(try db.document(withID: id))
            #expect(revision.attachmentNames.filter { $0.hasPrefix("d") }.count == 200, "\(id): \(revision.attachments.count)")
            #expect(!revision.attachmentNames.contains { $0.contains("/.") }, "\(id): a temporary name was saved")
            #expect(try sh("stat -c %Y \(again.path("docs/\(id)/attachments/d3/f13.txt"))") == "981173106\n", "\(id): its time")
            #expect(try sh("cat \(again.path("docs/\(id)/attachments/last3.txt"))") == "last 3")
            #expect(try sh("stat -c %Y \(again.path("docs/\(id)/attachments/last3.txt"))") == "981173106\n", "\(id): the time given after the close")
        }
        #expect(try sh("stat -c %Y \(again.path("docs/other/attachments/late/f13.txt"))") == "981173106\n")
        #expect(try db.stagedAttachments().isEmpty)
        #expect(!again.log.contains("not saved yet"), "\(again.log)")
        #expect(try StagingLogFiles.paths(in: db.stagingLogDirectory).isEmpty, "the stopped mount's log was taken in")
        #expect(again.unmount().succeeded)
    }

    @Test func aStagedFileWhoseBodyNeverReachedTheDiskIsReportedAndTheOthersAreSaved() throws {
        let tree = directory.appending("tree")
        try makeTree(tree, count: 100)
        do {
            let mount = try MountedDatabase(db.path)
            try sh("cp -r \(tree)/. \(mount.path("docs/doc/attachments/"))")
            #expect(try !db.stagedAttachments().isEmpty, "the files were folded before the kill; the test proves nothing")
            let pid = try #require(Int32(try sh("pgrep -f 'sofa mount \(db.path) \(mount.mountPoint)'").split(separator: "\n").first ?? ""))
            kill(pid, SIGKILL)
            _ = mount.unmount()
        }
        // As a power loss can leave it: the row of a staged file is on disk, its body is not (one
        // emptied, one gone).
        let staged = try db.stagedAttachments()
        let emptied = try #require(staged.first), gone = try #require(staged.last)
        try sh(": > '\(db.blobs.path(for: try #require(emptied.attachment.blobKey)))'")
        try sh("rm -f '\(db.blobs.path(for: try #require(gone.attachment.blobKey)))'")
        let again = try MountedDatabase(db.path)
        let revision = try #require(try db.document(withID: "doc"))
        let names = Set(revision.attachmentNames)
        #expect(!names.contains(emptied.name) && !names.contains(gone.name), "a body that is not there was saved")
        #expect(revision.attachments.count == 101 - 2, "the others are saved")
        #expect(try db.stagedAttachments().isEmpty)
        #expect(again.log.contains("\(emptied.name): written before the mount stopped, but its bytes did not reach the disk"))
        #expect(again.unmount().succeeded)
    }

    @Test func anEditorSaveDuringABulkWriteIsOneRevision() throws {
        let mount = try MountedDatabase(db.path)
        let tree = directory.appending("tree")
        try makeTree(tree, count: 200)
        try sh("cp -r \(tree)/. \(mount.path("docs/doc/attachments/"))")
        let before = try #require(try db.currentRevision(of: "doc")).revID.generation
        // The save takes in the staged files: one revision, at its close.
        try sh("printf '{\"title\": \"edited\"}' > \(mount.path("docs/doc/properties.json"))")
        let saved = try #require(try db.document(withID: "doc"))
        #expect(saved.revID.generation == before + 1)
        #expect(saved.properties == ["title": "edited"])
        #expect(saved.attachments.count == 201)
        #expect(try db.stagedAttachments().isEmpty)
    }

    @Test func aFileChangedElsewhereWhileStagedBecomesAConflictNotALoss() throws {
        let mount = try MountedDatabase(db.path)
        // One shell, so that b.txt closes within the window of a.txt's save: staged.
        try sh("printf one > \(mount.path("docs/doc/attachments/a.txt")) && printf two > \(mount.path("docs/doc/attachments/b.txt"))")
        #expect(try db.stagedAttachments().map(\.name) == ["b.txt"])
        // Another process changes b.txt before the fold.
        var draft = try db.newRevision(of: "doc")
        try draft.setAttachment("b.txt", data: Array("theirs".utf8))
        try db.save(draft)
        try settled(db)
        let tree = try db.revisionTree(of: "doc")
        let leaves = try tree.leaves.map { try db.revision($0.id, of: "doc") }
        let bodies = try Set(leaves.compactMap { $0.attachment(named: "b.txt")?.blobKey }.map { try db.blobs.contents(of: $0) })
        #expect(bodies == [Array("two".utf8), Array("theirs".utf8)], "both versions are kept, one as a conflict")
        _ = mount
    }

    /// What `git` does with its index while files keep coming (a checkout, a status beside a
    /// copy): create index.lock exclusively, write it, close it, give it a type (`user.mime_type`),
    /// then rename it onto index or unlink it, 400 times, while another writer keeps the
    /// document's burst going, so that folds come between a close and what follows. Each call
    /// succeeds: the unlink (or the setxattr) of a lock folded meanwhile answered ENOENT, and the
    /// next exclusive create EEXIST (git:
    /// "Unable to create index.lock: File exists"). Run again after a fold, nothing is left.
    @Test func aLockFileCreatedAndRemovedDuringFoldsAlwaysGoes() throws {
        let mount = try MountedDatabase(db.path)
        let folder = mount.path("docs/doc/attachments")
        let before = try generation(db, "doc")
        let script = """
            import os, threading, time
            d = '\(folder)'; stop = False; errors = []
            def writer():
                i = 0
                while not stop:
                    with open(os.path.join(d, 'w%d.bin' % (i % 200)), 'wb') as f: f.write(os.urandom(4096))
                    i += 1
            t = threading.Thread(target=writer); t.start()
            lock = os.path.join(d, 'index.lock')
            for n in range(400):
                try:
                    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                    os.write(fd, os.urandom(45000)); os.close(fd)
                    os.setxattr(lock, 'user.mime_type', b'application/x-lock')
                except OSError as e:
                    errors.append(('create', n, e.errno)); continue
                try:
                    if n % 2: os.rename(lock, os.path.join(d, 'index'))
                    else: os.unlink(lock)
                except OSError as e:
                    errors.append(('rename' if n % 2 else 'unlink', n, e.errno))
                time.sleep(0.01)
            stop = True; t.join()
            print(len(errors), errors[:5])
            """
        let output = try sh("python3 - <<'EOF'\n\(script)\nEOF").trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(output == "0 []", "(calls that failed: count, first ones (call, turn, errno)) \(output); the mount's log ends: \(mount.log.suffix(4000))")
        try settled(db)
        #expect(try generation(db, "doc") >= before + 3, "the writer kept folds coming while the lock came and went")
        let revision = try #require(try db.document(withID: "doc"))
        #expect(revision.attachment(named: "index.lock") == nil && revision.attachment(named: "index") != nil)
        #expect(!FileManager.default.fileExists(atPath: mount.path("docs/doc/attachments/index.lock")))
    }
}

/// A folder copied into a document folder made a moment before with mkdir.
@Suite struct NewDocumentFolderTests {
    let directory = TemporaryDirectory()

    @Test func cpDashRIntoANewDocumentFolderCreatesTheDocument() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        let mount = try MountedDatabase(db.path)
        let tree = directory.appending("tree")
        for i in 0..<30 {
            try FileManager.default.createDirectory(atPath: "\(tree)/d\(i % 3)/e", withIntermediateDirectories: true)
            try Data("\(i)".utf8).write(to: URL(fileURLWithPath: "\(tree)/d\(i % 3)/e/f\(i)"))
        }
        // (This failed with "cannot create directory …/attachments/./d0": the folder made in a
        // document not saved yet did not show.)
        try sh("mkdir \(mount.path("docs/new")) && cp -r \(tree)/. \(mount.path("docs/new/attachments/"))")
        let saved = try #require(try document(db, "new"))
        #expect(saved.attachments.count == 30)
        #expect(saved.attachment(named: "d2/e/f29") != nil)
    }
}

/// Documents copied in as folders (`DOC/attachments/…`), as `cp -r` and `tar x` make them.
@Suite struct DocumentFoldersCopiedInTests {
    let directory = TemporaryDirectory()

    @Test func tarOfDocumentFoldersMakesTheDocuments() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        let mount = try MountedDatabase(db.path)
        let tree = directory.appending("tree")
        for i in 0..<20 {
            try FileManager.default.createDirectory(atPath: "\(tree)/doc-\(i % 5)/attachments/d\(i % 2)", withIntermediateDirectories: true)
            try Data("\(i)".utf8).write(to: URL(fileURLWithPath: "\(tree)/doc-\(i % 5)/attachments/d\(i % 2)/f\(i)"))
        }
        // tar makes doc-0, then doc-0/attachments (which is there: it goes on), then the files.
        try sh("tar cf \(directory.appending("d.tar")) -C \(tree) . && tar xf \(directory.appending("d.tar")) -C \(mount.path("docs"))")
        try sh("tar cf \(directory.appending("t.tar")) -C \(tree) . && mkdir \(mount.path("docs/x")) && tar xf \(directory.appending("t.tar")) -C \(mount.path("docs/x/attachments"))")
        for i in 0..<5 { #expect(try document(db, "doc-\(i)")?.attachments.count == 4, "doc-\(i)") }
        #expect(try document(db, "x")?.attachment(named: "doc-3/attachments/d1/f13") != nil)
    }

    /// `cp -r` makes each folder it copies without looking first (it made their parent), so
    /// `mkdir DOC/attachments` must not fail in a document folder it just made: the first
    /// thing a user tries to copy a document (it failed with "File exists").
    @Test func cpROfADocumentFolderCopiesTheDocument() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        try db.put("a", ["title": "first"], attachments: ["note.txt": Array("note".utf8), "d/e/deep.bin": [1, 2, 3]])
        let mount = try MountedDatabase(db.path)
        try sh("cp -r \(mount.path("docs/a")) \(mount.path("docs/b"))")
        // And a copy taken out and brought back in under another name.
        let outside = directory.appending("outside")
        try sh("cp -r \(mount.path("docs/a")) \(outside) && cp -r \(outside) \(mount.path("docs/c"))")
        // mv from another file system copies (rename answers EXDEV), then removes.
        try sh("mv \(outside) \(mount.path("docs/d"))")
        #expect(!FileManager.default.fileExists(atPath: outside))
        for id in ["b", "c", "d"] {
            let copy = try #require(try document(db, id), "\(id) was not made")
            #expect(copy.properties["title"] == "first", "\(id)")
            #expect(copy.attachmentNames.sorted() == ["d/e/deep.bin", "note.txt"], "\(id)")
            #expect(try sh("cat \(mount.path("docs/\(id)/attachments/note.txt"))") == "note", "\(id)")
        }
        // A folder that holds something is there: mkdir says so, as on any disk.
        #expect(!(try shell("mkdir \(mount.path("docs/a/attachments"))")).succeeded)
    }

    /// `cp -r` of a document folder whose source lists attachments/ first (ext4 often does): the
    /// attachments make the document, then cp creates properties.json with O_EXCL (it made the
    /// folder). The `{}` standing there failed that with "File exists", and the properties
    /// were not copied. Done here step by step, as cp does it, so the order is certain.
    @Test func propertiesCreatedExclusivelyAfterTheAttachmentsOfANewDocument() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        let mount = try MountedDatabase(db.path)
        let doc = mount.path("docs/e")
        // bash's noclobber (`set -C`) opens with O_CREAT|O_EXCL, as cp does in a folder it made.
        try sh("mkdir \(doc) && for i in 1 2 3; do echo $i > \(doc)/attachments/f$i.txt; done && set -C && echo '{\"title\": \"e\"}' > \(doc)/properties.json")
        let copied = try waitUntil(60) { try document(db, "e")?.properties["title"] == "e" && document(db, "e")?.attachments.count == 3 }
        #expect(copied, "\(String(describing: try? document(db, "e")))")
        // Properties that hold something are there: O_EXCL fails, as on any disk, and they stay.
        #expect(!(try shell("set -C; echo '{}' > \(doc)/properties.json")).succeeded)
        #expect(try document(db, "e")?.properties["title"] == "e")
        // A document its attachments alone made shows `{}` once quiet.
        try sh("mkdir \(mount.path("docs/f")) && echo x > \(mount.path("docs/f/attachments/x"))")
        let shown = try waitUntil(60) {
            try shell("cat \(mount.path("docs/f/properties.json"))").stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "{}"
        }
        #expect(shown, "docs/f/properties.json never came")
        // `rm -r` of one still filling removes it (its empty properties go with the folder).
        try sh("mkdir \(mount.path("docs/g")) && echo x > \(mount.path("docs/g/attachments/x")) && echo y > \(mount.path("docs/g/attachments/y"))"
               + " && rm -r \(mount.path("docs/g"))")
        #expect(try waitUntil(60) { try db.currentRevision(of: "g")?.deleted ?? true }, "docs/g was removed")
        #expect(!FileManager.default.fileExists(atPath: mount.path("docs/g")))
    }
}

/// When a burst is folded: the rule of `Bursts.swift`, on the numbers of `Tuning`.
@Suite struct BurstDueTests {
    let directory = TemporaryDirectory()

    @Test func aLongBurstsFoldsAreSpacedByWhatTheLastTookWithinABound() throws {
        let db = try directory.makeDatabase()
        var burst = DocumentFileSystem.Burst(base: try db.put("doc", [:]), first: 1_000, last: 1_000)
        #expect(burst.due == 1_000 + Tuning.burstQuietWindow, "quiet: folded after the window")
        burst.last = 1_001.9  // files keep coming
        #expect(burst.due == 1_000 + Tuning.burstLongestDelay, "a fast fold (none yet): the longest delay")
        burst.lastFold = 0.05
        #expect(burst.due == 1_000 + Tuning.burstLongestDelay)
        burst.last = 1_020
        burst.lastFold = 0.8  // a large document, or a loaded machine
        #expect(burst.due == 1_000 + Tuning.burstFoldSpacing * 0.8)
        burst.last = 1_100
        burst.lastFold = 60
        #expect(burst.due == 1_000 + Tuning.burstLongestSpacedDelay, "bounded, however slow the folds")
        burst.last = 1_000.2
        #expect(burst.due == 1_000.2 + Tuning.burstQuietWindow, "quiet again: folded after the window whatever the last fold took")
    }
}
