import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit

/// Opening files: `open` of what the mount shows (bodies here or deferred, status files,
/// conflicts, scratch files) and `create`; the pending file every descriptor of a path being
/// written shares.
extension DocumentFileSystem {
    public func open(_ path: String, flags: Int32, caller: pid_t) throws -> OpenFile {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        let writing = flags & O_ACCMODE != O_RDONLY
        let truncating = flags & O_TRUNC != 0
        if writing { try checkWritable(node, path: path) }
        if let pending = claimPending(at: path) {
            // Being written: this open shares what is written so far, as on any disk.
            return try attach(pending, flags: flags, caller: caller)
        }
        switch node {
        case .properties(let id):
            let entry = try cached(id)
            guard let revision = entry.revision, showsProperties(of: id, revision) else { throw MountError.notFound(path) }
            let rendered = entry.rendered
            if writing {
                let handle = PropertiesWriteHandle(path: path, docID: id, base: revision.revID, initial: truncating ? [] : rendered)
                handle.seenProperties = revision.properties
                handle.emptiedAtOpen = truncating
                return try attach(register(handle), flags: flags & ~O_TRUNC, caller: caller)
            }
            return OpenFile(handle: handles.add(BytesHandle(path: path, bytes: rendered)), directIO: true, noFlush: true)
        case .attachment(let id, let name):
            guard let revision = try liveRevision(id), let attachment = try visibleAttachment(name, in: id) else {
                throw try attributes(of: path).kind == .directory ? MountError.isFolder(path) : MountError.notFound(path)
            }
            if writing {
                if !truncating && !attachment.contentAvailable {
                    throw SofaError.bodyNotAvailable(docID: id, name: name)
                }
                let handle = try AttachmentWriteHandle(path: path, docID: id, base: revision.revID, name: name,
                                                       contentType: attachment.contentType, blobs: store.blobs,
                                                       initialContent: truncating ? nil : attachment.blobKey)
                handle.seenDigest = attachment.digest
                handle.emptiedAtOpen = truncating
                return try attach(register(handle), flags: flags & ~O_TRUNC, caller: caller)
            }
            return try openForReading(attachment, docID: id, path: path, caller: caller)
        case .conflictProperties(let id, let rev):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            return OpenFile(handle: handles.add(BytesHandle(path: path, bytes: render(conflict.properties))), directIO: true)
        case .conflictAttachment(let id, let rev, let name):
            guard let conflict = try conflictRevision(id, rev), let attachment = conflict.attachment(named: name) else {
                throw MountError.notFound(path)
            }
            return try openForReading(attachment, docID: id, path: path, caller: caller)
        case .statusFile(let name):
            guard let bytes = try statusFile(name) else { throw MountError.notFound(path) }
            status.opened(name, bytes: bytes)
            return OpenFile(handle: handles.add(StatusFileHandle(path: path, name: name, bytes: bytes)), directIO: true)
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let file = try scratch.open(scratchPath(id, relative), flags: flags & ~O_CREAT)
            return OpenFile(handle: handles.add(ScratchHandle(path: path, file: file)))
        case .view(let view) where view.isReduceFile:
            return OpenFile(handle: handles.add(BytesHandle(path: path, bytes: try reduced(view, path: path))), directIO: true, noFlush: true)
        case .view(let view):
            _ = try viewAttributes(view, path: path)
            throw MountError.isFolder(path)
        case .query(let query):
            _ = try queryAttributes(query, path: path)
            throw MountError.isFolder(path)
        case .root, .docs, .statusDirectory, .document, .conflicts, .conflict:
            throw MountError.isFolder(path)
        }
    }

    private func openForReading(_ attachment: Attachment, docID: String, path: String, caller: pid_t) throws -> OpenFile {
        // A body evicted or purged a moment ago (the watcher has not said so yet) is deferred again.
        // Only a missing file means that: a disk error is answered as one, not with a remote fetch.
        let stored = try attachment.blobKey.flatMap { key -> BlobReader? in
            guard attachment.contentAvailable else { return nil }
            do {
                return try store.blobs.openReader(key, expectedLength: attachment.length)
            } catch SofaError.io(_, _, ENOENT) {
                return nil
            }
        }
        guard let reader = stored else {
            if let bodySource, let revID = try cached(docID).revision?.revID {
                // Who opens it decides whether it is fetched: a thumbnailer drawing a folder does
                // not download it (BrowsingPolicy); anyone else does.
                guard browsing.mayFetch(attachment.length, for: Caller(tid: caller)) else {
                    throw MountError.leftForThumbnailer(path, reader: Caller(tid: caller).description, length: attachment.length,
                                                        limit: browsing.thumbnailFetchMax ?? attachment.length)
                }
                // Reads fetch what they need; the kernel caches what they got (mmap works too).
                let reader = try bodySource.open(attachment, docID: docID, revID: revID)
                return OpenFile(handle: handles.add(DeferredBodyHandle(path: path, reader: reader, timeout: fetchTimeout)),
                                noFlush: true)
            }
            log.warning("\(path): the body of attachment \"\(attachment.name)\" is not on this machine (not downloaded)")
            return OpenFile(handle: handles.add(AbsentBodyHandle(path: path, docID: docID, attachment: attachment)), directIO: true,
                            noFlush: true)
        }
        store.noteRead(digest: attachment.digest)
        // A body never changes under its digest: keep the kernel's cache unless the path now shows another body.
        let keep = pending.noteOpened(path, digest: attachment.digest)
        // A large body is read by the kernel itself (FUSE passthrough, when in use): the blob
        // file never changes, and a new revision's body is another file. Not a sealed one (an
        // encrypted database): the kernel would read the ciphertext.
        let backing = reader.descriptor.flatMap { descriptor in
            reader.length >= Tuning.passthroughMinimumSize ? OpenFile.Backing(descriptor: descriptor, identity: reader.key.hex) : nil
        }
        return OpenFile(handle: handles.add(BlobReadHandle(path: path, reader: reader)), keepCache: keep, noFlush: true,
                        backing: backing)
    }

    public func create(_ path: String, permissions: UInt32, flags: Int32, caller: pid_t) throws -> OpenFile {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        try checkWritable(node, path: path)
        if let pending = claimPending(at: path) {
            guard flags & O_EXCL == 0 else {
                releaseUse(of: pending)
                throw MountError.exists(path)
            }
            return try attach(pending, flags: flags, caller: caller)
        }
        switch node {
        case .properties(let id):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let live = try liveRevision(id)
            let handle = PropertiesWriteHandle(path: path, docID: id, base: live?.revID, initial: [])
            handle.seenProperties = live?.properties
            handle.emptiedAtOpen = true
            return try attach(register(handle), flags: flags & ~O_TRUNC, caller: caller)
        case .attachment(let id, let name):
            guard !name.isEmpty, name != Node.blobsFolder else { throw MountError.isFolder(path) }
            try AttachmentName.validate(name)
            if let pointer = Blobs.pointer(ofStandIn: name), JSONPointer.segments(pointer) == nil {
                throw SofaError.invalidAttachmentName(name, reason: "a ~ in blobs/ must be ~0 (for ~) or ~1 (for /)")
            }
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let revision = try liveRevision(id)
            let existing = revision == nil ? nil : try visibleAttachment(name, in: id)
            let handle = try AttachmentWriteHandle(path: path, docID: id, base: revision?.revID, name: name,
                                                   contentType: existing?.contentType ?? MIMEType.forFileName(name),
                                                   blobs: store.blobs, initialContent: nil)
            handle.seenDigest = existing?.digest
            handle.emptiedAtOpen = true
            // The mode it is made with (a linker's 0755) is kept; the default needs no record.
            if permissions & 0o7777 != LocalAttributes.defaultFileMode { handle.given.mode = permissions & 0o7777 }
            let file = try attach(register(handle), flags: flags & ~O_TRUNC, caller: caller)
            noteEntryChange(name, in: id)
            return file
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let target = scratchPath(id, relative)
            try makeParents(of: target)
            let file = try scratch.open(target, flags: flags | O_CREAT, mode: mode_t(permissions))
            return OpenFile(handle: handles.add(ScratchHandle(path: path, file: file)))
        case .conflictProperties, .conflictAttachment, .conflict, .conflicts, .statusFile, .statusDirectory, .view, .query:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        case .root, .docs, .document:
            throw MountError.notWritableHere(path)
        }
    }

    /// Why a node that is shown cannot be written (the mount itself is writable).
    static func readOnlyReason(_ node: Node) -> MountError.ReadOnlyReason {
        switch node {
        case .statusFile, .statusDirectory: .status
        case .view: .view
        case .query: .queryResults
        default: .conflict
        }
    }

    func checkWritable(_ node: Node, path: String) throws {
        if readOnly { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .conflictProperties, .conflictAttachment, .conflict, .conflicts, .statusFile, .statusDirectory, .view:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        case .query(.results) where try attributesIfPresent(of: path) == nil:
            throw MountError.invalidArgument(path, why: "queries/ holds saved queries, each a NAME.json file (a Mango _find body), "
                                                 + "and beside each the folder of its results")
        case .query:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        default: return
        }
    }

    /// Makes `file` the pending file of its path, unless another open did so first (then that
    /// one is used and `file` is dropped).
    /// The caller is one more user of it.
    func register(_ file: WriteHandle) -> WriteHandle {
        let winner = pending.register(file)
        if winner !== file { file.close() }
        return winner
    }

    /// The file being written at `path`, with one more user, if there is one.
    func claimPending(at path: String) -> WriteHandle? {
        pending.claim(at: path)
    }

    /// A new descriptor on a pending file the caller claimed; `O_TRUNC` empties it.
    func attach(_ file: WriteHandle, flags: Int32, caller: pid_t) throws -> OpenFile {
        let descriptor = WriterDescriptor(file: file, opener: processOf(caller), openerThread: caller)
        if flags & O_TRUNC != 0 && flags & O_ACCMODE != O_RDONLY {
            do {
                try file.lock.withLock {
                    try file.truncate(to: 0)
                    file.emptiedAtOpen = true
                }
            } catch {
                release(descriptor)
                throw error
            }
        }
        // Attachments opened only to write skip the page cache (writes straight to the daemon);
        // properties.json always does (its size is known only when saved).
        let direct = file is PropertiesWriteHandle || flags & O_ACCMODE == O_WRONLY || flags & O_ACCMODE == O_RDONLY
        return OpenFile(handle: handles.add(descriptor), directIO: direct)
    }

    func makeParents(of path: String) throws {
        guard LongPath.makeParents(of: path) == 0 else {
            throw SofaError.system("mkdir", path: (path as NSString).deletingLastPathComponent, errno: errno)
        }
    }
}
