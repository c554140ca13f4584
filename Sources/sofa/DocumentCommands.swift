import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

struct Create: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Create an empty database.")

    @OptionGroup var db: DatabaseArgument
    @Option(help: "Generations of history kept per document.") var revsLimit = Tuning.defaultRevsLimit
    @Flag(help: ArgumentHelp("Encrypt everything in the database (AES-256-GCM).",
                             discussion: "With --key-file PATH, unlocked by that key file (made with a new random key if it does not exist); with --passphrase, by a passphrase asked for twice on the terminal (or read from --key-fd or --key-file)."))
    var encrypt = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        guard revsLimit >= 1 else { throw SofaError.invalidArgument("--revs-limit must be at least 1") }
        let encryption = try KeyOptions.newDatabaseKey(for: db.database, encrypt: encrypt)
        let database = try Database.create(at: db.database, revsLimit: revsLimit, encryptedWith: encryption)
        Output.line("created \(database.path)" + (encrypt ? " (encrypted)" : ""))
    }
}

struct Info: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Show document counts, sequence, identity and sizes.")

    @OptionGroup var db: DatabaseArgument
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func execute() throws {
        if let database = try db.couchbaseLite() { return try show(database) }
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
                "cache": .object(cacheJSON(cache)), "encrypted": .bool(database.isEncrypted),
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
            Encrypted:     \(database.isEncrypted ? "yes (AES-256-GCM; key.json)" : "no")
            """)
        Output.line(cacheLines(cache))
    }
}

struct List: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls", abstract: "List documents by id.",
        discussion: "An id holding a control character (a newline, a tab) is printed as a JSON string, in quotes, so that each line is one id. Patterns are the shell's (*, ?, [a-z]); quote them so that the shell leaves them alone.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Only ids matching one of these patterns ('h*', 'doc-?').") var patterns: [String] = []
    @Option(help: "At most this many documents.") var limit: Int?
    @Option(help: "Skip this many documents first.") var offset = 0
    @Flag(name: .short, help: "Long format: revision, attachment count, id and conflicts, under a header line.") var long = false
    @Flag(help: "Include deleted documents.") var deleted = false
    @Flag(help: "Only documents with conflicting revisions (resolve them with sofa revs and sofa rm --rev, or in the mount).")
    var conflicts = false
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func execute() throws {
        if let database = try db.couchbaseLite() { return try show(database) }
        let database = try db.open()
        // Page through ids so that huge databases list in constant memory.
        var remaining = limit ?? Int.max
        var after: String?
        var skip = offset
        var first = true
        let counting = conflicts || long || json
        // With patterns (as with --conflicts) --offset and --limit count the matching documents only.
        let filtered = conflicts || !patterns.isEmpty
        if json { Output.write(STDOUT_FILENO, "[") }
        if long && !json { Output.line("REVISION\tATTACHMENTS\tID") }  // as ps does; --json is for programs
        while remaining > 0 {
            // With --conflicts, --offset and --limit count the conflicted documents only.
            let page = try database.documents(after: after, offset: filtered ? 0 : skip, limit: filtered ? 1000 : min(remaining, 1000),
                                              includeDeleted: deleted, countingConflicts: counting)
            guard let last = page.last else { break }
            after = last.docID
            if !filtered { skip = 0 }
            for summary in page {
                if filtered {
                    guard !conflicts || summary.conflictCount > 0, matches(summary.docID) else { continue }
                    if skip > 0 {
                        skip -= 1
                        continue
                    }
                }
                guard remaining > 0 else { break }
                remaining -= 1
                if json {
                    let entry: JSONValue = ["id": .string(summary.docID), "rev": .string(summary.revID.description),
                                            "deleted": .bool(summary.deleted), "sequence": .integer(summary.sequence),
                                            "attachments": .integer(Int64(summary.attachmentCount)),
                                            "conflicts": .integer(Int64(summary.conflictCount))]
                    Output.write(STDOUT_FILENO, (first ? "\n  " : ",\n  ") + entry.jsonString())
                } else if long {
                    let marks = (summary.conflictCount > 0 ? "\t(\(counted(summary.conflictCount, "conflict")))" : "")
                        + (summary.deleted ? "\t(deleted)" : "")
                    Output.line("\(summary.revID)\t\(summary.attachmentCount)\t\(List.printable(summary.docID))\(marks)")
                } else {
                    Output.line(List.printable(summary.docID))
                }
                first = false
            }
        }
        if json { Output.write(STDOUT_FILENO, first ? "]\n" : "\n]\n") }
    }

    /// Whether `id` matches one of the patterns (all do when none is given), as the shell
    /// matches names (`fnmatch`, no special meaning for `/` or a leading dot: ids are not paths).
    func matches(_ id: String) -> Bool {
        patterns.isEmpty || patterns.contains { fnmatch($0, id, 0) == 0 }
    }

    /// An id as one line: as it is, or as a JSON string when it holds a character that would
    /// act on a terminal or end a line for some reader: C0 and C1 controls (U+009B is an 8-bit
    /// escape sequence, U+0085 a line end), DEL, U+2028 and U+2029, and the marks that reorder
    /// text (bidi overrides and isolates, which can make one id look like another). In the JSON
    /// string those are `\uXXXX`, which JSON allows for any character.
    static func printable(_ id: String) -> String {
        guard id.unicodeScalars.contains(where: \.actsOnTerminals) else { return id }
        var quoted = ""
        for scalar in JSONValue.string(id).jsonString().unicodeScalars {
            if scalar.actsOnTerminals {
                quoted += String(format: "\\u%04x", scalar.value)
            } else {
                quoted.unicodeScalars.append(scalar)
            }
        }
        return quoted
    }
}

struct Cat: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print documents (their current revisions, or --rev of one).",
        discussion: "A document with conflicting revisions shows them in _conflicts, as CouchDB's ?conflicts=true does; sofa put ignores that member.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document ids.") var ids: [String]
    @Option(help: "A specific revision (of one document).") var rev: String?
    @Flag(help: "Print only the properties, as properties.json shows them.") var properties = false
    @Flag(help: "Print each document on one line (JSON lines), and a failure as JSON on standard output.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func validate() throws {
        guard !ids.isEmpty else { throw ValidationError("give at least one document id") }
        guard rev == nil || ids.count == 1 else { throw ValidationError("--rev takes one document id, not \(ids.count)") }
    }

    func execute() throws {
        let couchbaseLite = try db.couchbaseLite()
        let database = couchbaseLite == nil ? try db.open() : nil
        var missing: [String] = []
        for id in ids {
            do {
                let shown: JSONObject
                if let couchbaseLite {
                    shown = try document(id, in: couchbaseLite)
                } else if let database {
                    shown = try document(id, in: database)
                } else {
                    continue
                }
                if json { Output.line(JSONValue.object(shown).jsonString()) } else { Output.json(.object(shown)) }
            } catch SofaError.documentNotFound(let id) where ids.count > 1 {
                missing.append(id)  // the others are still printed
            }
        }
        if let first = missing.first {
            throw missing.count == 1 ? SofaError.documentNotFound(first)
                : SofaError.invalidArgument("no documents \(missing.map { "\"\($0)\"" }.joined(separator: ", "))")
        }
    }

    private func document(_ id: String, in database: Database) throws -> JSONObject {
        if DocumentID.isLocal(id) {
            guard let local = try database.localDocument(withID: id) else { throw SofaError.documentNotFound(id) }
            var object: JSONObject = ["_id": .string(id), "_rev": .string(local.rev)]
            for (key, value) in local.body { object[key] = value }
            return properties ? local.body : object
        }
        let revision = try database.revision(of: id, rev: rev)
        if properties { return revision.properties }
        var object = try revision.couchJSON()
        let conflicts = try database.revisionTree(of: id).conflicts
        if rev == nil, !conflicts.isEmpty {
            object["_conflicts"] = .array(conflicts.map(\.id).sorted(by: >).map { .string($0.description) })
        }
        return object
    }
}

struct Put: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create or update a document from JSON (an argument, or standard input).",
        discussion: """
            A `_rev` in the JSON must be the current revision. Without `_attachments` the \
            document keeps its attachments; with it, as CouchDB: each stub (`"stub": true`, as \
            `sofa cat` prints them) keeps the attachment of that name, `data` (base64) sets one, \
            and those left out are removed. So `sofa cat DB ID | jq … | sofa put DB ID` works.
            """)

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Argument(help: "The JSON body, or - (the default) to read standard input.") var json: String = "-"
    @Flag(name: .customLong("json"), help: "Print CouchDB's answer ({\"ok\": true, \"id\", \"rev\"}), and a failure as JSON on standard output.")
    var printJSON = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { printJSON }

    /// The new revision, as the command's answer.
    private func answer(_ rev: String) {
        if printJSON {
            Output.line(JSONValue.object(["ok": true, "id": .string(id), "rev": .string(rev)]).jsonString())
        } else {
            Output.line(rev)
        }
    }

    func execute() throws {
        let database = try db.open()
        let bytes = json == "-" ? readStandardInput() : Array(json.utf8)
        let object = try parseJSONObject(bytes, what: "a document body")
        if object["_deleted"] != nil {
            throw SofaError.invalidDocument(reason: "top-level key \"_deleted\" is reserved (use `sofa rm` to delete)")
        }
        let document = try IncomingDocument(.object(object))  // its errors say "invalid document: …"
        if let bodyID = document.id, bodyID != id { throw SofaError.invalidDocument(reason: "_id \(bodyID) does not match \(id)") }
        if DocumentID.isLocal(id) {
            try DocumentID.validate(id)
            answer(try database.putLocalDocument(id, body: document.properties, rev: object["_rev"]?.stringValue))
            return
        }
        var draft = try document.rev.map { try database.newRevision(of: id, from: $0) } ?? database.newRevision(of: id)
        let received = try database.storeInlineBodies(of: document)
        try draft.take(document, received: received, keepingAttachmentsIfUnlisted: true)
        answer(try database.save(draft).revID.description)
    }
}

struct Remove: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete documents (each saves a tombstone).",
        discussion: "With one id, prints the tombstone's revision; with several, each id and its tombstone's revision. An id that cannot be deleted is named with the reason, the others are deleted, and the exit status is 1.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document ids.") var ids: [String]
    @Option(help: "The revision to delete (one id only); it must be current.") var rev: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func validate() throws {
        guard !ids.isEmpty else { throw ValidationError("give at least one document id") }
        guard rev == nil || ids.count == 1 else { throw ValidationError("--rev names the revision of one document: give one id with it") }
    }

    func execute() throws {
        let database = try db.open()
        var failed = 0
        for id in ids {
            do {
                if DocumentID.isLocal(id) {
                    try database.deleteLocalDocument(id, rev: rev)
                    continue
                }
                let tombstone = try database.deleteDocument(id, revID: rev.map(RevisionID.parse)).revID.description
                Output.line(ids.count == 1 ? tombstone : "\(List.printable(id))\t\(tombstone)")
            } catch where ids.count > 1 {
                Output.error("\(List.printable(id)): \(error)")
                failed += 1
            }
        }
        if failed > 0 { throw SofaError.invalidArgument("\(counted(failed, "document")) of \(ids.count) not deleted") }
    }
}

struct Revs: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Show a document's revision tree; the winner and conflicts are marked.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func execute() throws {
        let couchbaseLite = try db.couchbaseLite()
        let tree = try couchbaseLite?.revisionTree(of: id) ?? db.open().revisionTree(of: id)
        // Couchbase Lite's current revision is its own until the app resolves a conflict.
        let winner = try couchbaseLite?.currentRevision(of: id) ?? tree.winner?.id
        let conflicts = Set(tree.leaves.filter { !$0.deleted && $0.id != winner }.map(\.id))
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
    @Flag(help: "Print JSON: {\"ok\": …, \"problems\": […]} (the exit status is the same).") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func execute() throws {
        let problems = try db.open().check()
        if json {
            Output.json(["ok": .bool(problems.isEmpty), "problems": .array(problems.map { .string($0) })])
        } else {
            for problem in problems { Output.line(problem) }
        }
        guard problems.isEmpty else {
            Output.error(counted(problems.count, "problem") + " found")
            throw ExitCode(1)  // the answer is printed already, JSON or not
        }
        if !json { Output.line("ok") }
    }
}

struct Rekey: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Give an encrypted database a new key file or passphrase.",
        discussion: """
            The current key is given as every command takes it (--key-file, --key-fd, or the terminal); the new one \
            with --new-key-file PATH (made with a new random key if it does not exist; with --new-passphrase, a file \
            whose first line is the passphrase) or --new-passphrase alone (asked twice on the terminal). Only key.json \
            is rewritten, by an atomic rename: a kill at any moment leaves the old key or the new one working. \
            Copies and snapshots made before keep the key they had.
            """)

    @OptionGroup var db: DatabaseArgument
    @Option(help: "The new key file (created with a random key if missing), or with --new-passphrase a file holding it.")
    var newKeyFile: String?
    @Flag(help: "Unlock with a passphrase from now on.") var newPassphrase = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        guard let unlock = try Database.encryptionUnlock(at: db.database) else {
            throw SofaError.invalidArgument("\(db.database) is not encrypted: nothing to re-key")
        }
        guard let current = try KeyOptions.secret(for: db.database, unlock: unlock, confirming: false) else {
            throw SofaError.keyRejected(path: db.database, reason: "no current key given (--key-file, --key-fd, or a terminal)")
        }
        let newUnlock: KeyUnlock = newPassphrase ? .passphrase : .keyFile
        var madeKeyFile = false
        if newUnlock == .keyFile {
            guard let newKeyFile else { throw SofaError.invalidArgument("give the new key as --new-key-file PATH, or --new-passphrase") }
            if access(newKeyFile, F_OK) != 0 {
                try KeyOptions.writeNewKeyFile(at: newKeyFile)
                madeKeyFile = true
            }
        }
        guard let new = try KeyOptions.newSecret(from: newKeyFile, unlock: newUnlock, for: db.database) else {
            throw SofaError.invalidArgument("--new-passphrase needs a terminal to ask on, or --new-key-file holding the passphrase")
        }
        try Database.rekey(at: db.database, current: current, to: new, unlock: newUnlock)
        if madeKeyFile {
            Output.error("a new key was written to \(newKeyFile ?? ""): keep it safe; the old key no longer opens the database")
        }
        Output.line("re-keyed \(db.database): it opens with the new \(newUnlock == .passphrase ? "passphrase" : "key file") only")
    }
}

struct Encrypt: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Encrypt a plain database in place.",
        discussion: """
            With --key-file PATH (made with a new random key if it does not exist) or --passphrase (asked twice on the \
            terminal, or read from --key-file or --key-fd). The database is rewritten beside itself and swapped in with \
            one atomic rename: a kill at any moment leaves the plain database or the encrypted one. It must not be \
            open in another process (a mount, a server). Partial downloads are dropped; bodies are kept.
            """)

    @OptionGroup var db: DatabaseArgument
    @Flag(help: "Unlock it with a passphrase rather than a key file.") var passphrase = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        guard try Database.encryptionUnlock(at: db.database) == nil else { throw SofaError.invalidArgument("\(db.database) is encrypted already") }
        let key = try KeyOptions.newDatabaseKey(for: db.database, encrypt: true, passphrase: passphrase)
        try Database.convert(at: db.database, current: nil, to: key)
        Output.line("encrypted \(db.database)")
    }
}

struct Decrypt: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Remove the encryption of a database in place.",
        discussion: """
            Its key is given as every command takes it. The database is rewritten beside itself and swapped in with one \
            atomic rename: a kill at any moment leaves the encrypted database or the plain one. It must not be open in \
            another process.
            """)

    @OptionGroup var db: DatabaseArgument
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        guard let unlock = try Database.encryptionUnlock(at: db.database) else {
            throw SofaError.invalidArgument("\(db.database) is not encrypted")
        }
        guard let secret = try KeyOptions.secret(for: db.database, unlock: unlock, confirming: false) else {
            throw SofaError.keyRejected(path: db.database, reason: "no key given (--key-file, --key-fd, or a terminal)")
        }
        try Database.convert(at: db.database, current: secret, to: nil)
        Output.line("decrypted \(db.database): its files now hold plaintext")
    }
}

struct Compact: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Drop old revision bodies, delete unreferenced blobs and vacuum.",
        discussion: "Metadata of attachments whose bodies are not downloaded is always kept.")

    @OptionGroup var db: DatabaseArgument
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }
    @Flag(help: "Say what would be dropped and freed; change nothing.") var dryRun = false

    func execute() throws {
        // Alone in this process; compact() checks for other processes itself.
        let report = try db.open().compact(alone: true, dryRun: dryRun)
        if json {
            Output.json(["dry_run": .bool(dryRun), "revisions_pruned": .integer(Int64(report.revisionsPruned)),
                         "bodies_dropped": .integer(Int64(report.bodiesDropped)),
                         "blobs_deleted": .integer(Int64(report.blobsDeleted)),
                         "blob_bytes_freed": .integer(report.blobBytesFreed),
                         "recent_blobs_kept": .integer(Int64(report.recentBlobsKept)),
                         "shared_with_other_processes": .bool(report.sharedWithOtherProcesses),
                         "temporary_bytes_freed": .integer(report.temporaryBytesFreed),
                         "database_bytes_before": .integer(report.databaseBytesBefore),
                         "database_bytes_after": .integer(report.databaseBytesAfter),
                         "bytes_freed": .integer(report.bytesFreed)])
            return
        }
        if dryRun { Output.line("Dry run: nothing was changed; this is what compaction would do.") }
        Output.line("""
            Revisions pruned: \(report.revisionsPruned)
            Bodies dropped:   \(report.bodiesDropped)
            Blobs deleted:    \(report.blobsDeleted) (\(formatBytes(report.blobBytesFreed)))\(report.recentBlobsKept > 0
                ? "; \(counted(report.recentBlobsKept, "unreferenced blob")) younger than \(Int(Tuning.blobGracePeriod / 60)) minutes kept: "
                    + "another process has the database open (a mount, a server?) and may be about to use them; "
                    + "compact again when it has closed it" : "")
            Temporary files:  \(formatBytes(report.temporaryBytesFreed))
            SQLite file:      \(formatBytes(report.databaseBytesBefore)) -> \(formatBytes(report.databaseBytesAfter))
            Freed in all:     \(formatBytes(report.bytesFreed))
            """)
    }
}
