import DocumentModel
import Foundation

/// `_local` documents: outside the revision machinery, never replicated.
extension Database {
    /// The ids of every `_local` document (checkpoints, among others), sorted.
    public func localDocumentIDs() throws -> [String] {
        try read { connection in try connection.query("SELECT doc_id FROM local_docs ORDER BY doc_id") { $0.text(0) } }
    }

    /// A `_local` document's revision (`0-N`) and body; nil if there is none.
    public func localDocument(withID id: String) throws -> (rev: String, body: JSONObject)? {
        try read { connection in
            try connection.query("SELECT rev, body FROM local_docs WHERE doc_id = ?", .text(id)) { row in
                (row.text(0), try Database.parseBody(row.bytes(1)))
            }.first
        }
    }

    /// Creates or replaces a `_local` document. When `rev` is given it must be the
    /// current one (`conflict` otherwise). Returns the new revision, `0-N`.
    @discardableResult
    public func putLocalDocument(_ id: String, body: JSONObject, rev: String? = nil) throws -> String {
        try DocumentID.validate(id)
        return try write { connection in
            let current = try connection.query("SELECT rev FROM local_docs WHERE doc_id = ?", .text(id)) { $0.text(0) }.first
            if let rev, rev != current {
                throw SofaError.conflict(docID: id, revID: rev, current: current ?? "(none)")
            }
            let count = current.flatMap { Int($0.split(separator: "-").last ?? "") } ?? 0
            let newRev = "0-\(count + 1)"
            try connection.run("INSERT OR REPLACE INTO local_docs (doc_id, rev, body) VALUES (?, ?, ?)",
                               .text(id), .text(newRev), .text(JSONValue.object(body).jsonString()))
            return newRev
        }
    }

    /// Stores a `_local` document the way CouchDB's HTTP API does: no conflict check,
    /// the new revision is `0-(N+1)` for a given `0-N`, and `0-1` without one.
    @discardableResult
    public func replaceLocalDocument(_ id: String, body: JSONObject, after rev: String?) throws -> String {
        try DocumentID.validate(id)
        let count = rev.flatMap { Int($0.split(separator: "-").last ?? "") } ?? 0
        let newRev = "0-\(count + 1)"
        try write { connection in
            try connection.run("INSERT OR REPLACE INTO local_docs (doc_id, rev, body) VALUES (?, ?, ?)",
                               .text(id), .text(newRev), .text(JSONValue.object(body).jsonString()))
        }
        return newRev
    }

    /// Stores a `_local` document only if its revision is still `rev` (nil: it must not exist),
    /// as Sync Gateway keeps checkpoints; else `SofaError.conflict`.
    @discardableResult
    public func replaceLocalDocument(_ id: String, body: JSONObject, ifRevisionIs rev: String?) throws -> String {
        try DocumentID.validate(id)
        return try write { connection in
            let current = try connection.query("SELECT rev FROM local_docs WHERE doc_id = ?", .text(id)) { $0.text(0) }.first
            guard current == rev else { throw SofaError.conflict(docID: id, revID: rev, current: current ?? "") }
            let count = rev.flatMap { Int($0.split(separator: "-").last ?? "") } ?? 0
            let newRev = "0-\(count + 1)"
            try connection.run("INSERT OR REPLACE INTO local_docs (doc_id, rev, body) VALUES (?, ?, ?)",
                               .text(id), .text(newRev), .text(JSONValue.object(body).jsonString()))
            return newRev
        }
    }

    public func deleteLocalDocument(_ id: String, rev: String? = nil) throws {
        try write { connection in
            let current = try connection.query("SELECT rev FROM local_docs WHERE doc_id = ?", .text(id)) { $0.text(0) }.first
            guard let current else { throw SofaError.documentNotFound(id) }
            if let rev, rev != current { throw SofaError.conflict(docID: id, revID: rev, current: current) }
            try connection.run("DELETE FROM local_docs WHERE doc_id = ?", .text(id))
        }
    }
}
