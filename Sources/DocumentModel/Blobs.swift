/// Couchbase Lite 2.x and 3.x blobs: property values that stand for bodies in the blob store.
///
/// A blob is a dictionary anywhere in a document's properties (inside objects and arrays):
/// `{"@type": "blob", "content_type": "image/jpeg", "digest": "sha1-…", "length": 40234}`.
/// On the CouchDB wire each blob has a stand-in in `_attachments`, named `blob_` followed by
/// the JSON pointer of the property (`blob_/avatar`, `blob_/photos/0`), which carries its
/// body; this is how Couchbase Lite's replicator writes them and how it recognises them when
/// it reads them back. Sofa stores the stand-ins as the revision's attachment rows of those
/// names, so bodies, deferral, fetching, compaction and replication treat blobs and
/// attachments alike; what is a blob is decided by the properties (`standIns`).
public struct BlobProperty: Hashable, Sendable {
    /// Where the blob is: an RFC 6901 JSON pointer into the properties (`/photos/0`).
    public let pointer: String
    /// The body the blob names (its `digest`).
    public let key: BlobKey
    /// Its `length`, when it has one.
    public let length: Int64?
    /// Its `content_type`, when it has one.
    public let contentType: String?

    /// The name of its stand-in in `_attachments`.
    public var standInName: String { Blobs.standInName(pointer) }
}

public enum Blobs {
    /// The value of `@type` that marks a blob, spelled exactly so (Couchbase Lite compares bytes).
    public static let typeValue = "blob"
    public static let typeKey = "@type"
    /// Stand-in names are this prefix and a JSON pointer.
    public static let standInPrefix = "blob_/"

    public static func standInName(_ pointer: String) -> String { "blob_" + pointer }

    /// Whether an attachment name is of the form stand-ins have (it stands in for a blob
    /// only when its pointer leads to one, see `standIns(in:)`).
    public static func isStandInName(_ name: String) -> Bool { name.hasPrefix(standInPrefix) }

    /// The pointer a stand-in name holds.
    public static func pointer(ofStandIn name: String) -> String? {
        isStandInName(name) ? String(name.dropFirst(standInPrefix.count - 1)) : nil
    }

    /// Whether `value` is a blob dictionary: `@type` is `blob`, whatever else it holds.
    public static func isBlob(_ value: JSONValue) -> Bool {
        value[typeKey] == .string(typeValue)
    }

    /// The blobs in `properties`, in document order; blobs inside blobs are not looked for.
    /// Throws for a dictionary marked as a blob whose digest, length or content type is not
    /// valid (a document being saved here); `lenient` skips those instead (a document as
    /// another replica sent it, which is kept as it came).
    public static func find(in properties: JSONObject, docID: String, lenient: Bool = false) throws(SofaError) -> [BlobProperty] {
        var found: [BlobProperty] = []
        func visit(_ value: JSONValue, _ pointer: String) throws(SofaError) {
            switch value {
            case .object(let object):
                if isBlob(value) {
                    do {
                        found.append(try blob(object, at: pointer, docID: docID))
                    } catch where lenient {
                        return
                    }
                    return
                }
                for (key, member) in object where member.isContainer { try visit(member, pointer + "/" + JSONPointer.escape(key)) }
            case .array(let elements):
                for (index, element) in elements.enumerated() where element.isContainer { try visit(element, pointer + "/\(index)") }
            default:
                return
            }
        }
        // Only objects and arrays are walked into (a pointer is made for them alone): most
        // members are scalars, and every revision a replication saves is searched.
        for (key, value) in properties where value.isContainer { try visit(value, "/" + JSONPointer.escape(key)) }
        return found
    }

    /// The blob at `pointer`, when there is a valid one.
    public static func blob(at pointer: String, in properties: JSONObject, docID: String) -> BlobProperty? {
        guard let value = JSONPointer.value(at: pointer, in: properties), isBlob(value), case .object(let object) = value else { return nil }
        return try? blob(object, at: pointer, docID: docID)  // a malformed blob dictionary is not a blob here
    }

    static func blob(_ object: JSONObject, at pointer: String, docID: String) throws(SofaError) -> BlobProperty {
        func invalid(_ reason: String) -> SofaError { .invalidBlob(docID: docID, pointer: pointer, reason: reason) }
        guard let digest = object["digest"] else { throw invalid("it has no digest") }
        guard case .string(let text) = digest, let key = BlobKey(digestString: text) else {
            throw invalid("its digest \(digest.jsonString()) is not sha1- and the base64 of 20 bytes")
        }
        var length: Int64?
        if let value = object["length"] {
            guard case .integer(let number) = value, number >= 0 else {
                throw invalid("its length \(value.jsonString()) is not a whole number of bytes")
            }
            length = number
        }
        var contentType: String?
        if let value = object["content_type"] {
            guard case .string(let text) = value else { throw invalid("its content_type is not a string") }
            contentType = text
        }
        return BlobProperty(pointer: pointer, key: key, length: length, contentType: contentType)
    }

    /// The blob dictionary for a body: `existing`'s other members kept, `@type`, `content_type`,
    /// `digest` and `length` set, in the order Couchbase Lite writes them.
    public static func dictionary(key: BlobKey, length: Int64, contentType: String, keeping existing: JSONObject? = nil) -> JSONObject {
        var dictionary = JSONObject([(typeKey, .string(typeValue)), ("content_type", .string(contentType)),
                                     ("digest", .string(key.digestString)), ("length", .integer(length))])
        for (member, value) in existing ?? JSONObject() where dictionary[member] == nil { dictionary[member] = value }
        return dictionary
    }
}

/// RFC 6901 JSON pointers into document properties.
public enum JSONPointer {
    /// A member name as a pointer segment: `~` as `~0`, `/` as `~1`.
    public static func escape(_ key: String) -> String {
        guard key.contains("~") || key.contains("/") else { return key }
        return key.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
    }

    /// The member names of a pointer; nil when it is not one (not starting with `/`, or a `~`
    /// followed by anything but `0` or `1`).
    public static func segments(_ pointer: String) -> [String]? {
        guard pointer.hasPrefix("/") else { return nil }
        var segments: [String] = []
        for raw in pointer.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            var segment = ""
            var escaped = false
            for character in raw {
                if escaped {
                    switch character {
                    case "0": segment.append("~")
                    case "1": segment.append("/")
                    default: return nil
                    }
                    escaped = false
                } else if character == "~" {
                    escaped = true
                } else {
                    segment.append(character)
                }
            }
            if escaped { return nil }
            segments.append(segment)
        }
        return segments
    }

    /// The value at `pointer`, nil when nothing is there.
    public static func value(at pointer: String, in properties: JSONObject) -> JSONValue? {
        guard let segments = segments(pointer) else { return nil }
        var value = JSONValue.object(properties)
        for segment in segments {
            switch value {
            case .object(let object): guard let member = object[segment] else { return nil }; value = member
            case .array(let elements):
                guard let index = arrayIndex(segment), index < elements.count else { return nil }
                value = elements[index]
            default: return nil
            }
        }
        return value
    }

    /// `properties` with `value` at `pointer`: a member set, an array element replaced (or
    /// appended at the index one past the end), missing objects on the way made. Throws when the
    /// way leads through a value that holds nothing (a string, a number) or past an array's end.
    public static func setting(_ value: JSONValue, at pointer: String, in properties: JSONObject) throws(SofaError) -> JSONObject {
        guard let segments = segments(pointer), !segments.isEmpty else {
            throw .invalidArgument("\"\(pointer)\" is not a JSON pointer to a property (RFC 6901: /name/…, ~0 for ~, ~1 for /)")
        }
        func set(_ container: JSONValue?, _ rest: ArraySlice<String>) throws(SofaError) -> JSONValue {
            guard let segment = rest.first else { return value }
            switch container ?? .object(JSONObject()) {
            case .object(var object):
                object[segment] = try set(object[segment], rest.dropFirst())
                return .object(object)
            case .array(var elements):
                guard let index = arrayIndex(segment), index <= elements.count else {
                    throw .invalidArgument("\(pointer): \"\(segment)\" is not an index of an array of \(elements.count)")
                }
                if index == elements.count { elements.append(try set(nil, rest.dropFirst())) }
                else { elements[index] = try set(elements[index], rest.dropFirst()) }
                return .array(elements)
            case let other:
                throw .invalidArgument("\(pointer): \(other.kindName) is in the way")
            }
        }
        guard case .object(let result) = try set(.object(properties), segments[...]) else { return properties }
        return result
    }

    /// `properties` without the value at `pointer` (an array element is taken out, so later ones move up).
    public static func removing(_ pointer: String, from properties: JSONObject) -> JSONObject {
        guard let segments = segments(pointer), !segments.isEmpty else { return properties }
        func remove(_ container: JSONValue, _ rest: ArraySlice<String>) -> JSONValue {
            guard let segment = rest.first else { return container }
            let last = rest.count == 1
            switch container {
            case .object(var object):
                guard let member = object[segment] else { return container }
                object[segment] = last ? JSONValue?.none : remove(member, rest.dropFirst())
                return .object(object)
            case .array(var elements):
                guard let index = arrayIndex(segment), index < elements.count else { return container }
                if last { elements.remove(at: index) } else { elements[index] = remove(elements[index], rest.dropFirst()) }
                return .array(elements)
            default:
                return container
            }
        }
        guard case .object(let result) = remove(.object(properties), segments[...]) else { return properties }
        return result
    }

    /// An array index as RFC 6901 writes it: digits, no leading zero.
    static func arrayIndex(_ segment: String) -> Int? {
        guard !segment.isEmpty, segment.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
              segment == "0" || !segment.hasPrefix("0") else { return nil }
        return Int(segment)
    }
}

extension JSONValue {
    /// An object or an array: a value that may hold a blob.
    fileprivate var isContainer: Bool {
        switch self {
        case .object, .array: true
        default: false
        }
    }
}
