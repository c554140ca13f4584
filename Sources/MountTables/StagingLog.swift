import DocumentModel
import DocumentStore
import Foundation
import Logging

/// A mount's staged files, one record a closed file, in a file of its own: what `stage` into
/// `staged_attachments` does, without a SQLite transaction at each `close`.
///
/// A program writing thousands of files into one document (`cp -r`, `tar x`, `rsync`) closes
/// one every few hundred microseconds, and a SQLite commit took ~70 of them (its BEGIN, the row
/// and its index, the write-ahead log, the checkpoint every few hundred commits). A record here
/// is one `pwrite` into the page cache: as safe against a killed mount as the commit was (a
/// commit does not fsync either; the fold syncs bodies and revision together), and a power loss
/// tears at most the last records, which the frame's CRC tells (`StagingLogFiles`).
///
/// The records:
/// - a staged file (its body is already in the blob store): its blob key first, then its seq,
///   the seq of the record it replaces (a rename of a staged file, rsync's temporary name taking
///   its own), document, name, type, length, the digest the name had and the revision the
///   writer began from, its times and mode as the mount shows them, and names whose times and
///   mode go (the name it was renamed from);
/// - new times or a mode given to a staged file (`utimensat`, `chmod` after the close: `tar`,
///   `rsync`).
///
/// The fold saves a burst's files as one revision and, in the same transaction, writes their
/// times and modes into `local_attributes` and their seqs into `staging_log_folds`: so a file is
/// in a revision or in the log's unfolded records, never both or neither. Once nothing here is
/// unfolded, the file is emptied and its `staging_log_folds` rows go; the unmount removes it.
///
/// A log whose mount stopped (killed, crashed: its `flock` is free) is read by the next mount
/// of the database: its unfolded records become `staged_attachments` rows in one transaction
/// that also marks them folded here (so a kill between that and the log's removal imports
/// nothing twice), and that mount folds them as any stopped mount's rows.
///
/// Encrypted databases keep their staged files in SQLite: a log would name documents and files
/// in clear.
///
/// Invariants (under `lock`, which is taken before the database's write lock, never after):
/// - `live` holds every record of the file that is neither folded nor replaced, and `byName`
///   the seq of each (document, name) in `live`.
/// - `size` is where the next record goes: every record before it was written whole.
public final class StagingLog: @unchecked Sendable {
    /// The file's name (`PID-TOKEN.log`), which `StagedAttachment.log` and `staging_log_folds` name.
    public let name: String
    let path: String
    let database: Database
    private let lock = NSLock()
    private var fd: Int32 = -1
    private var size: Int64 = 0
    private var nextSeq: Int64 = 1
    private var live: [Int64: Entry] = [:]
    private var byName: [NameKey: Int64] = [:]

    struct Entry {
        var staged: StagedAttachment
        /// As the mount shows them: stored in `local_attributes` by the fold.
        var attributes: LocalAttributes
        /// Names whose row of `local_attributes` goes at the fold (the names it was renamed from).
        var clears: [String]
    }

    struct NameKey: Hashable {
        let docID: String
        let name: String
    }

    static let stagedKind = StagingLogFiles.stagedFileKind
    static let attributesKind: UInt8 = 2
    private static let logger = Logger(label: "sofa.staging")

    /// A log for `database`, or nil when its staged files stay in SQLite (an encrypted database,
    /// a file opened read-only). The file is made at the first record.
    public static func make(for database: Database) -> StagingLog? {
        guard !database.isEncrypted, database.schema.has(Schema.stagingLogFolds) else { return nil }
        return StagingLog(database: database)
    }

    private init(database: Database) {
        self.database = database
        name = "\(getpid())-\(String(UInt64.random(in: 0...UInt64.max), radix: 16))\(StagingLogFiles.suffix)"
        path = "\(database.stagingLogDirectory)/\(name)"
    }

    deinit {
        if fd >= 0 { close(fd) }
    }

    // MARK: Writing

    /// Stages a file whose body is in the blob store; `shown` are the times and mode the mount
    /// shows for it. A file of the same name staged here before is replaced.
    public func stage(_ draft: StagedAttachment.Draft, shown: LocalAttributes) throws -> StagedAttachment {
        try lock.withLock {
            let staged = StagedAttachment(seq: nextSeq, pid: getpid(), log: name, docID: draft.docID, attachment: draft.attachment.with(revpos: 0),
                                          expectedDigest: draft.expectedDigest, base: draft.base)
            try add(Entry(staged: staged, attributes: shown, clears: []), replacing: nil)
            return staged
        }
    }

    /// Stages a file staged here under another name of its document, its times and mode along;
    /// a conflict when it is no longer staged here (folded meanwhile).
    public func restage(_ staged: StagedAttachment, as newName: String, expectedDigest: String?) throws -> StagedAttachment {
        try AttachmentName.validate(newName)
        return try lock.withLock {
            guard let old = live[staged.seq], staged.log == name else {
                throw SofaError.conflict(docID: staged.docID, revID: staged.base?.description, current: "(folded)")
            }
            let moved = StagedAttachment(seq: nextSeq, pid: getpid(), log: name, docID: staged.docID,
                                         attachment: staged.attachment.with(name: newName, revpos: 0), expectedDigest: expectedDigest, base: staged.base)
            let clears = (old.clears + [staged.name]).filter { $0 != newName }
            try add(Entry(staged: moved, attributes: old.attributes, clears: clears), replacing: staged.seq)
            return moved
        }
    }

    /// Changes the times or mode of a file staged here; nil (and nothing changed) when it is not
    /// staged here any more: its row of `local_attributes` is the one to change.
    public func updateAttributes(of staged: StagedAttachment, _ change: (inout LocalAttributes) -> Void) throws -> LocalAttributes? {
        try lock.withLock {
            guard staged.log == name, var entry = live[staged.seq] else { return nil }
            change(&entry.attributes)
            var record = LogRecord(kind: Self.attributesKind)
            record.append(staged.seq)
            Self.append(entry.attributes, to: &record)
            try write(record)
            live[staged.seq] = entry
            return entry.attributes
        }
    }

    /// The times and modes of the files of document `id` staged here.
    public func attributes(in id: String) -> [String: LocalAttributes] {
        lock.withLock {
            var result: [String: LocalAttributes] = [:]
            for entry in live.values where entry.staged.docID == id { result[entry.staged.name] = entry.attributes }
            return result
        }
    }

    /// Runs `save` (the fold's transaction) with `folded`'s records marked folded and their times
    /// and modes stored in it; a conflict, and nothing saved, when one of them is no longer staged
    /// here (renamed or staged again meanwhile: the caller looks again).
    func fold<T>(_ folded: [StagedAttachment], _ save: (SQLiteConnection) throws -> T) throws -> T {
        try lock.withLock {
            let entries = try folded.map { staged in
                guard staged.log == name, let entry = live[staged.seq] else {
                    throw SofaError.conflict(docID: staged.docID, revID: nil, current: "(staged file \(staged.seq) gone)")
                }
                return entry
            }
            let result = try database.write { connection in
                let result = try save(connection)
                let foldedNames = Set(entries.map { NameKey(docID: $0.staged.docID, name: $0.staged.name) })
                for entry in entries {
                    try connection.run("INSERT OR IGNORE INTO staging_log_folds (log, seq) VALUES (?, ?)", .text(name), .integer(entry.staged.seq))
                    for cleared in entry.clears where !foldedNames.contains(NameKey(docID: entry.staged.docID, name: cleared)) {
                        try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(entry.staged.docID), .text(cleared))
                    }
                }
                for entry in entries { try Database.store(entry.attributes, docID: entry.staged.docID, name: entry.staged.name, in: connection) }
                return result
            }
            for entry in entries { remove(entry.staged) }
            if live.isEmpty, size > 0 { empty() }
            return result
        }
    }

    /// The mount ends: the file goes when everything it held is folded; otherwise it stays for
    /// the next mount (its lock is let go).
    public func finish() {
        lock.withLock {
            guard fd >= 0 else { return }
            if live.isEmpty {
                unlink(path)
                forgetFolds()
            }
            close(fd)
            fd = -1
        }
    }

    private func add(_ entry: Entry, replacing replaced: Int64?) throws {
        var record = LogRecord(kind: Self.stagedKind)
        let staged = entry.staged
        record.append(staged.attachment.blobKey?.hex ?? "")
        record.append(staged.seq)
        record.append(replaced)
        record.append(staged.docID)
        record.append(staged.name)
        record.append(staged.attachment.contentType)
        record.append(staged.attachment.length)
        record.append(staged.expectedDigest)
        record.append(staged.base?.description)
        Self.append(entry.attributes, to: &record)
        record.append(Int64(entry.clears.count))
        for cleared in entry.clears { record.append(cleared) }
        try write(record)
        nextSeq += 1
        if let replaced, let old = live[replaced] { remove(old.staged) }
        if let earlier = byName[NameKey(docID: staged.docID, name: staged.name)], let old = live[earlier] { remove(old.staged) }
        live[staged.seq] = entry
        byName[NameKey(docID: staged.docID, name: staged.name)] = staged.seq
    }

    private func remove(_ staged: StagedAttachment) {
        live[staged.seq] = nil
        let key = NameKey(docID: staged.docID, name: staged.name)
        if byName[key] == staged.seq { byName[key] = nil }
    }

    private func write(_ record: LogRecord) throws {
        if fd < 0 { try create() }
        let framed = StagingLogFiles.frame(record.bytes)
        let written = framed.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(size)) }
        guard written == framed.count else {
            // What was written of it lies past `size`: the next record goes over it.
            throw SofaError.system("write", path: path, errno: written < 0 ? errno : ENOSPC)
        }
        size += Int64(written)
    }

    private func create() throws {
        let directory = database.stagingLogDirectory
        guard mkdir(directory, 0o755) == 0 || errno == EEXIST else { throw SofaError.system("create directory", path: directory, errno: errno) }
        let opened = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard opened >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        guard flock(opened, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(opened)
            unlink(path)
            throw SofaError.system("lock", path: path, errno: code)
        }
        fd = opened
    }

    /// Nothing unfolded is left: the records go, and then their marks (a kill in between leaves
    /// marks of records that are gone, which name nothing).
    private func empty() {
        guard ftruncate(fd, 0) == 0 else { return }  // kept whole; emptied at a later fold or removed at the end
        size = 0
        forgetFolds()
    }

    private func forgetFolds() {
        do {
            try database.write { try $0.run("DELETE FROM staging_log_folds WHERE log = ?", .text(name)) }
        } catch {
            Self.logger.warning("\(path): rows of records already saved were not forgotten: \(error); they name nothing")
        }
    }

    // MARK: Reading

    /// What the log at `path` holds that no revision does: each name's latest staged file, less
    /// those `folded`, oldest first.
    static func unfolded(at path: String, folded: Set<Int64>) -> [Entry] {
        let fileName = (path as NSString).lastPathComponent
        let pid = pid_t(fileName.prefix { $0 != "-" }) ?? 0
        var entries: [Int64: Entry] = [:]
        var byName: [NameKey: Int64] = [:]
        for payload in StagingLogFiles.payloads(StagingLogFiles.contents(of: path)) {
            var reader = LogRecord.Reader(payload)
            do {
                switch try reader.byte() {
                case stagedKind:
                    let hex = try reader.string(), seq = try reader.int64(), replaced = try reader.optionalInt64()
                    let docID = try reader.string(), name = try reader.string(), contentType = try reader.string(), length = try reader.int64()
                    let expectedDigest = try reader.optionalString(), base = try reader.optionalString().map(Database.revisionID)
                    let attributes = try readAttributes(&reader)
                    let clears = try (0..<max(0, try reader.int64())).map { _ in try reader.string() }
                    guard let key = BlobKey(hex: hex) else { continue }
                    let attachment = Attachment(name: name, contentType: contentType, length: length, digest: key.digestString, blobKey: key,
                                                revpos: 0, contentAvailable: true)
                    let staged = StagedAttachment(seq: seq, pid: pid, log: fileName, docID: docID, attachment: attachment,
                                                  expectedDigest: expectedDigest, base: base)
                    if let replaced { entries[replaced] = nil }
                    let nameKey = NameKey(docID: docID, name: name)
                    if let earlier = byName[nameKey] { entries[earlier] = nil }
                    entries[seq] = Entry(staged: staged, attributes: attributes, clears: clears)
                    byName[nameKey] = seq
                case attributesKind:
                    let seq = try reader.int64(), attributes = try readAttributes(&reader)
                    entries[seq]?.attributes = attributes
                default:
                    continue  // a kind from a later version: not this one's to read
                }
            } catch {
                continue  // shorter than its fields: written by something else; passed over
            }
        }
        return entries.values.filter { !folded.contains($0.staged.seq) }.sorted { $0.staged.seq < $1.staged.seq }
    }

    /// The seqs marked folded in the log named `name`.
    static func folds(of name: String, in connection: SQLiteConnection) throws -> Set<Int64> {
        Set(try connection.query("SELECT seq FROM staging_log_folds WHERE log = ?", .text(name)) { $0.int64(0) })
    }

    /// Takes in the logs of mounts that stopped (their lock is free) as `staged_attachments`
    /// rows, and removes them; returns the rows' seqs. `except`: this mount's own log.
    public static func importStopped(into database: Database, except own: String?) throws -> Set<Int64> {
        guard database.schema.has(Schema.stagingLogFolds) else { return [] }
        var imported = Set<Int64>()
        for path in StagingLogFiles.paths(in: database.stagingLogDirectory) {
            let fileName = (path as NSString).lastPathComponent
            guard fileName != own else { continue }
            let fd = open(path, O_RDWR | O_CLOEXEC)
            guard fd >= 0 else { continue }  // removed meanwhile by another mount taking it in
            defer { close(fd) }
            var info = stat()
            // Still written by its mount; or taken in and removed by another one while this waited.
            guard flock(fd, LOCK_EX | LOCK_NB) == 0, fstat(fd, &info) == 0, info.st_nlink > 0 else { continue }
            try database.write { connection in
                let entries = unfolded(at: path, folded: try folds(of: fileName, in: connection))
                for entry in entries {
                    let staged = entry.staged
                    guard let key = staged.attachment.blobKey else { continue }
                    imported.insert(try Database.insertStaged(staged.attachment, key: key, docID: staged.docID, expectedDigest: staged.expectedDigest,
                                                              base: staged.base, pid: staged.pid, in: connection))
                    for cleared in entry.clears {
                        try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(staged.docID), .text(cleared))
                    }
                    try Database.store(entry.attributes, docID: staged.docID, name: staged.name, in: connection)
                    try connection.run("INSERT OR IGNORE INTO staging_log_folds (log, seq) VALUES (?, ?)", .text(fileName), .integer(staged.seq))
                }
            }
            unlink(path)
            try database.write { try $0.run("DELETE FROM staging_log_folds WHERE log = ?", .text(fileName)) }
        }
        return imported
    }

    // MARK: Attributes in records

    static func append(_ attributes: LocalAttributes, to record: inout LogRecord) {
        record.append(attributes.digest)
        record.append(attributes.modified)
        record.append(attributes.accessed)
        record.append(attributes.mode.map { Int64($0) })
    }

    static func readAttributes(_ reader: inout LogRecord.Reader) throws -> LocalAttributes {
        LocalAttributes(digest: try reader.optionalString(), modified: try reader.optionalInt64(), accessed: try reader.optionalInt64(),
                        mode: try reader.optionalInt64().map { UInt32(truncatingIfNeeded: $0) })
    }
}
