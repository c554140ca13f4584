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

    /// The attachments' names in name order (`attachments` keeps the revision's own order,
    /// CouchDB's).
    public var attachmentNames: [String] { attachments.map(\.name).sorted() }
}

/// A document's entry in the changes feed: each document once, at its latest change.
public struct Change: Hashable, Sendable {
    public let docID: String
    /// The winning revision after the change.
    public let revID: RevisionID
    public let deleted: Bool
    public let sequence: Int64

    public init(docID: String, revID: RevisionID, deleted: Bool, sequence: Int64) {
        self.docID = docID
        self.revID = revID
        self.deleted = deleted
        self.sequence = sequence
    }
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
    /// Its row's key: documents stored later have higher keys, a key stays with its document,
    /// and is never given to another (not even after a purge).
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
    /// Bodies that came with the revision (a `_bulk_get` with `attachments=true`), by
    /// attachment name: in the blob store already, checked against their digests.
    public var arrivedBodies: [String: ArrivedBody] = [:]

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

/// An attachment body received with a revision: the blob, the digest of its bytes as stored
/// (`IncomingBody.finish`), and when the request that brought it began (a revision that
/// cannot be saved removes the bodies it brought, if nothing else took them since). It is
/// not synced yet: whoever saves the revision syncs it first (`BlobStore.sync`), all of a
/// batch together, on a thread that does not hold up the next batch's download.
public struct ArrivedBody: Sendable {
    public let blob: StoredBlob
    public let digest: String
    public let since: Date

    public init(blob: StoredBlob, digest: String, since: Date) {
        self.blob = blob
        self.digest = digest
        self.since = since
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
    /// The attachments' order, CouchDB's: as the parent had them, and one set since first
    /// (CouchDB's `PUT /db/doc/name` puts the attachment first), unless `orderAttachments`
    /// gave the order. Lower ranks first; the rank of a name no longer there is left (unused).
    private var ranks: [String: Int] = [:]
    private var nextFirst = -1
    /// New bodies' MD5s for the revision id, worked out before the save
    /// (`Database.workOutCouchMD5s(of:)`) so it need not read them under the write lock.
    var couchMD5sAhead: [CouchAttachmentMD5.Body: [UInt8]] = [:]
    let blobs: BlobStore

    init(docID: String, parent: RevisionID?, properties: JSONObject, attachments: [Attachment], blobs: BlobStore) {
        self.docID = docID
        self.parent = parent
        self.properties = properties
        self.attachments = Dictionary(attachments.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
        for (rank, attachment) in attachments.enumerated() where ranks[attachment.name] == nil { ranks[attachment.name] = rank }
        self.blobs = blobs
    }

    /// The attachments in the revision's order.
    public var orderedAttachments: [Attachment] {
        RevisionDraft.order(attachments.values, by: ranks)
    }

    /// `attachments` by their rank in `ranks`, then the unranked ones by name. Each rank is
    /// looked up once: in the comparison, two lookups per step made a fourteenth of a fold of
    /// 10,000 files.
    static func order(_ attachments: some Sequence<Attachment>, by ranks: [String: Int]) -> [Attachment] {
        attachments.map { (rank: ranks[$0.name] ?? Int.max, attachment: $0) }
            .sorted { $0.rank != $1.rank ? $0.rank < $1.rank : $0.attachment.name < $1.attachment.name }
            .map(\.attachment)
    }

    /// Puts the attachments named in `names` first, in that order (a document's
    /// `_attachments` as it was sent); the others follow in their order.
    public mutating func orderAttachments(_ names: [String]) {
        let given = Set(names)
        let others = orderedAttachments.map(\.name).filter { !given.contains($0) }
        ranks = [:]
        for (rank, name) in (names + others).enumerated() where attachments[name] != nil && ranks[name] == nil { ranks[name] = rank }
        nextFirst = -1
    }

    /// Sets an attachment and puts it first.
    private mutating func place(_ attachment: Attachment) {
        attachments[attachment.name] = attachment
        ranks[attachment.name] = nextFirst
        nextFirst -= 1
    }

    /// Whether saving this draft would repeat `revision`: the same deletion, properties and
    /// attachments (by name, type and body; a body known here by its bytes, else by digest).
    /// Rewriting a file with the bytes it has, or reading a folder twice, then saves nothing.
    public func repeats(_ revision: Revision) -> Bool {
        func identities(_ attachments: some Sequence<Attachment>) -> Set<[String]> {
            Set(attachments.map { [$0.name, $0.contentType, $0.blobKey?.hex ?? $0.digest] })
        }
        // Names are unique on both sides, so lists of different lengths differ: a fold of new
        // files into a document of 10,000 need not build two sets of 10,000 to tell.
        return deleted == revision.deleted && attachments.count == revision.attachments.count
            && properties == revision.properties && identities(attachments.values) == identities(revision.attachments)
    }

    /// Sets an attachment to a body already in the blob store.
    public mutating func setAttachment(_ name: String, blob: StoredBlob, contentType: String? = nil) throws {
        try AttachmentName.validate(name)
        let blobType = Blobs.pointer(ofStandIn: name).flatMap { Blobs.blob(at: $0, in: properties, docID: docID)?.contentType }
        let type = contentType ?? attachments[name]?.contentType ?? blobType ?? MIMEType.forFileName(name)
        // revpos 0 marks a changed attachment; the save gives it the new generation.
        let attachment = Attachment(name: name, contentType: type, blob: blob, revpos: 0)
        try updateBlobProperty(for: attachment)
        place(attachment)
        if let md5 = blob.md5 { useBodyMD5(md5, of: blob.key) }
    }

    /// CouchDB's MD5 of body `key`, worked out before the save, which then takes it for the
    /// revision id instead of reading the body: the MD5 of its bytes (`StoredBlob.md5`, for a
    /// type CouchDB does not compress), or with `compressed` of its gzip form, as CouchDB
    /// stores the types it compresses (`CouchMD5sInBackground`).
    public mutating func useBodyMD5(_ md5: [UInt8], of key: BlobKey, compressed: Bool = false) {
        couchMD5sAhead[CouchAttachmentMD5.Body(key: key, compressible: compressed)] = md5
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
        try updateBlobProperty(for: attachment)
        place(attachment)
    }

    /// Changes an attachment's content type, keeping its body.
    public mutating func setContentType(_ contentType: String, ofAttachment name: String) throws {
        guard let existing = attachments[name] else { throw SofaError.attachmentNotFound(docID: docID, name: name) }
        let changed = existing.with(contentType: contentType, revpos: 0)
        if let pointer = Blobs.pointer(ofStandIn: name), case .object(var blob)? = JSONPointer.value(at: pointer, in: properties),
           Blobs.isBlob(.object(blob)) {
            blob["content_type"] = .string(contentType)
            properties = try JSONPointer.setting(.object(blob), at: pointer, in: properties)
        }
        attachments[name] = changed
    }

    public mutating func removeAttachment(_ name: String) throws {
        guard attachments.removeValue(forKey: name) != nil else {
            throw SofaError.attachmentNotFound(docID: docID, name: name)
        }
        _ = removeBlobProperty(standingIn: name)
    }

    /// Renames an attachment without touching its body. Renaming to or from a stand-in name
    /// (`blob_/…`) moves, makes or removes the blob property too.
    public mutating func renameAttachment(_ name: String, to newName: String) throws {
        try AttachmentName.validate(newName)
        guard let existing = attachments[name] else {
            throw SofaError.attachmentNotFound(docID: docID, name: name)
        }
        let renamed = existing.with(name: newName, revpos: 0)
        var moved = self
        moved.attachments[name] = nil
        let blob = moved.removeBlobProperty(standingIn: name)
        if let pointer = Blobs.pointer(ofStandIn: newName), let blob, existing.blobKey == nil {
            moved.properties = try JSONPointer.setting(.object(blob), at: pointer, in: moved.properties)
        } else {
            try moved.updateBlobProperty(for: renamed, keeping: blob)
        }
        moved.place(renamed)
        self = moved
    }

    // MARK: Blobs

    /// Sets the blob property at `pointer` (`/avatar`, `/photos/0`) to a body in the blob
    /// store: the property and its stand-in attachment.
    public mutating func setBlob(at pointer: String, blob: StoredBlob, contentType: String? = nil) throws {
        let name = Blobs.standInName(pointer)
        let type = contentType ?? Blobs.blob(at: pointer, in: properties, docID: docID)?.contentType
            ?? attachments[name]?.contentType ?? MIMEType.forFileName(pointer)
        try setAttachment(name, blob: blob, contentType: type)
    }

    /// Removes the blob property at `pointer` and its stand-in.
    public mutating func removeBlob(at pointer: String) throws {
        guard let value = JSONPointer.value(at: pointer, in: properties), Blobs.isBlob(value) else {
            throw SofaError.invalidArgument("document \"\(docID)\" has no blob at \(pointer)")
        }
        properties = JSONPointer.removing(pointer, from: properties)
        attachments[Blobs.standInName(pointer)] = nil
    }

    /// When `attachment` is the stand-in of a blob property (its name is `blob_/POINTER`) and
    /// its body is known here, the property at POINTER becomes (or stays) the blob dictionary of
    /// that body: the attachment is authoritative, as Couchbase Lite treats it.
    private mutating func updateBlobProperty(for attachment: Attachment, keeping old: JSONObject? = nil) throws {
        guard let pointer = Blobs.pointer(ofStandIn: attachment.name), let key = attachment.blobKey else { return }
        guard JSONPointer.segments(pointer).map({ !$0.isEmpty }) == true else {
            throw SofaError.invalidAttachmentName(attachment.name, reason: "\(pointer) is not a JSON pointer (RFC 6901: ~0 for ~, ~1 for /)")
        }
        var existing = old
        if existing == nil, case .object(let object)? = JSONPointer.value(at: pointer, in: properties) {
            guard Blobs.isBlob(.object(object)) else {
                throw SofaError.invalidBlob(docID: docID, pointer: pointer, reason: "a property that is not a blob is there")
            }
            existing = object
        } else if existing == nil, let value = JSONPointer.value(at: pointer, in: properties) {
            throw SofaError.invalidBlob(docID: docID, pointer: pointer, reason: "\(value.kindName) that is not a blob is there")
        }
        let dictionary = Blobs.dictionary(key: key, length: attachment.length, contentType: attachment.contentType, keeping: existing)
        properties = try JSONPointer.setting(.object(dictionary), at: pointer, in: properties)
    }

    /// Takes out the blob property `name` stands in for, if there is one, and returns it.
    private mutating func removeBlobProperty(standingIn name: String) -> JSONObject? {
        guard let pointer = Blobs.pointer(ofStandIn: name), case .object(let blob)? = JSONPointer.value(at: pointer, in: properties),
              Blobs.isBlob(.object(blob)) else { return nil }
        properties = JSONPointer.removing(pointer, from: properties)
        return blob
    }
}
