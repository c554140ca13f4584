import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

struct Create: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Create an empty database.")

    @OptionGroup var db: DatabaseArgument
    @Option(help: "Generations of history kept per document.") var revsLimit = Tuning.defaultRevsLimit

    func execute() throws {
        guard revsLimit >= 1 else { throw SofaError.invalidArgument("--revs-limit must be at least 1") }
        let database = try Database.create(at: db.database, revsLimit: revsLimit)
        Output.line("created \(database.path)")
    }
}

struct Info: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Show document counts, sequence, identity and sizes.")

    @OptionGroup var db: DatabaseArgument
    @Flag(help: "Print JSON.") var json = false

    func execute() throws {
        let database = try db.open()
        let info = try database.info()
        let cache = try database.cacheUse()
        if json {
            Output.json([
                "path": .string(info.path), "documents": .integer(Int64(info.documentCount)),
                "deleted_documents": .integer(Int64(info.deletedCount)), "last_sequence": .integer(info.lastSequence),
                "public_uuid": .string(info.publicUUID), "private_uuid": .string(info.privateUUID),
                "revs_limit": .integer(Int64(info.revsLimit)), "database_bytes": .integer(info.databaseBytes),
                "blob_count": .integer(Int64(info.blobCount)), "blob_bytes": .integer(info.blobBytes),
                "bodies_not_present": .integer(Int64(info.missingBodyCount)),
                "partial_downloads": .integer(Int64(cache.partialCount)), "partial_download_bytes": .integer(cache.partialBytes),
                "cache": .object(cacheJSON(cache)),
            ])
            return
        }
        Output.line("""
            Database:      \(info.path)
            Documents:     \(info.documentCount) (\(info.deletedCount) deleted)
            Last sequence: \(info.lastSequence)
            Public UUID:   \(info.publicUUID)
            Private UUID:  \(info.privateUUID)
            Revs limit:    \(info.revsLimit)
            SQLite size:   \(formatBytes(info.databaseBytes))
            Blobs:         \(info.blobCount) (\(formatBytes(info.blobBytes)))
            Bodies not present: \(info.missingBodyCount)
            """)
        Output.line(cacheLines(cache))
    }
}

struct List: SofaCommand {
    static let configuration = CommandConfiguration(commandName: "ls", abstract: "List documents by id.")

    @OptionGroup var db: DatabaseArgument
    @Option(help: "At most this many documents.") var limit: Int?
    @Option(help: "Skip this many documents first.") var offset = 0
    @Flag(name: .short, help: "Long format: revision, attachment count, id.") var long = false
    @Flag(help: "Include deleted documents.") var deleted = false
    @Flag(help: "Print JSON.") var json = false

    func execute() throws {
        let database = try db.open()
        // Page through ids so that huge databases list in constant memory.
        var remaining = limit ?? Int.max
        var after: String?
        var skip = offset
        var first = true
        if json { Output.write(STDOUT_FILENO, "[") }
        while remaining > 0 {
            let page = try database.documents(after: after, offset: skip, limit: min(remaining, 1000), includeDeleted: deleted)
            skip = 0
            guard let last = page.last else { break }
            after = last.docID
            remaining -= page.count
            for summary in page {
                if json {
                    let entry: JSONValue = ["id": .string(summary.docID), "rev": .string(summary.revID.description),
                                            "deleted": .bool(summary.deleted), "sequence": .integer(summary.sequence),
                                            "attachments": .integer(Int64(summary.attachmentCount))]
                    Output.write(STDOUT_FILENO, (first ? "\n  " : ",\n  ") + entry.jsonString())
                } else if long {
                    Output.line("\(summary.revID)\t\(summary.attachmentCount)\t\(summary.docID)\(summary.deleted ? "\t(deleted)" : "")")
                } else {
                    Output.line(summary.docID)
                }
                first = false
            }
        }
        if json { Output.write(STDOUT_FILENO, first ? "]\n" : "\n]\n") }
    }
}

struct Cat: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Print a document (its current revision, or --rev).")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Option(help: "A specific revision.") var rev: String?
    @Flag(help: "Print only the properties, as properties.json shows them.") var properties = false

    func execute() throws {
        let database = try db.open()
        if DocumentID.isLocal(id) {
            guard let local = try database.localDocument(withID: id) else { throw SofaError.documentNotFound(id) }
            var object: JSONObject = ["_id": .string(id), "_rev": .string(local.rev)]
            for (key, value) in local.body { object[key] = value }
            Output.json(.object(properties ? local.body : object))
            return
        }
        let revision = try database.revision(of: id, rev: rev)
        Output.json(.object(properties ? revision.properties : try revision.couchJSON()))
    }
}

struct Put: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create or update a document from JSON (an argument, or standard input).",
        discussion: "A `_rev` in the JSON must be the current revision. Attachments are kept.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Argument(help: "The JSON body, or - (the default) to read standard input.") var json: String = "-"

    func execute() throws {
        let database = try db.open()
        let bytes = json == "-" ? readStandardInput() : Array(json.utf8)
        var body = try parseJSONObject(bytes, what: "a document body")
        if let bodyID = body["_id"] {
            guard bodyID.stringValue == id else { throw SofaError.invalidDocument(reason: "_id \(bodyID) does not match \(id)") }
            body["_id"] = nil
        }
        let rev = body["_rev"]
        body["_rev"] = nil
        if DocumentID.isLocal(id) {
            try DocumentID.validate(id)
            Output.line(try database.putLocalDocument(id, body: body, rev: rev?.stringValue))
            return
        }
        var draft: RevisionDraft
        if let rev {
            guard let text = rev.stringValue else { throw SofaError.invalidRevisionID(rev.description) }
            draft = try database.newRevision(of: id, from: RevisionID.parse(text))
        } else {
            draft = try database.newRevision(of: id)
        }
        draft.properties = body
        Output.line(try database.save(draft).revID.description)
    }
}

struct Remove: SofaCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Delete a document (saves a tombstone).")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Option(help: "The revision to delete; it must be current.") var rev: String?

    func execute() throws {
        let database = try db.open()
        if DocumentID.isLocal(id) {
            try database.deleteLocalDocument(id, rev: rev)
            return
        }
        Output.line(try database.deleteDocument(id, revID: rev.map(RevisionID.parse)).revID.description)
    }
}

struct Revs: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Show a document's revision tree; the winner and conflicts are marked.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Flag(help: "Print JSON.") var json = false

    func execute() throws {
        let tree = try db.open().revisionTree(of: id)
        let winner = tree.winner?.id
        let conflicts = Set(tree.conflicts.map(\.id))
        if json {
            let nodes = tree.nodes.values.sorted { $1.id < $0.id }.map { node -> JSONValue in
                ["rev": .string(node.id.description), "parent": node.parent.map { .string($0.description) } ?? .null,
                 "deleted": .bool(node.deleted), "leaf": .bool(node.isLeaf)]
            }
            Output.json(["id": .string(id), "current": winner.map { .string($0.description) } ?? .null,
                         "conflicts": .array(conflicts.sorted(by: >).map { .string($0.description) }),
                         "revisions": .array(nodes)])
            return
        }
        var children: [RevisionID?: [RevisionNode]] = [:]
        for node in tree.nodes.values {
            // A parent that was pruned away makes its child a root.
            let parent = node.parent.flatMap { tree.contains($0) ? $0 : nil }
            children[parent, default: []].append(node)
        }
        func show(_ node: RevisionNode, prefix: String, connector: String, childPrefix: String) {
            var marks: [String] = []
            if node.id == winner { marks.append("current") }
            if conflicts.contains(node.id) { marks.append("conflict") }
            if node.deleted { marks.append("deleted") }
            Output.line(prefix + connector + node.id.description + (marks.isEmpty ? "" : "  [" + marks.joined(separator: ", ") + "]"))
            let kids = (children[node.id] ?? []).sorted { $0.id < $1.id }
            for (index, child) in kids.enumerated() {
                let isLast = index == kids.count - 1
                show(child, prefix: prefix + childPrefix, connector: isLast ? "└── " : "├── ", childPrefix: isLast ? "    " : "│   ")
            }
        }
        for root in (children[nil] ?? []).sorted(by: { $0.id < $1.id }) {
            show(root, prefix: "", connector: "", childPrefix: "")
        }
    }
}

struct Check: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Check the SQLite file and the hash of every blob.")

    @OptionGroup var db: DatabaseArgument

    func execute() throws {
        let problems = try db.open().check()
        for problem in problems { Output.line(problem) }
        guard problems.isEmpty else { throw SofaError.invalidArgument("\(problems.count) problem(s) found") }
        Output.line("ok")
    }
}

struct Compact: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Drop old revision bodies, delete unreferenced blobs and vacuum.",
        discussion: "Metadata of attachments whose bodies are not downloaded is always kept.")

    @OptionGroup var db: DatabaseArgument
    @Flag(help: "Print JSON.") var json = false

    func execute() throws {
        let report = try db.open().compact()
        if json {
            Output.json(["revisions_pruned": .integer(Int64(report.revisionsPruned)),
                         "bodies_dropped": .integer(Int64(report.bodiesDropped)),
                         "blobs_deleted": .integer(Int64(report.blobsDeleted)),
                         "blob_bytes_freed": .integer(report.blobBytesFreed),
                         "recent_blobs_kept": .integer(Int64(report.recentBlobsKept)),
                         "temporary_bytes_freed": .integer(report.temporaryBytesFreed),
                         "database_bytes_before": .integer(report.databaseBytesBefore),
                         "database_bytes_after": .integer(report.databaseBytesAfter),
                         "bytes_freed": .integer(report.bytesFreed)])
            return
        }
        Output.line("""
            Revisions pruned: \(report.revisionsPruned)
            Bodies dropped:   \(report.bodiesDropped)
            Blobs deleted:    \(report.blobsDeleted) (\(formatBytes(report.blobBytesFreed)))\(report.recentBlobsKept > 0
                ? "; \(report.recentBlobsKept) unreferenced blob(s) younger than \(Int(Tuning.blobGracePeriod / 60)) minutes kept" : "")
            Temporary files:  \(formatBytes(report.temporaryBytesFreed))
            SQLite file:      \(formatBytes(report.databaseBytesBefore)) -> \(formatBytes(report.databaseBytesAfter))
            Freed in all:     \(formatBytes(report.bytesFreed))
            """)
    }
}
