import Foundation

/// A Mango JSON index, as CouchDB keeps it: a view of a design document whose `language`
/// is `"query"`, so that indexes replicate with the database both ways. Its key for a
/// document is the tuple of the indexed fields' values (`Collation.key` of each); a
/// document lacking one of them, or not matching the partial filter, is not in it.
public struct MangoIndex: Sendable, Equatable {
    /// `_design/…`.
    public let designDocument: String
    public let name: String
    public let fields: [String]
    /// The fields as they were defined (`"n"` or `{"n": "desc"}`), kept for `_index`.
    public let definedFields: [JSONValue]
    public let partialFilter: JSONObject?
    let filter: Selector?

    public static func == (a: MangoIndex, b: MangoIndex) -> Bool {
        a.designDocument == b.designDocument && a.name == b.name && a.definedFields == b.definedFields && a.partialFilter == b.partialFilter
    }

    init(designDocument: String, name: String, definedFields: [JSONValue], partialFilter: JSONObject?) throws(SofaError) {
        var fields: [String] = []
        for item in definedFields {
            if let field = item.stringValue {
                fields.append(field)
            } else if let pair = item.objectValue, pair.count == 1, let (field, direction) = pair.entries.first,
                      direction.stringValue == "asc" || direction.stringValue == "desc" {
                fields.append(field)
            } else {
                throw .invalidQuery(error: "invalid_sort_json", reason: "Invalid sort field: \(item.jsonString())")
            }
        }
        guard !fields.isEmpty else { throw .invalidQuery(error: "bad_request", reason: "an index needs at least one field") }
        let directions = Set(definedFields.compactMap { $0.objectValue?.entries.first?.value.stringValue })
        guard directions.count <= 1 else {
            throw .invalidQuery(error: "unsupported_mixed_sort", reason: "Sorts currently only support a single direction for all fields.")
        }
        self.designDocument = designDocument
        self.name = name
        self.fields = fields
        self.definedFields = definedFields
        let filter = partialFilter.flatMap { $0.isEmpty ? nil : $0 }
        self.partialFilter = filter
        self.filter = try filter.map { object throws(SofaError) in try Selector(.object(object)) }
    }

    /// An index from the body of `POST /db/_index` (`index.fields`, `index.partial_filter_selector`,
    /// `ddoc`, `name`, `type`); unnamed ones are named by a digest of their definition, so the
    /// same definition posted twice is the same index.
    public init(request body: JSONObject) throws(SofaError) {
        for key in body.keys where !["index", "ddoc", "name", "type", "partitioned"].contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        guard let index = body["index"]?.objectValue else {
            throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: index")
        }
        for key in index.keys where !["fields", "partial_filter_selector", "selector"].contains(key) {
            throw .invalidQuery(error: "invalid_key", reason: "Invalid key \(key) for this request.")
        }
        guard let fields = index["fields"] else { throw .invalidQuery(error: "missing_required_key", reason: "Missing required key: fields") }
        guard let items = fields.arrayValue else { throw .invalidQuery(error: "invalid_fields_json", reason: "Fields must be a list.") }
        if let type = body["type"], type.stringValue != "json" {
            throw .invalidQuery(error: "not_implemented", reason: "Sofa only has \"json\" Mango indexes, not \(type.jsonString()) ones.")
        }
        let filter = (index["partial_filter_selector"] ?? index["selector"]).map { value -> JSONObject? in value.objectValue }
        if let filter, filter == nil { throw .invalidQuery(error: "invalid_selector_json", reason: "partial_filter_selector must be a JSON object") }
        let definition = JSONValue.object(["fields": .array(items), "partial_filter_selector": .object(filter.flatMap { $0 } ?? [:])])
        let digest = BlobKey.hexString(MessageDigest.hash(.sha1, Array(definition.jsonString().utf8)))
        func named(_ key: String) throws(SofaError) -> String? {
            guard let value = body[key] else { return nil }
            guard let text = value.stringValue, !text.isEmpty else {
                throw .invalidQuery(error: "invalid_\(key)_json", reason: "\(key) must be a non-empty string")
            }
            return text
        }
        let ddoc = try named("ddoc") ?? digest
        try self.init(designDocument: ddoc.hasPrefix("_design/") ? ddoc : "_design/" + ddoc, name: try named("name") ?? digest,
                      definedFields: items, partialFilter: filter.flatMap { $0 })
    }

    /// The query indexes a design document defines (none unless its `language` is `"query"`).
    public static func indexes(inDesignDocument id: String, properties: JSONObject) -> [MangoIndex] {
        guard properties["language"]?.stringValue == "query", let views = properties["views"]?.objectValue else { return [] }
        return views.compactMap { name, view -> MangoIndex? in
            guard let map = view["map"]?.objectValue, let fields = map["fields"]?.objectValue else { return nil }
            // `options.def` keeps the fields as defined; `map.fields` has them with their direction.
            let defined = view["options"]?["def"]?["fields"]?.arrayValue
                ?? fields.map { field, direction in .object([field: direction]) }
            // A definition CouchDB would refuse defines no index (as CouchDB skips it).
            return try? MangoIndex(designDocument: id, name: name, definedFields: defined,
                                   partialFilter: map["partial_filter_selector"]?.objectValue)
        }
    }

    /// The view a design document holds for this index, as CouchDB writes it.
    public var view: JSONValue {
        let directions = JSONObject(zip(fields, definedFields).map { field, defined in
            (field, defined.objectValue?.entries.first?.value ?? "asc")
        })
        var def: JSONObject = ["fields": .array(definedFields)]
        if let partialFilter { def["partial_filter_selector"] = .object(partialFilter) }
        return ["map": ["fields": .object(directions), "partial_filter_selector": .object(partialFilter ?? [:])],
                "reduce": "_count", "options": ["def": .object(def)]]
    }

    /// The index as `GET /db/_index` lists it.
    public var listing: JSONObject {
        var def: JSONObject = ["fields": .array(zip(fields, definedFields).map { field, defined in
            .object([field: defined.objectValue?.entries.first?.value ?? "asc"])
        })]
        if let partialFilter { def["partial_filter_selector"] = .object(SelectorNormalForm.normalize(partialFilter)) }
        return ["ddoc": .string(designDocument), "name": .string(name), "type": "json", "partitioned": false, "def": .object(def)]
    }

    /// The special index of every document by id, as `_index` lists it.
    public static let allDocsListing: JSONObject = ["ddoc": .null, "name": "_all_docs", "type": "special",
                                                    "def": ["fields": [["_id": "asc"]]]]

    /// The key of `document` (properties with `_id` and `_rev`) in this index; nil when the
    /// document is not in it.
    public func key(of document: JSONObject) -> [UInt8]? { entry(of: document)?.key }

    /// The key of `document` and the values it was made of, one per field.
    public func entry(of document: JSONObject) -> (key: [UInt8], values: [JSONValue])? {
        if let filter, !filter.matches(document) { return nil }
        var key: [UInt8] = []
        var values: [JSONValue] = []
        for field in fields {
            guard let value = Selector.lookUp(.object(document), path: field) else { return nil }
            Collation.appendKey(value, to: &key)
            values.append(value)
        }
        return (key, values)
    }
}
