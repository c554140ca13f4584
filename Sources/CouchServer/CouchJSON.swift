import DocumentModel
import DocumentStore
import Foundation

/// How a document's attachments are written out.
enum AttachmentBodies {
    /// `"stub": true` with length.
    case stubs
    /// `"data": base64` inline (JSON with `attachments=true`).
    case inline
    /// `"follows": true`, the bodies sent as MIME parts after the JSON.
    case follows
}

/// CouchDB's query options for rendering one revision.
struct RenderOptions {
    var revisions = false
    var conflicts = false
    var deletedConflicts = false
    var revsInfo = false
    var bodies = AttachmentBodies.stubs
    /// Bodies only for attachments changed after the newest of these that is an ancestor.
    var attsSince: [RevisionID] = []
    var encodingInfo = false
}

/// A revision as CouchDB's JSON, plus the attachments whose bodies go with it.
struct RenderedRevision {
    var json: JSONObject
    /// With `.follows`: the attachments to send as parts, in `_attachments` order.
    var following: [Attachment]
}

enum CouchJSON {
    static func sequence(_ value: Int64) -> JSONValue { .string(String(value)) }

    /// Reads a `since` / sequence value: a number, a numeric string, `"now"` is handled by callers.
    static func parseSequence(_ text: String) throws -> Int64 {
        // Accept CouchDB-style "N-opaque" too, from clients that mix servers up.
        let digits = text.split(separator: "-").first.map(String.init) ?? text
        guard let value = Int64(digits), value >= 0 else {
            throw HTTPError(.badRequest, "bad_request", "Malformed sequence supplied in 'since' parameter.")
        }
        return value
    }

    /// The generation from which attachment bodies are already known to the client.
    static func knownRevpos(_ attsSince: [RevisionID], history: [RevisionID]) -> Int {
        let ancestors = Set(history)
        return attsSince.filter { ancestors.contains($0) }.map(\.generation).max() ?? 0
    }

    /// Renders `revision`. `readBody` is called for inline bodies.
    /// `hasBody` tells `_revs_info` which ancestors still have their bodies here.
    static func render(_ revision: Revision, tree: RevisionTree, options: RenderOptions,
                       hasBody: (RevisionID) -> Bool = { _ in true },
                       readBody: (Attachment) throws -> [UInt8]) throws -> RenderedRevision {
        var json = JSONObject()
        json["_id"] = .string(revision.docID)
        json["_rev"] = .string(revision.revID.description)
        if revision.deleted { json["_deleted"] = true }
        for (key, value) in revision.properties { json[key] = value }
        let history = tree.history(of: revision.revID)
        if options.revisions {
            json["_revisions"] = ["start": .integer(Int64(revision.revID.generation)),
                                  "ids": .array(history.map { .string($0.suffix) })]
        }
        var following: [Attachment] = []
        if !revision.attachments.isEmpty {
            let known = knownRevpos(options.attsSince, history: history)
            var attachments = JSONObject()
            for attachment in revision.attachments {
                var entry: JSONObject = ["content_type": .string(attachment.contentType),
                                         "revpos": .integer(Int64(attachment.revpos)),
                                         "digest": .string(attachment.digest)]
                let wanted = attachment.revpos > known && attachment.contentAvailable
                switch (options.bodies, wanted) {
                case (.inline, true):
                    entry["data"] = .string(Data(try readBody(attachment)).base64EncodedString())
                case (.follows, true):
                    entry["length"] = .integer(attachment.length)
                    entry["follows"] = true
                    following.append(attachment)
                default:
                    entry["length"] = .integer(attachment.length)
                    entry["stub"] = true
                }
                attachments[attachment.name] = .object(entry)
            }
            json["_attachments"] = .object(attachments)
        }
        if options.conflicts {
            let conflicts = tree.conflicts.filter { $0.id != revision.revID }
            if !conflicts.isEmpty { json["_conflicts"] = .array(conflicts.map { .string($0.id.description) }) }
        }
        if options.deletedConflicts {
            let deleted = tree.leaves.filter { $0.deleted && $0.id != revision.revID }
            if !deleted.isEmpty { json["_deleted_conflicts"] = .array(deleted.map { .string($0.id.description) }) }
        }
        if options.revsInfo {
            json["_revs_info"] = .array(history.map { id in
                let status = tree.nodes[id]?.deleted == true ? "deleted" : id == revision.revID || hasBody(id) ? "available" : "missing"
                return ["rev": .string(id.description), "status": .string(status)]
            })
        }
        return RenderedRevision(json: json, following: following)
    }
}

/// One entry of an incoming document's `_attachments`.
struct IncomingAttachment {
    enum Body {
        /// Keep the body the document already has under this name.
        case stub
        /// Base64 data inline (decoded already).
        case data([UInt8])
        /// Sent as a MIME part after the JSON.
        case follows
    }
    let name: String
    let contentType: String?
    let body: Body
    let digest: String?
    let revpos: Int?
    let length: Int64?
    /// `gzip` when a following part is compressed.
    let encoding: String?
}

/// A document as a client sends it (`PUT`, `_bulk_docs`, the JSON part of a multipart PUT).
struct IncomingDocument {
    var id: String?
    var rev: RevisionID?
    var deleted = false
    var properties = JSONObject()
    /// `_revisions`, newest first, when given.
    var history: [RevisionID]?
    /// nil when the document has no `_attachments` (it then has none).
    var attachments: [IncomingAttachment]?

    /// Metadata fields CouchDB documents may carry and Sofa ignores on input.
    static let ignoredSpecials: Set<String> = ["_conflicts", "_deleted_conflicts", "_revs_info", "_local_seq", "_rev_tree"]

    init(_ value: JSONValue) throws {
        guard case .object(let object) = value else {
            throw HTTPError(.badRequest, "bad_request", "Document must be a JSON object")
        }
        for (key, value) in object {
            switch key {
            case "_id":
                guard let id = value.stringValue else { throw HTTPError(.badRequest, "illegal_docid", "Document id must be a string") }
                self.id = id
            case "_rev":
                guard let text = value.stringValue, let rev = RevisionID(text) else {
                    throw HTTPError(.badRequest, "bad_request", "Invalid rev format")
                }
                self.rev = rev
            case "_deleted":
                deleted = value.boolValue ?? false
            case "_revisions":
                guard let start = value["start"]?.int64Value, let ids = value["ids"]?.arrayValue,
                      start >= Int64(ids.count), !ids.isEmpty else {
                    throw HTTPError(.badRequest, "bad_request", "_revisions must have start and a non-empty ids list")
                }
                history = try ids.enumerated().map { index, id in
                    guard let suffix = id.stringValue, !suffix.isEmpty else {
                        throw HTTPError(.badRequest, "bad_request", "_revisions ids must be strings")
                    }
                    return RevisionID(generation: Int(start) - index, suffix: suffix)
                }
            case "_attachments":
                guard case .object(let entries) = value else {
                    throw HTTPError(.badRequest, "bad_request", "_attachments must be an object")
                }
                attachments = try entries.map { name, entry in try IncomingDocument.attachment(name, entry) }
            default:
                if key.hasPrefix("_") {
                    if IncomingDocument.ignoredSpecials.contains(key) { continue }
                    throw HTTPError(.badRequest, "doc_validation", "Bad special document member: \(key)")
                }
                properties[key] = value
            }
        }
        if rev == nil, let newest = history?.first { rev = newest }
    }

    private static func attachment(_ name: String, _ entry: JSONValue) throws -> IncomingAttachment {
        guard case .object = entry else { throw HTTPError(.badRequest, "bad_request", "attachment \(name) must be an object") }
        let body: IncomingAttachment.Body
        if entry["stub"]?.boolValue == true {
            body = .stub
        } else if entry["follows"]?.boolValue == true {
            body = .follows
        } else if let base64 = entry["data"]?.stringValue {
            guard let data = Data(base64Encoded: base64, options: .ignoreUnknownCharacters) else {
                throw HTTPError(.badRequest, "bad_request", "Invalid attachment data for \(name)")
            }
            body = .data([UInt8](data))
        } else {
            throw HTTPError(.badRequest, "bad_request", "attachment \(name) has no data, stub or follows")
        }
        return IncomingAttachment(name: name, contentType: entry["content_type"]?.stringValue, body: body,
                                  digest: entry["digest"]?.stringValue, revpos: entry["revpos"]?.int64Value.map { Int($0) },
                                  length: entry["length"]?.int64Value, encoding: entry["encoding"]?.stringValue)
    }

    /// The ancestors for `Database.insert`, parent first.
    var ancestors: [RevisionID] { Array((history ?? []).dropFirst()) }
}
