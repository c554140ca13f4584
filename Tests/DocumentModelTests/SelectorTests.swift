import DocumentModel
import Testing

@Suite struct SelectorTests {
    func matches(_ selector: String, _ document: String) throws -> Bool {
        let parsed = try Selector(JSONParser.parse(Array(selector.utf8)))
        guard case .object(let object) = try JSONParser.parse(Array(document.utf8)) else { return false }
        return parsed.matches(object)
    }

    @Test func equalityAndComparisons() throws {
        let doc = #"{"_id":"a","type":"note","n":5,"big":18446744073709551615,"tags":["x","y"],"meta":{"author":"ann"}}"#
        #expect(try matches(#"{"type":"note"}"#, doc))
        #expect(try !matches(#"{"type":"task"}"#, doc))
        #expect(try matches(#"{"n":{"$gt":4,"$lte":5}}"#, doc))
        #expect(try !matches(#"{"n":{"$lt":5}}"#, doc))
        #expect(try matches(#"{"n":5.0}"#, doc), "numbers compare by value")
        #expect(try matches(#"{"meta.author":"ann"}"#, doc))
        #expect(try matches(#"{"meta":{"author":"ann"}}"#, doc))
        #expect(try matches(#"{"tags":{"$all":["y"]},"missing":{"$exists":false}}"#, doc))
        #expect(try matches(#"{"n":{"$in":[1,5]},"type":{"$nin":["task"]}}"#, doc))
        #expect(try matches(#"{"$or":[{"type":"task"},{"n":{"$gte":5}}]}"#, doc))
        #expect(try !matches(#"{"$nor":[{"type":"note"}]}"#, doc))
        #expect(try matches(#"{"type":{"$regex":"^no"}}"#, doc))
        #expect(try matches(#"{"tags":{"$size":2,"$elemMatch":{"$eq":"x"}}}"#, doc))
        #expect(try matches(#"{"type":{"$gt":5}}"#, doc), "strings collate after numbers")
        #expect(try matches(#"{"n":{"$mod":[2,1]},"big":{"$type":"number"}}"#, doc))
        #expect(try matches(#"{"absent":{"$ne":1}}"#, doc))
        #expect(try !matches(#"{"absent":1}"#, doc))
    }

    @Test func unknownOperatorsAreRefused() {
        #expect(throws: SofaError.self) { try Selector(JSONParser.parse(Array(#"{"n":{"$near":1}}"#.utf8))) }
        #expect(throws: SofaError.self) { try Selector(JSONParser.parse(Array("[1]".utf8))) }
    }
}
