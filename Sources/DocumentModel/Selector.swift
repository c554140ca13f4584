import CUnicode
import Foundation

/// A CouchDB Mango selector (`{"type":"note","n":{"$gt":3}}`), as `_find`, replication
/// filters and `_changes?filter=_selector` use it: implicit equality and `$and`, `$or`,
/// `$nor`, `$not`, `$eq`, `$ne`, `$gt`, `$gte`, `$lt`, `$lte`, `$in`, `$nin`, `$exists`,
/// `$type`, `$size`, `$all`, `$elemMatch`, `$allMatch`, `$keyMapMatch`, `$regex`,
/// `$beginsWith`, `$mod`. Field names are dotted paths (`address.city`, `a\.b` for a
/// key holding a dot).
///
/// It matches as CouchDB 3.4 does, not as MongoDB: a condition on a field the document
/// lacks is false, whatever it is (`{"n": {"$ne": 1}}` does not match a document with no
/// `n`), except `$exists: false`; negations (`$not`, `$nor`) are pushed down to the fields
/// they name, so they are false for a missing field too. Strings compare by `Collation`.
/// Invalid selectors are refused with CouchDB's error names and reasons.
public struct Selector: Sendable {
    public let json: JSONObject
    /// Whether it names `_attachments` anywhere: then a document is matched as `_find` renders
    /// it (attachment stubs), not on its stored properties alone.
    public let looksAtAttachments: Bool
    let root: Node

    public init(_ value: JSONValue) throws(SofaError) {
        guard case .object(let object) = value else {
            throw .invalidQuery(error: "invalid_selector_json", reason: "Selector must be a JSON object, not: \(value.jsonString())")
        }
        json = object
        looksAtAttachments = value.jsonString().contains("\"_attachments")
        root = try Node.parse(object)
    }

    /// Whether `document` (properties with `_id`, `_rev`, `_deleted` as wanted) matches.
    public func matches(_ document: JSONObject) -> Bool {
        root.matches(.object(document))
    }

    /// The conditions every match must meet, by top-level field (`$and` flattened): what an
    /// index can narrow a query by. A field is listed when the selector requires it to exist.
    public var requiredFields: [String: [Operator]] {
        var fields: [String: [Operator]] = [:]
        func collect(_ node: Node, below prefix: [String]) {
            switch node {
            case .all(let children): children.forEach { collect($0, below: prefix) }
            case .field(let path, let condition):
                if let ops = condition.requiredOperators { fields[Selector.pathName(prefix + path), default: []] += ops }
                collect(condition, below: prefix + path)
            default: break
            }
        }
        collect(root, below: [])
        return fields
    }

    /// Whether a document whose fields `known` have the values in `partial` may match: the
    /// conditions on those fields are tested, every other one is taken to hold. An index
    /// holding those values lets a query skip documents without reading them.
    public func mayMatch(_ partial: JSONObject, known: Set<String>) -> Bool {
        func test(_ node: Node) -> Bool {
            switch node {
            case .all(let children): children.allSatisfy(test)
            case .any(let children): children.contains(where: test)
            case .field(let path, let condition):
                known.contains(Selector.pathName(path)) ? condition.matches(partial[Selector.pathName(path)]) : true
            case .not, .test: true
            }
        }
        return test(root)
    }

    /// The value at a dotted path (`address.city`), if there is one.
    public static func lookUp(_ value: JSONValue, path: String) -> JSONValue? {
        lookUp(value, path: splitPath(path))
    }

    static func lookUp(_ value: JSONValue, path: [String]) -> JSONValue? {
        var current: JSONValue? = value
        for part in path { current = current?[part] }
        return current
    }

    /// A dotted field name as its keys; `\.` is a dot inside a key.
    public static func splitPath(_ field: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var escaped = false
        for character in field {
            if escaped {
                current.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "." {
                parts.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        parts.append(current)
        return parts
    }

    static func pathName(_ path: [String]) -> String {
        path.map { $0.replacingOccurrences(of: ".", with: "\\.") }.joined(separator: ".")
    }

    /// CouchDB's collation of JSON values (see `Collation`).
    public static func compare(_ a: JSONValue, _ b: JSONValue) -> Int { Collation.compare(a, b) }

    // MARK: - The compiled selector

    /// One operator on the value at hand.
    public enum Operator: Sendable {
        case eq(JSONValue), ne(JSONValue), gt(JSONValue), gte(JSONValue), lt(JSONValue), lte(JSONValue)
        case `in`([JSONValue]), nin([JSONValue]), all([JSONValue])
        case exists(Bool), type(String), size(Int64), mod(Int64, Int64)
        case regex(Regex), beginsWith(String)
        case elemMatch(Node), allMatch(Node), keyMapMatch(Node)
    }

    /// A condition on a value: logic over conditions, a field of the value, or an operator.
    public indirect enum Node: Sendable {
        case all([Node]), any([Node]), not(Node)
        case field([String], Node)
        case test(Operator)

        static func parse(_ object: JSONObject) throws(SofaError) -> Node {
            var children: [Node] = []
            for (key, argument) in object {
                children.append(try parse(key, argument))
            }
            return children.count == 1 ? children[0] : .all(children)
        }

        private static func parse(_ key: String, _ argument: JSONValue) throws(SofaError) -> Node {
            func badArgument() -> SofaError {
                .invalidQuery(error: "bad_arg", reason: "Bad argument for operator \(key): \(argument.jsonString())")
            }
            func selectors() throws(SofaError) -> [Node] {
                guard let items = argument.arrayValue else { throw badArgument() }
                var nodes: [Node] = []
                for item in items {
                    // A value that is not a selector is an equality (CouchDB: `{"a": {"$or": [1, 2]}}`
                    // is a == 1 or a == 2; at the top level it compares the document itself).
                    guard let object = item.objectValue else {
                        nodes.append(.test(.eq(item)))
                        continue
                    }
                    nodes.append(try parse(object))
                }
                return nodes
            }
            func values() throws(SofaError) -> [JSONValue] {
                guard let items = argument.arrayValue else { throw badArgument() }
                return items
            }
            func condition() throws(SofaError) -> Node {
                guard let object = argument.objectValue else { throw badArgument() }
                return try parse(object)
            }
            guard key.hasPrefix("$") else {
                // A field: an object holds its operators or subfields (`{"a": {"b": 1}}` is
                // `{"a.b": 1}`), anything else is compared for equality.
                let path = Selector.splitPath(key)
                if case .object(let object) = argument, !object.isEmpty {
                    return .field(path, try parse(object))
                }
                return .field(path, .test(.eq(argument)))
            }
            switch key {
            case "$and": return .all(try selectors())
            case "$or": return .any(try selectors())
            case "$nor": return Node.any(try selectors()).negated
            case "$not": return try condition().negated
            case "$eq": return .test(.eq(argument))
            case "$ne": return .test(.ne(argument))
            case "$gt": return .test(.gt(argument))
            case "$gte": return .test(.gte(argument))
            case "$lt": return .test(.lt(argument))
            case "$lte": return .test(.lte(argument))
            case "$in": return .test(.in(try values()))
            case "$nin": return .test(.nin(try values()))
            case "$all": return .test(.all(try values()))
            case "$exists":
                guard case .bool(let flag) = argument else { throw badArgument() }
                return .test(.exists(flag))
            case "$type":
                guard let name = argument.stringValue else { throw badArgument() }
                return .test(.type(name))
            case "$size":
                guard let n = argument.int64Value else { throw badArgument() }
                return .test(.size(n))
            case "$mod":
                guard let pair = argument.arrayValue, pair.count == 2, let divisor = pair[0].int64Value,
                      let remainder = pair[1].int64Value, divisor != 0 else { throw badArgument() }
                return .test(.mod(divisor, remainder))
            case "$regex":
                guard let pattern = argument.stringValue, let regex = Regex(pattern) else { throw badArgument() }
                return .test(.regex(regex))
            case "$beginsWith":
                guard let prefix = argument.stringValue else { throw badArgument() }
                return .test(.beginsWith(prefix))
            case "$elemMatch": return .test(.elemMatch(try condition()))
            case "$allMatch": return .test(.allMatch(try condition()))
            case "$keyMapMatch": return .test(.keyMapMatch(try condition()))
            case "$near", "$nearSphere", "$geoWithin", "$where":
                throw .invalidQuery(error: "not_supported", reason: "Unsupported operator: \(key)")
            default: throw .invalidQuery(error: "invalid_operator", reason: "Invalid operator: \(key)")
            }
        }

        /// The negation, pushed down to fields (De Morgan), as CouchDB normalizes it.
        var negated: Node {
            switch self {
            case .all(let children): .any(children.map(\.negated))
            case .any(let children): .all(children.map(\.negated))
            case .not(let inner): inner
            case .field(let path, let condition): .field(path, condition.negated)
            case .test(.exists(let flag)): .test(.exists(!flag))
            case .test: .not(self)
            }
        }

        func matches(_ value: JSONValue?) -> Bool {
            guard let value else { return matchesMissing }
            switch self {
            case .all(let children): return children.allSatisfy { $0.matches(value) }
            case .any(let children): return children.contains { $0.matches(value) }
            case .not(let inner): return !inner.matches(value)
            case .field(let path, let condition): return condition.matches(Selector.lookUp(value, path: path))
            case .test(let op): return op.matches(value)
            }
        }

        /// A missing field meets only `$exists: false` (and conjunctions or choices of it).
        private var matchesMissing: Bool {
            switch self {
            case .test(.exists(let flag)): !flag
            case .all(let children): children.allSatisfy(\.matchesMissing)
            case .any(let children): children.contains { $0.matchesMissing }
            default: false
            }
        }

        /// The operators of a condition that requires its field to exist (nil when the field
        /// may be absent); a conjunction gives all its parts.
        var requiredOperators: [Operator]? {
            if matchesMissing { return nil }
            switch self {
            case .test(let op): return [op]
            case .all(let children): return children.flatMap { $0.requiredOperators ?? [] }
            default: return []
            }
        }
    }

    /// A `$regex`, compiled once, run by ICU with a time limit so that a pattern that
    /// backtracks without end cannot hold a query (or a replication) for ever: a match that
    /// runs out of time counts as no match, and is counted in `timeouts`.
    public final class Regex: @unchecked Sendable {
        public let pattern: String
        private let expression: UnsafeMutableRawPointer
        private let lock = NSLock()
        private var timedOut = 0

        /// ICU's time limit is in steps of its matching engine, each a few milliseconds' work.
        static let timeLimit: Int32 = 100

        init?(_ pattern: String) {
            self.pattern = pattern
            var text = pattern
            guard let expression = text.withUTF8({ cunicode_regex_open($0.baseAddress, Int32($0.count), Regex.timeLimit) }) else {
                return nil
            }
            self.expression = expression
        }

        deinit { cunicode_regex_close(expression) }

        /// How many matches ran out of time.
        public var timeouts: Int { lock.withLock { timedOut } }

        func matches(_ text: String) -> Bool {
            var text = text
            return text.withUTF8 { utf8 in
                lock.withLock {
                    let found = cunicode_regex_find(expression, utf8.baseAddress, Int32(utf8.count))
                    if found == -1 { timedOut += 1 }
                    return found == 1
                }
            }
        }
    }

    /// How many `$regex` matches of this selector ran out of time so far.
    public var regexTimeouts: Int {
        func count(_ node: Node) -> Int {
            switch node {
            case .all(let children), .any(let children): children.map(count).reduce(0, +)
            case .not(let inner), .field(_, let inner): count(inner)
            case .test(.regex(let regex)): regex.timeouts
            case .test(.elemMatch(let inner)), .test(.allMatch(let inner)), .test(.keyMapMatch(let inner)): count(inner)
            case .test: 0
            }
        }
        return count(root)
    }
}

extension Selector.Operator {
    func matches(_ value: JSONValue) -> Bool {
        switch self {
        case .eq(let operand): return Selector.equal(value, operand)
        case .ne(let operand): return !Selector.equal(value, operand)
        case .gt(let operand): return Collation.compare(value, operand) > 0
        case .gte(let operand): return Collation.compare(value, operand) >= 0
        case .lt(let operand): return Collation.compare(value, operand) < 0
        case .lte(let operand): return Collation.compare(value, operand) <= 0
        case .in(let operands): return operands.contains { Selector.equal(value, $0) }
        case .nin(let operands): return !operands.contains { Selector.equal(value, $0) }
        case .all(let wanted):
            guard let items = value.arrayValue else { return false }
            return wanted.allSatisfy { want in items.contains { Selector.equal($0, want) } }
        case .exists(let flag): return flag
        case .type(let name): return name == Selector.typeName(value)
        case .size(let n): return value.arrayValue.map { Int64($0.count) == n } ?? false
        case .mod(let divisor, let remainder):
            guard case .integer(let number) = value else { return false }
            return number % divisor == remainder
        case .regex(let regex): return value.stringValue.map(regex.matches) ?? false
        case .beginsWith(let prefix): return value.stringValue?.hasPrefix(prefix) ?? false
        case .elemMatch(let condition): return value.arrayValue?.contains { condition.matches($0) } ?? false
        case .allMatch(let condition):
            guard let items = value.arrayValue, !items.isEmpty else { return false }
            return items.allSatisfy { condition.matches($0) }
        case .keyMapMatch(let condition): return value.objectValue?.keys.contains { condition.matches(.string($0)) } ?? false
        }
    }
}

extension Selector {
    static func typeName(_ value: JSONValue) -> String {
        switch value {
        case .null: "null"
        case .bool: "boolean"
        case .integer, .bigInteger, .double: "number"
        case .string: "string"
        case .array: "array"
        case .object: "object"
        }
    }

    static func equal(_ a: JSONValue, _ b: JSONValue) -> Bool {
        if let x = Collation.number(a), let y = Collation.number(b) { return x == y }
        return a == b
    }
}
