import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// The cache of fetched bodies, through a real mount reading from a real `sofa serve`:
/// a limit holds the disk to it, the least recently read bodies go back to deferred and
/// come back when read, and pinned bodies, bodies saved here and bodies the remote no
/// longer has stay.
@Suite(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
final class BodyCacheTests {
    let directory = TemporaryDirectory()
    static let size: Int64 = 1 << 20
    static let limit: Int64 = 2_560 << 10

    /// Bytes on disk of fetched bodies and partial ones in `database` (blobs not in `except`).
    func cacheBytesOnDisk(_ database: String, except: Set<BlobKey>) throws -> Int64 {
        let folder = database + "/attachments"
        var total: Int64 = 0
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) where name.hasSuffix(".blob") {
            guard let key = BlobKey(hex: String(name.dropLast(5))), !except.contains(key) else { continue }
            var info = stat()
            if stat("\(folder)/\(name)", &info) == 0 { total += Int64(info.st_blocks) * 512 }
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: folder + "/tmp")) ?? [] where name.hasSuffix(".partial") {
            var info = stat()
            if stat("\(folder)/tmp/\(name)", &info) == 0 { total += Int64(info.st_blocks) * 512 }
        }
        return total
    }

    /// `source.sofa` with one 1 MiB body per (document, attachment, file, seed), served by
    /// `sofa serve`, and `deferred.sofa` pulled from it with every body deferred.
    func servedDeferredCopy(_ bodies: [(String, String, String, UInt64)]) throws -> ([BlobKey], ServedDatabases, String) {
        let sourcePath = directory.appending("source.sofa")
        #expect(try sofa("create", sourcePath).succeeded)
        var keys: [BlobKey] = []
        for (id, name, fileName, seed) in bodies {
            let file = directory.appending(fileName)
            keys.append(try writePatternFile(file, count: BodyCacheTests.size, seed: seed))
            #expect(try sofa("put", sourcePath, id, "{}").succeeded)
            #expect(try sofa("attach", sourcePath, id, name, file).succeeded)
        }
        let server = try ServedDatabases([sourcePath])
        let target = directory.appending("deferred.sofa")
        #expect(try sofa("create", target).succeeded)
        #expect(try sofa("pull", target, "http://127.0.0.1:\(server.port)/source", "--no-download-attachments").succeeded)
        return (keys, server, target)
    }

    func attribute(_ path: String, _ name: String) throws -> String {
        try shell("getfattr --only-values -n \(name) '\(path)' 2>/dev/null").stdout
    }

    @Test func aLimitEvictsTheLeastRecentlyReadFetchedBodiesAndKeepsPinnedLocalAndUnconfirmedOnes() throws {
        // Six documents with a 1 MiB body each on the server; a deferred copy with a limit of 2.5 MiB.
        let sourcePath = directory.appending("source.sofa")
        let (keys, server, target) = try servedDeferredCopy((0..<6).map { ("b\($0)", "body.bin", "body\($0)", UInt64(10 + $0)) })
        defer { _ = server }
        #expect(try sofa("cache", target, "--limit", "2560K").succeeded)
        // A body only this machine has: never the cache's.
        let localFile = directory.appending("local")
        let localKey = try writePatternFile(localFile, count: 3 << 20, seed: 99)
        #expect(try sofa("put", target, "mine", "{}").succeeded)
        #expect(try sofa("attach", target, "mine", "local.bin", localFile).succeeded)

        let mount = try MountedDatabase(target)
        func file(_ index: Int) -> String { mount.path("docs/b\(index)/attachments/body.bin") }

        // A pin set from a file manager fetches the body and keeps it.
        #expect(try shell("setfattr -n user.sofa.pinned -v true '\(file(0))'").succeeded)
        #expect(try attribute(file(0), "user.sofa.pinned") == "true")
        #expect(try waitUntil(10) { try attribute(file(0), "user.sofa.available") == "true" }, "the pinned body did not arrive")

        // b1 is edited here (a revision the server does not have) but keeps its body: still the cache's.
        var draft = try Database.open(at: target).newRevision(of: "b1")
        draft.properties["edited"] = true
        _ = try Database.open(at: target).save(draft)

        // Read b1..b5 in turn: the disk never holds more than the limit plus the bytes arriving.
        var peak: Int64 = 0
        for index in 1...5 {
            #expect(try shell("cmp '\(file(index))' '\(directory.appending("body\(index)"))'").succeeded, "b\(index) read wrong")
            peak = max(peak, try cacheBytesOnDisk(target, except: [keys[0], localKey]))
        }
        #expect(peak <= BodyCacheTests.limit + (512 << 10), "the cache held \(peak) bytes with a limit of \(BodyCacheTests.limit)")
        let status = try JSONParser.parse(Array(try String(contentsOfFile: mount.path(".sofa/status.json"), encoding: .utf8).utf8))
        #expect(status["cache"]?["limit"]?.int64Value == BodyCacheTests.limit, "\(status.jsonString())")
        #expect((status["cache"]?["used_bytes"]?.int64Value ?? .max) <= BodyCacheTests.limit)

        // The least recently read went back to deferred; the latest, the pinned and the local ones stay.
        #expect(try waitUntil(5) { try attribute(file(1), "user.sofa.available") == "false" })
        #expect(try attribute(file(2), "user.sofa.available") == "false")
        #expect(try waitUntil(5) { try attribute(file(5), "user.sofa.available") == "true" })
        #expect(try waitUntil(5) { try attribute(file(0), "user.sofa.available") == "true" })
        let database = try Database.open(at: target)
        #expect(database.blobs.contains(keys[0]) && database.blobs.contains(localKey))

        // An evicted body comes back when read, even under a revision the server never saw.
        #expect(try shell("cmp '\(file(1))' '\(directory.appending("body1"))'").succeeded)

        // A body the server no longer has is not evicted: only this machine has it now.
        #expect(try sofa("rm", sourcePath, "b5").succeeded)
        #expect(try sofa("compact", sourcePath).succeeded)  // its old revision's attachments go
        let shrunk = try sofa("cache", target, "--limit", "0", "--json")
        #expect(shrunk.succeeded, "\(shrunk.stderr)")
        let use = try JSONParser.parse(Array(shrunk.stdout.utf8))
        #expect(use["cached_bodies"]?.int64Value == 1, "\(shrunk.stdout)")
        #expect(use["pinned_bodies"]?.int64Value == 1, "\(shrunk.stdout)")
        #expect(database.blobs.contains(keys[5]) && database.blobs.contains(keys[0]) && database.blobs.contains(localKey))
        #expect(!database.blobs.contains(keys[1]) && !database.blobs.contains(keys[4]))
        #expect(try waitUntil(5) { try attribute(file(4), "user.sofa.available") == "false" })
        #expect(try sofa("info", target).stdout.contains("Pinned:        1 body (1.0 MiB)"))

        // Unpinned, it may go.
        #expect(try shell("setfattr -x user.sofa.pinned '\(file(0))'").succeeded)
        #expect(try attribute(file(0), "user.sofa.pinned") == "false")
        #expect(try sofa("cache", target, "--trim").succeeded)
        #expect(!database.blobs.contains(keys[0]))
        #expect(mount.unmount().succeeded)
    }

    @Test func pinDownloadsTheBodiesNotHereAndUnpinLetsThemGo() throws {
        let (keys, server, target) = try servedDeferredCopy([("doc", "a.bin", "body", 3)])
        defer { _ = server }
        let key = keys[0], file = directory.appending("body")

        #expect(try sofa("pin", target, "doc", "nope").stderr.contains("nope"))
        let pinned = try sofa("pin", target, "doc")
        #expect(pinned.succeeded && pinned.stdout.contains("downloaded 1 body"), "\(pinned.stdout)\(pinned.stderr)")
        let database = try Database.open(at: target)
        #expect(try database.blobs.contains(key) && database.isPinned(digest: key.digestString))
        #expect(try sofa("cache", target, "--limit", "0").succeeded)
        #expect(database.blobs.contains(key))
        #expect(try sofa("unpin", target, "doc", "a.bin").succeeded)
        #expect(try sofa("cache", target, "--trim").succeeded)
        #expect(!database.blobs.contains(key))
        // Gone from here, the body is deferred again and a download brings it back.
        #expect(try sofa("download", target).stdout.contains("downloaded 1 attachment body"))
        #expect(database.blobs.contains(key))
        // Once a revision saved here uses the same bytes as its own (not pushed anywhere), they stay.
        #expect(try sofa("put", target, "mine", "{}").succeeded)
        #expect(try sofa("attach", target, "mine", "copy.bin", file).succeeded)
        #expect(try sofa("cache", target, "--trim").succeeded)
        #expect(database.blobs.contains(key))
        #expect(try sofa("cat-attachment", target, "doc", "a.bin").succeeded)
    }
}
