import DocumentModel
import DocumentStore
import Foundation
import Testing

/// Fleece as Couchbase's format description gives it, byte for byte, and damaged Fleece.
/// (Bodies LiteCore itself wrote are read in CouchbaseLiteFileTests.)
struct FleeceTests {
    @Test func theFormatDescriptionsExamplesRead() throws {
        // {"foo": 123}, narrow: the string, the dictionary, a pointer to its key, the trailer.
        let narrow: [UInt8] = [0x43, 0x66, 0x6F, 0x6F, 0x70, 0x01, 0x80, 0x03, 0x00, 0x7B, 0x80, 0x03]
        #expect(try FleeceReader.decode(narrow) == ["foo": 123])
        // The same as a wide dictionary: 4-byte slots, the key inline.
        let wide: [UInt8] = [0x78, 0x01, 0x43, 0x66, 0x6F, 0x6F, 0x00, 0x7B, 0x00, 0x00, 0x80, 0x05]
        #expect(try FleeceReader.decode(wide) == ["foo": 123])
        // A root that is an inline value, alone.
        #expect(try FleeceReader.decode([0x38, 0x00]) == true)
        #expect(try FleeceReader.decode([0x0F, 0xFF]) == -1)  // 12-bit small integers are signed
        #expect(try FleeceReader.decode([0x07, 0xFF]) == 2047)
    }

    @Test func integersFloatsStringsAndSharedKeysRead() throws {
        // [-129 (2 bytes), 2^63 (unsigned, 8 bytes), 1.5 (float), "x"*16 (varint length)]
        var bytes: [UInt8] = [0x11, 0x7F, 0xFF, 0x00]  // int, 2 bytes: 0xFF7F = -129 (padded)
        bytes += [0x1F, 0, 0, 0, 0, 0, 0, 0, 0x80, 0x00]  // unsigned, 8 bytes
        bytes += [0x20, 0x00] + Array(withUnsafeBytes(of: Float(1.5).bitPattern.littleEndian, Array.init))
        bytes += [0x4F, 16] + Array(repeating: 0x78, count: 16)
        let array = bytes.count
        bytes += [0x60, 0x04]
        for target in [0, 4, 14, 20] { bytes += pointer(from: bytes.count, to: target) }
        bytes += pointer(from: bytes.count, to: array)
        let value = try FleeceReader.decode(bytes)
        #expect(value == [-129, .bigInteger("9223372036854775808"), 1.5, .string(String(repeating: "x", count: 16))])

        // {sharedKey 1: "v"}: a dictionary key is a shared key's number.
        let shared: [UInt8] = [0x70, 0x01, 0x00, 0x01, 0x41, 0x76, 0x80, 0x03]
        #expect(try FleeceReader.decode(shared, sharedKeys: ["a", "name"]) == ["name": "v"])
        #expect(throws: FleeceError.self) { try FleeceReader.decode(shared, sharedKeys: ["a"]) }
    }

    /// A narrow pointer written at `from` to the value at `to`.
    func pointer(from: Int, to: Int) -> [UInt8] {
        let units = (from - to) / 2
        return [0x80 | UInt8(units >> 8), UInt8(units & 0xFF)]
    }

    @Test func damagedFleeceIsAnErrorNeverACrash() throws {
        for damaged: [UInt8] in [[], [0x43], [0x80, 0x00], [0x80, 0x05], [0x43, 0x66, 0x80, 0x01], [0x4F, 0xFF, 0x80, 0x01],
                                 [0x70, 0x05, 0x80, 0x01], [0xC0, 0x01, 0x80, 0x01], [0x11, 0x7F, 0x80, 0x01]] {
            #expect(throws: FleeceError.self, "\(damaged)") { try FleeceReader.decode(damaged) }
        }
        // Every single-byte change of a real body decodes or throws; none crashes or loops.
        let body: [UInt8] = [0x43, 0x41, 0x6E, 0x6E, 0x70, 0x02, 0x00, 0x00, 0x80, 0x04, 0x00, 0x01, 0x00, 0x03, 0x80, 0x05]
        #expect(try FleeceReader.decode(body, sharedKeys: ["name", "n"]) == ["name": "Ann", "n": 3])
        for index in body.indices {
            for replacement: UInt8 in [0x00, 0x7F, 0x80, 0xFF, 0x0F, 0x67, 0x77, 0x4F] {
                var changed = body
                changed[index] = replacement
                _ = try? FleeceReader.decode(changed, sharedKeys: ["name", "n"])
            }
        }
        // Nesting past the limit.
        var deep: [UInt8] = [0x60, 0x00]
        for _ in 0..<(FleeceReader.maximumDepth + 5) {
            let previous = deep.count - 2
            deep += [0x60, 0x01] + pointer(from: deep.count + 2, to: previous)
        }
        deep += pointer(from: deep.count, to: deep.count - 4)
        #expect(throws: FleeceError.self) { try FleeceReader.decode(deep) }
    }

    @Test func liteCoreRevisionTreesRead() throws {
        // As LiteCore 3.2 wrote them for "a" (3 revisions) in a database `cblite` made.
        let extra = Array(hex: "0000001E000102150386E864EE29C16440808B668B8438D4AF951FD001000000001E0002001502F3A1CF0D30CCB624E4646760CB4DF7A406AB392F020000001EFFFF001501F32D429B2CD1A08540E8E9969B03F949C556330D010000000000000000")
        let tree = try LiteCoreRevisionTree(decoding: extra, docID: "a")
        #expect(tree.revisions.map(\.id.description) == ["3-86e864ee29c16440808b668b8438d4af951fd001",
                                                          "2-f3a1cf0d30ccb624e4646760cb4df7a406ab392f",
                                                          "1-f32d429b2cd1a08540e8e9969b03f949c556330d"])
        #expect(tree.revisions.map(\.parent) == [1, 2, nil])
        #expect(tree.revisions[0].isLeaf && !tree.revisions[1].isLeaf)
        #expect(tree.history(of: 0).count == 3)
        #expect(throws: SofaError.self) { try LiteCoreRevisionTree(decoding: Array(extra.prefix(40)), docID: "a") }
        #expect(throws: SofaError.self) { try LiteCoreRevisionTree.revisionID([0x00, 0x01, 0x02], docID: "a") }  // a version vector
    }
}

extension Array where Element == UInt8 {
    init(hex: String) {
        var bytes: [UInt8] = []
        var iterator = hex.makeIterator()
        while let high = iterator.next(), let low = iterator.next() { bytes.append(UInt8(String([high, low]), radix: 16)!) }
        self = bytes
    }
}
