@preconcurrency import CFuse3
import Foundation
import Logging

/// FUSE passthrough (Linux 6.9 and later, protocol 7.40): files the kernel reads itself.
///
/// An open answered with `FOPEN_PASSTHROUGH` and a backing id makes the kernel serve reads
/// and mmap of that file from the backing file registered under the id, without a READ
/// request to this process. libfuse 3.14 (Debian 12) predates the API, so this goes around
/// it: the session's I/O hooks (`DeviceIO`) show it every request as it is read from
/// `/dev/fuse` and every reply before it is written. Two replies change:
/// - INIT: when the kernel offers `FUSE_PASSTHROUGH`, the reply takes it (with
///   `FUSE_INIT_EXT` and `max_stack_depth = 1`: backing files on a plain file system).
/// - OPEN: a file the file system opened with a backing descriptor (`OpenFile.backing`) was
///   registered with `FUSE_DEV_IOC_BACKING_OPEN`; its reply gets `FOPEN_PASSTHROUGH` and the id.
/// Backing ids are a kernel resource: each goes with the release of its file. Layouts are
/// those of the kernel's `include/uapi/linux/fuse.h`.
final class Passthrough: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `lock`, but `device`, which is
    // set once before any worker runs.

    enum State: Equatable, CustomStringConvertible {
        case waitingForInit
        case inUse
        case disabled
        case notOffered
        case refused(String)

        var description: String {
            switch self {
            case .waitingForInit: "not negotiated yet"
            case .inUse: "in use"
            case .disabled: "off (--no-passthrough)"
            case .notOffered: "off: the kernel does not offer it (Linux 6.9 and later, as root)"
            case .refused(let reason): "off: \(reason)"
            }
        }
    }

    private let lock = NSLock()
    private var state: State
    private var initUnique: UInt64?
    private var kernelOffers = false
    /// OPEN requests awaiting their reply, by unique.
    private var pendingOpens: Set<UInt64> = []
    /// The kernel allows one backing file per inode at a time, shared by every open of it: the
    /// backing id of each inode open through passthrough, with what it holds and how many opens.
    private struct InodeBacking {
        let id: Int32
        let identity: String
        var opens: Int
    }
    private var inodes: [fuse_ino_t: InodeBacking] = [:]
    /// The inode and backing id of each open file handle, from the open to the release.
    private var handles: [UInt64: (ino: fuse_ino_t, id: Int32)] = [:]
    private var opened = 0
    var openedCount: Int { lock.withLock { opened } }
    private var device: Int32 = -1
    private let log = Logger(label: "sofa.fuse")

    init(enabled: Bool) {
        state = enabled ? .waitingForInit : .disabled
    }

    var currentState: State { lock.withLock { state } }
    var isInUse: Bool { lock.withLock { state == .inUse } }
    /// Files open through passthrough now.
    var openFiles: Int { lock.withLock { handles.count } }

    /// Takes the session's device (after it is mounted, before it serves); `hooked` says whether
    /// its requests and replies pass through `received` and `sending` (`DeviceIO`).
    func attach(device: Int32, hooked: Bool) {
        guard currentState != .disabled else { return }
        self.device = device
        if !hooked { lock.withLock { state = .refused("libfuse did not take the I/O hooks") } }
    }

    // MARK: Requests and replies

    private static let headerSize = 40, replyHeaderSize = 16
    private static let opInit: UInt32 = 26, opOpen: UInt32 = 14
    private static let initExtended: UInt32 = 1 << 30, writebackCache: UInt32 = 1 << 16
    /// `FUSE_PASSTHROUGH` is bit 37 of the 64 flags: bit 5 of `flags2`.
    private static let passthroughFlag2: UInt32 = 1 << 5
    private static let openPassthrough: UInt32 = 1 << 7, openNoFlush: UInt32 = 1 << 5

    /// A request read from the device: remember INIT (what the kernel offers) and OPENs.
    func received(_ buffer: UnsafeRawPointer, count: Int) {
        guard count >= Self.headerSize else { return }
        let opcode = buffer.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        guard opcode == Self.opOpen || opcode == Self.opInit else { return }
        let unique = buffer.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
        lock.withLock {
            if opcode == Self.opOpen {
                if state == .inUse { pendingOpens.insert(unique) }
                return
            }
            guard count >= Self.headerSize + 20 else { return }
            let flags = buffer.loadUnaligned(fromByteOffset: Self.headerSize + 12, as: UInt32.self)
            let flags2 = buffer.loadUnaligned(fromByteOffset: Self.headerSize + 16, as: UInt32.self)
            initUnique = unique
            kernelOffers = flags & Self.initExtended != 0 && flags2 & Self.passthroughFlag2 != 0
        }
    }

    /// A reply about to be written: INIT takes passthrough, an OPEN of a registered file uses it.
    func sending(_ vectors: UnsafeMutablePointer<iovec>, count: Int) {
        guard count >= 2, vectors[0].iov_len >= Self.replyHeaderSize, let header = vectors[0].iov_base,
              let body = vectors[1].iov_base else { return }
        let unique = header.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
        let failed = header.loadUnaligned(fromByteOffset: 4, as: Int32.self) != 0
        var announce: String?
        lock.withLock {
            if unique == initUnique {
                initUnique = nil
                guard state == .waitingForInit else { return }
                let flags = body.loadUnaligned(fromByteOffset: 12, as: UInt32.self)
                guard !failed, vectors[1].iov_len >= 40 else { state = .refused("INIT failed"); return }
                guard kernelOffers else { state = .notOffered; announce = state.description; return }
                guard flags & Self.writebackCache == 0 else { state = .refused("writeback cache is on"); announce = state.description; return }
                body.storeBytes(of: flags | Self.initExtended, toByteOffset: 12, as: UInt32.self)
                let flags2 = body.loadUnaligned(fromByteOffset: 32, as: UInt32.self)
                body.storeBytes(of: flags2 | Self.passthroughFlag2, toByteOffset: 32, as: UInt32.self)
                body.storeBytes(of: UInt32(1), toByteOffset: 36, as: UInt32.self)  // max_stack_depth
                state = .inUse
                announce = "in use"
                return
            }
            guard pendingOpens.remove(unique) != nil, !failed, vectors[1].iov_len == 16 else { return }
            let handle = body.loadUnaligned(fromByteOffset: 0, as: UInt64.self)
            guard let id = handles[handle]?.id else { return }
            // Only these open flags may go with passthrough (the kernel's FOPEN_PASSTHROUGH_MASK:
            // no FOPEN_KEEP_CACHE, the page cache is the backing file's).
            let flags = body.loadUnaligned(fromByteOffset: 8, as: UInt32.self)
            body.storeBytes(of: (flags & Self.openNoFlush) | Self.openPassthrough, toByteOffset: 8, as: UInt32.self)
            body.storeBytes(of: id, toByteOffset: 12, as: Int32.self)
        }
        if let announce { log.info("FUSE passthrough: \(announce)") }
    }

    // MARK: Backing files

    /// What became of an open offered a backing file.
    enum Outcome {
        /// Served as without passthrough.
        case notUsed
        /// The kernel reads it; `first` when this open made the inode's backing file.
        case used(first: Bool)
        /// Its inode is open through passthrough with other bytes (the file changed since):
        /// the kernel would refuse any other answer, so the open must fail.
        case conflict
    }

    /// Arranges for the open file `handle` of inode `ino`, whose OPEN reply is about to be
    /// sent, to be read by the kernel from `backing`: registered with the kernel unless the
    /// inode has that backing file already.
    func register(_ backing: OpenFile.Backing, for handle: UInt64, inode ino: fuse_ino_t) -> Outcome {
        guard isInUse else { return .notUsed }
        if let outcome = lock.withLock({ () -> Outcome? in
            guard var shared = inodes[ino] else { return nil }
            guard shared.identity == backing.identity else { return .conflict }
            shared.opens += 1
            inodes[ino] = shared
            handles[handle] = (ino, shared.id)
            opened += 1
            return .used(first: false)
        }) { return outcome }
        let id = cfuse_backing_open(device, backing.descriptor)
        guard id > 0 else {
            let code = errno
            let reason = String(cString: strerror(code))
            lock.withLock {
                // Not allowed at all (no CAP_SYS_ADMIN): stop asking. Others may be per file (a
                // backing file on a stacked file system).
                if code == EPERM { state = .refused("the kernel refused a backing file: \(reason)") }
            }
            log.notice("FUSE passthrough: the kernel refused a backing file (\(reason)); served by reads instead")
            return .notUsed
        }
        let raced = lock.withLock { () -> Bool in
            if inodes[ino] != nil { return true }  // another open of the inode registered meanwhile
            inodes[ino] = InodeBacking(id: id, identity: backing.identity, opens: 1)
            handles[handle] = (ino, id)
            opened += 1
            return false
        }
        if raced {
            _ = cfuse_backing_close(device, id)
            return register(backing, for: handle, inode: ino)
        }
        return .used(first: true)
    }

    /// The file `handle` is closed (or its open was never answered); the inode's backing id
    /// goes with its last open.
    func release(_ handle: UInt64) {
        let unused = lock.withLock { () -> Int32? in
            guard let (ino, id) = handles.removeValue(forKey: handle), var shared = inodes[ino] else { return nil }
            shared.opens -= 1
            guard shared.opens == 0 else {
                inodes[ino] = shared
                return nil
            }
            inodes[ino] = nil
            return id
        }
        if let unused { _ = cfuse_backing_close(device, unused) }
    }
}
