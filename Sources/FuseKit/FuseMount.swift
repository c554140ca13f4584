@preconcurrency import CFuse3
import Foundation

/// A mounted `FileSystem`: create it, `run()` it (blocks until unmounted), and
/// `unmount()` it from any thread (or let `fusermount3 -u` do so).
///
/// ```swift
/// let mount = try FuseMount(fileSystem: fs, at: "/mnt/db", configuration: .init())
/// try mount.run()
/// ```
public final class FuseMount: @unchecked Sendable {
    // Sendable invariant: `fuse` is set once in init and freed in run() after every
    // worker has stopped; `session` likewise. Other state is immutable.

    public struct Configuration: Sendable {
        /// Mount options given to libfuse (`allow_other`, `auto_unmount`, `ro`, …).
        public var options: [String] = []
        /// How long the kernel trusts attributes and names (seconds). Long, because the file
        /// system invalidates what changes behind the kernel's back (`invalidate(_:)`).
        public var attributeTimeout = 10.0
        public var entryTimeout = 10.0
        /// Names that do not exist: short, as new ones cannot be invalidated by path.
        public var negativeTimeout = 0.5
        /// Worker threads; size it for callbacks that block (a read waiting for a download).
        public var workers = 8
        /// Shown as the source in `mount` and `df`.
        public var fileSystemName = "sofa"

        public init() {}
    }

    /// The largest read and write request asked of the kernel.
    static let maximumRequest: UInt32 = 1 << 20

    public let mountPoint: String
    let fileSystem: any FileSystem
    let configuration: Configuration
    private let fuse: OpaquePointer
    private let session: OpaquePointer
    private var unmounted = false
    private let unmountLock = NSLock()
    /// Set once `run()` is about to free `fuse`; `invalidate` then does nothing. Guarded by `fuseLock`.
    private var destroyed = false
    /// Guards `destroyed` and every use of `fuse` from outside the loop. Lock order: a leaf.
    private let fuseLock = NSLock()

    public init(fileSystem: any FileSystem, at mountPoint: String, configuration: Configuration = Configuration()) throws {
        self.fileSystem = fileSystem
        self.mountPoint = mountPoint
        self.configuration = configuration

        var arguments = ["sofa", "-o", "fsname=\(configuration.fileSystemName),subtype=sofa"]
        for option in configuration.options { arguments += ["-o", option] }
        let argv = arguments.map { strdup($0) }
        defer { argv.forEach { free($0) } }
        var cArgs: [UnsafeMutablePointer<CChar>?] = argv
        var operations = FuseMount.operations()
        let fuse: OpaquePointer? = cArgs.withUnsafeMutableBufferPointer { buffer in
            var args = fuse_args(argc: Int32(buffer.count), argv: buffer.baseAddress, allocated: 0)
            defer { fuse_opt_free_args(&args) }
            // The bridge outlives the mount: `run()` releases it after the loop ends.
            return cfuse_new(&args, &operations, Unmanaged.passRetained(Box(fileSystem: fileSystem, configuration: configuration)).toOpaque())
        }
        guard let fuse else { throw FileSystemError(EINVAL) }
        guard fuse_mount(fuse, mountPoint) == 0 else {
            fuse_destroy(fuse)
            throw FileSystemError(errno == 0 ? EIO : errno)
        }
        self.fuse = fuse
        self.session = fuse_get_session(fuse)
    }

    /// Serves requests until the file system is unmounted.
    public func run() {
        let group = DispatchGroup()
        for index in 0..<max(1, configuration.workers) {
            group.enter()
            let session = SessionPointer(pointer: self.session)
            let thread = Thread {
                FuseMount.serve(session.pointer)
                group.leave()
            }
            thread.name = "fuse-\(index)"
            thread.stackSize = 1 << 20
            thread.start()
        }
        group.wait()
        fuseLock.lock()
        destroyed = true
        fuseLock.unlock()
        fuse_unmount(fuse)
        fuse_destroy(fuse)
    }

    private static func serve(_ session: OpaquePointer) {
        var buffer = fuse_buf()
        defer { free(buffer.mem) }
        while fuse_session_exited(session) == 0 {
            let result = fuse_session_receive_buf(session, &buffer)
            if result == -EINTR { continue }
            if result <= 0 {
                // ENODEV: unmounted. Tell the other workers too.
                fuse_session_exit(session)
                return
            }
            fuse_session_process_buf(session, &buffer)
        }
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
        try? process.run()
        process.waitUntilExit()
    }

    /// Drops what the kernel caches about `path` (attributes, name, data).
    /// Safe from any thread, also while or after the loop ends.
    public func invalidate(_ path: String) {
        fuseLock.lock()
        defer { fuseLock.unlock() }
        guard !destroyed else { return }
        _ = fuse_invalidate_path(fuse, path)
    }
}

/// libfuse's session, handed to the worker threads (libfuse makes it safe to share).
struct SessionPointer: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// What the C callbacks reach through `fuse_get_context()->private_data`.
final class Box: @unchecked Sendable {
    // Immutable after init.
    let fileSystem: any FileSystem
    let configuration: FuseMount.Configuration

    init(fileSystem: any FileSystem, configuration: FuseMount.Configuration) {
        self.fileSystem = fileSystem
        self.configuration = configuration
    }
}

// MARK: - The operations table

// File-scope helpers: C callbacks may not capture context, not even `Self`.
private var fs: any FileSystem {
    Unmanaged<Box>.fromOpaque(fuse_get_context()!.pointee.private_data).takeUnretainedValue().fileSystem
}

/// Runs `body`, turning thrown errors into negative errno values.
private func call(_ body: () throws -> Int32) -> Int32 {
    do {
        return try body()
    } catch let error as ErrnoConvertible {
        return -error.errno
    } catch {
        return -EIO
    }
}

private func string(_ pointer: UnsafePointer<CChar>?) -> String {
    pointer.map { String(cString: $0) } ?? ""
}

func fill(_ buffer: UnsafeMutablePointer<stat>, _ attributes: FileAttributes) {
    memset(buffer, 0, MemoryLayout<stat>.size)
    buffer.pointee.st_mode = (attributes.kind == .directory ? Glibc.S_IFDIR : Glibc.S_IFREG) | attributes.permissions
    buffer.pointee.st_nlink = UInt(attributes.linkCount)
    buffer.pointee.st_size = Int(attributes.size)
    buffer.pointee.st_blksize = 4096
    buffer.pointee.st_blocks = Int((attributes.size + 511) / 512)
    buffer.pointee.st_uid = geteuid()
    buffer.pointee.st_gid = getegid()
    let seconds = attributes.modified.rounded(.down)
    let time = timespec(tv_sec: Int(seconds), tv_nsec: Int((attributes.modified - seconds) * 1e9))
    buffer.pointee.st_mtim = time
    buffer.pointee.st_ctim = time
    buffer.pointee.st_atim = time
}


extension FuseMount {
    static func operations() -> fuse_operations {
        var ops = fuse_operations()
        ops.`init` = { connection, config in
            let box = Unmanaged<Box>.fromOpaque(fuse_get_context()!.pointee.private_data).takeUnretainedValue()
            if let connection {
                // 1 MiB requests instead of 128 KiB: an eighth of the round trips for big files.
                connection.pointee.max_write = FuseMount.maximumRequest
                connection.pointee.max_readahead = FuseMount.maximumRequest
                // open(O_TRUNC) arrives as one open, not an open and a truncate (one revision, not two).
                connection.pointee.want |= UInt32(FUSE_CAP_ATOMIC_O_TRUNC)
            }
            if let config {
                config.pointee.entry_timeout = box.configuration.entryTimeout
                config.pointee.attr_timeout = box.configuration.attributeTimeout
                config.pointee.negative_timeout = box.configuration.negativeTimeout
                config.pointee.hard_remove = 1  // no .fuse_hidden files: handles keep unlinked files alive
                config.pointee.nullpath_ok = 1
                config.pointee.use_ino = 0
            }
            return fuse_get_context()!.pointee.private_data
        }
        ops.destroy = { data in
            if let data { Unmanaged<Box>.fromOpaque(data).release() }
        }
        ops.getattr = { path, stat, info in
            call {
                let attributes = try info.map { try fs.attributes(ofHandle: $0.pointee.fh) } ?? fs.attributes(of: string(path))
                fill(stat!, attributes)
                return 0
            }
        }
        ops.opendir = { path, info in
            call {
                let directory = try fs.openDirectory(string(path))
                info!.pointee.fh = directory.handle
                cfuse_set_cache_readdir(info, directory.keepCache ? 1 : 0)
                cfuse_set_keep_cache(info, directory.keepCache ? 1 : 0)
                return 0
            }
        }
        ops.readdir = { _, buffer, filler, offset, info, flags in
            call {
                let plus = flags.rawValue & FUSE_READDIR_PLUS.rawValue != 0
                var position = offset
                try fs.readDirectory(info!.pointee.fh, from: offset) { entry in
                    position += 1
                    if plus, let attributes = entry.attributes {
                        let stat = UnsafeMutablePointer<stat>.allocate(capacity: 1)
                        defer { stat.deallocate() }
                        fill(stat, attributes)
                        return filler!(buffer, entry.name, stat, position, FUSE_FILL_DIR_PLUS) == 0
                    }
                    return filler!(buffer, entry.name, nil, position, fuse_fill_dir_flags(rawValue: 0)) == 0
                }
                return 0
            }
        }
        ops.releasedir = { _, info in
            fs.releaseDirectory(info!.pointee.fh)
            return 0
        }
        ops.open = { path, info in
            call {
                let file = try fs.open(string(path), flags: info!.pointee.flags)
                info!.pointee.fh = file.handle
                cfuse_set_keep_cache(info, file.keepCache ? 1 : 0)
                cfuse_set_direct_io(info, file.directIO ? 1 : 0)
                cfuse_set_noflush(info, file.noFlush ? 1 : 0)
                return 0
            }
        }
        ops.create = { path, mode, info in
            call {
                let file = try fs.create(string(path), permissions: mode & 0o7777, flags: info!.pointee.flags)
                info!.pointee.fh = file.handle
                cfuse_set_direct_io(info, file.directIO ? 1 : 0)
                return 0
            }
        }
        ops.read = { _, buffer, size, offset, info in
            call {
                Int32(try fs.read(info!.pointee.fh, into: UnsafeMutableRawBufferPointer(start: buffer, count: size), at: Int64(offset)))
            }
        }
        ops.write = { _, buffer, size, offset, info in
            call {
                Int32(try fs.write(info!.pointee.fh, UnsafeRawBufferPointer(start: buffer, count: size), at: Int64(offset)))
            }
        }
        ops.flush = { _, info in call { try fs.flush(info!.pointee.fh); return 0 } }
        ops.fsync = { _, _, info in call { try fs.fsync(info!.pointee.fh); return 0 } }
        ops.release = { _, info in
            fs.release(info!.pointee.fh)
            return 0
        }
        ops.truncate = { path, size, info in
            call {
                try fs.truncate(string(path), to: Int64(size), handle: info?.pointee.fh)
                return 0
            }
        }
        ops.mkdir = { path, _ in call { try fs.makeDirectory(string(path)); return 0 } }
        ops.rmdir = { path in call { try fs.removeDirectory(string(path)); return 0 } }
        ops.unlink = { path in call { try fs.unlink(string(path)); return 0 } }
        ops.rename = { from, to, flags in call { try fs.rename(string(from), to: string(to), flags: flags); return 0 } }
        ops.statfs = { path, result in
            call {
                result!.pointee = try fs.statistics(of: string(path))
                return 0
            }
        }
        ops.getxattr = { path, name, value, size in
            call {
                let bytes = try fs.extendedAttribute(string(name), of: string(path))
                if size == 0 { return Int32(bytes.count) }
                guard bytes.count <= size else { return -ERANGE }
                bytes.withUnsafeBytes { UnsafeMutableRawPointer(value!).copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
                return Int32(bytes.count)
            }
        }
        ops.listxattr = { path, list, size in
            call {
                // Names, each followed by a NUL.
                let bytes: [UInt8] = try fs.extendedAttributeNames(of: string(path)).reduce(into: []) { list, name in
                    list += name.utf8
                    list.append(0)
                }
                if size == 0 { return Int32(bytes.count) }
                guard bytes.count <= size else { return -ERANGE }
                if !bytes.isEmpty {
                    bytes.withUnsafeBytes { UnsafeMutableRawPointer(list!).copyMemory(from: $0.baseAddress!, byteCount: bytes.count) }
                }
                return Int32(bytes.count)
            }
        }
        ops.setxattr = { path, name, value, size, flags in
            call {
                let bytes = Array(UnsafeRawBufferPointer(start: value, count: size))
                try fs.setExtendedAttribute(string(name), of: string(path), to: bytes, flags: flags)
                return 0
            }
        }
        ops.removexattr = { path, name in call { try fs.removeExtendedAttribute(string(name), of: string(path)); return 0 } }
        ops.utimens = { path, times, _ in
            call {
                try fs.setTimes(string(path), accessed: times?[0], modified: times?[1])
                return 0
            }
        }
        // Ownership and modes are not stored; accept them so that cp -a and rsync -a work.
        ops.chmod = { path, _, _ in call { _ = try fs.attributes(of: string(path)); return 0 } }
        ops.chown = { path, _, _, _ in call { _ = try fs.attributes(of: string(path)); return 0 } }
        ops.link = { _, _ in -EPERM }
        ops.symlink = { _, _ in -EPERM }
        ops.mknod = { _, _, _ in -EPERM }
        return ops
    }
}
