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
        #expect(try !matches(#"{"absent":1}"#, doc))
    }

    /// CouchDB 3.4's answers, checked against a live CouchDB (`MangoTests` does it side by side).
    @Test func missingFieldsNegationsAndCollationAreCouchDBs() throws {
        let doc = #"{"_id":"a","n":5,"s":"b","o":{"k":1}}"#
        // A condition on a field the document lacks is false, negated or not; only $exists:false holds.
        #expect(try !matches(#"{"absent":{"$ne":1}}"#, doc))
        #expect(try !matches(#"{"absent":{"$nin":[1]}}"#, doc))
        #expect(try !matches(#"{"$not":{"absent":1}}"#, doc))
        #expect(try !matches(#"{"$nor":[{"absent":1}]}"#, doc))
        #expect(try matches(#"{"absent":{"$not":{"$exists":true}}}"#, doc))
        #expect(try matches(#"{"absent":{"$exists":false}}"#, doc))
        #expect(try matches(#"{"$not":{"n":4}}"#, doc))
        #expect(try !matches(#"{"$not":{"$or":[{"n":4},{"s":"b"}]}}"#, doc))
        // Strings by the Unicode Collation Algorithm: a < A < b < B.
        #expect(try matches(#"{"s":{"$gt":"A","$lt":"B"}}"#, doc))
        #expect(try !matches(#"{"s":{"$gt":"B"}}"#, doc))
        #expect(Collation.compare("a", "A") < 0 && Collation.compare("A", "b") < 0 && Collation.compare("b", "B") < 0)
        // Objects hold subfields; $beginsWith, $keyMapMatch.
        #expect(try matches(#"{"o":{"k":{"$gte":1}}}"#, doc))
        #expect(try matches(#"{"s":{"$beginsWith":"b"},"o":{"$keyMapMatch":{"$eq":"k"}}}"#, doc))
    }

    @Test func keysSortAsCollationDoes() {
        let values: [JSONValue] = [.null, false, true, -1.5, 0, 2, 10, "a", "A", "b", "B", "é", [], [1], [1, 2], ["a"], [:], ["a": 1]]
        for (i, a) in values.enumerated() {
            for b in values[(i + 1)...] {
                #expect(Collation.compare(a, b) < 0, "\(a.jsonString()) < \(b.jsonString())")
                #expect(Collation.key(a).lexicographicallyPrecedes(Collation.key(b)), "key of \(a.jsonString()) < key of \(b.jsonString())")
            }
        }
        #expect(Collation.key(0) == Collation.key(-0.0) && Collation.key(2) == Collation.key(2.0))
    }

    @Test func aRegexThatBacktracksForEverIsCutShort() throws {
        let selector = try Selector(JSONParser.parse(Array(#"{"s":{"$regex":"^(a+)+$"}}"#.utf8)))
        let started = ContinuousClock.now
        #expect(!selector.matches(["s": .string(String(repeating: "a", count: 40) + "b")]))
        #expect(selector.regexTimeouts == 1)
        #expect(ContinuousClock.now - started < .seconds(30), "ICU's time limit bounds it")
        #expect(selector.matches(["s": "aaa"]))
    }

    @Test func invalidSelectorsAreRefusedWithCouchDBsErrors() {
        func error(_ text: String) -> SofaError? {
            do { _ = try Selector(JSONParser.parse(Array(text.utf8))) } catch let error as SofaError { return error } catch {}
            return nil
        }
        #expect(error(#"{"n":{"$foo":1}}"#) == .invalidQuery(error: "invalid_operator", reason: "Invalid operator: $foo"))
        #expect(error(#"{"n":{"$near":1}}"#) == .invalidQuery(error: "not_supported", reason: "Unsupported operator: $near"))
        #expect(error("[1]") == .invalidQuery(error: "invalid_selector_json", reason: "Selector must be a JSON object, not: [1]"))
        #expect(error(#"{"n":{"$in":2}}"#) == .invalidQuery(error: "bad_arg", reason: "Bad argument for operator $in: 2"))
        #expect(error(#"{"n":{"$exists":1}}"#) == .invalidQuery(error: "bad_arg", reason: "Bad argument for operator $exists: 1"))
        #expect(error(#"{"n":{"$regex":"("}}"#) == .invalidQuery(error: "bad_arg", reason: #"Bad argument for operator $regex: "(""#))
        #expect(error(#"{"n":{"$mod":[0,1]}}"#) == .invalidQuery(error: "bad_arg", reason: "Bad argument for operator $mod: [0,1]"))
    }
}
