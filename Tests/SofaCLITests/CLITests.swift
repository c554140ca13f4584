import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

@Suite struct CLITests {
    let directory = TemporaryDirectory()

    func create(_ name: String = "cli.sofa") throws -> String {
        let path = directory.appending(name)
        let result = try sofa("create", path)
        #expect(result.succeeded, "\(result.stderr)")
        return path
    }

    @Test func putCatLsRevsAndInfo() throws {
        let db = try create()
        let first = try sofa("put", db, "note", #"{"title":"hi","n":1}"#)
        #expect(first.succeeded)
        let rev1 = first.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(rev1.hasPrefix("1-"))
        let second = try sofa("put", db, "note", #"{"_rev":"\#(rev1)","title":"hello","n":2}"#)
        #expect(second.succeeded, "\(second.stderr)")
        let rev2 = second.stdout.trimmingCharacters(in: .whitespacesAndNewlines)

        let cat = try sofa("cat", db, "note")
        #expect(cat.stdout == "{\n  \"_id\": \"note\",\n  \"_rev\": \"\(rev2)\",\n  \"title\": \"hello\",\n  \"n\": 2\n}\n")
        #expect(try sofa("cat", db, "note", "--rev", rev1, "--properties").stdout == "{\n  \"title\": \"hi\",\n  \"n\": 1\n}\n")

        let source = directory.appending("photo.png")
        FileManager.default.createFile(atPath: source, contents: Data([0x89, 0x50, 0x4E, 0x47]))
        #expect(try sofa("attach", db, "note", "photo.png", source).succeeded)
        #expect(try sofa("ls", db, "-l").stdout.hasSuffix("\t1\tnote\n"))
        #expect(try sofa("ls", db).stdout == "note\n")

        let revs = try JSONValue(parsing: try sofa("revs", db, "note", "--json").stdout)
        #expect(revs["revisions"]?.arrayValue?.count == 3)
        #expect(revs["current"]?.stringValue?.hasPrefix("3-") == true)
        let tree = try sofa("revs", db, "note").stdout
        #expect(tree.contains("[current]") && tree.contains(rev1))

        let info = try JSONValue(parsing: try sofa("info", db, "--json").stdout)
        #expect(info["documents"] == .integer(1))
        #expect(info["last_sequence"] == .integer(3))
        #expect(info["blob_count"] == .integer(1))
        #expect(info["blob_bytes"] == .integer(4))

        #expect(try sofa("detach", db, "note", "photo.png").succeeded)
        #expect(try sofa("rm", db, "note").succeeded)
        #expect(try sofa("ls", db).stdout == "")
        #expect(try sofa("ls", db, "--deleted", "--json").stdout.contains("\"deleted\":true"))
        let compact = try JSONValue(parsing: try sofa("compact", db, "--json").stdout)
        #expect(compact["bodies_dropped"] == .integer(4))
    }

    @Test func errorsSayWhatFailedAndExitNonZero() throws {
        let db = try create()
        #expect(try sofa("put", db, "doc", #"{"a":1}"#).succeeded)
        let before = try sofa("cat", db, "doc").stdout

        let cases: [([String], String)] = [
            (["put", db, "doc", "{\"a\":\n 1,,}"], "invalid JSON at line 2, column 4"),
            (["put", db, "doc", "[1,2]"], "must be a JSON object, not an array"),
            (["put", db, "", "{}"], "invalid document id \"\": it is empty"),
            (["put", db, "_private", "{}"], "only _design/ and _local/ ids may start with '_'"),
            (["put", db, "doc", #"{"_rev":"1-nope","a":2}"#], "has no revision 1-nope"),
            (["put", db, "doc", #"{"_deleted":true}"#], "top-level key \"_deleted\" is reserved (use `sofa rm` to delete)"),
            (["put", db, "doc", #"{"_secret":1}"#], "Bad special document member: _secret"),
            (["attach", db, "doc", "_x", "/etc/hostname"], "invalid attachment name \"_x\""),
            (["attach", db, "doc", "", "/etc/hostname"], "invalid attachment name \"\""),
            (["attach", db, "doc", "a", directory.appending("missing")], "No such file or directory"),
            (["cat", db, "nope"], "no document \"nope\""),
            (["cat-attachment", db, "doc", "nope"], "has no attachment \"nope\""),
            (["ls", directory.path], "is not a Sofa database: it has no db.sqlite3"),
            (["ls", directory.appending("missing.sofa")], "is not a Sofa database: no such file or directory"),
            (["create", db], "already exists"),
        ]
        for (arguments, message) in cases {
            let result = try ChildProcess([sofaBinary] + arguments).wait()
            #expect(result.status == 1, "\(arguments) exited \(result.status)")
            #expect(result.stderr.contains(message), "\(arguments): \(result.stderr)")
            #expect(result.stdout.isEmpty)
        }
        // Nothing changed.
        #expect(try sofa("cat", db, "doc").stdout == before)
        #expect(try JSONValue(parsing: try sofa("info", db, "--json").stdout)["last_sequence"] == .integer(1))
    }

    @Test func aFullDiskBehindTheOutputIsAnError() throws {
        let db = try create()
        #expect(try sofa("attach", db, "doc", "a.bin", "/etc/hostname").succeeded)
        for arguments in [["cat-attachment", db, "doc", "a.bin"], ["export", db], ["cat", db, "doc"]] {
            let result = try sofa(arguments, stdout: "/dev/full")
            #expect(result.status == 1, "\(arguments) exited \(result.status)")
            #expect(result.stderr.contains("no space left"), "\(arguments): \(result.stderr)")
        }
    }

    @Test func staleRevisionIsAConflict() throws {
        let db = try create()
        let rev1 = try sofa("put", db, "doc", #"{"v":1}"#).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try sofa("put", db, "doc", #"{"v":2}"#).succeeded)
        let stale = try sofa("put", db, "doc", #"{"_rev":"\#(rev1)","v":3}"#)
        #expect(stale.status == 1 && stale.stderr.contains("conflict"), "\(stale.stderr)")
        #expect(try sofa("cat", db, "doc", "--properties").stdout == "{\n  \"v\": 2\n}\n")
    }

    @Test func putReadsStandardInputAndKeepsAttachments() throws {
        let db = try create()
        let body = directory.appending("body.json")
        try Data(#"{"from":"stdin"}"#.utf8).write(to: URL(fileURLWithPath: body))
        let attached = directory.appending("a.txt")
        try Data("text".utf8).write(to: URL(fileURLWithPath: attached))
        #expect(try sofa("attach", db, "doc", "a.txt", attached).succeeded)
        #expect(try sofa("put", db, "doc", stdin: body).succeeded)
        #expect(try sofa("cat", db, "doc", "--properties").stdout == "{\n  \"from\": \"stdin\"\n}\n")
        #expect(try sofa("cat-attachment", db, "doc", "a.txt").stdout == "text")
    }

    /// `sofa cat DB ID | jq … | sofa put DB ID -`: the stubs cat prints are accepted (as CouchDB
    /// accepts them), a name left out of `_attachments` is removed, inline data sets one, and a
    /// stub for a body the document does not have is refused with nothing saved.
    @Test func catFeedsPutWithItsAttachmentStubs() throws {
        let db = try create()
        let file = directory.appending("a.txt")
        try Data("text".utf8).write(to: URL(fileURLWithPath: file))
        #expect(try sofa("put", db, "doc", #"{"v":1}"#).succeeded)
        #expect(try sofa("attach", db, "doc", "a.txt", file).succeeded)
        #expect(try sofa("attach", db, "doc", "b.txt", file).succeeded)

        func catThen(_ change: (inout JSONObject) -> Void) throws -> ProcessResult {
            guard case .object(var object) = try JSONValue(parsing: try sofa("cat", db, "doc").stdout) else { fatalError() }
            change(&object)
            let edited = directory.appending("edited.json")
            try Data(JSONValue.object(object).jsonString().utf8).write(to: URL(fileURLWithPath: edited))
            return try sofa("put", db, "doc", "-", stdin: edited)
        }
        let same = try catThen { $0["v"] = 2 }
        #expect(same.succeeded, "\(same.stderr)")
        #expect(try sofa("cat", db, "doc", "--properties").stdout == "{\n  \"v\": 2\n}\n")
        #expect(try sofa("cat-attachment", db, "doc", "b.txt").stdout == "text")

        #expect(try catThen { object in
            var attachments = object["_attachments"]?.objectValue ?? [:]
            attachments["b.txt"] = nil
            attachments["c.txt"] = ["content_type": "text/plain", "data": .string(Data("inline".utf8).base64EncodedString())]
            object["_attachments"] = .object(attachments)
        }.succeeded)
        #expect(try sofa("cat-attachment", db, "doc", "c.txt").stdout == "inline")
        #expect(try sofa("cat-attachment", db, "doc", "a.txt").stdout == "text")
        #expect(try sofa("cat-attachment", db, "doc", "b.txt").status == 1, "left out of _attachments: removed")

        let before = try sofa("cat", db, "doc").stdout
        let refused = try catThen { object in
            var attachments = object["_attachments"]?.objectValue ?? [:]
            attachments["gone.txt"] = ["stub": true, "length": 4, "digest": "sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA="]
            object["_attachments"] = .object(attachments)
        }
        #expect(refused.status == 1)
        #expect(refused.stderr.contains(#"_attachments has a stub for "gone.txt""#), "\(refused.stderr)")
        #expect(try sofa("cat", db, "doc").stdout == before)
        // Without _attachments the document keeps its attachments, as before.
        #expect(try sofa("put", db, "doc", #"{"v":3}"#).succeeded)
        #expect(try sofa("cat-attachment", db, "doc", "c.txt").stdout == "inline")
    }

    /// Every command with --json answers on standard output when it fails too: a program that
    /// parses the output gets `{"ok": false, "error": …, "reason": …}`, never nothing.
    @Test func aFailureWithJSONIsJSONOnStandardOutput() throws {
        let db = try create()
        let missing = directory.appending("missing.sofa")
        let cases: [([String], String)] = [
            (["info", missing, "--json"], "not_a_database"),
            (["ls", missing, "--json"], "not_a_database"),
            (["revs", db, "nope", "--json"], "not_found"),
            (["check", missing, "--json"], "not_a_database"),
            (["compact", missing, "--json"], "not_a_database"),
            (["find", db, "{not json", "--json"], "invalid_json"),
            (["cache", missing, "--json"], "not_a_database"),
            (["blob", "ls", db, "nope", "--json"], "not_found"),
            (["pull", db, "http://127.0.0.1:9/nothing", "--retries", "0", "--json"], "unreachable"),
            (["push", db, "http://127.0.0.1:9/nothing", "--retries", "0", "--json"], "unreachable"),
            (["sync", db, "http://127.0.0.1:9/nothing", "--retries", "0", "--json"], "unreachable"),
        ]
        for (arguments, error) in cases {
            let result = try ChildProcess([sofaBinary] + arguments).wait()
            #expect(result.status == 1, "\(arguments) exited \(result.status): \(result.stderr)")
            let lines = result.stdout.split(separator: "\n")
            guard let last = lines.last, let answer = try? JSONValue(parsing: String(last)) else {
                Issue.record("\(arguments): no JSON on stdout: \(result.stdout) / \(result.stderr)")
                continue
            }
            #expect(answer["ok"] == false, "\(arguments)")
            if !error.isEmpty { #expect(answer["error"] == .string(error), "\(arguments): \(answer)") }
            let reason = answer["reason"]?.stringValue ?? ""
            #expect(!reason.isEmpty && result.stderr.contains(reason), "\(arguments): the same reason on stderr")
        }
        // Without --json, nothing on stdout, as before.
        #expect(try sofa("info", missing).stdout.isEmpty)
    }

    /// The small things a first day meets: a missing database suggests `sofa create`, `ls -l`
    /// has a header, export says what it wrote, names with control characters are escaped in
    /// messages, a listening address that is not this machine's is said plainly, and unpacking
    /// a snapshot shows progress on a terminal.
    @Test func firstDayRoughEdges() throws {
        let db = try create()
        let missing = try sofa("ls", directory.appending("nope.sofa"))
        #expect(missing.stderr.contains("sofa create"), "\(missing.stderr)")
        #expect(try sofa("put", db, "doc", #"{"v":1}"#).succeeded)
        #expect(try sofa("ls", db, "-l").stdout.hasPrefix("REVISION\tATTACHMENTS\tID\n"))
        let export = try sofa("export", db, directory.appending("out.jsonl"))
        #expect(export.stdout == "exported 1 document to \(directory.appending("out.jsonl"))\n")
        let odd = try sofa("cat", db, "line\nforged\u{1B}[31m")
        #expect(odd.stderr == "sofa: no document \"line\\nforged\\u{1B}[31m\"\n", "\(odd.stderr)")
        let serve = try sofa("serve", db, "--host", "192.0.2.1", "--port", "0")
        #expect(serve.status == 1 && serve.stderr.contains("no network interface of this machine has that address"), "\(serve.stderr)")
        #expect(!serve.stderr.contains("descriptor"))

        let zip = directory.appending("snap.zip")
        #expect(try sofa("snapshot", db, zip).succeeded)
        let copy = directory.appending("copy.sofa")
        // On a terminal (script(1) gives one), the unpacking shows its progress.
        let onTerminal = try ChildProcess(["/usr/bin/script", "-qec", "\(sofaBinary) copy \(zip) \(copy)", "/dev/null"]).wait()
        #expect(onTerminal.succeeded, "\(onTerminal.stderr)")
        #expect(onTerminal.stdout.contains("unpacked: ") && onTerminal.stdout.contains("copied \(zip)"), "\(onTerminal.stdout)")
    }

    /// As `rm` and cblite take them: several ids at once, and shell patterns for `ls`.
    @Test func rmTakesSeveralIdsAndLsTakesPatterns() throws {
        let db = try create()
        for id in ["hello", "help", "x", "y"] { #expect(try sofa("put", db, id, "{}").succeeded) }
        #expect(try sofa("ls", db, "h*").stdout == "hello\nhelp\n")
        #expect(try sofa("ls", db, "h*", "?", "--offset", "1", "--limit", "2").stdout == "help\nx\n", "offset and limit count the matches")
        let removed = try sofa("rm", db, "hello", "missing", "x")
        #expect(removed.status == 1 && removed.stderr.contains("missing: no document \"missing\"")
                && removed.stderr.contains("1 document of 3 not deleted"), "\(removed.stderr)")
        #expect(removed.stdout.split(separator: "\n").map { $0.split(separator: "\t").first.map(String.init) ?? "" } == ["hello", "x"])
        #expect(try sofa("ls", db).stdout == "help\ny\n", "the others were deleted")
        #expect(try sofa("rm", db, "help", "y", "--rev", "1-x").status == 64, "--rev with several ids is a usage error")
        #expect(try sofa("rm", db, "y").stdout.hasPrefix("2-"), "one id prints the tombstone's revision, as before")
    }

    /// A key file that holds a passphrase, given to `create --encrypt`: the message names the
    /// file and the fix; it did say that the database, not yet made, "cannot be opened".
    @Test func aPassphraseInAKeyFileIsNamedWhenADatabaseIsCreated() throws {
        let file = directory.appending("passphrase.txt")
        try "correct horse battery staple\n".write(toFile: file, atomically: true, encoding: .utf8)
        let path = directory.appending("secret.sofa")
        let refused = try sofa("create", path, "--encrypt", "--key-file", file)
        #expect(refused.status == 1 && refused.stderr.contains("--key-file \(file) is not a key file")
                && refused.stderr.contains("add --passphrase") && !refused.stderr.contains("cannot be opened"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: path))
        #expect(try sofa("create", path, "--encrypt", "--passphrase", "--key-file", file).succeeded)
        #expect(try sofa("info", path, "--key-file", file).succeeded)
    }

    /// `--json` on put, cat and mount, as on the other commands: an answer a program reads on
    /// every exit.
    @Test func putCatAndMountAnswerInJSON() throws {
        let db = try create()
        let put = try sofa("put", db, "doc", #"{"n":1}"#, "--json")
        let answer = try JSONValue(parsing: put.stdout)
        #expect(answer["ok"] == true && answer["id"] == "doc" && answer["rev"]?.stringValue?.hasPrefix("1-") == true, "\(put.stdout)")
        let first = try #require(answer["rev"]?.stringValue)
        #expect(try sofa("put", db, "doc", #"{"n":2}"#).succeeded)
        let stale = try sofa("put", db, "doc", #"{"_rev":"\#(first)","n":3}"#, "--json")
        let conflict = try JSONValue(parsing: stale.stdout)
        #expect(stale.status == 1 && conflict["error"] == "conflict", "\(stale.stdout)")
        #expect(try sofa("put", db, "other", "{}").succeeded)
        let cat = try sofa("cat", db, "doc", "other", "--json")
        let lines = try cat.stdout.split(separator: "\n").map { try JSONValue(parsing: String($0)) }
        #expect(lines.map { $0["_id"]?.stringValue } == ["doc", "other"], "one document a line: \(cat.stdout)")
        let missing = try sofa("cat", db, "nope", "--json")
        let notFound = try JSONValue(parsing: missing.stdout)
        #expect(missing.status == 1 && notFound["error"] == "not_found", "\(missing.stdout)")
        guard isRoot else { return }
        let mountPoint = directory.appending("json-mnt")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let mounted = try sofa("mount", db, mountPoint, "--json")
        defer { _ = try? shell("fusermount3 -u '\(mountPoint)'") }
        let started = try JSONValue(parsing: mounted.stdout)
        #expect(mounted.succeeded && started["ok"] == true && started["mount_point"]?.stringValue == mountPoint, "\(mounted.stdout)")
        #expect(try shell("fusermount3 -u '\(mountPoint)'").succeeded)
        let failed = try sofa("mount", db, mountPoint, "--json", "-o", "not_an_option")
        let why = try JSONValue(parsing: failed.stdout)
        #expect(failed.status == 1 && why["error"] == "mount_failed" && why["reason"]?.stringValue?.contains("not_an_option") == true,
                "\(failed.stdout)")
    }

    /// A failed background mount shows its own log lines, never an earlier attempt's.
    @Test func aFailedMountShowsThisAttemptsLog() throws {
        #expect(isRoot, "mounting needs root (as CI has)")
        let db = try create()
        let mountPoint = directory.appending("mnt")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let first = try sofa("mount", db, mountPoint, "-o", "first_unknown_option")
        #expect(!first.succeeded && first.stderr.contains("first_unknown_option"), "\(first.stderr)")
        let second = try sofa("mount", db, mountPoint, "-o", "second_unknown_option")
        #expect(!second.succeeded && second.stderr.contains("second_unknown_option"), "\(second.stderr)")
        #expect(!second.stderr.contains("first_unknown_option"), "an earlier attempt's lines: \(second.stderr)")
        #expect(try String(contentsOfFile: db + "/mount.log.1", encoding: .utf8).contains("first_unknown_option"), "the one before is kept")
    }

    @Test func localDocumentsThroughTheCLI() throws {
        let db = try create()
        #expect(try sofa("put", db, "_local/ckpt", #"{"seq":1}"#).stdout == "0-1\n")
        #expect(try sofa("cat", db, "_local/ckpt", "--properties").stdout == "{\n  \"seq\": 1\n}\n")
        #expect(try sofa("ls", db).stdout == "")
    }
}

@Suite struct ExportImportTests {
    let directory = TemporaryDirectory()

    /// A database with every kind of thing export must carry: conflicts, tombstones,
    /// odd ids, numbers, attachments (text, binary, nested names), local documents.
    func makeSource() throws -> Database {
        let db = try directory.makeDatabase("source.sofa")
        for (id, body) in [("plain", #"{"a":1}"#), ("unicode-ünïcødé-文档-🚀", #"{"s":"é😀\u0001\u2028"}"#),
                           ("folder/sub/doc", #"{"x":[1,2.0,18446744073709551615]}"#), ("_design/app", #"{"views":{}}"#)] {
            var draft = try db.newRevision(of: id)
            guard case .object(let object) = try JSONValue(parsing: body) else { fatalError() }
            draft.properties = object
            try db.save(draft)
        }
        var draft = try db.newRevision(of: "files")
        try draft.setAttachment("hello.txt", data: Array("hello\n".utf8))
        try draft.setAttachment("sub/dir/image.png", data: (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try db.save(draft)
        draft = try db.newRevision(of: "files")
        draft.properties = ["edited": true]
        try db.save(draft)
        // A conflict and a tombstone.
        try db.insert(ReplicatedRevision(docID: "conflicted", revID: RevisionID("2-aaa")!, ancestors: [RevisionID("1-root")!], properties: ["side": "A"]))
        try db.insert(ReplicatedRevision(docID: "conflicted", revID: RevisionID("3-bbb")!, ancestors: [RevisionID("2-bbb")!, RevisionID("1-root")!], properties: ["side": "B"]))
        try db.save({ var d = try db.newRevision(of: "gone"); d.properties = ["x": 1]; return d }())
        try db.deleteDocument("gone")
        try db.putLocalDocument("_local/ckpt", body: ["seq": 9])
        return db
    }

    func leaves(_ db: Database, _ id: String) throws -> [Revision] {
        try db.revisionTree(of: id).leaves.map { try db.revision($0.id, of: id) }
    }

    @Test func exportThenImportGivesTheSameDocumentsRevisionsAndDigests() throws {
        let source = try makeSource()
        let file = directory.appending("dump.jsonl")
        let export = try sofa("export", source.path, file)
        #expect(export.succeeded, "\(export.stderr)")
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        let imported = try sofa("import", target, file)
        #expect(imported.succeeded, "\(imported.stderr)")

        let copy = try Database.open(at: target)
        let ids = try source.documents(includeDeleted: true).map(\.docID)
        #expect(try copy.documents(includeDeleted: true).map(\.docID) == ids)
        for id in ids {
            let original = try leaves(source, id)
            let copied = try leaves(copy, id)
            #expect(copied.map(\.revID) == original.map(\.revID), "\(id)")
            #expect(copied.map(\.properties) == original.map(\.properties), "\(id)")
            #expect(copied.map(\.deleted) == original.map(\.deleted), "\(id)")
            #expect(copied.map { $0.attachments.map(\.digest) } == original.map { $0.attachments.map(\.digest) }, "\(id)")
            #expect(copied.map { $0.attachments.map(\.revpos) } == original.map { $0.attachments.map(\.revpos) }, "\(id)")
            #expect(try copy.revisionTree(of: id).history(of: copied[0].revID) == source.revisionTree(of: id).history(of: original[0].revID))
        }
        #expect(try copy.revisionTree(of: "conflicted").conflicts.map(\.id) == [RevisionID("2-aaa")!])
        // _local documents are per-replica state (checkpoints): they are not exported.
        #expect(try copy.localDocument(withID: "_local/ckpt") == nil)
        #expect(try copy.check().isEmpty)
        let image = try #require(try copy.document(withID: "files")?.attachment(named: "sub/dir/image.png"))
        #expect(try copy.blobs.contents(of: image.blobKey!) == (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })

        // Importing again changes nothing.
        let sequence = try copy.lastSequence
        #expect(try sofa("import", target, file).succeeded)
        #expect(try copy.lastSequence == sequence)
    }

    @Test func stubExportImportsBodiesAsNotPresent() throws {
        let source = try makeSource()
        let file = directory.appending("stubs.jsonl")
        #expect(try sofa("export", source.path, file, "--no-attachments").succeeded)
        let text = try String(contentsOfFile: file, encoding: .utf8)
        #expect(!text.contains("\"data\"") && text.contains("\"stub\":true"))
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        #expect(try sofa("import", target, file).succeeded)
        let copy = try Database.open(at: target)
        let files = try #require(try copy.document(withID: "files"))
        #expect(files.attachments.allSatisfy { !$0.contentAvailable })
        #expect(files.attachment(named: "sub/dir/image.png")?.length == 70_000)
        #expect(try copy.info().missingBodyCount == 2)
        let cat = try sofa("cat-attachment", target, "files", "hello.txt")
        #expect(cat.status == 1 && cat.stderr.contains("not downloaded"))
    }

    @Test func badLinesAreReportedWithTheirNumber() throws {
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        let file = directory.appending("bad.jsonl")
        try Data("{\"_id\":\"ok\",\"a\":1}\n\n{\"_id\":\"broken\",\n".utf8).write(to: URL(fileURLWithPath: file))
        let result = try sofa("import", target, file)
        #expect(result.status == 1)
        #expect(result.stderr.contains("line 3: invalid JSON"), "\(result.stderr)")
        // Lines before the bad one are kept.
        #expect(try sofa("ls", target).stdout == "ok\n")
        try Data(#"{"_id":"x","_attachments":{"a":{"data":"aGVsbG8=","digest":"sha1-AAAAAAAAAAAAAAAAAAAAAAAAAAA="}}}"#.utf8)
            .write(to: URL(fileURLWithPath: file))
        let mismatch = try sofa("import", target, file)
        #expect(mismatch.status == 1 && mismatch.stderr.contains("does not match its digest"), "\(mismatch.stderr)")
    }
}
