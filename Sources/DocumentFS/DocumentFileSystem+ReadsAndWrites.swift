import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Reads, writes, truncates, `flush` (a close: the save of a pending file) and `fsync` of
/// open files, and their release.
extension DocumentFileSystem {
    public func read(_ number: UInt64, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        let handle = try handles.get(number)
        if handle is BlobReadHandle || handle is BytesHandle || handle is DeferredBodyHandle {
            // Immutable, or (a body arriving) guarded inside: no lock held while a read waits.
            return try handle.read(into: buffer, at: offset)
        }
        return try handle.guardLock.withLock { try handle.read(into: buffer, at: offset) }
    }

    public func write(_ number: UInt64, _ bytes: UnsafeRawBufferPointer, at offset: Int64) throws -> Int {
        let handle = try handles.get(number)
        return try handle.guardLock.withLock { try handle.write(bytes, at: offset) }
    }

    public func truncate(_ path: String, to size: Int64, handle number: UInt64?) throws {
        if let number {
            let handle = try handles.get(number)
            try handle.guardLock.withLock { try handle.truncate(to: size) }
            return
        }
        if let pending = claimPending(at: path) {
            // Being written: truncated like any open file, saved when its writer closes it. The
            // truncate holds a use of it meanwhile: a `close` just before it (whose release may
            // arrive at the same moment) must not leave its change unsaved, so when it is the
            // last user, its release saves (`truncate` right after `close` of a new file was
            // lost 55 times in 60).
            defer { releaseUse(of: pending) }
            try pending.lock.withLock { try pending.truncate(to: size) }
            return
        }
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        switch node {
        case .properties, .attachment:
            // open, truncate, save, close: one revision.
            let file = try open(path, flags: O_WRONLY, caller: 0)
            guard let descriptor = try handles.get(file.handle) as? WriterDescriptor else { throw MountError.inconsistent(path, why: "the open file is not a writer's") }
            defer { release(file.handle) }
            try descriptor.file.lock.withLock {
                try descriptor.file.truncate(to: size)
                try save(descriptor.file)
            }
        case .scratch(let id, let relative):
            guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
            try scratch.truncate(scratchPath(id, relative), to: size)
        default:
            try checkWritable(node, path: path)
            throw MountError.isFolder(path)
        }
    }

    /// A close of a descriptor: the process that opened it saves what it wrote as one revision;
    /// a copy it handed to a child process (a shell's redirection) saves nothing when the
    /// child closes it: the opener's close, or the last one, does. A created or emptied file
    /// that nothing was written to waits for the last close (shells close a duplicate first).
    public func flush(_ number: UInt64, caller: pid_t) throws {
        guard let descriptor = try handles.get(number) as? WriterDescriptor else { return }
        guard caller == 0 || caller == descriptor.openerThread || processOf(caller) == descriptor.opener else { return }
        let file = descriptor.file
        try file.lock.withLock {
            guard !file.unlinked else { return }
            try save(file)
        }
    }

    /// Durable, not yet a revision: fsync syncs what was written to disk and records it as a
    /// pending save (a mount that stops before saving it saves it at its next start); the
    /// revision is made when the file is closed, as without the fsync. SQLite's commits, msync
    /// and editors' fsyncs make no revisions of their own.
    public func fsync(_ number: UInt64) throws {
        let handle = try handles.get(number)
        FuseMount.mayBlock()  // an fsync: others are answered meanwhile
        if let scratch = handle as? ScratchHandle {
            return try scratch.file.sync()
        }
        guard let descriptor = handle as? WriterDescriptor else { return }
        let file = descriptor.file
        try file.lock.withLock {
            guard !file.unlinked, file.dirty || file.emptiedAtOpen, !file.failed else {
                if file.failed, let error = file.lastError { throw error }
                return
            }
            try makeDurable(file)
        }
    }

    public func release(_ number: UInt64) {
        guard let handle = handles.remove(number) else { return }
        release(handle)
    }

    func release(_ handle: Handle) {
        guard let descriptor = handle as? WriterDescriptor else {
            handle.lock.withLock { handle.close() }
            if let file = handle as? StatusFileHandle { status.closed(file.name) }
            return
        }
        releaseUse(of: descriptor.file)
    }

    /// One user less; the last saves what is left to save, and only then does the file stop
    /// being pending (until then, its path shows it: no moment where it is nowhere).
    func releaseUse(of file: WriteHandle) {
        guard pending.release(file) else { return }
        file.lock.withLock {
            if file.dirty || file.emptiedAtOpen, !file.failed, !file.unlinked {
                file.dirty = true
                do { try save(file) } catch { log.error("\(file.path): not saved: \(error)") }
            }
            dropPendingSave(of: file)  // not saved after all (a failed write): nothing to recover either
            let unused = pending.retire(file)  // false: opened again meanwhile, still pending
            if unused { file.close() }
        }
    }
}
