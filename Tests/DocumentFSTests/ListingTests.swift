import DocumentModel
import DocumentStore
@testable import DocumentFS
import Foundation
import Testing
import TestSupport

/// Reads `path` as the kernel does: `count` entries per call, each call going on after the
/// last entry it got; `between` runs after each call.
func readAsTheKernelDoes(_ fs: DocumentFileSystem, _ path: String, count: Int,
                         between: (Int) throws -> Void = { _ in }) throws -> [String] {
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

/// Listings carry no state between reads (the kernel opens folders itself), so every
/// entry's position must say where to go on, whatever changes between two reads.
@Suite struct ListingTests {
    let directory = TemporaryDirectory()
    let db: Database
    let fs: DocumentFileSystem

    init() throws {
        db = try directory.makeDatabase()
        fs = try DocumentFileSystem(store: db)
    }

    func list(_ path: String, count: Int, between: (Int) throws -> Void = { _ in }) throws -> [String] {
        try readAsTheKernelDoes(fs, path, count: count, between: between)
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

/// A view's folder is listed through its index a page at a time (`DocumentFileSystem+Views`):
/// every key once, in CouchDB's order, however the kernel splits its reads and whatever
/// changes between them.
@Suite struct ViewListingTests {
    let directory = TemporaryDirectory()
    let db: Database
    let fs: DocumentFileSystem

    init() throws {
        db = try directory.makeDatabase()
        fs = try DocumentFileSystem(store: db)
        try db.put("_design/app", ["views": ["by_n": ["map": "function(d) { if (d.n !== undefined) emit(d.n, null); }"]]])
        // More keys than a page of the index (Tuning.viewListingPage), one document per key.
        for n in 0..<600 { try db.put(String(format: "doc-%03d", n), ["n": .integer(Int64(n))]) }
    }

    func list(_ path: String, count: Int, between: (Int) throws -> Void = { _ in }) throws -> [String] {
        try readAsTheKernelDoes(fs, path, count: count, between: between).filter { $0 != "." && $0 != ".." }
    }

    @Test func everyKeyOnceInOrderWhileDocumentsComeAndGo() throws {
        #expect(Tuning.viewListingPage < 600)
        let keys = try list("/views/app/by_n", count: 37) { call in
            guard call == 3 else { return }
            // Listed up to about 111: one key listed and one not yet listed go, two come after.
            try db.deleteDocument("doc-005")
            try db.deleteDocument("doc-400")
            try db.put("late", ["n": 1000])
            try db.put("later", ["n": 1001])
        }
        var expected = (0..<600).filter { $0 != 5 && $0 != 400 }.map(String.init) + ["1000", "1001"]
        #expect(!keys.contains("400"), "a key removed before its turn is not listed")
        #expect(keys.filter { $0 != "5" } == expected, "every key once, in the view's order")
        // Read again from the start, with every read going on from a position the mount has
        // forgotten (as after many other folders were listed): the same keys.
        expected.removeAll { $0 == "5" }
        let forgetting = try list("/views/app/by_n", count: 50) { _ in fs.derived.viewListings.removeAll() }
        #expect(forgetting == expected)
    }

    @Test func aKeysFolderListsItsDocumentsAPageAtATime() throws {
        for n in 0..<300 { try db.put(String(format: "same-%03d", n), ["n": "same"]) }
        let documents = try list("/views/app/by_n/same", count: 11)
        #expect(documents == (0..<300).map { String(format: "same-%03d", $0) })
        #expect(try fs.readLink("/views/app/by_n/same/same-007") == "../../../../docs/same-007")
        #expect(throws: MountError.self) { try fs.attributes(of: "/views/app/by_n/same/doc-001") }
        // `"same"` is no name of the key "same": a string is written as JSON only where it must be.
        #expect(throws: MountError.self) { try fs.attributes(of: "/views/app/by_n/\"same\"") }
        // One name per key: the key 1 is `1`, not `1.0` (which collates as it).
        #expect(try fs.attributes(of: "/views/app/by_n/1").kind == .directory)
        #expect(throws: MountError.self) { try fs.attributes(of: "/views/app/by_n/1.0") }
    }
}

@Suite struct ViewKeyNameTests {
    @Test func keysAreTheirTextOrTheirJSONAndComeBackFromTheirNames() throws {
        let cases: [(JSONValue, String)] = [
            ("invoice", "invoice"), ("12", "\"12\""), ("true", "\"true\""), ("_reduce.json", "\"_reduce.json\""),
            ("", "\"\""), ("a/b%c", "a%2Fb%25c"), (" 1", "\" 1\""), ("\"q", "\"\\\"q\""), (".", "%2E"),
            (12, "12"), (-1.5, "-1.5"), (.null, "null"), (true, "true"), ([2024, 5], "[2024,5]"),
            (["a": ["b/c"]], "{\"a\":[\"b%2Fc\"]}"), ("ünïcødé 文档", "ünïcødé 文档"),
        ]
        for (key, name) in cases {
            #expect(ViewKeyNames.name(of: key) == name, "\(key)")
            #expect(ViewKeyNames.key(named: name) == key, "\(name)")
        }
        #expect(ViewKeyNames.key(named: "[1, 2]") == JSONValue?.none, "one name per key")
        #expect(ViewKeyNames.key(named: "\"same\"") == JSONValue?.none)
        #expect(ViewKeyNames.name(of: .string(String(repeating: "x", count: 256))) == nil, "longer than a file name may be")
    }
}

/// A folder larger than `Tuning.listingSnapshotMinimum` is worked out once per listing and
/// resumed from its kept names (`ListingSnapshots`). Through a real mount, a program reading
/// the folder a few entries at a time (`getdents64` with a small buffer) while files are
/// removed and rewritten there must see only what is there, at its size now: readdirplus
/// hands both to the kernel's caches.
@Suite struct LargeFolderListingTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
    }

    @Test func aListingResumedAfterChangesShowsNoRemovedNameAndCurrentSizes() throws {
        let count = Tuning.listingSnapshotMinimum * 2
        try db.put("doc", [:], attachments: Dictionary(uniqueKeysWithValues: (0..<count).map { ("d/file-\($0).txt", Array("small".utf8)) }))
        let mount = try MountedDatabase(db.path)
        let folder = mount.path("docs/doc/attachments/d")
        // Reads one small buffer, then removes 20 names not seen yet, grows one, adds one, and reads on.
        let script = """
            import ctypes, os, random, struct, sys
            libc = ctypes.CDLL(None, use_errno=True)
            folder = sys.argv[1]
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            buffer = ctypes.create_string_buffer(600)
            def read():
                n = libc.syscall(217, fd, buffer, len(buffer))
                assert n >= 0, os.strerror(ctypes.get_errno())
                names, at = [], 0
                while at < n:
                    length = struct.unpack_from('H', buffer.raw, at + 16)[0]
                    names.append(buffer.raw[at + 19:at + length].split(b'\\0', 1)[0].decode())
                    at += length
                return names
            listed = read()
            rest = [f'file-{i}.txt' for i in range(\(count)) if f'file-{i}.txt' not in listed]
            random.shuffle(rest)
            removed, grown = rest[:20], rest[20]
            for name in removed: os.unlink(os.path.join(folder, name))
            with open(os.path.join(folder, grown), 'wb') as f: f.write(b'x' * 1000)
            with open(os.path.join(folder, 'late.txt'), 'wb') as f: f.write(b'late')
            while True:
                names = read()
                if not names: break
                listed += names
            print(grown); print('/'.join(removed)); print('/'.join(listed))
            """
        let file = directory.appending("read-while-changing.py")
        try script.write(toFile: file, atomically: true, encoding: .utf8)
        let output = try sh("python3 '\(file)' '\(folder)'")
        // The program's lines: the grown name, the removed names, the listed names ('/' apart).
        let lines = output.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        try #require(lines.count >= 3, "\(output)")
        let grown = lines[0]
        let removed = Set(lines[1].split(separator: "/").map(String.init))
        let listed = lines[2].split(separator: "/").map(String.init).filter { $0 != "." && $0 != ".." }
        #expect(removed.count == 20)
        #expect(Set(listed).count == listed.count, "nothing twice")
        #expect(removed.isDisjoint(with: listed), "a name removed before its page is not listed: \(removed.intersection(listed))")
        let stayed = (0..<count).map { "file-\($0).txt" }.filter { !removed.contains($0) }
        #expect(Set(stayed).isSubset(of: listed), "every name that stayed is listed")
        // The sizes the kernel was handed (readdirplus), not asked again within the entry timeout.
        for name in removed.prefix(3) { #expect(!FileManager.default.fileExists(atPath: folder + "/" + name)) }
        #expect(try sh("stat -c %s '\(folder)/\(grown)'").trimmingCharacters(in: .whitespacesAndNewlines) == "1000")
        #expect(try sh("ls '\(folder)'").contains("late.txt"), "a new listing shows what came")
        #expect(mount.unmount().succeeded)
    }
}
