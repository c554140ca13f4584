import DocumentModel
import Foundation

/// CouchDB's document format, written and read in this one place for the server, the
/// replicator and export/import: a revision as CouchDB's JSON (`_id`, `_rev`, `_deleted`,
/// `_revisions`, `_attachments` with stubs, inline `data` or `follows`, `_conflicts`…), and
/// back.
///
/// Digests: an attachment whose body is here carries the digest of its bytes as Sofa
/// stores them (decoded; `sha1-…` for bodies made here, `md5-…` for bodies that came with
/// one), so the digest sent with a body always matches the bytes sent. CouchDB checks an
/// `md5-` digest against the bytes it receives and refuses a mismatch (`500
/// function_clause`); it ignores other digests and computes its own.
///
/// Which bodies go along: CouchDB's rule. A body is sent unless the receiver is known to
/// have it: its revpos is at or below the generation of the newest ancestor the receiver
/// holds (`atts_since`, `possible_ancestors`). A revpos of 0 (CouchDB gives that to
/// attachments that arrived inline with `new_edits=false`) says nothing, so such a body
/// is always sent.
public enum CouchFormat {
    /// How a document's attachments are written out.
    public enum Bodies: Sendable {
        /// `"stub": true` with length.
        case stubs
        /// `"data": base64` inline (JSON with `attachments=true`).
        case inline
        /// `"follows": true`, the bodies sent as MIME parts after the JSON.
        case follows
    }

    /// CouchDB's query options for rendering one revision.
    public struct Options: Sendable {
        public var revisions = false
        public var conflicts = false
        public var deletedConflicts = false
        public var revsInfo = false
        public var bodies = Bodies.stubs
        /// Bodies only for attachments changed after the newest of these that is an ancestor.
        public var attsSince: [RevisionID] = []
        public var encodingInfo = false

        public init() {}
    }

    /// A revision as CouchDB's JSON, plus the attachments whose bodies go with it.
    public struct Rendered: Sendable {
        public var json: JSONObject
        /// With `.follows`: the attachments to send as parts, in `_attachments` order.
        public var following: [Attachment]
        /// Attachments whose bodies the rule says go along but that are not on this machine
        /// (written as stubs).
        public var absent: [Attachment] = []
    }

    /// The generation from which the receiver has the attachment bodies: that of the newest
    /// revision of `history` (the revision's own, newest first) that it holds.
    public static func knownGeneration(_ held: [RevisionID], history: [RevisionID]) -> Int {
        let ancestors = Set(history)
        return held.filter { ancestors.contains($0) }.map(\.generation).max() ?? 0
    }

    /// Whether an attachment's body goes along to a receiver that has the bodies up to
    /// generation `known` (see the type's overview). The one place this rule lives.
    public static func sendsBody(_ attachment: Attachment, known: Int) -> Bool {
        attachment.revpos == 0 || attachment.revpos > known
    }

    /// `_revisions` for a history, newest first.
    public static func revisions(_ history: [RevisionID]) -> JSONValue {
        guard let newest = history.first else { return .null }
        return ["start": .integer(Int64(newest.generation)), "ids": .array(history.map { .string($0.suffix) })]
    }

    /// One `_attachments` entry without its body: content type, revpos, digest, length, stub.
    /// `bySHA1`: the digest of the bytes here when they are (what Couchbase Lite looks bodies up by).
    public static func stub(_ attachment: Attachment, bySHA1: Bool = false) -> JSONObject {
        let digest = bySHA1 ? attachment.blobKey?.digestString ?? attachment.digest : attachment.digest
        return ["content_type": .string(attachment.contentType), "revpos": .integer(Int64(attachment.revpos)),
                "digest": .string(digest), "length": .integer(attachment.length), "stub": true]
    }

    /// Renders `revision`. `readBody` is called for inline bodies. `hasBody` tells
    /// `_revs_info` which ancestors still have their bodies here. Bodies that are not on
    /// this machine go as stubs.
    public static func render(_ revision: some CouchRevision, history: [RevisionID], tree: RevisionTree? = nil, options: Options,
                              hasBody: (RevisionID) throws -> Bool = { _ in true },
                              readBody: (Attachment) throws -> [UInt8]) throws -> Rendered {
        var json = JSONObject()
        json["_id"] = .string(revision.docID)
        json["_rev"] = .string(revision.revID.description)
        if revision.deleted { json["_deleted"] = true }
        for (key, value) in revision.properties { json[key] = value }
        if options.revisions { json["_revisions"] = revisions(history) }
        var following: [Attachment] = []
        var absent: [Attachment] = []
        if !revision.attachments.isEmpty {
            let known = options.attsSince.isEmpty ? Int.min : knownGeneration(options.attsSince, history: history)
            var attachments = JSONObject()
            for attachment in revision.attachments {
                var entry: JSONObject = ["content_type": .string(attachment.contentType),
                                         "revpos": .integer(Int64(attachment.revpos)),
                                         "digest": .string(attachment.digest)]
                let sent = sendsBody(attachment, known: known)
                if sent && !attachment.contentAvailable { absent.append(attachment) }
                let wanted = sent && attachment.contentAvailable
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
        if let tree, options.conflicts {
            let conflicts = tree.conflicts.filter { $0.id != revision.revID }
            if !conflicts.isEmpty { json["_conflicts"] = .array(conflicts.map { .string($0.id.description) }) }
        }
        if let tree, options.deletedConflicts {
            let deleted = tree.leaves.filter { $0.deleted && $0.id != revision.revID }
            if !deleted.isEmpty { json["_deleted_conflicts"] = .array(deleted.map { .string($0.id.description) }) }
        }
        if let tree, options.revsInfo {
            json["_revs_info"] = .array(try history.map { id in
                let status = try tree.nodes[id]?.deleted == true ? "deleted" : id == revision.revID || hasBody(id) ? "available" : "missing"
                return ["rev": .string(id.description), "status": .string(status)]
            })
        }
        return Rendered(json: json, following: following, absent: absent)
    }

    /// Renders a stored revision of the document whose tree is `tree`.
    public static func render(_ revision: Revision, tree: RevisionTree, options: Options,
                              hasBody: (RevisionID) throws -> Bool = { _ in true },
                              readBody: (Attachment) throws -> [UInt8]) throws -> Rendered {
        try render(revision, history: tree.history(of: revision.revID), tree: tree, options: options,
                   hasBody: hasBody, readBody: readBody)
    }

    /// The part headers CouchDB writes before an attachment body in a multipart document.
    public static func partHeaders(_ attachment: Attachment) -> String {
        let name = attachment.name.replacingOccurrences(of: "\"", with: "\\\"")
        return "Content-Disposition: attachment; filename=\"\(name)\"\r\nContent-Type: \(attachment.contentType)\r\n"
            + "Content-Length: \(attachment.length)\r\n\r\n"
    }
}

/// What a revision needs to be written in CouchDB's format: a stored `Revision`, or a
/// `ReplicatedRevision` on its way between two databases.
public protocol CouchRevision {
    var docID: String { get }
    var revID: RevisionID { get }
    var deleted: Bool { get }
    var properties: JSONObject { get }
    var attachments: [Attachment] { get }
}

extension Revision: CouchRevision {}
extension ReplicatedRevision: CouchRevision {}

/// A document that CouchDB's format refuses, with CouchDB's error name
/// (`bad_request`, `doc_validation`) and reason.
public struct CouchFormatError: Error, CustomStringConvertible, Sendable {
    public let error: String
    public let reason: String

    public init(_ error: String, _ reason: String) {
        self.error = error
        self.reason = reason
    }

    public var description: String { "invalid document: \(reason)" }
}

/// One entry of an incoming document's `_attachments`.
public struct IncomingAttachment: Sendable {
    public enum Body: Sendable {
        /// Keep the body the document already has under this name.
        case stub
        /// Base64 data inline (decoded already).
        case data([UInt8])
        /// Sent as a MIME part after the JSON.
        case follows
    }
    public let name: String
    public let contentType: String?
    public let body: Body
    public let digest: String?
    public let revpos: Int?
    public let length: Int64?
    /// `gzip` when a following part is compressed.
    public let encoding: String?

    /// Whether the body came inline (`data`).
    public var isInline: Bool {
        if case .data = body { return true }
        return false
    }
}

/// A document as a client sends it (`PUT`, `_bulk_docs`, the JSON part of a multipart PUT).
public struct IncomingDocument: Sendable {
    public var id: String?
    public var rev: RevisionID?
    public var deleted = false
    public var properties = JSONObject()
    /// `_revisions`, newest first, when given.
    public var history: [RevisionID]?
    /// nil when the document has no `_attachments` (it then has none).
    public var attachments: [IncomingAttachment]?

    /// Metadata fields CouchDB documents may carry and Sofa ignores on input.
    public static let ignoredSpecials: Set<String> = ["_conflicts", "_deleted_conflicts", "_revs_info", "_local_seq", "_rev_tree"]

    public init(_ value: JSONValue) throws {
        guard case .object(let object) = value else {
            throw CouchFormatError("bad_request", "Document must be a JSON object")
        }
        for (key, value) in object {
            switch key {
            case "_id":
                guard let id = value.stringValue else { throw CouchFormatError("illegal_docid", "Document id must be a string") }
                self.id = id
            case "_rev":
                guard let text = value.stringValue, let rev = RevisionID(text) else {
                    throw CouchFormatError("bad_request", "Invalid rev format")
                }
                self.rev = rev
            case "_deleted":
                deleted = value.boolValue ?? false
            case "_revisions":
                guard let start = value["start"]?.int64Value, let ids = value["ids"]?.arrayValue,
                      start >= Int64(ids.count), !ids.isEmpty else {
                    throw CouchFormatError("bad_request", "_revisions must have start and a non-empty ids list")
                }
                history = try ids.enumerated().map { index, id in
                    guard let suffix = id.stringValue, !suffix.isEmpty else {
                        throw CouchFormatError("bad_request", "_revisions ids must be strings")
                    }
                    return RevisionID(generation: Int(start) - index, suffix: suffix)
                }
            case "_attachments":
                guard case .object(let entries) = value else {
                    throw CouchFormatError("bad_request", "_attachments must be an object")
                }
                attachments = try entries.map { name, entry in try IncomingDocument.attachment(name, entry) }
            default:
                if key.hasPrefix("_") && !key.hasPrefix(Database.replicationFieldPrefix) {
                    if IncomingDocument.ignoredSpecials.contains(key) { continue }
                    throw CouchFormatError("doc_validation", "Bad special document member: \(key)")
                }
                properties[key] = value
            }
        }
        if rev == nil, let newest = history?.first { rev = newest }
    }

    private static func attachment(_ name: String, _ entry: JSONValue) throws -> IncomingAttachment {
        guard case .object = entry else { throw CouchFormatError("bad_request", "attachment \(name) must be an object") }
        let body: IncomingAttachment.Body
        if entry["stub"]?.boolValue == true {
            body = .stub
        } else if entry["follows"]?.boolValue == true {
            body = .follows
        } else if let base64 = entry["data"]?.stringValue {
            guard let data = Data(base64Encoded: base64, options: .ignoreUnknownCharacters) else {
                throw CouchFormatError("bad_request", "Invalid attachment data for \(name)")
            }
            body = .data([UInt8](data))
        } else {
            throw CouchFormatError("bad_request", "attachment \(name) has no data, stub or follows")
        }
        return IncomingAttachment(name: name, contentType: entry["content_type"]?.stringValue, body: body,
                                  digest: entry["digest"]?.stringValue, revpos: entry["revpos"]?.int64Value.map { Int($0) },
                                  length: entry["length"]?.int64Value, encoding: entry["encoding"]?.stringValue)
    }

    /// The ancestors for `Database.insert`, parent first.
    public var ancestors: [RevisionID] { Array((history ?? []).dropFirst()) }
}

extension IncomingAttachment {
    /// The attachment as its sender describes it, without a body here (yet).
    public func metadata(of revision: RevisionID) -> Attachment {
        Attachment(name: name, contentType: contentType ?? MIMEType.forFileName(name), length: length ?? 0,
                   digest: digest ?? "", blobKey: nil, revpos: revpos ?? revision.generation)
    }
}
