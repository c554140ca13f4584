import DocumentModel
import Foundation

/// Row helpers shared by the database's reads and writes.
extension Database {
    struct DocumentRow {
        let key: Int64
        let current: RevisionID
        let deleted: Bool
    }

    static func documentRow(_ id: String, in connection: SQLiteConnection) throws -> DocumentRow? {
        try connection.query("SELECT doc_key, current_rev, deleted FROM docs WHERE doc_id = ?", .text(id)) { row in
            DocumentRow(key: row.int64(0), current: try revisionID(row.text(1)), deleted: row.bool(2))
        }.first
    }

    /// A new document's row. Its key is above every key given before, purged documents' too
    /// (SQLite's own choice, the largest key + 1, would give a purged document's key again):
    /// a key names one document for the database's life, as the mount's inode numbers of a
    /// document's folder, made from it, must.
    static func insertDocumentRow(_ id: String, revID: RevisionID, in connection: SQLiteConnection) throws -> Int64 {
        try connection.run("""
            INSERT INTO docs (doc_key, doc_id, current_rev, deleted, sequence)
            VALUES (max(coalesce((SELECT max(doc_key) FROM docs), 0),
                        coalesce((SELECT value FROM meta WHERE key = 'last_purged_key'), 0)) + 1, ?, ?, 0, NULL)
            """, .text(id), .text(revID.description))
        return connection.lastInsertedRowID
    }

    static func loadTree(docKey: Int64, in connection: SQLiteConnection) throws -> RevisionTree {
        RevisionTree(try connection.query("SELECT rev_id, parent_id, deleted, leaf FROM revs WHERE doc_key = ?", .integer(docKey)) { row in
            RevisionNode(id: try revisionID(row.text(0)), parent: try row.optionalText(1).map(revisionID),
                         deleted: row.bool(2), isLeaf: row.bool(3))
        })
    }

    func loadRevision(docKey: Int64, docID: String, revID: RevisionID, in connection: SQLiteConnection) throws -> Revision? {
        let rows = try connection.query("""
            SELECT parent_id, deleted, body, sequence, saved_at FROM revs WHERE doc_key = ? AND rev_id = ? AND body IS NOT NULL
            """, .integer(docKey), .text(revID.description)
        ) { row in
            (parent: try row.optionalText(0).map(Database.revisionID), deleted: row.bool(1),
             body: try Database.parseBody(row.bytes(2)), sequence: row.int64(3), savedAt: row.double(4))
        }
        guard let row = rows.first else { return nil }
        return Revision(docID: docID, revID: revID, parentRevID: row.parent, deleted: row.deleted, properties: row.body,
                        attachments: try loadAttachments(docKey: docKey, revID: revID, in: connection, blobs: blobs),
                        sequence: row.sequence, savedAt: Date(timeIntervalSince1970: row.savedAt))
    }

    /// Attachment rows of a revision, in its order (CouchDB's: as they were given; rows from
    /// before version 8 by name); `contentAvailable` is checked against `blobs` when given.
    func loadAttachments(docKey: Int64, revID: RevisionID, in connection: SQLiteConnection, blobs: BlobStore?) throws -> [Attachment] {
        try loadAttachmentRows(docKey: docKey, revID: revID, in: connection, blobs: blobs).map(\.attachment)
    }

    /// A revision's attachments in their order, each with the MD5 CouchDB keeps for its body
    /// where known (`couch_md5`): what a save needs of its parent, in one read.
    func loadAttachmentRows(docKey: Int64, revID: RevisionID, in connection: SQLiteConnection,
                            blobs: BlobStore?) throws -> [(attachment: Attachment, couchMD5: [UInt8]?)] {
        try connection.query("""
            SELECT name, content_type, length, digest, blob_key, revpos, \(schema.has(Schema.attachmentOrder) ? "couch_md5" : "NULL") FROM rev_attachments
            WHERE doc_key = ? AND rev_id = ? ORDER BY \(schema.has(Schema.attachmentOrder) ? "position, " : "")name
            """, .integer(docKey), .text(revID.description)
        ) { row in
            let key = row.optionalText(4).flatMap(BlobKey.init(hex:))
            return (Attachment(name: row.text(0), contentType: row.text(1), length: row.int64(2), digest: row.text(3),
                               blobKey: key, revpos: row.int(5),
                               contentAvailable: key.map { blobs?.contains($0) ?? false } ?? false),
                    row.isNull(6) ? nil : row.bytes(6))
        }
    }

    static func deleteRevision(docKey: Int64, revID: RevisionID, in connection: SQLiteConnection) throws {
        try connection.run("DELETE FROM rev_attachments WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(revID.description))
        try connection.run("DELETE FROM revs WHERE doc_key = ? AND rev_id = ?", .integer(docKey), .text(revID.description))
    }

    static func nextSequence(in connection: SQLiteConnection) throws -> Int64 {
        connection.wroteChanges = true
        return try connection.query("UPDATE meta SET value = value + 1 WHERE key = 'last_sequence' RETURNING value") { $0.int64(0) }[0]
    }

    static func lastSequence(in connection: SQLiteConnection) throws -> Int64 {
        try connection.query("SELECT value FROM meta WHERE key = 'last_sequence'") { $0.int64(0) }[0]
    }

    /// Generations of history kept per document (CouchDB's `_revs_limit`).
    public var revsLimit: Int {
        get throws { try read { try Database.revsLimit(in: $0) } }
    }

    /// Changes the history kept per document; later saves and compaction prune to it.
    public func setRevsLimit(_ limit: Int) throws {
        guard limit >= 1 else { throw SofaError.invalidArgument("the revs limit must be at least 1") }
        try write { try $0.run("UPDATE meta SET value = ? WHERE key = 'revs_limit'", SQLValue(limit)) }
    }

    static func revsLimit(in connection: SQLiteConnection) throws -> Int {
        try connection.query("SELECT value FROM meta WHERE key = 'revs_limit'") { $0.int(0) }[0]
    }

    package static func revisionID(_ text: String) throws -> RevisionID {
        guard let rev = RevisionID(text) else { throw SofaError.sqlite(code: 0, message: "corrupt revision id \(text)", sql: nil) }
        return rev
    }

    static func parseBody(_ bytes: [UInt8]) throws -> JSONObject {
        guard case .object(let object) = try JSONValue(parsing: bytes) else {
            throw SofaError.invalidDocument(reason: "stored body is not an object")
        }
        return object
    }

    /// Top-level keys starting with `_` are CouchDB's, not the document's.
    /// The one kind of `_` field documents may hold, as in CouchDB: the state the replicator
    /// writes into `_replicator` documents (`_replication_state`, `_replication_stats`…).
    static let replicationFieldPrefix = "_replication_"

    static func validateProperties(_ properties: JSONObject) throws {
        if let key = properties.keys.first(where: { $0.hasPrefix("_") && !$0.hasPrefix(replicationFieldPrefix) }) {
            throw SofaError.invalidDocument(reason: "top-level key \"\(key)\" is reserved (keys starting with '_' are not allowed)")
        }
    }
}
