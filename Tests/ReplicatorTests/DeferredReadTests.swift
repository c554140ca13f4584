import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Deferred bodies read through a real mount, from a real `sofa serve`, with the bytes the
/// server sends counted by a proxy: reads fetch the ranges they need, not whole bodies.
@Suite(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
final class DeferredReadTests {
    let directory = TemporaryDirectory()
    static let size: Int64 = 4 << 20

    /// A served source with two documents sharing one 4 MiB body (`plain/body` and an
    /// extensionless `twin/data`), a deferred pull of it through a proxy, and a mount.
    struct Setup {
        let source: Database
        let server: ServedDatabases
        let proxy: FaultProxy
        let target: String
        let bodyFile: String
        let key: BlobKey
    }

    /// `copies` more documents `copy-N` have the same body as `copy-N/attachments/body.bin`.
    func setUp(copies: Int = 0) throws -> Setup {
        let bodyFile = directory.appending("body.bin")
        let key = try writePatternFile(bodyFile, count: DeferredReadTests.size, seed: 7)
        let sourcePath = directory.appending("source.sofa")
        #expect(try sofa("create", sourcePath).succeeded)
        for (id, name) in [("plain", "body.bin"), ("twin", "data")] + (0..<copies).map({ ("copy-\($0)", "body.bin") }) {
            #expect(try sofa("put", sourcePath, id, "{\"kind\":\"\(id)\"}").succeeded)
            #expect(try sofa("attach", sourcePath, id, name, bodyFile).succeeded)
        }
        let server = try ServedDatabases([sourcePath])
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = directory.appending("deferred.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, "http://127.0.0.1:\(proxy.port)/source", "--no-download-attachments")
        #expect(pulled.succeeded && pulled.stdout.contains("\(2 + copies) deferred"), "\(pulled.stdout)\(pulled.stderr)")
        return Setup(source: try Database.open(at: sourcePath), server: server, proxy: proxy, target: target,
                     bodyFile: bodyFile, key: key)
    }

    /// `count` bytes of the source body at `offset`.
    func expected(_ setup: Setup, at offset: Int64, count: Int) throws -> [UInt8] {
        let handle = try #require(FileHandle(forReadingAtPath: setup.bodyFile))
        defer { try? handle.close() }
        try handle.seek(toOffset: UInt64(offset))
        return [UInt8](try handle.read(upToCount: count) ?? Data())
    }

    /// Reads `count` bytes at `offset` of a mounted file with one pread.
    func pread(_ path: String, at offset: Int64, count: Int) throws -> [UInt8] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { throw SofaError.io(operation: "open", path: path, errno: errno) }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: count)
        let read = Glibc.pread(fd, &buffer, count, off_t(offset))
        guard read >= 0 else { throw SofaError.io(operation: "read", path: path, errno: errno) }
        return Array(buffer[0..<read])
    }

    func attribute(_ path: String, _ name: String) throws -> String {
        try shell("getfattr --only-values -n \(name) '\(path)' 2>/dev/null").stdout
    }

    @Test func headTailAndScatteredReadsFetchWhatTheyReadThenCatFetchesTheRest() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target)
        let path = mount.path("docs/plain/attachments/body.bin")
        var sent = setup.proxy.bytesFromServer

        // head -c 4096: a few chunks, not the body.
        let head = try shell("head -c 4096 '\(path)' | od -An -tx1 | head -c 200")
        #expect(head.stdout == (try shell("head -c 4096 '\(setup.bodyFile)' | od -An -tx1 | head -c 200")).stdout)
        #expect(setup.proxy.bytesFromServer - sent < 256 << 10, "head -c 4096 made the server send \(setup.proxy.bytesFromServer - sent) bytes")
        sent = setup.proxy.bytesFromServer

        // tail -c 4096.
        #expect(try shell("tail -c 4096 '\(path)' > '\(directory.appending("tail"))'").succeeded)
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: directory.appending("tail"))))
                == expected(setup, at: DeferredReadTests.size - 4096, count: 4096))
        #expect(setup.proxy.bytesFromServer - sent < 256 << 10, "tail -c 4096 made the server send \(setup.proxy.bytesFromServer - sent) bytes")
        sent = setup.proxy.bytesFromServer

        // 40 scattered 4 KiB reads: each gets the right bytes; each fetches about a chunk.
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<40 {
            let offset = Int64.random(in: 0..<(DeferredReadTests.size - 4096), using: &generator)
            #expect(try pread(path, at: offset, count: 4096) == expected(setup, at: offset, count: 4096), "at \(offset)")
        }
        let scattered = setup.proxy.bytesFromServer - sent
        #expect(scattered < 40 * (40 << 10), "40 scattered reads made the server send \(scattered) bytes")
        #expect(try attribute(path, "user.sofa.available") == "false")
        #expect(try attribute(path, "user.sofa.progress").hasSuffix("/\(DeferredReadTests.size)"))

        // cat reads it all: only what is missing travels; the body becomes a blob.
        let before = setup.proxy.bytesFromServer
        let sum = try shell("sha1sum '\(path)'")
        #expect(sum.stdout.hasPrefix(setup.key.hex), "\(sum.stdout)\(sum.stderr)")
        #expect(setup.proxy.bytesFromServer - before < Int(DeferredReadTests.size), "cat sent the rest only")
        #expect(waitUntil { (try? self.attribute(path, "user.sofa.available")) == "true" })
        // The other document shares the body: present there too, without a byte more.
        let afterCat = setup.proxy.bytesFromServer
        #expect(waitUntil(10) { (try? self.attribute(mount.path("docs/twin/attachments/data"), "user.sofa.available")) == "true" })
        #expect(try shell("sha1sum '\(mount.path("docs/twin/attachments/data"))'").stdout.hasPrefix(setup.key.hex))
        #expect(setup.proxy.bytesFromServer == afterCat)
        #expect(try sofa("info", setup.target).stdout.contains("Bodies not present: 0"))
        #expect(mount.unmount().succeeded)
        #expect(try sofa("check", setup.target).succeeded)
    }

    @Test func gioSniffsAnExtensionlessDeferredFileWithoutFetchingIt() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target)
        let sent = setup.proxy.bytesFromServer
        let info = try shell("gio info -a standard::content-type '\(mount.path("docs/twin/attachments/data"))'")
        #expect(info.succeeded && info.stdout.contains("standard::content-type"), "\(info.stdout)\(info.stderr)")
        let fetched = setup.proxy.bytesFromServer - sent
        #expect(fetched < 512 << 10, "sniffing the type fetched \(fetched) of \(DeferredReadTests.size) bytes")
        #expect(mount.unmount().succeeded)
    }

    /// Writes a PNG of random pixels (incompressible: about 3 × `side`² bytes) with python3.
    func writePNG(_ path: String, side: Int) throws {
        let script = """
            import os, struct, sys, zlib
            w = h = int(sys.argv[2])
            raw = b''.join(b'\\x00' + os.urandom(w * 3) for _ in range(h))
            def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
            open(sys.argv[1], 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(raw, 0)) + chunk(b'IEND', b''))
            """
        let made = try ChildProcess(["/usr/bin/python3", "-c", script, path, String(side)]).wait()
        #expect(made.succeeded, "\(made.stderr)")
    }

    /// A file manager drawing a folder of deferred photos starts a thumbnailer on each: the
    /// real gdk-pixbuf-thumbnailer (what pcmanfm and Nautilus run) gets no large body that is
    /// not here (ENODATA, nothing fetched), a small one is fetched for it, a reader that is not
    /// a thumbnailer gets the large one, and once it is here the thumbnailer draws it too.
    @Test func thumbnailersDoNotDownloadLargeBodiesToDrawAnIcon() throws {
        let big = directory.appending("big.png"), small = directory.appending("small.png")
        try writePNG(big, side: 1200)  // 4.3 MB, over the default 1 MiB
        try writePNG(small, side: 150)  // 67 KB
        let sourcePath = directory.appending("photos.sofa")
        #expect(try sofa("create", sourcePath).succeeded)
        #expect(try sofa("attach", sourcePath, "album", "big.png", big).succeeded)
        #expect(try sofa("attach", sourcePath, "album", "small.png", small).succeeded)
        let server = try ServedDatabases([sourcePath])
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = directory.appending("deferred-photos.sofa")
        #expect(try sofa("create", target).succeeded)
        #expect(try sofa("pull", target, "http://127.0.0.1:\(proxy.port)/photos", "--no-download-attachments").stdout.contains("2 deferred"))
        let mount = try MountedDatabase(target)
        let folder = mount.path("docs/album/attachments")

        /// Whether the thumbnailer drew it, and what it said.
        func thumbnail(_ name: String) throws -> (drawn: Bool, said: String) {
            let out = directory.appending("thumb-\(name)")
            unlink(out)
            let result = try ChildProcess(["/usr/bin/gdk-pixbuf-thumbnailer", "-s", "128", "\(folder)/\(name)", out]).wait()
            return (result.succeeded && access(out, F_OK) == 0, result.stderr)
        }
        var sent = proxy.bytesFromServer
        let refused = try thumbnail("big.png")
        #expect(!refused.drawn, "the thumbnailer drew a body that is not here")
        #expect(proxy.bytesFromServer - sent < 64 << 10, "a thumbnailer's read fetched \(proxy.bytesFromServer - sent) bytes")
        #expect(try attribute("\(folder)/big.png", "user.sofa.available") == "false")

        sent = proxy.bytesFromServer
        let drawn = try thumbnail("small.png")
        #expect(drawn.drawn, "a small body is fetched for a thumbnail: \(drawn.said)")
        let smallSize = try #require(try FileManager.default.attributesOfItem(atPath: small)[.size] as? Int)
        #expect(proxy.bytesFromServer - sent >= smallSize)

        // Opened by anything else (a viewer, cat, cp), the large body comes whole.
        let sum = try shell("sha1sum '\(folder)/big.png'").stdout
        #expect(sum.prefix(40) == (try shell("sha1sum '\(big)'").stdout.prefix(40)))
        #expect(waitUntil { (try? self.attribute("\(folder)/big.png", "user.sofa.available")) == "true" })
        let now = try thumbnail("big.png")
        #expect(now.drawn, "here now, it is drawn: \(now.said)")
        #expect(mount.unmount().succeeded)

        // thumbnail_fetch_max=all (here as sofa mount's flag): thumbnailers fetch every body.
        let second = directory.appending("all.sofa")
        #expect(try sofa("create", second).succeeded)
        #expect(try sofa("pull", second, "http://127.0.0.1:\(proxy.port)/photos", "--no-download-attachments").succeeded)
        let open = try MountedDatabase(second, arguments: ["--thumbnail-fetch-max", "all"])
        let out = directory.appending("thumb-all")
        let all = try ChildProcess(["/usr/bin/gdk-pixbuf-thumbnailer", "-s", "128", open.path("docs/album/attachments/big.png"), out]).wait()
        #expect(all.succeeded && access(out, F_OK) == 0, "\(all.stderr)")
        #expect(open.unmount().succeeded)
    }

    @Test func twoReadersAtOnceGetTheirBytesAndEachChunkTravelsOnce() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target)
        let path = mount.path("docs/plain/attachments/body.bin")
        let sent = setup.proxy.bytesFromServer
        // One reader from the start, one from the middle, at once.
        let first = try ChildProcess(["/bin/sh", "-c", "sha1sum '\(path)'"])
        let second = try ChildProcess(["/bin/sh", "-c", "tail -c +\(DeferredReadTests.size / 2 + 1) '\(path)' | sha1sum"])
        let half = try shell("tail -c +\(DeferredReadTests.size / 2 + 1) '\(setup.bodyFile)' | sha1sum").stdout
        #expect(first.wait().stdout.hasPrefix(setup.key.hex))
        #expect(second.wait().stdout == half)
        let fetched = setup.proxy.bytesFromServer - sent
        #expect(fetched >= Int(DeferredReadTests.size) && fetched < Int(DeferredReadTests.size) + (128 << 10),
                "\(fetched) bytes sent for an \(DeferredReadTests.size)-byte body")
        #expect(mount.unmount().succeeded)
    }


    /// Reads waiting for a server gone silent hold up nothing else: more of them than the
    /// mount once had threads (8) wait in the mount at once, each in a file of its own, while
    /// other programs list, read and write there; once the server answers again each waiting
    /// read gets its bytes.
    @Test func readsWaitingForASilentServerHoldUpNothingElse() throws {
        let setup = try setUp(copies: 12)
        let mount = try MountedDatabase(setup.target)
        let connectionsBefore = setup.proxy.connections
        setup.proxy.stallNext(1000, afterBytes: 0)
        let sent = setup.proxy.bytesFromServer
        let readers = try (0..<12).map { index in
            try ChildProcess(["/bin/sh", "-c", "head -c 4096 '\(mount.path("docs/copy-\(index)/attachments/body.bin"))' | sha1sum"])
        }
        #expect(waitUntil(20) { setup.proxy.connections > connectionsBefore }, "the mount asked the server")
        Thread.sleep(forTimeInterval: 1)  // the readers reach the mount and wait there

        // Meanwhile, bounded by `timeout` so that a hang fails instead of stalling the test.
        let docs = mount.path("docs")
        for command in ["ls -l '\(docs)/plain/attachments' '\(docs)/twin/attachments'",
                        "cat '\(docs)/plain/properties.json'",
                        "stat '\(docs)/twin/attachments/data'",
                        "mkdir '\(docs)/meanwhile' && printf '{\"written\": true}' > '\(docs)/meanwhile/properties.json'",
                        "grep -q written '\(docs)/meanwhile/properties.json'"] {
            let result = try ChildProcess(["/usr/bin/timeout", "10", "/bin/sh", "-c", command]).wait()
            #expect(result.succeeded, "\(command): \(result.status) \(result.stderr)")
        }
        #expect(setup.proxy.bytesFromServer == sent, "the server has sent nothing: the readers still wait")

        setup.proxy.behave()
        let head = try shell("head -c 4096 '\(setup.bodyFile)' | sha1sum").stdout
        for (index, reader) in readers.enumerated() {
            let result = reader.wait()
            #expect(result.stdout == head, "reader \(index): \(result.stdout) \(result.stderr)")
        }
        let saved = try sofa("cat", setup.target, "meanwhile")
        #expect(saved.stdout.contains("written"), "\(saved.stdout)\(saved.stderr)")
        #expect(mount.unmount().succeeded)
    }

    @Test func purgeAndDownloadByAnotherProcessShowInTheMountAndAPurgedBodyIsFetchedAgain() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target)
        let path = mount.path("docs/plain/attachments/body.bin")
        let twin = mount.path("docs/twin/attachments/data")
        #expect(try attribute(path, "user.sofa.available") == "false")

        // sofa download in another process: both documents show the body within a second or so.
        #expect(try sofa("download", setup.target, "plain").succeeded)
        #expect(waitUntil(10) { (try? self.attribute(path, "user.sofa.available")) == "true" })
        #expect(waitUntil(10) { (try? self.attribute(twin, "user.sofa.available")) == "true" })
        #expect(try shell("sha1sum '\(twin)'").stdout.hasPrefix(setup.key.hex))

        // purge-attachment in another process: the mount says so, and a read fetches it again.
        #expect(try sofa("purge-attachment", setup.target, "plain", "body.bin").succeeded)
        #expect(waitUntil(10) { (try? self.attribute(path, "user.sofa.available")) == "false" })
        #expect(try attribute(twin, "user.sofa.available") == "false")
        let sent = setup.proxy.bytesFromServer
        #expect(try shell("sha1sum '\(twin)'").stdout.hasPrefix(setup.key.hex))
        #expect(setup.proxy.bytesFromServer - sent >= Int(DeferredReadTests.size))
        #expect(mount.unmount().succeeded)
    }

    @Test func theDownloadRulesOfAPullAreKeptAndAnEditThatKeepsADeferredBodyNeverFetchesIt() throws {
        let setup = try setUp()
        let url = "http://127.0.0.1:\(setup.proxy.port)/source"
        let shown = try sofa("download-policy", setup.target)
        #expect(shown.stdout.contains("none: bodies are fetched when read"), "\(shown.stdout)\(shown.stderr)")

        // On the server: a properties-only edit of a document whose body is deferred here, and a
        // new document with a body.
        let connection = try setup.server.connect()
        let plain = try #require(try connection.json("GET", "/source/plain").json)
        var edited = try #require(plain.objectValue)
        edited["kind"] = "edited on the server"
        #expect(try connection.json("PUT", "/source/plain", .object(edited)).status == 201)
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: setup.bodyFile)))
        #expect(try connection.request("PUT", "/source/fresh/new.bin", headers: [("Content-Type", "application/octet-stream")],
                                       body: Array(bytes.reversed())).status == 201)

        // A synced mount given no rules follows the pull's: nothing is downloaded.
        let sent = setup.proxy.bytesFromServer
        let mount = try MountedDatabase(setup.target, arguments: ["--remote", url, "--sync", "--continuous"])
        #expect(waitUntil(20) {
            (try? String(contentsOfFile: mount.path("docs/plain/properties.json"), encoding: .utf8))?.contains("edited on the server") == true
                && FileManager.default.fileExists(atPath: mount.path("docs/fresh/attachments/new.bin"))
        })
        #expect(try attribute(mount.path("docs/plain/attachments/body.bin"), "user.sofa.available") == "false")
        #expect(try attribute(mount.path("docs/fresh/attachments/new.bin"), "user.sofa.available") == "false")
        #expect(setup.proxy.bytesFromServer - sent < 1 << 20, "\(setup.proxy.bytesFromServer - sent) bytes came for metadata")
        #expect(mount.unmount().succeeded)

        // Changed with the one command, the rules apply to the next pull: a new body comes, the kept one stays deferred.
        #expect(try sofa("download-policy", setup.target, "--download-attachments").stdout.contains("all bodies"))
        #expect(try connection.request("PUT", "/source/later/small.txt", headers: [("Content-Type", "text/plain")],
                                       body: Array("small body\n".utf8)).status == 201)
        let pulled = try sofa("pull", setup.target, url)
        #expect(pulled.succeeded && pulled.stdout.contains("1 attachment body downloaded"), "\(pulled.stdout)\(pulled.stderr)")
        #expect(try sofa("cat-attachment", setup.target, "later", "small.txt").stdout == "small body\n")
        #expect(try sofa("cat-attachment", setup.target, "plain", "body.bin").status == 1)
    }

    @Test func sofaServeOfADeferredCopyFetchesItsBodiesFromItsRemote() throws {
        let setup = try setUp()
        let served = try ServedDatabases([setup.target])
        let connection = try served.connect()
        // A range: passed through, a few chunks fetched.
        let sent = setup.proxy.bytesFromServer
        let range = try connection.request("GET", "/deferred/plain/body.bin", headers: [("Range", "bytes=3000000-3000999")])
        let wanted = try expected(setup, at: 3_000_000, count: 1000)
        #expect(range.status == 206 && range.body == wanted, "\(range.status)")
        #expect(setup.proxy.bytesFromServer - sent < 256 << 10)
        // The whole body, streamed as it arrives; then it is here.
        let whole = try connection.request("GET", "/deferred/twin/data")
        #expect(whole.status == 200 && MessageDigest.hash(.sha1, whole.body) == setup.key.digestBytes)
        #expect(waitUntil { (try? sofa("info", setup.target).stdout.contains("Bodies not present: 0")) == true })
        _ = served.stop()
    }

    @Test func aDiskThatFillsWhileChunksArriveFailsTheReadAndLosesNothing() throws {
        let setup = try setUp()
        // The deferred copy on a 3 MiB file system: its 4 MiB body cannot all arrive.
        let small = directory.appending("small-disk")
        #expect(try shell("mkdir -p '\(small)' && mount -t tmpfs -o size=3m tmpfs '\(small)'").succeeded)
        defer { _ = try? shell("umount -l '\(small)'") }
        #expect(try shell("cp -a '\(setup.target)' '\(small)/db.sofa'").succeeded)
        let mount = try MountedDatabase(small + "/db.sofa", arguments: ["--remote", "http://127.0.0.1:\(setup.proxy.port)/source",
                                                                         "--retries", "1"])
        let path = mount.path("docs/plain/attachments/body.bin")
        let full = try shell("cat '\(path)' > /dev/null")
        #expect(!full.succeeded && full.stderr.contains("Input/output error"), "\(full.stderr)")
        // What fitted is readable and right; the database is whole.
        #expect(try pread(path, at: 0, count: 4096) == expected(setup, at: 0, count: 4096))
        // Room again: the read completes, with the right bytes.
        #expect(try shell("mount -o remount,size=64m '\(small)'").succeeded)
        #expect(try shell("sha1sum '\(path)'").stdout.hasPrefix(setup.key.hex))
        let log = mount.unmount()
        #expect(log.succeeded)
        #expect(log.stderr.lowercased().contains("no space left on device"), "the mount says why: \(log.stderr.suffix(1500))")
        #expect(try sofa("check", small + "/db.sofa").succeeded)
    }

    @Test func twoMountsOfOneDatabaseReadOneDeferredBodyAtOnce() throws {
        let setup = try setUp()
        let first = try MountedDatabase(setup.target)
        let second = try MountedDatabase(setup.target)
        let readers = try [first, second].map { mount in
            try ChildProcess(["/bin/sh", "-c", "sha1sum '\(mount.path("docs/plain/attachments/body.bin"))'"])
        }
        for reader in readers { #expect(reader.wait().stdout.hasPrefix(setup.key.hex)) }
        // Both see it installed (one of them installed it, the other found it there).
        for mount in [first, second] {
            #expect(waitUntil(10) { (try? self.attribute(mount.path("docs/plain/attachments/body.bin"), "user.sofa.available")) == "true" })
        }
        #expect(first.unmount().succeeded)
        #expect(second.unmount().succeeded)
        #expect(try sofa("check", setup.target).succeeded)
        #expect(try DeferredBodyTests().partialDownloads(setup.target).isEmpty)
    }

    @Test func downloadAndPullPrintJSONProgressEventsForScripts() throws {
        let setup = try setUp()
        // A slow link (4 MiB/s): the 4 MiB body takes about a second, and progress is told every half.
        setup.proxy.limitRate(4 << 20)
        let result = try sofa("download", setup.target, "--json")
        #expect(result.succeeded, "\(result.stderr)")
        let events = try result.stdout.split(separator: "\n").map { try JSONParser.parse(Array($0.utf8)) }
        let last = try #require(events.last)
        #expect(last["ok"]?.boolValue == true && last["bodies_downloaded"]?.int64Value == 1, "\(result.stdout)")
        #expect(last["bytes"]?.int64Value == DeferredReadTests.size)
        #expect(events.contains { $0["event"]?.stringValue == "downloaded" && $0["bodies"]?.int64Value == 1 })
        let progress = events.filter { $0["event"]?.stringValue == "progress" }
        #expect(!progress.isEmpty, "\(result.stdout)")
        for event in progress {
            #expect(event["length"]?.int64Value == DeferredReadTests.size && (event["bytes"]?.int64Value ?? -1) >= 0)
        }
        #expect(result.stderr.isEmpty, "no terminal lines mixed in: \(result.stderr)")

        // A pull that downloads the body tells how far it is too.
        let copy = directory.appending("copy.sofa")
        #expect(try sofa("create", copy).succeeded)
        let pulled = try sofa("pull", copy, "http://127.0.0.1:\(setup.proxy.port)/source", "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let bodyEvents = try pulled.stdout.split(separator: "\n").map { try JSONParser.parse(Array($0.utf8)) }
            .filter { $0["event"]?.stringValue == "body_progress" }
        #expect(!bodyEvents.isEmpty, "\(pulled.stdout)")
        for event in bodyEvents {
            let bytes = event["bytes"]?.int64Value ?? -1
            #expect(event["length"]?.int64Value == DeferredReadTests.size && bytes > 0 && bytes < DeferredReadTests.size,
                    "\(event.jsonString())")
        }
    }

    @Test func aServerThatGetsRangesWrongIsAskedForTheWholeBody() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target, arguments: ["--retry-delay", "0.05"])
        // Every ranged answer claims to start one byte later than it does.
        setup.proxy.replace("Content-Range: bytes 0-", with: "Content-Range: bytes 1-")
        let path = mount.path("docs/plain/attachments/body.bin")
        #expect(try pread(path, at: 0, count: 4096) == expected(setup, at: 0, count: 4096))
        #expect(try shell("sha1sum '\(path)'").stdout.hasPrefix(setup.key.hex))
        #expect(mount.unmount().succeeded)
        #expect(try sofa("check", setup.target).succeeded)
    }

    @Test func aBodyThatChangesOnTheServerIsDroppedNotMixed() throws {
        let setup = try setUp()
        let mount = try MountedDatabase(setup.target, arguments: ["--retry-delay", "0.05", "--retries", "2"])
        let path = mount.path("docs/plain/attachments/body.bin")
        #expect(try pread(path, at: 0, count: 4096) == expected(setup, at: 0, count: 4096))
        #expect(setup.proxy.bytesFromServer > 0)
        // The server now tags its answers with another body's digest.
        let digest = setup.key.digestString.dropFirst("sha1-".count)
        let other = String(digest.reversed())
        setup.proxy.replace("ETag: \"\(digest)\"", with: "ETag: \"\(other)\"")
        let read = try shell("dd if='\(path)' of=/dev/null bs=4096 skip=1000 count=1 2>&1")
        #expect(!read.succeeded && read.stdout.contains("Input/output error"), "\(read.stdout)")
        // What had arrived is gone: nothing of the old bytes is kept beside new ones.
        let kept = try DeferredBodyTests().partialDownloads(setup.target)
        #expect(kept.values.allSatisfy { $0 == 0 }, "\(kept)")
        // The server behaves again: the body is fetched afresh and whole.
        setup.proxy.behave()
        #expect(try shell("sha1sum '\(path)'").stdout.hasPrefix(setup.key.hex))
        #expect(mount.unmount().succeeded)
        #expect(try sofa("check", setup.target).succeeded)
    }
}
