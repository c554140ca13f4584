import DocumentModel
import Foundation
import Testing
import TestSupport

@Suite struct JSONTestSuiteConformance {
    static let directory = fixturesDirectory + "/JSONTestSuite/test_parsing"

    static func files(prefix: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix(prefix) }.sorted()
    }

    @Test func suiteIsPresent() {
        #expect(Self.files(prefix: "y_").count > 90, "JSONTestSuite not found at \(Self.directory)")
        #expect(Self.files(prefix: "n_").count > 150)
    }

    @Test func acceptsEveryValidDocument() throws {
        for file in Self.files(prefix: "y_") {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: "\(Self.directory)/\(file)")))
            do {
                let value = try JSONValue(parsing: bytes)
                // What we write reads back as the same value.
                #expect(try JSONValue(parsing: value.serialized()) == value, "\(file) does not round-trip")
                #expect(try JSONValue(parsing: value.serialized(.pretty)) == value, "\(file) pretty form does not round-trip")
            } catch {
                Issue.record("\(file) was refused: \(error)")
            }
        }
    }

    @Test func refusesEveryInvalidDocument() throws {
        for file in Self.files(prefix: "n_") {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: "\(Self.directory)/\(file)")))
            #expect(throws: JSONParseError.self, "\(file) was accepted") { try JSONValue(parsing: bytes) }
        }
    }

    @Test func implementationDefinedDocumentsNeitherCrashNorHang() throws {
        var outcomes: [String: Bool] = [:]
        for file in Self.files(prefix: "i_") {
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: "\(Self.directory)/\(file)")))
            outcomes[file] = (try? JSONValue(parsing: bytes)) != nil
        }
        #expect(outcomes.count == Self.files(prefix: "i_").count)
        // Big integers are kept exactly, as CouchDB keeps them.
        #expect(outcomes["i_number_too_big_pos_int.json"] == true)
        // Numbers that overflow a double are refused rather than turned into infinity.
        #expect(outcomes["i_number_huge_exp.json"] == false)
        // Lone surrogates cannot be represented and are refused.
        #expect(outcomes["i_string_lone_second_surrogate.json"] == false)
    }
}

@Suite struct JSONValueTests {
    @Test func keepsKeyOrderAndNumberKinds() throws {
        let value = try JSONValue(parsing: #"{"z":1,"a":1.0,"m":true,"big":18446744073709551615,"neg":-9223372036854775809,"e":1e-7}"#)
        guard case .object(let object) = value else { Issue.record("not an object"); return }
        #expect(object.keys == ["z", "a", "m", "big", "neg", "e"])
        #expect(object["z"] == .integer(1))
        #expect(object["a"] == .double(1.0))
        #expect(object["m"] == .bool(true))
        #expect(object["big"] == .bigInteger("18446744073709551615"))
        #expect(object["neg"] == .bigInteger("-9223372036854775809"))
        #expect(value.jsonString() == #"{"z":1,"a":1.0,"m":true,"big":18446744073709551615,"neg":-9223372036854775809,"e":1e-7}"#)
    }

    @Test func canonicalFormSortsKeysByCodePoint() throws {
        let value = try JSONValue(parsing: #"{"b":{"y":1,"x":2},"a":[3,{"é":1,"z":2}],"B":null}"#)
        #expect(value.jsonString(.canonical) == #"{"B":null,"a":[3,{"z":2,"é":1}],"b":{"x":2,"y":1}}"#)
    }

    @Test func writesStringsAsCouchDBDoes() throws {
        let value = try JSONValue(parsing: #"["\u00e9\ud83d\ude00", "\/", "\u0001", "a\"b\\c\n", "\u2028"]"#)
        #expect(value.jsonString() == "[\"é😀\",\"/\",\"\\u0001\",\"a\\\"b\\\\c\\n\",\"\u{2028}\"]")
    }

    @Test func prettyPrintsWithTrailingNewline() throws {
        let value = try JSONValue(parsing: #"{"a":[1,{}],"b":{}}"#)
        #expect(value.prettyPrinted() == "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": {}\n}\n")
    }

    @Test func duplicateKeysKeepFirstPositionAndLastValue() throws {
        let value = try JSONValue(parsing: #"{"a":1,"b":2,"a":3}"#)
        #expect(value.jsonString() == #"{"a":3,"b":2}"#)
    }

    @Test func errorsSayLineAndColumn() {
        do {
            _ = try JSONValue(parsing: "{\n  \"a\": 1,\n  \"b\" 2\n}")
            Issue.record("accepted invalid JSON")
        } catch {
            #expect(error.line == 3)
            #expect(error.column == 7)
            #expect(error.description.contains("line 3, column 7"))
        }
    }

    @Test func refusesTooDeepNestingWithoutCrashing() {
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(throws: JSONParseError.self) { try JSONValue(parsing: deep) }
        let fine = String(repeating: "[", count: JSONParser.maximumDepth) + String(repeating: "]", count: JSONParser.maximumDepth)
        #expect((try? JSONValue(parsing: fine)) != nil)
    }

    @Test func doublesRoundTripInShortestForm() throws {
        for text in ["0.1", "1.0", "-0.0", "6.02e+23", "1e-7", "1.5e-300", "100.0", "5e-324", "1.7976931348623157e+308"] {
            let value = try JSONValue(parsing: text)
            #expect(value.jsonString() == text, "\(text) was written as \(value.jsonString())")
        }
        #expect(try JSONValue(parsing: "2.5e+3").jsonString() == "2500.0")
    }
}

/// Mutates the conformance suite's documents at random (bit flips, truncations,
/// insertions, splices) and checks that the parser never crashes or hangs, and
/// that everything it accepts round-trips through the writer.
@Suite struct JSONFuzzTests {
    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    @Test func mutatedInputsNeverCrashAndAcceptedOnesRoundTrip() throws {
        let directory = JSONTestSuiteConformance.directory
        let corpus = try JSONTestSuiteConformance.files(prefix: "").map {
            try [UInt8](Data(contentsOf: URL(fileURLWithPath: "\(directory)/\($0)")))
        }.filter { $0.count < 4096 }
        #expect(corpus.count > 250)
        var random = SplitMix(state: 20261122)
        let tokens = Array("{}[]\",:0123456789.eE+-\\u tfnalrse\u{0}\u{7f}é".utf8)
        var accepted = 0
        for _ in 0..<60_000 {
            var input = corpus.randomElement(using: &random)!
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                switch Int.random(in: 0..<5, using: &random) {
                case 0 where !input.isEmpty:
                    input[Int.random(in: 0..<input.count, using: &random)] ^= UInt8(1 << Int.random(in: 0..<8, using: &random))
                case 1 where !input.isEmpty:
                    input.removeLast(Int.random(in: 0...input.count, using: &random) / 2)
                case 2:
                    input.insert(tokens.randomElement(using: &random)!, at: Int.random(in: 0...input.count, using: &random))
                case 3:
                    let other = corpus.randomElement(using: &random)!
                    input += other.prefix(Int.random(in: 0...other.count, using: &random))
                default:
                    if !input.isEmpty { input.remove(at: Int.random(in: 0..<input.count, using: &random)) }
                }
            }
            if let value = try? JSONValue(parsing: input) {
                accepted += 1
                let again = try JSONValue(parsing: value.serialized())
                #expect(again == value)
                #expect(try JSONValue(parsing: value.serialized(.canonical)).serialized(.canonical) == value.serialized(.canonical))
            }
        }
        #expect(accepted > 1000, "the fuzzer should also produce valid documents")
    }
}

/// Erlang's term order as CouchDB sees JSON (the order of one document's rows of one key).
@Suite struct ErlangTermOrderTests {
    @Test func jsonSortsAsErlangSortsJiffysTerms() {
        // Ascending, as `lists:sort` puts them: numbers, atoms by name, objects, arrays, strings.
        let sorted: [JSONValue] = [-1, 0, 1.5, 2, .bigInteger("123456789012345678901234567890"), false, .null, true,
                                   ["a": 2], ["a": 2, "b": 0], ["z": 1], [], [1], [1, 2], [2], "", "A", "a", "ab", "é"]
        for (index, value) in sorted.enumerated() {
            for later in sorted[(index + 1)...] {
                #expect(value.erlangTermPrecedes(later), "\(value) < \(later)")
                #expect(!later.erlangTermPrecedes(value), "not \(later) < \(value)")
            }
            #expect(!value.erlangTermPrecedes(value))
        }
        #expect(!JSONValue.integer(1).erlangTermPrecedes(.double(1)) && !JSONValue.double(1).erlangTermPrecedes(.integer(1)), "1 == 1.0")
    }
}
