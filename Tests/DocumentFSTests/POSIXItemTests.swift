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
