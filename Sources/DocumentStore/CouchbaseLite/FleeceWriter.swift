import DocumentModel
import Foundation

/// Writes Fleece as Couchbase Lite reads it: values written before the collections that hold
/// them, collections wide (4-byte slots: values up to 4 bytes inline, others by pointer),
/// dictionary keys sorted as Fleece looks them up (shared-key numbers first, by number,
/// then strings by their bytes), the root reached from the last two bytes.
///
/// Keys go through `SharedKeys` as LiteCore's encoder does: a key already in the database's
/// table is written as its number (a reader that finds it in the table looks it up by
/// number only), and an eligible new one is added to the table.
public struct FleeceWriter {
    private var output: [UInt8] = []
    private var sharedKeys: SharedKeys

    /// The database's shared-key table as the writer leaves it (it may have grown).
    public var keys: SharedKeys { sharedKeys }

    public init(sharedKeys: SharedKeys) { self.sharedKeys = sharedKeys }

    /// `value` as a Fleece document.
    public mutating func encode(_ value: JSONValue) -> [UInt8] {
        output = []
        output.reserveCapacity(256)
        let root = write(value)
        switch root {
        case .inline(let bytes) where bytes.count == 2:
            output += bytes
        case .inline(let bytes):
            // A 4-byte value: written out, then pointed to.
            let at = output.count
            output += bytes
            pad()
            appendNarrowPointer(to: at)
        case .at(let offset):
            appendNarrowPointer(to: offset)
        }
        return output
    }

    /// The last two bytes: a narrow pointer to `offset`, or to a wide pointer to it when it is
    /// further than a narrow pointer reaches.
    private mutating func appendNarrowPointer(to offset: Int) {
        var target = offset
        if output.count - target > 0x7FFE {
            let wide = output.count
            output += Self.widePointer(from: wide, to: target)
            target = wide
        }
        let units = (output.count - target) / 2
        output += [0x80 | UInt8(units >> 8), UInt8(units & 0xFF)]
    }

    private static func widePointer(from: Int, to: Int) -> [UInt8] {
        let units = UInt32((from - to) / 2)
        return [0x80 | UInt8(units >> 24), UInt8((units >> 16) & 0xFF), UInt8((units >> 8) & 0xFF), UInt8(units & 0xFF)]
    }

    private mutating func pad() { if output.count % 2 == 1 { output.append(0) } }

    /// Where a written value is: small enough to sit in a wide slot, or at an offset.
    private enum Written {
        case inline([UInt8])
        case at(Int)
    }

    /// The bytes of a value that is not a collection.
    private static func scalar(_ value: JSONValue) -> [UInt8] {
        switch value {
        case .null: return [0x30, 0x00]
        case .bool(let flag): return [flag ? 0x38 : 0x34, 0x00]
        case .integer(let number): return integer(number)
        case .bigInteger(let text):
            if let unsigned = UInt64(text) { return unsignedInteger(unsigned) }
            return double(Double(text) ?? 0)
        case .double(let number):
            if number.rounded() == number, abs(number) < 9.2e18 { return integer(Int64(number)) }
            return double(number)
        case .string(let text):
            var bytes = Array(text.utf8)
            var header: [UInt8]
            if bytes.count < 15 {
                header = [0x40 | UInt8(bytes.count)]
            } else {
                header = [0x4F]
                var count = bytes.count
                while count >= 0x80 {
                    header.append(UInt8(count & 0x7F) | 0x80)
                    count >>= 7
                }
                header.append(UInt8(count))
            }
            bytes = header + bytes
            if bytes.count == 1 { bytes.append(0) }
            return bytes
        case .array, .object:
            preconditionFailure("collections are written by write(_:)")
        }
    }

    private static func integer(_ number: Int64) -> [UInt8] {
        if (-2048...2047).contains(number) {
            let raw = UInt16(bitPattern: Int16(number)) & 0x0FFF
            return [UInt8(raw >> 8), UInt8(raw & 0xFF)]
        }
        var count = 1
        while count < 8, !(Int64(-1) << (8 * count - 1) ... (Int64(1) << (8 * count - 1)) - 1).contains(number) { count += 1 }
        let pattern = UInt64(bitPattern: number)
        return [0x10 | UInt8(count - 1)] + (0..<count).map { UInt8((pattern >> (8 * $0)) & 0xFF) }
    }

    private static func unsignedInteger(_ number: UInt64) -> [UInt8] {
        if number <= UInt64(Int64.max) { return integer(Int64(number)) }
        return [0x18 | 0x07] + (0..<8).map { UInt8((number >> (8 * $0)) & 0xFF) }
    }

    private static func double(_ number: Double) -> [UInt8] {
        if Double(Float(number)) == number || number.isNaN {
            return [0x20, 0x00] + withUnsafeBytes(of: Float(number).bitPattern.littleEndian, Array.init)
        }
        return [0x28, 0x00] + withUnsafeBytes(of: number.bitPattern.littleEndian, Array.init)
    }

    /// Writes `value` (its members first), returning where it is.
    private mutating func write(_ value: JSONValue) -> Written {
        switch value {
        case .array(let items):
            let slots = items.map { write($0) }
            return .at(writeCollection(tag: 0x60, slots: slots, count: items.count))
        case .object(let object):
            var entries: [(key: Key, value: JSONValue)] = object.entries.map { (sharedKeys.key(for: $0.key), $0.value) }
            entries.sort { $0.key < $1.key }
            var slots: [Written] = []
            slots.reserveCapacity(entries.count * 2)
            for entry in entries {
                switch entry.key {
                case .shared(let number): slots.append(.inline(Self.integer(Int64(number))))
                case .string(let text): slots.append(write(.string(text)))
                }
                slots.append(write(entry.value))
            }
            return .at(writeCollection(tag: 0x70, slots: slots, count: entries.count))
        default:
            let bytes = Self.scalar(value)
            if bytes.count <= 4 { return .inline(bytes) }
            pad()
            let at = output.count
            output += bytes
            pad()
            return .at(at)
        }
    }

    /// A wide array or dictionary: its header (a long count as 2047 and a varint), then a
    /// 4-byte slot per value: the value itself, or a pointer back to it.
    private mutating func writeCollection(tag: UInt8, slots: [Written], count: Int) -> Int {
        pad()
        let start = output.count
        if count < 0x07FF {
            output += [tag | 0x08 | UInt8(count >> 8), UInt8(count & 0xFF)]
        } else {
            output += [tag | 0x08 | 0x07, 0xFF]
            var extra = count - 0x07FF
            while extra >= 0x80 {
                output.append(UInt8(extra & 0x7F) | 0x80)
                extra >>= 7
            }
            output.append(UInt8(extra))
            pad()
        }
        for slot in slots {
            switch slot {
            case .inline(let bytes):
                output += bytes + [UInt8](repeating: 0, count: 4 - bytes.count)
            case .at(let offset):
                output += Self.widePointer(from: output.count, to: offset)
            }
        }
        return start
    }

    /// A dictionary key: a shared key's number, or the string itself.
    enum Key: Comparable {
        case shared(Int)
        case string(String)

        static func < (lhs: Key, rhs: Key) -> Bool {
            switch (lhs, rhs) {
            case let (.shared(a), .shared(b)): a < b
            case (.shared, .string): true
            case (.string, .shared): false
            case let (.string(a), .string(b)): a.utf8.lexicographicallyPrecedes(b.utf8)
            }
        }
    }
}

/// A database's shared keys (Fleece's `SharedKeys`, kept in `kv_info`): dictionary keys written
/// as small numbers. At most 2048; only short keys of letters, digits, `_` and `-` are added.
public struct SharedKeys: Sendable {
    public private(set) var keys: [String]
    private var numbers: [String: Int]
    /// Keys added since it was read (the table must be saved with what used them).
    public private(set) var added = 0

    public static let maximumCount = 2048
    public static let maximumKeyLength = 16

    public init(_ keys: [String]) {
        self.keys = keys
        numbers = Dictionary(keys.enumerated().map { ($0.element, $0.offset) }, uniquingKeysWith: { first, _ in first })
    }

    /// The number of `key`, adding it when it is eligible and there is room.
    mutating func key(for key: String) -> FleeceWriter.Key {
        if let number = numbers[key] { return .shared(number) }
        guard keys.count < Self.maximumCount, Self.isEligible(key) else { return .string(key) }
        numbers[key] = keys.count
        keys.append(key)
        added += 1
        return .shared(keys.count - 1)
    }

    static func isEligible(_ key: String) -> Bool {
        let bytes = key.utf8
        return !bytes.isEmpty && bytes.count <= maximumKeyLength
            && bytes.allSatisfy { (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) || $0 == 0x5F || $0 == 0x2D }
    }
}
