import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Replicator
import Testing
import TestSupport

/// `sofa pull`, `sofa push` and `sofa sync` against a real `sofa serve` on 127.0.0.1.
@Suite struct ReplicationTests {
    let directory = TemporaryDirectory()

    /// The leaves of every document, with their bodies and attachment hashes: what must match after replication.
    func snapshot(_ db: Database) throws -> [String: String] {
        var result: [String: String] = [:]
        for summary in try db.documents(includeDeleted: true) {
            let tree = try db.revisionTree(of: summary.docID)
            for leaf in tree.leaves {
                let revision = try db.revision(leaf.id, of: summary.docID)
                let attachments = revision.attachments.map { "\($0.name)=\($0.blobKey?.hex ?? "absent"):\($0.length)" }
                result["\(summary.docID) \(leaf.id)"] = JSONValue.object(revision.properties).jsonString(.canonical)
                    + (revision.deleted ? " deleted" : "") + " " + attachments.joined(separator: ",")
            }
        }
        return result
    }

    /// A source with plain documents, an update, a deletion, a conflict and attachments (one of 3 MiB).
    func makeSource(in directory: TemporaryDirectory? = nil) throws -> Database {
        let directory = directory ?? self.directory
        let db = try directory.makeDatabase("source.sofa")
        for i in 0..<30 {
            var draft = try db.newRevision(of: String(format: "doc-%02d", i))
            draft.properties = ["n": .integer(Int64(i)), "text": .string("é 😀 \(i)")]
            try db.save(draft)
        }
        var updated = try db.newRevision(of: "doc-00")
        updated.properties["n"] = 100
        try db.save(updated)
        _ = try db.deleteDocument("doc-01")
        // A conflict: two children of doc-02's first revision.
        let root = try #require(try db.document(withID: "doc-02")?.revID)
        var branch = try db.newRevision(of: "doc-02")
        branch.properties["branch"] = "mine"
        try db.save(branch)
        _ = try db.insert(ReplicatedRevision(docID: "doc-02", revID: RevisionID("2-ffffffffffffffffffffffffffffffff")!, ancestors: [root], properties: ["branch": "other"]))  // wins: the highest id
        var withFiles = try db.newRevision(of: "files")
        try withFiles.setAttachment("notes/readme.txt", data: Array("hello, replication\n".utf8), contentType: "text/plain")
        let big = directory.appending("big.bin")
        try writePatternFile(big, count: 3 << 20)
        try withFiles.setAttachment("big.bin", contentsOf: big)
        try db.save(withFiles)
        return db
    }

    @Test func pullCopiesEverythingAndResumesFromItsCheckpoint() throws {
        let source = try makeSource()
        let server = try ServedDatabases([source.path])
        let url = "http://127.0.0.1:\(server.port)/source"
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)

        // Pages of 10 (three pages are in flight at once): each progress event tells the changes left.
        let first = try sofa("pull", target, url, "--json", "--batch-size", "10")
        #expect(first.succeeded, "\(first.stderr)")
        let events = try first.stdout.split(separator: "\n").map { try JSONParser.parse(Array($0.utf8)) }
        let pending = events.filter { $0["event"] == "progress" }.compactMap { $0["pending"]?.int64Value }
        #expect(pending == [21, 11, 1, 0], "31 changes (30 documents, one of them deleted, and files), 10 a page: \(pending)")
        let summary = try #require(events.last)
        #expect(summary["status"] == "complete")
        #expect(summary["docs_written"] == 32, "30 documents, the second leaf of the conflict, and files")
        #expect(summary["attachments_downloaded"] == 2)
        let pulled = try Database.open(at: target)
        #expect(try snapshot(pulled) == snapshot(source), "same leaves, bodies, tombstones, conflicts and attachment bytes")
        #expect(try pulled.revisionTree(of: "doc-02").conflicts.count == 1)
        #expect(try pulled.check().isEmpty)
        // The checkpoint is saved when the run ends (and every few seconds of a long one), not
        // once a page: one write on each side for the four pages.
        for db in [source, pulled] {
            let checkpoints = try db.localDocumentIDs().compactMap { try db.localDocument(withID: $0) }.filter { $0.body["source_last_seq"] != nil }
            #expect(checkpoints.map(\.rev) == ["0-1"], "\(db.path): \(checkpoints)")
        }

        // Nothing new: nothing read. Then two new documents and a changed one: only those travel,
        // and the unchanged 3 MiB body is not downloaded again.
        let again = try sofa("pull", target, url, "--json")
        #expect(try JSONParser.parse(Array(again.stdout.split(separator: "\n").last!.utf8))["docs_read"] == 0)
        let http = try server.connect()
        #expect(try http.json("PUT", "/source/new-1", ["a": 1]).status == 201)
        #expect(try http.json("PUT", "/source/new-2", ["a": 2]).status == 201)
        let files = try #require(try http.request("GET", "/source/files").json)
        var changed = try #require(files.objectValue)
        changed["edited"] = true
        #expect(try http.json("PUT", "/source/files", .object(changed)).status == 201)
        let third = try sofa("pull", target, url, "--json")
        let incremental = try JSONParser.parse(Array(third.stdout.split(separator: "\n").last!.utf8))
        #expect(incremental["docs_read"] == 3)
        #expect(incremental["attachments_downloaded"] == 0, "unchanged bodies never travel again")
        #expect(try snapshot(Database.open(at: target)) == snapshot(source))
    }

    @Test func pushSendsLocalRevisionsWithTheirAttachments() throws {
        let source = try makeSource()
        let remote = try directory.makeDatabase("remote.sofa")
        let server = try ServedDatabases([remote.path])
        let url = "http://127.0.0.1:\(server.port)/remote"
        let pushed = try sofa("push", source.path, url)
        #expect(pushed.succeeded, "\(pushed.stderr)")
        #expect(pushed.stdout.contains("32 written"))
        #expect(try snapshot(remote) == snapshot(source))

        // A local edit of the attachment document pushes only the changed revision; the big body stays a stub.
        var edit = try source.newRevision(of: "files")
        try edit.setAttachment("notes/readme.txt", data: Array("changed\n".utf8))
        try source.save(edit)
        let again = try sofa("push", source.path, url, "--json")
        #expect(try JSONParser.parse(Array(again.stdout.split(separator: "\n").last!.utf8))["docs_written"] == 1)
        #expect(try snapshot(remote) == snapshot(source))
    }

    @Test func syncBothWaysAndDeferredBodies() throws {
        let source = try makeSource()
        let server = try ServedDatabases([source.path])
        let url = "http://127.0.0.1:\(server.port)/source"
        let local = directory.appending("local.sofa")
        #expect(try sofa("create", local).succeeded)
        #expect(try sofa("put", local, "made-here", #"{"x":1}"#).succeeded)

        // Bodies larger than 1 KiB stay on the server: metadata only here.
        let sync = try sofa("sync", local, url, "--download-attachments-max", "1K")
        #expect(sync.succeeded, "\(sync.stderr)")
        #expect(sync.stdout.contains("1 deferred"))
        let db = try Database.open(at: local)
        let big = try #require(try db.document(withID: "files")?.attachment(named: "big.bin"))
        #expect(!big.contentAvailable)
        #expect(big.length == 3 << 20)
        #expect(try db.document(withID: "files")?.attachment(named: "notes/readme.txt")?.contentAvailable == true)
        let read = try sofa("cat-attachment", local, "files", "big.bin")
        #expect(!read.succeeded)
        #expect(read.stderr.contains("not"), "\(read.stderr)")
        // The local document went up.
        #expect(try server.connect().request("GET", "/source/made-here").json?["x"] == 1)
    }

    @Test func downloadRulesByType() throws {
        let source = try makeSource()
        let server = try ServedDatabases([source.path])
        let target = directory.appending("typed.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, "http://127.0.0.1:\(server.port)/source", "--download-attachments-types", "text/*,image/png")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let files = try #require(try Database.open(at: target).document(withID: "files"))
        #expect(files.attachment(named: "notes/readme.txt")?.contentAvailable == true, "text/plain matches text/*")
        #expect(files.attachment(named: "big.bin")?.contentAvailable == false, "application/octet-stream is deferred")
    }

    @Test func clearErrorsForBadRemotes() throws {
        let remote = try directory.makeDatabase("guarded.sofa")
        let passwordFile = directory.appending("pw")
        try "right\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases([remote.path, "--user", "admin", "--password-file", passwordFile])
        let local = directory.appending("l.sofa")
        #expect(try sofa("create", local).succeeded)

        let anonymous = try sofa("pull", local, "http://127.0.0.1:\(server.port)/guarded")
        #expect(anonymous.status == 1)
        #expect(anonymous.stderr.contains("not authorized"), "\(anonymous.stderr)")
        let wrong = try sofa("pull", local, "http://admin:wrong@127.0.0.1:\(server.port)/guarded")
        #expect(wrong.status == 1)
        #expect(!wrong.stderr.contains("wrong"), "credentials never appear in errors: \(wrong.stderr)")
        let right = try sofa("pull", local, "http://127.0.0.1:\(server.port)/guarded", "--user", "admin", "--password-file", passwordFile)
        #expect(right.succeeded, "\(right.stderr)")

        let missing = try sofa("pull", local, "http://127.0.0.1:\(server.port)/nope", "--user", "admin", "--password-file", passwordFile)
        #expect(missing.stderr.contains("404"), "\(missing.stderr)")
        let refused = try sofa("pull", local, "http://127.0.0.1:1/db")
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("cannot reach"), "\(refused.stderr)")
        #expect(try sofa("pull", local, "ftp://x/db").stderr.contains("not an http(s) or ws(s) database URL"))
    }
}

/// The replicator against a misbehaving network: a proxy of our own between it and `sofa serve`.
@Suite struct ReplicationFaultTests {
    let directory = TemporaryDirectory()

    func setUp() throws -> (source: Database, server: ServedDatabases, proxy: FaultProxy, target: String) {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        return (source, server, proxy, target)
    }

    func pull(_ target: String, _ proxy: FaultProxy, _ extra: String...) throws -> ProcessResult {
        try ChildProcess([sofaBinary, "pull", target, "http://127.0.0.1:\(proxy.port)/source", "--json",
                          "--retries", "4", "--retry-delay", "0.05"] + extra).wait()
    }

    @Test func refusedConnectionsAndResetsAreRetried() throws {
        let (source, server, proxy, target) = try setUp()
        defer { withExtendedLifetime(server) {} }
        proxy.refuseNext(2)
        proxy.resetNext(2, afterBytes: 1 << 20)
        let result = try pull(target, proxy)
        #expect(result.succeeded, "\(result.stderr)")
        #expect(result.stderr.contains("retrying"), "retries are logged")
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source))
        #expect(try Database.open(at: target).check().isEmpty)
    }

    /// A server that accepts and then says nothing: each request gives up after
    /// `--stall-timeout` seconds of silence and is tried `--retries` times, then the pull fails
    /// saying why, and nothing was written. (Without the option, 30 s: CouchDB's.)
    @Test func aSilentServerIsGivenUpOnAfterTheStallTimeout() throws {
        let (_, server, proxy, target) = try setUp()
        defer { withExtendedLifetime(server) {} }
        proxy.stallNext(1000, afterBytes: 0)
        let result = try ChildProcess([sofaBinary, "pull", target, "http://127.0.0.1:\(proxy.port)/source",
                                       "--retries", "2", "--retry-delay", "0.05", "--stall-timeout", "1"]).wait()
        #expect(!result.succeeded)
        #expect(result.stderr.contains("retrying after attempt 1") && result.stderr.contains("nothing received for 1 s (--stall-timeout)"), "\(result.stderr)")
        #expect(try Database.open(at: target).counts().documents == 0)
    }

    /// #28 item 7: the login (`POST /_session`) is retried like any other request.
    @Test func aLoginThatMeetsAResetOrAnEmptyReplyIsRetried() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let passwordFile = directory.appending("password")
        try "pw".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases([source.path, "--user", "admin", "--password-file", passwordFile])
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        // The first two connections, the login's, are closed at once: an empty reply, twice.
        proxy.refuseNext(2)
        let result = try ChildProcess([sofaBinary, "pull", target, "http://admin:pw@127.0.0.1:\(proxy.port)/source",
                                       "--retries", "4", "--retry-delay", "0.05"]).wait()
        #expect(result.succeeded, "\(result.stderr)")
        #expect(result.stderr.contains("retrying"), "\(result.stderr)")
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source))
    }

    @Test func aBodyThatFailsItsDigestIsNeverStored() throws {
        let (_, server, proxy, target) = try setUp()
        defer { withExtendedLifetime(server) {} }
        proxy.replace("hello, replication", with: "HELLO, replication")
        let lied = try pull(target, proxy)
        #expect(lied.status == 1)
        #expect(lied.stderr.contains("does not match its digest"), "\(lied.stderr)")
        let db = try Database.open(at: target)
        #expect(try db.document(withID: "files") == nil, "the document whose body lied is not stored")
        for blob in try FileManager.default.contentsOfDirectory(atPath: "\(target)/attachments") where blob.hasSuffix(".blob") {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: "\(target)/attachments/\(blob)"))
            #expect(!String(decoding: bytes, as: UTF8.self).contains("HELLO"))
        }
    }

    @Test func anInterruptedPullResumesFromItsCheckpoint() throws {
        let (source, server, proxy, target) = try setUp()
        defer { withExtendedLifetime(server) {} }
        // Every answer is cut after 64 KiB: the 3 MiB body never arrives, so the run stops
        // at the batch holding it, after checkpointing the batches before.
        proxy.resetNext(1000, afterBytes: 64 << 10)
        let interrupted = try pull(target, proxy, "--batch-size", "5")
        #expect(interrupted.status == 1)
        let partial = try Database.open(at: target).documents(includeDeleted: true).count
        #expect(partial > 0 && partial < 31, "\(partial) documents before the interruption")
        // The run saved its checkpoint when it failed: on both sides, at the pages it wrote.
        for db in [source, try Database.open(at: target)] {
            let checkpoints = try db.localDocumentIDs().compactMap { try db.localDocument(withID: $0) }.filter { $0.body["source_last_seq"] != nil }
            #expect(checkpoints.count == 1, "\(db.path): \(checkpoints)")
        }

        proxy.behave()
        let resumed = try pull(target, proxy, "--batch-size", "5")
        #expect(resumed.succeeded, "\(resumed.stderr)")
        let summary = try JSONParser.parse(Array(resumed.stdout.split(separator: "\n").last!.utf8))
        #expect((summary["docs_read"]?.int64Value ?? 99) < 32, "resumed from the checkpoint, not from the start")
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source))
    }
}

extension ReplicationFaultTests {
    /// Ctrl-C during a long pull: the pages written stay, the checkpoint is saved where it
    /// stopped (a run saves one only every few seconds), the process says so and exits 130
    /// without waiting for the body still arriving, and the next pull goes on from there.
    @Test func aPullStoppedByCtrlCSavesItsCheckpointAndTheNextGoesOn() throws {
        let (source, server, proxy, target) = try setUp()
        defer { withExtendedLifetime(server) {} }
        proxy.limitRate(64 << 10)  // the 3 MiB body of the last page takes about 48 s
        let output = directory.appending("pull.out")
        let started = Date()
        let child = try ChildProcess([sofaBinary, "pull", target, "http://127.0.0.1:\(proxy.port)/source", "--json",
                                      "--batch-size", "5"], stdout: output)
        #expect(waitUntil(20) { (try? String(contentsOfFile: output, encoding: .utf8))?.contains(#""event":"progress""#) == true })
        child.kill(SIGINT)
        let stopped = child.wait()
        #expect(stopped.status == 130, "\(stopped.stderr)")
        #expect(stopped.stderr.contains("pull stopped by SIGINT") && stopped.stderr.contains("checkpoint saved: the same command again goes on from there"), "\(stopped.stderr)")
        // --json's last line says why and what was done so far, never null.
        let last = try String(contentsOfFile: output, encoding: .utf8).split(separator: "\n").last.map(String.init) ?? ""
        let answer = try JSONParser.parse(Array(last.utf8))
        #expect(answer["error"]?.stringValue == "stopped" && answer["reason"]?.stringValue == "SIGINT", "\(last)")
        #expect((answer["partial"]?["docs_written"]?.int64Value ?? 0) > 0 && answer["partial"]?["partial_body_bytes"]?.int64Value != nil, "\(last)")
        #expect(Date().timeIntervalSince(started) < 30, "stopped without waiting for the body on its way (48 s)")
        let partial = try Database.open(at: target).documents(includeDeleted: true).count
        #expect(partial > 0 && partial < 31, "\(partial) documents before the stop")
        for db in [source, try Database.open(at: target)] {
            let checkpoints = try db.localDocumentIDs().compactMap { try db.localDocument(withID: $0) }.filter { $0.body["source_last_seq"] != nil }
            #expect(checkpoints.count == 1, "\(db.path): \(checkpoints)")
        }

        proxy.limitRate(nil)
        let resumed = try pull(target, proxy)
        #expect(resumed.succeeded, "\(resumed.stderr)")
        let summary = try JSONParser.parse(Array(resumed.stdout.split(separator: "\n").last!.utf8))
        #expect((summary["docs_read"]?.int64Value ?? 99) < 32, "only what had not arrived travels: \(summary)")
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source))
    }
}

/// Deferred bodies: `sofa download`, and reads through a mount that fetch on demand.
@Suite struct DeferredBodyTests {
    let directory = TemporaryDirectory()

    /// A deferred pull of the standard source; returns the target path.
    func deferredCopy(from url: String) throws -> String {
        let target = directory.appending("deferred.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, url, "--no-download-attachments")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(pulled.stdout.contains("2 deferred"))
        return target
    }

    @Test func downloadFetchesDeferredBodiesAndResumesWithARange() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path], logLevel: "debug")
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = try deferredCopy(from: "http://127.0.0.1:\(proxy.port)/source")
        #expect(try sofa("info", target).stdout.contains("Bodies not present: 2"))
        let before = proxy.bytesFromServer

        // The 3 MiB body is cut after 1 MiB once: the retry asks for the rest only.
        proxy.resetNext(1, afterBytes: 1 << 20)
        let download = try ChildProcess([sofaBinary, "download", target, "files", "big.bin", "--retry-delay", "0.05"]).wait()
        #expect(download.succeeded, "\(download.stderr)")
        #expect(download.stdout.contains("downloaded 1 attachment body (3145728 bytes)"))
        // Resumed, not restarted: less than the cut part plus the whole body again, and a Range request.
        let transferred = proxy.bytesFromServer - before
        #expect(transferred < (4 << 20), "\(transferred) bytes")
        #expect(try sofa("info", target).stdout.contains("Bodies not present: 1"))
        #expect(try sofa("download", target).succeeded)
        #expect(try sofa("info", target).stdout.contains("Bodies not present: 0"))
        #expect(try sofa("check", target).succeeded)

        // purge-attachment makes a body deferred again (its blob goes); download brings it back.
        let purged = try sofa("purge-attachment", target, "files", "big.bin")
        #expect(purged.stdout.contains("3145728 bytes freed"), "\(purged.stdout)\(purged.stderr)")
        #expect(try sofa("info", target).stdout.contains("Bodies not present: 1"))
        #expect(try sofa("cat-attachment", target, "files", "big.bin").status == 1)
        #expect(try sofa("download", target).stdout.contains("downloaded 1 attachment body"))
        #expect(try sofa("check", target).succeeded)
        let copy = try Database.open(at: target)
        #expect(try ReplicationTests().snapshot(copy) == ReplicationTests().snapshot(source))
        let log = server.stop().stderr
        #expect(log.range(of: #"GET /source/files/big\.bin\?rev=\S+ \(bytes=[1-9]\d*-\d+\) 206"#, options: .regularExpression) != nil,
                "the retry asked for the rest with a Range: \(log.suffix(2000))")
    }

    /// The partial bodies waiting in `target`'s store: file name and bytes held (they are sparse files).
    func partialDownloads(_ target: String) throws -> [String: Int] {
        let folder = target + "/attachments/tmp"
        var result: [String: Int] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: folder) where name.hasSuffix(".partial") {
            var info = stat()
            result[name] = stat("\(folder)/\(name)", &info) == 0 ? Int(info.st_blocks) * 512 : -1
        }
        return result
    }

    @Test func aFailedOrCancelledDownloadResumesInTheNextRun() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path], logLevel: "debug")
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = try deferredCopy(from: "http://127.0.0.1:\(proxy.port)/source")
        let size = 3 << 20

        // A download that runs out of tries keeps what arrived, and says so.
        proxy.resetNext(1, afterBytes: 1 << 20)
        let failed = try sofa("download", target, "files", "big.bin", "--retries", "1")
        #expect(failed.status == 1 && failed.stderr.contains("download failed") && failed.stderr.contains("will not travel again"),
                "\(failed.stderr)")
        let afterFailure = try partialDownloads(target)
        #expect(afterFailure.count == 1 && afterFailure.values.allSatisfy { $0 > 0 && $0 < size }, "\(afterFailure)")
        #expect(try sofa("info", target).stdout.contains("1 partial)"))

        // Compaction keeps it (a revision waits for that body) and drops one nothing waits for.
        let stray = target + "/attachments/tmp/sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA=.partial"
        try Data(repeating: 7, count: 1000).write(to: URL(fileURLWithPath: stray))
        #expect(try sofa("compact", target).succeeded)
        #expect(!FileManager.default.fileExists(atPath: stray))
        #expect(try partialDownloads(target) == afterFailure)

        // A server that goes silent partway: SIGTERM (a service manager's stop) ends the download
        // at once and keeps every byte; the status is the shell's for SIGTERM, 143, not Ctrl-C's.
        proxy.stallNext(1, afterBytes: 1 << 20)
        let stalledAt = proxy.bytesFromServer
        let download = try ChildProcess([sofaBinary, "download", target, "files", "big.bin"])
        #expect(waitUntil(20) { proxy.bytesFromServer - stalledAt >= 1 << 20 })
        download.kill(SIGTERM)
        let cancelled = download.wait()
        #expect(cancelled.status == 143 && cancelled.stderr.contains("download stopped by SIGTERM"), "\(cancelled.status) \(cancelled.stderr)")
        let afterCancel = try partialDownloads(target)
        #expect(afterCancel.keys == afterFailure.keys && afterCancel.values.allSatisfy { $0 > afterFailure.values.first! }, "\(afterCancel)")

        // The next run asks only for the rest.
        proxy.behave()
        let resumeStart = proxy.bytesFromServer
        let resumed = try sofa("download", target, "files", "big.bin")
        #expect(resumed.stdout.contains("downloaded 1 attachment body"), "\(resumed.stdout)\(resumed.stderr)")
        let kept = afterCancel.values.first ?? 0
        let transferred = proxy.bytesFromServer - resumeStart
        // At most the chunk the stall cut through travels again (its bytes here are not a whole chunk), and headers.
        #expect(transferred < size - kept + (32 << 10), "\(transferred) bytes for the \(size - kept) missing")
        #expect(try partialDownloads(target).isEmpty)
        #expect(try sofa("download", target).stdout.contains("downloaded 1 attachment body (19 bytes)"))
        #expect(try sofa("check", target).succeeded)
        let copy = try Database.open(at: target)
        #expect(try ReplicationTests().snapshot(copy) == ReplicationTests().snapshot(source))
        let log = server.stop().stderr
        let ranges = log.matches(of: try Regex(#"GET /source/files/big\.bin\?rev=\S+ \(bytes=[1-9]\d*-\d+\) 206"#)).count
        #expect(ranges == 2, "the two later runs each asked for the rest with a Range; saw \(ranges)")
    }

    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func readingADeferredBodyThroughTheMountFetchesItOnce() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path], logLevel: "debug")
        let proxy = try FaultProxy(upstreamPort: server.port)
        let target = try deferredCopy(from: "http://127.0.0.1:\(proxy.port)/source")
        let pulled = proxy.bytesFromServer
        let mount = try MountedDatabase(target)
        let path = mount.path("docs/files/attachments/big.bin")
        #expect(try shell("getfattr --only-values -n user.sofa.available '\(path)'").stdout == "false")
        // Eight readers at once: one transfer; everyone gets the right bytes.
        let expected = try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)
        let readers = try (0..<8).map { _ in try ChildProcess(["/bin/sh", "-c", "sha1sum '\(path)'"]) }
        for reader in readers {
            let result = reader.wait()
            #expect(result.succeeded, "\(result.stderr)")
            #expect(result.stdout.hasPrefix(expected))
        }
        #expect(try shell("head -c 19 '\(mount.path("docs/files/attachments/notes/readme.txt"))'").stdout == "hello, replication\n")
        // The body is installed just after the last reader got its bytes.
        #expect(try waitUntil { try shell("getfattr --only-values -n user.sofa.available '\(path)'").stdout == "true" })
        #expect(mount.unmount().succeeded)
        // Each chunk travelled once: the body's bytes, and the headers of the few ranged requests
        // of the readahead's ramp (64 KiB, doubling to 4 MiB, then the rest in one).
        let sent = proxy.bytesFromServer - pulled
        #expect(sent >= 3 << 20 && sent < (3 << 20) + 64 << 10, "\(sent) bytes sent for a 3 MiB body read by eight readers")
        _ = server.stop()
        #expect(try sofa("info", target).stdout.contains("Bodies not present: 0"))
    }

    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func anUnreachableRemoteFailsReadsWithEIOAfterABoundedWaitAndWorksWhenItReturns() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let port = server.port
        let target = try deferredCopy(from: "http://127.0.0.1:\(port)/source")
        server.stop()
        let mount = try MountedDatabase(target, arguments: ["--fetch-timeout", "2"])
        let started = Date()
        let path = mount.path("docs/files/attachments/big.bin")
        let read = try shell("cat '\(path)' > /dev/null")
        #expect(!read.succeeded)
        #expect(read.stderr.contains("Input/output error"), "\(read.stderr)")
        #expect(Date().timeIntervalSince(started) < 15, "bounded wait")

        // The remote returns: the next read fetches the body.
        let back = try ServedDatabases([source.path, "--port", String(port)])
        defer { withExtendedLifetime(back) {} }
        let expected = try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)
        #expect(try shell("sha1sum '\(path)'").stdout.hasPrefix(expected))
        #expect(mount.unmount().succeeded)
    }
}

/// `sofa mount --remote URL --sync --continuous`: the mount as a live replica.
@Suite struct SyncedMountTests {
    let directory = TemporaryDirectory()

    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func editsGoBothWaysAndSurviveTheRemoteGoingAway() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        var server = try ServedDatabases([source.path])
        let port = server.port
        let url = "http://127.0.0.1:\(port)/source"
        let local = directory.appending("replica.sofa")
        #expect(try sofa("create", local).succeeded)
        let mount = try MountedDatabase(local, arguments: ["--remote", url, "--sync", "--continuous", "--no-download-attachments"])

        // The remote's documents appear; their big bodies are fetched only when read.
        #expect(waitUntil { FileManager.default.fileExists(atPath: mount.path("docs/doc-29/properties.json")) })
        #expect(try shell("sha1sum '\(mount.path("docs/files/attachments/big.bin"))'").stdout
                .hasPrefix(try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)))
        let status = try JSONParser.parse([UInt8](try Data(contentsOf: URL(fileURLWithPath: mount.path(".sofa/status.json")))))
        #expect(["idle", "busy"].contains(status["replication"]?["state"]?.stringValue ?? ""), "\(status)")

        // An edit in the mount goes up; an edit on the remote comes down into the mount.
        #expect(try shell("mkdir '\(mount.path("docs/from-mount"))' && echo '{\"made\":\"in the mount\"}' > '\(mount.path("docs/from-mount/properties.json"))'").succeeded)
        // (Bounds, not timings: the ThreadSanitizer pass runs every suite at once, mount and server included.)
        #expect(try waitUntil(30) { try server.connect().request("GET", "/source/from-mount").json?["made"] == "in the mount" })
        #expect(try server.connect().json("PUT", "/source/from-remote", ["made": "remotely"]).status == 201)
        #expect(try waitUntil(30) { (try? String(contentsOfFile: mount.path("docs/from-remote/properties.json"), encoding: .utf8))?.contains("remotely") == true })

        // The remote goes away: edits keep working and wait; status says offline; they go out on its return.
        server.stop()
        #expect(try shell("echo '{\"made\":\"offline\"}' > '\(mount.path("docs/from-mount/properties.json"))'").succeeded)
        #expect(try waitUntil(15) {
            let text = try String(contentsOfFile: mount.path(".sofa/status.json"), encoding: .utf8)
            return text.contains("\"offline\"")
        })
        server = try ServedDatabases([source.path, "--port", String(port)])
        #expect(try waitUntil(45) { try server.connect().request("GET", "/source/from-mount").json?["made"] == "offline" })
        // Recovered: the error is history, not a current one.
        #expect(try waitUntil(15) {
            let status = try JSONParser.parse([UInt8](try Data(contentsOf: URL(fileURLWithPath: mount.path(".sofa/status.json")))))
            return status["replication"]?["last_error"] == .null && status["replication"]?["recovered_error"]?.stringValue != nil
        })
        #expect(mount.unmount().succeeded)
    }

    /// A save made while a continuous push is busy (after it read the changes) goes out
    /// with the next pass, not with the next save after it.
    @Test func aSaveDuringAPushPassGoesOutWithoutAnotherSave() throws {
        let local = try directory.makeDatabase("local.sofa")
        var big = try local.newRevision(of: "big")
        let file = directory.appending("big.bin")
        try writePatternFile(file, count: 2 << 20)
        try big.setAttachment("big.bin", contentsOf: file)
        try local.save(big)
        let remote = try directory.makeDatabase("remote.sofa")
        let server = try ServedDatabases([remote.path])
        let proxy = try FaultProxy(upstreamPort: server.port)
        proxy.limitRate(1 << 20)  // the 2 MiB body takes two seconds to go up
        let session = ReplicationSession(database: local, remote: try RemoteDatabase("http://127.0.0.1:\(proxy.port)/remote"),
                                         directions: [.push], continuous: true)
        session.start()
        defer { session.stop(); session.wait() }
        Thread.sleep(forTimeInterval: 0.5)
        var late = try local.newRevision(of: "late")
        late.properties = ["saved": "during the pass"]
        try local.save(late)
        try #require(try server.connect().request("GET", "/remote/big").status == 404, "the first pass was still running")
        #expect(try waitUntil(30) { try server.connect().request("GET", "/remote/late").status == 200 })
    }
}

/// The body downloader against CouchDB 3.4.3's own bytes (../shared/fixtures): an MD5
/// digest of identity bytes, and a `text/*` body CouchDB stores gzip-compressed, whose
/// digest is the MD5 of the gzip stream and which arrives gzip-encoded.
@Suite struct CouchDBBodyTests {
    static let fixtures = fixturesDirectory + "/couchdb-3.4.3/client-source"

    /// ETag (the digest without `md5-`), Content-Length and body of a recorded response.
    func recorded(_ file: String) throws -> (digest: String, length: Int64, body: [UInt8]) {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(Self.fixtures)/\(file)")))
        let split = try #require(bytes.firstRange(of: Array("\r\n\r\n".utf8)))
        let head = String(decoding: bytes[..<split.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let value = { (name: String) in head.first { $0.lowercased().hasPrefix(name + ":") }?.split(separator: ":", maxSplits: 1)[1].trimmingCharacters(in: .whitespaces) }
        return ("md5-" + (value("etag") ?? "").trimmingCharacters(in: CharacterSet(charactersIn: "\"")),
                Int64(value("content-length") ?? "") ?? -1, Array(bytes[split.upperBound...]))
    }

    @Test func downloadsCouchDBBodiesAndChecksTheirDigests() throws {
        try #require(FileManager.default.fileExists(atPath: Self.fixtures), "fixtures not found at \(Self.fixtures)")
        let server = try ReplayServer(responses: [
            "GET /fixture-src/att-text/hello.txt": "\(Self.fixtures)/047-att-get-text-accept-gzip.response",
            "GET /fixture-src/att-binary/image.png": "\(Self.fixtures)/038-att-get-binary-full.response",
            "GET /fixture-src/big/big.bin": "\(Self.fixtures)/052-att-get-big-full.response",
        ])
        let text = try recorded("046-att-get-text-identity.response")
        let gzip = try recorded("047-att-get-text-accept-gzip.response")
        let png = try recorded("038-att-get-binary-full.response")
        let big = try recorded("052-att-get-big-full.response")
        #expect(gzip.digest == text.digest, "one digest, of the gzip bytes")

        // A local copy that knows these attachments by metadata only, as a deferred pull leaves it.
        let directory = TemporaryDirectory()
        let db = try directory.makeDatabase("deferred.sofa")
        func stub(_ name: String, _ type: String, _ recorded: (digest: String, length: Int64, body: [UInt8]), identityLength: Int64) -> DocumentStore.Attachment {
            DocumentStore.Attachment(name: name, contentType: type, length: identityLength, digest: recorded.digest, blobKey: nil, revpos: 1)
        }
        try db.insert(ReplicatedRevision(docID: "att-text", revID: RevisionID("1-d857e59ce77709f7189804bbc0d8c37f")!, ancestors: [],
                                         properties: ["type": "attachment-text"],
                                         attachments: [stub("hello.txt", "text/plain", gzip, identityLength: text.length)]))
        try db.insert(ReplicatedRevision(docID: "att-binary", revID: RevisionID("2-3bfd06bd63102a8fd247006741ee6387")!, ancestors: [],
                                         properties: [:], attachments: [stub("image.png", "image/png", png, identityLength: png.length)]))
        try db.insert(ReplicatedRevision(docID: "big", revID: RevisionID("1-955e240b7f5bb9d9ff1d72653193c33b")!, ancestors: [],
                                         properties: [:], attachments: [stub("big.bin", "application/octet-stream", big, identityLength: big.length)]))
        #expect(try db.missingBodies().count == 3)

        let result = try sofa("download", db.path, "--remote", "http://127.0.0.1:\(server.port)/fixture-src")
        #expect(result.succeeded, "\(result.stderr)")
        #expect(result.stdout.contains("downloaded 3 attachment bodies"))
        #expect(try db.missingBodies().isEmpty)
        #expect(try db.check().isEmpty)
        // Stored decoded: the text body is the identity bytes CouchDB serves without gzip.
        #expect(try db.blobs.contents(of: #require(db.document(withID: "att-text")?.attachment(named: "hello.txt")?.blobKey)) == text.body)
        #expect(try db.blobs.contents(of: #require(db.document(withID: "att-binary")?.attachment(named: "image.png")?.blobKey)) == png.body)
        #expect(server.requests.contains { $0.hasPrefix("GET /fixture-src/att-text/hello.txt?rev=1-d857e59ce77709f7189804bbc0d8c37f") })
    }

    @Test func aCouchDBBodyWithTheWrongDigestIsRefused() throws {
        try #require(FileManager.default.fileExists(atPath: Self.fixtures), "fixtures not found at \(Self.fixtures)")
        let server = try ReplayServer(responses: ["GET /fixture-src/att-binary/image.png": "\(Self.fixtures)/038-att-get-binary-full.response"])
        let png = try recorded("038-att-get-binary-full.response")
        let directory = TemporaryDirectory()
        let db = try directory.makeDatabase("deferred.sofa")
        // Metadata claiming another body (the big attachment's digest) for these bytes.
        let big = try recorded("052-att-get-big-full.response")
        try db.insert(ReplicatedRevision(docID: "att-binary", revID: RevisionID("2-3bfd06bd63102a8fd247006741ee6387")!, ancestors: [],
                                         properties: [:], attachments: [DocumentStore.Attachment(name: "image.png", contentType: "image/png", length: png.length,
                                                                                    digest: big.digest, blobKey: nil, revpos: 1)]))
        let result = try sofa("download", db.path, "--remote", "http://127.0.0.1:\(server.port)/fixture-src", "--retries", "2", "--retry-delay", "0.01")
        #expect(result.status == 1)
        #expect(result.stderr.contains("does not match its digest"), "\(result.stderr)")
        #expect(try db.missingBodies().count == 1)
        let blobs = try FileManager.default.contentsOfDirectory(atPath: db.path + "/attachments").filter { $0.hasSuffix(".blob") }
        #expect(blobs.isEmpty, "the refused body is not in the blob store: \(blobs)")
    }
}

/// Sync between two replicas editing the same documents.
@Suite struct ConflictingSyncTests {
    let directory = TemporaryDirectory()

    @Test func concurrentEditsConflictAndResolveTheSameWayOnBothSides() throws {
        let remote = try directory.makeDatabase("remote.sofa")
        let server = try ServedDatabases([remote.path], logLevel: "debug")
        let url = "http://127.0.0.1:\(server.port)/remote"
        let local = directory.appending("local.sofa")
        #expect(try sofa("create", local).succeeded)
        let blob = directory.appending("photo.bin")
        // Over ReplicatorTuning.largestInlineBody, so that a push carrying it is a multipart PUT the log shows.
        try writePatternFile(blob, count: 1_500_000)
        #expect(try sofa("put", local, "shared", #"{"v":0}"#).succeeded)
        #expect(try sofa("attach", local, "shared", "photo.bin", blob).succeeded)
        #expect(try sofa("sync", local, url).succeeded)

        // Both sides edit the same document while apart.
        let http = try server.connect()
        let current = try #require(try http.request("GET", "/remote/shared").json?.objectValue)
        var remoteEdit = current
        remoteEdit["v"] = "remote"
        #expect(try http.json("PUT", "/remote/shared", .object(remoteEdit)).status == 201)
        let localDB = try Database.open(at: local)
        var localEdit = try localDB.newRevision(of: "shared")
        localEdit.properties["v"] = "local"
        try localDB.save(localEdit)

        let sync = try sofa("sync", local, url, "--json")
        #expect(sync.succeeded, "\(sync.stderr)")
        let localTree = try localDB.revisionTree(of: "shared")
        let remoteTree = try remote.revisionTree(of: "shared")
        #expect(localTree.conflicts.count == 1)
        #expect(localTree.winner?.id == remoteTree.winner?.id, "the same winner on both sides")
        #expect(Set(localTree.leaves.map(\.id)) == Set(remoteTree.leaves.map(\.id)))

        // Nothing changed since: a second sync moves no document.
        let quiet = try sofa("sync", local, url, "--json")
        let summaries = quiet.stdout.split(separator: "\n").compactMap { try? JSONParser.parse(Array($0.utf8)) }.filter { $0["status"] != nil }
        #expect(summaries.count == 2)
        #expect(summaries.allSatisfy { $0["docs_read"] == 0 && $0["docs_written"] == 0 }, "\(quiet.stdout)")

        // A properties-only edit keeps its attachment: the push sends no attachment bytes.
        var edit = try localDB.newRevision(of: "shared")
        edit.properties["v"] = "edited again"
        try localDB.save(edit)
        #expect(try sofa("push", local, url).succeeded)
        let log = server.stop().stderr
        let multipartPuts = log.components(separatedBy: "PUT /remote/shared?new_edits=false").count - 1
        #expect(multipartPuts == 1, "only the first push carried the photo: \(multipartPuts)")
        #expect(try remote.document(withID: "shared")?.properties["v"] == "edited again")
    }
}

/// Filtered replication: a Mango selector both ways, Sync Gateway channels on pulls.
@Suite struct FilteredReplicationTests {
    let directory = TemporaryDirectory()

    @Test func aSelectorFiltersPullsAtTheServerAndPushesHere() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let url = "http://127.0.0.1:\(server.port)/source"
        let target = directory.appending("even.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, url, "--selector", #"{"n":{"$mod":[2,0],"$lt":10}}"#)
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let ids = try Database.open(at: target).documents().map(\.docID)
        // doc-00 is n=100 after its update; doc-02's winning revision is the conflict branch without n.
        #expect(ids == ["doc-04", "doc-06", "doc-08"])

        // Pushing back with another selector sends only what matches.
        let local = try Database.open(at: target)
        var draft = try local.newRevision(of: "doc-04")
        draft.properties["flag"] = true
        try local.save(draft)
        var other = try local.newRevision(of: "doc-06")
        other.properties["flag"] = false
        try local.save(other)
        let pushed = try sofa("push", target, url, "--selector", #"{"flag":true}"#, "--json")
        let summary = try JSONParser.parse(Array(pushed.stdout.split(separator: "\n").last!.utf8))
        #expect(summary["docs_written"] == 1, "\(pushed.stdout)")
        #expect(try source.document(withID: "doc-04")?.properties["flag"] == true)
        #expect(try source.document(withID: "doc-06")?.properties["flag"] == nil)

        let bad = try sofa("pull", target, url, "--selector", #"{"n":{"$foo":1}}"#)
        #expect(bad.status == 1)
        #expect(bad.stderr.contains("Invalid operator: $foo"), "\(bad.stderr)")
    }

    @Test func channelsAskSyncGatewaysFilter() throws {
        let changes = directory.appending("changes.response")
        let body = #"{"results":[],"last_seq":"7"}"# + "\n"
        try ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body)
            .write(toFile: changes, atomically: true, encoding: .utf8)
        let info = directory.appending("info.response")
        let infoBody = #"{"db_name":"sg","update_seq":7}"# + "\n"
        try ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(infoBody.utf8.count)\r\n\r\n" + infoBody)
            .write(toFile: info, atomically: true, encoding: .utf8)
        let gateway = try ReplayServer(responses: ["GET /sg": info, "GET /sg/_changes": changes])
        // The feed moved to "7" (all of it filtered out): that progress is checkpointed.
        gateway.respond(to: "PUT", pathPrefix: "/sg/_local/") { _, _ in
            ReplayServer.jsonResponse("201 Created", Array(#"{"ok":true,"id":"_local/x","rev":"0-1"}"#.utf8))
        }
        let target = directory.appending("channels.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, "http://127.0.0.1:\(gateway.port)/sg", "--channels", "news,sports")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(gateway.requests.contains { $0.hasPrefix("GET /sg/_changes?") && $0.contains("filter=sync_gateway/bychannel&channels=news,sports") },
                "\(gateway.requests)")
        #expect(gateway.requests.contains { $0.hasPrefix("PUT /sg/_local/") }, "\(gateway.requests)")
    }
}

/// TLS through libcurl: verification on by default, `--cacert` for a private CA.
@Suite struct TLSReplicationTests {
    let directory = TemporaryDirectory()

    @Test func verifiesTheServerAndTrustsAGivenCA() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let certificate = directory.appending("cert.pem"), key = directory.appending("key.pem")
        let made = try shell("openssl req -x509 -newkey rsa:2048 -nodes -keyout \(key) -out \(certificate) -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>&1")
        try #require(made.succeeded, "\(made.stdout)")
        // socat terminates TLS on a free port and forwards to sofa serve.
        let probe = try FaultProxy(upstreamPort: server.port)  // only to borrow a free port number
        let port = probe.port
        probe.close()
        let tls = try ChildProcess(["/usr/bin/socat", "OPENSSL-LISTEN:\(port),bind=127.0.0.1,reuseaddr,fork,cert=\(certificate),key=\(key),verify=0",
                                    "TCP:127.0.0.1:\(server.port)"])
        defer {
            tls.kill(SIGTERM)
            _ = tls.wait()
        }
        #expect(waitUntil { (try? HTTPConnection(port: port)) != nil }, "socat listens")
        let url = "https://127.0.0.1:\(port)/source"
        let target = directory.appending("tls.sofa")
        #expect(try sofa("create", target).succeeded)

        let untrusted = try sofa("pull", target, url, "--retries", "1")
        #expect(untrusted.status == 1)
        #expect(untrusted.stderr.lowercased().contains("certificate"), "\(untrusted.stderr)")
        let trusted = try sofa("pull", target, url, "--cacert", certificate, "--no-download-attachments")
        #expect(trusted.succeeded, "\(trusted.stderr)")

        // Deferred bodies come over the same TLS: sofa download, and reads in a (background) mount.
        let untrustedDownload = try sofa("download", target, "--retries", "1")
        #expect(untrustedDownload.status == 1 && untrustedDownload.stderr.lowercased().contains("certificate"), "\(untrustedDownload.stderr)")
        #expect(try sofa("download", target, "files", "notes/readme.txt", "--cacert", certificate).succeeded)
        if isRoot {
            let mountPoint = directory.appending("mnt")
            try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
            let mounted = try sofa("mount", target, mountPoint, "--remote", url, "--cacert", certificate)
            #expect(mounted.succeeded, "\(mounted.stderr)")
            let expected = try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)
            let read = try shell("sha1sum \(mountPoint)/docs/files/attachments/big.bin")
            _ = try shell("fusermount3 -u \(mountPoint)")
            #expect(read.stdout.hasPrefix(expected), "\(read.stdout)\(read.stderr)")
        }
        #expect(try sofa("download", target, "--cacert", certificate).succeeded)
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source))
    }
}

/// A pull from CouchDB 3.4.3 itself, as recorded: its `_changes` (opaque string sequences),
/// its `_bulk_get` answers to CouchDB's own replicator, its attachment bodies.
@Suite struct CouchDBPullTests {
    static let root = fixturesDirectory + "/couchdb-3.4.3"

    static func body(_ file: String) throws -> [UInt8] {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(root)/\(file)")))
        return Array(bytes[bytes.firstRange(of: Array("\r\n\r\n".utf8))!.upperBound...])
    }

    /// A replay of CouchDB as a source; without `_bulk_get`, documents answer `open_revs` instead.
    static func couchDB(bulkGet: Bool) throws -> ReplayServer {
        let source = "\(Self.root)/client-source"
        let server = try ReplayServer(responses: [
            "GET /fixture-src": "\(source)/002-get-db-info.response",
            "GET /fixture-src/_changes": "\(source)/004-changes-normal-all-docs-since-0.response",
            "GET /fixture-src/att-text/hello.txt": "\(source)/047-att-get-text-accept-gzip.response",
            "GET /fixture-src/att-binary/image.png": "\(source)/038-att-get-binary-full.response",
            "GET /fixture-src/att-slash/sub/dir/notes.txt": "\(source)/050-att-get-slash-name-literal.response",
            "GET /fixture-src/big/big.bin": "\(source)/052-att-get-big-full.response",
        ])
        // _bulk_get: CouchDB's answers to its own replicator, merged, for the ids asked.
        var recorded: [String: [JSONValue]] = [:]
        for file in ["replicator-pull/010-post-bulk-get.response", "replicator-pull/012-post-bulk-get.response"] {
            for result in try JSONParser.parse(Self.body(file))["results"]?.arrayValue ?? [] {
                recorded[result["id"]!.stringValue!, default: []] += result["docs"]?.arrayValue ?? []
            }
        }
        recorded["_design/app"] = [["ok": try JSONParser.parse(Self.body("client-source/037-get-design-doc.response"))]]
        let answers = recorded
        if bulkGet {
            server.respond(to: "POST", pathPrefix: "/fixture-src/_bulk_get") { _, body in
                let asked = Set(((try? JSONParser.parse(body))?["docs"]?.arrayValue ?? []).compactMap { $0["id"]?.stringValue })
                let results: [JSONValue] = asked.sorted().map { id in ["id": .string(id), "docs": .array(answers[id] ?? [])] }
                return ReplayServer.jsonResponse("200 OK", JSONValue.object(["results": .array(results)]).serialized())
            }
        } else {
            // GET /fixture-src/<id>?open_revs=["rev"]&revs=true&latest=true → [{"ok": doc}]
            server.respond(to: "GET", pathPrefix: "/fixture-src/") { target, _ in
                guard target.contains("open_revs=") else { return nil }
                let path = target.split(separator: "?")[0].dropFirst("/fixture-src/".count)
                guard let id = String(path).removingPercentEncoding, let docs = answers[id],
                      let query = target.split(separator: "?").last, let revs = query.split(separator: "&").first(where: { $0.hasPrefix("open_revs=") }),
                      let wanted = String(revs.dropFirst("open_revs=".count)).removingPercentEncoding else { return nil }
                let asked = Set((try? JSONParser.parse(Array(wanted.utf8)))?.arrayValue?.compactMap(\.stringValue) ?? [])
                let matching = docs.filter { asked.contains($0["ok"]?["_rev"]?.stringValue ?? "") }
                return ReplayServer.jsonResponse("200 OK", JSONValue.array(matching).serialized())
            }
        }
        let checkpoint = try Self.body("client-source/056-local-put-new.response")
        server.respond(to: "PUT", pathPrefix: "/fixture-src/_local/") { _, _ in ReplayServer.jsonResponse("201 Created", checkpoint) }
        return server
    }

    @Test func withoutBulkGetRevisionsComeOneByOneWithOpenRevs() throws {
        try #require(FileManager.default.fileExists(atPath: Self.root + "/README.md"), "fixtures not found at \(Self.root)")
        let server = try Self.couchDB(bulkGet: false)
        let directory = TemporaryDirectory()
        let target = directory.appending("no-bulk-get.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, "http://127.0.0.1:\(server.port)/fixture-src", "--no-download-attachments", "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        #expect(try JSONParser.parse(Array(pulled.stdout.split(separator: "\n").last!.utf8))["docs_written"] == 14)
        #expect(server.requests.filter { $0.contains("open_revs=") }.count == 14, "one GET per revision after the 404")
        #expect(try Database.open(at: target).revisionTree(of: "conflicted").leaves.count == 2)
    }

    @Test func pullsTheScenarioWithItsRevisionsNumbersAndBodies() throws {
        try #require(FileManager.default.fileExists(atPath: Self.root + "/README.md"), "fixtures not found at \(Self.root)")
        let server = try Self.couchDB(bulkGet: true)

        let directory = TemporaryDirectory()
        let target = directory.appending("from-couchdb.sofa")
        #expect(try sofa("create", target).succeeded)
        let url = "http://127.0.0.1:\(server.port)/fixture-src"
        let pulled = try sofa("pull", target, url, "--no-download-attachments", "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let summary = try JSONParser.parse(Array(pulled.stdout.split(separator: "\n").last!.utf8))
        #expect(summary["docs_written"] == 14, "13 documents, one with two leaves: \(summary)")
        #expect(summary["last_seq"]?.stringValue?.hasPrefix("20-g1AAAA") == true, "CouchDB's opaque sequence kept as is")

        // The same revisions as CouchDB's _changes listed, conflicts and tombstone included.
        let db = try Database.open(at: target)
        let changes = try JSONParser.parse(Self.body("client-source/004-changes-normal-all-docs-since-0.response"))
        for row in changes["results"]?.arrayValue ?? [] {
            let id = row["id"]!.stringValue!
            let leaves = Set(try db.revisionTree(of: id).leaves.map(\.id.description))
            #expect(leaves == Set(row["changes"]!.arrayValue!.compactMap { $0["rev"]?.stringValue }), "\(id)")
        }
        #expect(try db.currentRevision(of: "deleted-doc")?.deleted == true)
        #expect(try db.revisionTree(of: "conflicted").winner?.id.description.hasPrefix("3-764860a0") == true)
        let nested = try #require(try db.document(withID: "nested"))
        #expect(JSONValue.object(nested.properties).jsonString().contains("18446744073709551615"), "integers of any size kept")
        #expect(try db.document(withID: "unicode-ünïcødé-文档-🚀") != nil)
        #expect(try db.document(withID: "folder/sub/doc") != nil)
        #expect(try db.document(withID: "att-text")?.attachment(named: "hello.txt")?.digest == "md5-RDofGnyO+gqFEboJNt2ARg==")

        // The deferred bodies come from CouchDB's recorded answers, checked against its MD5 digests.
        for id in ["att-text", "att-binary", "big"] {
            let download = try sofa("download", target, id)
            #expect(download.succeeded, "\(id): \(download.stderr)")
        }
        // notes.txt was recorded without Accept-Encoding: gzip, so its bytes are the identity form of a
        // body whose digest is the MD5 of CouchDB's gzip stream: they cannot be checked, and are refused.
        let unverifiable = try sofa("download", target, "att-slash", "--retries", "1")
        #expect(unverifiable.status == 1)
        #expect(unverifiable.stderr.contains("does not match its digest"))
        #expect(Set(try db.missingBodies().map(\.docID)) == ["att-slash", "att-two"])
        #expect(try db.check().isEmpty)
        #expect(try db.blobs.contents(of: #require(db.document(withID: "att-text")?.attachment(named: "hello.txt")?.blobKey))
                == Self.body("client-source/046-att-get-text-identity.response"))
        #expect(server.requests.contains { $0.hasPrefix("PUT /fixture-src/_local/") }, "the checkpoint went to the source")
    }
}

/// The normalised remote URL that replication ids are made from.
@Suite struct RemoteURLTests {
    @Test func defaultPortsAreExplicitAndCredentialsGone() throws {
        #expect(try RemoteDatabase("http://Host.example/db").url == "http://host.example:80/db")
        #expect(try RemoteDatabase("http://host.example:80/db/").url == RemoteDatabase("http://host.example/db").url)
        #expect(try RemoteDatabase("https://host.example/db").url == RemoteDatabase("https://host.example:443/db").url)
        #expect(try RemoteDatabase("https://host.example/db").url != RemoteDatabase("http://host.example/db").url)
        let secret = try RemoteDatabase("http://ann:s%40cret@host.example:5984/db")
        #expect(secret.url == "http://host.example:5984/db")
        #expect(secret.user == "ann" && secret.password == "s@cret")
        #expect(!secret.description.contains("cret"))
        #expect(throws: SofaError.self) { try RemoteDatabase("http://host.example/") }
        #expect(throws: SofaError.self) { try RemoteDatabase("ftp://host.example/db") }
    }
}

extension ReplicationTests {
    /// A pull that runs out of disk (#30): the documents that fit are committed, those that do
    /// not are named with the reason, their bodies leave nothing behind, the checkpoint stays
    /// before the first that failed, and with room again the next pull brings the rest. (A pull
    /// used to commit nothing and leave every downloaded body unreferenced until a compaction.)
    @Test func aPullThatRunsOutOfDiskKeepsWhatFitAndLeavesNoOrphanBody() throws {
        #expect(isRoot, "this test mounts a tmpfs and needs root")
        let source = try directory.makeDatabase("source.sofa")
        let body = directory.appending("big.bin")
        for (index, id) in (0..<33).map({ $0 % 11 == 10 ? "big-\($0 / 11)" : String(format: "small-%02d", $0) }).enumerated() {
            var draft = try source.newRevision(of: id)
            draft.properties = ["n": .integer(Int64(index))]
            if id.hasPrefix("big") {
                try writePatternFile(body, count: Int64((3 << 19) + index))  // 1.5 MiB, each its own
                try draft.setAttachment("body.bin", contentsOf: body)
            }
            try source.save(draft)
        }
        let server = try ServedDatabases([source.path])
        let small = directory.appending("small-disk")
        #expect(try shell("mkdir -p '\(small)' && mount -t tmpfs -o size=4m tmpfs '\(small)'").succeeded)
        defer { _ = try? shell("umount -l '\(small)'") }
        let target = small + "/target.sofa"
        #expect(try sofa("create", target).succeeded)
        let url = "http://127.0.0.1:\(server.port)/source"

        let first = try sofa("pull", target, url)
        #expect(!first.succeeded)
        #expect(first.stderr.contains("disk_full") && first.stderr.contains("no space left on device"), "\(first.stderr)")
        let pulled = try Database.open(at: target)
        let ids = try pulled.documents().map(\.docID)
        #expect(ids.filter { $0.hasPrefix("small") }.count == 30, "every small document fits and is kept: \(ids)")
        #expect(ids.contains("big-0") && !ids.contains("big-2"), "\(ids)")
        // No body without its document, no temporary file.
        let stored = try FileManager.default.contentsOfDirectory(atPath: pulled.blobs.directory).filter { $0.hasSuffix(".blob") }
        let referenced = try Set(ids.flatMap { try pulled.document(withID: $0)?.attachments.compactMap(\.blobKey?.hex) ?? [] })
        #expect(Set(stored.map { String($0.dropLast(5)) }) == referenced, "\(stored) \(referenced)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: pulled.blobs.directory + "/tmp").isEmpty)
        #expect(try sofa("check", target).succeeded)
        // Room again: the next pull brings what did not fit, and the two databases are the same.
        #expect(try shell("mount -o remount,size=64m '\(small)'").succeeded)
        let second = try sofa("pull", target, url)
        #expect(second.succeeded, "\(second.stderr)")
        #expect(try snapshot(Database.open(at: target)) == snapshot(source))
    }
}
