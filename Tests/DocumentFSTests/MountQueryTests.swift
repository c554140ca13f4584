import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Saved Mango queries as folders in a real mount (#29): `queries/<name>.json` holds a `_find`
/// body, `queries/<name>/` links to the documents it finds, in its order, and follows them.
@Suite struct MountQueryTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        // A Mango index on n, so that a query may be sorted by it (CouchDB refuses a sort no index serves).
        try db.put("_design/mango", ["language": "query", "views": ["by-n": ["map": ["fields": ["n": "asc"]], "reduce": "_count"],
                                                                       "options": ["def": ["fields": ["n"]]]]])
        try db.put("inv-1", ["type": "invoice", "n": 30])
        try db.put("inv-2", ["type": "invoice", "n": 10])
        try db.put("inv-3", ["type": "invoice", "n": 20])
        try db.put("folder/doc", ["type": "invoice", "n": 40])
        try db.put("note", ["type": "note", "n": 5])
    }

    func ls(_ path: String) throws -> [String] {
        try sh("ls -A '\(path)'").split(separator: "\n").map(String.init)
    }

    /// The folder's entries in the order the mount lists them (not sorted by ls).
    func listed(_ path: String) throws -> [String] {
        try sh("ls -U '\(path)'").split(separator: "\n").map(String.init)
    }

    func save(_ query: String, as name: String, in mount: MountedDatabase) throws {
        try sh("printf '%s' '\(query)' > '\(mount.path("queries/\(name).json"))'")
    }

    @Test func aSavedQueryIsAFolderOfLinksToTheDocumentsItFinds() throws {
        let mount = try MountedDatabase(db.path)
        #expect(try ls(mount.mountPoint).contains("queries"))
        #expect(try ls(mount.path("queries")) == [])
        try save(#"{"selector": {"type": "invoice"}}"#, as: "invoices", in: mount)
        #expect(try ls(mount.path("queries")) == ["invoices", "invoices.json"])
        #expect(try sh("stat -c %F '\(mount.path("queries/invoices"))'") == "directory\n")
        // Every match (no limit: not Mango's 25), by id as _find gives them, design documents never.
        #expect(try listed(mount.path("queries/invoices")) == ["folder%2Fdoc", "inv-1", "inv-2", "inv-3"])
        #expect(try sh("readlink '\(mount.path("queries/invoices/inv-1"))'") == "../../docs/inv-1\n")
        #expect(try sh("readlink '\(mount.path("queries/invoices/folder%2Fdoc"))'") == "../../docs/folder%2Fdoc\n")
        let through = try sh("cat '\(mount.path("queries/invoices/inv-2/properties.json"))'")
        #expect(try JSONParser.parse(Array(through.utf8))["n"] == 10)
        #expect(try sh("cd '\(mount.path("queries"))' && find . -type l | sort") ==
                "./invoices/folder%2Fdoc\n./invoices/inv-1\n./invoices/inv-2\n./invoices/inv-3\n")
        // What the file says is the cat of it.
        #expect(try sh("cat '\(mount.path("queries/invoices.json"))'") == #"{"selector": {"type": "invoice"}}"#)
        // Sorted through the index, cut by skip and limit, in the query's order.
        try save(#"{"selector": {"n": {"$gt": 5}}, "sort": [{"n": "desc"}], "skip": 1, "limit": 2}"#, as: "top", in: mount)
        #expect(try listed(mount.path("queries/top")) == ["inv-1", "inv-3"])
        #expect(!(try shell("ls '\(mount.path("queries/top/folder%2Fdoc"))' 2>&1").succeeded), "skipped")
        #expect(!(try shell("ls '\(mount.path("queries/top/inv-2"))' 2>&1").succeeded), "past the limit")
        #expect(!(try shell("ls '\(mount.path("queries/invoices/note"))' 2>&1").succeeded), "not a match")
        #expect(!(try shell("ls '\(mount.path("queries/missing"))' 2>&1").succeeded), "no missing.json")
        // A selector on _attachments sees them as _find does.
        try db.put("scan", ["type": "scan"], attachments: ["page.png": [1, 2, 3]])
        try save(#"{"selector": {"_attachments": {"$exists": true}}}"#, as: "with-files", in: mount)
        #expect(try ls(mount.path("queries/with-files")) == ["scan"])
        #expect(try sh("stat -c %F '\(mount.path("queries/with-files/scan"))'") == "symbolic link\n")
        #expect(!(try shell("ls '\(mount.path("queries/with-files/inv-1"))' 2>&1").succeeded))
        // What cannot be done, and why.
        for (command, words) in [("touch '\(mount.path("queries/notes.txt"))'", "Invalid argument"),
                                 ("mkdir '\(mount.path("queries/new"))'", "Operation not permitted"),
                                 ("mkdir '\(mount.path("queries/invoices"))'", "File exists"),
                                 ("rm '\(mount.path("queries/invoices/inv-1"))'", "Read-only file system"),
                                 ("rmdir '\(mount.path("queries/top"))'", "Read-only file system"),
                                 ("mv '\(mount.path("queries/invoices/inv-1"))' '\(mount.path("docs/moved"))'", "Read-only file system"),
                                 ("ln -s ../../docs/note '\(mount.path("queries/invoices/note"))'", "Operation not permitted"),
                                 ("rmdir '\(mount.path("queries"))'", "Device or resource busy")] {
            let result = try shell(command + " 2>&1")
            #expect(!result.succeeded && result.stdout.contains(words), "\(command): \(result.stdout)")
        }
        #expect(try document(db, "inv-1") != nil, "nothing was removed")
        // Kept with the database: there after a new mount, and shown by a read-only one.
        mount.unmount()
        let again = try MountedDatabase(db.path, arguments: ["--read-only"])
        #expect(try ls(again.path("queries")) == ["invoices", "invoices.json", "top", "top.json", "with-files", "with-files.json"])
        #expect(try listed(again.path("queries/top")) == ["inv-1", "inv-3"])
        let refused = try shell("touch '\(again.path("queries/more.json"))' 2>&1")
        #expect(!refused.succeeded && refused.stdout.contains("Read-only file system"), "\(refused.stdout)")
    }

    @Test func savedQueriesFollowTheDocumentsAndTheirFiles() throws {
        let mount = try MountedDatabase(db.path)
        let results = mount.path("queries/invoices")
        try save(#"{"selector": {"type": "invoice"}}"#, as: "invoices", in: mount)
        #expect(try ls(results) == ["folder%2Fdoc", "inv-1", "inv-2", "inv-3"])
        // Saved by another process: a new match, a match no more, a match deleted.
        try db.put("inv-4", ["type": "invoice", "n": 1])
        try db.put("inv-2", ["type": "paid"])
        try db.deleteDocument("inv-3", revID: try #require(try document(db, "inv-3")).revID)
        #expect(waitUntil(3) { (try? ls(results)) == ["folder%2Fdoc", "inv-1", "inv-4"] }, "\((try? ls(results)) ?? [])")
        // Saved through the mount: the same.
        try sh("rm -r '\(mount.path("docs/inv-1"))'")
        #expect(waitUntil(3) { (try? ls(results)) == ["folder%2Fdoc", "inv-4"] }, "\((try? ls(results)) ?? [])")
        // The file edited the way sed -i edits it (a temporary file renamed over it): the results follow at once.
        try sh("sed -i 's/invoice/paid/' '\(mount.path("queries/invoices.json"))'")
        #expect(try ls(results) == ["inv-2"])
        // Renamed, the folder goes with it; removed, it goes.
        try sh("mv '\(mount.path("queries/invoices.json"))' '\(mount.path("queries/paid.json"))'")
        #expect(try ls(mount.path("queries")) == ["paid", "paid.json"])
        #expect(try ls(mount.path("queries/paid")) == ["inv-2"])
        try sh("rm '\(mount.path("queries/paid.json"))'")
        #expect(try ls(mount.path("queries")) == [])
        #expect(try document(db, "inv-2") != nil, "removing a query removes no document")
    }

    @Test func aFileThatHoldsNoQuerySaysWhyWhenItsFolderIsListed() throws {
        let mount = try MountedDatabase(db.path)
        for (text, reason) in [("{\"selector\": {\"type\": ", "is not a Mango query: invalid JSON"),
                               ("[1, 2]", "is not a Mango query: a query is a JSON object"),
                               (#"{"type": "invoice"}"#, #"no "selector": a query file holds what _find takes"#),
                               (#"{"selector": {"n": {"$near": 1}}}"#, "Unsupported operator: $near"),
                               (#"{"selector": {"type": "invoice"}, "sort": ["type"]}"#, "No index exists for this sort")] {
            try save(text, as: "wrong", in: mount)
            let listing = try shell("ls '\(mount.path("queries/wrong"))' 2>&1")
            #expect(!listing.succeeded && listing.stdout.contains("Invalid argument"), "\(text): \(listing.stdout)")
            let status = try JSONParser.parse(Array(try sh("cat '\(mount.path(".sofa/status.json"))'").utf8))
            let last = status["recent_errors"]?.arrayValue?.last
            #expect(last?["path"] == "/queries/wrong" && last?["reason"]?.stringValue?.contains(reason) == true,
                    "\(text): \(last?.jsonString() ?? "nothing recorded")")
        }
        // The file is kept as written, for its author to mend.
        #expect(try sh("cat '\(mount.path("queries/wrong.json"))'").contains("\"sort\": [\"type\"]"))
        try save(#"{"selector": {"type": "note"}}"#, as: "wrong", in: mount)
        #expect(try ls(mount.path("queries/wrong")) == ["note"])
    }

    @Test func aLargeResultListsPageByPageInTheQuerysOrder() throws {
        // More matches than three pages of the listing (256 each), some skipped and limited.
        try db.inBatch { batch in
            for i in 0..<900 {
                var draft = try db.newDocument(String(format: "big-%04d", i))
                draft.properties = ["type": "big", "n": .integer(Int64(1000 + (i * 7) % 900))]
                try batch.save(draft)
            }
        }
        let mount = try MountedDatabase(db.path)
        try save(#"{"selector": {"type": "big"}}"#, as: "all", in: mount)
        #expect(try listed(mount.path("queries/all")) == (0..<900).map { String(format: "big-%04d", $0) })
        try save(#"{"selector": {"type": "big", "n": {"$gte": 1000}}, "sort": ["n"], "skip": 100, "limit": 700}"#, as: "cut", in: mount)
        let expected = (0..<900).sorted { (1000 + ($0 * 7) % 900) < (1000 + ($1 * 7) % 900) }[100..<800].map { String(format: "big-%04d", $0) }
        #expect(try listed(mount.path("queries/cut")) == expected)
        #expect(try sh("find '\(mount.path("queries/cut"))' -type l | wc -l") == "700\n")
        // ls -l looks up every name: each is a match.
        #expect(try sh("ls -l '\(mount.path("queries/cut"))' | grep -c ' -> ../../docs/big-'") == "700\n")
    }
}
