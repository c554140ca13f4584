import Foundation

/// A Mango query as CouchDB's `_find` takes it: `selector`, `limit` (25), `skip`, `sort`,
/// `fields`, `bookmark`, `use_index`, `allow_fallback`, `execution_stats`; `r`,
/// `conflicts`, `update`, `stable`, `stale` and `partition` are accepted. Parsing, the
/// choice of index (`plan`) and projection live here; the scan is `Database.find`.
public struct MangoQuery: Sendable {
    public let selector: Selector
    public var limit = 25
    public var skip = 0
    /// Fields to order by, in order, all one direction; empty: no order asked for.
    public var sort: [String] = []
    public var descending = false
    /// Fields to keep (dotted paths); nil: the whole document.
    public var fields: [String]?
    /// Where a previous page ended.
    public var bookmark: Bookmark?
    public var executionStats = false
    /// `use_index`: a design document, or a design document and an index name.
    public var useIndex: (designDocument: String, name: String?)?
    public var allowFallback = true

    /// A position between pages: after a document id (`_all_docs`), or after a key and a
    /// document id (a JSON index).
    public enum Bookmark: Sendable, Equatable {
        case after(String)
        case afterKey([UInt8], String)

        /// Opaque to clients, as CouchDB's are.
        public var token: String {
            let text: String
            switch self {
            case .after(let id): text = "a" + id
            case .afterKey(let key, let id): text = "k" + BlobKey.hexString(key) + " " + id
            }
            return Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }

        public init?(token: String) {
            var base64 = token.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while base64.count % 4 != 0 { base64 += "=" }
            guard let data = Data(base64Encoded: base64), let text = String(data: data, encoding: .utf8), let kind = text.first else { return nil }
            let rest = text.dropFirst()
            switch kind {
            case "a": self = .after(String(rest))
            case "k":
                guard let space = rest.firstIndex(of: " "), let key = Bookmark.bytes(hex: rest[..<space]) else { return nil }
                self = .afterKey(key, String(rest[rest.index(after: space)...]))
            default: return nil
            }
        }

        private static func bytes(hex: Substring) -> [UInt8]? {
            let digits = Array(hex.utf8)
            guard digits.count % 2 == 0 else { return nil }
            var bytes: [UInt8] = []
            for i in stride(from: 0, to: digits.count, by: 2) {
                guard let byte = UInt8(String(decoding: digits[i...i + 1], as: UTF8.self), radix: 16) else { return nil }
                bytes.append(byte)
            }
            return bytes
        }
    }

    private static let knownKeys: Set<String> = ["selector", "limit", "skip", "sort", "fields", "bookmark", "use_index", "allow_fallback",
                                                 "execution_stats", "r", "conflicts", "update", "stable", "stale", "partition"]

    public init(_ body: JSONObject) throws(SofaError) {
        for key in body.keys where !MangoQuery.knownKeys.contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        guard let selector = body["selector"] else { throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: selector") }
        self.selector = try Selector(selector)
        func count(_ key: String) throws(SofaError) -> Int? {
            guard let value = body[key] else { return nil }
            guard let n = value.int64Value, n >= 0 else {
                throw .invalidQuery(error: "invalid_non_neg_integer", reason: "\(value.jsonString()) is not an integer greater than or equal to zero")
            }
            return Int(clamping: n)
        }
        limit = try count("limit") ?? limit
        skip = try count("skip") ?? skip
        if let value = body["sort"] {
            guard let items = value.arrayValue else { throw .invalidQuery(error: "invalid_sort_json", reason: "Sort must be an array of sort specs.") }
            var directions: Set<Bool> = []
            for item in items {
                if let field = item.stringValue {
                    sort.append(field)
                    directions.insert(false)
                } else if let pair = item.objectValue, pair.count == 1, let (field, direction) = pair.entries.first,
                          let word = direction.stringValue, word == "asc" || word == "desc" {
                    sort.append(field)
                    directions.insert(word == "desc")
                } else {
                    throw .invalidQuery(error: "invalid_sort_json", reason: "Invalid sort field: \(item.jsonString())")
                }
            }
            if directions.count > 1 {
                throw .invalidQuery(error: "unsupported_mixed_sort", reason: "Sorts currently only support a single direction for all fields.")
            }
            descending = directions.first ?? false
        }
        if let value = body["fields"] {
            guard let items = value.arrayValue, items.allSatisfy({ $0.stringValue != nil }) else {
                throw .invalidQuery(error: "invalid_field_json", reason: "Invalid JSON for field spec: \(value.jsonString())")
            }
            fields = items.isEmpty ? nil : items.compactMap(\.stringValue)
        }
        if let value = body["bookmark"], value != .null, value.stringValue != "nil" {
            guard let token = value.stringValue, let bookmark = Bookmark(token: token) else {
                throw .invalidQuery(error: "invalid_bookmark", reason: "Invalid bookmark value: \(value.jsonString())")
            }
            self.bookmark = bookmark
        }
        executionStats = body["execution_stats"]?.boolValue ?? false
        allowFallback = body["allow_fallback"]?.boolValue ?? true
        if let value = body["use_index"] {
            let parts = value.arrayValue ?? [value]
            guard parts.count <= 2, parts.allSatisfy({ $0.stringValue != nil }) else {
                throw .invalidQuery(error: "invalid_index_json", reason: "use_index must be a design document name, or one and an index name")
            }
            if let ddoc = parts.first?.stringValue, !ddoc.isEmpty {
                useIndex = (MangoQuery.designDocumentID(ddoc), parts.count == 2 ? parts[1].stringValue : nil)
            }
        }
    }

    static func designDocumentID(_ name: String) -> String { name.hasPrefix("_design/") ? name : "_design/" + name }

    /// The document with only the asked-for fields (nested ones rebuilt), or all of it.
    public func project(_ document: JSONObject) -> JSONObject {
        guard let fields else { return document }
        var result = JSONObject()
        for field in fields {
            guard let value = Selector.lookUp(.object(document), path: field) else { continue }
            result = MangoQuery.setting(value, at: Selector.splitPath(field)[...], in: result)
        }
        return result
    }

    private static func setting(_ value: JSONValue, at path: ArraySlice<String>, in object: JSONObject) -> JSONObject {
        var object = object
        guard let first = path.first else { return object }
        if path.count == 1 {
            object[first] = value
        } else {
            object[first] = .object(setting(value, at: path.dropFirst(), in: object[first]?.objectValue ?? [:]))
        }
        return object
    }
}

/// How a query is answered: which index, which part of it, in which direction, and why.
public struct QueryPlan: Sendable {
    /// nil: every document in id order (CouchDB's `_all_docs`).
    public var index: MangoIndex?
    /// Index keys from `lower` (included) to `upper` (excluded); nil: no bound.
    public var lower: [UInt8]?
    public var upper: [UInt8]?
    /// Under `_all_docs`: the one id an `_id` equality allows.
    public var onlyID: String?
    public var descending = false
    /// The start and end of the range as CouchDB's `_explain` shows them (`"<MAX>"`: open).
    public var startKey: [JSONValue] = []
    public var endKey: [JSONValue] = []
    public var warnings: [String] = []
    /// Every index considered, as `_explain` lists them.
    public var candidates: [(index: MangoIndex?, usable: Bool, reason: String)] = []
}

extension MangoQuery {
    /// Chooses the index that answers this query among `indexes`, as CouchDB 3.4 does: an index
    /// is usable when the selector requires every one of its fields (sort fields and `_id`
    /// aside) and the sort follows its fields (after fields held equal); partial indexes only
    /// when named by `use_index`. The usable index whose leading fields the selector narrows
    /// most wins, then the one with fewer fields, then by name. With none, `_all_docs` answers
    /// (with CouchDB's warning) unless the query is sorted (CouchDB's `no_usable_index`).
    public func plan(indexes: [MangoIndex]) throws(SofaError) -> QueryPlan {
        let required = selector.requiredFields
        var plan = QueryPlan()
        plan.descending = descending
        func equalities(_ field: String) -> [JSONValue] {
            (required[field] ?? []).compactMap { if case .eq(let value) = $0 { value } else { nil } }
        }
        func reason(_ index: MangoIndex, named: Bool) -> String? {
            if index.partialFilter != nil && !named { return "is_partial" }
            let needed = Set(index.fields).subtracting(sort).subtracting(["_id", "_rev"])
            guard needed.allSatisfy({ required[$0] != nil }) else { return "field_mismatch" }
            guard !sort.isEmpty else { return nil }
            // The sort must be the index's fields from some point on, every field before it held equal.
            var start = 0
            while start < index.fields.count, index.fields[start] != sort.first, !equalities(index.fields[start]).isEmpty { start += 1 }
            let following = index.fields.dropFirst(start)
            return following.starts(with: sort) ? nil : "sort_order_mismatch"
        }
        func narrowed(_ index: MangoIndex) -> Int {
            var count = 0
            for field in index.fields {
                let ops = required[field] ?? []
                guard ops.contains(where: \.bounds) else { break }
                count += 1
                if equalities(field).isEmpty { break }
            }
            return count
        }
        let allDocsUsable = sort.isEmpty || (sort == ["_id"] && required["_id"] != nil)
        var usable: [MangoIndex] = []
        for index in indexes {
            let named = useIndex.map { $0.designDocument == index.designDocument && ($0.name == nil || $0.name == index.name) } ?? false
            let why = reason(index, named: named)
            plan.candidates.append((index, why == nil, why ?? "usable"))
            if why == nil { usable.append(index) }
        }
        plan.candidates.append((nil, allDocsUsable, allDocsUsable ? "unfavored_type" : "sort_order_mismatch"))
        usable.sort { a, b in
            let (x, y) = (narrowed(a), narrowed(b))
            if x != y { return x > y }
            if a.fields.count != b.fields.count { return a.fields.count < b.fields.count }
            return (a.designDocument, a.name) < (b.designDocument, b.name)
        }
        var chosen = usable.first { $0.partialFilter == nil }
        if let (ddoc, name) = useIndex {
            let label = name.map { "\(ddoc), \($0)" } ?? ddoc
            if let named = usable.first(where: { $0.designDocument == ddoc && (name == nil || $0.name == name) }) {
                chosen = named
            } else if !allowFallback {
                throw .invalidQuery(error: "invalid_index", reason: "\(label) specified by `use_index` could not be found or it is not suitable.")
            } else {
                plan.warnings.append(name == nil ? "\(ddoc) was not used because it does not contain a valid index for this query."
                                                 : "\(label) was not used because it is not a valid index for this query.")
            }
        }
        guard let index = chosen else {
            guard allDocsUsable else {
                throw .invalidQuery(error: "no_usable_index", reason: "No index exists for this sort, try indexing by the sort fields.")
            }
            plan.warnings.append("No matching index found, create an index to optimize query time.")
            if let id = equalities("_id").first?.stringValue { plan.onlyID = id }
            plan.startKey = [plan.onlyID.map(JSONValue.string) ?? .null]
            plan.endKey = [plan.onlyID.map(JSONValue.string) ?? "<MAX>"]
            return plan
        }
        plan.index = index
        // The key range: leading fields held equal, then the bounds of the next one.
        var prefix: [UInt8] = []
        var lower: [UInt8]?
        var upper: [UInt8]?
        for field in index.fields {
            let ops = required[field] ?? []
            if let value = equalities(field).first {
                Collation.appendKey(value, to: &prefix)
                plan.startKey.append(value)
                plan.endKey.append(value)
                continue
            }
            var start: JSONValue?
            var end: JSONValue?
            for op in ops {
                switch op {
                case .gt(let v), .gte(let v):
                    let bound = prefix + Collation.key(v) + (op.isStrict ? [0xFF] : [])
                    if lower.map({ bound.lexicographicallyPrecedes($0) }) != true { lower = bound; start = v }
                case .lt(let v), .lte(let v):
                    let bound = prefix + Collation.key(v) + (op.isStrict ? [] : [0xFF])
                    if upper.map({ $0.lexicographicallyPrecedes(bound) }) != true { upper = bound; end = v }
                default: break
                }
            }
            plan.startKey.append(start ?? .null)
            plan.endKey.append(end ?? "<MAX>")
            break
        }
        if !prefix.isEmpty {
            lower = lower ?? prefix
            upper = upper ?? Collation.afterPrefix(prefix)
        }
        plan.lower = lower
        plan.upper = upper
        return plan
    }
}

extension Selector.Operator {
    /// Whether an index range can be narrowed by it.
    var bounds: Bool {
        switch self {
        case .eq, .gt, .gte, .lt, .lte: true
        default: false
        }
    }

    var isStrict: Bool {
        switch self {
        case .gt, .lt: true
        default: false
        }
    }
}
