import DocumentModel
import Foundation

/// Mango JSON indexes in SQLite (schema version 5).
///
/// The design documents whose `language` is `"query"` define them (so they replicate, and an
/// index pulled from CouchDB is built here); `mango_indexes` lists what they define and
/// `mango_keys` holds each index's entries: the document's key (`Collation.key` of each
/// field's value, so that SQLite's byte order is CouchDB's order) and its id. Entries change in
/// the transaction that changes a document's winning revision, and an index is built in the
/// transaction that saves the design document defining it: a query never sees an index that
/// is behind, and never has to write.
extension MangoIndex {
    /// `mango_indexes` and `mango_keys` (version 5): the indexes and their entries (key,
    /// document id, the indexed values as a JSON array, which let a query skip documents
    /// without reading them).
    static let schemaStep = SchemaStep("mango indexes", numberedVersion: 5, sql: """
        CREATE TABLE IF NOT EXISTS mango_indexes (
            index_id INTEGER PRIMARY KEY,
            ddoc TEXT NOT NULL,
            name TEXT NOT NULL,
            definition TEXT NOT NULL,
            UNIQUE (ddoc, name)
        );
        CREATE TABLE IF NOT EXISTS mango_keys (
            index_id INTEGER NOT NULL,
            key BLOB NOT NULL,
            doc_id TEXT NOT NULL,
            field_values TEXT NOT NULL,
            PRIMARY KEY (index_id, key, doc_id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS mango_keys_by_doc ON mango_keys (doc_id);
        """)
}

extension Database {
    /// The indexes defined in this database, by design document and name.
    public func mangoIndexes() throws -> [MangoIndex] {
        guard schema.has(MangoIndex.schemaStep) else { return [] }
        return try read { try Database.mangoIndexes(in: $0).map(\.index) }
    }

    static func mangoIndexes(in connection: SQLiteConnection) throws -> [(id: Int64, index: MangoIndex)] {
        try connection.query("SELECT index_id, ddoc, name, definition FROM mango_indexes ORDER BY ddoc, name") { row in
            let definition: JSONObject = ["language": "query", "views": .object(JSONObject([(row.text(2), try JSONParser.parse(row.bytes(3)))]))]
            return MangoIndex.indexes(inDesignDocument: row.text(1), properties: definition).first.map { (row.int64(0), $0) }
        }.compactMap { $0 }
    }

    /// Keeps the indexes in step with a document whose winning revision changed (or that is
    /// gone, `winner` nil): its entries are replaced; a design document's indexes are
    /// redefined and built anew when their definition changed.
    func documentChanged(docKey: Int64?, docID: String, winner: (revID: RevisionID, deleted: Bool)?,
                         in connection: SQLiteConnection) throws {
        guard schema.has(MangoIndex.schemaStep) else { return }
        if DocumentID.isDesign(docID) {
            try designDocumentChanged(docKey: docKey, docID: docID, winner: winner, in: connection)
            return
        }
        let indexes = try Database.mangoIndexes(in: connection)
        guard !indexes.isEmpty else { return }
        try connection.run("DELETE FROM mango_keys WHERE doc_id = ?", .text(docID))
        guard let docKey, let winner, !winner.deleted,
              let body = try connection.query("SELECT body FROM revs WHERE doc_key = ? AND rev_id = ?",
                                              .integer(docKey), .text(winner.revID.description), row: { $0.bytes(0) }).first
        else { return }
        let document = try Database.indexedDocument(docID, revID: winner.revID.description, body: body)
        for (id, index) in indexes {
            if let entry = index.entry(of: document) { try Database.insert(entry, docID: docID, index: id, in: connection) }
        }
    }

    private func designDocumentChanged(docKey: Int64?, docID: String, winner: (revID: RevisionID, deleted: Bool)?,
                                       in connection: SQLiteConnection) throws {
        var defined: [MangoIndex] = []
        if let docKey, let winner, !winner.deleted,
           let revision = try loadRevision(docKey: docKey, docID: docID, revID: winner.revID, in: connection) {
            defined = MangoIndex.indexes(inDesignDocument: docID, properties: revision.properties)
        }
        let existing = try Database.mangoIndexes(in: connection).filter { $0.index.designDocument == docID }
        for (id, index) in existing where !defined.contains(index) {
            try connection.run("DELETE FROM mango_keys WHERE index_id = ?", .integer(id))
            try connection.run("DELETE FROM mango_indexes WHERE index_id = ?", .integer(id))
        }
        for index in defined where !existing.contains(where: { $0.index == index }) {
            try connection.run("INSERT INTO mango_indexes (ddoc, name, definition) VALUES (?, ?, ?)",
                               .text(docID), .text(index.name), .text(index.view.jsonString()))
            let id = try connection.query("SELECT last_insert_rowid()") { $0.int64(0) }[0]
            try Database.build(index, id: id, in: connection)
        }
    }

    /// Enters every live document (design documents aside) into a new index.
    private static func build(_ index: MangoIndex, id: Int64, in connection: SQLiteConnection) throws {
        try connection.forEach("""
            SELECT d.doc_id, d.current_rev, r.body FROM docs d JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev
            WHERE d.deleted = 0 AND r.body IS NOT NULL AND substr(d.doc_id, 1, 8) <> '_design/'
            """) { row in
            let document = try indexedDocument(row.text(0), revID: row.text(1), body: row.bytes(2))
            if let entry = index.entry(of: document) { try insert(entry, docID: row.text(0), index: id, in: connection) }
        }
    }

    /// Defines the indexes of every query design document (a database upgraded to version 5).
    func buildMangoIndexesFromDesignDocuments() throws {
        try write { connection in
            let designs = try connection.query("""
                SELECT doc_key, doc_id, current_rev, deleted FROM docs WHERE substr(doc_id, 1, 8) = '_design/'
                """) { row in (row.int64(0), row.text(1), try Database.revisionID(row.text(2)), row.bool(3)) }
            for (key, id, rev, deleted) in designs {
                try designDocumentChanged(docKey: key, docID: id, winner: (rev, deleted), in: connection)
            }
        }
    }

    /// What an index sees of a document: its properties with `_id` and `_rev`.
    static func indexedDocument(_ docID: String, revID: String, body: [UInt8]) throws -> JSONObject {
        var document = try parseBody(body)
        document["_id"] = .string(docID)
        document["_rev"] = .string(revID)
        return document
    }

    private static func insert(_ entry: (key: [UInt8], values: [JSONValue]), docID: String, index: Int64,
                               in connection: SQLiteConnection) throws {
        try connection.run("INSERT INTO mango_keys (index_id, key, doc_id, field_values) VALUES (?, ?, ?, ?)",
                           .integer(index), .blob(entry.key), .text(docID), .text(JSONValue.array(entry.values).jsonString()))
    }
}

extension Database {
    /// Defines `index` in its design document (made if missing, with `language: "query"`), as
    /// `POST /db/_index` does. Returns false when the same index was there already.
    @discardableResult
    public func createIndex(_ index: MangoIndex) throws -> Bool {
        try editDesignDocument(index.designDocument) { properties in
            if let language = properties["language"]?.stringValue, language != "query" {
                throw SofaError.invalidQuery(error: "invalid_design_doc",
                                             reason: "\(index.designDocument) holds \(language) views, not Mango indexes")
            }
            var views = properties["views"]?.objectValue ?? [:]
            let existing = MangoIndex.indexes(inDesignDocument: index.designDocument, properties: properties)
            if existing.contains(index) { return false }
            views[index.name] = index.view
            properties["language"] = "query"
            properties["views"] = .object(views)
            return true
        }
    }

    /// Removes an index from its design document (the document goes with its last index), as
    /// `DELETE /db/_index/DDOC/json/NAME` does. Returns false when there is no such index.
    @discardableResult
    public func deleteIndex(designDocument: String, name: String) throws -> Bool {
        try editDesignDocument(designDocument) { properties in
            guard MangoIndex.indexes(inDesignDocument: designDocument, properties: properties).contains(where: { $0.name == name }),
                  var views = properties["views"]?.objectValue else { return false }
            views[name] = nil
            properties["views"] = .object(views)
            return true
        }
    }

    /// Changes a design document's properties, retrying when another writer got there first.
    private func editDesignDocument(_ id: String, _ change: (inout JSONObject) throws -> Bool) throws -> Bool {
        while true {
            var draft = try newRevision(of: id)
            var properties = draft.deleted ? [:] : draft.properties
            guard try change(&properties) else { return false }
            let empty = properties["views"]?.objectValue?.isEmpty == true && properties["language"]?.stringValue == "query"
            if empty && draft.parent != nil {
                draft.properties = [:]  // as CouchDB's DELETE: a tombstone of nothing
                draft.deleted = true
            } else {
                draft.properties = properties
            }
            do {
                _ = try save(draft)
                return true
            } catch SofaError.conflict {
                continue
            }
        }
    }
}
