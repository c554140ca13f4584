import DocumentModel
import DocumentStore
import Foundation
import Replicator
import Testing
import TestSupport
import ZIPFoundation

/// Pre-built databases: snapshots in zips, copies with new identities that find their
/// originals' checkpoints, `sofa cp` in every direction, `sofa mount --seed`.
@Suite struct PrebuiltDatabaseTests {
    let directory = TemporaryDirectory()

    /// `sofa pull DB URL --json`: how many documents it read.
    func pull(_ database: String, _ url: String, _ options: String...) throws -> Int? {
        let pulled = try sofa(["pull", database, url, "--json"] + options)
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let summary = pulled.stdout.split(separator: "\n").last.flatMap { try? JSONParser.parse(Array($0.utf8)) }
        let read = summary?["docs_read"]?.int64Value.map(Int.init)
        print("pull \(database) \(url): \(read.map(String.init) ?? "?") documents read")
        return read
    }

    /// The checkpoints on the served database, by id, with their revisions.
    func checkpoints(_ served: String) throws -> [String: String] {
        let db = try Database.open(at: served)
        return Dictionary(uniqueKeysWithValues: try db.localDocumentIDs().map { ($0, try db.localDocument(withID: $0)?.rev ?? "") })
    }

    /// A source served by `sofa serve`, and `built.sofa` pulled from it as an application's
    /// build would make the database it ships.
    func buildFromServer() throws -> (source: Database, server: ServedDatabases, url: String, built: String) {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let url = "http://127.0.0.1:\(server.port)/source"
        let built = directory.appending("built.sofa")
        #expect(try sofa("create", built).succeeded)
        #expect(try pull(built, url) == 32)
        return (source, server, url, built)
    }

    /// Files and folders whose names say they are half-made copies.
    func leftovers() -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory.path)) ?? []).filter { $0.contains(".partial") }
    }

    @Test func snapshotsAndCopiesOfCopiesPullOnlyWhatChangedWithoutDisturbingEachOther() throws {
        let (source, server, url, built) = try buildFromServer()

        let zip = directory.appending("app-data.zip")
        let made = try sofa("snapshot", built, zip)
        #expect(made.succeeded, "\(made.stderr)")
        #expect(made.stdout.contains("30 documents") && made.stdout.contains("2 attachment bodies"), "\(made.stdout)")
        let again = try sofa("snapshot", built, zip)
        #expect(again.status == 1 && again.stderr.contains("already exists"), "\(again.stderr)")
        #expect(try sofa("snapshot", built, zip, "--force").succeeded)

        // Two installs of the snapshot, and a copy of one of them.
        let first = directory.appending("first.sofa"), second = directory.appending("second.sofa")
        let third = directory.appending("third.sofa")
        #expect(try sofa("copy", zip, first).succeeded)
        #expect(try sofa("copy", zip, second).succeeded)
        #expect(try sofa("copy", first, third).succeeded)
        let origin = try Database.open(at: built)
        let copies = try [first, second, third].map { try Database.open(at: $0) }
        #expect(Set((copies + [origin]).map(\.privateUUID)).count == 4 && Set((copies + [origin]).map(\.publicUUID)).count == 4,
                "every copy has its own identity")
        #expect(try copies[0].previousPrivateUUIDs == [origin.privateUUID])
        #expect(try copies[2].previousPrivateUUIDs == [copies[0].privateUUID, origin.privateUUID], "the chain survives a second copy")
        for copy in copies {
            #expect(try ReplicationTests().snapshot(copy) == ReplicationTests().snapshot(source))
            #expect(try copy.check().isEmpty)
        }

        // New documents on the server: each copy's first pull reads only those, and writes a
        // checkpoint of its own, leaving the original's (and the other copies') alone.
        let before = try checkpoints(source.path)
        #expect(before.count == 1, "\(before)")
        let http = try server.connect()
        #expect(try http.json("PUT", "/source/later-1", ["n": 1]).status == 201)
        #expect(try http.json("PUT", "/source/later-2", ["n": 2]).status == 201)
        for copy in [third, second, first] {
            #expect(try pull(copy, url) == 2, "\(copy)")
        }
        let after = try checkpoints(source.path)
        #expect(after.count == 4, "one checkpoint per database: \(after)")
        for (id, rev) in before { #expect(after[id] == rev, "the original's checkpoint is untouched") }
        #expect(try http.json("PUT", "/source/later-3", ["n": 3]).status == 201)
        for copy in [first, second, third] {
            #expect(try pull(copy, url) == 1, "\(copy) resumes from its own checkpoint")
        }
        #expect(try pull(built, url) == 3, "the original resumes from its own")
    }

    @Test(.enabled(if: isRoot, "ports 80 and 443 need root"))
    func theDefaultPortAndThePortWrittenOutShareACheckpoint() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path], port: 80)
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        #expect(try pull(target, "http://127.0.0.1/source") == 32)
        #expect(try server.connect().json("PUT", "/source/later", ["n": 1]).status == 201)
        #expect(try pull(target, "http://127.0.0.1:80/source") == 1, "the same checkpoint, whichever way the URL is written")
        #expect(try pull(target, "http://127.0.0.1:80/source/") == 0)
        #expect(try checkpoints(source.path).count == 1)

        // The same with https on 443, TLS ended by socat in front of the server.
        let certificate = directory.appending("cert.pem"), key = directory.appending("key.pem")
        let made = try shell("openssl req -x509 -newkey rsa:2048 -nodes -keyout \(key) -out \(certificate) -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>&1")
        try #require(made.succeeded, "\(made.stdout)")
        let tls = try ChildProcess(["/usr/bin/socat", "OPENSSL-LISTEN:443,bind=127.0.0.1,reuseaddr,fork,cert=\(certificate),key=\(key),verify=0",
                                    "TCP:127.0.0.1:80"])
        defer {
            tls.kill(SIGTERM)
            _ = tls.wait()
        }
        #expect(waitUntil { (try? HTTPConnection(port: 443)) != nil }, "socat listens on 443")
        let secure = directory.appending("secure.sofa")
        #expect(try sofa("create", secure).succeeded)
        #expect(try pull(secure, "https://127.0.0.1/source", "--cacert", certificate) == 33)
        #expect(try server.connect().json("PUT", "/source/later-2", ["n": 2]).status == 201)
        #expect(try pull(secure, "https://127.0.0.1:443/source", "--cacert", certificate) == 1)
        #expect(try checkpoints(source.path).count == 2, "one for each database, whichever way the URLs were written")
    }

    @Test func badInputGetsAClearErrorAndLeavesNothingHalfMade() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let zip = directory.appending("good.zip")
        #expect(try sofa("snapshot", source.path, zip).succeeded)
        let target = directory.appending("target.sofa")
        func refused(_ arguments: String..., saying words: String) throws {
            let result = try sofa(arguments)
            #expect(result.status == 1, "\(arguments) succeeded")
            #expect(result.stderr.contains(words), "\(arguments): \(result.stderr)")
            #expect(access(target, F_OK) != 0, "\(arguments) left \(target)")
            #expect(leftovers().isEmpty, "\(arguments) left \(leftovers())")
        }

        // Not a database: a plain folder, a missing path, a text file, a zip of something else.
        let folder = directory.appending("folder")
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try refused("copy", folder, target, saying: "is not a Sofa database")
        try refused("copy", directory.appending("missing.sofa"), target, saying: "no such file")
        let text = directory.appending("notes.txt")
        try "hello".write(toFile: text, atomically: true, encoding: .utf8)
        try refused("copy", text, target, saying: "not a zip archive")
        let other = directory.appending("other.zip")
        try makeZip(other, ["photos/cat.jpg": Array("meow".utf8)])
        try refused("copy", other, target, saying: "holds no db.sqlite3")

        // A truncated zip, and one whose bytes were damaged in transit.
        let bytes = try Array(Data(contentsOf: URL(fileURLWithPath: zip)))
        let truncated = directory.appending("truncated.zip")
        try Data(bytes.prefix(bytes.count / 2)).write(to: URL(fileURLWithPath: truncated))
        try refused("copy", truncated, target, saying: "truncated")
        var damaged = bytes
        let big = try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)
        let entry = try #require(locate(Array("\(big).blob".utf8), in: damaged))  // its local header; stored, not deflated
        damaged[entry + 100_000] ^= 0xFF
        let damagedZip = directory.appending("damaged.zip")
        try Data(damaged).write(to: URL(fileURLWithPath: damagedZip))
        try refused("copy", damagedZip, target, saying: "damaged")

        // CRCs that match but bodies that are not what their names say; entries that try to
        // leave the database folder; a SQLite file that is not one.
        let snapshot = try Archive(url: URL(fileURLWithPath: zip), accessMode: .read)
        var database: [UInt8] = []
        _ = try snapshot.extract(try #require(snapshot["source.sofa/db.sqlite3"])) { database += $0 }
        let lying = directory.appending("lying.zip")
        try makeZip(lying, ["x.sofa/db.sqlite3": database,
                            "x.sofa/attachments/\(String(repeating: "ab", count: 20)).blob": Array("not those bytes".utf8)])
        try refused("copy", lying, target, saying: "does not hash to its name")
        let escaping = directory.appending("escaping.zip")
        try makeZip(escaping, ["x.sofa/db.sqlite3": database, "x.sofa/../../escaped.blob": Array("x".utf8)])
        try refused("copy", escaping, target, saying: "not part of a Sofa database")
        #expect(access(directory.appending("escaped.blob"), F_OK) != 0)
        let garbage = directory.appending("garbage.zip")
        try makeZip(garbage, ["x.sofa/db.sqlite3": Array(repeating: 0x41, count: 8192)])
        try refused("copy", garbage, target, saying: "is not a Sofa database")

        // The destination exists: refused; --force replaces a database, never anything else.
        #expect(try sofa("copy", zip, target).succeeded)
        let identity = try Database.open(at: target).privateUUID
        let exists = try sofa("copy", zip, target)
        #expect(exists.status == 1 && exists.stderr.contains("already exists"), "\(exists.stderr)")
        #expect(try Database.open(at: target).privateUUID == identity, "the refused copy changed nothing")
        #expect(try sofa("copy", zip, target, "--force").succeeded)
        #expect(try Database.open(at: target).privateUUID != identity)
        #expect(try Database.open(at: target).check().isEmpty)
        let notReplaced = try sofa("copy", zip, folder, "--force")
        #expect(notReplaced.status == 1 && notReplaced.stderr.contains("refusing to replace"), "\(notReplaced.stderr)")
        #expect(leftovers().isEmpty, "\(leftovers())")
    }

    @Test func copiesAndSnapshotsOfADatabaseBeingWrittenAreConsistent() throws {
        let source = try directory.makeDatabase("busy.sofa")
        let stop = Atomic(false)
        let writer = Thread {
            var n = 0
            while !stop.value {
                var draft = try! source.newRevision(of: String(format: "n-%06d", n))
                draft.properties = ["n": .integer(Int64(n))]
                if n % 10 == 0 { try! draft.setAttachment("body.bin", data: Array(repeating: UInt8(n % 251), count: 40_000 + n)) }
                try! source.save(draft)
                n += 1
            }
        }
        writer.start()
        defer { stop.value = true }
        while try source.counts().documents < 50 { usleep(10_000) }
        var copies: [String] = []
        for round in 0..<3 {
            let copy = directory.appending("copy-\(round).sofa")
            #expect(try sofa("copy", source.path, copy).succeeded)
            copies.append(copy)
            let zip = directory.appending("snapshot-\(round).zip")
            #expect(try sofa("snapshot", source.path, zip).succeeded)
            let installed = directory.appending("installed-\(round).sofa")
            #expect(try sofa("copy", zip, installed).succeeded)
            copies.append(installed)
        }
        stop.value = true
        for path in copies {
            let copy = try Database.open(at: path)
            #expect(try copy.check().isEmpty, "\(path)")
            let ids = try copy.documents().map(\.docID)
            #expect(ids == (0..<ids.count).map { String(format: "n-%06d", $0) }, "\(path) holds a prefix of what was written")
            #expect(ids.count >= 50)
            #expect(try copy.info().missingBodyCount == 0, "\(path): every body of the snapshot was copied")
        }
    }

    @Test func cpCopiesBetweenADatabaseAndServersFoldersAndJSONLines() throws {
        let source = try ReplicationTests().makeSource(in: directory)
        let server = try ServedDatabases([source.path])
        let url = "http://127.0.0.1:\(server.port)/source"
        let expected = try ReplicationTests().snapshot(source)

        // From a server into a new database, and back out to it.
        let pulled = directory.appending("pulled.sofa")
        let pulling = try sofa("cp", url, pulled)
        #expect(pulling.succeeded, "\(pulling.stderr)")
        #expect(try ReplicationTests().snapshot(Database.open(at: pulled)) == expected)
        #expect(try sofa("put", pulled, "made-here", #"{"by":"cp"}"#).succeeded)
        #expect(try sofa("cp", pulled, url).succeeded)
        #expect(try server.connect().request("GET", "/source/made-here").json?["by"] == "cp")
        let missing = try sofa("cp", pulled, "http://127.0.0.1:\(server.port)/fresh")
        #expect(missing.status == 1 && missing.stderr.contains("404"), "\(missing.stderr)")
        let created = try sofa("cp", pulled, "http://127.0.0.1:\(server.port)/fresh", "--create-target")
        #expect(created.succeeded, "\(created.stderr)")
        #expect(try server.connect().request("GET", "/fresh").json?["doc_count"] == 31)

        let withPush = try ReplicationTests().snapshot(source)
        #expect(withPush.count == expected.count + 1)

        // JSON lines: every leaf, conflicts and deletions included.
        let lines = directory.appending("all.jsonl")
        #expect(try sofa("cp", source.path, lines).succeeded)
        let fromLines = directory.appending("lines.sofa")
        #expect(try sofa("cp", lines, fromLines).succeeded)
        let fromLinesSnapshot = try ReplicationTests().snapshot(Database.open(at: fromLines))
        #expect(fromLinesSnapshot == withPush)
        let overwrite = try sofa("cp", source.path, lines)
        #expect(overwrite.status == 1 && overwrite.stderr.contains("already exists"), "\(overwrite.stderr)")

        // A folder: one JSON file per live document, attachment files beside it.
        let folder = directory.appending("docs") + "/"
        let exported = try sofa("cp", source.path, folder)
        #expect(exported.succeeded, "\(exported.stderr)")
        #expect(FileManager.default.fileExists(atPath: folder + "doc-00.json"))
        #expect(!FileManager.default.fileExists(atPath: folder + "doc-01.json"), "deleted documents are not written")
        #expect(try String(contentsOfFile: folder + "files/notes/readme.txt", encoding: .utf8) == "hello, replication\n")
        let big = try #require(try source.document(withID: "files")?.attachment(named: "big.bin")?.blobKey?.hex)
        #expect(try shell("sha1sum '\(folder)files/big.bin'").stdout.hasPrefix(big))
        let back = directory.appending("back.sofa")
        let imported = try sofa("cp", folder, back)
        #expect(imported.succeeded, "\(imported.stderr)")
        let copy = try Database.open(at: back)
        for summary in try source.documents() {
            let original = try #require(try source.document(withID: summary.docID))
            let restored = try #require(try copy.document(withID: summary.docID), "\(summary.docID)")
            #expect(restored.revID == original.revID && restored.properties == original.properties)
            #expect(restored.attachments.map(\.digest) == original.attachments.map(\.digest))
        }
        #expect(try copy.document(withID: "doc-01") == nil)

        // Edited by hand: without _rev a file is a new revision; with _rev, edited bytes are refused.
        try #"{"n": 3, "edited": true}"#.write(toFile: folder + "doc-03.json", atomically: true, encoding: .utf8)
        try "changed\n".write(toFile: folder + "files/notes/readme.txt", atomically: true, encoding: .utf8)
        let stale = try sofa("cp", folder, back)
        #expect(stale.status == 1 && stale.stderr.contains("remove _rev"), "\(stale.stderr)")
        var files = try parseObject(try String(contentsOfFile: folder + "files.json", encoding: .utf8))
        files["_rev"] = nil
        files["_revisions"] = nil
        try JSONValue.object(files).prettyPrinted().write(toFile: folder + "files.json", atomically: true, encoding: .utf8)
        #expect(try sofa("cp", folder, back).succeeded)
        #expect(try copy.document(withID: "doc-03")?.properties["edited"] == true)
        #expect(try copy.document(withID: "doc-03")?.revID.generation == 2, "one revision however often the folder is read")
        #expect(try sofa("cp", folder, back).succeeded)
        #expect(try copy.document(withID: "files")?.revID.generation == 2)
        let edited = try #require(try copy.document(withID: "files"))
        #expect(edited.revID.generation == 2)
        #expect(try copy.blobs.contents(of: #require(edited.attachment(named: "notes/readme.txt")?.blobKey)) == Array("changed\n".utf8))
        #expect(edited.attachment(named: "big.bin")?.blobKey?.hex == big)

        let neither = try sofa("cp", lines, directory.appending("other.jsonl"))
        #expect(neither.status == 1 && neither.stderr.contains("neither"), "\(neither.stderr)")
        let notEmpty = try sofa("cp", source.path, folder)
        #expect(notEmpty.status == 1 && notEmpty.stderr.contains("not empty"), "\(notEmpty.stderr)")
    }

    @Test(.enabled(if: isRoot, "mounting needs root and /dev/fuse"))
    func mountWithASeedCreatesTheDatabaseFromTheSnapshotThenSyncs() throws {
        let (source, server, url, built) = try buildFromServer()
        let zip = directory.appending("seed.zip")
        #expect(try sofa("snapshot", built, zip).succeeded)
        #expect(try server.connect().json("PUT", "/source/after-the-snapshot", ["n": 1]).status == 201)

        let database = directory.appending("app.sofa")
        let mount = try MountedDatabase(database, arguments: ["--seed", zip, "--remote", url, "--pull"])
        #expect(waitUntil { FileManager.default.fileExists(atPath: mount.path("docs/after-the-snapshot/properties.json")) })
        #expect(try String(contentsOfFile: mount.path("docs/files/attachments/notes/readme.txt"), encoding: .utf8) == "hello, replication\n")
        let unmounted = mount.unmount()
        #expect(unmounted.succeeded)
        #expect(unmounted.stderr.contains("created \(database) from \(zip)"), "\(unmounted.stderr)")
        let app = try Database.open(at: database)
        #expect(try app.previousPrivateUUIDs == [try Database.open(at: built).privateUUID])
        #expect(try checkpoints(source.path).count == 2, "the seeded database pulled with a checkpoint of its own")

        // Once the database exists, the seed is not used again.
        let remount = try MountedDatabase(database, arguments: ["--seed", zip])
        #expect(FileManager.default.fileExists(atPath: remount.path("docs/after-the-snapshot/properties.json")))
        #expect(remount.unmount().succeeded)
        #expect(try Database.open(at: database).privateUUID == app.privateUUID)
    }

    // MARK: - Helpers

    private func makeZip(_ path: String, _ entries: [String: [UInt8]]) throws {
        let archive = try Archive(url: URL(fileURLWithPath: path), accessMode: .create)
        for (name, bytes) in entries.sorted(by: { $0.key < $1.key }) {
            try archive.addEntry(with: name, type: .file, uncompressedSize: Int64(bytes.count)) { position, size in
                Data(bytes[Int(position)..<Int(position) + size])
            }
        }
    }

    private func locate(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        return (0...(haystack.count - needle.count)).first { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
    }

    private func parseObject(_ text: String) throws -> JSONObject {
        try #require(try JSONParser.parse(Array(text.utf8)).objectValue)
    }
}

/// A flag shared with a writer thread.
final class Atomic<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var stored: Value
    init(_ value: Value) { stored = value }
    var value: Value {
        get { lock.withLock { stored } }
        set { lock.withLock { stored = newValue } }
    }
}
