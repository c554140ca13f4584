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
/// The log is a run of segments, `PID-TOKEN-N.log`: a mount that writes for days without a
/// quiet moment (its oldest staged files are folded while new ones come) starts a new segment
/// past `segmentBytes`, and removes an older one once nothing in it is unfolded, so the log
/// holds about what is unfolded, not everything ever staged. A staged file's record goes into
/// the newest segment; new times for it go into its own. The segments of one mount are read
/// together (seqs run across them).
///
/// A fold does not hold the log through its transaction: files closed meanwhile are staged as
/// ever (`tar x` of 10,000 files into one document: a `close` waited 250–780 ms for a fold of
/// 6,000). The records it folds are marked `folding` until it ends; new times or a mode for one
/// of them, or its rename, wait for that end (then it is in the revision, and its row of
/// `local_attributes` takes the change), so a fold that ends never drops one given meanwhile.
/// A file staged under the name of one being folded also waits, and is refused (a conflict):
/// the digest its writer expects in the revision is the one before the fold, so its mount
/// saves it itself, on top of the fold's revision.
///
/// Invariants (under `lock`, which is taken before the database's write lock, never after):
/// - `live` holds every record that is neither folded nor replaced, and `byName` the seq of
///   each (document, name) in `live`; each segment's `live` counts those in it.
/// - `folding` holds the seqs of the records a fold is saving; each is in `live` or was
///   replaced since; nothing changes an entry of `live` whose seq is in it.
/// - A segment's `size` is where its next record goes: every record before it was written whole.
/// - Every segment but the newest has something live in it, or is removed at the next fold.
public final class StagingLog: @unchecked Sendable {
    /// The mount's log (`PID-TOKEN`), which `StagedAttachment.log` and `staging_log_folds` name.
    public let name: String
    let database: Database
    /// Guards what follows; signalled when a fold ends.
    private let lock = NSCondition()
    private var folding: Set<Int64> = []
    private var segments: [Int: Segment] = [:]
    private var newest = 0
    private var nextSeq: Int64 = 1
    private var live: [Int64: Entry] = [:]
    private var byName: [NameKey: Int64] = [:]

    /// A segment is started once the newest one holds this much (`Tuning.stagingLogSegmentBytes`).
    let segmentBytes: Int64

    struct Entry {
        var staged: StagedAttachment
        /// As the mount shows them: stored in `local_attributes` by the fold.
        var attributes: LocalAttributes
        /// Names whose row of `local_attributes` goes at the fold (the names it was renamed from).
        var clears: [String]
        /// The segment its record is in.
        var segment = 0
    }

    struct Segment {
        let path: String
        let fd: Int32
        var size: Int64 = 0
        /// Records in it that are neither folded nor replaced.
        var live = 0
        /// The seqs of the staged files' records in it.
        var seqs: ClosedRange<Int64>?
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
    public static func make(for database: Database, segmentBytes: Int64 = Tuning.stagingLogSegmentBytes) -> StagingLog? {
        guard !database.isEncrypted, database.schema.has(Schema.stagingLogFolds) else { return nil }
        return StagingLog(database: database, segmentBytes: segmentBytes)
    }

    private init(database: Database, segmentBytes: Int64) {
        self.database = database
        self.segmentBytes = segmentBytes
        name = "\(getpid())-\(String(UInt64.random(in: 0...UInt64.max), radix: 16))"
    }

    deinit {
        for segment in segments.values { close(segment.fd) }
    }

    /// The log a segment file belongs to: its name up to the segment's number.
    static func logName(ofSegment fileName: String) -> String {
        let stem = fileName.hasSuffix(StagingLogFiles.suffix) ? String(fileName.dropLast(StagingLogFiles.suffix.count)) : fileName
        guard let dash = stem.lastIndex(of: "-") else { return stem }
        return String(stem[..<dash])
    }

    // MARK: Writing

    /// Stages a file whose body is in the blob store; `shown` are the times and mode the mount
    /// shows for it. A file of the same name staged here before is replaced.
    public func stage(_ draft: StagedAttachment.Draft, shown: LocalAttributes) throws -> StagedAttachment {
        try DocumentID.validate(draft.docID)
        try AttachmentName.validate(draft.attachment.name)
        guard draft.attachment.blobKey != nil else {
            throw SofaError.invalidArgument("a staged attachment needs a body in the blob store (\(draft.attachment.name))")
        }
        return try lock.withLock {
            try waitForFold(ofName: draft.attachment.name, in: draft.docID)
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
            waitForFolds(of: [staged.seq])
            guard let old = live[staged.seq], staged.log == name else {
                throw SofaError.conflict(docID: staged.docID, revID: staged.base?.description, current: "(folded)")
            }
            try waitForFold(ofName: newName, in: staged.docID)
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
            waitForFolds(of: [staged.seq])
            guard staged.log == name, var entry = live[staged.seq] else { return nil }
            change(&entry.attributes)
            var record = LogRecord(kind: Self.attributesKind)
            record.append(staged.seq)
            Self.append(entry.attributes, to: &record)
            try write(record, into: entry.segment)
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
    /// here (renamed or staged again meanwhile: the caller looks again). The log is not held
    /// through the transaction: other files are staged meanwhile.
    func fold<T>(_ folded: [StagedAttachment], _ save: (SQLiteConnection) throws -> T) throws -> T {
        let seqs = folded.map(\.seq)
        let entries = try lock.withLock {
            // Another save folding some of them (a file's own commit beside its burst's fold): its end tells.
            waitForFolds(of: seqs)
            let entries = try folded.map { staged in
                guard staged.log == name, let entry = live[staged.seq] else {
                    throw SofaError.conflict(docID: staged.docID, revID: nil, current: "(staged file \(staged.seq) gone)")
                }
                return entry
            }
            folding.formUnion(seqs)
            return entries
        }
        // Their entries do not change until the end (`folding`): what is settled is what they hold.
        let result: T
        do {
            result = try database.write { connection in
                let result = try save(connection)
                try Self.settle(entries, of: name, in: connection)
                return result
            }
        } catch {
            endFold(seqs, saved: nil)
            throw error
        }
        endFold(seqs, saved: entries)
        return result
    }

    /// The end of a fold of records `seqs`: unmarked, and, when its transaction committed, the
    /// `saved` entries gone from the log; whoever waits for it is woken.
    private func endFold(_ seqs: [Int64], saved: [Entry]?) {
        lock.withLock {
            folding.subtract(seqs)
            if let saved {
                for entry in saved { remove(entry.staged) }
                if live.isEmpty { empty() } else { removeFoldedSegments() }
            }
            lock.broadcast()
        }
    }

    /// Waits, under `lock`, until no fold is saving any of records `seqs`.
    private func waitForFolds(of seqs: [Int64]) {
        while seqs.contains(where: folding.contains) { lock.wait() }
    }

    /// When a fold is saving the file staged as `name` of document `id`, waits for its end and
    /// answers a conflict: the writer saw that file, which is now in a revision its caller has
    /// not seen, so the digest it expects there is stale (the caller saves the file now).
    /// Without a fold under way (most closes), nothing is looked up.
    private func waitForFold(ofName name: String, in id: String) throws {
        guard !folding.isEmpty, let seq = byName[NameKey(docID: id, name: name)], folding.contains(seq) else { return }
        waitForFolds(of: [seq])
        throw SofaError.conflict(docID: id, revID: nil, current: "(\(name) folded meanwhile)")
    }

    /// The mount ends: the files go when everything they held is folded; otherwise they stay
    /// for the next mount (their locks are let go).
    public func finish() {
        lock.withLock {
            guard !segments.isEmpty else { return }
            if live.isEmpty {
                for segment in segments.values { unlink(segment.path) }
                forgetFolds()
            }
            for segment in segments.values { close(segment.fd) }
            segments = [:]
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
        if segments[newest] == nil || segments[newest]!.size >= segmentBytes { try startSegment() }
        try write(record, into: newest)
        nextSeq += 1
        if let replaced, let old = live[replaced] { remove(old.staged) }
        // One hash of the name for both: the file staged under it before goes (its `byName` is
        // already this one's, which `remove` leaves).
        if let earlier = byName.updateValue(staged.seq, forKey: NameKey(docID: staged.docID, name: staged.name)),
           let old = live[earlier] {
            remove(old.staged)
        }
        var entry = entry
        entry.segment = newest
        live[staged.seq] = entry
        segments[newest]!.live += 1
        segments[newest]!.seqs = (segments[newest]!.seqs?.lowerBound ?? staged.seq)...staged.seq
    }

    private func remove(_ staged: StagedAttachment) {
        guard let entry = live.removeValue(forKey: staged.seq) else { return }
        segments[entry.segment]?.live -= 1
        let key = NameKey(docID: staged.docID, name: staged.name)
        if byName[key] == staged.seq { byName[key] = nil }
    }

    private func write(_ record: LogRecord, into number: Int) throws {
        guard let segment = segments[number] else { throw SofaError.invalidArgument("no staging log segment \(number)") }
        let framed = StagingLogFiles.frame(record.bytes)
        let written = framed.withUnsafeBytes { pwrite(segment.fd, $0.baseAddress, $0.count, off_t(segment.size)) }
        guard written == framed.count else {
            // What was written of it lies past `size`: the next record goes over it.
            throw SofaError.system("write", path: segment.path, errno: written < 0 ? errno : ENOSPC)
        }
        segments[number]!.size += Int64(written)
    }

    private func startSegment() throws {
        let directory = database.stagingLogDirectory
        guard mkdir(directory, 0o755) == 0 || errno == EEXIST else { throw SofaError.system("create directory", path: directory, errno: errno) }
        let path = "\(directory)/\(name)-\(newest + 1)\(StagingLogFiles.suffix)"
        let opened = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard opened >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        guard flock(opened, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            close(opened)
            unlink(path)
            throw SofaError.system("lock", path: path, errno: code)
        }
        newest += 1
        segments[newest] = Segment(path: path, fd: opened)
    }

    /// Nothing unfolded is left: the older segments go and the newest is emptied, then the
    /// marks go (a kill in between leaves marks of records that are gone, which name nothing).
    private func empty() {
        for (number, segment) in segments where number != newest {
            unlink(segment.path)
            close(segment.fd)
            segments[number] = nil
        }
        guard let segment = segments[newest], segment.size > 0 else { return }
        guard ftruncate(segment.fd, 0) == 0 else { return }  // kept whole; emptied at a later fold or removed at the end
        segments[newest]!.size = 0
        segments[newest]!.seqs = nil
        forgetFolds()
    }

    /// Removes the older segments with nothing unfolded left, and then their marks.
    private func removeFoldedSegments() {
        let done = segments.filter { $0.key != newest && $0.value.live == 0 }
        guard !done.isEmpty else { return }
        for (number, segment) in done {
            unlink(segment.path)
            close(segment.fd)
            segments[number] = nil
        }
        do {
            try database.write { connection in
                for range in done.values.compactMap(\.seqs) {
                    try connection.run("DELETE FROM staging_log_folds WHERE log = ? AND seq BETWEEN ? AND ?",
                                       .text(name), .integer(range.lowerBound), .integer(range.upperBound))
                }
            }
        } catch {
            Self.logger.warning("staging log \(name): rows of records already saved were not forgotten: \(error); they name nothing")
        }
    }

    private func forgetFolds() {
        do {
            try database.write { try $0.run("DELETE FROM staging_log_folds WHERE log = ?", .text(name)) }
        } catch {
            Self.logger.warning("staging log \(name): rows of records already saved were not forgotten: \(error); they name nothing")
        }
    }

    // MARK: Reading

    /// The logs in the staging folder `directory`, each with its segments' paths in order.
    static func logs(in directory: String) throws -> [(name: String, segments: [String])] {
        var byLog: [String: [(number: Int, path: String)]] = [:]
        for path in try StagingLogFiles.paths(in: directory) {
            let fileName = (path as NSString).lastPathComponent
            let number = Int(fileName.dropLast(StagingLogFiles.suffix.count).split(separator: "-").last ?? "") ?? 0
            byLog[logName(ofSegment: fileName), default: []].append((number, path))
        }
        return byLog.sorted { $0.key < $1.key }.map { ($0.key, $0.value.sorted { $0.number < $1.number }.map(\.path)) }
    }

    /// What log `name` (its segments' paths, in order) holds that no revision does: each
    /// name's latest staged file, less those `folded`, oldest first.
    static func unfolded(log name: String, segments: [String], folded: Set<Int64>) throws -> [Entry] {
        let pid = pid_t(name.prefix { $0 != "-" }) ?? 0
        var entries: [Int64: Entry] = [:]
        var byName: [NameKey: Int64] = [:]
        for payload in try segments.flatMap({ StagingLogFiles.payloads(try StagingLogFiles.contents(of: $0)) }) {
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
                    let staged = StagedAttachment(seq: seq, pid: pid, log: name, docID: docID, attachment: attachment,
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
        for (log, paths) in try logs(in: database.stagingLogDirectory) where log != own {
            var descriptors: [Int32] = []
            defer { for fd in descriptors { close(fd) } }
            let free = paths.allSatisfy { path in
                let fd = open(path, O_RDWR | O_CLOEXEC)
                guard fd >= 0 else { return false }  // removed meanwhile by another mount taking it in
                descriptors.append(fd)
                var info = stat()
                // Still written by its mount; or taken in and removed by another one while this waited.
                return flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &info) == 0 && info.st_nlink > 0
            }
            guard free else { continue }
            try database.write { connection in
                let entries = try unfolded(log: log, segments: paths, folded: try folds(of: log, in: connection))
                for entry in entries {
                    let staged = entry.staged
                    guard let key = staged.attachment.blobKey else { continue }
                    imported.insert(try Database.insertStaged(staged.attachment, key: key, docID: staged.docID, expectedDigest: staged.expectedDigest,
                                                              base: staged.base, pid: staged.pid, in: connection))
                }
                try settle(entries, of: log, in: connection)
            }
            for path in paths { unlink(path) }
            try database.write { try $0.run("DELETE FROM staging_log_folds WHERE log = ?", .text(log)) }
        }
        return imported
    }

    /// Writes what `entries` hold for `local_attributes` (the names they were renamed from go;
    /// each file's times and mode as the mount showed them) and marks them folded in log `log`,
    /// in `connection`'s transaction: a fold's, or the one that makes a stopped mount's records rows.
    static func settle(_ entries: [Entry], of log: String, in connection: SQLiteConnection) throws {
        let stored = Set(entries.map { NameKey(docID: $0.staged.docID, name: $0.staged.name) })
        for entry in entries {
            try connection.run("INSERT OR IGNORE INTO staging_log_folds (log, seq) VALUES (?, ?)", .text(log), .integer(entry.staged.seq))
            for cleared in entry.clears where !stored.contains(NameKey(docID: entry.staged.docID, name: cleared)) {
                try connection.run("DELETE FROM local_attributes WHERE doc_id = ? AND name = ?", .text(entry.staged.docID), .text(cleared))
            }
        }
        for entry in entries { try Database.store(entry.attributes, docID: entry.staged.docID, name: entry.staged.name, in: connection) }
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
