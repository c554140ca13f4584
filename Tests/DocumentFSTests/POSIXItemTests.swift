import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// POSIX behaviours pjdfstest and real programs rely on, through a real mount.
@Suite struct POSIXItemTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        try db.put("doc", ["n": 1], attachments: ["keep.txt": Array("kept".utf8)])
    }

    /// pjdfstest unlink/14.t: an open file keeps working after its name is gone, fstat included.
    @Test func fstatOfAnOpenFileAfterUnlinkWorks() throws {
        let mount = try MountedDatabase(db.path)
        let script = """
            import os, sys
            p = sys.argv[1]
            fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
            os.write(fd, b'hello')
            os.unlink(p)
            st = os.fstat(fd)
            assert st.st_size == 5, st
            assert st.st_nlink == 0, st
            os.lseek(fd, 0, 0)
            assert os.read(fd, 100) == b'hello'
            os.close(fd)
            assert not os.path.exists(p)
            print('ok')
            """
        let file = directory.appending("fstat.py")
        try script.write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try sh("python3 \(file) \(mount.path("docs/doc/attachments/gone.txt"))") == "ok\n")
        #expect(try document(db, "doc")?.attachment(named: "gone.txt") == nil)
    }

    /// pjdfstest ftruncate/02.t's shape: a truncate by path right after the create's close.
    @Test func aTruncateByPathRightAfterCreateIsKept() throws {
        let mount = try MountedDatabase(db.path)
        let script = """
            import os, sys
            for i in range(40):
                p = sys.argv[1] + '/t%d' % i
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                os.truncate(p, 123)
                assert os.stat(p).st_size == 123, (i, os.stat(p).st_size)
            print('ok')
            """
        let file = directory.appending("truncate.py")
        try script.write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try sh("python3 \(file) \(mount.path("docs/doc/attachments"))") == "ok\n")
        let saved = try #require(try document(db, "doc"))
        for i in 0..<40 { #expect(saved.attachment(named: "t\(i)")?.length == 123, "t\(i)") }
    }
}

/// Paths as long as the kernel takes (pjdfstest makes them; so does a deep `mkdir -p`): a
/// document folder's own files live under the scratch folder, whose path comes first, so
/// without `LongPath` every call past about 4,000 bytes answered ENAMETOOLONG.
@Suite struct LongPathTests {
    let directory = TemporaryDirectory()

    @Test func filesAtTheKernelsPathLimitWorkInADocumentFolderAsOnADisk() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        try db.put("doc", ["n": 1])
        // Folders of 250 bytes down to 4,094 bytes of path below the document folder, each
        // call made relative to it, as pjdfstest does from its working directory.
        let script = """
            import os, sys
            os.chdir(sys.argv[1])
            path = ""
            while len(path) < 4094 - 201:
                room = 4094 - 201 - len(path) - (1 if path else 0)
                path = (path + "/" if path else "") + "d" * min(250, room)
                os.mkdir(path)
            leaf = path + "/" + "f" * 200
            temporary = path + "/" + "." + "t" * 199
            steps = []
            def step(name, call):
                try:
                    result = call()
                    steps.append(name + " " + (result if isinstance(result, str) else "ok"))
                except OSError as error:
                    steps.append(name + " errno " + str(error.errno))
            step("length", lambda: str(len(leaf)))
            step("create", lambda: open(leaf, "w").write("hello"))
            step("read", lambda: open(leaf).read())
            step("size", lambda: str(os.stat(leaf).st_size))
            step("chmod", lambda: os.chmod(leaf, 0o600))
            step("mode", lambda: oct(os.stat(leaf).st_mode & 0o777))
            step("utime", lambda: os.utime(leaf, (1000000, 2000000)))
            step("mtime", lambda: str(int(os.stat(leaf).st_mtime)))
            step("truncate", lambda: os.truncate(leaf, 3))
            step("temporary", lambda: open(temporary, "w").write("written then renamed"))
            step("rename over", lambda: os.rename(temporary, leaf))
            step("after rename", lambda: open(leaf).read())
            step("list", lambda: ",".join(sorted(n[:3] for n in os.listdir(path))))
            step("into attachments", lambda: os.rename(leaf, "attachments/long.txt"))
            step("attachment", lambda: open("attachments/long.txt").read())
            step("again", lambda: open(leaf, "w").write("x"))
            step("unlink", lambda: os.unlink(leaf))
            step("gone", lambda: str(os.path.exists(leaf)))
            while path:
                step("rmdir", lambda: os.rmdir(path))
                path = path.rsplit("/", 1)[0] if "/" in path else ""
            print("\\n".join(steps))
            """
        let file = directory.appending("long.py")
        try script.write(toFile: file, atomically: true, encoding: .utf8)
        let disk = directory.appending("disk")
        try FileManager.default.createDirectory(atPath: disk + "/attachments", withIntermediateDirectories: true)
        let expected = try sh("python3 \(file) \(disk)")
        #expect(expected.contains("length 4094\n") && !expected.contains("errno"), "the disk's own answers: \(expected)")
        let mount = try MountedDatabase(db.path)
        let answered = try sh("python3 \(file) \(mount.path("docs/doc"))")
        #expect(answered == expected)
        try settled(db)
        let key = try #require(try document(db, "doc")?.attachment(named: "long.txt")?.blobKey)
        #expect(try db.blobs.contents(of: key) == Array("written then renamed".utf8))
    }
}
