import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

@Suite struct MountLoadTests {
    let directory = TemporaryDirectory()

    @Test func eightWritersAndEightReadersAtOnceLoseNothing() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        let shared: [UInt8] = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 13) }
        try db.put("shared", ["n": 0], attachments: ["data.bin": shared])
        for writer in 0..<8 { try db.put("w\(writer)", ["writer": .integer(Int64(writer))]) }
        let mount = try MountedDatabase(db.path)
        let files = 12
        let failures = FailureLog()
        DispatchQueue.concurrentPerform(iterations: 16) { worker in
            do {
                if worker < 8 {
                    // A writer: files into its own document, and properties edits.
                    for file in 0..<files {
                        let bytes = [UInt8](repeating: UInt8(worker * 16 + file), count: 30_000 + file)
                        let path = mount.path("docs/w\(worker)/attachments/f\(file).bin")
                        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else {
                            failures.record("write \(path) failed: \(errno)")
                            continue
                        }
                        let text = "{\"writer\":\(worker),\"file\":\(file)}"
                        try Data(text.utf8).write(to: URL(fileURLWithPath: mount.path("docs/w\(worker)/properties.json")))
                    }
                } else {
                    // A reader: the shared attachment, listings, properties.
                    for _ in 0..<40 {
                        let read = FileManager.default.contents(atPath: mount.path("docs/shared/attachments/data.bin"))
                        if read.map([UInt8].init) != shared { failures.record("torn read of data.bin") }
                        _ = try FileManager.default.contentsOfDirectory(atPath: mount.path("docs"))
                        _ = try FileManager.default.contentsOfDirectory(atPath: mount.path("docs/w\(worker - 8)/attachments"))
                        _ = FileManager.default.contents(atPath: mount.path("docs/w\(worker - 8)/properties.json"))
                    }
                }
            } catch {
                failures.record("worker \(worker): \(error)")
            }
        }
        #expect(failures.messages.isEmpty, "\(failures.messages.prefix(5))")
        for writer in 0..<8 {
            let revision = try #require(try document(db, "w\(writer)"))
            #expect(revision.attachmentNames.count == files, "w\(writer) has \(revision.attachmentNames)")
            // One revision per close at most: closes in quick succession in one document are
            // staged and folded into fewer (Tuning.burstQuietWindow).
            #expect(revision.revID.generation <= 1 + 2 * files, "at most one revision per close: \(revision.revID)")
            #expect(revision.properties == ["writer": .integer(Int64(writer)), "file": .integer(Int64(files - 1))])
            for file in 0..<files {
                let attachment = try #require(revision.attachment(named: "f\(file).bin"))
                #expect(try db.blobs.contents(of: attachment.blobKey!) == [UInt8](repeating: UInt8(writer * 16 + file), count: 30_000 + file))
            }
            #expect(try db.revisionTree(of: "w\(writer)").conflicts.isEmpty)
        }
        let result = mount.unmount()
        #expect(result.succeeded, "\(result.stderr)")
    }

    @Test func thousandsOfDocumentsListInOrderAcrossPages() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let db = try directory.makeDatabase()
        let ids = (0..<5000).map { String(format: "doc-%05d", $0) }
        try db.inBatch { batch in
            for id in ids {
                var draft = try db.newRevision(of: id)
                draft.properties = ["id": .string(id)]
                try batch.save(draft)
            }
        }
        let mount = try MountedDatabase(db.path)
        // `ls -f` keeps the file system's order: every page and buffer boundary must join up.
        let listed = try sh("ls -f \(mount.path("docs"))").split(separator: "\n").map(String.init).filter { $0 != "." && $0 != ".." }
        #expect(listed == ids)
        #expect(try sh("find \(mount.path("docs")) -name properties.json | wc -l") == "5000\n")
        #expect(mount.unmount().succeeded)
    }
}

/// Collects failures from worker threads; assertions happen on the test thread.
final class FailureLog: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []

    func record(_ message: String) { lock.lock(); list.append(message); lock.unlock() }
    var messages: [String] { lock.lock(); defer { lock.unlock() }; return list }
}
