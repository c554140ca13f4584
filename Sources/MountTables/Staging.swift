import DocumentModel
import DocumentStore
import Foundation

/// An attachment body a mount saved into a document that is not part of a revision yet.
///
/// A program writing many files into one document (`cp -r`, `tar x`, `rsync`, `git checkout`)
/// would otherwise make one revision per file, each repeating the document's whole attachment
/// list. Instead, while a document is busy, each closed file is *staged*: its body is already
/// in the blob store and one small row records it, so the file is safe against a killed mount
/// at once and costs the same whatever the folder holds. The mount then folds every staged
/// file of the document into one revision (`Database.save(_:unstaging:log:)`), and
/// the rows go in the same transaction, so a file is in a revision or staged, never both or
/// neither.
///
/// ```swift
/// let staged = try db.stage(StagedAttachment.Draft(docID: "photos", attachment: attachment,
///                                                   expectedDigest: nil, base: rev))
/// var draft = try db.newRevision(of: "photos")
/// try draft.setAttachment(staged.attachment)
/// try db.save([(draft, allowConflict: false)], unstaging: [staged])
/// ```
public struct StagedAttachment: Hashable, Sendable {
    /// The row's number (in the log: the record's): later stagings of the same name have higher ones.
    public let seq: Int64
    /// The mount process that staged it; one that is no longer running left it to be folded.
    public let pid: pid_t
    /// The staging log holding it (`StagingLog.name`); nil: a row of `staged_attachments`.
    public let log: String?
    public let docID: String
    /// The attachment as it will be saved (its revpos is given by the save).
    public let attachment: Attachment
    /// The digest the name had in the document the writer started from (nil: it was absent).
    /// A revision in which the name has another digest has changed it meanwhile.
    public let expectedDigest: String?
    /// The revision the writer started from.
    public let base: RevisionID?

    public var name: String { attachment.name }

    public init(seq: Int64, pid: pid_t, log: String? = nil, docID: String, attachment: Attachment, expectedDigest: String?,
                base: RevisionID?) {
        (self.seq, self.pid, self.log, self.docID, self.attachment) = (seq, pid, log, docID, attachment)
        (self.expectedDigest, self.base) = (expectedDigest, base)
    }

    /// What `Database.stage(_:)` records.
    public struct Draft: Sendable {
        public let docID: String
        public let attachment: Attachment
        public let expectedDigest: String?
        public let base: RevisionID?
        /// Times and mode given to the attachment (see `LocalAttributes`), written with the row.
        public let given: LocalAttributes

        public init(docID: String, attachment: Attachment, expectedDigest: String?, base: RevisionID?,
                    given: LocalAttributes = LocalAttributes()) {
            (self.docID, self.attachment, self.expectedDigest, self.base, self.given) = (docID, attachment, expectedDigest, base, given)
        }
    }
}

extension Database {
    /// Records a staged attachment (and its modification time, if given) in one transaction.
    /// The body must already be in the blob store.
    public func stage(_ draft: StagedAttachment.Draft) throws -> StagedAttachment {
        guard schema.has(Schema.stagedAttachments) else { throw SofaError.readOnlyFileSystem(path: databaseFilePath) }
        try DocumentID.validate(draft.docID)
        try AttachmentName.validate(draft.attachment.name)
        guard let key = draft.attachment.blobKey else {
            throw SofaError.invalidArgument("a staged attachment needs a body in the blob store (\(draft.attachment.name))")
        }
        let pid = getpid()
        let seq = try write { connection -> Int64 in
            let seq = try Database.insertStaged(draft.attachment, key: key, docID: draft.docID, expectedDigest: draft.expectedDigest,
                                                base: draft.base, pid: pid, in: connection)
            if draft.given != LocalAttributes(), schema.has(Schema.localAttributes) {
                var attributes = try Database.localAttributes(draft.docID, draft.attachment.name, in: connection) ?? LocalAttributes()
                attributes.take(draft.given, forBody: draft.attachment.digest)
                try Database.store(attributes, docID: draft.docID, name: draft.attachment.name, in: connection)
            }
            return seq
        }
        return StagedAttachment(seq: seq, pid: pid, docID: draft.docID, attachment: draft.attachment.with(revpos: 0),
                                expectedDigest: draft.expectedDigest, base: draft.base)
    }

    /// Stages a staged attachment under another name of its document (rsync's temporary file
    /// renamed to its own name), in one transaction: the old row goes, and its local attributes
    /// go along, replacing those of the name it takes.
    public func restage(_ staged: StagedAttachment, as name: String, expectedDigest: String?) throws -> StagedAttachment {
        guard schema.has(Schema.stagedAttachments), let key = staged.attachment.blobKey else { throw SofaError.readOnlyFileSystem(path: databaseFilePath) }
        try AttachmentName.validate(name)
        let pid = getpid()
        let seq = try write { connection -> Int64 in
            let seq = try Database.insertStaged(staged.attachment.with(name: name), key: key, docID: staged.docID,
                                                expectedDigest: expectedDigest, base: staged.base, pid: pid, in: connection)
            try connection.run("DELETE FROM staged_attachments WHERE seq = ?", .integer(staged.seq))
            // Folded meanwhile: the file is in a revision now, and the rename is the revision's to make.
            guard connection.changes == 1 else {
                throw SofaError.conflict(docID: staged.docID, revID: staged.base?.description, current: "(folded)")
            }
            if schema.has(Schema.localAttributes) {
                let moved = try Database.localAttributes(staged.docID, staged.name, in: connection)
                try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name IN (?, ?)",
                                   .text(staged.docID), .text(staged.name), .text(name))
                if let moved { try Database.store(moved, docID: staged.docID, name: name, in: connection) }
            }
            return seq
        }
        return StagedAttachment(seq: seq, pid: pid, docID: staged.docID, attachment: staged.attachment.with(name: name, revpos: 0),
                                expectedDigest: expectedDigest, base: staged.base)
    }

    /// Inserts a staged row and drops the older ones of the same name this process staged (a
    /// file saved again before its fold replaces what it staged before); returns its seq.
    static func insertStaged(_ attachment: Attachment, key: BlobKey, docID: String, expectedDigest: String?, base: RevisionID?,
                             pid: pid_t, in connection: SQLiteConnection) throws -> Int64 {
        try connection.run("""
            INSERT INTO staged_attachments (pid, doc_id, name, content_type, length, blob_key, expected_digest, base_rev)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?)
            """, .integer(Int64(pid)), .text(docID), .text(attachment.name), .text(attachment.contentType),
            .integer(attachment.length), .text(key.hex), SQLValue(expectedDigest), SQLValue(base?.description))
        let seq = connection.lastInsertedRowID
        try connection.run("DELETE FROM staged_attachments WHERE doc_id = ? AND name = ? AND pid = ? AND seq < ?",
                           .text(docID), .text(attachment.name), .integer(Int64(pid)), .integer(seq))
        return seq
    }

    /// Every staged attachment, oldest first: the rows, then what each mount's staging log holds
    /// unfolded (`StagingLog`; read apart from the rows, so a fold under way can show a file in
    /// neither for a moment, never one in both). A mount's start takes in those of mounts that
    /// stopped, `includingLogs: false` once it has made their logs rows.
    public func stagedAttachments(includingLogs: Bool = true) throws -> [StagedAttachment] {
        guard schema.has(Schema.stagedAttachments) else { return [] }
        var logged: [StagedAttachment] = []
        if includingLogs, schema.has(Schema.stagingLogFolds) {
            for (log, segments) in try StagingLog.logs(in: stagingLogDirectory) {
                let folded = try read { try StagingLog.folds(of: log, in: $0) }
                logged += try StagingLog.unfolded(log: log, segments: segments, folded: folded).map(\.staged)
            }
        }
        return try logged + read { connection in
            try connection.query("""
                SELECT seq, pid, doc_id, name, content_type, length, blob_key, expected_digest, base_rev
                FROM staged_attachments ORDER BY seq
                """) { row in
                guard let key = BlobKey(hex: row.text(6)) else {
                    throw SofaError.sqlite(code: 0, message: "corrupt blob key in staged_attachments: \(row.text(6))", sql: nil)
                }
                let attachment = Attachment(name: row.text(3), contentType: row.text(4), length: row.int64(5), digest: key.digestString,
                                            blobKey: key, revpos: 0, contentAvailable: blobs.contains(key))
                return StagedAttachment(seq: row.int64(0), pid: pid_t(row.int(1)), docID: row.text(2), attachment: attachment,
                                        expectedDigest: row.optionalText(7), base: try row.optionalText(8).map(Database.revisionID))
            }
        }
    }

    /// Saves drafts (a revision on top of the current one, conflicting branches) and forgets
    /// the staged files `unstaged` (rows, and records of `log`), all in one transaction: all or
    /// nothing. `whileSaving` is given the revisions before the transaction commits (under the
    /// write lock: it must take no lock but a leaf one), so what the caller notes of them is
    /// there when another thread sees them.
    @discardableResult
    public func save(_ drafts: [(RevisionDraft, allowConflict: Bool)], unstaging unstaged: [StagedAttachment],
                     log: StagingLog? = nil, whileSaving: ([Revision]) -> Void = { _ in }) throws -> [Revision] {
        let logged = unstaged.filter { $0.log != nil }
        let rows = unstaged.filter { $0.log == nil }
        func transaction(_ connection: SQLiteConnection) throws -> [Revision] {
            let saved = try save(drafts, unstagingRows: rows, in: connection)
            whileSaving(saved)
            return saved
        }
        guard !logged.isEmpty else { return try write(transaction) }
        guard let log else { throw SofaError.invalidArgument("staged files of a log were saved without it") }
        return try log.fold(logged, transaction)
    }

    /// The body of `save(_:unstaging:log:)`'s transaction: the drafts, and the rows `rows` gone.
    private func save(_ drafts: [(RevisionDraft, allowConflict: Bool)], unstagingRows rows: [StagedAttachment],
                      in connection: SQLiteConnection) throws -> [Revision] {
        let revisions = try drafts.map { try save($0.0, allowConflict: $0.allowConflict, in: connection) }
        guard schema.has(Schema.stagedAttachments) else { return revisions }
        for seq in rows.map(\.seq) {
            try connection.run("DELETE FROM staged_attachments WHERE seq = ?", .integer(seq))
            // Restaged (renamed) or replaced meanwhile: the caller looks again.
            guard connection.changes == 1 else {
                throw SofaError.conflict(docID: drafts.first?.0.docID ?? "", revID: nil, current: "(staged file \(seq) gone)")
            }
        }
        return revisions
    }
}
