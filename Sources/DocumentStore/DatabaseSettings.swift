import DocumentModel
import Foundation

extension Database {
    /// CouchDB's default number of purges a database remembers (`_purged_infos_limit`).
    static let defaultPurgedInfosLimit = 1000

    /// Purges leaf revisions, as CouchDB's `_purge` does: each leaf named goes, with the
    /// ancestors no other revision of its document descends from, and a document left with no
    /// revision goes altogether (nothing of it replicates; it is as if it had never been).
    /// Revisions that are not leaves, and unknown ones, are left alone. A document whose winner
    /// changed takes a new sequence. Returns, per document, the revisions purged.
    @discardableResult
    public func purge(_ requested: [String: [RevisionID]]) throws -> [String: [RevisionID]] {
        try write { connection in
            connection.wroteChanges = true  // a document purged away takes no new sequence
            var purged: [String: [RevisionID]] = [:]
            for (id, revisions) in requested {
                purged[id] = []
                guard let row = try Database.documentRow(id, in: connection) else { continue }
                var nodes = try Database.loadTree(docKey: row.key, in: connection).nodes
                var gone: [RevisionID] = []
                for revision in revisions where nodes[revision]?.isLeaf == true {
                    purged[id]!.append(revision)
                    var current: RevisionID? = revision
                    while let node = current.flatMap({ nodes[$0] }), !nodes.values.contains(where: { $0.parent == node.id }) {
                        nodes[node.id] = nil
                        gone.append(node.id)
                        current = node.parent
                    }
                }
                guard !gone.isEmpty else { continue }
                for revision in gone { try Database.deleteRevision(docKey: row.key, revID: revision, in: connection) }
                if let winner = RevisionTree(Array(nodes.values)).winner {
                    try connection.run("UPDATE docs SET current_rev = ?, deleted = ?, sequence = ? WHERE doc_key = ?",
                                       .text(winner.id.description), SQLValue(winner.deleted),
                                       .integer(try Database.nextSequence(in: connection)), .integer(row.key))
                    try documentChanged(docKey: row.key, docID: id, winner: (winner.id, winner.deleted), in: connection)
                } else {
                    try documentChanged(docKey: nil, docID: id, winner: nil, in: connection)
                    try Database.forgetInViews(id, in: connection)
                    try connection.run("DELETE FROM docs WHERE doc_key = ?", .integer(row.key))
                    try connection.run("""
                        INSERT INTO meta (key, value) VALUES ('last_purged_key', ?)
                        ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)
                        """, .integer(row.key))
                    // Other parts' rows of the document (a mount's local attributes).
                    for forget in schema.forgetDocumentStatements { try connection.run(forget, .text(id)) }
                }
            }
            try connection.run("INSERT INTO meta (key, value) VALUES ('purge_seq', 1) ON CONFLICT (key) DO UPDATE SET value = value + 1")
            return purged
        }
    }

    /// How many purges have been made (CouchDB's `purge_seq`).
    public var purgeSequence: Int64 {
        get throws { try metaValue("purge_seq") { $0.int64(0) } ?? 0 }
    }

    /// `_purged_infos_limit`: stored for clients that set it (Sofa keeps no purge history to trim).
    public var purgedInfosLimit: Int {
        get throws { try metaValue("purged_infos_limit") { $0.int(0) } ?? Database.defaultPurgedInfosLimit }
    }

    public func setPurgedInfosLimit(_ limit: Int) throws {
        guard limit >= 1 else { throw SofaError.invalidArgument("the purged infos limit must be at least 1") }
        try setMetaValue("purged_infos_limit", SQLValue(limit))
    }

    /// CouchDB's `instance_start_time`: when the database was created (seconds since 1970), the
    /// same for its whole life, which replicators compare at each checkpoint. A database made
    /// before it was recorded gets the time of the first ask, kept from then on; read-only, it
    /// is the time its file last changed status.
    public var instanceStartTime: Int64 {
        get throws {
            if let recorded = try metaValue("instance_start_time", { $0.int64(0) }) { return recorded }
            guard !isReadOnly else {
                var info = stat()
                return stat(databaseFilePath, &info) == 0 ? Int64(info.st_ctim.tv_sec) : 0
            }
            return try write { connection in
                try connection.run("INSERT OR IGNORE INTO meta (key, value) VALUES ('instance_start_time', ?)",
                                   .integer(Int64(Date().timeIntervalSince1970)))
                return try connection.query("SELECT value FROM meta WHERE key = 'instance_start_time'") { $0.int64(0) }[0]
            }
        }
    }

    /// The shard count CouchDB reports as `cluster.q` for this database: what `PUT /db?q=N` gave
    /// it (kept so a client reads back what it asked), else 2, CouchDB 3's default. Sofa keeps
    /// one file whatever it says; it matters to clients that create databases as CouchDB does.
    public var shardCount: Int {
        get throws { try metaValue("cluster_q", { $0.int(0) }) ?? 2 }
    }

    public func setShardCount(_ count: Int) throws {
        guard count >= 1 else { throw SofaError.invalidArgument("the shard count must be at least 1") }
        try setMetaValue("cluster_q", SQLValue(count))
    }

    /// The `meta` row `key`, read by `column`; nil when there is none.
    func metaValue<T>(_ key: String, _ column: (SQLiteRow) throws -> T) throws -> T? {
        try read { try $0.query("SELECT value FROM meta WHERE key = ?", .text(key), row: column).first }
    }

    func setMetaValue(_ key: String, _ value: SQLValue) throws {
        try write { try $0.run("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value", .text(key), value) }
    }
}

extension Database {
    /// What a database's security object is until one is stored: CouchDB 3's default, admins only
    /// (what `sofa serve --user` gives: its one user is the server's admin).
    static let defaultSecurityObject: JSONObject = ["admins": ["roles": ["_admin"]], "members": ["roles": ["_admin"]]]

    /// The database's security object (CouchDB's `_security`: `admins` and `members`, each with
    /// `names` and `roles`), as last stored.
    public var securityObject: JSONObject {
        get throws {
            let text = try metaValue("security") { $0.text(0) }
            guard let text, case .object(let object) = try JSONParser.parse(Array(text.utf8)) else { return Database.defaultSecurityObject }
            return object
        }
    }

    /// Stores a security object; `admins` and `members`, when present, must be objects whose
    /// `names` and `roles`, when present, are arrays of strings.
    public func setSecurityObject(_ object: JSONObject) throws {
        for section in ["admins", "members"] {
            guard let value = object[section] else { continue }
            guard case .object(let members) = value else {
                throw SofaError.invalidArgument("`\(section)` must be an object with `names` and `roles`")
            }
            for list in ["names", "roles"] {
                guard let entries = members[list] else { continue }
                guard case .array(let items) = entries, items.allSatisfy({ $0.stringValue != nil }) else {
                    throw SofaError.invalidArgument("`\(section).\(list)` must be an array of strings")
                }
            }
        }
        try setMetaValue("security", .text(JSONValue.object(object).jsonString()))
    }
}
