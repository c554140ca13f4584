import Foundation

/// A Mango query as CouchDB's `_find` takes it: `selector`, `limit` (25), `skip`, `sort`,
/// `fields`, `bookmark`; `use_index`, `r`, `conflicts`, `update`, `stable` and
/// `execution_stats` are accepted. Parsing and the pieces a scan needs (ordering,
/// projection, bookmarks) live here; the scan itself is `Database.find`.
public struct MangoQuery: Sendable {
    public let selector: Selector
    public var limit = 25
    public var skip = 0
    /// Fields to order by, in order; empty: document id order.
    public var sort: [(field: String, descending: Bool)] = []
    /// Fields to keep (dotted paths); nil: the whole document.
    public var fields: [String]?
    /// Where a previous page ended.
    public var bookmark: Bookmark?
    public var executionStats = false
    public var useIndex: JSONValue?

    /// A position between pages: after a document id (id order), or an offset (sorted).
    public enum Bookmark: Sendable, Equatable {
        case after(String)
        case offset(Int)

        /// Opaque to clients, as CouchDB's are.
        public var token: String {
            let text: String
            switch self {
            case .after(let id): text = "a" + id
            case .offset(let n): text = "o" + String(n)
            }
            return Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        }

        public init?(token: String) {
            var base64 = token.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
            while base64.count % 4 != 0 { base64 += "=" }
            guard let data = Data(base64Encoded: base64), let text = String(data: data, encoding: .utf8), let kind = text.first else { return nil }
            let rest = String(text.dropFirst())
            switch kind {
            case "a": self = .after(rest)
            case "o":
                guard let n = Int(rest), n >= 0 else { return nil }
                self = .offset(n)
            default: return nil
            }
        }
    }

    public init(_ body: JSONObject) throws(SofaError) {
        guard let selector = body["selector"] else { throw .invalidArgument("a query needs a selector") }
        self.selector = try Selector(selector)
        if let value = body["limit"] {
            guard let n = value.int64Value, n >= 0 else { throw .invalidArgument("limit must be a non-negative integer") }
            limit = Int(clamping: n)
        }
        if let value = body["skip"] {
            guard let n = value.int64Value, n >= 0 else { throw .invalidArgument("skip must be a non-negative integer") }
            skip = Int(clamping: n)
        }
        if let value = body["sort"] {
            guard let items = value.arrayValue else { throw .invalidArgument("sort must be an array") }
            sort = try items.map { item throws(SofaError) in
                if let field = item.stringValue { return (field, false) }
                guard let pair = item.objectValue, pair.count == 1, let (field, direction) = pair.entries.first,
                      let word = direction.stringValue, word == "asc" || word == "desc" else {
                    throw .invalidArgument("each sort entry must be \"field\" or {\"field\": \"asc\"|\"desc\"}")
                }
                return (field, word == "desc")
            }
            if Set(sort.map(\.descending)).count > 1 { throw .invalidArgument("sort fields must all go the same direction") }
        }
        if let value = body["fields"] {
            guard let items = value.arrayValue, items.allSatisfy({ $0.stringValue != nil }) else {
                throw .invalidArgument("fields must be an array of field names")
            }
            fields = items.compactMap(\.stringValue)
        }
        if let value = body["bookmark"], value != .null, value.stringValue != "nil" {
            guard let token = value.stringValue, let bookmark = Bookmark(token: token) else { throw .invalidArgument("invalid bookmark") }
            self.bookmark = bookmark
        }
        executionStats = body["execution_stats"]?.boolValue ?? false
        useIndex = body["use_index"]
    }

    /// Whether `a` comes before `b` in the query's order (ties: document id).
    public func precedes(_ a: JSONObject, _ b: JSONObject) -> Bool {
        for (field, descending) in sort {
            let order = Selector.compare(Selector.lookUp(.object(a), path: field) ?? .null, Selector.lookUp(.object(b), path: field) ?? .null)
            if order != 0 { return descending ? order > 0 : order < 0 }
        }
        let (x, y) = (a["_id"]?.stringValue ?? "", b["_id"]?.stringValue ?? "")
        return sort.first?.descending == true ? y.unicodeScalars.lexicographicallyPrecedes(x.unicodeScalars)
            : x.unicodeScalars.lexicographicallyPrecedes(y.unicodeScalars)
    }

    /// The document with only the asked-for fields (nested ones rebuilt), or all of it.
    public func project(_ document: JSONObject) -> JSONObject {
        guard let fields else { return document }
        var result = JSONObject()
        for field in fields {
            guard let value = Selector.lookUp(.object(document), path: field) else { continue }
            let parts = field.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            result = MangoQuery.setting(value, at: parts[...], in: result)
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
