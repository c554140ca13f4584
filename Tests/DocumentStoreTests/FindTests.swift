import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Mango queries against a real database (`Database.find`): indexes, order, paging, projection.
@Suite struct FindTests {
    let directory = TemporaryDirectory()

    func query(_ body: JSONObject) throws -> MangoQuery { try MangoQuery(body) }

    func ids(_ result: FindResult) -> [String] { result.documents.compactMap { $0["_id"]?.stringValue } }

    @Test func sortedPagesFollowTheirBookmarksThroughAnIndex() throws {
        let db = try directory.makeDatabase()
        for n in 0..<25 { try db.put(String(format: "d%02d", n), ["n": .integer(Int64(n % 7)), "odd": .bool(n % 2 == 1)]) }
        _ = try db.deleteDocument("d03")
        let sorted: JSONObject = ["selector": ["odd": true], "sort": [["n": "desc"]], "limit": 4]
        #expect(throws: SofaError.invalidQuery(error: "no_usable_index", reason: "No index exists for this sort, try indexing by the sort fields.")) {
            try db.find(query(sorted))
        }
        try db.createIndex(MangoIndex(request: ["index": ["fields": ["n"]], "ddoc": "by-n", "name": "n"]))
        var seen: [String] = []
        var bookmark: JSONValue = .null
        while true {
            var body = sorted
            body["bookmark"] = bookmark
            let page = try db.find(query(body))
            #expect(page.plan.index?.name == "n" && page.warnings.isEmpty)
            seen += ids(page)
            #expect(page.documents.count <= 4)
            if page.documents.count < 4 { break }
            bookmark = .string(page.bookmark!.token)
        }
        // Every odd document but the deleted d03, by n descending, then by id descending.
        let expected = (0..<25).filter { $0 % 2 == 1 && $0 != 3 }.map { String(format: "d%02d", $0) }
            .sorted { a, b in
                let (x, y) = (Int(a.dropFirst())! % 7, Int(b.dropFirst())! % 7)
                return x != y ? x > y : a > b
            }
        #expect(seen == expected)
    }

    @Test func anIndexReadsOnlyItsRangeAndFollowsEverySave() throws {
        let db = try directory.makeDatabase()
        for n in 0..<200 { try db.put(String(format: "d%03d", n), ["n": .integer(Int64(n)), "type": n % 2 == 0 ? "even" : "odd"]) }
        try db.put("no-n", ["type": "even"])
        try db.createIndex(MangoIndex(request: ["index": ["fields": ["type", "n"]]]))
        let narrow = try query(["selector": ["type": "even", "n": ["$gte": 100, "$lt": 110]], "execution_stats": true])
        var result = try db.find(narrow)
        #expect(ids(result) == stride(from: 100, to: 110, by: 2).map { String(format: "d%03d", $0) })
        #expect(result.keysExamined == 5 && result.documentsExamined == 5, "read \(result.keysExamined) keys")
        // Edits, deletions, purges and replicated revisions all move the entries.
        try db.put("d100", ["n": 500, "type": "even"])
        _ = try db.deleteDocument("d102")
        let d104 = try #require(try db.currentRevision(of: "d104"))
        try db.purge(["d104": [d104.revID]])
        try db.put("new", ["n": 101, "type": "even"])
        result = try db.find(narrow)
        #expect(ids(result) == ["new", "d106", "d108"].sorted { a, b in a == "new" ? true : (b == "new" ? false : a < b) })
        #expect(result.keysExamined == 3)
        // An index on a field no document has is empty; the query is still answered (by it).
        try db.createIndex(MangoIndex(request: ["index": ["fields": ["nobody"]], "name": "nobody", "ddoc": "nobody"]))
        #expect(try ids(db.find(query(["selector": ["nobody": ["$gt": 0]]]))).isEmpty)
        // Removing the index removes its design document; queries fall back to _all_docs with CouchDB's warning.
        let listed = try db.mangoIndexes()
        #expect(listed.count == 2)
        for index in listed { #expect(try db.deleteIndex(designDocument: index.designDocument, name: index.name)) }
        #expect(try db.mangoIndexes().isEmpty && db.currentRevision(of: listed[0].designDocument)?.deleted == true)
        result = try db.find(narrow)
        #expect(result.plan.index == nil && result.warnings.first == "No matching index found, create an index to optimize query time.")
        #expect(result.documents.count == 3 && result.documentsExamined == 200)
    }

    @Test func aDesignDocumentSavedAsCouchDBWritesItDefinesAnIndex() throws {
        let db = try directory.makeDatabase()
        for n in 0..<10 { try db.put("d\(n)", ["n": .integer(Int64(n)), "keep": .bool(n < 5)]) }
        // As _index writes it in CouchDB 3.4, with a partial filter: so a pulled index is built here.
        try db.put("_design/pulled", ["language": "query", "views": ["p": [
            "map": ["fields": ["n": "asc"], "partial_filter_selector": ["keep": true]], "reduce": "_count",
            "options": ["def": ["fields": ["n"], "partial_filter_selector": ["keep": true]]]]]])
        let index = try #require(db.mangoIndexes().first)
        #expect(index.fields == ["n"] && index.partialFilter == ["keep": true])
        // A partial index is used only when named, as CouchDB does.
        #expect(try db.find(query(["selector": ["n": ["$gte": 0]]])).plan.index == nil)
        let named = try db.find(query(["selector": ["n": ["$gte": 0]], "use_index": "pulled"]))
        #expect(named.plan.index == index && ids(named) == ["d0", "d1", "d2", "d3", "d4"])
        // Design documents never match, and a changed definition rebuilds the index.
        #expect(try !ids(db.find(query(["selector": ["_id": ["$gt": nil]]]))).contains { $0.hasPrefix("_design/") })
        try db.put("_design/pulled", ["language": "query", "views": ["p": ["map": ["fields": ["n": "asc"]], "reduce": "_count"]]])
        #expect(try ids(db.find(query(["selector": ["n": ["$gte": 7]]]))) == ["d7", "d8", "d9"])
        #expect(throws: SofaError.invalidQuery(error: "invalid_index", reason: "_design/nope specified by `use_index` could not be found or it is not suitable.")) {
            try db.find(query(["selector": ["n": 1], "use_index": "nope", "allow_fallback": false]))
        }
    }

    @Test func indexesSurviveReopeningAndAreBuiltWhenAnOlderDatabaseIsUpgraded() throws {
        let db = try directory.makeDatabase()
        for n in 0..<20 { try db.put("d\(n)", ["n": .integer(Int64(n))]) }
        try db.createIndex(MangoIndex(request: ["index": ["fields": ["n"]], "ddoc": "i", "name": "n"]))
        let path = db.path
        // Make it a version 4 file (no index tables, no step names), as an older Sofa left it.
        try sqlite(path, "DROP TABLE mango_keys; DROP TABLE mango_indexes; DROP TABLE schema_steps; PRAGMA user_version = 4;")
        let reopened = try Database.open(at: path)
        let result = try reopened.find(query(["selector": ["n": ["$gt": 16]], "execution_stats": true]))
        #expect(result.plan.index?.name == "n" && ids(result) == ["d17", "d18", "d19"] && result.keysExamined == 3)
    }

    @Test func fieldsRebuildNestedObjectsAndSkipCounts() throws {
        let db = try directory.makeDatabase()
        try db.put("a", ["user": ["name": "Ann", "age": 40], "tags": ["x"]])
        try db.put("b", ["user": ["name": "Bob", "age": 30]])
        let page = try db.find(query(["selector": ["user.age": ["$gte": 30]], "fields": ["user.name", "_id"], "skip": 1]))
        #expect(page.documents == [["user": ["name": "Bob"], "_id": "b"]])
        #expect(page.documentsExamined == 2 && page.bookmark == .after("b"))
        #expect(throws: SofaError.invalidQuery(error: "unsupported_mixed_sort", reason: "Sorts currently only support a single direction for all fields.")) {
            try query(["selector": ["n": 1], "sort": [["n": "asc"], ["m": "desc"]]])
        }
        #expect(throws: SofaError.invalidQuery(error: "invalid_bookmark", reason: #"Invalid bookmark value: "not a bookmark!""#)) {
            try query(["selector": ["n": 1], "bookmark": "not a bookmark!"])
        }
    }

    /// Runs SQL on a database's file with Python's sqlite3 module.
    func sqlite(_ path: String, _ sql: String) throws {
        let script = "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.close()"
        let result = try shell("python3 -c '\(script)' '\(path)/db.sqlite3' '\(sql)'")
        #expect(result.status == 0, "\(result.stderr)")
    }
}
