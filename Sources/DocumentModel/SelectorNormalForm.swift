/// CouchDB's normal form of a Mango selector, what `_explain` shows (`mango_selector:normalize`):
/// every condition is `{field: {$op: argument}}` with nested field objects joined into dotted
/// paths (`{"a": {"b": 1}}` → `{"a.b": {"$eq": 1}}`); several conditions of one object are an
/// `$and` in the order given; `$not` and `$nor` are pushed down to the conditions (`$gt` ↔
/// `$lte`, `$eq` ↔ `$ne`, `$in` ↔ `$nin`, `$exists` flips, `$and` ↔ `$or`; the operators that
/// have no opposite keep a `$not`); `$elemMatch` and `$allMatch` take a selector of their own,
/// where an operator stands for the element itself (the field `""`). Existing `$and`s are kept
/// as written, not flattened. Checked side by side with CouchDB 3.4.3.
public enum SelectorNormalForm {
    public static func normalize(_ selector: JSONObject) -> JSONObject {
        combine(clauses(path: nil, .object(selector)))
    }

    /// The conditions `value` sets on `path` (nil: the selector's top level).
    private static func clauses(path: String?, _ value: JSONValue) -> [JSONObject] {
        guard case .object(let object) = value else {
            return [[path ?? "": .object(["$eq": value])]]
        }
        if object.isEmpty { return path.map { [[$0: .object(["$eq": .object([:])])]] } ?? [] }
        var result: [JSONObject] = []
        for (key, argument) in object {
            switch key {
            case "$and", "$or":
                let list = argument.arrayValue ?? []
                result.append([key: .array(list.map { .object(combine(clauses(path: path, $0))) })])
            case "$nor":
                let list = argument.arrayValue ?? []
                result.append(["$and": .array(list.map { .object(negate(combine(clauses(path: path, $0)))) })])
            case "$not":
                result.append(negate(combine(clauses(path: path, argument))))
            case "$elemMatch", "$allMatch":
                let inner: JSONValue = argument.objectValue.map { .object(normalize($0)) } ?? argument
                result.append([path ?? "": .object([key: inner])])
            case let op where op.hasPrefix("$"):
                result.append([path ?? "": .object([op: argument])])
            default:
                result += clauses(path: path.map { "\($0).\(key)" } ?? key, argument)
            }
        }
        return result
    }

    private static func combine(_ clauses: [JSONObject]) -> JSONObject {
        switch clauses.count {
        case 0: [:]
        case 1: clauses[0]
        default: ["$and": .array(clauses.map { .object($0) })]
        }
    }

    private static let opposites: [String: String] = [
        "$eq": "$ne", "$ne": "$eq", "$lt": "$gte", "$gte": "$lt", "$gt": "$lte", "$lte": "$gt", "$in": "$nin", "$nin": "$in",
    ]

    /// The clause that matches where `clause` does not.
    private static func negate(_ clause: JSONObject) -> JSONObject {
        guard clause.count == 1, let (key, value) = clause.entries.first else { return ["$not": .object(clause)] }
        switch key {
        case "$and": return ["$or": .array((value.arrayValue ?? []).map { .object(negate($0.objectValue ?? [:])) })]
        case "$or": return ["$and": .array((value.arrayValue ?? []).map { .object(negate($0.objectValue ?? [:])) })]
        default:
            guard case .object(let condition) = value, condition.count == 1, let (op, argument) = condition.entries.first else {
                return ["$not": .object(clause)]
            }
            if let opposite = opposites[op] { return [key: .object([opposite: argument])] }
            if op == "$exists", case .bool(let exists) = argument { return [key: .object(["$exists": .bool(!exists)])] }
            if op == "$not" { return [key: argument] }
            return [key: .object(["$not": .object(condition)])]
        }
    }
}
