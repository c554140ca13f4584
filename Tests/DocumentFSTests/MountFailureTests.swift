import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// The disk under a mounted database fills up (a small tmpfs): writers get ENOSPC,
/// nothing half-written is saved, and the mount goes on working once there is room.
@Suite struct MountFailureTests {
    let directory = TemporaryDirectory()

    @Test func fullDiskFailsTheWriteAndSavesNothing() throws {
        #expect(isRoot, "this test mounts a tmpfs and needs root")
        let small = directory.appending("small")
        try FileManager.default.createDirectory(atPath: small, withIntermediateDirectories: false)
        let tmpfs = try shell("mount -t tmpfs -o size=4m tmpfs \(small)")
        #expect(tmpfs.succeeded, "\(tmpfs.stderr)")
        defer { _ = try? shell("umount -l \(small)") }
        let db = try Database.create(at: small + "/full.sofa")
        let before = try db.put("doc", ["n": 1], attachments: ["keep.txt": Array("kept\n".utf8)])
        let source = directory.appending("big.bin")
        try writePatternFile(source, count: 8 << 20)

        let mount = try MountedDatabase(db.path)
        let folder = mount.path("docs/doc/attachments")
        // cp streams into the blob store until the disk is full; its write fails.
        let copy = try shell("cp \(source) \(folder)/big.bin")
        #expect(!copy.succeeded && copy.stderr.contains("No space left on device"), "\(copy.stderr)")
        #expect(try document(db, "doc") == before, "no revision from a body that did not fit")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory + "/tmp")
        #expect(leftovers.isEmpty, "the half body is gone: \(leftovers)")
        let blobs = try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).filter { $0.hasSuffix(".blob") }
        #expect(blobs.count == 1, "no blob of the half body: \(blobs)")
        #expect(!FileManager.default.fileExists(atPath: "\(folder)/big.bin"))

        // A writer that carries on after ENOSPC must not save a body with a gap in it.
        let retry = try shell("""
            python3 -c '
            import os, sys
            fd = os.open("\(folder)/retry.bin", os.O_WRONLY | os.O_CREAT)
            try:
                for i in range(64): os.write(fd, b"x" * 131072)
                sys.exit("the disk never filled")
            except OSError as e: print("full:", e.strerror)
            try: os.write(fd, b"tail"); print("wrote after the error")
            except OSError as e: print("later write:", e.strerror)
            try: os.close(fd); print("closed")
            except OSError as e: print("close:", e.strerror)
            '
            """)
        #expect(retry.stdout == "full: No space left on device\nlater write: No space left on device\nclose: No space left on device\n",
                "\(retry.stdout) \(retry.stderr)")
        #expect(try document(db, "doc") == before)
        // Once there is room again, work goes on.
        let echo = try shell("echo fits > \(folder)/small.txt")
        let state = try sh("df -k \(small); ls -la \(db.path) \(db.path)/attachments/tmp")
        #expect(echo.succeeded, "\(echo.stderr) \(state)\n\(mount.log)")
        #expect(try document(db, "doc")?.attachmentNames == ["keep.txt", "small.txt"])
        #expect(try sh("cat \(folder)/keep.txt") == "kept\n")
        #expect(mount.unmount().succeeded)
    }
}

extension MountFailureTests {
    /// A stored body that cannot be read (here its file replaced by a folder, which opens but is
    /// not the body) is a disk error: the read fails with EIO and the log says why. It used to
    /// read as "not here" (`try?`), answered "No data available" as for a body never downloaded,
    /// or sent to the remote for bytes this machine has.
    @Test func aStoredBodyThatCannotBeReadIsAnIOErrorNotAnAbsentBody() throws {
        let db = try directory.makeDatabase()
        let revision = try db.put("doc", ["n": 1], attachments: ["note.txt": Array("hello\n".utf8)])
        let key = try #require(revision.attachment(named: "note.txt")?.blobKey)
        let blob = db.blobs.path(for: key)
        try FileManager.default.removeItem(atPath: blob)
        try FileManager.default.createDirectory(atPath: blob, withIntermediateDirectories: false)
        let mount = try MountedDatabase(db.path)
        let read = try shell("cat \(mount.path("docs/doc/attachments/note.txt"))")
        #expect(!read.succeeded && read.stderr.contains("Input/output error"), "\(read.stderr)")
        let log = mount.unmount().stderr
        #expect(log.contains(key.hex), "the log names the blob: \(log.suffix(2000))")
    }
}

extension MountFailureTests {
    /// A database that fails to read (here a table taken away under the running mount, as a
    /// damaged file or an I/O error would) is a failure: every path that reads it fails with
    /// EIO and says why, in the log and the status file. It must never read as "no such
    /// document" (ENOENT), which a program would take for a deletion and act on. When the
    /// table is back, everything is there.
    @Test func aDatabaseThatCannotBeReadIsAnIOErrorNeverAbsence() throws {
        let db = try directory.makeDatabase()
        try db.put("a", ["n": 1], attachments: ["note.txt": Array("hello\n".utf8)])
        try db.put("b", ["n": 2])
        let mount = try MountedDatabase(db.path)
        let file = "\(db.path)/db.sqlite3"
        #expect(try shell("sqlite3 '\(file)' 'ALTER TABLE revs RENAME TO revs_away'").succeeded)
        for command in ["cat '\(mount.path("docs/a/properties.json"))'", "stat '\(mount.path("docs/b"))'",
                        "ls '\(mount.path("docs/a/attachments"))'", "ls '\(mount.path("docs"))'",
                        "echo '{}' > '\(mount.path("docs/b/properties.json"))'"] {
            let result = try shell(command)
            #expect(!result.succeeded, "\(command)")
            #expect(result.stderr.contains("Input/output error"), "\(command): \(result.stderr)")
            #expect(!result.stderr.contains("No such file"), "\(command): \(result.stderr)")
        }
        let status = try JSONParser.parse(Array(try Data(contentsOf: URL(fileURLWithPath: mount.path(".sofa/status.json")))))
        let reasons = (status["recent_errors"]?.arrayValue ?? []).compactMap { $0["reason"]?.stringValue }
        #expect(reasons.contains { $0.contains("no such table") }, "\(reasons)")
        #expect(try shell("sqlite3 '\(file)' 'ALTER TABLE revs_away RENAME TO revs'").succeeded)
        #expect(try sh("cat '\(mount.path("docs/a/attachments/note.txt"))'") == "hello\n")
        #expect(try sh("ls '\(mount.path("docs"))'") == "a\nb\n")
        #expect(try document(db, "b")?.properties == ["n": 2], "the refused write changed nothing")
    }
}

extension MountFailureTests {
    /// The kernel holds a document folder by its number (the document's storage key), and finds
    /// its path again from it for every call made inside it: a shell's working folder, an open
    /// folder. A database that cannot tell the path answers EIO with its reason, not "No such
    /// file", which a program (rsync --delete, a sync client) would take for a removal.
    @Test func aFolderHeldByItsNumberIsAnIOErrorWhenTheDatabaseCannotSayWhereItIs() throws {
        let db = try directory.makeDatabase()
        try db.put("a", ["n": 1])
        let mount = try MountedDatabase(db.path)
        let file = "\(db.path)/db.sqlite3"
        let inside = try shell("""
            cd '\(mount.path("docs/a"))' && sqlite3 '\(file)' 'ALTER TABLE docs RENAME TO docs_away' && cat properties.json
            """)
        #expect(try shell("sqlite3 '\(file)' 'ALTER TABLE docs_away RENAME TO docs'").succeeded)
        #expect(!inside.succeeded)
        #expect(inside.stderr.contains("Input/output error") && !inside.stderr.contains("No such file"), "\(inside.stderr)")
        #expect(try sh("cd '\(mount.path("docs/a"))' && cat properties.json").contains("\"n\": 1"))
        let log = mount.unmount().stderr
        #expect(log.contains("no such table: docs"), "the log says why: \(log.suffix(2000))")
    }
}

extension MountFailureTests {
    /// A mount table longer than a page (as on most desktops: snaps, containers, systemd):
    /// Foundation read only the first 4 KiB of /proc/self/mountinfo, so the mount just made was
    /// not found when it came after that: `sofa mount` could not arm its guard or see a mount
    /// point busy, and tests could not see their mounts. Found when leftover mounts of earlier
    /// runs pushed this machine's table past 4 KiB.
    @Test func aMountIsFoundInAMountTableLongerThanAPage() throws {
        #expect(isRoot, "this test mounts and needs root")
        let many = directory.appending("a-folder-name-long-enough-to-fill-the-mount-table-quickly")
        var mounted: [String] = []
        defer { for path in mounted { _ = try? shell("umount -l '\(path)'") } }
        for index in 0..<60 {
            let path = "\(many)/mount-point-number-\(index)"
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            #expect(try shell("mount -t tmpfs -o size=64k none '\(path)'").succeeded)
            mounted.append(path)
        }
        let table = try sh("cat /proc/self/mountinfo")
        #expect(table.utf8.count > 6000, "the table is longer than a page and a half")
        // Read to its end: every one of these mounts is in it (other tests mount and unmount
        // meanwhile, so the two reads need not be the same length).
        let read = KernelFile.text("/proc/self/mountinfo") ?? ""
        #expect(mounted.allSatisfy { read.contains($0) }, "read to its end: \(read.utf8.count) bytes")
        let db = try directory.makeDatabase()
        try db.put("doc", ["n": 1])
        let mount = try MountedDatabase(db.path)  // waits until it finds the mount in the table
        #expect(try sh("cat '\(mount.path("docs/doc/properties.json"))'").contains("\"n\": 1"))
        // The mount's own look at the table: a second mount on the same point is refused as busy.
        let again = try shell("\(sofaBinary) mount '\(db.path)' '\(mount.mountPoint)' 2>&1")
        #expect(!again.succeeded && again.stdout.contains("already"), "\(again.stdout)")
        #expect(mount.unmount().succeeded)
    }
}
