import DocumentModel
import Foundation

/// A Couchbase Lite `rev` message (BLIP sync) read as a revision: what both sides take from it,
/// `sofa serve` receiving a push and the replicator pulling from a Sync Gateway-like server.
/// Each side then finds the attachments' bodies its own way (asked of the client, or left on
/// the server), so the attachments are given as the metadata the message names.
public struct RevMessage: Sendable {
    public let docID: String
    public let revID: RevisionID
    /// The ancestors, parent first (the `history` property, without the revision itself).
    public let history: [RevisionID]
    public let deleted: Bool
    /// The body without CouchDB's special keys (`_id`, `_rev`, `_deleted`, `_revisions`,
    /// `_attachments`).
    public let properties: JSONObject
    public let attachments: [NamedAttachment]

    /// An entry of `_attachments`: a body named by its digest.
    public struct NamedAttachment: Sendable {
        public let name: String
        public let digest: String
        public let contentType: String
        /// Absent in the metadata: the revision's generation (Couchbase Lite's rule).
        public let revpos: Int
        public let length: Int64?
    }

    /// Reads `body` and the message's properties (`property(name)`). The document and revision
    /// are the `id` and `rev` properties, else the body's `_id` and `_rev`.
    public init(body: [UInt8], property: (String) -> String?) throws(SofaError) {
        let parsed: JSONValue
        do { parsed = try JSONParser.parse(body) } catch { throw .invalidJSON(error) }
        guard var object = parsed.objectValue else { throw .invalidArgument("rev: the body is not a JSON object") }
        guard let id = property("id") ?? object["_id"]?.stringValue, !id.isEmpty else { throw .invalidArgument("rev: no document id") }
        guard let text = property("rev") ?? object["_rev"]?.stringValue, let rev = RevisionID(text) else {
            throw .invalidArgument("rev: \(id) has no valid revision id")
        }
        var history = (property("history") ?? "").split(separator: ",").compactMap { RevisionID($0.trimmingCharacters(in: .whitespaces)) }
        if history.first == rev { history.removeFirst() }
        var attachments: [NamedAttachment] = []
        for (name, value) in object["_attachments"]?.objectValue ?? [:] {
            guard let metadata = value.objectValue, let digest = metadata["digest"]?.stringValue else {
                throw .invalidArgument("rev: attachment \(name) of \(id) has no digest")
            }
            attachments.append(NamedAttachment(name: name, digest: digest,
                                               contentType: metadata["content_type"]?.stringValue ?? MIMEType.forFileName(name),
                                               revpos: metadata["revpos"]?.int64Value.map(Int.init) ?? rev.generation,
                                               length: metadata["length"]?.int64Value))
        }
        // BLIP's flags: "true", "yes" or a number other than 0.
        let flag = property("deleted")?.lowercased()
        deleted = flag.map { $0 == "true" || $0 == "yes" || (Int($0) ?? 0) != 0 } == true || object["_deleted"]?.boolValue == true
        for key in ["_id", "_rev", "_deleted", "_revisions", "_attachments"] { object[key] = nil }
        (docID, revID, self.history, properties, self.attachments) = (id, rev, history, object, attachments)
    }
}

extension RevMessage {
    /// A `rev` message for a revision: its properties (`id`, `rev`, `sequence` when given,
    /// `deleted`, `history` parent first) and its body, the revision's properties with an
    /// `_attachments` stub per attachment, each named by its SHA-1 where the body is here (what
    /// Couchbase Lite asks `getAttachment` with). Both roles send revisions this way: a server
    /// answering a pull, a client pushing.
    public static func encode(docID: String, revID: RevisionID, deleted: Bool, properties: JSONObject,
                              attachments: [Attachment], history: [RevisionID], sequence: Int64? = nil,
                              extra: [(String, String)] = []) -> (properties: [(String, String)], body: [UInt8]) {
        var body = properties
        if !attachments.isEmpty {
            var stubs = JSONObject()
            for attachment in attachments { stubs[attachment.name] = .object(CouchFormat.stub(attachment, bySHA1: true)) }
            body["_attachments"] = .object(stubs)
        }
        var fields = [("id", docID), ("rev", revID.description)]
        if let sequence { fields.append(("sequence", String(sequence))) }
        if deleted { fields.append(("deleted", "1")) }
        if !history.isEmpty { fields.append(("history", history.map(\.description).joined(separator: ","))) }
        return (fields + extra, JSONValue.object(body).serialized())
    }
}
