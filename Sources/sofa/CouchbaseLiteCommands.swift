import DocumentModel
import DocumentStore
import Foundation

/// `sofa info|ls|cat|revs` on a Couchbase Lite database (`NAME.cblite2`), read in place.
extension DatabaseArgument {
    /// The Couchbase Lite database the argument names, or nil for a Sofa database.
    func couchbaseLite() throws -> CouchbaseLiteDatabase? {
        CouchbaseLiteDatabase.isCouchbaseLite(at: database) ? try CouchbaseLiteDatabase.open(at: database) : nil
    }
}

extension Info {
    func show(_ database: CouchbaseLiteDatabase) throws {
        let info = try database.info()
        if json {
            Output.json([
                "path": .string(database.path), "kind": "couchbase-lite",
                "documents": .integer(Int64(info.documentCount)), "deleted_documents": .integer(Int64(info.deletedCount)),
                "last_sequence": .integer(info.lastSequence), "public_uuid": .string(info.publicUUID),
                "private_uuid": .string(info.privateUUID), "blob_count": .integer(Int64(info.blobCount)),
                "blob_bytes": .integer(info.blobBytes), "other_collections": .array(info.otherCollections.map { .string($0) }),
            ])
            return
        }
        var lines = """
            Database:      \(database.path) (Couchbase Lite 3, read in place)
            Documents:     \(info.documentCount) (\(info.deletedCount) deleted)
            Last sequence: \(info.lastSequence)
            Public UUID:   \(info.publicUUID)
            Private UUID:  \(info.privateUUID)
            Blobs:         \(info.blobCount) (\(formatBytes(info.blobBytes)))
            """
        if !info.otherCollections.isEmpty {
            lines += "\nCollections:   \(info.otherCollections.joined(separator: ", ")) besides the default one (Sofa reads the default one)"
        }
        Output.line(lines)
    }
}

extension List {
    func show(_ database: CouchbaseLiteDatabase) throws {
        let ids = try database.documentIDs(deleted: deleted).filter(matches).dropFirst(offset).prefix(limit ?? Int.max)
        var first = true
        if json { Output.write(STDOUT_FILENO, "[") }
        if long && !json { Output.line("REVISION\tATTACHMENTS\tID") }
        for id in ids {
            guard let document = try database.document(id) else { continue }  // removed meanwhile
            let needsTree = conflicts || long || json
            let conflictCount = needsTree ? try database.revisionTree(of: document).tree.leaves.filter { !$0.deleted }.count - (document.deleted ? 0 : 1) : 0
            if conflicts, conflictCount == 0 { continue }
            var attachmentCount = 0
            if long || json, let (properties, _) = try database.body(of: document.revID, in: document, tree: database.revisionTree(of: document)) {
                let blobs = (try? Blobs.find(in: properties, docID: id, lenient: true).count) ?? 0
                attachmentCount = (properties["_attachments"]?.objectValue?.count ?? 0) + blobs
            }
            if json {
                let entry: JSONValue = ["id": .string(id), "rev": .string(document.revID.description), "deleted": .bool(document.deleted),
                                        "sequence": .integer(document.sequence), "attachments": .integer(Int64(attachmentCount)),
                                        "conflicts": .integer(Int64(conflictCount))]
                Output.write(STDOUT_FILENO, (first ? "\n  " : ",\n  ") + entry.jsonString())
            } else if long {
                let marks = (conflictCount > 0 ? "\t(\(counted(conflictCount, "conflict")))" : "") + (document.deleted ? "\t(deleted)" : "")
                Output.line("\(document.revID)\t\(attachmentCount)\t\(List.printable(id))\(marks)")
            } else {
                Output.line(List.printable(id))
            }
            first = false
        }
        if json { Output.write(STDOUT_FILENO, first ? "]\n" : "\n]\n") }
    }
}

extension Cat {
    func document(_ id: String, in database: CouchbaseLiteDatabase) throws -> JSONObject {
        let (object, conflicts) = try database.couchJSON(of: id, rev: try rev.map { try RevisionID.parse($0) })
        if properties {
            var bare = object
            for key in ["_id", "_rev", "_deleted", "_attachments"] { bare[key] = nil }
            return bare
        }
        var shown = object
        if rev == nil, !conflicts.isEmpty {
            shown["_conflicts"] = .array(conflicts.sorted(by: >).map { .string($0.description) })
        }
        return shown
    }
}
