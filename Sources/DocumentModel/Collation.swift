import CUnicode

/// CouchDB's order of JSON values, used by Mango selectors, sorts and indexes:
/// null < false < true < numbers < strings < arrays < objects; strings by the Unicode
/// Collation Algorithm (ICU's root collator, as CouchDB's `couch_ejson_compare`), so
/// `a < A < b < B`; arrays and objects element by element.
public enum Collation {
    /// The collator's version (ICU's root collator: "153.120" with ICU 72), which CouchDB
    /// reports as a view index's `collator_versions`.
    public static let collatorVersion: String = {
        var text = [CChar](repeating: 0, count: 32)
        cunicode_collator_version(&text, Int32(text.count))
        return String(cString: text)
    }()

    /// -1, 0 or 1 as `a` sorts before, with or after `b`.
    public static func compare(_ a: JSONValue, _ b: JSONValue) -> Int {
        let (ra, rb) = (rank(a), rank(b))
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case (.bool(let x), .bool(let y)): return x == y ? 0 : (x ? 1 : -1)
        case (.string(let x), .string(let y)): return compare(x, y)
        case (.array(let x), .array(let y)):
            for (p, q) in zip(x, y) {
                let order = compare(p, q)
                if order != 0 { return order }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        case (.object(let x), .object(let y)):
            // Member by member, key then value, in the order they were written.
            for ((k1, v1), (k2, v2)) in zip(x.entries, y.entries) {
                let byKey = compare(k1, k2)
                if byKey != 0 { return byKey }
                let byValue = compare(v1, v2)
                if byValue != 0 { return byValue }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        default:
            guard let x = number(a), let y = number(b) else { return 0 }
            return x == y ? 0 : (x < y ? -1 : 1)
        }
    }

    /// Two strings by the Unicode Collation Algorithm; identical ones without asking ICU.
    public static func compare(_ a: String, _ b: String) -> Int {
        if a == b { return 0 }
        var (a, b) = (a, b)
        return a.withUTF8 { x in
            b.withUTF8 { y in
                Int(cunicode_collate(x.baseAddress, Int32(x.count), y.baseAddress, Int32(y.count)))
            }
        }
    }

    /// A value as bytes whose `memcmp` order is `compare`'s (an index key). Every encoding is
    /// self-delimiting, so keys of several values concatenate into a key of the tuple.
    public static func key(_ value: JSONValue) -> [UInt8] {
        var bytes: [UInt8] = []
        appendKey(value, to: &bytes)
        return bytes
    }

    public static func appendKey(_ value: JSONValue, to bytes: inout [UInt8]) {
        bytes.append(UInt8(rank(value)))
        switch value {
        case .null, .bool: break
        case .integer, .bigInteger, .double:
            // IEEE 754 bits, made to sort as unsigned big-endian: flip the sign bit of a
            // positive number, every bit of a negative one.
            let d = number(value) ?? 0
            let bits = (d == 0 ? 0.0 : d).bitPattern  // -0 is 0
            let ordered = bits & (1 << 63) == 0 ? bits | (1 << 63) : ~bits
            for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: ordered >> UInt64(shift))) }
        case .string(let text):
            appendSortKey(text, to: &bytes)
        case .array(let items):
            for item in items { appendKey(item, to: &bytes) }
            bytes.append(0)
        case .object(let object):
            for (key, member) in object.entries {
                appendKey(.string(key), to: &bytes)
                appendKey(member, to: &bytes)
            }
            bytes.append(0)
        }
    }

    /// A key greater than every key that starts with `prefix` (the end of a prefix range).
    public static func afterPrefix(_ prefix: [UInt8]) -> [UInt8] { prefix + [0xFF] }

    /// ICU's sort key, which ends with a single zero byte and holds no other.
    private static func appendSortKey(_ text: String, to bytes: inout [UInt8]) {
        var text = text
        text.withUTF8 { utf8 in
            var capacity = utf8.count * 4 + 16
            while true {
                let needed = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: capacity) { buffer -> Int in
                    let needed = Int(cunicode_sort_key(utf8.baseAddress, Int32(utf8.count), buffer.baseAddress, Int32(capacity)))
                    if needed > 0 && needed <= capacity { bytes.append(contentsOf: buffer[0..<needed]) }
                    return needed
                }
                if needed <= capacity {
                    if needed <= 0 { bytes.append(0) }  // Swift strings are UTF-8: never happens
                    return
                }
                capacity = needed
            }
        }
    }

    /// The position of a value's type in the order (from 1, so that 0 can end a list).
    private static func rank(_ value: JSONValue) -> Int {
        switch value {
        case .null: 1
        case .bool(let flag): flag ? 3 : 2
        case .integer, .bigInteger, .double: 4
        case .string: 5
        case .array: 6
        case .object: 7
        }
    }

    static func number(_ value: JSONValue) -> Double? {
        switch value {
        case .integer(let n): Double(n)
        case .bigInteger(let digits): Double(digits)
        case .double(let d): d
        default: nil
        }
    }
}
