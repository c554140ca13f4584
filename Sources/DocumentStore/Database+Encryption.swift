import CLinux
import DocumentModel
import Foundation

// `sofa encrypt` and `sofa decrypt`: a database rewritten in the other form beside itself,
// then swapped in with one atomic exchange of the two folders (renameat2 RENAME_EXCHANGE), so a
// kill at any moment leaves the original, or the rewritten one, under the database's name.
// Re-keying (`rekey`) rewrites only key.json (Database.swift).

extension Database {
    /// Rewrites the database at `path` encrypted under `target` (a new random data key wrapped
    /// by the secret), or plain when `target` is nil. `current` opens it if it is encrypted.
    /// The database keeps its identity, documents, checkpoints and bodies (those here: partial
    /// downloads are dropped and fetched again); it must not be open in another process.
    public static func convert(at path: String, current: DatabaseSecret?, to target: (DatabaseSecret, KeyUnlock)?) throws {
        let path = normalize(path)
        let stage: String
        do {
            let source = try Database.open(at: path, secret: current, unlocked: nil)
            guard source.isEncrypted != (target != nil) else {
                throw SofaError.invalidArgument("\(path) is \(source.isEncrypted ? "encrypted" : "not encrypted") already")
            }
            guard !source.isReadOnly else { throw SofaError.readOnlyFileSystem(path: path) }
            stage = try source.withOtherProcessesExcluded { alone -> String in
                guard alone else {
                    throw SofaError.invalidArgument("\(path) is open in another process (a mount, a server, a replication): stop it first")
                }
                if let work = try source.read({ try source.schema.unfinishedWork(in: $0, folder: source.path) }).first {
                    throw SofaError.invalidArgument("\(path) has \(work): mount it once to save them, then try again")
                }
                return try source.writeConverted(to: target)
            }
        }
        // Everything of the source is closed now. One atomic exchange, then the old folder goes.
        guard renameat2(AT_FDCWD, stage, AT_FDCWD, path, 2 /* RENAME_EXCHANGE */) == 0 else {
            let code = errno
            try? FileManager.default.removeItem(atPath: stage)  // the original is untouched; this is the half that failed
            throw SofaError.system("exchange \(stage) with", path: path, errno: code)
        }
        let parent = (path as NSString).deletingLastPathComponent
        let folder = Glibc.open(parent.isEmpty ? "." : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 { fsync(folder); Glibc.close(folder) }
        try? FileManager.default.removeItem(atPath: stage)  // the old form; StagedDirectory.removeAbandoned takes what stays
    }

    /// Writes this database in the other form into a staging folder beside it; returns its path.
    private func writeConverted(to target: (DatabaseSecret, KeyUnlock)?) throws -> String {
        let staging = stagingLocation(for: path)
        StagedDirectory.removeAbandoned(in: staging.directory, prefix: staging.prefix)
        let stage = staging.path
        try? FileManager.default.removeItem(atPath: stage)  // a leftover of this pid's earlier run, if any
        guard mkdir(stage, 0o755) == 0 else { throw SofaError.system("create directory", path: stage, errno: errno) }
        do {
            let keys = try target.map { try DatabaseKey.makeNew(in: stage, wrappedWith: $0.0, unlock: $0.1) }
            let blobs = BlobStore(directory: "\(stage)/\(Database.attachmentsDirectoryName)", key: keys)
            try blobs.createDirectories()
            do {  // the connections close before the folder moves
                let pages = try keys.map { try SealedPages(key: $0.pages) }
                let copy = try SQLiteConnection(path: "\(stage)/\(Database.databaseFileName)", create: true, sealed: pages)
                try Schema.configure(copy)
                try copyRows(into: copy)
                try copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                let problems = try copy.query("PRAGMA integrity_check") { $0.text(0) }.filter { $0 != "ok" }
                guard problems.isEmpty else { throw SofaError.notADatabase(path: stage, reason: problems.prefix(3).joined(separator: "; ")) }
                // Every body the revisions or other parts' rows (a mount's staged saves) refer to, read here and written there.
                var keysToCopy = Set(try Database.referencedBlobKeys(in: copy))
                keysToCopy.formUnion(try schema.heldBlobKeys(in: copy, folder: stage).compactMap(BlobKey.init(hex:)))
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
                defer { buffer.deallocate() }
                for key in keysToCopy.sorted() where self.blobs.contains(key) {
                    let reader = try self.blobs.openReader(key)
                    let writer = try blobs.makeWriter()
                    while case let count = try reader.read(into: buffer), count > 0 {
                        try writer.write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
                    }
                    _ = try writer.finish(expecting: key, durable: false)
                }
            }
            // The mount's scratch files (an editor's, saved queries): sealed or opened as the rest.
            try ScratchFolder(database: self).copyAll(to: ScratchFolder(root: "\(stage)/scratch", key: keys)) {
                try read { try $0.query("SELECT doc_id FROM docs") { $0.text(0) } }
            }
            try syncFileSystem(of: stage)
            return stage
        } catch {
            try? FileManager.default.removeItem(atPath: stage)  // the original is untouched
            throw error
        }
    }

    /// Copies the schema and every row of this database into the empty `target`, attached to
    /// it under the VFS this one is read through (the sealed one, or the plain unix VFS).
    private func copyRows(into target: SQLiteConnection) throws {
        let vfs = sealedPages?.vfsName ?? "unix"
        let uri = "file:" + databaseFilePath.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)! + "?mode=ro&vfs=" + vfs
        try target.run("ATTACH DATABASE ? AS source", .text(uri))
        defer { try? target.execute("DETACH DATABASE source") }  // the connection closes right after in any case
        let version = try target.query("PRAGMA source.user_version") { $0.int(0) }[0]
        let objects = try target.query("""
            SELECT type, name, sql FROM source.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%'
            ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, rowid
            """) { (type: $0.text(0), name: $0.text(1), sql: $0.text(2)) }
        try target.execute("BEGIN IMMEDIATE")
        do {
            for object in objects where object.type == "table" { try target.execute(object.sql) }
            for object in objects where object.type == "table" {
                let name = "\"" + object.name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                try target.execute("INSERT INTO main.\(name) SELECT * FROM source.\(name)")
            }
            let sequences = try target.query("SELECT name FROM source.sqlite_master WHERE name = 'sqlite_sequence'") { $0.text(0) }
            if !sequences.isEmpty {
                try target.execute("DELETE FROM main.sqlite_sequence; INSERT INTO main.sqlite_sequence SELECT * FROM source.sqlite_sequence")
            }
            for object in objects where object.type != "table" { try target.execute(object.sql) }
            try target.execute("PRAGMA main.user_version = \(version)")
            try target.execute("COMMIT")
        } catch {
            try? target.execute("ROLLBACK")  // the error thrown below is the one that matters
            throw error
        }
    }
}

