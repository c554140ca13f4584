import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Mango queries against a real database (`Database.find`): order, paging, projection.
@Suite struct FindTests {
    let directory = TemporaryDirectory()

    func query(_ body: JSONObject) throws -> MangoQuery { try MangoQuery(body) }

    @Test func sortedPagesFollowTheirBookmarksAndDeletedDocumentsNeverMatch() throws {
        let db = try directory.makeDatabase()
        for n in 0..<25 { try db.put(String(format: "d%02d", n), ["n": .integer(Int64(n % 7)), "odd": .bool(n % 2 == 1)]) }
        _ = try db.deleteDocument("d03")
        var seen: [String] = []
        var bookmark: JSONValue = .null
        repeat {
            let page = try db.find(query(["selector": ["odd": true], "sort": [["n": "desc"]], "limit": 4, "bookmark": bookmark]))
            seen += page.documents.compactMap { $0["_id"]?.stringValue }
            bookmark = page.bookmark.map { .string($0.token) } ?? .null
            #expect(page.documents.count <= 4)
        } while bookmark != .null
        // Every odd document but the deleted d03, by n descending, then by id.
        let expected = (0..<25).filter { $0 % 2 == 1 && $0 != 3 }.map { String(format: "d%02d", $0) }
            .sorted { a, b in
                let (x, y) = (Int(a.dropFirst())! % 7, Int(b.dropFirst())! % 7)
                return x != y ? x > y : a > b
            }
        #expect(seen == expected)
    }

    @Test func fieldsRebuildNestedObjectsAndSkipCounts() throws {
        let db = try directory.makeDatabase()
        try db.put("a", ["user": ["name": "Ann", "age": 40], "tags": ["x"]])
        try db.put("b", ["user": ["name": "Bob", "age": 30]])
        let page = try db.find(query(["selector": ["user.age": ["$gte": 30]], "fields": ["user.name", "_id"], "skip": 1]))
        #expect(page.documents == [["user": ["name": "Bob"], "_id": "b"]])
        #expect(page.documentsExamined == 2 && page.bookmark == nil)
        #expect(throws: SofaError.self) { try query(["selector": ["n": 1], "sort": [["n": "asc"], ["m": "desc"]]]) }
        #expect(throws: SofaError.self) { try query(["selector": ["n": 1], "bookmark": "not a bookmark!"]) }
    }
}
