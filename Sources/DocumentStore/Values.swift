import DocumentModel
import Foundation

/// An attachment of a revision: metadata always, body when `contentAvailable`.
public struct Attachment: Hashable, Sendable {
    public let name: String
    public let contentType: String
    /// The body's length in bytes, known even when the body is not here.
    public let length: Int64
    /// The digest that identifies the body in replication: `sha1-…` for bodies
    /// made here, or the remote's (`md5-…` from CouchDB) for bodies not yet fetched.
    public let digest: String
    /// The local blob's key (SHA-1 of the bytes); nil while only a remote digest is known.
    public let blobKey: BlobKey?
    /// The generation of the revision that last changed this attachment.
    public let revpos: Int
    /// Whether the body is on this machine.
    public let contentAvailable: Bool

    public init(name: String, contentType: String, length: Int64, digest: String, blobKey: BlobKey?,
                revpos: Int, contentAvailable: Bool = false) {
        self.name = name
        self.contentType = contentType
        self.length = length
        self.digest = digest
        self.blobKey = blobKey
        self.revpos = revpos
        self.contentAvailable = contentAvailable
    }

    /// A copy with some fields changed.
    public func with(name: String? = nil, contentType: String? = nil, revpos: Int? = nil, contentAvailable: Bool? = nil) -> Attachment {
        Attachment(name: name ?? self.name, contentType: contentType ?? self.contentType, length: length, digest: digest,
                   blobKey: blobKey, revpos: revpos ?? self.revpos, contentAvailable: contentAvailable ?? self.contentAvailable)
    }

    /// Metadata for a body stored in the blob store.
    public init(name: String, contentType: String, blob: StoredBlob, revpos: Int) {
        self.init(name: name, contentType: contentType, length: blob.length, digest: blob.key.digestString,
                  blobKey: blob.key, revpos: revpos, contentAvailable: true)
    }
}

/// One revision of a document.
public struct Revision: Hashable, Sendable {
    public let docID: String
    public let revID: RevisionID
    public let parentRevID: RevisionID?
    public let deleted: Bool
    /// The body without underscore keys, in stored order.
    public let properties: JSONObject
    /// Sorted by name.
    public let attachments: [Attachment]
    /// The database sequence at which this revision was saved.
    public let sequence: Int64
    public let savedAt: Date

    public func attachment(named name: String) -> Attachment? {
        attachments.first { $0.name == name }
    }

    public var attachmentNames: [String] { attachments.map(\.name) }
}

/// A document's entry in the changes feed: each document once, at its latest change.
public struct Change: Hashable, Sendable {
    public let docID: String
    /// The winning revision after the change.
    public let revID: RevisionID
    public let deleted: Bool
    public let sequence: Int64
}

/// A line of a document listing.
public struct DocumentSummary: Hashable, Sendable {
    public let docID: String
    public let revID: RevisionID
    public let deleted: Bool
    public let sequence: Int64
    public let attachmentCount: Int
    /// When the current revision was saved.
    public let modified: Date
    /// Live leaves besides the current revision (CouchDB's `_conflicts`); counted only when asked.
    public var conflictCount = 0
}

/// A live document as a listing in storage order sees it (`Database.documentsInStorageOrder`).
public struct StoredDocument: Hashable, Sendable {
    /// Its row's key: documents stored later have higher keys, and a key stays with its document.
    public let key: Int64
    public let docID: String
    /// When the current revision was saved.
    public let modified: Date
    /// Live leaves besides the current revision (CouchDB's `_conflicts`); counted only when asked.
    public var conflictCount = 0
}

/// What `sofa info` shows.
public struct DatabaseInfo: Hashable, Sendable {
    public let path: String
    public let documentCount: Int
    public let deletedCount: Int
    public let lastSequence: Int64
    public let publicUUID: String
    public let privateUUID: String
    public let revsLimit: Int
    /// Size of db.sqlite3 and its WAL.
    public let databaseBytes: Int64
    public let blobCount: Int
    public let blobBytes: Int64
    /// Attachments of current revisions whose bodies are not on this machine.
    public let missingBodyCount: Int
}

/// What a compaction freed.
public struct CompactionReport: Hashable, Sendable {
    public var revisionsPruned = 0
    public var bodiesDropped = 0
    public var blobsDeleted = 0
    public var blobBytesFreed: Int64 = 0
    /// Unreferenced blobs kept because they were written within `Tuning.blobGracePeriod`.
    public var recentBlobsKept = 0
    /// Whether another process had the database open, so recent unreferenced blobs had to
    /// be kept (it may have written one for a save it has not committed yet).
    public var sharedWithOtherProcesses = false
    public var temporaryBytesFreed: Int64 = 0
    public var databaseBytesBefore: Int64 = 0
    public var databaseBytesAfter: Int64 = 0

    public var bytesFreed: Int64 {
        blobBytesFreed + temporaryBytesFreed + max(0, databaseBytesBefore - databaseBytesAfter)
    }
}

/// A revision received from another replica with its history, for `Database.insert(_:)`
/// (CouchDB's `_bulk_docs` with `new_edits=false`).
public struct ReplicatedRevision: Sendable {
    public let docID: String
    public let revID: RevisionID
    /// The ancestors, parent first. May stop short of the root.
    public let ancestors: [RevisionID]
    public let deleted: Bool
    public let properties: JSONObject
    public let attachments: [Attachment]

    public init(docID: String, revID: RevisionID, ancestors: [RevisionID], deleted: Bool = false,
                properties: JSONObject, attachments: [Attachment] = []) {
        self.docID = docID
        self.revID = revID
        self.ancestors = ancestors
        self.deleted = deleted
        self.properties = properties
        self.attachments = attachments
    }
}

/// A new revision being prepared: start from `Database.newRevision(of:)`, change
/// properties and attachments, then `Database.save(_:)`.
///
/// ```swift
/// var draft = try db.newRevision(of: "notes")
/// draft.properties["title"] = "Hello"
/// try draft.setAttachment("photo.png", contentsOf: "/tmp/photo.png")
/// let saved = try db.save(draft)
/// ```
/// Setting an attachment streams its body into the blob store at once; the
/// revision refers to it only when saved.
public struct RevisionDraft: Sendable {
    public let docID: String
    /// The revision this one follows; nil for a new document.
    public let parent: RevisionID?
    public var properties: JSONObject
    public var deleted = false
    public private(set) var attachments: [String: Attachment]
    let blobs: BlobStore

    init(docID: String, parent: RevisionID?, properties: JSONObject, attachments: [Attachment], blobs: BlobStore) {
        self.docID = docID
        self.parent = parent
        self.properties = properties
        self.attachments = Dictionary(attachments.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
        self.blobs = blobs
    }

    /// Whether saving this draft would repeat `revision`: the same deletion, properties and
    /// attachments (by name, type and body; a body known here by its bytes, else by digest).
    /// Rewriting a file with the bytes it has, or reading a folder twice, then saves nothing.
    public func repeats(_ revision: Revision) -> Bool {
        func identities(_ attachments: some Sequence<Attachment>) -> Set<[String]> {
            Set(attachments.map { [$0.name, $0.contentType, $0.blobKey?.hex ?? $0.digest] })
        }
        return deleted == revision.deleted && properties == revision.properties
            && identities(attachments.values) == identities(revision.attachments)
    }

    /// Sets an attachment to a body already in the blob store.
    public mutating func setAttachment(_ name: String, blob: StoredBlob, contentType: String? = nil) throws {
        try AttachmentName.validate(name)
        let type = contentType ?? attachments[name]?.contentType ?? MIMEType.forFileName(name)
        // revpos 0 marks a changed attachment; the save gives it the new generation.
        attachments[name] = Attachment(name: name, contentType: type, blob: blob, revpos: 0)
    }

    public mutating func setAttachment(_ name: String, data: some ContiguousBytes, contentType: String? = nil) throws {
        try AttachmentName.validate(name)
        try setAttachment(name, blob: blobs.write(data), contentType: contentType)
    }

    /// Streams the file (or pipe) at `path` into the attachment.
    public mutating func setAttachment(_ name: String, contentsOf path: String, contentType: String? = nil) throws {
        try AttachmentName.validate(name)
        try setAttachment(name, blob: blobs.write(contentsOf: path), contentType: contentType)
    }

    /// Sets an attachment's metadata directly (e.g. a body known only by its remote digest).
    public mutating func setAttachment(_ attachment: Attachment) throws {
        try AttachmentName.validate(attachment.name)
        attachments[attachment.name] = attachment
    }

    /// Changes an attachment's content type, keeping its body.
    public mutating func setContentType(_ contentType: String, ofAttachment name: String) throws {
        guard let existing = attachments[name] else { throw SofaError.attachmentNotFound(docID: docID, name: name) }
        attachments[name] = existing.with(contentType: contentType, revpos: 0)
    }

    public mutating func removeAttachment(_ name: String) throws {
        guard attachments.removeValue(forKey: name) != nil else {
            throw SofaError.attachmentNotFound(docID: docID, name: name)
        }
    }

    /// Renames an attachment without touching its body.
    public mutating func renameAttachment(_ name: String, to newName: String) throws {
        try AttachmentName.validate(newName)
        guard let existing = attachments.removeValue(forKey: name) else {
            throw SofaError.attachmentNotFound(docID: docID, name: name)
        }
        attachments[newName] = existing.with(name: newName, revpos: 0)
    }
}
