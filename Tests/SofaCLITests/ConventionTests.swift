import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// What a new user meets first: versions, messages, overwrite rules, `--json` shapes,
/// conflicts, odd ids, and help that reads as sentences.
@Suite struct ConventionTests {
    let directory = TemporaryDirectory()

    func create(_ name: String = "notes.sofa") throws -> String {
        let path = directory.appending(name)
        #expect(try sofa("create", path).succeeded)
        return path
    }

    @Test func checkPrintsJSON() throws {
        let db = try create()
        let file = directory.appending("a.txt")
        try "body\n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect(try sofa("attach", db, "doc", "a.txt", file).succeeded)
        let healthy = try JSONValue(parsing: try sofa("check", db, "--json").stdout)
        #expect(healthy["ok"] == true && healthy["problems"]?.arrayValue?.isEmpty == true)
        // A blob whose bytes no longer match its name.
        let blob = try #require(try FileManager.default.contentsOfDirectory(atPath: db + "/attachments").first { $0.hasSuffix(".blob") })
        chmod(db + "/attachments/" + blob, 0o644)
        try "tampered\n".write(toFile: db + "/attachments/" + blob, atomically: false, encoding: .utf8)
        let broken = try sofa("check", db, "--json")
        #expect(broken.status == 1)
        let report = try JSONValue(parsing: broken.stdout)
        #expect(report["ok"] == false && report["problems"]?.arrayValue?.count == 1, "\(broken.stdout)")
    }

    @Test func versionIsPrinted() throws {
        let version = try sofa("--version")
        #expect(version.succeeded)
        #expect(version.stdout == SofaVersion.current + "\n")
    }

    @Test func downloadOfSomethingThatIsNotThereFails() throws {
        let db = try create()
        let noDocument = try sofa("download", db, "no-such-doc", "--remote", "http://127.0.0.1:9/x")
        #expect(noDocument.status == 1 && noDocument.stderr.contains("no document \"no-such-doc\""), "\(noDocument.stderr)")
        #expect(try sofa("put", db, "doc", "{}").succeeded)
        let noAttachment = try sofa("download", db, "doc", "nope.bin", "--remote", "http://127.0.0.1:9/x")
        #expect(noAttachment.status == 1 && noAttachment.stderr.contains("has no attachment \"nope.bin\""), "\(noAttachment.stderr)")
    }

    @Test func conflictsAreListedShownAndIgnoredByPut() throws {
        let path = try create()
        let db = try Database.open(at: path)
        try db.put("calm", ["n": 1])
        try db.put("torn", ["side": "mine"])
        let root = try #require(try db.document(withID: "torn")?.revID)
        var draft = try db.newRevision(of: "torn")
        draft.properties = ["side": "mine, again"]
        try db.save(draft)
        _ = try db.insert(ReplicatedRevision(docID: "torn", revID: RevisionID("2-ffff")!, ancestors: [root], properties: ["side": "theirs"]))

        #expect(try sofa("ls", path, "--conflicts").stdout == "torn\n")
        #expect(try sofa("ls", path, "-l").stdout.contains("\ttorn\t(1 conflict)\n"))
        let listed = try JSONValue(parsing: try sofa("ls", path, "--json").stdout)
        #expect(listed.arrayValue?.map { $0["conflicts"]?.int64Value } == [0, 1])

        let cat = try sofa("cat", path, "torn")
        let shown = try JSONValue(parsing: cat.stdout)
        let conflicts = try #require(shown["_conflicts"]?.arrayValue)
        #expect(conflicts.count == 1)
        #expect(try JSONValue(parsing: try sofa("cat", path, "calm").stdout)["_conflicts"] == nil)
        // What cat shows goes back in with put: _conflicts is not a property.
        let file = directory.appending("torn.json")
        try cat.stdout.write(toFile: file, atomically: true, encoding: .utf8)
        let put = try sofa("put", path, "torn", stdin: file)
        #expect(put.succeeded, "\(put.stderr)")
        #expect(try db.document(withID: "torn")?.properties["_conflicts"] == nil)
    }

    @Test func catTakesSeveralIdsAndNamesTheMissingOnes() throws {
        let db = try create()
        #expect(try sofa("put", db, "a", #"{"n":1}"#).succeeded)
        #expect(try sofa("put", db, "b", #"{"n":2}"#).succeeded)
        let both = try sofa("cat", db, "a", "b", "--properties")
        #expect(both.stdout == "{\n  \"n\": 1\n}\n{\n  \"n\": 2\n}\n")
        let partly = try sofa("cat", db, "a", "gone", "b", "--properties")
        #expect(partly.status == 1 && partly.stderr.contains("no document \"gone\""), "\(partly.stderr)")
        #expect(partly.stdout == both.stdout, "the others are printed")
        let twoRevs = try sofa("cat", db, "a", "b", "--rev", "1-x")
        #expect(twoRevs.status != 0 && twoRevs.stderr.contains("--rev takes one document id"), "\(twoRevs.stderr)")
    }

    @Test func anIdWithANewlineIsListedOnOneLine() throws {
        let path = try create()
        try Database.open(at: path).put("two\nlines", [:])
        #expect(try sofa("ls", path).stdout == "\"two\\nlines\"\n")
    }

    /// C1 controls (U+009B drives a terminal, U+0085 ends a line), U+2028 and bidi overrides are
    /// written as `\uXXXX` in a JSON string, as C0 controls are: one id, one line, read back whole.
    @Test func anIdWithC1ControlsLineSeparatorsOrBidiMarksIsListedAsJSON() throws {
        let path = try create()
        let ids = ["csi\u{9B}31m", "next\u{85}line", "para\u{2028}graph", "evil\u{202E}txt.exe", "plain"]
        for id in ids { try Database.open(at: path).put(id, [:]) }
        let lines = try sofa("ls", path).stdout.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
        #expect(lines.count == ids.count, "\(lines)")
        for line in lines {
            #expect(!line.unicodeScalars.contains { (0x80...0x9F).contains($0.value) || [0x2028, 0x202E].contains($0.value) },
                    "printed raw: \(line.debugDescription)")
        }
        let read = lines.map { line in line.hasPrefix("\"") ? (try? JSONParser.parse(Array(line.utf8)))?.stringValue ?? "?" : String(line) }
        #expect(Set(read) == Set(ids), "\(lines)")
        // Error messages that name them escape them too (a bidi override included).
        for id in ids.dropLast() {
            let missing = try sofa("cat", path, id + "-missing").stderr
            #expect(!missing.unicodeScalars.contains { (0x80...0x9F).contains($0.value) || [0x2028, 0x202E].contains($0.value) },
                    "printed raw: \(missing.debugDescription)")
        }
    }

    @Test func attachingTheSameBytesAgainSavesNothing() throws {
        let db = try create()
        let file = directory.appending("note.txt")
        try "same bytes\n".write(toFile: file, atomically: true, encoding: .utf8)
        let first = try sofa("attach", db, "doc", "note.txt", file)
        let again = try sofa("attach", db, "doc", "note.txt", file)
        #expect(again.succeeded && again.stdout == first.stdout, "\(again.stdout) \(again.stderr)")
        #expect(again.stderr.contains("unchanged"))
        #expect(try Database.open(at: db).currentRevision(of: "doc")?.revID.generation == 1)
    }

    @Test func everyCommandThatWritesAFileRefusesToOverwriteWithoutForce() throws {
        let db = try create()
        #expect(try sofa("put", db, "doc", "{}").succeeded)
        let file = directory.appending("dump.jsonl")
        try "keep me\n".write(toFile: file, atomically: true, encoding: .utf8)
        for arguments in [["export", db, file], ["cp", db, file]] {
            let refused = try sofa(arguments)
            #expect(refused.status == 1 && refused.stderr.contains("already exists (--force replaces it)"), "\(arguments): \(refused.stderr)")
            #expect(try String(contentsOfFile: file, encoding: .utf8) == "keep me\n")
        }
        #expect(try sofa("export", db, file, "--force").succeeded)
        let zip = directory.appending("snap.zip")
        #expect(try sofa("snapshot", db, zip).succeeded)
        let again = try sofa("snapshot", db, zip)
        #expect(again.status == 1 && again.stderr.contains("already exists (--force replaces it)"), "\(again.stderr)")
        let copy = try create("copy.sofa")
        let over = try sofa("copy", db, copy)
        #expect(over.status == 1 && over.stderr.contains("already exists (--force replaces it)"), "\(over.stderr)")
    }

    @Test func cpRefusesADestinationItCannotName() throws {
        let db = try create()
        let target = directory.appending("x.txt")
        let refused = try sofa("cp", db, target)
        #expect(refused.status == 1 && refused.stderr.contains("x.txt is not something cp knows"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: target))
    }

    @Test func optionsBelongToTheDirectionTheyServe() throws {
        let db = try create()
        let pushChannels = try sofa("push", db, "http://127.0.0.1:9/x", "--channels", "a")
        #expect(pushChannels.status != 0 && pushChannels.stderr.contains("Unknown option '--channels'"), "\(pushChannels.stderr)")
        let pullCreate = try sofa("pull", db, "http://127.0.0.1:9/x", "--create-target")
        #expect(pullCreate.status != 0 && pullCreate.stderr.contains("Unknown option '--create-target'"), "\(pullCreate.stderr)")
    }

    @Test func aBusyPortIsSaidPlainly() throws {
        let db = try create()
        let first = try ServedDatabases([db])
        let second = try sofa("serve", db, "--port", String(first.port))
        #expect(second.status == 1, "\(second.stderr)")
        #expect(second.stderr.contains("the port is in use") && second.stderr.contains("--port"), "\(second.stderr)")
        #expect(!second.stderr.contains("errno"), "no system-call internals: \(second.stderr)")
    }

    /// A port past 65535 is refused by name (it was cut to 16 bits: 70000 served on 4464).
    @Test func aPortThatIsNoTCPPortIsRefused() throws {
        let db = try create()
        for port in ["70000", "99999", "-1"] {
            let served = try sofa("serve", db, "--port=\(port)")
            #expect(served.status == 64 || served.status == 1, "\(port): \(served.status) \(served.stderr)")
            #expect(served.stderr.contains("is not a TCP port"), "\(port): \(served.stderr)")
        }
    }

    @Test func pushToAMissingDatabaseSuggestsCreatingIt() throws {
        let db = try create()
        #expect(try sofa("put", db, "doc", "{}").succeeded)
        let server = try ServedDatabases([try create("served.sofa")])
        let pushed = try sofa("push", db, "http://127.0.0.1:\(server.port)/absent")
        #expect(pushed.status == 1 && pushed.stderr.contains("--create-target"), "\(pushed.stderr)")
        let json = try sofa("push", db, "http://127.0.0.1:\(server.port)/absent", "--create-target", "--json")
        #expect(json.succeeded, "\(json.stderr)")
        let pulled = try sofa("pull", try create("back.sofa"), "http://127.0.0.1:\(server.port)/absent", "--json")
        // last_seq is a string both ways, whatever the source's sequences are.
        for output in [json.stdout, pulled.stdout] {
            let summary = try JSONValue(parsing: Array(try #require(output.split(separator: "\n").last).utf8))
            #expect(summary["last_seq"]?.stringValue != nil, "\(output)")
        }
    }

    @Test func helpReadsAsSentences() throws {
        // Wide enough for any paragraph: a sentence broken over lines would show here.
        let help = try ChildProcess([sofaBinary, "serve", "--help"], environment: ["COLUMNS": "400"]).wait().stdout
        #expect(help.contains("`sofa serve notes.sofa` answers at http://127.0.0.1:5984/notes. New databases"), "\(help)")
        let mount = try ChildProcess([sofaBinary, "mount", "--help"], environment: ["COLUMNS": "400"]).wait().stdout
        #expect(mount.contains("writes create revisions. Unmount with"), "\(mount)")
        // The options every command takes are in every command's help (they were parsed apart, and shown nowhere).
        for command in ["ls", "mount", "serve", "pull", "cp", "blob set"] {
            let help = try sofa(command.split(separator: " ").map(String.init) + ["--help"]).stdout
            #expect(help.contains("GLOBAL OPTIONS:") && help.contains("-v, --verbose") && help.contains("--key-file <path>")
                    && help.contains("--key-fd <n>") && help.contains("-q, --quiet"), "sofa \(command) --help: \(help)")
        }
        // And they still work anywhere before `--`, as before.
        #expect(try sofa("ls", directory.appending("none.sofa"), "-q", "--key-file", "/dev/null").stderr.contains("sofa create"))
    }

    /// Detach, then compact: the body goes at once (nothing else has the database open);
    /// --dry-run says so first and changes nothing.
    @Test func compactionAfterADetachFreesTheBodyAtOnceAndDryRunsChangeNothing() throws {
        let db = try create()
        let file = directory.appending("big.bin")
        try writePatternFile(file, count: 1 << 20)
        #expect(try sofa("attach", db, "doc", "big.bin", file).succeeded)
        #expect(try sofa("detach", db, "doc", "big.bin").succeeded)
        func blobs() throws -> Int { try FileManager.default.contentsOfDirectory(atPath: db + "/attachments").filter { $0.hasSuffix(".blob") }.count }
        #expect(try blobs() == 1)

        let dry = try JSONValue(parsing: try sofa("compact", db, "--dry-run", "--json").stdout)
        #expect(dry["dry_run"] == true && dry["blobs_deleted"]?.int64Value == 1 && dry["blob_bytes_freed"]?.int64Value == 1 << 20, "\(dry)")
        #expect(try blobs() == 1, "a dry run deletes nothing")

        let done = try JSONValue(parsing: try sofa("compact", db, "--json").stdout)
        #expect(done["blobs_deleted"]?.int64Value == 1 && done["recent_blobs_kept"]?.int64Value == 0, "\(done)")
        #expect(try blobs() == 0)

        // purge-attachment and cp: a dry run says what it would do.
        #expect(try sofa("attach", db, "doc", "big.bin", file).succeeded)
        let purge = try sofa("purge-attachment", db, "doc", "big.bin", "--dry-run")
        #expect(purge.stdout.contains("would purge the body of big.bin (1048576 bytes)"), "\(purge.stdout)")
        #expect(try blobs() == 1)
        let target = directory.appending("out.jsonl")
        try "keep\n".write(toFile: target, atomically: true, encoding: .utf8)
        let cp = try sofa("cp", db, target, "--force", "--dry-run")
        #expect(cp.succeeded && cp.stdout.contains("would copy the database") && cp.stdout.contains("replacing what is there"), "\(cp.stdout)")
        #expect(try String(contentsOfFile: target, encoding: .utf8) == "keep\n")
    }

    @Test func findPrintsMatchingDocumentsOnePerLine() throws {
        let path = try create()
        let db = try Database.open(at: path)
        for (id, n) in [("x", 1), ("y", 5), ("z", 3)] { try db.put(id, ["n": .integer(Int64(n))]) }
        _ = try db.deleteDocument("x")
        let unsorted = try sofa("find", path, #"{"n": {"$gte": 1}}"#, "--fields", "_id,n")
        #expect(unsorted.stdout == "{\"_id\":\"y\",\"n\":5}\n{\"_id\":\"z\",\"n\":3}\n", "\(unsorted.stdout)\(unsorted.stderr)")
        #expect(unsorted.stderr.contains("warning: No matching index found"), "\(unsorted.stderr)")
        let noIndex = try sofa("find", path, #"{"n": {"$gte": 1}}"#, "--sort", "n:desc")
        #expect(noIndex.status == 1 && noIndex.stderr.contains("No index exists for this sort"), "\(noIndex.stderr)")
        let created = try sofa("index", path, "--create", "n", "--ddoc", "by-n", "--name", "n")
        #expect(created.succeeded && created.stdout == "created: _design/by-n n\n", "\(created.stdout)\(created.stderr)")
        #expect(try sofa("index", path).stdout == "by-n/n  n\n")
        let found = try sofa("find", path, #"{"n": {"$gte": 1}}"#, "--sort", "n:desc", "--fields", "_id,n")
        #expect(found.stdout == "{\"_id\":\"y\",\"n\":5}\n{\"_id\":\"z\",\"n\":3}\n" && found.stderr.isEmpty, "\(found.stdout)\(found.stderr)")
        let bad = try sofa("find", path, #"{"n": {"$foo": 1}}"#)
        #expect(bad.status == 1 && bad.stderr.contains("Invalid operator: $foo"), "\(bad.stderr)")
        #expect(try sofa("index", path, "--delete", "by-n/n").succeeded && sofa("index", path).stdout.isEmpty)
    }
}
