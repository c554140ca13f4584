import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Encrypted databases (#32) as a user makes and uses them: `sofa create --encrypt`, saves
/// through the CLI, the mount, `sofa serve` and a pull from the live CouchDB (bodies fetched
/// whole and deferred ones read through the mount), then every file of the database searched
/// for what was saved, beside a plain database that went through the same steps.
@Suite(.serialized) struct EncryptedDatabaseTests {
    let directory = TemporaryDirectory()
    let marker = "SOFAMARK\(UUID().uuidString.prefix(6))"

    /// Every file below `folder` that holds `text`.
    func filesHolding(_ text: String, in folder: String) -> [String] {
        let needle = Array(text.utf8)
        var found: [String] = []
        guard let enumerator = FileManager.default.enumerator(atPath: folder) else {
            Issue.record("\(folder) cannot be listed: a search of it would find nothing and prove nothing")
            return ["(unlistable)"]
        }
        var files = 0
        for case let relative as String in enumerator {
            let path = folder + "/" + relative
            if !isDirectory(path) { files += 1 }
            guard let bytes = FileManager.default.contents(atPath: path), bytes.count >= needle.count else { continue }
            if bytes.range(of: Data(needle)) != nil { found.append(relative) }
        }
        #expect(files >= 2, "\(folder) holds \(files) files: nothing to search")
        return found
    }

    /// Every path below `folder` whose name holds `text`.
    func pathsNaming(_ text: String, in folder: String) -> [String] {
        ((FileManager.default.enumerator(atPath: folder)?.allObjects as? [String]) ?? []).filter { $0.contains(text) }
    }

    /// What programs leave in a document folder of a mount besides its attachments (scratch
    /// files): an editor's swap file written at offsets, a temporary file rsync renames into
    /// attachments/, a properties.json saved by a rename, a saved query, a folder made for a
    /// new document, one for an id too long for a sealed name, and vim (swap file, backup)
    /// saving a new document. Read back as written.
    func writeScratchFiles(through mount: MountedDatabase, document: String, label: String) throws {
        let folder = mount.path("docs/\(document)")
        #expect(try shell("""
            cd '\(folder)' && seq 1 2000 | sed 's/^/\(marker) swap /' > '.\(marker).swp' \
            && printf '\(marker)' | dd of='.\(marker).swp' bs=1 seek=9000 conv=notrunc 2>/dev/null \
            && printf '%s' '\(markedText(300))' > 'attachments/.\(marker)-synced.txt.Xa1b2C' \
            && mv 'attachments/.\(marker)-synced.txt.Xa1b2C' 'attachments/\(marker)-synced.txt' \
            && printf '{"text":"\(marker) renamed over"}' > '.\(marker).json.new' && mv '.\(marker).json.new' properties.json \
            && printf '{"selector":{"text":"\(marker) renamed over"}}' > '../../queries/\(marker).json' \
            && mkdir '../\(marker)-pending' && printf '\(marker) pending' > '../\(marker)-pending/notes.txt' \
            && mkdir '../\(longID)' && printf '\(marker) long' > '../\(longID)/.notes.swp' \
            && mkdir '../\(marker)-vim' && vim -es -N -u NONE -i NONE -c 'set swapfile backup writebackup' \
               -c 'normal i{"by": "vim \(marker)"}' -c wq '../\(marker)-vim/properties.json'
            """).succeeded, "\(label)")
        try checkScratchFiles(through: mount, document: document, label: label)
    }

    /// A document id whose sealed name is too long for a file name.
    var longID: String { marker + String(repeating: "x", count: 200) }

    func checkScratchFiles(through mount: MountedDatabase, document: String, label: String) throws {
        let folder = mount.path("docs/\(document)")
        var swap = (1...2000).map { "\(marker) swap \($0)\n" }.joined().utf8.map { $0 }
        swap.replaceSubrange(9000..<(9000 + marker.utf8.count), with: marker.utf8)
        #expect(FileManager.default.contents(atPath: "\(folder)/.\(marker).swp").map([UInt8].init) == swap, "\(label): the swap file")
        #expect(try String(contentsOfFile: "\(folder)/attachments/\(marker)-synced.txt", encoding: .utf8) == markedText(300), "\(label)")
        #expect(try String(contentsOfFile: "\(folder)/properties.json", encoding: .utf8).contains("\(marker) renamed over"), "\(label)")
        #expect(try String(contentsOfFile: mount.path("queries/\(marker).json"), encoding: .utf8).contains(marker), "\(label)")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: mount.path("queries/\(marker)"))) == [document], "\(label): the query's results")
        let documents = (try? FileManager.default.contentsOfDirectory(atPath: mount.path("docs"))) ?? []
        #expect(documents.contains("\(marker)-pending") && documents.contains(longID), "\(label): folders of documents not saved yet")
        #expect(try String(contentsOfFile: mount.path("docs/\(marker)-pending/notes.txt"), encoding: .utf8) == "\(marker) pending", "\(label)")
        #expect(try String(contentsOfFile: mount.path("docs/\(longID)/.notes.swp"), encoding: .utf8) == "\(marker) long", "\(label)")
        #expect(try String(contentsOfFile: mount.path("docs/\(marker)-vim/properties.json"), encoding: .utf8).contains("vim \(marker)"), "\(label)")
    }

    func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    /// A text body of `lines` lines, each with the marker.
    func markedText(_ lines: Int) -> String { (0..<lines).map { "\(marker) line \($0)\n" }.joined() }

    @Test func nothingSavedThroughAnyPathReachesTheDiskInTheClear() throws {
        let couch = LiveCouchDB.shared
        let key = directory.appending("db.key")
        let encrypted = directory.appending("e.sofa"), plain = directory.appending("p.sofa")
        let created = try sofa("create", encrypted, "--encrypt", "--key-file", key)
        #expect(created.succeeded && created.stdout.contains("(encrypted)"), "\(created.stderr)")
        #expect(created.stderr.contains("a new key was written to \(key)"))
        #expect(try String(contentsOfFile: key, encoding: .utf8).count == 65, "64 hex digits and a newline")
        #expect(try sofa("create", plain).succeeded)
        // The source on CouchDB: a document and two attachments, one to pull whole, one to leave there.
        let source = try couch.newDatabase("encrypted-source")
        #expect(try couch.request("PUT", "/\(source)/\(marker)-couch", .object(["text": .string(marker)])).status == 201)
        let rev = try couch.request("GET", "/\(source)/\(marker)-couch").json?["_rev"]?.stringValue ?? ""
        let first = try couch.upload("/\(source)/\(marker)-couch/\(marker)-whole.txt?rev=\(rev)", Array(markedText(3_000).utf8),
                                     contentType: "text/plain")
        #expect(first.status == 201)
        let deferredSource = try couch.newDatabase("encrypted-deferred")
        #expect(try couch.request("PUT", "/\(deferredSource)/\(marker)-deferred", .object(["text": .string(marker)])).status == 201)
        let rev2 = try couch.request("GET", "/\(deferredSource)/\(marker)-deferred").json?["_rev"]?.stringValue ?? ""
        let deferredBody = markedText(20_000)
        #expect(try couch.upload("/\(deferredSource)/\(marker)-deferred/\(marker)-later.txt?rev=\(rev2)", Array(deferredBody.utf8),
                                 contentType: "text/plain").status == 201)
        let attachment = directory.appending("\(marker)-file.txt")
        try markedText(5_000).write(toFile: attachment, atomically: true, encoding: .utf8)

        for (database, keyArguments) in [(plain, [String]()), (encrypted, ["--key-file", key])] {
            let label = database == plain ? "plain" : "encrypted"
            // The CLI.
            let put = try ChildProcess([sofaBinary, "put", database, "\(marker)-cli"] + keyArguments,
                                       stdin: try textFile(#"{"text":"\#(marker) by the CLI"}"#)).wait()
            #expect(put.succeeded, "\(label): \(put.stderr)")
            #expect(try sofa(["attach", database, "\(marker)-cli", "\(marker)-attached.txt", attachment] + keyArguments).succeeded)
            // The mount: a new document, an attachment copied in, another written in pieces and rewritten in the middle.
            do {
                let mount = try MountedDatabase(database, arguments: keyArguments)
                let folder = mount.path("docs/\(marker)-mounted")
                #expect(mkdir(folder, 0o755) == 0)
                try #"{"text":"\#(marker) by the mount"}"#.write(toFile: folder + "/properties.json", atomically: false, encoding: .utf8)
                #expect(try shell("cp '\(attachment)' '\(folder)/attachments/\(marker)-copied.txt'").succeeded)
                #expect(try shell("""
                    cd '\(folder)/attachments' && seq 1 3000 | sed 's/^/\(marker) /' > pieces.txt \
                    && printf '\(marker)' | dd of=pieces.txt bs=1 seek=5000 conv=notrunc 2>/dev/null
                    """).succeeded)
                #expect(try String(contentsOfFile: "\(folder)/attachments/\(marker)-copied.txt", encoding: .utf8) == markedText(5_000))
                try writeScratchFiles(through: mount, document: "\(marker)-mounted", label: label)
                #expect(mount.unmount().succeeded, "\(label)")
            }
            // sofa serve: a document and an attachment through CouchDB's API.
            do {
                let server = try ServedDatabases([database] + keyArguments)
                let name = database == plain ? "p" : "e"
                let connection = try server.connect()
                let saved = try connection.json("PUT", "/\(name)/\(marker)-served", .object(["text": .string(marker)]))
                #expect(saved.status == 201, "\(label): \(saved.text)")
                let servedRev = saved.json?["rev"]?.stringValue ?? ""
                let upload = try connection.request("PUT", "/\(name)/\(marker)-served/\(marker)-served.txt?rev=\(servedRev)",
                                                    headers: [("Content-Type", "text/plain")], body: Array(markedText(2_000).utf8))
                #expect(upload.status == 201, "\(label): \(upload.text)")
                let back = try connection.request("GET", "/\(name)/\(marker)-served/\(marker)-served.txt")
                #expect(back.body == Array(markedText(2_000).utf8), "\(label)")
                server.stop()
            }
            // A pull from CouchDB with its bodies, and one with bodies left there and read through the mount.
            let pulled = try sofa(["pull", database, couch.url(source)] + keyArguments)
            #expect(pulled.succeeded, "\(label): \(pulled.stderr)")
            let deferred = try sofa(["pull", database, couch.url(deferredSource), "--no-download-attachments"] + keyArguments)
            #expect(deferred.succeeded, "\(label): \(deferred.stderr)")
            do {
                let mount = try MountedDatabase(database, arguments: ["--remote", couch.url(deferredSource)] + keyArguments)
                let read = try String(contentsOfFile: mount.path("docs/\(marker)-deferred/attachments/\(marker)-later.txt"), encoding: .utf8)
                #expect(read == deferredBody, "\(label): the deferred body read through the mount")
                try checkScratchFiles(through: mount, document: "\(marker)-mounted", label: "\(label), mounted again")
                #expect(mount.unmount().succeeded)
            }
            let check = try sofa(["check", database] + keyArguments)
            #expect(check.succeeded && check.stdout.contains("ok"), "\(label): \(check.stdout) \(check.stderr)")
            let listed = try sofa(["ls", database] + keyArguments)
            #expect(listed.stdout.contains("\(marker)-mounted") && listed.stdout.contains("\(marker)-served")
                    && listed.stdout.contains("\(marker)-couch") && listed.stdout.contains("\(marker)-deferred"), "\(label): \(listed.stdout)")
        }
        // The test can fail: the plain database holds the marker in its files; the encrypted one in none.
        #expect(!filesHolding(marker, in: plain).isEmpty)
        #expect(filesHolding(marker, in: encrypted) == [], "files of the encrypted database holding what was saved")
        #expect(!pathsNaming(marker, in: plain + "/scratch").isEmpty)
        #expect(pathsNaming(marker, in: encrypted) == [], "files of the encrypted database named by what was saved")
        // A copy stays encrypted with the same key.
        let copy = directory.appending("c.sofa")
        #expect(try sofa("copy", encrypted, copy, "--key-file", key).succeeded)
        #expect(filesHolding(marker, in: copy) == [])
        #expect(try sofa("cat", copy, "\(marker)-cli", "--key-file", key).stdout.contains("\(marker) by the CLI"))
        #expect(try sofa("cat", copy, "\(marker)-cli").stderr.contains("is encrypted and cannot be opened: no key given"))
        // So does a snapshot zip, and the database installed from it.
        let zip = directory.appending("e.zip"), installed = directory.appending("i.sofa")
        #expect(try sofa("snapshot", encrypted, zip, "--key-file", key).succeeded)
        #expect(try sofa("copy", zip, installed, "--key-file", key).succeeded)
        #expect(filesHolding(marker, in: directory.path).allSatisfy { !$0.hasPrefix("e.zip") && !$0.hasPrefix("i.sofa") })
        let fromZip = try sofa("cat-attachment", installed, "\(marker)-deferred", "\(marker)-later.txt", "--key-file", key)
        #expect(fromZip.stdout == deferredBody, "\(fromZip.stderr)")
    }

    func textFile(_ text: String) throws -> String {
        let path = directory.appending("input-\(UUID().uuidString)")
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// The mount's scratch files go along when a database is encrypted (sealed, names and all)
    /// and decrypted (opened again); plain ones an earlier version kept in an encrypted
    /// database are sealed by the next mount.
    @Test func scratchFilesAreSealedByEncryptOpenedByDecryptAndOldPlainOnesByTheNextMount() throws {
        let key = directory.appending("s.key"), database = directory.appending("s.sofa")
        #expect(try sofa("create", database).succeeded)
        do {
            let mount = try MountedDatabase(database)
            #expect(mkdir(mount.path("docs/\(marker)-mounted"), 0o755) == 0)
            try writeScratchFiles(through: mount, document: "\(marker)-mounted", label: "plain")
            #expect(mount.unmount().succeeded)
        }
        #expect(!pathsNaming(marker, in: database + "/scratch").isEmpty && !filesHolding(marker, in: database + "/scratch").isEmpty)
        let encrypted = try sofa("encrypt", database, "--key-file", key)
        #expect(encrypted.succeeded, "\(encrypted.stderr)")
        #expect(filesHolding(marker, in: database) == [] && pathsNaming(marker, in: database) == [], "sealed by sofa encrypt")
        // As the previous version left them: a folder and a file, plain, in the scratch folder.
        let old = database + "/scratch/\(marker)-old"
        #expect(mkdir(old, 0o755) == 0)
        try "\(marker) old".write(toFile: old + "/.old.swp", atomically: false, encoding: .utf8)
        do {
            let mount = try MountedDatabase(database, arguments: ["--key-file", key])
            try checkScratchFiles(through: mount, document: "\(marker)-mounted", label: "encrypted")
            #expect(try String(contentsOfFile: mount.path("docs/\(marker)-old/.old.swp"), encoding: .utf8) == "\(marker) old")
            #expect(mount.unmount().succeeded)
        }
        #expect(filesHolding(marker, in: database) == [] && pathsNaming(marker, in: database) == [], "sealed by the mount")
        let decrypted = try sofa("decrypt", database, "--key-file", key)
        #expect(decrypted.succeeded, "\(decrypted.stderr)")
        #expect(!pathsNaming(marker, in: database + "/scratch").isEmpty, "names opened by sofa decrypt")
        do {
            let mount = try MountedDatabase(database)
            try checkScratchFiles(through: mount, document: "\(marker)-mounted", label: "decrypted")
            #expect(try String(contentsOfFile: mount.path("docs/\(marker)-old/.old.swp"), encoding: .utf8) == "\(marker) old")
            #expect(mount.unmount().succeeded)
        }
    }

    /// `sofa serve --encrypt`: the databases `PUT /{db}` creates are encrypted with the server's key.
    @Test func aServerStartedWithEncryptMakesEncryptedDatabases() throws {
        let key = directory.appending("serve.key"), folder = directory.appending("served")
        #expect(mkdir(folder, 0o755) == 0)
        try DatabaseSecret.newKeyFile().withBytes { try Data($0).write(to: URL(fileURLWithPath: key)) }
        let server = try ServedDatabases(["--directory", folder, "--encrypt", "--key-file", key])
        let connection = try server.connect()
        #expect(try connection.json("PUT", "/made").status == 201)
        #expect(try connection.json("PUT", "/made/\(marker)", .object(["text": .string(markedText(100))])).status == 201)
        #expect(try connection.json("GET", "/made/\(marker)").json?["text"]?.stringValue == markedText(100))
        _ = server.stop()
        #expect(access(folder + "/made.sofa/key.json", F_OK) == 0)
        #expect(filesHolding(marker, in: folder + "/made.sofa") == [])
        #expect(try sofa("cat", folder + "/made.sofa", marker, "--key-file", key).stdout.contains(marker))
        #expect(try sofa("cat", folder + "/made.sofa", marker).stderr.contains("is encrypted and cannot be opened"))
        // No key: refused before it serves anything.
        let refused = try sofa("serve", "--directory", folder, "--encrypt", "--port", "0")
        #expect(!refused.succeeded && refused.stderr.contains("no key to encrypt with"), "\(refused.stderr)")
    }

    /// `sofa cp URL new.sofa --encrypt` and `sofa cp docs.jsonl new.sofa --encrypt`: the database cp
    /// creates is encrypted (a new key file made as `sofa create --encrypt` makes one).
    @Test func cpWithEncryptCreatesAnEncryptedDatabaseFromAServerOrJSONLines() throws {
        let couch = LiveCouchDB.shared
        let source = try couch.newDatabase("encrypted-cp")
        #expect(try couch.request("PUT", "/\(source)/\(marker)-doc", .object(["text": .string(marker)])).status == 201)
        let rev = try couch.request("GET", "/\(source)/\(marker)-doc").json?["_rev"]?.stringValue ?? ""
        #expect(try couch.upload("/\(source)/\(marker)-doc/\(marker).txt?rev=\(rev)", Array(markedText(500).utf8), contentType: "text/plain").status == 201)
        let key = directory.appending("cp.key"), pulled = directory.appending("pulled.sofa")
        let cp = try sofa("cp", couch.url(source), pulled, "--encrypt", "--key-file", key)
        #expect(cp.succeeded, "\(cp.stderr)")
        #expect(cp.stderr.contains("a new key was written to \(key)"))
        #expect(filesHolding(marker, in: pulled) == [] && pathsNaming(marker, in: pulled) == [])
        #expect(try sofa("cat-attachment", pulled, "\(marker)-doc", "\(marker).txt", "--key-file", key).stdout == markedText(500))
        let lines = directory.appending("docs.jsonl"), imported = directory.appending("imported.sofa")
        try #"{"_id":"\#(marker)-line","text":"\#(marker) from a line"}"#.appending("\n").write(toFile: lines, atomically: true, encoding: .utf8)
        #expect(try sofa("cp", lines, imported, "--encrypt", "--key-file", key).succeeded)
        #expect(filesHolding(marker, in: imported) == [])
        #expect(try sofa("cat", imported, "\(marker)-line", "--key-file", key).stdout.contains("\(marker) from a line"))
        // What it cannot do is refused, with what to do instead.
        let existing = try sofa("cp", lines, imported, "--encrypt", "--key-file", key)
        #expect(!existing.succeeded && existing.stderr.contains("sofa encrypt"), "\(existing.stderr)")
        let copy = try sofa("cp", imported, directory.appending("copy.sofa"), "--encrypt", "--key-file", key)
        #expect(!copy.succeeded && copy.stderr.contains("keeps its own key"), "\(copy.stderr)")
    }

    @Test func aWrongOrMissingKeyOrADamagedBodyIsAClearErrorNeverOtherBytes() throws {
        let key = directory.appending("k")
        let database = directory.appending("d.sofa")
        #expect(try sofa("create", database, "--encrypt", "--key-file", key).succeeded)
        let body = markedText(2_000)
        let file = try textFile(body)
        #expect(try sofa("attach", database, "doc", "a.txt", file, "--key-file", key).succeeded)
        // Missing and wrong keys, and a key file that is no key.
        let missing = try sofa("cat", database, "doc")
        #expect(missing.status == 1 && missing.stderr.contains("no key given") && missing.stdout.isEmpty)
        let wrong = directory.appending("wrong")
        try Data((0..<32).map { UInt8($0) }).write(to: URL(fileURLWithPath: wrong))
        let refused = try sofa("cat", database, "doc", "--key-file", wrong)
        #expect(refused.status == 1 && refused.stderr.contains("wrong key") && refused.stdout.isEmpty, "\(refused.stderr)")
        let notAKey = try sofa("cat", database, "doc", "--key-file", file)
        #expect(notAKey.status == 1 && notAKey.stderr.contains("a key file holds 32 bytes or 64 hex digits"), "\(notAKey.stderr)")
        // The key through a descriptor.
        let throughFD = try ChildProcess(["/bin/sh", "-c", "'\(sofaBinary)' cat-attachment '\(database)' doc a.txt --key-fd 3 3<'\(key)'"]).wait()
        #expect(throughFD.stdout == body, "\(throughFD.stderr)")
        // A flipped byte in the body's file: an error, and nothing but the body's own bytes before it.
        let blobs = try FileManager.default.contentsOfDirectory(atPath: database + "/attachments").filter { $0.hasSuffix(".blob") }
        #expect(blobs.count == 1)
        let blob = database + "/attachments/" + (blobs.first ?? "")
        var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: blob)))
        bytes[32 + 2 * 4_124 + 100] ^= 0x20
        chmod(blob, 0o644)
        try Data(bytes).write(to: URL(fileURLWithPath: blob))
        let damaged = try sofa("cat-attachment", database, "doc", "a.txt", "--key-file", key)
        #expect(damaged.status != 0 && damaged.stderr.contains("corrupt"), "\(damaged.stderr)")
        #expect(body.hasPrefix(damaged.stdout) && damaged.stdout.count < body.count, "no bytes but the body's own")
        let checked = try sofa("check", database, "--key-file", key)
        #expect(checked.status != 0 || !checked.stdout.contains("ok"), "check finds the damaged body: \(checked.stdout)")
        // A flipped byte in a page of the SQLite file: an error, not other data.
        let sqlite = database + "/db.sqlite3"
        #expect(try sofa("check", database, "--key-file", key).status != -1)
        var pages = try [UInt8](Data(contentsOf: URL(fileURLWithPath: sqlite)))
        #expect(pages.count >= 3 * 4_096)
        for page in 1..<(pages.count / 4_096) { pages[page * 4_096 + 200] ^= 1 }
        try Data(pages).write(to: URL(fileURLWithPath: sqlite))
        let broken = try sofa("cat", database, "doc", "--key-file", key)
        #expect(broken.status != 0 && broken.stdout.isEmpty, "\(broken.stdout) \(broken.stderr)")
    }

    @Test func aPassphraseUnlocksTheDatabaseAndIsAskedForWhenNotGiven() throws {
        let database = directory.appending("pass.sofa")
        let passphrase = try textFile("correct horse battery staple\n")
        let created = try sofa("create", database, "--encrypt", "--passphrase", "--key-file", passphrase)
        #expect(created.succeeded, "\(created.stderr)")
        let keyJSON = try String(contentsOfFile: database + "/key.json", encoding: .utf8)
        #expect(keyJSON.contains("\"passphrase\"") && keyJSON.contains("131072") && !keyJSON.contains("horse"))
        #expect(try ChildProcess([sofaBinary, "put", database, "doc", "--key-file", passphrase],
                                 stdin: try textFile(#"{"a":1}"#)).wait().succeeded)
        let wrong = try sofa("cat", database, "doc", "--key-file", try textFile("correct horse battery stapler\n"))
        #expect(wrong.status == 1 && wrong.stderr.contains("wrong passphrase"), "\(wrong.stderr)")
        let none = try sofa("cat", database, "doc")
        #expect(none.status == 1 && none.stderr.contains("no passphrase given"), "\(none.stderr)")
        #expect(try sofa("cat", database, "doc", "--key-file", passphrase).stdout.contains("\"a\": 1"))
    }

    /// What a database holds, to compare before and after: each document's current revision and
    /// its attachments' digests, and that every body here reads back whole.
    func contents(_ path: String, key: String?) throws -> [String: String] {
        let secret = try key.map { DatabaseSecret([UInt8](try Data(contentsOf: URL(fileURLWithPath: $0)))) }
        let database = try Database.open(at: path, secret: secret)
        var result: [String: String] = [:]
        for id in try database.documents().map(\.docID) {
            guard let revision = try database.document(withID: id) else { continue }
            result[id] = revision.revID.description + " " + revision.attachments.map { "\($0.name)=\($0.digest)" }.sorted().joined(separator: ",")
        }
        #expect(try database.check() == [], "\(path)")
        return result
    }

    /// `sofa encrypt`, `rekey` and `decrypt` killed at random moments, one after another: each
    /// time the database opens, with the old key or the new one (or plain), and holds what it held.
    @Test func encryptRekeyAndDecryptKilledAtRandomMomentsLoseNothing() throws {
        let database = directory.appending("k.sofa")
        let keys = [directory.appending("a.key"), directory.appending("b.key")]
        for key in keys { try DatabaseSecret.newKeyFile().withBytes { try Data($0).write(to: URL(fileURLWithPath: key)) } }
        do {
            let db = try Database.create(at: database)
            for i in 0..<300 {
                var draft = try db.newRevision(of: String(format: "doc-%03d", i))
                draft.properties = ["n": .integer(Int64(i)), "text": .string(markedText(3))]
                if i % 10 == 0 { try draft.setAttachment("body.bin", data: [UInt8](repeating: UInt8(i & 0xFF), count: 200_000 + i)) }
                try db.save(draft)
            }
        }
        let original = try contents(database, key: nil)
        #expect(original.count == 300)
        var key: Int? = nil  // nil: plain; else the index of the key that opens it
        // Seconds, by command: grows to the longest uninterrupted run of each seen (a rekey takes a
        // fraction of an encrypt: one bound for all would kill few rekeys, and few runs at all).
        var longest: [String: Double] = [:]
        var interrupted = 0
        var generator = SystemRandomNumberGenerator()
        for round in 0..<21 {
            let command: [String]
            let next: Int?
            if let current = key {
                if round % 2 == 0 {
                    next = 1 - current
                    command = ["rekey", database, "--key-file", keys[current], "--new-key-file", keys[1 - current]]
                } else {
                    next = nil
                    command = ["decrypt", database, "--key-file", keys[current]]
                }
            } else {
                next = round % 4
                command = ["encrypt", database, "--key-file", keys[round % 4 == 0 ? 0 : 1]]
            }
            let nextKey = next.map { key == nil ? ($0 == 0 ? 0 : 1) : $0 }
            let started = Date()
            let child = try ChildProcess([sofaBinary] + command)
            // Up to 0.8 of the longest: most runs are cut short, some finish (a run that finished
            // takes effect and is checked so).
            usleep(UInt32(Double.random(in: 0...(0.8 * (longest[command[0]] ?? 0.3)), using: &generator) * 1_000_000))
            child.kill(SIGKILL)
            let result = child.wait()
            if result.signal == SIGKILL { interrupted += 1 } else {
                #expect(result.succeeded, "\(command): \(result.stderr)")
                longest[command[0]] = max(longest[command[0]] ?? 0, Date().timeIntervalSince(started))
            }
            // It opens in the old form or the new one, holding what it held.
            let encryptedNow = access(database + "/key.json", F_OK) == 0
            let candidates: [Int?] = ([key, nextKey] as [Int?]).filter { ($0 != nil) == encryptedNow }
            var opened: Int?? = nil
            for candidate in candidates {
                guard let found = try? contents(database, key: candidate.map { keys[$0] }) else { continue }
                #expect(found == original, "round \(round) \(command), opened with \(candidate.map { "key \($0)" } ?? "no key")")
                opened = .some(candidate)
                break
            }
            guard let state = opened else {
                Issue.record("round \(round): \(command) killed: the database opens with neither the old key nor the new one")
                return
            }
            if result.signal != SIGKILL { #expect(state == nextKey, "round \(round): a finished \(command) took effect") }
            key = state
            // The next command that opens it takes what the killed one left beside it: then no
            // half-made copy stays, and while it is encrypted no plaintext is anywhere.
            #expect(try sofa(["ls", database] + (state.map { ["--key-file", keys[$0]] } ?? [])).succeeded)
            let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.contains(".partial-") }
            #expect(leftovers.isEmpty, "round \(round) \(command): \(leftovers)")
            if state != nil { #expect(filesHolding(marker, in: directory.path) == [], "round \(round) \(command)") }
        }
        #expect(interrupted >= 5, "only \(interrupted) of 21 runs were cut short: the test would not test much")
    }

    /// What a mount made durable with fsync and did not save before it was killed (an attachment
    /// and a properties.json) waits sealed on disk, and the next mount saves it.
    @Test func whatAKilledMountHadFsyncedWaitsSealedAndIsSavedByTheNext() throws {
        let key = directory.appending("m.key")
        let database = directory.appending("m.sofa")
        #expect(try sofa("create", database, "--encrypt", "--key-file", key).succeeded)
        #expect(try ChildProcess([sofaBinary, "put", database, "doc", "--key-file", key], stdin: try textFile(#"{"a":1}"#)).wait().succeeded)
        var mount = try MountedDatabase(database, arguments: ["--key-file", key])
        let fd = open(mount.path("docs/doc/attachments/journal.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        #expect(fd >= 0)
        let synced = Array(markedText(500).utf8)
        #expect(write(fd, synced, synced.count) == synced.count)
        #expect(fsync(fd) == 0)
        let properties = open(mount.path("docs/doc/properties.json"), O_WRONLY | O_TRUNC)
        let json = Array(#"{"synced": "\#(marker)"}"#.utf8)
        #expect(write(properties, json, json.count) == json.count)
        #expect(fsync(properties) == 0)
        let pids = try shell("pgrep -f 'sofa mount \(database) \(mount.mountPoint)'").stdout.split(separator: "\n")
        let pid = try #require(Int32(pids.first ?? ""))
        kill(pid, SIGKILL)
        close(fd)
        close(properties)
        _ = mount.unmount()
        #expect(filesHolding(marker, in: database) == [], "what was made durable waits sealed")
        mount = try MountedDatabase(database, arguments: ["--key-file", key])
        #expect(try [UInt8](Data(contentsOf: URL(fileURLWithPath: mount.path("docs/doc/attachments/journal.bin")))) == synced)
        #expect(try String(contentsOfFile: mount.path("docs/doc/properties.json"), encoding: .utf8).contains(marker))
        #expect(mount.unmount().succeeded)
        #expect(filesHolding(marker, in: database) == [])
    }

    /// Compaction finds an encrypted store's unreferenced bodies by their keyed names (which do
    /// not give the digest back) and deletes them, keeping the ones still referenced.
    @Test func compactionDeletesOnlyUnreferencedSealedBodies() throws {
        let key = directory.appending("c.key")
        let database = directory.appending("compact.sofa")
        #expect(try sofa("create", database, "--encrypt", "--key-file", key).succeeded)
        let first = try textFile(markedText(1_000)), second = try textFile(markedText(2_000))
        #expect(try sofa("attach", database, "doc", "a.txt", first, "--key-file", key).succeeded)
        #expect(try sofa("attach", database, "doc", "b.txt", second, "--key-file", key).succeeded)
        #expect(try sofa("attach", database, "doc", "a.txt", second, "--key-file", key).succeeded)  // the first body is no longer current
        func blobFiles() throws -> Int { try FileManager.default.contentsOfDirectory(atPath: database + "/attachments").filter { $0.hasSuffix(".blob") }.count }
        #expect(try blobFiles() == 2)
        #expect(try sofa("rm", database, "doc", "--key-file", key).succeeded)
        let compacted = try sofa("compact", database, "--json", "--key-file", key)
        #expect(compacted.succeeded, "\(compacted.stderr)")
        #expect(compacted.stdout.contains("\"blobs_deleted\": 2") || compacted.stdout.contains("\"blobs_deleted\":2"), "\(compacted.stdout)")
        #expect(try blobFiles() == 0)
        #expect(try sofa("attach", database, "kept", "k.txt", first, "--key-file", key).succeeded)
        #expect(try sofa("compact", database, "--key-file", key).succeeded)
        #expect(try blobFiles() == 1)
        #expect(try sofa("cat-attachment", database, "kept", "k.txt", "--key-file", key).stdout == markedText(1_000))
        #expect(try sofa("check", database, "--key-file", key).stdout.contains("ok"))
        // In the background, the mount of an encrypted database keeps its log out of the database's folder.
        let mountPoint = directory.appending("bg")
        #expect(mkdir(mountPoint, 0o755) == 0)
        let mounted = try sofa("mount", database, mountPoint, "--key-file", key)
        #expect(mounted.succeeded, "\(mounted.stderr)")
        #expect(try String(contentsOfFile: mountPoint + "/docs/kept/attachments/k.txt", encoding: .utf8) == markedText(1_000))
        #expect(try shell("fusermount3 -u '\(mountPoint)'").succeeded)
        #expect(access(database + "/mount.log", F_OK) != 0, "no mount.log beside an encrypted database")
        #expect(try sofa("info", database, "--key-file", key).stdout.contains("Encrypted:     yes"))
        #expect(try sofa("info", database, "--json", "--key-file", key).stdout.contains("\"encrypted\": true"))
    }
}
