import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Killed processes, concurrent processes, and huge attachments, all through the real `sofa` binary.
@Suite struct RobustnessTests {
    let directory = TemporaryDirectory()

    func create(_ name: String) throws -> String {
        let path = directory.appending(name)
        #expect(try sofa("create", path).succeeded)
        return path
    }

    @Test func killedDuringABlobWriteLeavesAHealthyUnchangedDatabase() throws {
        let db = try create("kill-blob.sofa")
        #expect(try sofa("put", db, "doc", #"{"v":1}"#).succeeded)
        let before = try sofa("cat", db, "doc").stdout
        let fifo = directory.appending("fifo")
        #expect(mkfifo(fifo, 0o600) == 0)
        let child = try ChildProcess([sofaBinary, "attach", db, "doc", "big.bin", fifo])
        let fd = open(fifo, O_WRONLY)
        #expect(fd >= 0)
        let chunk = [UInt8](repeating: 0x5A, count: 1 << 20)
        for _ in 0..<3 { #expect(write(fd, chunk, chunk.count) == chunk.count) }
        child.kill(SIGKILL)
        close(fd)
        #expect(child.wait().signal == SIGKILL)

        // The dead writer's temporary file (3 MiB) goes with the next open; nothing else changed.
        #expect(try FileManager.default.contentsOfDirectory(atPath: db + "/attachments/tmp").count == 1)
        let database = try Database.open(at: db)
        #expect(try FileManager.default.contentsOfDirectory(atPath: db + "/attachments/tmp").isEmpty)
        #expect(try database.check().isEmpty)
        #expect(try sofa("cat", db, "doc").stdout == before)
        #expect(try FileManager.default.contentsOfDirectory(atPath: db + "/attachments").filter { $0.hasSuffix(".blob") }.isEmpty)
    }

    /// JSON lines for `count` documents at generation `generation`, every 10th with an attachment.
    func writeDump(_ path: String, count: Int, generation: Int) throws -> [String: (rev: String, value: Int64)] {
        var expected: [String: (String, Int64)] = [:]
        var text = ""
        for n in 0..<count {
            let id = String(format: "doc-%05d", n)
            let value = Int64(n * 10 + generation)
            let ids = (1...generation).reversed().map { "\($0)\(String(format: "%031x", n))" }
            let rev = "\(generation)-\(ids[0])"
            var line = #"{"_id":"\#(id)","_rev":"\#(rev)","_revisions":{"start":\#(generation),"ids":[\#(ids.map { "\"\($0)\"" }.joined(separator: ","))]},"value":\#(value)"#
            if n % 10 == 0 {
                let data = Data("attachment \(id) generation \(generation)".utf8).base64EncodedString()
                line += #","_attachments":{"a.txt":{"content_type":"text/plain","revpos":\#(generation),"data":"\#(data)"}}"#
            }
            text += line + "}\n"
            expected[id] = (rev, value)
        }
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        return expected
    }

    @Test func killedDuringSavesHoldsTheOldOrTheNewRevisionNothingBetween() throws {
        let count = 3000
        var interrupted = 0
        for round in 0..<4 {
            let db = try create("kill-save-\(round).sofa")
            let old = try writeDump(directory.appending("gen1-\(round).jsonl"), count: count, generation: 1)
            let new = try writeDump(directory.appending("gen2-\(round).jsonl"), count: count, generation: 2)
            #expect(try sofa("import", db, directory.appending("gen1-\(round).jsonl")).succeeded)
            let watcher = try Database.open(at: db)
            let baseline = try watcher.lastSequence
            let child = try ChildProcess([sofaBinary, "import", db, directory.appending("gen2-\(round).jsonl")])
            // Kill it once it is well into the import: somewhere inside a later batch.
            let threshold = baseline + Int64(1 + round * 600)
            while try watcher.lastSequence < threshold { usleep(200) }
            child.kill(SIGKILL)
            let killed = child.wait().signal == SIGKILL

            let database = try Database.open(at: db)
            #expect(try database.check().isEmpty, "round \(round)")
            var updated = 0
            for summary in try database.documents() {
                let doc = try #require(try database.document(withID: summary.docID))
                let value = doc.properties["value"]?.int64Value
                if doc.revID.description == new[summary.docID]!.rev {
                    updated += 1
                    #expect(value == new[summary.docID]!.value)
                } else {
                    #expect(doc.revID.description == old[summary.docID]!.rev)
                    #expect(value == old[summary.docID]!.value)
                }
                if let attachment = doc.attachment(named: "a.txt") {
                    let reader = try database.openContent(of: attachment, docID: doc.docID)
                    #expect(reader.length == attachment.length)
                }
            }
            #expect(try database.documents().count == count)
            // Whole transactions only.
            #expect(updated % Tuning.importBatchSize == 0, "round \(round): \(updated) updated")
            if killed && updated < count { interrupted += 1 }
        }
        #expect(interrupted >= 3, "the import finished before it could be killed")
    }

    @Test func twoProcessesSavingAtOnceLoseNothing() throws {
        let db = try create("two.sofa")
        #expect(try sofa("put", db, "shared", #"{"n":0}"#).succeeded)
        let dumps = try (0..<2).map { index -> String in
            let path = directory.appending("p\(index).jsonl")
            let lines = (0..<1500).map { #"{"_id":"p\#(index)-\#($0)","n":\#($0)}"# }
            try Data(lines.joined(separator: "\n").utf8).write(to: URL(fileURLWithPath: path))
            return path
        }
        // Two imports and two loops of updates to one shared document, all at once.
        let imports = try dumps.map { try ChildProcess([sofaBinary, "import", db, $0]) }
        let loops = try (0..<2).map { index in
            try ChildProcess(["/bin/sh", "-c", """
                ok=0; conflicts=0
                for i in $(seq 1 40); do
                  if \(sofaBinary) put \(db) shared '{"writer":\(index),"i":'$i'}' >/dev/null 2>\(directory.path)/err-\(index); then ok=$((ok+1));
                  elif grep -q conflict \(directory.path)/err-\(index); then conflicts=$((conflicts+1)); else cat \(directory.path)/err-\(index) >&2; fi
                done
                echo $ok $conflicts
                """])
        }
        for child in imports {
            let result = child.wait()
            #expect(result.succeeded, "\(result.stderr)")
        }
        var saved = 0
        for child in loops {
            let result = child.wait()
            #expect(result.succeeded && result.stderr.isEmpty, "\(result.stderr)")
            let numbers = result.stdout.split(separator: " ").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
            #expect(numbers.count == 2 && numbers[0] + numbers[1] == 40, "\(result.stdout)")
            saved += numbers.first ?? 0
        }
        let database = try Database.open(at: db)
        #expect(try database.documents().count == 3001)
        // Every successful update is a generation: none overwrote another.
        #expect(try database.document(withID: "shared")?.revID.generation == 1 + saved)
        #expect(try database.revisionTree(of: "shared").leaves.count == 1)
        #expect(try database.check().isEmpty)
    }

    @Test func oneGibibyteAttachmentStreamsWithFlatMemory() throws {
        let db = try create("big.sofa")
        let source = directory.appending("big.bin")
        let size: Int64 = 1 << 30
        let key = try writePatternFile(source, count: size, seed: 42)
        let attach = try sofa("attach", db, "doc", "big.bin", source, measureMemory: true)
        #expect(attach.succeeded, "\(attach.stderr)")
        unlink(source)
        #expect(attach.maxRSS > 0 && attach.maxRSS < 100_000_000, "attach peaked at \(attach.maxRSS / 1_000_000) MB")

        let output = directory.appending("out.bin")
        let cat = try sofa("cat-attachment", db, "doc", "big.bin", stdout: output, measureMemory: true)
        #expect(cat.succeeded, "\(cat.stderr)")
        #expect(cat.maxRSS > 0 && cat.maxRSS < 100_000_000, "cat-attachment peaked at \(cat.maxRSS / 1_000_000) MB")
        let database = try Database.open(at: db)
        let attachment = try #require(try database.document(withID: "doc")?.attachment(named: "big.bin"))
        #expect(attachment.length == size && attachment.blobKey == key)
        var info = stat()
        #expect(stat(output, &info) == 0 && Int64(info.st_size) == size)
        let copied = try database.blobs.write(contentsOf: output)
        #expect(copied.key == key)
    }
}
