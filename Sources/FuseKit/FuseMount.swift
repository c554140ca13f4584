@preconcurrency import CFuse3
import Foundation
import Logging
import Synchronization

/// A mounted `FileSystem`: create it, `run()` it (blocks until unmounted), and
/// `unmount()` it from any thread (or let `fusermount3 -u` do so).
///
/// ```swift
/// let mount = try FuseMount(fileSystem: fs, at: "/mnt/db", configuration: .init())
/// try mount.run()
/// ```
public final class FuseMount: @unchecked Sendable {
    // Sendable invariant: `session` is set once in init and freed in run() after every
    // worker has stopped; uses from outside the loop hold `sessionLock`. Other state is immutable.

    public struct Configuration: Sendable {
        /// Mount options given to libfuse (`allow_other`, `auto_unmount`, `ro`, …).
        public var options: [String] = []
        /// How long the kernel trusts attributes and names (seconds). Long, because the file
        /// system invalidates what changes behind the kernel's back (`invalidate(_:descendants:)`):
        /// a folder listed from the kernel's cache asks nothing, so with a short timeout its
        /// names would expire unused and cost a LOOKUP each on the next `stat` (10 s made a
        /// `stat` of 20,000 warm files 3.8 times slower than 60 s).
        public var attributeTimeout = 60.0
        public var entryTimeout = 60.0
        /// Names that do not exist: short, as new ones cannot be invalidated by path.
        public var negativeTimeout = 0.5
        /// The most threads serving at once (`Workers`: one, and more only while requests
        /// block): how many requests may wait at once (reads waiting for a download, each in
        /// a file of its own) with the mount still answering others. Threads start only when
        /// needed, so a high limit costs nothing while requests are quick.
        public var workers = 32
        /// Shown as the source in `mount` and `df`.
        public var fileSystemName = "sofa"
        /// Let the kernel read files opened with a backing descriptor itself (FUSE passthrough),
        /// when it offers that.
        public var passthrough = true
        /// How long the thread that reads requests keeps asking for the next one before it sleeps
        /// (seconds; 0: sleeps at once). See `DeviceIO`.
        public var spin = 50e-6
        /// Let the kernel keep what symbolic links read (`FUSE_CAP_CACHE_SYMLINKS`): only for a
        /// file system whose links never change their target (while the kernel knows the node),
        /// as its `readLink` is then asked once per node instead of at every `ls -l`.
        public var cacheSymbolicLinks = false
        /// The owner every file and folder shows (`-o uid=,gid=`, as sshfs and rclone take them);
        /// by default the user the mount runs as. With `default_permissions` the kernel checks
        /// access against it.
        public var uid = geteuid()
        public var gid = getegid()
        /// Permission bits every file and folder shows without (`-o umask=`, as sshfs's): what a
        /// file was given is kept, and shown less these.
        public var umask: mode_t = 0

        public init() {}
    }

    /// The largest read and write request asked of the kernel.
    static let maximumRequest: UInt32 = 1 << 20

    public let mountPoint: String
    private let box: Box
    private let session: OpaquePointer
    private var unmounted = false
    private let unmountLock = NSLock()
    /// Set once `run()` is about to free `session`; `invalidate` then does nothing. Guarded by `sessionLock`.
    private var destroyed = false
    /// Guards `destroyed` and every use of `session` from outside the loop. Lock order: a leaf.
    private let sessionLock = NSLock()

    public init(fileSystem: any FileSystem, at mountPoint: String, configuration: Configuration = Configuration()) throws {
        self.mountPoint = mountPoint
        box = Box(fileSystem: fileSystem, configuration: configuration)

        var arguments = ["sofa", "-o", "fsname=\(configuration.fileSystemName),subtype=sofa"]
        for option in configuration.options { arguments += ["-o", option] }
        let argv = arguments.map { strdup($0) }
        defer { argv.forEach { free($0) } }
        var cArgs: [UnsafeMutablePointer<CChar>?] = argv
        var operations = FuseMount.operations()
        let box = self.box
        let session: OpaquePointer? = cArgs.withUnsafeMutableBufferPointer { buffer in
            var args = fuse_args(argc: Int32(buffer.count), argv: buffer.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            // `self.box` outlives the session: `run()` destroys the session before the mount goes.
            return fuse_session_new(&args, &operations, MemoryLayout<fuse_lowlevel_ops>.size, Unmanaged.passUnretained(box).toOpaque())
        }
        guard let session else { throw FileSystemError(EINVAL) }
        guard fuse_session_mount(session, mountPoint) == 0 else {
            fuse_session_destroy(session)
            throw FileSystemError(errno == 0 ? EIO : errno)
        }
        DeviceIO.install(on: session, box: box)
        self.session = session
        box.invalidateEntry = { [weak self] parent, name in self?.invalidateEntry(parent, name) }
    }

    /// Drops the kernel's entry `name` in `parent`: its next lookup asks.
    private func invalidateEntry(_ parent: fuse_ino_t, _ name: String) {
        sessionLock.lock()
        defer { sessionLock.unlock() }
        guard !destroyed else { return }
        _ = name.withCString { fuse_lowlevel_notify_inval_entry(session, parent, $0, strlen($0)) }
    }

    /// Whether FUSE passthrough is in use, and if not, why ("in use", "off: …").
    public var passthrough: String { box.passthrough.currentState.description }
    /// Files the kernel reads itself now, and how many were opened so since the mount.
    public var passthroughFiles: (open: Int, opened: Int) { (box.passthrough.openFiles, box.passthrough.openedCount) }
    /// The nodes kept for the kernel's inodes (those the file system numbers itself aside).
    public var keptNodes: Int { box.table.count }
    /// READ requests this process answered since the mount.
    public var readRequests: Int { box.readRequests.load(ordering: .relaxed) }

    /// Serves requests until the file system is unmounted.
    public func run() {
        Workers(session: session, maximum: box.configuration.workers).run()
        sessionLock.withLock { destroyed = true }
        fuse_session_unmount(session)
        fuse_session_destroy(session)
    }

    /// Unmounts lazily from outside the loop: open files finish their work, then the loop ends.
    public func unmount() {
        unmountLock.lock()
        defer { unmountLock.unlock() }
        guard !unmounted else { return }
        unmounted = true
        FuseMount.unmount(mountPoint)
    }

    /// Unmounts `path` lazily: `umount2(MNT_DETACH)` as root, `fusermount3 -u -z` otherwise.
    public static func unmount(_ path: String) {
        if geteuid() == 0, umount2(path, Int32(MNT_DETACH)) == 0 { return }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/fusermount3")
        process.arguments = ["-u", "-z", path]
        // No fusermount3: the umount2 above was the way, and failed; nothing else to try.
        guard (try? process.run()) != nil else { return }
        process.waitUntilExit()
    }

    /// Drops what the kernel caches about `path` (attributes, data, a directory's listing) and,
    /// with `descendants`, about every node it knows below it, also those whose names are gone
    /// (a `stat` of one then asks, instead of showing a removed file until the timeout).
    /// Safe from any thread, also while or after the loop ends.
    public func invalidate(_ path: String, descendants: Bool = false) {
        // Found before the session's lock is taken: a numbered node's number is the file system's.
        guard let ino = box.table.number(of: path) else {
            // A numbered node whose number went with it (a purged document): its name is
            // dropped instead, so that the kernel looks it up again rather than use the number.
            let slash = path.lastIndex(of: "/") ?? path.startIndex
            let parentPath = slash == path.startIndex ? "/" : String(path[..<slash])
            let name = String(path[path.index(after: slash)...])
            if !name.isEmpty, let parent = box.table.number(of: parentPath) { invalidateEntry(parent, name) }
            return
        }
        let nodes = [ino] + (descendants ? box.table.descendants(of: ino, at: path) : [])
        sessionLock.lock()
        defer { sessionLock.unlock() }
        guard !destroyed else { return }
        for node in nodes {
            _ = fuse_lowlevel_notify_inval_inode(session, node, 0, 0)
        }
    }
}

/// libfuse's session, handed to the worker threads (libfuse makes it safe to share).
struct SessionPointer: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// What the C callbacks reach through `fuse_req_userdata`.
final class Box: @unchecked Sendable {
    // Immutable after init but for an atomic; `table` guards itself.
    let fileSystem: any FileSystem
    let configuration: FuseMount.Configuration
    let table: InodeTable
    let passthrough: Passthrough
    let readRequests = Atomic<Int>(0)
    /// Whether the reading thread may spin now (`DeviceIO`).
    let spinGate = SpinGate()
    /// Whether the kernel opens directories without asking (set at INIT, read by every worker).
    private let kernelOpensDirectories = Atomic<Bool>(false)
    var openDirectoryInKernel: Bool {
        get { kernelOpensDirectories.load(ordering: .acquiring) }
        set { kernelOpensDirectories.store(newValue, ordering: .releasing) }
    }

    /// The open handles of each inode, so that `fstat` of a file unlinked while open (the
    /// kernel asks by inode, without the handle, and the name is gone) still answers from it.
    /// Guarded by `openLock` (a leaf lock).
    private var openFiles: [fuse_ino_t: Set<UInt64>] = [:]
    private var inodeOfHandle: [UInt64: fuse_ino_t] = [:]
    private let openLock = NSLock()

    func opened(_ handle: UInt64, inode: fuse_ino_t) {
        openLock.withLock {
            openFiles[inode, default: []].insert(handle)
            inodeOfHandle[handle] = inode
        }
    }

    func closed(_ handle: UInt64) {
        openLock.withLock {
            guard let inode = inodeOfHandle.removeValue(forKey: handle) else { return }
            openFiles[inode]?.remove(handle)
            if openFiles[inode]?.isEmpty == true { openFiles[inode] = nil }
        }
    }

    /// An open handle of `ino`, if it has one.
    func openHandle(of ino: fuse_ino_t) -> UInt64? {
        openLock.withLock { openFiles[ino]?.first }
    }

    init(fileSystem: any FileSystem, configuration: FuseMount.Configuration) {
        self.fileSystem = fileSystem
        self.configuration = configuration
        table = InodeTable(pathOfNumber: { try fileSystem.path(ofNumber: $0) }, numberOfPath: { fileSystem.number(ofPath: $0) },
                           numberedChildren: { fileSystem.numberedChildren(of: $0) })
        passthrough = Passthrough(enabled: configuration.passthrough)
    }

    /// Set by the mount: drops the kernel's entry `name` in `parent` (from another thread).
    var invalidateEntry: (@Sendable (fuse_ino_t, String) -> Void)?

    /// Gives the name of `ino`, just opened through passthrough, a new inode for later lookups.
    func retire(_ ino: fuse_ino_t) {
        guard let (parent, name) = table.retire(ino) else { return }
        invalidateEntry?(parent, name)
    }

    /// The path of `ino`, or ENOENT.
    func path(_ ino: fuse_ino_t) throws -> String {
        guard let path = try table.path(ino) else { throw FileSystemError(ENOENT) }
        return path
    }

    /// The path of `name` in `parent`, or ENOENT; ENAMETOOLONG for a name longer than
    /// NAME_MAX (255 bytes), as on any Linux file system (FUSE itself passes up to 1,024).
    func path(_ parent: fuse_ino_t, _ name: UnsafePointer<CChar>?) throws -> String {
        if let name, strlen(name) > Int(NAME_MAX) { throw FileSystemError(ENAMETOOLONG) }
        guard let path = try table.path(parent, string(name)) else { throw FileSystemError(ENOENT) }
        return path
    }

    /// An entry for `name` in `parent`, counted as a lookup (the kernel now holds it).
    func entry(_ parent: fuse_ino_t, _ name: String, _ attributes: FileAttributes) -> fuse_entry_param {
        var entry = fuse_entry_param()
        entry.ino = table.remember(parent, name, number: attributes.number)
        fill(&entry.attr, attributes, ino: entry.ino, configuration)
        entry.attr_timeout = timeout(of: attributes, configuration)
        entry.entry_timeout = configuration.entryTimeout
        return entry
    }
}

// MARK: - The operations table

// File-scope helpers: C callbacks may not capture context.
private func context(_ request: fuse_req_t?) -> Box {
    Unmanaged<Box>.fromOpaque(fuse_req_userdata(request)!).takeUnretainedValue()
}

/// Runs one request and answers its error, if any. A failed `operation` is logged with its path
/// and reason: expected answers (ENOENT, EEXIST…) at debug level, other refusals at notice,
/// failures at error. A `query` (a lookup, a read of attributes or of a listing, which are
/// refused all the time by design) is logged only when it fails (a disk or database error).
private func answer(_ request: fuse_req_t?, _ operation: String? = nil, _ ino: fuse_ino_t = 0, _ name: UnsafePointer<CChar>? = nil,
                    query: String? = nil, _ body: (Box, any FileSystem) throws -> Void) {
    let box = context(request)
    do {
        try body(box, box.fileSystem)
    } catch {
        let known = error as? ErrnoConvertible
        let code = known?.errno ?? EIO
        // Recorded before the reply: a program that reads the status file right after its
        // call failed finds the failure there.
        defer { fuse_reply_err(request, code) }
        guard let operation = operation ?? (known?.isFailure ?? true ? query : nil) else { return }
        // The inode's path now, for the log: nil when the kernel's inode is gone meanwhile.
        let path = (try? name.map { try box.path(ino, $0) } ?? box.path(ino)) ?? "inode \(ino)"
        let level: Logger.Level = known?.isFailure ?? true ? .error
            : [ENOENT, EEXIST, ENOTEMPTY, ENODATA, ENAMETOOLONG, EISDIR, ENOTDIR].contains(code) ? .debug : .notice
        // The errno's words (what the program printed), then the error's own account of it.
        let words = String(cString: strerror(code)), account = "\(error)"
        let detail = account == words ? "" : " (\(account))"
        fuseLog.log(level: level, "\(operation) \(path): \(words)\(detail)")
        if level != .debug { box.fileSystem.failed(operation, path: path, errno: code, reason: account) }
    }
}

private let fuseLog = Logger(label: "sofa.fuse")

private func string(_ pointer: UnsafePointer<CChar>?) -> String {
    pointer.map { String(cString: $0) } ?? ""
}

/// libfuse's stand-in number for entries whose node the kernel does not get (readdir).
private let unknownInode: fuse_ino_t = 0xffff_ffff

private func typeBits(_ kind: FileAttributes.Kind) -> mode_t {
    switch kind {
    case .directory: Glibc.S_IFDIR
    case .regularFile: Glibc.S_IFREG
    case .symbolicLink: Glibc.S_IFLNK
    }
}

/// How long the kernel keeps `attributes`.
func timeout(of attributes: FileAttributes, _ configuration: FuseMount.Configuration) -> Double {
    attributes.volatile ? 0 : min(attributes.timeout ?? configuration.attributeTimeout, configuration.attributeTimeout)
}

private func fill(_ buffer: UnsafeMutablePointer<stat>, _ attributes: FileAttributes, ino: fuse_ino_t,
                  _ configuration: FuseMount.Configuration) {
    memset(buffer, 0, MemoryLayout<stat>.size)
    buffer.pointee.st_ino = UInt(ino)
    buffer.pointee.st_mode = typeBits(attributes.kind) | (attributes.permissions & ~configuration.umask)
    buffer.pointee.st_nlink = UInt(attributes.linkCount)
    buffer.pointee.st_size = Int(attributes.size)
    // The request size for files: cp sizes its buffer by it (1 MiB writes instead of 128 KiB, an
    // eighth of the round trips).
    buffer.pointee.st_blksize = attributes.kind == .regularFile ? Int(FuseMount.maximumRequest) : 4096
    buffer.pointee.st_blocks = Int((attributes.size + 511) / 512)
    buffer.pointee.st_uid = configuration.uid
    buffer.pointee.st_gid = configuration.gid
    buffer.pointee.st_mtim = attributes.modified.timespec
    buffer.pointee.st_ctim = attributes.modified.timespec
    buffer.pointee.st_atim = (attributes.accessed ?? attributes.modified).timespec
}

private func replyAttributes(_ request: fuse_req_t?, _ box: Box, _ attributes: FileAttributes, ino: fuse_ino_t) {
    var result = stat()
    fill(&result, attributes, ino: ino, box.configuration)
    fuse_reply_attr(request, &result, timeout(of: attributes, box.configuration))
}

/// Replies an xattr value or name list: its size when `size` is 0, else the bytes.
private func replyXattr(_ request: fuse_req_t?, _ bytes: [UInt8], size: Int) throws {
    if size == 0 {
        fuse_reply_xattr(request, bytes.count)
        return
    }
    guard bytes.count <= size else { throw FileSystemError(ERANGE) }
    bytes.withUnsafeBytes { _ = fuse_reply_buf(request, $0.baseAddress?.assumingMemoryBound(to: CChar.self), bytes.count) }
}

/// The type bits of a listed entry; 0 (DT_UNKNOWN: the caller stats it) when not given.
private func fileType(_ entry: DirectoryEntry) -> mode_t {
    if entry.name == "." || entry.name == ".." { return Glibc.S_IFDIR }
    return entry.attributes.map { typeBits($0.kind) } ?? 0
}

/// Fills a readdir(plus) answer of at most `size` bytes from `offset` and sends it.
private func replyDirectory(_ request: fuse_req_t?, _ ino: fuse_ino_t, size: Int, offset: off_t,
                            _ info: UnsafeMutablePointer<fuse_file_info>?, plus: Bool) {
    answer(request, nil, ino, query: "readdir") { box, fs in
        let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: max(size, 1))
        defer { buffer.deallocate() }
        var used = 0
        try fs.readDirectory(box.path(ino), after: UInt64(bitPattern: Int64(offset))) { entry in
            let position = off_t(bitPattern: UInt(entry.position))
            let remaining = size - used
            let isDot = entry.name == "." || entry.name == ".."
            if plus {
                var item = fuse_entry_param()
                if let attributes = entry.attributes, !isDot {
                    item = box.entry(ino, entry.name, attributes)
                } else {
                    item.attr.st_ino = UInt(unknownInode)
                    item.attr.st_mode = fileType(entry)
                }
                let needed = fuse_add_direntry_plus(request, buffer + used, remaining, entry.name, &item, position)
                guard needed <= remaining else {
                    if item.ino != 0 { box.table.forget(item.ino, 1) }  // not sent: not looked up
                    return false
                }
                used += needed
            } else {
                var item = stat()
                item.st_ino = UInt(unknownInode)
                item.st_mode = fileType(entry)
                let needed = fuse_add_direntry(request, buffer + used, remaining, entry.name, &item, position)
                guard needed <= remaining else { return false }
                used += needed
            }
            return true
        }
        fuse_reply_buf(request, buffer, used)
    }
}

extension FuseMount {
    static func operations() -> fuse_lowlevel_ops {
        var ops = fuse_lowlevel_ops()
        ops.`init` = { userdata, connection in
            guard let connection else { return }
            // 1 MiB requests instead of 128 KiB: an eighth of the round trips for big files.
            connection.pointee.max_write = FuseMount.maximumRequest
            connection.pointee.max_readahead = FuseMount.maximumRequest
            // open(O_TRUNC) arrives as one open, not an open and a truncate (one revision, not two).
            connection.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
            let box = Unmanaged<Box>.fromOpaque(userdata!).takeUnretainedValue()
            if box.configuration.cacheSymbolicLinks && connection.pointee.capable & UInt32(FUSE_CAP_CACHE_SYMLINKS) != 0 {
                connection.pointee.want |= UInt32(FUSE_CAP_CACHE_SYMLINKS)
            }
            box.openDirectoryInKernel = connection.pointee.capable & UInt32(FUSE_CAP_NO_OPENDIR_SUPPORT) != 0
        }
        ops.lookup = { request, parent, name in
            answer(request, nil, parent, name, query: "lookup") { box, fs in
                let path = try box.path(parent, name)
                let attributes: FileAttributes
                do {
                    attributes = try fs.lookup(path, caller: fuse_req_ctx(request).pointee.pid)
                } catch is NotThereForThisCaller {
                    fuse_reply_err(request, ENOENT)  // no negative entry: others still find it
                    return
                } catch let error as ErrnoConvertible where error.errno == ENOENT {
                    // A negative entry, which the kernel keeps for a short while.
                    var entry = fuse_entry_param()
                    entry.entry_timeout = box.configuration.negativeTimeout
                    fuse_reply_entry(request, &entry)
                    return
                }
                var entry = box.entry(parent, string(name), attributes)
                if fuse_reply_entry(request, &entry) != 0 { box.table.forget(entry.ino, 1) }
            }
        }
        ops.forget = { request, ino, count in
            context(request).table.forget(ino, count)
            fuse_reply_none(request)
        }
        ops.forget_multi = { request, count, forgets in
            let table = context(request).table
            for index in 0..<count { table.forget(forgets![index].ino, forgets![index].nlookup) }
            fuse_reply_none(request)
        }
        ops.getattr = { request, ino, info in
            answer(request, nil, ino, query: "getattr") { box, fs in
                let attributes: FileAttributes
                if let info {
                    attributes = try fs.attributes(ofHandle: info.pointee.fh)
                } else if let path = try box.table.path(ino) {
                    attributes = try fs.attributes(of: path)
                } else if let handle = box.openHandle(of: ino) {
                    // Unlinked while open: what the open file holds, with no name left.
                    var open = try fs.attributes(ofHandle: handle)
                    open.linkCount = 0
                    attributes = open
                } else {
                    throw FileSystemError(ENOENT)
                }
                replyAttributes(request, box, attributes, ino: ino)
            }
        }
        ops.setattr = { request, ino, attributes, toSet, info in
            answer(request, "setattr", ino) { box, fs in
                let set = UInt32(bitPattern: toSet)
                let path = try box.table.path(ino)
                guard path != nil || info != nil else { throw FileSystemError(ENOENT) }
                if set & UInt32(FUSE_SET_ATTR_SIZE) != 0 {
                    try fs.truncate(path ?? "", to: Int64(attributes!.pointee.st_size), handle: info?.pointee.fh)
                }
                if set & UInt32(FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME) != 0 {
                    func time(_ isSet: Int32, _ now: Int32, _ given: timespec) -> timespec {
                        if set & UInt32(now) != 0 { return timespec(tv_sec: 0, tv_nsec: (1 << 30) - 1 /* UTIME_NOW */) }
                        if set & UInt32(isSet) != 0 { return given }
                        return timespec(tv_sec: 0, tv_nsec: (1 << 30) - 2 /* UTIME_OMIT */)
                    }
                    try fs.setTimes(try box.path(ino), accessed: time(FUSE_SET_ATTR_ATIME, FUSE_SET_ATTR_ATIME_NOW, attributes!.pointee.st_atim),
                                    modified: time(FUSE_SET_ATTR_MTIME, FUSE_SET_ATTR_MTIME_NOW, attributes!.pointee.st_mtim))
                }
                if set & UInt32(FUSE_SET_ATTR_MODE) != 0 {
                    try fs.setPermissions(try box.path(ino), UInt32(attributes!.pointee.st_mode) & 0o7777)
                }
                // Ownership is not stored: accepted so that cp -a and rsync -a work.
                let current = try info.map { try fs.attributes(ofHandle: $0.pointee.fh) } ?? fs.attributes(of: box.path(ino))
                replyAttributes(request, box, current, ino: ino)
            }
        }
        ops.opendir = { request, _, info in
            // ENOSYS tells the kernel (Linux 5.1 and later) to open directories itself from now on,
            // keeping their listings, without asking: one round trip less for every folder
            // `ls -R` or `find` enters. Older kernels take ENOSYS as an error: open with the same flags.
            if context(request).openDirectoryInKernel {
                fuse_reply_err(request, ENOSYS)
            } else {
                cfuse_set_cache_readdir(info, 1)
                cfuse_set_keep_cache(info, 1)
                fuse_reply_open(request, info)
            }
        }
        ops.readdir = { request, ino, size, offset, info in
            replyDirectory(request, ino, size: size, offset: offset, info, plus: false)
        }
        ops.readdirplus = { request, ino, size, offset, info in
            replyDirectory(request, ino, size: size, offset: offset, info, plus: true)
        }
        ops.open = { request, ino, info in
            answer(request, "open", ino) { box, fs in
                let file = try fs.open(box.path(ino), flags: info!.pointee.flags, caller: fuse_req_ctx(request).pointee.pid)
                info!.pointee.fh = file.handle
                box.opened(file.handle, inode: ino)
                cfuse_set_keep_cache(info, file.keepCache ? 1 : 0)
                cfuse_set_direct_io(info, file.directIO ? 1 : 0)
                cfuse_set_noflush(info, file.noFlush ? 1 : 0)
                var first = false
                // A numbered node cannot be given a new inode (below): it is read here.
                if let backing = file.backing, box.table.isKept(ino) {
                    switch box.passthrough.register(backing, for: file.handle, inode: ino) {
                    case .notUsed: break
                    case .used(let made): first = made
                    case .conflict:
                        // Open through passthrough with the bytes it had: changed in the moment before
                        // its name was given a new inode (below). A new open finds the new one.
                        box.closed(file.handle)
                        fs.release(file.handle)
                        throw FileSystemError(ESTALE, reason: "changed while open; open it again")
                    }
                }
                // Before the reply, so that nothing the opener does next (open the name to write it)
                // meets this inode: the kernel would refuse any open of it but through passthrough.
                // (An open holds no lock of its folder by the time it asks: the entry can go now.)
                if first { box.retire(ino) }
                if fuse_reply_open(request, info) != 0 {
                    box.passthrough.release(file.handle)
                    box.closed(file.handle)
                    fs.release(file.handle)
                }
            }
        }
        ops.create = { request, parent, name, mode, info in
            answer(request, "create", parent, name) { box, fs in
                let file = try fs.create(box.path(parent, name), permissions: mode & 0o7777, flags: info!.pointee.flags,
                                         caller: fuse_req_ctx(request).pointee.pid)
                info!.pointee.fh = file.handle
                cfuse_set_direct_io(info, file.directIO ? 1 : 0)
                let attributes: FileAttributes
                do {
                    attributes = try fs.attributes(ofHandle: file.handle)
                } catch {
                    box.closed(file.handle)
                    fs.release(file.handle)
                    throw error
                }
                var entry = box.entry(parent, string(name), attributes)
                box.opened(file.handle, inode: entry.ino)
                if fuse_reply_create(request, &entry, info) != 0 {
                    box.table.forget(entry.ino, 1)
                    box.closed(file.handle)
                    fs.release(file.handle)
                }
            }
        }
        ops.read = { request, ino, size, offset, info in
            answer(request, "read", ino) { box, fs in
                box.readRequests.add(1, ordering: .relaxed)
                let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: max(size, 1), alignment: 16)
                defer { buffer.deallocate() }
                let count = try fs.read(info!.pointee.fh, into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<size]), at: Int64(offset))
                fuse_reply_buf(request, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), count)
            }
        }
        ops.write = { request, ino, bytes, size, offset, info in
            answer(request, "write", ino) { _, fs in
                let count = try fs.write(info!.pointee.fh, UnsafeRawBufferPointer(start: bytes, count: size), at: Int64(offset))
                fuse_reply_write(request, count)
            }
        }
        ops.flush = { request, ino, info in
            answer(request, "close", ino) { _, fs in
                try fs.flush(info!.pointee.fh, caller: fuse_req_ctx(request).pointee.pid)
                fuse_reply_err(request, 0)
            }
        }
        ops.fsync = { request, ino, _, info in
            answer(request, "fsync", ino) { _, fs in
                try fs.fsync(info!.pointee.fh)
                fuse_reply_err(request, 0)
            }
        }
        ops.release = { request, _, info in
            let box = context(request)
            box.passthrough.release(info!.pointee.fh)
            box.closed(info!.pointee.fh)
            box.fileSystem.release(info!.pointee.fh)
            fuse_reply_err(request, 0)
        }
        ops.mkdir = { request, parent, name, _ in
            answer(request, "mkdir", parent, name) { box, fs in
                let path = try box.path(parent, name)
                try fs.makeDirectory(path, caller: fuse_req_ctx(request).pointee.pid)
                var entry = box.entry(parent, string(name), try fs.attributes(of: path))
                if fuse_reply_entry(request, &entry) != 0 { box.table.forget(entry.ino, 1) }
            }
        }
        ops.rmdir = { request, parent, name in
            answer(request, "rmdir", parent, name) { box, fs in
                try fs.removeDirectory(box.path(parent, name))
                box.table.removed(parent, string(name))
                fuse_reply_err(request, 0)
            }
        }
        ops.unlink = { request, parent, name in
            answer(request, "unlink", parent, name) { box, fs in
                try fs.unlink(box.path(parent, name))
                box.table.removed(parent, string(name))
                fuse_reply_err(request, 0)
            }
        }
        ops.rename = { request, parent, name, newParent, newName, flags in
            answer(request, "rename", parent, name) { box, fs in
                let (from, to) = (try box.path(parent, name), try box.path(newParent, newName))
                let exchange = flags & 2 /* RENAME_EXCHANGE */ != 0
                // A numbered node that moves needs a node kept: its number no longer gives its path.
                let moved = box.table.moving(parent, string(name), at: from)
                let swapped = exchange ? box.table.moving(newParent, string(newName), at: to) : InodeTable.Moving()
                try fs.rename(from, to: to, flags: flags)
                box.table.renamed(parent, string(name), to: newParent, string(newName), exchange: exchange, moved: moved, swapped: swapped)
                fuse_reply_err(request, 0)
            }
        }
        ops.statfs = { request, ino in
            answer(request, nil, ino, query: "statfs") { box, fs in
                var result = try fs.statistics(of: try box.table.path(ino) ?? "/")
                fuse_reply_statfs(request, &result)
            }
        }
        ops.readlink = { request, ino in
            answer(request, "readlink", ino) { box, fs in
                let target = try fs.readLink(box.path(ino))
                fuse_reply_readlink(request, target)
            }
        }
        ops.getxattr = { request, ino, name, size in
            answer(request, nil, ino, query: "getxattr") { box, fs in
                try replyXattr(request, fs.extendedAttribute(string(name), of: box.path(ino)), size: size)
            }
        }
        ops.listxattr = { request, ino, size in
            answer(request, nil, ino, query: "listxattr") { box, fs in
                // Names, each followed by a NUL.
                let bytes: [UInt8] = try fs.extendedAttributeNames(of: box.path(ino)).reduce(into: []) { list, name in
                    list += name.utf8
                    list.append(0)
                }
                try replyXattr(request, bytes, size: size)
            }
        }
        ops.setxattr = { request, ino, name, value, size, flags in
            answer(request, "setxattr", ino) { box, fs in
                let bytes = Array(UnsafeRawBufferPointer(start: value, count: size))
                try fs.setExtendedAttribute(string(name), of: box.path(ino), to: bytes, flags: flags)
                fuse_reply_err(request, 0)
            }
        }
        ops.removexattr = { request, ino, name in
            answer(request, "removexattr", ino) { box, fs in
                try fs.removeExtendedAttribute(string(name), of: box.path(ino))
                fuse_reply_err(request, 0)
            }
        }
        ops.link = { request, _, _, _ in fuse_reply_err(request, EPERM) }
        ops.symlink = { request, _, _, _ in fuse_reply_err(request, EPERM) }
        ops.mknod = { request, _, _, _, _ in fuse_reply_err(request, EPERM) }
        return ops
    }
}
