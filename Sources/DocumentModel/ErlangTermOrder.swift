import Foundation

extension JSONValue {
    /// Whether `self` sorts before `other` in Erlang's term order, as CouchDB's Erlang code
    /// sees JSON (jiffy's terms): numbers (by value) < atoms (`false` < `null` < `true`, by
    /// name) < objects (a tuple holding the list of `{Key, Value}` pairs) < arrays (lists,
    /// element by element, a prefix first) < strings (binaries, byte by byte). CouchDB orders a
    /// document's rows of one key in a view by it (`lists:sort` of what the map emitted).
    public func erlangTermPrecedes(_ other: JSONValue) -> Bool { erlangCompare(other) < 0 }

    private var erlangClass: Int {
        switch self {
        case .integer, .bigInteger, .double: 0
        case .bool, .null: 1
        case .object: 2
        case .array: 3
        case .string: 4
        }
    }

    private var atomName: String {
        switch self {
        case .bool(let value): value ? "true" : "false"
        default: "null"
        }
    }

    private var number: Double {
        switch self {
        case .integer(let value): Double(value)
        case .bigInteger(let digits): Double(digits) ?? 0
        case .double(let value): value
        default: 0
        }
    }

    /// -1, 0 or 1.
    private func erlangCompare(_ other: JSONValue) -> Int {
        let (mine, theirs) = (erlangClass, other.erlangClass)
        if mine != theirs { return mine < theirs ? -1 : 1 }
        switch (self, other) {
        case (.integer(let a), .integer(let b)): return a == b ? 0 : a < b ? -1 : 1
        case (.string(let a), .string(let b)): return Self.bytes(Array(a.utf8), Array(b.utf8))
        case (.array(let a), .array(let b)): return Self.elements(a, b)
        case (.object(let a), .object(let b)):
            for (x, y) in zip(a.entries, b.entries) {
                let key = Self.bytes(Array(x.key.utf8), Array(y.key.utf8))
                if key != 0 { return key }
                let value = x.value.erlangCompare(y.value)
                if value != 0 { return value }
            }
            return a.entries.count == b.entries.count ? 0 : a.entries.count < b.entries.count ? -1 : 1
        default:
            if mine == 1 { return atomName == other.atomName ? 0 : atomName < other.atomName ? -1 : 1 }
            return number == other.number ? 0 : number < other.number ? -1 : 1
        }
    }

    private static func elements(_ a: [JSONValue], _ b: [JSONValue]) -> Int {
        for (x, y) in zip(a, b) {
            let order = x.erlangCompare(y)
            if order != 0 { return order }
        }
        return a.count == b.count ? 0 : a.count < b.count ? -1 : 1
    }

    private static func bytes(_ a: [UInt8], _ b: [UInt8]) -> Int {
        a == b ? 0 : a.lexicographicallyPrecedes(b) ? -1 : 1
    }
}
