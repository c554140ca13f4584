import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// FUSE passthrough: large stored bodies are read by the kernel from their blob files, with
/// no READ request to the mount; small ones, and everything else, as before.
@Suite struct PassthroughTests {
    let directory = TemporaryDirectory()
    let db: Database
    let big: [UInt8]

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        var generator = SystemRandomNumberGenerator()
        big = (0..<(4 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try db.put("doc", ["title": "bodies"], attachments: ["big.bin": big, "small.txt": Array("small body\n".utf8)])
    }

    func fuseStatus(_ mount: MountedDatabase) throws -> JSONValue {
        let text = try sh("cat '\(mount.path(".sofa/status.json"))'")
        return try #require(try JSONParser.parse(Array(text.utf8))["fuse"])
    }

    func readRequests(_ mount: MountedDatabase) throws -> Int64 {
        try #require(try fuseStatus(mount)["read_requests"]?.int64Value)
    }

    /// READ requests that reading `file` cost, besides those of reading the status file.
    func readsOf(_ file: String, _ mount: MountedDatabase) throws -> Int64 {
        let first = try readRequests(mount)
        let second = try readRequests(mount)  // the cost of one status read
        try sh("cat '\(file)' > /dev/null")
        let third = try readRequests(mount)
        return (third - second) - (second - first)
    }

    /// status.json changes from one open to the next (its open counts among others): a
    /// program that sizes its read by `fstat`, as Foundation's `Data(contentsOf:)` does, must
    /// get all of what its open reads, not a size the kernel kept from an earlier version.
    @Test func theStatusFileSizeIsThatOfWhatEachOpenReads() throws {
        let mount = try MountedDatabase(db.path)
        defer { _ = mount.unmount() }
        let path = mount.path(".sofa/status.json")
        var sizes: Set<Int> = []
        for _ in 0..<150 {
            let data = try Data(contentsOf: URL(fileURLWithPath: path))
            sizes.insert(data.count)
            _ = try JSONParser.parse([UInt8](data))  // throws on a cut-off read
            #expect(FileManager.default.fileExists(atPath: mount.path("docs/doc/attachments/small.txt")))
            _ = try Data(contentsOf: URL(fileURLWithPath: mount.path("docs/doc/attachments/small.txt")))
        }
        #expect(sizes.count > 1, "the status changed while it was read")
    }

    @Test func largeBodiesAreReadByTheKernelAndSmallOnesByTheMount() throws {
        let mount = try MountedDatabase(db.path)
        #expect(try fuseStatus(mount)["passthrough"] == "in use", "\(mount.log)")
        #expect(waitUntil(5) { mount.log.contains("FUSE passthrough: in use") }, "\(mount.log)")
        let bigFile = mount.path("docs/doc/attachments/big.bin")
        #expect(try readsOf(bigFile, mount) == 0, "the kernel read the blob file itself")
        #expect(try sh("sha1sum '\(bigFile)'").hasPrefix(BlobKey.of(big).hex))
        #expect(try readsOf(mount.path("docs/doc/attachments/small.txt"), mount) >= 1, "a small body is read through the mount")
        #expect(try fuseStatus(mount)["passthrough_opened"]?.int64Value ?? 0 >= 2)
        #expect(try fuseStatus(mount)["passthrough_open_files"] == 0, "each backing file goes with its close")

        // Without passthrough the same body costs reads: the count above can tell.
        #expect(mount.unmount().succeeded)
        let plain = try MountedDatabase(db.path, arguments: ["--no-passthrough"])
        #expect(try fuseStatus(plain)["passthrough"] == "off (--no-passthrough)")
        #expect(try readsOf(plain.path("docs/doc/attachments/big.bin"), plain) >= 4)
    }

    @Test func mappedReadsAndABodyReplacedOrDeletedWhileOpen() throws {
        let mount = try MountedDatabase(db.path)
        let file = mount.path("docs/doc/attachments/big.bin")
        let replacement = directory.appending("replacement.bin")
        let newer = big.reversed() as [UInt8]
        #expect(FileManager.default.createFile(atPath: replacement, contents: Data(newer)))
        let blob = db.blobs.path(for: BlobKey.of(big))
        // One process holds the body open and mapped while a new revision replaces it and its
        // blob file is deleted, then overwritten with other bytes, behind the mount's back.
        let script = """
            import hashlib, mmap, os, shutil, subprocess, sys
            path, replacement, blob = sys.argv[1:4]
            fd = os.open(path, os.O_RDONLY)
            mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            before = hashlib.sha1(mapped[:]).hexdigest()
            shutil.copyfile(replacement, path)            # a new revision through the mount
            os.chmod(blob, 0o644); os.unlink(blob)        # compaction or eviction deleting the old body
            with open(blob, "wb") as other: other.write(b"another body" * 1000)
            after_map = hashlib.sha1(mapped[:]).hexdigest()
            after_read = hashlib.sha1(os.pread(fd, 8 << 20, 0)).hexdigest()
            with open(path, "rb") as again: fresh = hashlib.sha1(again.read()).hexdigest()
            print(before, after_map, after_read, fresh)
            """
        let result = try shell("python3 -c '\(script)' '\(file)' '\(replacement)' '\(blob)'")
        #expect(result.succeeded, "\(result.stderr)")
        let digests = result.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        #expect(digests == [BlobKey.of(big).hex, BlobKey.of(big).hex, BlobKey.of(big).hex, BlobKey.of(newer).hex],
                "the open file keeps its bytes, a new open sees the new revision: \(result.stdout)")
    }

    @Test func tenThousandFilesOpenAtOnceAndTheirBackingFilesGoWithThem() throws {
        let body = [UInt8](repeating: 7, count: Int(Tuning.passthroughMinimumSize))
        let blob = try db.blobs.write(body)
        try db.inBatch { batch in
            for index in 0..<10_000 {
                var draft = try db.newDocument("many-\(index)")
                try draft.setAttachment("body.bin", blob: blob)
                _ = try batch.save(draft)
            }
        }
        let mount = try MountedDatabase(db.path)
        let script = """
            import json, os, resource, sys
            root, status = sys.argv[1:3]
            resource.setrlimit(resource.RLIMIT_NOFILE, (12000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            fds = [os.open(f"{root}/many-{i}/attachments/body.bin", os.O_RDONLY) for i in range(10000)]
            firsts = {os.pread(fd, 1, 262143) for fd in fds}
            with open(status) as f: during = json.load(f)["fuse"]["passthrough_open_files"]
            for fd in fds: os.close(fd)
            print(len(fds), sorted(firsts), during)
            """
        let result = try shell("python3 -c '\(script)' '\(mount.path("docs"))' '\(mount.path(".sofa/status.json"))'")
        #expect(result.stdout == "10000 [b'\\x07'] 10000\n", "\(result.stdout) \(result.stderr)")
        #expect(waitUntil(10) { (try? fuseStatus(mount)["passthrough_open_files"]) == 0 }, "backing files are released")
    }
}
