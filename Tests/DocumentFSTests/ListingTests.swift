import DocumentModel
import DocumentStore
@testable import DocumentFS
import Foundation
import Testing
import TestSupport

/// Listings carry no state between reads (the kernel opens folders itself), so every
/// entry's position must say where to go on, whatever changes between two reads.
@Suite struct ListingTests {
    let directory = TemporaryDirectory()
    let db: Database
    let fs: DocumentFileSystem

    init() throws {
        db = try directory.makeDatabase()
        fs = try DocumentFileSystem(database: db)
    }

    /// Reads `path` as the kernel does: `count` entries per call, each call going on after the
    /// last entry it got; `between` runs after each call.
    func list(_ path: String, count: Int, between: (Int) throws -> Void = { _ in }) throws -> [String] {
        var names: [String] = [], position: UInt64 = 0, call = 0
        while true {
            var got = 0
            try fs.readDirectory(path, after: position) { entry in
                guard got < count else { return false }
                #expect(entry.position > position, "positions increase: \(entry.name)")
                names.append(entry.name)
                position = entry.position
                got += 1
                return true
            }
            guard got > 0 else { return names }
            call += 1
            try between(call)
        }
    }

    @Test func documentsThatStayAreListedOnceWhileOthersComeAndGo() throws {
        let ids = (0..<40).map { String(format: "doc-%02d", $0) }
        for id in ids { try db.put(id, ["n": 1]) }
        let names = try list("/docs", count: 7) { call in
            guard call == 2 else { return }
            // Between two reads: one listed document and one not yet listed go, two come.
            try db.deleteDocument("doc-03")
            try db.deleteDocument("doc-30")
            try db.put("new-1", ["n": 1])
            try db.put("doc-05", ["n": 2])  // an update moves nothing
            try db.put("aaa", ["n": 1])
        }
        #expect(names.prefix(2) == [".", ".."])
        let documents = Array(names.dropFirst(2))
        #expect(Set(documents).count == documents.count, "nothing twice: \(documents)")
        let stayed = ids.filter { $0 != "doc-03" && $0 != "doc-30" }
        #expect(stayed.allSatisfy(documents.contains), "every document that stayed is listed: \(documents)")
        #expect(!documents.contains("doc-30"), "a document deleted before its turn is not listed")
        #expect(documents.suffix(2) == ["new-1", "aaa"], "new documents come last, in the order they were stored")
    }

    @Test func attachmentsThatStayAreListedOnceWhileOthersComeAndGo() throws {
        let names = (0..<30).map { "file-\($0).txt" }
        try db.put("doc", [:], attachments: Dictionary(uniqueKeysWithValues: names.map { ($0, Array($0.utf8)) }))
        var removed: [String] = []
        let listed = try list("/docs/doc/attachments", count: 5) { call in
            guard call == 2 else { return }
            var draft = try db.newRevision(of: "doc")
            // The first ten listed so far and five of the rest leave, in whatever order the folder lists.
            removed = Array(names.shuffled().prefix(15))
            for name in removed { try draft.removeAttachment(name) }
            try draft.setAttachment("late.txt", data: Array("late".utf8))
            try db.save(draft)
        }
        let files = listed.filter { $0 != "." && $0 != ".." }
        #expect(Set(files).count == files.count, "nothing twice: \(files)")
        #expect(names.filter { !removed.contains($0) }.allSatisfy(files.contains), "every attachment that stayed is listed: \(files)")
    }

    @Test func propertiesComeFirstInADocumentFolder() throws {
        try db.put("doc", ["n": 1], attachments: ["a.txt": Array("a".utf8)])
        // `rm -r` removes in listing order: properties.json first starts one removal (one tombstone).
        #expect(try list("/docs/doc", count: 100) == [".", "..", "properties.json", "attachments"])
    }
}
