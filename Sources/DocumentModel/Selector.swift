import Foundation

/// A CouchDB Mango selector (`{"type":"note","n":{"$gt":3}}`), as replication filters
/// use it: implicit equality and `$and`, `$or`, `$nor`, `$not`, `$eq`, `$ne`, `$gt`,
/// `$gte`, `$lt`, `$lte`, `$in`, `$nin`, `$exists`, `$type`, `$size`, `$all`,
/// `$elemMatch`, `$allMatch`, `$regex`, `$mod`. Field names are dotted paths.
public struct Selector: Sendable {
    public let json: JSONObject

    /// Throws for operators Sofa does not know, so a filter never silently matches everything.
    public init(_ value: JSONValue) throws(SofaError) {
        guard case .object(let object) = value else { throw .invalidArgument("a selector must be a JSON object") }
        try Selector.validate(object)
        json = object
    }

    private static let known: Set<String> = ["$and", "$or", "$nor", "$not", "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in",
                                             "$nin", "$exists", "$type", "$size", "$all", "$elemMatch", "$allMatch", "$regex", "$mod"]

    private static func validate(_ object: JSONObject) throws(SofaError) {
        for (key, value) in object {
            if key.hasPrefix("$") && !known.contains(key) { throw .invalidArgument("unknown selector operator \(key)") }
            if case .object(let nested) = value { try validate(nested) }
            if case .array(let items) = value {
                for case .object(let nested) in items { try validate(nested) }
            }
        }
    }

    /// Whether `document` (properties with `_id`, `_rev`, `_deleted` as wanted) matches.
    public func matches(_ document: JSONObject) -> Bool {
        Selector.match(.object(document), condition: json)
    }

    /// `value` against a condition object, field by field.
    private static func match(_ value: JSONValue, condition: JSONObject) -> Bool {
        condition.allSatisfy { key, argument in
            switch key {
            case "$and": return argument.arrayValue?.allSatisfy { item in item.objectValue.map { match(value, condition: $0) } ?? false } ?? false
            case "$or": return argument.arrayValue?.contains { item in item.objectValue.map { match(value, condition: $0) } ?? false } ?? false
            case "$nor": return !(argument.arrayValue?.contains { item in item.objectValue.map { match(value, condition: $0) } ?? false } ?? true)
            case "$not": return !(argument.objectValue.map { match(value, condition: $0) } ?? true)
            default:
                if key.hasPrefix("$") { return test(value, op: key, argument) }
                let field = lookUp(value, path: key)
                if case .object(let nested) = argument, nested.keys.contains(where: { $0.hasPrefix("$") }) {
                    return nested.allSatisfy { op, operand in
                        switch op {
                        case "$and", "$or", "$nor", "$not": match(field ?? .null, condition: [op: operand]) && (field != nil || op == "$not")
                        default: test(field, op: op, operand)
                        }
                    }
                }
                return field.map { equal($0, argument) } ?? false
            }
        }
    }

    /// The value at a dotted path (`address.city`), if there is one.
    public static func lookUp(_ value: JSONValue, path: String) -> JSONValue? {
        var current: JSONValue? = value
        for part in path.split(separator: ".", omittingEmptySubsequences: false) {
            current = current?[String(part)]
        }
        return current
    }

    /// One operator applied to a field (nil when the field is absent).
    private static func test(_ field: JSONValue?, op: String, _ operand: JSONValue) -> Bool {
        if op == "$exists" { return (field != nil) == (operand.boolValue ?? true) }
        guard let field else { return op == "$ne" || op == "$nin" }
        switch op {
        case "$eq": return equal(field, operand)
        case "$ne": return !equal(field, operand)
        case "$gt": return compare(field, operand) > 0
        case "$gte": return compare(field, operand) >= 0
        case "$lt": return compare(field, operand) < 0
        case "$lte": return compare(field, operand) <= 0
        case "$in": return operand.arrayValue?.contains { equal(field, $0) } ?? false
        case "$nin": return !(operand.arrayValue?.contains { equal(field, $0) } ?? false)
        case "$type": return operand.stringValue == typeName(field)
        case "$size": return field.arrayValue.map { Int64($0.count) == operand.int64Value } ?? false
        case "$all":
            guard let items = field.arrayValue, let wanted = operand.arrayValue else { return false }
            return wanted.allSatisfy { want in items.contains { equal($0, want) } }
        case "$elemMatch":
            guard let items = field.arrayValue, let condition = operand.objectValue else { return false }
            return items.contains { match($0, condition: condition) }
        case "$allMatch":
            guard let items = field.arrayValue, let condition = operand.objectValue else { return false }
            return items.allSatisfy { match($0, condition: condition) }
        case "$regex":
            guard let text = field.stringValue, let pattern = operand.stringValue,
                  let expression = try? NSRegularExpression(pattern: pattern) else { return false }
            return expression.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)) != nil
        case "$mod":
            guard let number = field.int64Value, let pair = operand.arrayValue, pair.count == 2,
                  let divisor = pair[0].int64Value, let remainder = pair[1].int64Value, divisor != 0 else { return false }
            return number % divisor == remainder
        default: return false
        }
    }

    private static func typeName(_ value: JSONValue) -> String {
        switch value {
        case .null: "null"
        case .bool: "boolean"
        case .integer, .bigInteger, .double: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    private static func number(_ value: JSONValue) -> Double? {
        switch value {
        case .integer(let n): Double(n)
        case .bigInteger(let digits): Double(digits)
        case .double(let d): d
        default: nil
        }
    }

    private static func equal(_ a: JSONValue, _ b: JSONValue) -> Bool {
        if let x = number(a), let y = number(b) { return x == y }
        return a == b
    }

    /// CouchDB's collation of JSON types: null < false < true < numbers < strings < arrays < objects.
    public static func compare(_ a: JSONValue, _ b: JSONValue) -> Int {
        func rank(_ value: JSONValue) -> Int {
            switch value {
            case .null: 0
            case .bool(let flag): flag ? 2 : 1
            case .integer, .bigInteger, .double: 3
            case .string: 4
            case .array: 5
            case .object: 6
            }
        }
        let (ra, rb) = (rank(a), rank(b))
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case _ where number(a) != nil:
            let (x, y) = (number(a)!, number(b)!)
            return x == y ? 0 : (x < y ? -1 : 1)
        case (.string(let x), .string(let y)):
            return x == y ? 0 : (x.unicodeScalars.lexicographicallyPrecedes(y.unicodeScalars) ? -1 : 1)
        case (.array(let x), .array(let y)):
            for (p, q) in zip(x, y) {
                let order = compare(p, q)
                if order != 0 { return order }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        default:
            return 0
        }
    }
}
