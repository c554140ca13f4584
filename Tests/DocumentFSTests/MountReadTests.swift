import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Reading through a real mount with ordinary tools.
@Suite struct MountReadTests {
    let directory = TemporaryDirectory()
    let db: Database
    let data: [UInt8] = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) }

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        try db.put("plain", ["title": "Hello", "n": 1, "list": [1, 2.5, "x"]],
                   attachments: ["hello.txt": Array("hello\n".utf8), "data.bin": data, "sub/dir/notes.txt": Array("notes".utf8)])
        try db.put("folder/sub/doc", ["slash": true])
        try db.put(".", ["dot": true])
        try db.put("../../etc", ["escape": "attempt"], attachments: ["../evil": Array("x".utf8)])
        try db.put("unicode-ünïcødé-文档-🚀", ["é": "😀"])
        var remote = try db.newRevision(of: "remote")
        try remote.setAttachment(Attachment(name: "big.bin", contentType: "application/octet-stream", length: 1234,
                                            digest: "md5-AAAAAAAAAAAAAAAAAAAAAA==", blobKey: nil, revpos: 1))
        try db.save(remote)
        try db.insert(ReplicatedRevision(docID: "conflicted", revID: RevisionID("2-aaa")!, ancestors: [RevisionID("1-root")!], properties: ["side": "A"]))
        try db.insert(ReplicatedRevision(docID: "conflicted", revID: RevisionID("3-bbb")!, ancestors: [RevisionID("2-bbb")!, RevisionID("1-root")!],
                                         properties: ["side": "B"]))
    }

    @Test func listsTheTreeWithEscapedNamesAndExactSizes() throws {
        let mount = try MountedDatabase(db.path)
        let docs = try sh("ls -A \(mount.path("docs"))").split(separator: "\n").map(String.init)
        #expect(docs == ["%2E", "..%2F..%2Fetc", "conflicted", "folder%2Fsub%2Fdoc", "plain", "remote", "unicode-ünïcødé-文档-🚀"])
        #expect(try sh("ls \(mount.path("docs/plain"))") == "attachments\nproperties.json\n")
        #expect(try sh("ls \(mount.path("docs/plain/attachments"))") == "data.bin\nhello.txt\nsub\n")
        #expect(try sh("ls -A '\(mount.path("docs/..%2F..%2Fetc/attachments"))'") == "..%2Fevil\n")
        let rendered = JSONValue.object(try document(db, "plain")!.properties).prettyPrinted()
        #expect(try sh("stat -c %s \(mount.path("docs/plain/properties.json"))") == "\(rendered.utf8.count)\n")
        #expect(try sh("stat -c %s \(mount.path("docs/plain/attachments/data.bin"))") == "300000\n")
        // The size of a body that is not here comes from its metadata.
        #expect(try sh("stat -c %s \(mount.path("docs/remote/attachments/big.bin"))") == "1234\n")
        #expect(try sh("stat -c %F \(mount.path("docs/plain/attachments/sub/dir"))") == "directory\n")
        let files = try sh("cd \(mount.path("docs/plain")) && find . -type f | sort")
        #expect(files == "./attachments/data.bin\n./attachments/hello.txt\n./attachments/sub/dir/notes.txt\n./properties.json\n")
        #expect(try sh("du -sb \(mount.path("docs/plain/attachments"))").hasPrefix("300011"))
        // statfs reports the disk that holds the database.
        let mountBlocks = try sh("stat -f -c %b \(mount.mountPoint)")
        let diskBlocks = try sh("stat -f -c %b \(db.path)")
        #expect(mountBlocks == diskBlocks)
        // The revision's time is the files' mtime.
        let saved = Int(try document(db, "plain")!.savedAt.timeIntervalSince1970)
        #expect(try sh("stat -c %Y \(mount.path("docs/plain/properties.json"))") == "\(saved)\n")
        #expect(mount.unmount().succeeded)
    }

    @Test func readsWithOrdinaryTools() throws {
        let mount = try MountedDatabase(db.path)
        let properties = mount.path("docs/plain/properties.json")
        let first = try sh("cat \(properties)")
        #expect(first == "{\n  \"title\": \"Hello\",\n  \"n\": 1,\n  \"list\": [\n    1,\n    2.5,\n    \"x\"\n  ]\n}\n")
        #expect(try sh("cat \(properties)") == first)
        let bin = mount.path("docs/plain/attachments/data.bin")
        #expect(try sh("sha1sum \(bin)").hasPrefix(BlobKey.of(data).hex))
        #expect(try sh("head -c 1000 \(bin) | sha1sum").hasPrefix(BlobKey.of(Array(data[0..<1000])).hex))
        #expect(try sh("dd if=\(bin) bs=1000 skip=100 count=5 status=none | sha1sum").hasPrefix(BlobKey.of(Array(data[100_000..<105_000])).hex))
        #expect(try sh("tail -c 777 \(bin) | sha1sum").hasPrefix(BlobKey.of(Array(data.suffix(777))).hex))
        #expect(try sh("file -b \(mount.path("docs/plain/attachments/hello.txt"))") == "ASCII text\n")
        #expect(try sh("cat '\(mount.path("docs/unicode-ünïcødé-文档-🚀/properties.json"))'") == "{\n  \"é\": \"😀\"\n}\n")
        #expect(try sh("cat \(mount.path("docs/%2E/properties.json"))") == "{\n  \"dot\": true\n}\n")

        // mmap, as editors and viewers read.
        let fd = open(bin, O_RDONLY)
        #expect(fd >= 0)
        let mapped = mmap(nil, data.count, PROT_READ, MAP_SHARED, fd, 0)
        #expect(mapped != MAP_FAILED)
        if let mapped, mapped != MAP_FAILED {
            #expect(Array(UnsafeRawBufferPointer(start: mapped, count: data.count)) == data)
            munmap(mapped, data.count)
        }
        close(fd)
    }

    @Test func extendedAttributesDescribeRevisionsAndBodies() throws {
        let mount = try MountedDatabase(db.path)
        let plain = try #require(try document(db, "plain"))
        let attributes = try sh("getfattr -d --absolute-names \(mount.path("docs/plain/attachments/hello.txt"))")
        #expect(attributes.contains("user.mime_type=\"text/plain\""))
        #expect(attributes.contains("user.sofa.available=\"true\""))
        #expect(attributes.contains("user.sofa.digest=\"\(plain.attachment(named: "hello.txt")!.digest)\""))
        #expect(attributes.contains("user.sofa.rev=\"\(plain.revID)\""))
        #expect(try sh("getfattr --only-values -n user.sofa.available \(mount.path("docs/remote/attachments/big.bin"))") == "false")
        #expect(try sh("getfattr --only-values -n user.sofa.rev \(mount.path("docs/plain"))") == plain.revID.description)
        let missing = try shell("getfattr -n user.nope \(mount.path("docs/plain/attachments/hello.txt"))")
        #expect(!missing.succeeded && missing.stderr.contains("No such attribute"))
        // What ls -l asks of every file: not supported (ls then stops asking), without a lookup.
        for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
            let absent = try shell("getfattr -n \(name) \(mount.path("docs/plain/attachments/hello.txt"))")
            #expect(!absent.succeeded && absent.stderr.contains("Operation not supported"), "\(name): \(absent.stderr)")
        }
    }

    @Test func bodiesThatAreNotHereFailPromptlyWithAClearError() throws {
        let mount = try MountedDatabase(db.path)
        let start = Date()
        let result = try shell("cat \(mount.path("docs/remote/attachments/big.bin"))")
        #expect(!result.succeeded)
        #expect(result.stderr.contains("No data available"), "\(result.stderr)")
        #expect(Date().timeIntervalSince(start) < 5, "it must not hang")
        #expect(mount.log.contains("not downloaded"), "\(mount.log)")
    }

    @Test func conflictsAndStatusAreReadOnlyFolders() throws {
        let mount = try MountedDatabase(db.path)
        #expect(try sh("ls \(mount.path("docs/conflicted"))") == "attachments\nconflicts\nproperties.json\n")
        #expect(try sh("ls \(mount.path("docs/conflicted/conflicts"))") == "2-aaa\n")
        #expect(try sh("cat \(mount.path("docs/conflicted/conflicts/2-aaa/properties.json"))") == "{\n  \"side\": \"A\"\n}\n")
        #expect(try sh("cat \(mount.path("docs/conflicted/properties.json"))") == "{\n  \"side\": \"B\"\n}\n")
        let refused = try shell("echo '{}' > \(mount.path("docs/conflicted/conflicts/2-aaa/properties.json"))")
        #expect(!refused.succeeded && refused.stderr.contains("Read-only file system"), "\(refused.stderr)")
        // Listed as a file: the type a listing gives (d_type) is what scandir and file managers trust.
        let types = try sh("python3 -c 'import os; print([(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(\"\(mount.path(".sofa"))\")])'")
        #expect(types == "[('status.json', False)]\n", "\(types)")
        let status = try JSONValue(parsing: try sh("cat \(mount.path(".sofa/status.json"))"))
        #expect(status["last_sequence"] == .integer(try db.lastSequence))
        // When it was mounted, as a person reads a time (ISO 8601), within the last minute.
        let mounted = try #require(status["mounted_at"]?.stringValue.flatMap { ISO8601DateFormatter().date(from: $0) }, "\(status)")
        #expect(abs(mounted.timeIntervalSinceNow) < 60)
        #expect(!(try shell("touch \(mount.path(".sofa/x"))")).succeeded)
    }

    @Test func unsupportedOperationsFailWithAProperErrno() throws {
        let mount = try MountedDatabase(db.path)
        let hello = mount.path("docs/plain/attachments/hello.txt")
        let link = try shell("ln \(hello) \(mount.path("docs/plain/attachments/hard"))")
        #expect(!link.succeeded && link.stderr.contains("Operation not permitted"), "\(link.stderr)")
        let symlink = try shell("ln -s /etc/passwd \(mount.path("docs/plain/attachments/sym"))")
        #expect(!symlink.succeeded && symlink.stderr.contains("Operation not permitted"), "\(symlink.stderr)")
        let fifo = try shell("mkfifo \(mount.path("docs/plain/attachments/fifo"))")
        #expect(!fifo.succeeded && fifo.stderr.contains("Operation not permitted"), "\(fifo.stderr)")
        // chmod, chown and touch are accepted (cp -a, rsync -a) and change nothing.
        try sh("chmod 600 \(hello) && chown 0:0 \(hello) && touch \(hello)")
        #expect(try generation(db, "plain") == 1)
    }

    @Test func readOnlyMountRefusesChanges() throws {
        let mount = try MountedDatabase(db.path, arguments: ["--read-only"])
        #expect(try sh("cat \(mount.path("docs/plain/attachments/hello.txt"))") == "hello\n")
        for command in ["echo '{}' > \(mount.path("docs/plain/properties.json"))", "rm \(mount.path("docs/plain/attachments/hello.txt"))",
                        "mkdir \(mount.path("docs/new"))"] {
            let result = try shell(command)
            #expect(!result.succeeded && result.stderr.contains("Read-only file system"), "\(command): \(result.stderr)")
        }
        #expect(try generation(db, "plain") == 1)
    }
}
