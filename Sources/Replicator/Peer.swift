import DocumentModel
import DocumentStore
import Foundation

/// One side of a replication, as PouchDB's `replicate` sees a database: a changes feed,
/// `_revs_diff`, revisions with their history, `_bulk_docs` with `new_edits=false`, and
/// `_local` checkpoints. `LocalPeer` is a Sofa database, `RemotePeer` a CouchDB-compatible
/// server; a pull is `Replication(source: remote, target: local)` and a push the same
/// routine with the two swapped.
///
/// Attachment bodies move between the two on the target's terms: a local target takes
/// the bodies it lacks (and its download policy allows) with `fetchBody`, a remote target
/// reads the bodies it must be sent with `openBody`. Only a local peer can be read that way,
/// so replicating between two remote databases is refused (that is CouchDB's job).
protocol ReplicationPeer: AnyObject {
    /// For messages: a path or a URL without credentials.
    var name: String { get }

    /// Up to `limit` changes after `since`, each document with all of its leaves.
    func changes(since: JSONValue, limit: Int, filter: ReplicationFilter) throws -> ChangeBatch

    /// The revisions of `revs` this peer lacks.
    func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)]

    /// The revisions with their history and attachment metadata, and with `bodies` the bodies
    /// the target asked for where this peer can send them along (`arrivedBodies`); the others
    /// stay where they are. A revision this peer cannot give is a failure of that document,
    /// not of the run.
    func revisions(_ wanted: [(id: String, rev: RevisionID)], bodies: BodyRequest?) throws
        -> [Result<ReplicatedRevision, DocumentFailure>]

    /// The bodies this peer, as a target, would take along with the revisions `missing` names
    /// (nil: it asks for them one by one, or not at all).
    func bodyRequest(for missing: [(id: String, missing: MissingRevisions)]) -> BodyRequest?

    /// Stores the body of one of its attachments in `blobs`, checked against the attachment's
    /// digest and length; returns it with the digest of the bytes as stored.
    func fetchBody(of attachment: Attachment, docID: String, rev: RevisionID, into blobs: BlobStore) throws
        -> (blob: StoredBlob, digest: String)

    /// Opens the body of one of its attachments for reading.
    func openBody(of attachment: Attachment, docID: String) throws -> BlobReader

    /// Saves revisions with their history (`new_edits=false`), taking the bodies it lacks from
    /// `source`. `missing` is what `revsDiff` answered. Returns the documents it refused.
    func write(_ revisions: [ReplicatedRevision], missing: [String: MissingRevisions], from source: ReplicationPeer,
               result: inout ReplicationResult) throws -> [DocumentFailure]

    /// A `_local` checkpoint document, or nil.
    func checkpoint(_ id: String) throws -> JSONObject?

    /// Saves a `_local` checkpoint document.
    func saveCheckpoint(_ id: String, _ body: JSONObject) throws
}

/// Bodies a target asks to receive with the revisions themselves (a local database whose
/// policy downloads every body): stored into `blobs`. `attsSince`: per document, the
/// revisions the target has, whose attachments need not travel (CouchDB's `atts_since`).
struct BodyRequest {
    let blobs: BlobStore
    let attsSince: [String: [RevisionID]]
}

/// Which documents a replication carries.
struct ReplicationFilter: Sendable {
    var docIDs: [String]?
    /// A CouchDB Mango selector.
    var selector: Selector?
    /// Sync Gateway channels (remote sources only).
    var channels: [String]?
    /// A design document's filter function, `DDOC/NAME`, and the query parameters it is given.
    var function: String?
    var queryParameters: [String: String] = [:]
}

/// One document in a changes feed: its leaves at `sequence`.
struct PeerChange {
    let sequence: JSONValue
    let docID: String
    let revs: [RevisionID]
}

/// A page of a changes feed.
struct ChangeBatch {
    var changes: [PeerChange]
    /// Where the next page starts (read past filtered-out changes too).
    var lastSequence: JSONValue
    /// No more changes after this page.
    var isLast: Bool
    /// Changes left after this page, when the peer tells (CouchDB's `pending`): for progress.
    var pending: Int?

    /// This batch as pages of at most `size` changes, in order: each ends at its last change's
    /// sequence, and only the last page ends where the batch does (so it alone may be `isLast`).
    func pages(of size: Int) -> [ChangeBatch] {
        guard changes.count > size else { return [self] }
        return stride(from: 0, to: changes.count, by: size).map { start in
            let end = min(start + size, changes.count)
            guard end < changes.count else {
                return ChangeBatch(changes: Array(changes[start...]), lastSequence: lastSequence, isLast: isLast, pending: pending)
            }
            return ChangeBatch(changes: Array(changes[start..<end]), lastSequence: changes[end - 1].sequence, isLast: false,
                               pending: pending.map { $0 + changes.count - end })
        }
    }
}

extension DocumentFailure {
    /// A revision a source answered with an error entry (`_bulk_get`'s `{"id", "rev", "error",
    /// "reason"}`, in JSON or as a multipart part); `id` and `rev` are what was asked, for what
    /// the entry leaves out (CouchDB says `"rev": "undefined"` for a document it lacks).
    static func notGiven(_ entry: JSONValue?, id: String? = nil, rev: String? = nil) -> DocumentFailure {
        DocumentFailure(docID: entry?["id"]?.stringValue ?? id ?? "?",
                        rev: entry?["rev"]?.stringValue.flatMap { $0 == "undefined" ? nil : $0 } ?? rev,
                        error: entry?["error"]?.stringValue ?? "error",
                        reason: entry?["reason"]?.stringValue ?? "the source did not give this revision")
    }
}
