import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// A saved document's folder, properties.json and attachments/ are numbered from its storage
/// key (#30): the mount keeps nothing for them however many the kernel holds (`ls -l docs/`
/// of a million documents), their inode numbers hold across mounts, and a folder that moves,
/// or a number given again after a purge, never leads to the wrong document.
@Suite struct MountInodeTests {
    let directory = TemporaryDirectory()
    let db: Database
    static let documents = 300

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        for index in 0..<MountInodeTests.documents {
            try db.put(String(format: "doc-%03d", index), ["n": .integer(Int64(index))],
                       attachments: index % 10 == 0 ? ["photo.jpg": Array("photo \(index)".utf8)] : [:])
        }
    }

    /// The nodes the mount keeps for the kernel (`.sofa/status.json`).
    func keptNodes(_ mount: MountedDatabase) throws -> Int64? {
        let status = try JSONParser.parse(Array(try sh("cat '\(mount.path(".sofa/status.json"))'").utf8))
        guard case .integer(let count)? = status["fuse"]?["kept_nodes"] else { return nil }
        return count
    }

    /// Every inode number and path down to the documents' own nodes, as `find` sees them.
    func inodes(_ mount: MountedDatabase) throws -> [String] {
        try sh("cd '\(mount.mountPoint)' && find docs -mindepth 1 -maxdepth 2 -printf '%i %p\\n' | sort -k2")
            .split(separator: "\n").map(String.init)
    }

    @Test func documentsTakeNoNodeAndKeepTheirNumbersAcrossMounts() throws {
        let mount = try MountedDatabase(db.path)
        let before = try #require(try keptNodes(mount))
        try sh("ls -l '\(mount.path("docs"))' > /dev/null")
        let listed = try inodes(mount)
        // Each document's folder, properties.json and attachments/.
        #expect(listed.count == 3 * MountInodeTests.documents)
        let numbers = listed.map { $0.split(separator: " ")[0] }
        #expect(Set(numbers).count == numbers.count, "every node its own number")
        // 900 nodes looked up; before numbering, each was kept.
        let after = try #require(try keptNodes(mount))
        #expect(after - before < 10, "nodes kept: \(before) before, \(after) after looking up 900")
        // Paths found from the numbers: reads, and writes below them.
        #expect(try sh("cat '\(mount.path("docs/doc-123/properties.json"))'").contains("123"))
        #expect(try sh("cat '\(mount.path("docs/doc-120/attachments/photo.jpg"))'") == "photo 120")
        try sh("mkdir -p '\(mount.path("docs/doc-007/attachments/a/b"))' && echo deep > '\(mount.path("docs/doc-007/attachments/a/b/c.txt"))'")
        #expect(try sh("cat '\(mount.path("docs/doc-007/attachments/a/b/c.txt"))'") == "deep\n")
        #expect(try document(db, "doc-007")?.attachment(named: "a/b/c.txt") != nil)
        mount.unmount()

        let again = try MountedDatabase(db.path)
        #expect(try inodes(again) == listed, "the same numbers in a new mount")
    }

    @Test func aMovedFolderKeepsItsInodeAndItsOldNameIsAnotherDocument() throws {
        let mount = try MountedDatabase(db.path)
        let number = try sh("stat -c %i '\(mount.path("docs/doc-001"))'")
        // The kernel holds its properties.json, attachments/ and an attachment too when it moves.
        #expect(try sh("cat '\(mount.path("docs/doc-001/properties.json"))'").contains("\"n\": 1\n"))
        try sh("echo note > '\(mount.path("docs/doc-001/attachments/note.txt"))'")
        let inner = try sh("stat -c %i '\(mount.path("docs/doc-001/properties.json"))' '\(mount.path("docs/doc-001/attachments"))'")
        try sh("mv '\(mount.path("docs/doc-001"))' '\(mount.path("docs/moved"))'")
        #expect(try sh("stat -c %i '\(mount.path("docs/moved/properties.json"))' '\(mount.path("docs/moved/attachments"))'") == inner)
        #expect(try sh("cat '\(mount.path("docs/moved/attachments/note.txt"))'") == "note\n")
        try sh("echo '{\"n\": 1, \"edited\": true}' > '\(mount.path("docs/moved/properties.json"))'")
        #expect(try document(db, "moved")?.properties["edited"] == true)
        // The kernel keeps the folder's inode under its new name: it must still find it.
        #expect(try sh("stat -c %i '\(mount.path("docs/moved"))'") == number)
        #expect(try sh("ls '\(mount.path("docs/moved"))'") == "attachments\nproperties.json\n")
        #expect(!(try shell("ls '\(mount.path("docs/doc-001"))' 2>&1").succeeded))
        // The old id saved again by another process (its storage key, so its number, is the
        // moved folder's): a document of its own, the moved one unchanged.
        try db.put("doc-001", ["n": 1001])
        #expect(waitUntil(10) { (try? shell("cat '\(mount.path("docs/doc-001/properties.json"))'"))?.stdout.contains("1001") == true })
        #expect(try sh("stat -c %i '\(mount.path("docs/doc-001"))'") != number)
        #expect(try sh("cat '\(mount.path("docs/moved/properties.json"))'").contains("\"edited\": true"))
        #expect(try sh("stat -c %i '\(mount.path("docs/moved"))'") == number)
    }

    @Test func anotherProcesssChangeShowsThroughNumberedNodes() throws {
        let mount = try MountedDatabase(db.path)
        #expect(try sh("cat '\(mount.path("docs/doc-010/properties.json"))'").contains("\"n\": 10\n"))
        #expect(try sh("ls '\(mount.path("docs/doc-010/attachments"))'") == "photo.jpg\n")
        try db.put("doc-010", ["n": 10, "changed": "elsewhere"], attachments: ["photo.jpg": Array("photo 10".utf8), "new.txt": Array("new".utf8)])
        #expect(waitUntil(10) { (try? shell("cat '\(mount.path("docs/doc-010/properties.json"))'"))?.stdout.contains("elsewhere") == true })
        #expect(try sh("ls '\(mount.path("docs/doc-010/attachments"))'") == "new.txt\nphoto.jpg\n")
    }

    @Test func aPurgedDocumentsNumberIsNotGivenAgain() throws {
        let last = try db.put("zz-last", ["who": "purged"])
        let mount = try MountedDatabase(db.path)
        #expect(try sh("cat '\(mount.path("docs/zz-last/properties.json"))'").contains("purged"))
        let number = try sh("stat -c %i '\(mount.path("docs/zz-last"))'")
        // Purged away with nothing else changing: the listing the kernel keeps drops it.
        let other = try db.put("zz-other", ["who": "purged alone"])
        #expect(waitUntil(10) { (try? shell("ls '\(mount.path("docs"))'"))?.stdout.contains("zz-other") == true })
        try db.purge(["zz-other": [other.revID]])
        #expect(waitUntil(10) { (try? shell("ls '\(mount.path("docs"))'"))?.stdout.contains("zz-other") == false })
        // Gone altogether, and it had the largest storage key, which SQLite alone would give to
        // the next document stored: the kernel's entry of the purged name would lead to it.
        try db.purge(["zz-last": [last.revID]])
        try db.put("zz-next", ["who": "next"])
        #expect(waitUntil(10) { (try? shell("cat '\(mount.path("docs/zz-next/properties.json"))'"))?.stdout.contains("next") == true })
        #expect(try sh("stat -c %i '\(mount.path("docs/zz-next"))'") != number)
        // The kernel may hold the purged name a while (no change of it is published): it shows
        // nothing (ls takes ENOENT from getdents as the end of a removed folder), never zz-next.
        #expect(try shell("ls -A '\(mount.path("docs/zz-last"))' 2>&1").stdout.isEmpty)
        #expect(!(try shell("cat '\(mount.path("docs/zz-last/properties.json"))'").succeeded))
        #expect(try sh("ls '\(mount.path("docs"))'").split(separator: "\n").filter { $0.hasPrefix("zz-") } == ["zz-next"])
    }
}
