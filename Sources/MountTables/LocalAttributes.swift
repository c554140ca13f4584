import DocumentModel
import DocumentStore
import Foundation

/// What a mount keeps about a file or folder of a document that revisions do not hold: the
/// times given to it (`touch -d`, `cp -a`, `rsync -a`, `tar x`), to the nanosecond, and its
/// permission bits (`chmod +x`, a file created executable by a linker or `install -m 755`).
///
/// They are local to this database: replication neither sends nor receives them, since
/// CouchDB's attachments have no such fields (a replica shows revision times and mode 0644).
/// Times belong to the body they were given to (`digest`): once an attachment has another
/// body, its time is again that of the revision that changed it. The mode belongs to the name,
/// whatever its body, until the file is removed.
///
/// A folder's row is named by `LocalAttributes.folderName(_:)` (its path with a `/` at its
/// end; `/` alone for `attachments/`).
public struct LocalAttributes: Sendable, Equatable {
    /// The body the times were given to; nil for a folder.
    public var digest: String?
    /// Nanoseconds since 1970.
    public var modified: Int64?
    public var accessed: Int64?
    /// Permission bits given, when other than the default.
    public var mode: UInt32?

    public init(digest: String? = nil, modified: Int64? = nil, accessed: Int64? = nil, mode: UInt32? = nil) {
        (self.digest, self.modified, self.accessed, self.mode) = (digest, modified, accessed, mode)
    }

    /// The permission bits a file or folder has when none were given.
    public static let defaultFileMode: UInt32 = 0o644
    public static let defaultFolderMode: UInt32 = 0o755

    /// Takes what was given to a file whose body is now `digest`: times given to another body
    /// go first; a mode given that is the default is no mode of its own.
    public mutating func take(_ given: LocalAttributes, forBody digest: String) {
        if self.digest != digest { (self.digest, modified, accessed) = (digest, nil, nil) }
        if let time = given.modified { modified = time }
        if let time = given.accessed { accessed = time }
        if let mode = given.mode { self.mode = mode == Self.defaultFileMode ? nil : mode }
    }

    /// The row name of a folder of attachments (`""` is `attachments/` itself).
    public static func folderName(_ folder: String) -> String { folder + "/" }

    /// Nanoseconds since 1970 for a time in seconds.
    public static func nanoseconds(_ seconds: Double) -> Int64 { Int64((seconds * 1e9).rounded()) }
}

extension Database {
    /// The local attributes of a document's files and folders, by row name.
    public func localAttributes(ofDocument id: String) throws -> [String: LocalAttributes] {
        guard schema.has(CachedBody.schemaStep) else { return [:] }
        return try read { connection in
            var result: [String: LocalAttributes] = [:]
            if schema.has(Schema.localAttributes) {
                try connection.forEach("SELECT name, digest, modified, accessed, mode FROM local_attributes WHERE doc_id = ?", .text(id)) { row in
                    result[row.text(0)] = LocalAttributes(digest: row.optionalText(1), modified: row.optionalInt64(2),
                                                          accessed: row.optionalInt64(3), mode: row.optionalInt64(4).map { UInt32($0) })
                }
            } else {  // versions 4 to 6, opened read-only
                try connection.forEach("SELECT name, digest, modified FROM attachment_times WHERE doc_id = ?", .text(id)) { row in
                    result[row.text(0)] = LocalAttributes(digest: row.text(1), modified: LocalAttributes.nanoseconds(row.double(2)))
                }
            }
            return result
        }
    }

    /// The local attributes of one file or folder (`name`, or a folder's row name).
    public func localAttributes(docID: String, name: String) throws -> LocalAttributes? {
        guard schema.has(Schema.localAttributes) else { return try localAttributes(ofDocument: docID)[name] }
        return try read { try Database.localAttributes(docID, name, in: $0) }
    }

    /// Changes the local attributes of one file or folder (`name`, or a folder's row name);
    /// a row left with nothing in it goes. Returns what the row now holds.
    @discardableResult
    public func updateLocalAttributes(docID: String, name: String, _ change: (inout LocalAttributes) -> Void) throws -> LocalAttributes? {
        guard schema.has(Schema.localAttributes) else { throw SofaError.readOnlyFileSystem(path: databaseFilePath) }
        return try write { connection in
            var attributes = try Database.localAttributes(docID, name, in: connection) ?? LocalAttributes()
            change(&attributes)
            return try Database.store(attributes, docID: docID, name: name, in: connection)
        }
    }

    /// Moves local attributes with renamed files and folders (`moves`: old row name → new),
    /// and drops those of `removed` names, in one transaction.
    public func moveLocalAttributes(docID: String, moves: [(from: String, to: String)], toDocument target: String? = nil,
                                    removing removed: [String] = []) throws {
        guard schema.has(Schema.localAttributes), !(moves.isEmpty && removed.isEmpty) else { return }
        try write { connection in
            var moved: [(String, LocalAttributes)] = []
            for (from, to) in moves {
                guard let attributes = try Database.localAttributes(docID, from, in: connection) else { continue }
                try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(docID), .text(from))
                moved.append((to, attributes))
            }
            for name in removed {
                try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(docID), .text(name))
            }
            for (to, attributes) in moved { try Database.store(attributes, docID: target ?? docID, name: to, in: connection) }
        }
    }

    static func localAttributes(_ docID: String, _ name: String, in connection: SQLiteConnection) throws -> LocalAttributes? {
        try connection.query("SELECT digest, modified, accessed, mode FROM local_attributes WHERE doc_id = ? AND name = ?",
                             .text(docID), .text(name)) { row in
            LocalAttributes(digest: row.optionalText(0), modified: row.optionalInt64(1), accessed: row.optionalInt64(2),
                            mode: row.optionalInt64(3).map { UInt32($0) })
        }.first
    }

    /// Writes a row (or deletes it when it holds nothing but a digest); returns what it holds.
    @discardableResult
    static func store(_ attributes: LocalAttributes, docID: String, name: String, in connection: SQLiteConnection) throws -> LocalAttributes? {
        if attributes == LocalAttributes(digest: attributes.digest) {
            try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(docID), .text(name))
            return nil
        }
        try connection.run("INSERT OR REPLACE INTO local_attributes (doc_id, name, digest, modified, accessed, mode) VALUES (?, ?, ?, ?, ?, ?)",
                           .text(docID), .text(name), SQLValue(attributes.digest), SQLValue(attributes.modified),
                           SQLValue(attributes.accessed), SQLValue(attributes.mode.map { Int64($0) }))
        return attributes
    }
}
