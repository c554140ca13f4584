import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit
import Synchronization

/// An open file of the mount. Subclasses hold the state of one kind of file;
/// `lock` guards it. Lock order (docs/internals.md, Locks): a handle's lock (1) is taken
/// before the database's (2, 3) and the mount's parts' (leaves).
class Handle: @unchecked Sendable {
    let lock = NSLock()
    /// The mount path it was opened at (for logs and for `getattr` of written files); a file
    /// being written follows its renames (under `lock`).
    var path: String

    init(path: String) { self.path = path }

    /// The lock that guards what reads and writes through this handle touch.
    var guardLock: NSLock { lock }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int { throw MountError.notOpenFor(path, operation: "reading") }
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int { throw MountError.notOpenFor(path, operation: "writing") }
    func truncate(to size: Int64) throws { throw MountError.notOpenFor(path, operation: "writing") }
    var size: Int64 { 0 }
    func close() {}
}

/// Copies what `bytes` holds from `offset` into `buffer`; returns the count (0 past the end).
private func copy(_ bytes: [UInt8], into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Int {
    guard offset < bytes.count else { return 0 }
    let count = min(buffer.count, bytes.count - Int(offset))
    bytes.withUnsafeBytes { buffer.copyMemory(from: UnsafeRawBufferPointer(rebasing: $0[Int(offset)..<Int(offset) + count])) }
    return count
}

/// A read-only snapshot of bytes: properties.json as rendered at open, status files.
class BytesHandle: Handle, @unchecked Sendable {
    let bytes: [UInt8]

    init(path: String, bytes: [UInt8]) {
        self.bytes = bytes
        super.init(path: path)
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        copy(bytes, into: buffer, at: offset)
    }

    override var size: Int64 { Int64(bytes.count) }
}

/// A status file as rendered at its open (`DocumentFileSystem.openStatusFiles`).
final class StatusFileHandle: BytesHandle, @unchecked Sendable {
    let name: String

    init(path: String, name: String, bytes: [UInt8]) {
        self.name = name
        super.init(path: path, bytes: bytes)
    }
}

/// Reads an attachment body straight from its blob file.
final class BlobReadHandle: Handle, @unchecked Sendable {
    let reader: BlobReader

    init(path: String, reader: BlobReader) {
        self.reader = reader
        super.init(path: path)
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        try reader.read(into: buffer, at: offset)
    }

    override var size: Int64 { reader.length }
}

/// An attachment whose body is not here (or not all of it): each read fetches the bytes
/// it needs from the remote, waiting at most `timeout` for them; one that cannot read as EIO.
final class DeferredBodyHandle: Handle, @unchecked Sendable {
    let reader: any BodyReader
    let timeout: Double

    init(path: String, reader: any BodyReader, timeout: Double) {
        self.reader = reader
        self.timeout = timeout
        super.init(path: path)
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        do {
            return try reader.read(into: buffer, at: offset, timeout: timeout, willWait: FuseMount.mayBlock)
        } catch {
            throw MountError.bodyUnreadable(path, cause: error)
        }
    }

    override var size: Int64 { reader.length }

    override func close() { reader.close() }
}

/// An attachment whose body is not on this machine, and no remote to fetch it from:
/// reads fail with ENODATA.
final class AbsentBodyHandle: Handle, @unchecked Sendable {
    let docID: String
    let attachment: Attachment

    init(path: String, docID: String, attachment: Attachment) {
        self.docID = docID
        self.attachment = attachment
        super.init(path: path)
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
    }

    override var size: Int64 { attachment.length }
}

/// What a written file changes in its document when it is saved.
enum Change: Hashable {
    case properties
    case attachment(String)
}

/// A file being written (a pending file): its content becomes a revision when the process
/// that opened it closes it, when it is fsynced, or when its last descriptor goes. Every
/// descriptor opened at its path meanwhile (`WriterDescriptor`) shares it, readers included,
/// so a file being written can be opened, read, truncated, renamed and unlinked by path.
class WriteHandle: Handle, @unchecked Sendable {
    var docID: String
    /// The revision the content was based on when opened (nil: a new document).
    var base: RevisionID?
    /// Written or truncated since the last save: the next flush saves.
    var dirty = false
    /// Created, or truncated by open(O_TRUNC), and not saved since. Shells close a
    /// duplicate descriptor before they write, so this alone waits for release to save.
    var emptiedAtOpen = false
    /// The last save failed (its error was returned by flush); release does not retry.
    var failed = false
    var lastError: Error?
    /// Unlinked while open: what is written from now on is never saved.
    var unlinked = false
    /// Descriptors sharing it. Read and changed only by `PendingFiles`, under its lock.
    var users = 0
    /// Times and a mode given while unsaved changes wait (a mode given at create): recorded
    /// with the body saved.
    var given = LocalAttributes()
    /// Set while what was written is durable but not saved (an fsync): its `PendingSave`.
    var durableID: String?

    init(path: String, docID: String, base: RevisionID?) {
        self.docID = docID
        self.base = base
        super.init(path: path)
    }

    /// What saving this file changes in its document.
    var change: Change { fatalError("abstract") }
}

/// properties.json open for writing: the bytes live in memory (documents are small).
final class PropertiesWriteHandle: WriteHandle, @unchecked Sendable {
    var buffer: [UInt8]
    /// The properties shown when this file began (nil: unknown), then those it saved.
    var seenProperties: JSONObject?
    static let maximumSize = Tuning.mountPropertiesSize

    init(path: String, docID: String, base: RevisionID?, initial: [UInt8]) {
        buffer = initial
        super.init(path: path, docID: docID, base: base)
    }

    override var change: Change { .properties }

    override func read(into destination: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        copy(buffer, into: destination, at: offset)
    }

    override func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        let end = Int(offset) + bytes.count
        guard end <= PropertiesWriteHandle.maximumSize else { throw MountError.tooLarge(path, limit: Int64(PropertiesWriteHandle.maximumSize)) }
        if end > buffer.count { buffer += [UInt8](repeating: 0, count: end - buffer.count) }
        buffer.replaceSubrange(Int(offset)..<end, with: bytes)
        dirty = true
        failed = false
        return bytes.count
    }

    override func truncate(to size: Int64) throws {
        guard size <= PropertiesWriteHandle.maximumSize else { throw MountError.tooLarge(path, limit: Int64(PropertiesWriteHandle.maximumSize)) }
        if Int(size) < buffer.count { buffer.removeLast(buffer.count - Int(size)) } else {
            buffer += [UInt8](repeating: 0, count: Int(size) - buffer.count)
        }
        dirty = true
        failed = false
    }

    override var size: Int64 { Int64(buffer.count) }
}

/// An attachment open for writing: the body goes to a temporary file in the
/// blob store, hashed as it arrives while writes are sequential, and becomes a
/// blob (renamed, never copied) when the file is saved. Written again after a
/// save, it starts a new temporary copy of that blob then, not before.
final class AttachmentWriteHandle: WriteHandle, @unchecked Sendable {
    var name: String
    let contentType: String
    let blobs: BlobStore
    /// The body being written; nil after a save until the next write.
    private var file: TemporaryBlobFile?
    /// The body as last saved.
    private var saved: StoredBlob?
    /// The digest the attachment had when this file began (nil: it did not exist), and after
    /// each save the one it saved: a different one shown at the next save was written by
    /// someone else meanwhile.
    var seenDigest: String?

    init(path: String, docID: String, base: RevisionID?, name: String, contentType: String, blobs: BlobStore,
         initialContent: BlobKey?) throws {
        self.name = name
        self.contentType = contentType
        self.blobs = blobs
        file = try blobs.makeTemporaryFile(copying: initialContent)
        super.init(path: path, docID: docID, base: base)
    }

    override var change: Change { .attachment(name) }

    private func writableFile() throws -> TemporaryBlobFile {
        if let file { return file }
        let copy = try blobs.makeTemporaryFile(copying: saved?.key)
        file = copy
        return copy
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        if let file { return try file.read(into: buffer, at: offset) }
        guard let saved else { return 0 }
        return try blobs.openReader(saved.key).read(into: buffer, at: offset)
    }

    override func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        try alterBody { try $0.write(bytes, at: offset) }
        return bytes.count
    }

    override func truncate(to size: Int64) throws {
        if size > self.size && size > Tuning.maximumTruncatedSize { throw MountError.tooLarge(path, limit: Tuning.maximumTruncatedSize) }
        if size == 0 { lost = nil }
        try alterBody { try $0.truncate(to: size) }
    }

    /// Applies a write or truncation to the body being written; one that fails loses the body.
    private func alterBody(_ body: (TemporaryBlobFile) throws -> Void) throws {
        if let lost { throw lost }
        do {
            try body(writableFile())
        } catch {
            lose(error)
            throw error
        }
        dirty = true
        failed = false
    }

    /// Set when a write could not be stored (a full disk): the body has a gap, so nothing of
    /// it is saved; every later write and flush fails with the same error, and its bytes are
    /// dropped at once (room for whatever comes next). Only emptying the file starts afresh.
    private var lost: Error?

    private func lose(_ error: Error) {
        lost = error
        file?.discard()
        file = nil
        failed = true
        lastError = error
        dirty = false
        emptiedAtOpen = false
    }

    override var size: Int64 { file?.size ?? saved?.length ?? 0 }

    /// Syncs the body being written to disk and links it at `keep` (once); false when there
    /// is nothing unsaved to keep.
    func makeDurable(at keep: String) throws -> Bool {
        guard let file else { return false }
        try file.sync()
        if !LongPath.exists(keep), LongPath.link(file.path, keep) != 0 {
            throw SofaError.system("link", path: keep, errno: errno)
        }
        return true
    }

    /// Moves the written bytes into the blob store.
    /// `durable: false` leaves the body's fsync to the fold that saves it (a staged file).
    func commitBody(durable: Bool = true) throws -> StoredBlob {
        guard let file else { return saved! }
        let blob = try file.commit(durable: durable)
        self.file = nil
        saved = blob
        return blob
    }

    override func close() { file?.discard() }
}

/// One descriptor (FUSE file handle) on a pending file. Descriptors share the file; each
/// knows the process that opened it, whose close saves (an inherited copy closed by a child
/// process does not: `{ printf …; cmd; } > f` is one revision).
final class WriterDescriptor: Handle, @unchecked Sendable {
    let file: WriteHandle
    /// The thread group (process) that opened it.
    let opener: pid_t
    /// The thread that opened it: its own close needs no look at /proc.
    let openerThread: pid_t

    init(file: WriteHandle, opener: pid_t, openerThread: pid_t) {
        self.file = file
        self.opener = opener
        self.openerThread = openerThread
        super.init(path: file.path)
    }

    override var guardLock: NSLock { file.lock }
    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        try file.read(into: buffer, at: offset)
    }
    override func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        // An unlinked file is still written and read through its descriptors (it is saved nowhere).
        try file.write(bytes, at: offset)
    }
    override func truncate(to size: Int64) throws { try file.truncate(to: size) }
    override var size: Int64 { file.size }
}

/// The thread group (process) of a thread id, as the kernel names callers by thread.
/// Every open and close of a file being written asks, and reading `/proc/TID/status` costs
/// more than the rest of a create: the last answer is kept for a second, as one thread of
/// one program usually makes many files in a row (`tar`, `cp`, `rsync`). A thread id is not
/// handed to another process that soon.
func processOf(_ thread: pid_t) -> pid_t {
    guard thread > 0 else { return thread }
    let now = DispatchTime.now().uptimeNanoseconds
    if let known = lastProcessAsked.withLock({ $0.thread == thread && now &- $0.at < 1_000_000_000 ? $0.group : nil }) {
        return known
    }
    let group = readProcessOf(thread)
    lastProcessAsked.withLock { $0 = (thread, group, now) }
    return group
}

private let lastProcessAsked = Mutex<(thread: pid_t, group: pid_t, at: UInt64)>((0, 0, 0))

/// `processOf` from `/proc`, with plain system calls.
private func readProcessOf(_ thread: pid_t) -> pid_t {
    let fd = open("/proc/\(thread)/status", O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return thread }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 512)  // Tgid: is on the fourth line
    let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
    guard count > 0 else { return thread }
    let key = Array("\nTgid:".utf8)
    var index = 0
    while index + key.count <= count {
        if buffer[index..<index + key.count].elementsEqual(key) { break }
        index += 1
    }
    index += key.count
    var group: pid_t = 0
    var digits = 0
    while index < count, buffer[index] == UInt8(ascii: "\t") || buffer[index] == UInt8(ascii: " ") { index += 1 }
    while index < count, buffer[index] >= UInt8(ascii: "0"), buffer[index] <= UInt8(ascii: "9") {
        group = group * 10 + pid_t(buffer[index] - UInt8(ascii: "0"))
        digits += 1
        index += 1
    }
    return digits > 0 ? group : thread
}

/// A scratch file: a real file beside the database (sealed in an encrypted one).
final class ScratchHandle: Handle, @unchecked Sendable {
    let file: ScratchFile

    init(path: String, file: ScratchFile) {
        self.file = file
        super.init(path: path)
    }

    override func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        try file.read(into: buffer, at: offset)
    }

    override func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        try file.write(bytes, at: offset)
    }

    override func truncate(to size: Int64) throws { try file.truncate(to: size) }

    override var size: Int64 { (try? file.size()) ?? 0 }

    override func close() { file.close() }
}

/// Open files by handle number.
final class HandleTable: @unchecked Sendable {
    // Guarded by `lock` (a leaf lock: nothing else is taken while it is held).
    private var handles: [UInt64: Handle] = [:]
    private var next: UInt64 = 1
    private let lock = NSLock()

    func add(_ handle: Handle) -> UInt64 {
        lock.lock()
        defer { lock.unlock() }
        let number = next
        next += 1
        handles[number] = handle
        return number
    }

    func get(_ number: UInt64) throws -> Handle {
        lock.lock()
        defer { lock.unlock() }
        guard let handle = handles[number] else { throw MountError.notOpenFor("handle \(number)", operation: "anything: it is not open") }
        return handle
    }

    func remove(_ number: UInt64) -> Handle? {
        lock.lock()
        defer { lock.unlock() }
        return handles.removeValue(forKey: number)
    }

}
