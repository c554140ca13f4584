import DocumentModel
import Foundation

/// Saving: drafts on top of the current revision, replicated revisions as they come
/// (`new_edits=false`), deletions, and the history kept.
extension Database {
    /// A draft on top of `parent` holding what `content` holds (a revision value the caller
    /// kept, e.g. the one a mount showed when a file was opened): a conflicting branch can then
    /// be made from a revision whose body the database no longer keeps.
    public func newRevision(of id: String, from parent: RevisionID?, like content: Revision?) throws -> RevisionDraft {
        try DocumentID.validate(id)
        return RevisionDraft(docID: id, parent: parent, properties: content?.properties ?? JSONObject(),
                             attachments: content?.attachments ?? [], blobs: blobs)
    }

    /// A draft of the next revision of `id`: on top of its current revision, or of
    /// nothing for a new document. A deleted document is continued from its tombstone.
    public func newRevision(of id: String) throws -> RevisionDraft {
        try DocumentID.validate(id)
        guard let current = try currentRevision(of: id) else {
            return RevisionDraft(docID: id, parent: nil, properties: JSONObject(), attachments: [], blobs: blobs)
        }
        return RevisionDraft(docID: id, parent: current.revID, properties: current.deleted ? JSONObject() : current.properties,
                             attachments: current.deleted ? [] : current.attachments, blobs: blobs)
    }

    /// A draft of a brand-new document. Saving it when the id exists already is a
    /// conflict, or a new root branch with `allowConflict`.
    public func newDocument(_ id: String) throws -> RevisionDraft {
        try DocumentID.validate(id)
        return RevisionDraft(docID: id, parent: nil, properties: JSONObject(), attachments: [], blobs: blobs)
    }

    /// A draft on top of a specific revision (which may be stale; see `save(_:allowConflict:)`).
    public func newRevision(of id: String, from revID: RevisionID) throws -> RevisionDraft {
        draft(on: try revision(revID, of: id))
    }

    /// A draft that edits `revID` as CouchDB's interactive writes do (a PUT or `_bulk_docs` with
    /// `_rev`): a deleted revision cannot be edited, as CouchDB answers 409 (a deleted document
    /// is made again without a `_rev`, continuing from its tombstone).
    public func newRevision(of id: String, editing revID: RevisionID) throws -> RevisionDraft {
        let base = try revision(revID, of: id)
        guard !base.deleted else { throw SofaError.conflict(docID: id, revID: revID.description, current: revID.description) }
        return draft(on: base)
    }

    private func draft(on base: Revision) -> RevisionDraft {
        RevisionDraft(docID: base.docID, parent: base.revID, properties: base.properties, attachments: base.attachments, blobs: blobs)
    }

    /// Saves a draft as a new revision.
    ///
    /// If the draft's parent is no longer the current revision, this throws
    /// `SofaError.conflict` unless `allowConflict` is true, in which case the draft
    /// becomes a new branch (a conflict) and nothing is lost. Saving content
    /// identical to an existing child of the parent returns that revision.
    ///
    /// The design documents' `validate_doc_update` functions run before the write lock is
    /// taken, on a snapshot, so that saves of one database validate at once (as CouchDB runs
    /// them) and a slow validator holds no other save up; the save under the lock validates
    /// again only when what they were shown changed meanwhile (the document's current
    /// revision, the validators).
    @discardableResult
    public func save(_ draft: RevisionDraft, allowConflict: Bool = false) throws -> Revision {
        let validated = try prevalidate(draft, allowConflict: allowConflict)
        return try write { try save(draft, allowConflict: allowConflict, validated: validated, in: $0) }
    }

    /// Runs the validators on `draft` now, outside the write lock, for a save that passes what
    /// this returns to `Batch.save(_:allowConflict:validated:)`. Throws as that save would for
    /// a refusal or a conflict seen now.
    public func prevalidate(_ draft: RevisionDraft, allowConflict: Bool = false) throws -> Validated? {
        // A database last seen without validators costs its saves no read here (the save under
        // the lock validates whatever it finds then).
        guard validators.mayHaveAny else { return nil }
        return try read { try prevalidate(draft, allowConflict: allowConflict, in: $0) }
    }

    /// Whether any design document holds a `validate_doc_update` (one read, for a caller that
    /// would prevalidate many drafts).
    public func hasValidators() throws -> Bool {
        try read { try !validatorSignature(in: $0).isEmpty }
    }

    /// What a validation run before the write lock was shown; equal state under the lock
    /// means the same inputs, and the same answer.
    public struct Validated: Equatable, Sendable {
        let current: RevisionID?
        let deleted: Bool
        let validators: [String]
        let author: Author
    }

    /// Validates `draft` against `connection`'s snapshot; nil when there was nothing to run
    /// (no validators, a design or `_local` document).
    private func prevalidate(_ draft: RevisionDraft, allowConflict: Bool, in connection: SQLiteConnection) throws -> Validated? {
        let signature = try validatorSignature(in: connection)
        guard !signature.isEmpty, !draft.docID.hasPrefix("_design/"), !DocumentID.isLocal(draft.docID) else { return nil }
        let prepared = try prepare(draft, allowConflict: allowConflict, in: connection)
        try validate(prepared, draft: draft, in: connection)
        return Validated(current: prepared.row?.current, deleted: prepared.row?.deleted ?? false, validators: signature, author: Author.current)
    }

    /// Deletes a document by saving a tombstone on top of `revID` (or the current revision).
    @discardableResult
    public func deleteDocument(_ id: String, revID: RevisionID? = nil) throws -> Revision {
        try write { connection in
            guard let row = try Database.documentRow(id, in: connection), !row.deleted else { throw SofaError.documentNotFound(id) }
            var parent = row.current
            if let revID, revID != row.current {
                // A conflict's losing branch ends with a tombstone on its leaf, as CouchDB's
                // DELETE with that `rev` does; any other revision is out of date.
                let tree = try Database.loadTree(docKey: row.key, in: connection)
                guard tree.leaves.contains(where: { $0.id == revID && !$0.deleted }) else {
                    throw SofaError.conflict(docID: id, revID: revID.description, current: row.current.description)
                }
                parent = revID
            }
            var draft = RevisionDraft(docID: id, parent: parent, properties: JSONObject(), attachments: [], blobs: blobs)
            draft.deleted = true
            return try save(draft, allowConflict: parent != row.current, in: connection)
        }
    }

    /// A resolved conflict moved onto `branch`, the revision a server keeps as current, for a
    /// server that takes only revisions that follow its current one (Sync Gateway, `sofa serve`
    /// to Couchbase Lite): the current revision's content saved again as a child of `branch`,
    /// and the current revision's own branch ended with a tombstone, in one transaction, as
    /// Couchbase Lite's resolvers do. Nil when there is nothing to move: `branch` is not here,
    /// is still a live leaf (the conflict is not resolved), or the current revision already
    /// follows it.
    public func resolution(of id: String, onto branch: RevisionID) throws -> Revision? {
        try write { connection in
            guard let row = try Database.documentRow(id, in: connection), !row.deleted, row.current != branch else { return nil }
            let tree = try Database.loadTree(docKey: row.key, in: connection)
            guard tree.contains(branch), !tree.leaves.contains(where: { $0.id == branch && !$0.deleted }),
                  !tree.history(of: row.current).contains(branch),
                  let winner = try loadRevision(docKey: row.key, docID: id, revID: row.current, in: connection) else { return nil }
            let moved = RevisionDraft(docID: id, parent: branch, properties: winner.properties, attachments: winner.attachments, blobs: blobs)
            let resolution = try save(moved, allowConflict: true, in: connection)
            var ended = RevisionDraft(docID: id, parent: row.current, properties: JSONObject(), attachments: [], blobs: blobs)
            ended.deleted = true
            _ = try save(ended, allowConflict: true, in: connection)
            return resolution
        }
    }

    /// Inserts a revision with its history, as replication does (`new_edits=false`).
    /// Returns false when the revision was already here.
    @discardableResult
    public func insert(_ revision: ReplicatedRevision) throws -> Bool {
        try write { try insert(revision, in: $0) }
    }

    /// A draft made ready to save against `connection`'s state: its row and tree, its parent,
    /// its attachments (with their revpos) and properties, as the revision will have them.
    struct PreparedSave {
        let row: DocumentRow?
        let tree: RevisionTree
        let parent: RevisionID?
        let attachments: [Attachment]
        let properties: JSONObject
        let parentAttachments: [String: Attachment]
        let parentMD5s: [String: [UInt8]]
        let generation: Int
    }

    private func prepare(_ draft: RevisionDraft, allowConflict: Bool, in connection: SQLiteConnection) throws -> PreparedSave {
        try DocumentID.validate(draft.docID)
        guard !DocumentID.isLocal(draft.docID) else {
            throw SofaError.invalidDocumentID(draft.docID, reason: "_local documents are saved with putLocalDocument")
        }
        try Database.validateProperties(draft.properties)
        if !draft.deleted { try Database.checkViews(ofDesign: draft.docID, properties: draft.properties) }
        let row = try Database.documentRow(draft.docID, in: connection)
        let tree = try row.map { try Database.loadTree(docKey: $0.key, in: connection) } ?? RevisionTree([])

        var parent = draft.parent
        if let requested = draft.parent {
            guard let row else { throw SofaError.documentNotFound(draft.docID) }
            guard tree.contains(requested) else {
                throw SofaError.revisionNotFound(docID: draft.docID, revID: requested.description)
            }
            if requested != row.current && !allowConflict {
                throw SofaError.conflict(docID: draft.docID, revID: requested.description, current: row.current.description)
            }
        } else if let row {
            if row.deleted {
                parent = row.current  // re-creating a deleted document continues from its tombstone
            } else if !allowConflict {
                throw SofaError.conflict(docID: draft.docID, revID: nil, current: row.current.description)
            }
        }
        if draft.deleted && row == nil { throw SofaError.documentNotFound(draft.docID) }

        // The parent's attachments and the MD5s CouchDB keeps for them, in one read.
        let parentRows = try parent.flatMap { parent in
            try row.map { try loadAttachmentRows(docKey: $0.key, revID: parent, in: connection, blobs: nil) }
        } ?? []
        let parentAttachments = Dictionary(parentRows.map { ($0.attachment.name, $0.attachment) }, uniquingKeysWith: { $1 })
        let parentMD5s = Dictionary(parentRows.compactMap { row in row.couchMD5.map { (row.attachment.name, $0) } }, uniquingKeysWith: { $1 })
        var draftRows = draft.attachments
        if !draft.deleted {
            let parentProperties = try parentAttachments.keys.contains(where: Blobs.isStandInName)
                ? loadRevision(docKey: row!.key, docID: draft.docID, revID: parent!, in: connection)?.properties : nil
            draftRows = try StandInRows(docID: draft.docID, parentProperties: parentProperties, parentAttachments: parentAttachments,
                                        blobs: blobs).rows(for: draft.properties, draftRows: draftRows)
        }
        let generation = (parent?.generation ?? 0) + 1
        let ranks = Dictionary(draft.orderedAttachments.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { first, _ in first })
        let ordered = RevisionDraft.order(draftRows.values, by: ranks)
        let attachments: [Attachment] = draft.deleted ? [] : ordered.map { attachment in
            // Keep revpos when neither body nor type changed since the parent.
            let old = parentAttachments[attachment.name]
            let unchanged = old.map { $0.digest == attachment.digest && $0.contentType == attachment.contentType } ?? false
            return attachment.with(revpos: unchanged ? old!.revpos : generation)
        }
        let properties = draft.deleted ? JSONObject() : draft.properties
        return PreparedSave(row: row, tree: tree, parent: parent, attachments: attachments, properties: properties,
                            parentAttachments: parentAttachments, parentMD5s: parentMD5s, generation: generation)
    }

    /// Runs the validators on a prepared save.
    private func validate(_ prepared: PreparedSave, draft: RevisionDraft, in connection: SQLiteConnection) throws {
        let (row, tree, parent) = (prepared.row, prepared.tree, prepared.parent)
        try validate(docID: draft.docID, newDocument: {
            Database.validationJSON(docID: draft.docID, rev: parent, history: parent.map { [$0] } ?? [], deleted: draft.deleted,
                                    properties: prepared.properties, attachments: prepared.attachments)
        }, oldDocument: {
            guard let parent, let key = row?.key, let old = try loadRevision(docKey: key, docID: draft.docID, revID: parent, in: connection),
                  !old.deleted else { return nil }
            return Database.validationJSON(docID: draft.docID, rev: parent, history: tree.history(of: parent), deleted: false,
                                           properties: old.properties, attachments: old.attachments)
        }, author: Author.current, in: connection)
    }

    /// Saves `draft` under the write lock. `validated`: the validators already ran before the
    /// lock (see `save(_:allowConflict:)`); they run again if what they saw has changed.
    package func save(_ draft: RevisionDraft, allowConflict: Bool, validated: Validated? = nil, in connection: SQLiteConnection) throws -> Revision {
        let prepared = try prepare(draft, allowConflict: allowConflict, in: connection)
        let seen = validated.map { _ in
            Validated(current: prepared.row?.current, deleted: prepared.row?.deleted ?? false,
                      validators: (try? validatorSignature(in: connection)) ?? ["?"], author: Author.current)
        }
        if validated == nil || seen != validated { try validate(prepared, draft: draft, in: connection) }
        let (row, tree, parent, attachments, properties) = (prepared.row, prepared.tree, prepared.parent, prepared.attachments, prepared.properties)
        let (parentAttachments, parentMD5s, generation) = (prepared.parentAttachments, prepared.parentMD5s, prepared.generation)
        let couchMD5s = try couchMD5s(of: attachments, parentAttachments: parentAttachments, parentMD5s: parentMD5s,
                                     ahead: draft.couchMD5sAhead, in: connection)
        // A tombstone keeps no properties here, but CouchDB's id covers those it was sent with.
        let revID = RevisionID.derive(parent: parent, deleted: draft.deleted, properties: draft.properties, attachments: attachments.map {
            RevisionAttachmentIdentity(name: $0.name, contentType: $0.contentType, md5: couchMD5s[$0.name]!)
        })
        let docKey = try row?.key ?? Database.insertDocumentRow(draft.docID, revID: revID, in: connection)
        if tree.contains(revID) {
            // The same edit of the same parent was saved before.
            return try loadRevision(docKey: docKey, docID: draft.docID, revID: revID, in: connection)!
        }
        // The same seconds value is stored and returned, so a reloaded revision compares equal.
        let savedAt = Date(timeIntervalSince1970: Date().timeIntervalSince1970)
        try insertRevision(docKey: docKey, revID: revID, parent: parent, deleted: draft.deleted, properties: properties,
                           attachments: attachments, couchMD5s: couchMD5s, savedAt: savedAt, in: connection)
        try noteSavedHere(attachments.filter { $0.revpos == generation && $0.blobKey != nil }.map(\.digest), in: connection)
        let newNode = RevisionNode(id: revID, parent: parent, deleted: draft.deleted, isLeaf: true)
        let sequence = try finishChange(docKey: docKey, docID: draft.docID, tree: tree, added: [newNode], in: connection)
        // A body the draft had here is here still (a revision or a staged file holds it from
        // compaction): only the others are looked for (10,000 path walks under the write lock in
        // a fold of 10,000 files).
        return Revision(docID: draft.docID, revID: revID, parentRevID: parent, deleted: draft.deleted, properties: properties,
                        attachments: attachments.map { $0.contentAvailable ? $0 : $0.with(contentAvailable: $0.blobKey.map(blobs.contains) ?? false) },
                        sequence: sequence, savedAt: savedAt)
    }

    func insert(_ revision: ReplicatedRevision, in connection: SQLiteConnection) throws -> Bool {
        try DocumentID.validate(revision.docID)
        guard !DocumentID.isLocal(revision.docID) else {
            throw SofaError.invalidDocumentID(revision.docID, reason: "_local documents do not replicate")
        }
        try Database.validateProperties(revision.properties)
        if !revision.deleted { try Database.checkViews(ofDesign: revision.docID, properties: revision.properties) }
        for attachment in revision.attachments { try AttachmentName.validate(attachment.name) }
        var expected = revision.revID.generation
        for ancestor in revision.ancestors {
            expected -= 1
            guard ancestor.generation == expected, expected >= 1 else {
                throw SofaError.invalidDocument(reason: "the history of \(revision.revID) is not a chain of generations (\(ancestor))")
            }
        }
        let row = try Database.documentRow(revision.docID, in: connection)
        let tree = try row.map { try Database.loadTree(docKey: $0.key, in: connection) } ?? RevisionTree([])
        if tree.contains(revision.revID) { return false }
        try validate(docID: revision.docID, newDocument: {
            Database.validationJSON(docID: revision.docID, rev: revision.revID, history: [revision.revID] + revision.ancestors,
                                    deleted: revision.deleted, properties: revision.properties, attachments: revision.attachments)
        }, oldDocument: {
            // As CouchDB: the nearest ancestor this database has, when it has its body.
            guard let key = row?.key, let ancestor = revision.ancestors.first(where: tree.contains),
                  let old = try loadRevision(docKey: key, docID: revision.docID, revID: ancestor, in: connection), !old.deleted else { return nil }
            return Database.validationJSON(docID: revision.docID, rev: ancestor, history: tree.history(of: ancestor), deleted: false,
                                           properties: old.properties, attachments: old.attachments)
        }, author: Author.current, in: connection)
        let docKey = try row?.key ?? Database.insertDocumentRow(revision.docID, revID: revision.revID, in: connection)

        // Graft: the ancestors we lack become body-less history revisions.
        let known = revision.ancestors.firstIndex(where: tree.contains) ?? revision.ancestors.count
        var added: [RevisionNode] = []
        for index in stride(from: known - 1, through: 0, by: -1) {
            let id = revision.ancestors[index]
            let parent = index + 1 < revision.ancestors.count ? revision.ancestors[index + 1] : nil
            try connection.run("""
                INSERT INTO revs (doc_key, rev_id, parent_id, generation, deleted, leaf, body, sequence, saved_at)
                VALUES (?, ?, ?, ?, 0, 0, NULL, 0, ?)
                """, .integer(docKey), .text(id.description), SQLValue(parent?.description), SQLValue(id.generation),
                .real(Date().timeIntervalSince1970))
            added.append(RevisionNode(id: id, parent: parent, deleted: false, isLeaf: false))
        }
        let parent = revision.ancestors.first
        try insertRevision(docKey: docKey, revID: revision.revID, parent: parent, deleted: revision.deleted,
                           properties: revision.deleted ? JSONObject() : revision.properties,
                           attachments: revision.deleted ? revision.attachments : withStandIns(revision), in: connection)
        added.append(RevisionNode(id: revision.revID, parent: parent, deleted: revision.deleted, isLeaf: true))
        try finishChange(docKey: docKey, docID: revision.docID, tree: tree, added: added, in: connection)
        return true
    }

    /// `revision`'s attachments with a stand-in row for every blob of its properties that has
    /// none: Couchbase Lite pushes a revision whose blobs did not change without `_attachments`
    /// (its has-attachments flag is not set), and any replica may do the same. The properties
    /// decide what is a blob; the row names the blob's body when it is here, so that
    /// compaction, copies and reads all see the body as used.
    private func withStandIns(_ revision: ReplicatedRevision) -> [Attachment] {
        // Lenient: what a replica sent is kept as it came; a malformed blob is not a blob.
        guard let found = try? Blobs.find(in: revision.properties, docID: revision.docID, lenient: true), !found.isEmpty else {
            return revision.attachments
        }
        var attachments = revision.attachments
        var names = Set(attachments.map(\.name))
        for blob in found where !names.contains(blob.standInName) {
            let row: Attachment
            if let same = attachments.first(where: { $0.blobKey == blob.key || $0.digest == blob.key.digestString }) {
                row = same.with(name: blob.standInName)
            } else if let length = blobs.size(of: blob.key) {
                row = Attachment(name: blob.standInName, contentType: blob.contentType ?? MIMEType.fallback, length: length,
                                 digest: blob.key.digestString, blobKey: blob.key, revpos: revision.revID.generation,
                                 contentAvailable: true)
            } else {
                // Not here: a replicator that leaves it on its remote names it itself (only a
                // remote that serves bodies by digest can send it later; CouchDB cannot).
                continue
            }
            attachments.append(row)
            names.insert(row.name)
        }
        return attachments
    }

    /// Stores a revision and its attachment rows, in `attachments`' order.
    private func insertRevision(docKey: Int64, revID: RevisionID, parent: RevisionID?, deleted: Bool,
                                properties: JSONObject, attachments: [Attachment], couchMD5s: [String: [UInt8]] = [:],
                                savedAt: Date = Date(), in connection: SQLiteConnection) throws {
        let body = JSONValue.object(properties).jsonString()
        try connection.run("""
            INSERT INTO revs (doc_key, rev_id, parent_id, generation, deleted, leaf, body, sequence, saved_at)
            VALUES (?, ?, ?, ?, ?, 1, ?, 0, ?)
            """, .integer(docKey), .text(revID.description), SQLValue(parent?.description), SQLValue(revID.generation),
            SQLValue(deleted), .text(body), .real(savedAt.timeIntervalSince1970))
        for (position, attachment) in attachments.enumerated() {
            if schema.has(Schema.attachmentOrder) {
                try connection.run("""
                    INSERT INTO rev_attachments (doc_key, rev_id, name, content_type, length, digest, blob_key, revpos, position, couch_md5)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """, .integer(docKey), .text(revID.description), .text(attachment.name), .text(attachment.contentType),
                    .integer(attachment.length), .text(attachment.digest), SQLValue(attachment.blobKey?.hex),
                    SQLValue(attachment.revpos), SQLValue(position), couchMD5s[attachment.name].map(SQLValue.blob) ?? .null)
            } else {
                try connection.run("""
                    INSERT INTO rev_attachments (doc_key, rev_id, name, content_type, length, digest, blob_key, revpos)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """, .integer(docKey), .text(revID.description), .text(attachment.name), .text(attachment.contentType),
                    .integer(attachment.length), .text(attachment.digest), SQLValue(attachment.blobKey?.hex),
                    SQLValue(attachment.revpos))
            }
        }
    }

    /// The MD5 CouchDB keeps for each attachment's body, by name, for the revision id: the
    /// parent's where the body and its kind (compressed or not) did not change, one worked
    /// out before for the same body, one known for free (`md5-` digest of a type CouchDB does
    /// not compress, CouchDB's name of a gzip-encoded body), else from the body up to
    /// `CouchAttachmentMD5.exactLimit` (`ahead`: those worked out before the transaction, on
    /// the draft); for a body not here, its CouchDB digest (`md5-…`, the remote's own); else,
    /// with no way to know CouchDB's at a cost worth paying, the MD5 of its digest string.
    private func couchMD5s(of attachments: [Attachment], parentAttachments: [String: Attachment], parentMD5s: [String: [UInt8]],
                           ahead: [CouchAttachmentMD5.Body: [UInt8]], in connection: SQLiteConnection) throws -> [String: [UInt8]] {
        guard !attachments.isEmpty else { return [:] }
        var result: [String: [UInt8]] = [:]
        let worker = CouchAttachmentMD5.Worker()
        for attachment in attachments {
            let compressible = CouchAttachmentMD5.isCompressible(attachment.contentType)
            if let old = parentAttachments[attachment.name], old.digest == attachment.digest,
               CouchAttachmentMD5.isCompressible(old.contentType) == compressible, let md5 = parentMD5s[attachment.name] {
                result[attachment.name] = md5
            } else if !compressible, let key = attachment.blobKey, let md5 = ahead[CouchAttachmentMD5.Body(key: key, compressible: false)] {
                // The bytes' own MD5, worked out before the save: the same as any MD5 known of
                // them, with no query and no read under the write lock. (Of a compressed type,
                // an MD5 CouchDB gave for those bytes comes first: its gzip form may differ.)
                result[attachment.name] = md5
            } else if let key = attachment.blobKey, let known = try knownCouchMD5(of: key, compressible: compressible, in: connection) {
                result[attachment.name] = known
            } else if !compressible || attachment.blobKey == nil, let md5 = CouchAttachmentMD5.md5(ofDigest: attachment.digest) {
                // A body of a type CouchDB stores as it is, named by its MD5; or one not here, by the remote's.
                result[attachment.name] = md5
            } else if compressible, let key = attachment.blobKey, let encoded = try encodedBodyMD5(of: key, in: connection) {
                result[attachment.name] = encoded
            } else if CouchAttachmentMD5.isWorkedOutFromBody(attachment), let key = attachment.blobKey, blobs.contains(key) {
                result[attachment.name] = try ahead[CouchAttachmentMD5.Body(key: key, compressible: compressible)]
                    ?? worker.md5(of: key, contentType: attachment.contentType, in: blobs)
            } else {
                result[attachment.name] = CouchAttachmentMD5.md5(ofDigest: attachment.digest)
                    ?? MessageDigest.hash(.md5, Array(attachment.digest.utf8))
            }
        }
        return result
    }

    /// Works out, outside any transaction, the MD5s a save of `draft` would read its new bodies
    /// for inside its own (`CouchAttachmentMD5.isWorkedOutFromBody`), and hands them to the
    /// save on the draft, so a save of thousands of new bodies holds the write lock for its
    /// rows only: a mount's fold of 6,000 files spent half its transaction reading them, and a
    /// file closed meanwhile waited for it. A body that cannot be read is left to the save.
    /// Many bodies are shared among the cores: gzip for those of text types is most of the end
    /// of a copy of many text files (10,000 of 4 KiB: 2 s on one core).
    public func workOutCouchMD5s(of draft: inout RevisionDraft) {
        var wanted = Set<CouchAttachmentMD5.Body>()
        for attachment in draft.attachments.values where attachment.revpos == 0 && CouchAttachmentMD5.isWorkedOutFromBody(attachment) {
            let body = CouchAttachmentMD5.Body(key: attachment.blobKey!, compressible: CouchAttachmentMD5.isCompressible(attachment.contentType))
            if draft.couchMD5sAhead[body] == nil { wanted.insert(body) }
        }
        let work = Array(wanted)
        guard !work.isEmpty else { return }  // most single-file saves: no threads, no lock
        let shares = min(ProcessInfo.processInfo.activeProcessorCount, work.count / Tuning.couchMD5sPerShare + 1)
        let found = Locked<[CouchAttachmentMD5.Body: [UInt8]]>([:])
        DispatchQueue.concurrentPerform(iterations: shares) { [blobs, work] share in
            let worker = CouchAttachmentMD5.Worker()
            var mine: [CouchAttachmentMD5.Body: [UInt8]] = [:]
            for index in stride(from: share, to: work.count, by: shares) {
                // A body that is not here fails to open: no MD5 ahead, the save decides.
                mine[work[index]] = try? worker.md5(of: work[index], in: blobs)
            }
            found.withLock { $0.merge(mine) { first, _ in first } }
        }
        draft.couchMD5sAhead.merge(found.withLock { $0 }) { first, _ in first }
    }

    /// CouchDB's MD5 of the gzip form of body `key`, when it came gzip-encoded from CouchDB
    /// (`body_digests`).
    private func encodedBodyMD5(of key: BlobKey, in connection: SQLiteConnection) throws -> [UInt8]? {
        guard schema.has(Schema.bodyDigests) else { return nil }
        return try connection.query("SELECT digest FROM body_digests WHERE blob_key = ? AND digest LIKE 'md5-%' LIMIT 1", .text(key.hex)) {
            $0.text(0)
        }.first.flatMap(CouchAttachmentMD5.md5(ofDigest:))
    }

    /// An MD5 worked out before for the body `key` stored as CouchDB stores `compressible` types or not.
    private func knownCouchMD5(of key: BlobKey, compressible: Bool, in connection: SQLiteConnection) throws -> [UInt8]? {
        guard schema.has(Schema.attachmentOrder) else { return nil }
        return try connection.query("""
            SELECT content_type, couch_md5 FROM rev_attachments WHERE blob_key = ? AND couch_md5 IS NOT NULL LIMIT 8
            """, .text(key.hex)) { (type: $0.text(0), md5: $0.bytes(1)) }
            .first { CouchAttachmentMD5.isCompressible($0.type) == compressible }?.md5
    }

    /// After revisions were added: pick the winner, take a new sequence, prune old history.
    @discardableResult
    private func finishChange(docKey: Int64, docID: String, tree: RevisionTree, added: [RevisionNode], in connection: SQLiteConnection) throws -> Int64 {
        var nodes = tree.nodes
        for node in added {
            nodes[node.id] = node
            // A revision that gained a child is no longer a leaf, in memory and on disk.
            if let parent = node.parent, let old = nodes[parent], old.isLeaf {
                nodes[parent] = RevisionNode(id: old.id, parent: old.parent, deleted: old.deleted, isLeaf: false)
                try connection.run("UPDATE revs SET leaf = 0 WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(parent.description))
            }
        }
        let updated = RevisionTree(Array(nodes.values))
        let winner = updated.winner!
        let sequence = try Database.nextSequence(in: connection)
        try connection.run("UPDATE docs SET current_rev = ?, deleted = ?, sequence = ? WHERE doc_key = ?",
                           .text(winner.id.description), SQLValue(winner.deleted), .integer(sequence), .integer(docKey))
        try documentChanged(docKey: docKey, docID: docID, winner: (winner.id, winner.deleted), in: connection)
        for node in added {
            try connection.run("UPDATE revs SET sequence = ? WHERE doc_key = ? AND rev_id = ?",
                               .integer(sequence), .integer(docKey), .text(node.id.description))
        }
        let limit = try Database.revsLimit(in: connection)
        if updated.nodes.count > limit {
            for id in updated.revisionsBeyond(limit: limit) {
                try Database.deleteRevision(docKey: docKey, revID: id, in: connection)
            }
        }
        if added.contains(where: { $0.parent != nil }) { try pruneHistoryBodies(docKey: docKey, in: connection) }
        return sequence
    }

    /// Drops the bodies and attachment lists of a document's non-leaf revisions once they hold
    /// more than `Tuning.historyAttachmentRows` attachment rows, as CouchDB's compaction would:
    /// a document of many files then stores one list per leaf, not one per revision it ever
    /// had (2,000 files added one by one used to leave ~2 million rows). Revision ids stay
    /// (within the revs limit) for replication; leaves, and so conflicts, are never touched.
    /// A small document keeps its history's bodies until `compact()`, as before.
    private func pruneHistoryBodies(docKey: Int64, in connection: SQLiteConnection) throws {
        let historyRows = try connection.query("""
            SELECT COUNT(*) FROM rev_attachments a JOIN revs r ON r.doc_key = a.doc_key AND r.rev_id = a.rev_id
            WHERE a.doc_key = ? AND r.leaf = 0
            """, .integer(docKey)) { $0.int(0) }[0]
        guard historyRows > Tuning.historyAttachmentRows else { return }
        try connection.run("""
            DELETE FROM rev_attachments WHERE doc_key = ? AND rev_id IN (SELECT rev_id FROM revs WHERE doc_key = ? AND leaf = 0)
            """, .integer(docKey), .integer(docKey))
        try connection.run("UPDATE revs SET body = NULL WHERE doc_key = ? AND leaf = 0 AND body IS NOT NULL", .integer(docKey))
    }
}
