/// The values of JSON documents, as Sofa stores and shows them.
///
/// Unlike Foundation's `JSONSerialization`, a `JSONValue` keeps what a document
/// author wrote: object keys stay in the order they were written, integers are
/// never confused with doubles or booleans, and integers of any size survive
/// exactly (CouchDB keeps `18446744073709551615` and `123456789012345678901234567890`,
/// so Sofa does too).
///
/// ```swift
/// let value = try JSONValue(parsing: #"{"b":1,"a":[true,1.5]}"#)
/// value["b"]              // .integer(1)
/// value.prettyPrinted()   // keys stay in the order b, a
/// ```
public enum JSONValue: Hashable, Sendable {
    case null
    case bool(Bool)
    /// An integer that fits in 64 bits.
    case integer(Int64)
    /// An integer that does not fit in 64 bits, kept as its decimal digits
    /// (with a leading `-` when negative) so that it round-trips exactly.
    case bigInteger(String)
    /// A number written with a fraction or an exponent.
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object(JSONObject)
}

/// A JSON object whose keys keep their order.
///
/// Lookups are linear, which is faster than hashing for the small objects
/// documents are made of. A duplicate key in parsed input keeps its first
/// position and its last value.
public struct JSONObject: Hashable, Sendable, Sequence, ExpressibleByDictionaryLiteral {
    public private(set) var entries: [(key: String, value: JSONValue)]

    public init() { entries = [] }

    public init(_ entries: [(String, JSONValue)]) {
        self.entries = []
        for (key, value) in entries { self[key] = value }
    }

    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self.init(elements)
    }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }
    public var keys: [String] { entries.map(\.key) }

    public subscript(key: String) -> JSONValue? {
        get { entries.first(where: { $0.key == key })?.value }
        set {
            let index = entries.firstIndex(where: { $0.key == key })
            switch (index, newValue) {
            case let (index?, value?): entries[index].value = value
            case let (index?, nil): entries.remove(at: index)
            case let (nil, value?): entries.append((key, value))
            case (nil, nil): break
            }
        }
    }

    /// The entries whose keys pass `isIncluded`, in order.
    public func filter(_ isIncluded: (String) -> Bool) -> JSONObject {
        var copy = JSONObject()
        copy.entries = entries.filter { isIncluded($0.key) }
        return copy
    }

    public func makeIterator() -> IndexingIterator<[(key: String, value: JSONValue)]> {
        entries.makeIterator()
    }

    public static func == (lhs: JSONObject, rhs: JSONObject) -> Bool {
        lhs.entries.count == rhs.entries.count
            && zip(lhs.entries, rhs.entries).allSatisfy { $0.key == $1.key && $0.value == $1.value }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(entries.count)
        for (key, value) in entries {
            hasher.combine(key)
            hasher.combine(value)
        }
    }
}

extension JSONValue {
    /// The member named `key` when this is an object.
    public subscript(key: String) -> JSONValue? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    /// The element at `index` when this is an array and the index is in range.
    public subscript(index: Int) -> JSONValue? {
        if case .array(let elements) = self, elements.indices.contains(index) { return elements[index] }
        return nil
    }

    public var objectValue: JSONObject? {
        if case .object(let object) = self { return object }
        return nil
    }

    public var arrayValue: [JSONValue]? {
        if case .array(let array) = self { return array }
        return nil
    }

    public var stringValue: String? {
        if case .string(let string) = self { return string }
        return nil
    }

    public var boolValue: Bool? {
        if case .bool(let bool) = self { return bool }
        return nil
    }

    /// The value as an `Int64` when it is an integer, or a double with no fraction.
    public var int64Value: Int64? {
        switch self {
        case .integer(let value): return value
        case .double(let value) where value.rounded() == value && abs(value) < 9.2e18: return Int64(value)
        default: return nil
        }
    }

    /// A short name of the value's kind, for error messages.
    public var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "a boolean"
        case .integer, .bigInteger, .double: "a number"
        case .string: "a string"
        case .array: "an array"
        case .object: "an object"
        }
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByFloatLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, JSONValue)...) { self = .object(JSONObject(elements)) }
    public init(nilLiteral: ()) { self = .null }
}
