import DocumentModel
import Foundation

/// Reads Fleece, the binary form Couchbase Lite keeps documents in (format described in
/// couchbase/fleece's `Fleece.md`): 2-byte-aligned values, the root at the end, collections
/// of 2-byte (narrow) or 4-byte (wide) slots, longer values reached by pointers that point
/// back. Dictionary keys may be small integers naming an entry of the database's shared
/// keys (`kv_info`'s `SharedKeys`, itself a Fleece array of strings).
///
/// Everything is checked: a pointer outside the data or not pointing back, a length past
/// the end, a shared key the table lacks, nesting deeper than `maximumDepth` are each a
/// `FleeceError` naming what and where, never a crash or a partial value.
public struct FleeceReader {
    public let bytes: [UInt8]
    public let sharedKeys: [String]
    public static let maximumDepth = 512

    public init(_ bytes: [UInt8], sharedKeys: [String] = []) {
        self.bytes = bytes
        self.sharedKeys = sharedKeys
    }

    /// The whole document as JSON. Binary values become base64 strings (as Couchbase Lite's
    /// own JSON conversion writes them).
    public static func decode(_ bytes: [UInt8], sharedKeys: [String] = []) throws(FleeceError) -> JSONValue {
        let reader = FleeceReader(bytes, sharedKeys: sharedKeys)
        let root = try reader.root()
        return try reader.value(at: root.at, end: root.end, depth: 0)
    }

    /// Where the root value starts (the last two bytes, or where they point), and where it must end.
    func root() throws(FleeceError) -> (at: Int, end: Int) {
        guard bytes.count >= 2, bytes.count % 2 == 0 else { throw .init("\(bytes.count) bytes: Fleece data is an even number of bytes, at least 2") }
        let last = bytes.count - 2
        guard bytes[last] & 0x80 != 0 else {
            guard bytes.count == 2 else { throw .init("the root is an inline value but data comes before it") }
            return (last, bytes.count)
        }
        return try follow(pointerAt: last, wide: false, limit: last)
    }

    /// The value a pointer at `offset` leads to (through further pointers, which are wide),
    /// checked to lie before `limit`, and where it must end: before the pointer that led to it.
    private func follow(pointerAt offset: Int, wide: Bool, limit: Int) throws(FleeceError) -> (at: Int, end: Int) {
        var at = offset
        var isWide = wide
        var bound = limit
        while bytes[at] & 0x80 != 0 {
            guard bytes[at] & 0x40 == 0 else { throw .init("an external pointer at \(at) (a delta against another document)") }
            let distance: Int
            if isWide {
                guard at + 4 <= bytes.count else { throw .init("a wide pointer at \(at) runs past the end") }
                distance = Int((UInt32(bytes[at]) << 24 | UInt32(bytes[at + 1]) << 16 | UInt32(bytes[at + 2]) << 8 | UInt32(bytes[at + 3])) & 0x3FFF_FFFF) << 1
            } else {
                distance = Int((UInt16(bytes[at]) << 8 | UInt16(bytes[at + 1])) & 0x3FFF) << 1
            }
            let target = at - distance
            guard distance > 0, target >= 0, target < bound else { throw .init("a pointer at \(at) leads outside the data (\(distance) bytes back)") }
            (bound, at, isWide) = (at, target, true)  // pointers reached through pointers are wide
        }
        return (at, bound)
    }

    /// A varint (7 bits a byte, low first) at `offset`: its value and length.
    private func varint(at offset: Int) throws(FleeceError) -> (value: Int, length: Int) {
        var value = 0
        var shift = 0
        var at = offset
        while at < bytes.count, shift < 63 {
            let byte = bytes[at]
            value |= Int(byte & 0x7F) << shift
            at += 1
            if byte & 0x80 == 0 { return (value, at - offset) }
            shift += 7
        }
        throw .init("a length at \(offset) runs past the end")
    }

    /// Checks that `count` bytes from `offset` lie before `end`.
    private func need(_ count: Int, at offset: Int, end: Int, _ what: String) throws(FleeceError) {
        guard count >= 0, offset + count <= end else { throw .init("\(what) at \(offset) runs past its end (\(count) bytes)") }
    }

    /// The bytes of a string or binary value at `offset`.
    private func stringBytes(at offset: Int, end: Int) throws(FleeceError) -> ArraySlice<UInt8> {
        var count = Int(bytes[offset] & 0x0F)
        var start = offset + 1
        if count == 0x0F {
            let length = try varint(at: start)
            (count, start) = (length.value, start + length.length)
        }
        try need(count, at: start, end: end, "a string")
        return bytes[start..<(start + count)]
    }

    /// The header of an array or dictionary: its item count, where the slots start, their width.
    private func collection(at offset: Int, end: Int) throws(FleeceError) -> (count: Int, first: Int, wide: Bool) {
        try need(2, at: offset, end: end, "a collection")
        let wide = bytes[offset] & 0x08 != 0
        var count = Int(bytes[offset] & 0x07) << 8 | Int(bytes[offset + 1])
        var first = offset + 2
        if count == 0x07FF {
            // A long count: 2047 plus a varint.
            let length = try varint(at: first)
            count += length.value
            first += length.length
            first += first & 1
        }
        return (count, first, wide)
    }

    /// The value in a collection's slot, and where it must end: inline in the slot, or where
    /// its pointer leads.
    private func slot(_ at: Int, wide: Bool, collection: Int) throws(FleeceError) -> (at: Int, end: Int) {
        bytes[at] & 0x80 != 0 ? try follow(pointerAt: at, wide: wide, limit: collection) : (at, at + (wide ? 4 : 2))
    }

    /// The value at `offset`, which must end by `end`.
    func value(at offset: Int, end: Int, depth: Int) throws(FleeceError) -> JSONValue {
        try need(2, at: offset, end: end, "a value")
        let first = bytes[offset]
        switch first >> 4 {
        case 0x0:
            let raw = Int(first & 0x0F) << 8 | Int(bytes[offset + 1])
            return .integer(Int64(raw & 0x800 != 0 ? raw - 0x1000 : raw))
        case 0x1:
            let count = Int(first & 0x07) + 1
            try need(count, at: offset + 1, end: end, "an integer")
            var value: UInt64 = 0
            for index in 0..<count { value |= UInt64(bytes[offset + 1 + index]) << (8 * index) }
            if first & 0x08 != 0 {
                return value <= UInt64(Int64.max) ? .integer(Int64(value)) : .bigInteger(String(value))
            }
            if count < 8, value & (1 << (8 * count - 1)) != 0 { value |= ~0 << (8 * count) }  // sign-extend
            return .integer(Int64(bitPattern: value))
        case 0x2:
            if first & 0x08 != 0 {
                try need(8, at: offset + 2, end: end, "a double")
                var raw: UInt64 = 0
                for index in 0..<8 { raw |= UInt64(bytes[offset + 2 + index]) << (8 * index) }
                return .double(Double(bitPattern: raw))
            }
            try need(4, at: offset + 2, end: end, "a float")
            var raw: UInt32 = 0
            for index in 0..<4 { raw |= UInt32(bytes[offset + 2 + index]) << (8 * index) }
            return .double(Double(Float(bitPattern: raw)))
        case 0x3:
            guard first & 0x03 == 0 else { throw .init("a mutable-only special value at \(offset)") }
            switch (first >> 2) & 0x03 {
            case 1: return .bool(false)
            case 2: return .bool(true)
            default: return .null  // null, and `undefined` (JSON has no such value)
            }
        case 0x4:
            return .string(String(decoding: try stringBytes(at: offset, end: end), as: UTF8.self))
        case 0x5:
            return .string(Data(try stringBytes(at: offset, end: end)).base64EncodedString())
        case 0x6, 0x7:
            guard depth < Self.maximumDepth else { throw .init("nested deeper than \(Self.maximumDepth)") }
            let isDictionary = first >> 4 == 0x7
            let (count, start, wide) = try collection(at: offset, end: end)
            let width = wide ? 4 : 2
            try need(count * width * (isDictionary ? 2 : 1), at: start, end: end, isDictionary ? "a dictionary" : "an array")
            if !isDictionary {
                var items: [JSONValue] = []
                items.reserveCapacity(count)
                for index in 0..<count {
                    let item = try slot(start + index * width, wide: wide, collection: offset)
                    items.append(try value(at: item.at, end: item.end, depth: depth + 1))
                }
                return .array(items)
            }
            var entries: [(String, JSONValue)] = []
            entries.reserveCapacity(count)
            for index in 0..<count {
                let keySlot = try slot(start + 2 * index * width, wide: wide, collection: offset)
                let key = try self.key(at: keySlot.at, end: keySlot.end)
                let valueSlot = try slot(start + (2 * index + 1) * width, wide: wide, collection: offset)
                if bytes[valueSlot.at] == 0x3C { continue }  // `undefined`: the key is absent
                entries.append((key, try value(at: valueSlot.at, end: valueSlot.end, depth: depth + 1)))
            }
            return .object(JSONObject(entries))
        default:
            throw .init("a pointer where a value was expected at \(offset)")
        }
    }

    /// A dictionary key: a string, or a small integer naming a shared key.
    private func key(at offset: Int, end: Int) throws(FleeceError) -> String {
        switch bytes[offset] >> 4 {
        case 0x4:
            return String(decoding: try stringBytes(at: offset, end: end), as: UTF8.self)
        case 0x0:
            guard case .integer(let number) = try value(at: offset, end: end, depth: 0) else { throw .init("a bad key at \(offset)") }
            guard number >= 0 else { throw .init("a dictionary that inherits from another (key \(number)): delta-encoded") }
            guard Int(number) < sharedKeys.count else {
                throw .init("key \(number) names a shared key the database lacks (it has \(sharedKeys.count))")
            }
            return sharedKeys[Int(number)]
        default:
            throw .init("a dictionary key at \(offset) is neither a string nor a shared key")
        }
    }
}

/// Fleece data that cannot be read, and why.
public struct FleeceError: Error, CustomStringConvertible, Sendable {
    public let reason: String
    init(_ reason: String) { self.reason = reason }
    public var description: String { "damaged Fleece: \(reason)" }
}
