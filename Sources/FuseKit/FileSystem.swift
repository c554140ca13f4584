/// FuseKit: a small bridge from libfuse3's low-level API to a path-based Swift
/// `FileSystem`. `InodeTable` keeps the kernel's inode numbers and their lookup counts;
/// the low-level API (unlike libfuse's own path layer, which drops a directory's
/// `cache_readdir` and `keep_cache`) lets the kernel keep listings.
///
/// - **Threading.** `FuseMount` serves with its own threads (`Workers`): one reads
///   and answers while requests are quick, more join while requests block (libfuse's
///   `fuse_loop_mt` wakes a different thread for each request, and stops workers with
///   `pthread_cancel`, which ThreadSanitizer cannot stomach). Every `FileSystem` method
///   may be called on several threads at once and must be synchronous: block on locks
///   or I/O, never on a `Task`.
/// - **Errors.** A method throws; the bridge turns the error into an errno with
///   `ErrnoConvertible` (anything else is `EIO`). Nothing is asserted on worker
///   threads.
/// - **Handles.** `open`/`create` return a 64-bit handle that the kernel hands back
///   with every later call on that open file; paths are only for namespace
///   operations. Directories have no handles: the kernel opens them itself (no
///   OPENDIR round trip) and keeps their listings.
/// - **Caching.** The kernel caches attributes and entries for the timeouts given
///   in `FuseMount.Configuration`, and file data when `open` says `keepCache`;
///   `FuseMount.invalidate(_:)` drops what it holds for a path changed behind its back.
/// - **Unmounting.** The loop ends when the file system is unmounted from outside
///   (`fusermount3 -u`, `umount`); `FuseMount.unmount()` does that lazily, so open
///   files finish their work first.

import Foundation

/// A time as `stat` gives it, in nanoseconds since 1970 (64 bits: past 2038 and 2106).
public struct FileTime: Sendable, Hashable, Comparable {
    public var nanoseconds: Int64

    public init(nanoseconds: Int64) { self.nanoseconds = nanoseconds }
    public init(seconds: Double) { nanoseconds = Int64((seconds * 1e9).rounded()) }
    public init(_ time: timespec) { nanoseconds = Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec) }

    public static var now: FileTime {
        var time = Glibc.timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return FileTime(time)
    }

    /// Seconds since 1970, as the database keeps times.
    public var seconds: Double { Double(nanoseconds) / 1e9 }

    public var timespec: Glibc.timespec {
        let (seconds, rest) = nanoseconds.quotientAndRemainder(dividingBy: 1_000_000_000)
        return rest < 0 ? Glibc.timespec(tv_sec: Int(seconds - 1), tv_nsec: Int(rest + 1_000_000_000))
            : Glibc.timespec(tv_sec: Int(seconds), tv_nsec: Int(rest))
    }

    public static func < (a: FileTime, b: FileTime) -> Bool { a.nanoseconds < b.nanoseconds }
}

/// What `stat` shows for a node.
public struct FileAttributes: Sendable, Equatable {
    /// A symbolic link's target is asked with `FileSystem.readLink(_:)`.
    public enum Kind: Sendable { case directory, regularFile, symbolicLink }

    public var kind: Kind
    public var size: Int64
    /// Permission bits (e.g. 0o644).
    public var permissions: UInt32
    public var modified: FileTime
    /// The last access, when known apart from `modified` (the mount does not record reads: it
    /// is as if mounted `noatime`, and `atime` changes only when set).
    public var accessed: FileTime?
    public var linkCount: UInt32
    /// Content that changes from one open to the next (a status file): the kernel keeps no
    /// attributes of it, so `fstat` of an open file asks, and gets the size of what that
    /// open reads (`attributes(ofHandle:)`), not a size cached from an earlier version.
    public var volatile = false
    /// How long the kernel may trust these attributes (seconds), when shorter than the mount's
    /// `attributeTimeout`: for a folder whose listing follows the database (a view's), as the
    /// kernel drops a kept listing when it finds the folder's time changed.
    public var timeout: Double?
    /// The file system's own number for a node (below 2^48), when it can give the node's path
    /// back from it (`FileSystem.path(ofNumber:)`) for as long as the node lives: the mount
    /// then keeps nothing for it while the kernel holds it. For nodes of which there are very
    /// many (a database's document folders). A numbered file is never read through passthrough
    /// (`OpenFile.backing` is not used for it).
    public var number: UInt64?

    public init(kind: Kind, size: Int64 = 0, permissions: UInt32? = nil, modified: FileTime = FileTime(nanoseconds: 0),
                accessed: FileTime? = nil, linkCount: UInt32? = nil) {
        self.kind = kind
        self.size = size
        self.permissions = permissions ?? (kind == .directory ? 0o755 : kind == .symbolicLink ? 0o777 : 0o644)
        self.modified = modified
        self.accessed = accessed
        self.linkCount = linkCount ?? (kind == .directory ? 2 : 1)
    }
}

/// One entry of a directory listing.
public struct DirectoryEntry: Sendable {
    public let name: String
    /// Attributes, when cheap to give: the kernel then needs no `stat` per entry (readdirplus).
    public let attributes: FileAttributes?
    /// Where the listing resumes after this entry (`readDirectory(_:after:add:)`): never 0,
    /// increasing along the listing, and tied to the entry rather than to its index, so that
    /// entries added or removed between two reads neither hide nor repeat the others.
    public let position: UInt64

    public init(name: String, attributes: FileAttributes? = nil, position: UInt64) {
        self.name = name
        self.attributes = attributes
        self.position = position
    }
}

/// How an open file should be treated by the kernel.
public struct OpenFile: Sendable {
    public let handle: UInt64
    /// Keep the kernel's cached data of this file from earlier opens (it has not changed).
    public var keepCache: Bool
    /// Bypass the page cache (for files whose size is not known up front).
    public var directIO: Bool
    /// `close` need not call `flush` (nothing to save): one round trip less.
    public var noFlush: Bool
    /// A file holding exactly this file's bytes, which will not change while it is open (a
    /// read-only open of an immutable body). With FUSE passthrough the kernel then reads (and
    /// maps) that file itself and sends no READ for this one.
    public var backing: Backing?

    public struct Backing: Sendable {
        /// Open for reading; it stays the file system's (closed with its handle).
        public let descriptor: Int32
        /// Names the bytes: two files of the same identity hold the same bytes.
        public let identity: String
        public init(descriptor: Int32, identity: String) {
            self.descriptor = descriptor
            self.identity = identity
        }
    }

    public init(handle: UInt64, keepCache: Bool = false, directIO: Bool = false, noFlush: Bool = false, backing: Backing? = nil) {
        self.handle = handle
        self.keepCache = keepCache
        self.directIO = directIO
        self.noFlush = noFlush
        self.backing = backing
    }
}

/// An error that knows its errno. A file system's errors conform (in one place, one switch);
/// anything else a method throws is answered as EIO and logged as a failure.
public protocol ErrnoConvertible: Error {
    var errno: Int32 { get }
    /// Whether something failed (logged as an error) rather than a request refused by the file
    /// system's rules (logged as a notice, or at debug level for ENOENT, EEXIST and the like).
    var isFailure: Bool { get }
}

/// The bridge's own answers, about the kernel's requests rather than the file system's tree: an
/// inode it does not know, a name longer than NAME_MAX, a buffer too small, a session that
/// cannot start, a file changed while a passthrough open was set up. A file system's errors are
/// its own types.
public struct FileSystemError: ErrnoConvertible, Equatable, CustomStringConvertible {
    public let errno: Int32
    /// Why, when the errno alone does not say (it goes to the log).
    public let reason: String?
    public init(_ errno: Int32, reason: String? = nil) {
        self.errno = errno
        self.reason = reason
    }
    public var isFailure: Bool { errno == EIO }
    public var description: String { reason ?? String(cString: strerror(errno)) }
}

/// A file system served by `FuseMount`. Paths are absolute within the mount
/// (`/docs/a/properties.json`). All methods may run concurrently.
public protocol FileSystem: AnyObject, Sendable {
    func attributes(of path: String) throws -> FileAttributes
    /// What a lookup of `path` by thread `caller` finds: `attributes(of:)`, unless the file
    /// system answers this caller apart (`NotThereForThisCaller`).
    func lookup(_ path: String, caller: pid_t) throws -> FileAttributes
    /// Attributes of an open file (it may have been unlinked or renamed since).
    func attributes(ofHandle handle: UInt64) throws -> FileAttributes

    /// Lists the directory at `path`, in order of `position`, from the first entry whose
    /// position is above `after` (0: from the start); `add` returns false when the kernel's
    /// buffer is full. Directories are never opened: the kernel keeps listings (drop one with
    /// `FuseMount.invalidate` when the directory changes behind its back), so a listing
    /// carries no state between calls.
    func readDirectory(_ path: String, after position: UInt64, add: (DirectoryEntry) -> Bool) throws

    /// `caller` is the thread that asked (the kernel's request pid), in open, create and flush.
    func open(_ path: String, flags: Int32, caller: pid_t) throws -> OpenFile
    func create(_ path: String, permissions: UInt32, flags: Int32, caller: pid_t) throws -> OpenFile
    func read(_ handle: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int
    func write(_ handle: UInt64, _ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int
    /// Called on every `close` of a file descriptor (by whichever process holds a copy of it).
    func flush(_ handle: UInt64, caller: pid_t) throws
    func fsync(_ handle: UInt64) throws
    /// The last close; errors cannot be reported any more.
    func release(_ handle: UInt64)
    func truncate(_ path: String, to size: Int64, handle: UInt64?) throws

    func makeDirectory(_ path: String) throws
    /// `makeDirectory(_:)` asked by thread `caller`.
    func makeDirectory(_ path: String, caller: pid_t) throws
    func removeDirectory(_ path: String) throws
    func unlink(_ path: String) throws
    /// `flags` are renameat2's (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
    func rename(_ from: String, to: String, flags: UInt32) throws

    /// The target of the symbolic link at `path`.
    func readLink(_ path: String) throws -> String

    func extendedAttribute(_ name: String, of path: String) throws -> [UInt8]
    func extendedAttributeNames(of path: String) throws -> [String]
    func setExtendedAttribute(_ name: String, of path: String, to value: [UInt8], flags: Int32) throws
    func removeExtendedAttribute(_ name: String, of path: String) throws

    func statistics(of path: String) throws -> statvfs
    /// `utimensat`: `UTIME_NOW` and `UTIME_OMIT` as in `tv_nsec`.
    func setTimes(_ path: String, accessed: timespec?, modified: timespec?) throws
    /// `chmod`: the permission bits (`mode & 0o7777`). `chown` is accepted and ignored.
    func setPermissions(_ path: String, _ permissions: UInt32) throws

    /// An operation failed and `errno` went back to the program: told once, where it is
    /// answered (and logged), so the file system can show the reason where a user looks.
    /// Only failures worth a user's notice come here: not "no such file" and its kind.
    func failed(_ operation: String, path: String, errno: Int32, reason: String)

    /// The path of the node given `number` in its attributes (`FileAttributes.number`); nil
    /// when there is none (the kernel is then told ENOENT). Throws when it cannot be told (a
    /// database error): the program is told EIO, never that the file is not there.
    func path(ofNumber number: UInt64) throws -> String?
    /// The number the node at `path` is given, also when it no longer exists: how the mount
    /// finds the kernel's inode of a numbered node that moves or changes behind its back.
    func number(ofPath path: String) -> UInt64?
    /// The numbered nodes directly in the folder at `path` (also when they do not exist now):
    /// what the kernel may hold below it that the mount must tell about a change, or keep when
    /// the folder moves.
    func numberedChildren(of path: String) -> [(name: String, number: UInt64)]
}

/// A lookup answered "no such file" to one caller only: the kernel keeps no negative entry of
/// it, so the next lookup by anyone asks again.
public struct NotThereForThisCaller: Error {
    public init() {}
}

extension FileSystem {
    public func lookup(_ path: String, caller: pid_t) throws -> FileAttributes { try attributes(of: path) }
    public func makeDirectory(_ path: String, caller: pid_t) throws { try makeDirectory(path) }

    /// A file system without symbolic links: nothing is one (EINVAL, as readlink(2) of a file).
    public func readLink(_ path: String) throws -> String { throw FileSystemError(EINVAL) }

    public func failed(_ operation: String, path: String, errno: Int32, reason: String) {}

    /// A file system that numbers no node.
    public func path(ofNumber number: UInt64) throws -> String? { nil }
    public func number(ofPath path: String) -> UInt64? { nil }
    public func numberedChildren(of path: String) -> [(name: String, number: UInt64)] { [] }
}
