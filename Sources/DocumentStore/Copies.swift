import CLinux
import DocumentModel
import Foundation
import ZIPFoundation

// Copies of a database: `copy(to:)` beside it, `writeSnapshot(to:)` into a zip to ship, and
// `install(snapshot:at:)` from such a zip. Every copy is built in a hidden staging directory
// next to its destination and renamed into place once complete and synced, so a failure or a
// killed process never leaves a half-made database under the destination's name.

extension Database {
    /// The private UUIDs this database had before it was copied, newest first: a copy's
    /// replications find the checkpoints its originals left (`Database.copy(to:)`). A failed
    /// read is passed up: read as "none", a replication would start again from the beginning.
    public var previousPrivateUUIDs: [String] {
        get throws {
            let text = try read { connection in
                try connection.query("SELECT value FROM meta WHERE key = 'previous_private_uuids'") { $0.text(0) }.first
            }
            guard let text else { return [] }
            guard let list = try JSONParser.parse(Array(text.utf8)).arrayValue else {
                throw SofaError.notADatabase(path: path, reason: "previous_private_uuids is not a JSON array")
            }
            return list.compactMap(\.stringValue)
        }
    }

    /// A consistent copy at `destination` with new public and private UUIDs that remembers
    /// this database's private UUID (and its predecessors), so its first pull resumes from
    /// the checkpoints this one left instead of starting over. The SQLite file is copied
    /// with `VACUUM INTO` (one snapshot, while others write); the blobs that snapshot
    /// refers to are hard-linked where the file system allows, copied otherwise.
    /// `replacing` allows an existing database at `destination` to be replaced.
    public func copy(to destination: String, replacing: Bool = false) throws -> Database {
        let stage = try StagedDirectory(for: destination, replacing: replacing)
        do {
            // An encrypted database's copy keeps its key (the same key.json): the pre-built flow.
            if isEncrypted { try copyFile(KeyFile.path(in: path), to: KeyFile.path(in: stage.path)) }
            let target = BlobStore(directory: "\(stage.path)/\(Database.attachmentsDirectoryName)", key: encryption)
            try target.createDirectories()
            let file = "\(stage.path)/\(Database.databaseFileName)"
            try vacuum(into: file)
            do {  // the connection closes before the directory moves
                let copy = try SQLiteConnection(path: file, create: false, sealed: sealedPages)
                try Database.keepJournalInMemoryUntilWAL(copy)
                for key in try Database.referencedBlobKeys(in: copy) where blobs.contains(key) {
                    let from = blobs.path(for: key), to = target.path(for: key)
                    guard link(from, to) != 0 else { continue }
                    guard errno == EXDEV || errno == EPERM || errno == EMLINK else { throw SofaError.system("link", path: to, errno: errno) }
                    _ = try target.write(contentsOf: from, expecting: key, durable: false)
                }
                try Database.renewIdentity(copy)
                try copy.execute("PRAGMA journal_mode = WAL")
            }
            return try stage.install(unlocked: encryption)
        } catch {
            stage.discard()
            throw error
        }
    }

    /// Writes a consistent snapshot of this database into a new zip at `path`: the SQLite
    /// file (one `VACUUM INTO` snapshot, deflated) and the blobs it refers to, under
    /// `NAME.sofa/`. It keeps this database's identity and checkpoints; `install(snapshot:at:)`
    /// gives each installed copy its own identity. Bodies that are not here (deferred) stay
    /// metadata only. Text-like bodies are deflated, others stored as they are.
    /// `zip64Threshold` is for tests: ZIP64 records for sizes and offsets from there on.
    public func writeSnapshot(to path: String, replacing: Bool = false, zip64Threshold: UInt64 = 0xFFFF_FFFF,
                              progress: ((_ done: Int64, _ total: Int64) -> Void)? = nil) throws -> SnapshotReport {
        let output = Database.normalize(path)
        if !replacing, access(output, F_OK) == 0 { throw SofaError.databaseExists(path: output) }
        let staging = stagingLocation(for: output)
        StagedDirectory.removeAbandoned(in: staging.directory, prefix: staging.prefix)
        let partial = staging.path
        let vacuumed = partial + ".sqlite3"
        defer { unlink(vacuumed) }
        do {
            try vacuum(into: vacuumed)
            let snapshot = try SQLiteConnection(path: vacuumed, create: false, sealed: sealedPages)
            var bodies: [(key: BlobKey, compress: Bool, size: Int64)] = []
            var report = SnapshotReport(path: output)
            try snapshot.forEach("""
                SELECT blob_key, MAX(content_type) FROM rev_attachments GROUP BY COALESCE(blob_key, digest)
                """) { row in
                var info = stat()
                guard let key = row.optionalText(0).flatMap(BlobKey.init(hex:)), stat(blobs.path(for: key), &info) == 0 else {
                    report.bodiesNotPresent += 1
                    return
                }
                bodies.append((key, MIMEType.isCompressible(row.text(1)), Int64(info.st_size)))
            }
            report.documentCount = try snapshot.query("SELECT COUNT(*) FROM docs WHERE deleted = 0") { $0.int(0) }[0]
            report.privateUUID = try snapshot.query("SELECT value FROM meta WHERE key = 'private_uuid'") { $0.text(0) }[0]
            unlink(partial)
            let zip = try ZipWriter(path: partial, zip64Threshold: zip64Threshold)
            let root = "\(Database.baseName(of: self.path)).sofa/"
            var databaseInfo = stat()
            stat(vacuumed, &databaseInfo)
            let total = Int64(databaseInfo.st_size) + bodies.reduce(0) { $0 + $1.size }
            if isEncrypted { try zip.add(root + KeyFile.fileName, contentsOf: KeyFile.path(in: self.path), compress: false) }
            try zip.add(root + Database.databaseFileName, contentsOf: vacuumed, compress: !isEncrypted)
            var done = Int64(databaseInfo.st_size)
            progress?(done, total)
            for body in bodies {
                do {
                    try zip.add("\(root)\(Database.attachmentsDirectoryName)/\(blobs.fileName(for: body.key))",
                                contentsOf: blobs.path(for: body.key), compress: body.compress && !isEncrypted)
                    report.bodyCount += 1
                    report.bodyBytes += body.size
                } catch SofaError.io("open", _, ENOENT) {
                    // Compacted away since the snapshot was taken (a later revision dropped it):
                    // the installed copy fetches it when read, like any deferred body.
                    report.bodiesNotPresent += 1
                }
                done += body.size
                progress?(done, total)
            }
            try zip.finish()
            guard rename(partial, output) == 0 else { throw SofaError.system("rename", path: output, errno: errno) }
            var zipInfo = stat()
            if stat(output, &zipInfo) == 0 { report.zipBytes = Int64(zipInfo.st_size) }
            return report
        } catch {
            unlink(partial)
            throw Database.describeZipError(error, path: output)
        }
    }

    /// Unpacks a snapshot zip (as `writeSnapshot` makes, or any zip of a database folder)
    /// into a new database at `destination`: every entry is checked (paths stay inside the
    /// database, bodies hash to their names, CRCs match, the SQLite file passes its
    /// integrity check), then it gets a new identity that remembers the snapshot's, as
    /// `copy(to:)` gives.
    /// `progress` is told the bytes unpacked so far and the total.
    public static func install(snapshot zip: String, at destination: String, replacing: Bool = false,
                               progress: ((_ done: Int64, _ total: Int64) -> Void)? = nil) throws -> Database {
        let archive: Archive
        do {
            archive = try Archive(url: URL(fileURLWithPath: zip), accessMode: .read)
        } catch {
            var info = stat()
            guard stat(zip, &info) == 0 else { throw SofaError.system("open", path: zip, errno: errno) }
            throw SofaError.notADatabase(path: zip, reason: "it is not a zip archive, or it is truncated")
        }
        let entries = Array(archive)
        let roots = entries.filter { $0.type == .file && ($0.path as NSString).lastPathComponent == databaseFileName }
            .map { String($0.path.dropLast(databaseFileName.count)) }
        guard roots.count == 1, let root = roots.first else {
            throw SofaError.notADatabase(path: zip, reason: roots.isEmpty
                ? "the archive holds no \(databaseFileName)" : "the archive holds \(roots.count) databases")
        }
        let stage = try StagedDirectory(for: destination, replacing: replacing)
        // An encrypted database's snapshot carries its key.json: installed with the same key.
        var encryption: DatabaseKey?
        if let keyEntry = entries.first(where: { $0.type == .file && $0.path == root + KeyFile.fileName }) {
            do {
                try extract(keyEntry, from: archive, toFile: KeyFile.path(in: stage.path), unpacked: { _ in })
                encryption = try unlock(stage.path, secret: nil)
            } catch {
                stage.discard()
                throw error
            }
        }
        let total = entries.reduce(Int64(0)) { $0 + Int64(clamping: $1.uncompressedSize) }
        var done: Int64 = 0
        let unpacked = { (count: Int) in
            done += Int64(count)
            progress?(done, total)
        }
        do {
            let blobs = BlobStore(directory: "\(stage.path)/\(attachmentsDirectoryName)", key: encryption)
            try blobs.createDirectories()
            for entry in entries where entry.type != .directory {
                guard entry.path.hasPrefix(root) else {
                    throw SofaError.notADatabase(path: zip, reason: "\(entry.path) lies outside the database folder \(root)")
                }
                let relative = String(entry.path.dropFirst(root.count))
                guard entry.type == .file else { throw SofaError.notADatabase(path: zip, reason: "\(entry.path) is not a regular file") }
                if relative == KeyFile.fileName && encryption != nil {
                    continue  // unpacked first
                } else if encryption != nil, relative.hasPrefix("\(attachmentsDirectoryName)/"), !relative.hasPrefix("\(attachmentsDirectoryName)/tmp/"),
                          relative.hasSuffix(BlobStore.fileSuffix), BlobKey(hex: String(relative.dropFirst(attachmentsDirectoryName.count + 1).dropLast(5))) != nil {
                    // Sealed, under a keyed name: checked below, once the SQLite file says which bodies these are.
                    try extract(entry, from: archive, toFile: "\(stage.path)/\(relative)", unpacked: unpacked)
                } else if relative == databaseFileName || relative == databaseFileName + "-wal" {
                    try extract(entry, from: archive, toFile: "\(stage.path)/\(relative)", unpacked: unpacked)
                } else if relative.hasPrefix("\(attachmentsDirectoryName)/tmp/") || relative.hasSuffix("-shm") {
                    continue  // another process's unfinished write, or SQLite's shared memory: never needed
                } else if relative.hasPrefix("\(attachmentsDirectoryName)/"), relative.hasSuffix(".blob"),
                          let key = BlobKey(hex: String(relative.dropFirst(attachmentsDirectoryName.count + 1).dropLast(5))) {
                    let writer = try blobs.makeWriter()
                    _ = try archive.extract(entry, bufferSize: BlobStore.chunkSize) { data in
                        try data.withUnsafeBytes { try writer.write($0) }
                        unpacked(data.count)
                    }
                    do {
                        _ = try writer.finish(expecting: key, durable: false)
                    } catch SofaError.blobCorrupted {
                        throw SofaError.notADatabase(path: zip, reason: "\(entry.path) does not hash to its name (the zip is damaged)")
                    }
                } else {
                    throw SofaError.notADatabase(path: zip, reason: "\(entry.path) is not part of a Sofa database")
                }
            }
            do {  // the connection closes before the directory moves
                let connection = try SQLiteConnection(path: "\(stage.path)/\(databaseFileName)", create: false,
                                                      sealed: try encryption.map { try SealedPages(key: $0.pages) })
                try keepJournalInMemoryUntilWAL(connection)
                let problems: [String]
                do {
                    _ = try Schema.check(connection, path: zip, readOnly: false)
                    problems = try connection.query("PRAGMA integrity_check") { $0.text(0) }.filter { $0 != "ok" }
                } catch SofaError.sqlite(_, let message, _) {
                    throw SofaError.notADatabase(path: zip, reason: "its \(databaseFileName) is not a SQLite database (\(message))")
                }
                guard problems.isEmpty else {
                    throw SofaError.notADatabase(path: zip, reason: "its SQLite file is damaged: \(problems.prefix(3).joined(separator: "; "))")
                }
                if encryption != nil {
                    for key in try referencedBlobKeys(in: connection) where blobs.contains(key) {
                        do { try blobs.verify(key) } catch {
                            throw SofaError.notADatabase(path: zip, reason: "the body \(key.hex) is damaged in the zip (\(error))")
                        }
                    }
                }
                try renewIdentity(connection)
                try connection.execute("PRAGMA journal_mode = WAL")
                try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            }
            return try stage.install(unlocked: encryption)
        } catch {
            stage.discard()
            throw describeZipError(error, path: zip)
        }
    }

    /// The SQLite file as one consistent snapshot, written by a connection of its own
    /// (VACUUM INTO reads outside any transaction, while others write).
    private func vacuum(into file: String) throws {
        let snapshot = try SQLiteConnection(path: databaseFilePath, create: false, immutable: isReadOnly, sealed: sealedPages)
        try snapshot.run("VACUUM INTO ?", .text(file))
    }

    /// `VACUUM INTO` makes a file in rollback-journal mode. A sealed one cannot have a journal
    /// on disk (the VFS refuses its page records: docs/encryption.md), so until the copy is
    /// switched to WAL its journal is kept in memory; a copy cut short meanwhile is a staged
    /// folder that is thrown away.
    static func keepJournalInMemoryUntilWAL(_ connection: SQLiteConnection) throws {
        guard connection.sealed != nil else { return }
        try connection.execute("PRAGMA journal_mode = MEMORY")
    }

    /// The blobs the revisions in `connection`'s database refer to.
    /// Every body a kept revision uses: its attachment rows' blobs, and the blobs its properties
    /// name (a revision stored before its stand-ins were made, or whose blob has no row).
    static func referencedBlobKeys(in connection: SQLiteConnection) throws -> [BlobKey] {
        var keys = Set(try connection.query("SELECT DISTINCT blob_key FROM rev_attachments WHERE blob_key IS NOT NULL") { row in
            BlobKey(hex: row.text(0))
        }.compactMap { $0 })
        keys.formUnion(try blobKeysNamedInBodies(in: connection))
        return Array(keys)
    }

    /// The bodies the blob dictionaries of stored revision bodies name (only bodies that hold
    /// `"@type"` are parsed). A blob is a blob however the revision that holds it arrived.
    /// With `leavesOnly`, only the bodies of leaf revisions (those a compaction keeps).
    static func blobKeysNamedInBodies(in connection: SQLiteConnection, leavesOnly: Bool = false) throws -> Set<BlobKey> {
        var keys = Set<BlobKey>()
        let bodies = try connection.query("SELECT body FROM revs WHERE body IS NOT NULL AND instr(body, '\"@type\"') > 0"
                                          + (leavesOnly ? " AND leaf = 1" : "")) { $0.text(0) }
        for body in bodies {
            guard let properties = try? JSONParser.parse(Array(body.utf8)).objectValue,
                  let found = try? Blobs.find(in: properties, docID: "", lenient: true) else { continue }
            keys.formUnion(found.map(\.key))
        }
        return keys
    }

    /// New public and private UUIDs for a copied SQLite file; the old private UUID joins
    /// the front of `previous_private_uuids`, so replications can find its checkpoints. The
    /// rows of a mount's unfinished work go (`SchemaStep.forgetInCopies`): their bodies were
    /// not copied, and the original's mount finishes them there.
    static func renewIdentity(_ connection: SQLiteConnection) throws {
        try connection.execute("BEGIN IMMEDIATE")
        do {
            // A new database: what a mount of the original had not finished stays the original's.
            let steps = AppliedSchema(names: try SchemaMigrator.applied(connection, path: connection.path).names)
            for statement in steps.forgetInCopiesStatements { try connection.execute(statement) }
            let meta = Dictionary(try connection.query("SELECT key, value FROM meta") { ($0.text(0), $0.optionalText(1) ?? "") },
                                  uniquingKeysWith: { $1 })
            guard let old = meta["private_uuid"] else { throw SofaError.notADatabase(path: connection.path, reason: "its identity is missing") }
            let earlier = try meta["previous_private_uuids"].map { try JSONParser.parse(Array($0.utf8)) }?.arrayValue ?? []
            let chain = JSONValue.array([.string(old)] + earlier).jsonString()
            try connection.run("UPDATE meta SET value = ? WHERE key = 'public_uuid'", .text(Schema.newUUID()))
            try connection.run("UPDATE meta SET value = ? WHERE key = 'private_uuid'", .text(Schema.newUUID()))
            try connection.run("INSERT OR REPLACE INTO meta (key, value) VALUES ('previous_private_uuids', ?)", .text(chain))
            try connection.execute("COMMIT")
        } catch {
            try? connection.execute("ROLLBACK")  // the error thrown below is the one that matters
            throw error
        }
    }

    /// Copies a small file (key.json) byte for byte, synced.
    private func copyFile(_ from: String, to: String) throws {
        guard let data = FileManager.default.contents(atPath: from) else { throw SofaError.system("read", path: from, errno: errno) }
        let fd = Glibc.open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SofaError.system("create", path: to, errno: errno) }
        defer { close(fd) }
        try data.withUnsafeBytes { try writeFully(fd, $0, path: to) }
    }

    /// Streams one zip entry into a new file.
    private static func extract(_ entry: Entry, from archive: Archive, toFile path: String, unpacked: (Int) -> Void) throws {
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        defer { close(fd) }
        _ = try archive.extract(entry, bufferSize: BlobStore.chunkSize) { data in
            try data.withUnsafeBytes { try writeFully(fd, $0, path: path) }
            unpacked(data.count)
        }
    }

    /// ZIPFoundation's errors, said the way a user can act on.
    private static func describeZipError(_ error: Error, path: String) -> Error {
        guard let failure = error as? Archive.ArchiveError else { return error }
        switch failure {
        case .invalidCRC32: return SofaError.notADatabase(path: path, reason: "an entry fails its CRC check (the zip is damaged)")
        case .unreadableArchive, .missingEndOfCentralDirectoryRecord, .invalidLocalHeaderDataOffset,
             .invalidLocalHeaderSize, .invalidCentralDirectoryOffset, .invalidCentralDirectorySize,
             .invalidCentralDirectoryEntryCount, .invalidEntrySize, .invalidCompressionMethod:
            return SofaError.notADatabase(path: path, reason: "the zip is damaged or truncated (\(failure))")
        default: return SofaError.invalidArgument("\(path): zip error \(failure)")
        }
    }

    /// `notes` for `/x/notes.sofa`.
    static func baseName(of path: String) -> String {
        let name = (path as NSString).lastPathComponent
        return name.hasSuffix(".sofa") ? String(name.dropLast(5)) : name
    }
}

/// What `writeSnapshot` wrote.
public struct SnapshotReport: Sendable {
    public var path: String
    public var privateUUID = ""
    public var documentCount = 0
    public var bodyCount = 0
    public var bodyBytes: Int64 = 0
    /// Attachments whose bodies were deferred in the source: the snapshot has their metadata only.
    public var bodiesNotPresent = 0
    public var zipBytes: Int64 = 0
}

/// A directory built as `.NAME.partial-PID` beside `destination` and renamed to it when
/// complete. Stale staging directories of processes that no longer run are removed first.
struct StagedDirectory {
    let destination: String
    let path: String
    let replacing: Bool

    init(for destination: String, replacing: Bool) throws {
        let destination = Database.normalize(destination)
        self.destination = destination
        self.replacing = replacing
        var info = stat()
        if stat(destination, &info) == 0 {
            guard replacing else { throw SofaError.databaseExists(path: destination) }
            // Only ever replace a database, never some other folder.
            guard info.st_mode & S_IFMT == S_IFDIR, access("\(destination)/\(Database.databaseFileName)", F_OK) == 0 else {
                throw SofaError.notADatabase(path: destination, reason: "refusing to replace something that is not a database")
            }
        }
        let staging = stagingLocation(for: destination)
        StagedDirectory.removeAbandoned(in: staging.directory, prefix: staging.prefix)
        path = staging.path
        try? FileManager.default.removeItem(atPath: path)  // a leftover of this pid's earlier run, if any; mkdir says if it is in the way
        guard mkdir(path, 0o755) == 0 else { throw SofaError.system("create directory", path: path, errno: errno) }
    }

    /// Syncs what was written, renames it into place and opens it.
    func install(unlocked: DatabaseKey? = nil) throws -> Database {
        try syncFileSystem(of: path)  // every file staged on that file system
        if replacing, access(destination, F_OK) == 0 {
            let aside = path + ".replaced"
            guard rename(destination, aside) == 0 else { throw SofaError.system("rename", path: destination, errno: errno) }
            guard rename(path, destination) == 0 else {
                let code = errno
                rename(aside, destination)
                throw SofaError.system("rename", path: destination, errno: code)
            }
            try? FileManager.default.removeItem(atPath: aside)  // the new database is in place; the old one's removal can fail harmlessly
        } else {
            // rename(2) would replace an empty directory made meanwhile; link-free check instead.
            guard access(destination, F_OK) != 0 else { throw SofaError.databaseExists(path: destination) }
            guard rename(path, destination) == 0 else { throw SofaError.system("rename", path: destination, errno: errno) }
        }
        try syncFileSystem(of: stagingLocation(for: destination).directory)
        return try Database.open(at: destination, secret: nil, unlocked: unlocked)
    }

    func discard() {
        try? FileManager.default.removeItem(atPath: path)  // a failed copy's leftovers; removeAbandoned takes what stays
    }

    /// Removes what `prefix`PID names (files or folders) for processes that no longer run: a
    /// killed copy's, `encrypt`'s or `decrypt`'s half-made database (plaintext, for a decrypt).
    /// One exception: a process killed between moving the old database aside
    /// (`….partial-PID.replaced`) and renaming the new one into place left no database at
    /// `destination`; the old one goes back there instead of away.
    static func removeAbandoned(in directory: String, prefix: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }  // a sweep: nothing to sweep
        let destination = "\(directory)/\(prefix.dropFirst().dropLast(".partial-".count))"
        for name in names where name.hasPrefix(prefix) {
            let rest = name.dropFirst(prefix.count)
            guard let pid = pid_t(rest.prefix { $0.isNumber }), kill(pid, 0) != 0, errno == ESRCH else { continue }
            if name.hasSuffix(".replaced"), access(destination, F_OK) != 0, rename("\(directory)/\(name)", destination) == 0 { continue }
            try? FileManager.default.removeItem(atPath: "\(directory)/\(name)")  // tried again at the next sweep
        }
    }
}

