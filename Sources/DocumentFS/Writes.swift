import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// What makes two attachments the same in a revision.
/// renameat2(2) flags (not exported by Glibc's module).
private let renameNoReplace: UInt32 = 1
private let renameExchange: UInt32 = 2

extension DocumentFileSystem {
    // MARK: - Opening

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
            guard let revision = entry.revision, removal(id)?.properties != true else { throw MountError.notFound(path) }
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
                                                       contentType: attachment.contentType, blobs: database.blobs,
                                                       initialContent: truncating ? nil : attachment.blobKey)
                handle.seenDigest = attachment.digest
                handle.emptiedAtOpen = truncating
                return try attach(register(handle), flags: flags & ~O_TRUNC, caller: caller)
            }
            return try openForReading(attachment, docID: id, path: path)
        case .conflictProperties(let id, let rev):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            return OpenFile(handle: handles.add(BytesHandle(path: path, bytes: render(conflict.properties))), directIO: true)
        case .conflictAttachment(let id, let rev, let name):
            guard let conflict = try conflictRevision(id, rev), let attachment = conflict.attachment(named: name) else {
                throw MountError.notFound(path)
            }
            return try openForReading(attachment, docID: id, path: path)
        case .statusFile(let name):
            guard let bytes = try statusFile(name) else { throw MountError.notFound(path) }
            withState { openStatusFiles[name] = (bytes, (openStatusFiles[name]?.opens ?? 0) + 1) }
            return OpenFile(handle: handles.add(StatusFileHandle(path: path, name: name, bytes: bytes)), directIO: true)
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let fd = Glibc.open(scratchPath(id, relative), (flags & ~O_CREAT) | O_CLOEXEC)
            guard fd >= 0 else { throw SofaError.system("open", path: scratchPath(id, relative), errno: errno) }
            return OpenFile(handle: handles.add(ScratchHandle(path: path, fd: fd)))
        case .root, .docs, .statusDirectory, .document, .conflicts, .conflict:
            throw MountError.isFolder(path)
        }
    }

    private func openForReading(_ attachment: Attachment, docID: String, path: String) throws -> OpenFile {
        // A body evicted or purged a moment ago (the watcher has not said so yet) is deferred again.
        // Only a missing file means that: a disk error is answered as one, not with a remote fetch.
        let stored = try attachment.blobKey.flatMap { key -> BlobReader? in
            guard attachment.contentAvailable else { return nil }
            do {
                return try database.blobs.openReader(key, expectedLength: attachment.length)
            } catch SofaError.io(_, _, ENOENT) {
                return nil
            }
        }
        guard let reader = stored else {
            if let bodySource, let revID = try cached(docID).revision?.revID {
                // Reads fetch what they need; the kernel caches what they got (mmap works too).
                let reader = try bodySource.open(attachment, docID: docID, revID: revID)
                return OpenFile(handle: handles.add(DeferredBodyHandle(path: path, reader: reader, timeout: fetchTimeout)),
                                noFlush: true)
            }
            log.warning("\(path): the body of attachment \"\(attachment.name)\" is not on this machine (not downloaded)")
            return OpenFile(handle: handles.add(AbsentBodyHandle(path: path, docID: docID, attachment: attachment)), directIO: true,
                            noFlush: true)
        }
        database.noteRead(digest: attachment.digest)
        // A body never changes under its digest: keep the kernel's cache unless the path now shows another body.
        let keep = withState {
            let same = openedDigests[path] == attachment.digest
            openedDigests[path] = attachment.digest
            return same
        }
        // A large body is read by the kernel itself (FUSE passthrough, when in use): the blob
        // file never changes, and a new revision's body is another file.
        return OpenFile(handle: handles.add(BlobReadHandle(path: path, reader: reader)), keepCache: keep, noFlush: true,
                        backing: reader.length >= Tuning.passthroughMinimumSize
                            ? OpenFile.Backing(descriptor: reader.descriptor, identity: reader.key.hex) : nil)
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
                                                   blobs: database.blobs, initialContent: nil)
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
            let fd = Glibc.open(target, flags | O_CREAT | O_CLOEXEC, mode_t(permissions))
            guard fd >= 0 else { throw SofaError.system("open", path: target, errno: errno) }
            return OpenFile(handle: handles.add(ScratchHandle(path: path, fd: fd)))
        case .conflictProperties, .conflictAttachment, .conflict, .conflicts, .statusFile, .statusDirectory:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        case .root, .docs, .document:
            throw MountError.notWritableHere(path)
        }
    }

    /// Why a node that is shown cannot be written (the mount itself is writable).
    static func readOnlyReason(_ node: Node) -> MountError.ReadOnlyReason {
        switch node {
        case .statusFile, .statusDirectory: .status
        default: .conflict
        }
    }

    private func checkWritable(_ node: Node, path: String) throws {
        if readOnly { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .conflictProperties, .conflictAttachment, .conflict, .conflicts, .statusFile, .statusDirectory:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        default: return
        }
    }

    /// Makes `file` the pending file of its path, unless another open did so first (then that
    /// one is used and `file` is dropped).
    /// The caller is one more user of it.
    func register(_ file: WriteHandle) -> WriteHandle {
        let winner = withState { () -> WriteHandle in
            let winner = pendingFiles[file.path] ?? file
            pendingFiles[file.path] = winner
            winner.users += 1
            return winner
        }
        if winner !== file { file.close() }
        return winner
    }

    /// The file being written at `path`, with one more user, if there is one.
    func claimPending(at path: String) -> WriteHandle? {
        withState {
            guard let file = pendingFiles[path] else { return nil }
            file.users += 1
            return file
        }
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
        let parent = (path as NSString).deletingLastPathComponent
        guard !isDirectory(parent) else { return }
        try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
    }

    // MARK: - Reading and writing

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
            guard Glibc.truncate(scratchPath(id, relative), off_t(size)) == 0 else { throw SofaError.system("truncate", path: scratchPath(id, relative), errno: errno) }
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
            guard Glibc.fsync(scratch.fd) == 0 else { throw SofaError.system("fsync", path: scratch.path, errno: errno) }
            return
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

    /// Syncs a pending file's bytes and records them as a pending save. Caller holds its lock.
    private func makeDurable(_ file: WriteHandle) throws {
        let id = file.durableID ?? UUID().uuidString.lowercased()
        let keep = database.pendingSaveFile(id)
        let record: PendingSave
        switch file {
        case let properties as PropertiesWriteHandle:
            // Refused now if it would be refused at close (close and fsync report invalid JSON alike).
            do { _ = try parseProperties(properties.buffer) } catch {
                keepRejected(properties.buffer, of: file.docID, because: error)
                throw error
            }
            let fd = Glibc.open(keep, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            guard fd >= 0 else { throw SofaError.system("open", path: keep, errno: errno) }
            defer { Glibc.close(fd) }
            let written = properties.buffer.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            guard written == properties.buffer.count, fdatasync(fd) == 0 else { throw SofaError.system("write", path: keep, errno: errno) }
            record = PendingSave(id: id, pid: getpid(), docID: file.docID, name: nil, base: file.base, contentType: nil, file: keep)
        case let attachment as AttachmentWriteHandle:
            guard try attachment.makeDurable(at: keep) else { return }
            record = PendingSave(id: id, pid: getpid(), docID: file.docID, name: attachment.name, base: file.base,
                                 contentType: attachment.contentType, file: keep)
        default:
            return
        }
        try database.recordPendingSave(record)
        file.durableID = id
    }

    /// Forgets the pending save of `file`, if it has one. Caller holds its lock.
    private func dropPendingSave(of file: WriteHandle) {
        guard let id = file.durableID else { return }
        database.removePendingSave(id)
        file.durableID = nil
    }

    /// Saves what mounts that stopped (killed, crashed, the machine went down) had made durable
    /// with fsync but not saved: each becomes the revision its close would have made.
    func recoverPendingSaves() {
        guard !readOnly else { return }
        let saves: [PendingSave]
        do {
            saves = try database.pendingSaves()
        } catch {
            // They stay in the journal for the next mount; this one says so rather than nothing.
            log.error("cannot read the journal of saves made durable by a mount that stopped, so none is recovered now: \(error)")
            return
        }
        for save in saves where save.pid != getpid() && kill(save.pid, 0) != 0 && errno == ESRCH {
            let place = "docs/\(FileNames.escape(save.docID))/" + (save.name.map { "attachments/\($0)" } ?? Node.propertiesFileName)
            do {
                if access(save.file, F_OK) == 0 {
                    if let name = save.name {
                        let blob = try database.blobs.adopt(fileAt: save.file, keepingOriginal: true)
                        _ = try commit(save.docID, base: save.base, change: .attachment(name)) { draft in
                            try draft.setAttachment(name, blob: blob, contentType: save.contentType ?? MIMEType.forFileName(name))
                        }
                    } else {
                        let properties = try parseProperties(try readSmallFile(save.file))
                        _ = try commit(save.docID, base: save.base, change: .properties) { $0.properties = properties }
                    }
                    log.notice("\(place): saved what was written and fsynced before the mount stopped")
                }
                database.removePendingSave(save.id)
            } catch {
                log.error("\(place): cannot save what was fsynced before the mount stopped: \(error); kept in \(save.file)")
            }
        }
    }

    public func release(_ number: UInt64) {
        guard let handle = handles.remove(number) else { return }
        release(handle)
    }

    private func release(_ handle: Handle) {
        guard let descriptor = handle as? WriterDescriptor else {
            handle.lock.withLock { handle.close() }
            if let status = handle as? StatusFileHandle {
                withState {
                    guard let open = openStatusFiles[status.name] else { return }
                    openStatusFiles[status.name] = open.opens > 1 ? (open.bytes, open.opens - 1) : nil
                }
            }
            return
        }
        releaseUse(of: descriptor.file)
    }

    /// One user less; the last saves what is left to save, and only then does the file stop
    /// being pending (until then, its path shows it: no moment where it is nowhere).
    func releaseUse(of file: WriteHandle) {
        guard withState({ () -> Bool in
            file.users -= 1
            return file.users == 0
        }) else { return }
        file.lock.withLock {
            if file.dirty || file.emptiedAtOpen, !file.failed, !file.unlinked {
                file.dirty = true
                do { try save(file) } catch { log.error("\(file.path): not saved: \(error)") }
            }
            dropPendingSave(of: file)  // not saved after all (a failed write): nothing to recover either
            let unused = withState { () -> Bool in
                guard file.users == 0 else { return false }  // opened again meanwhile: still pending
                if pendingFiles[file.path] === file { pendingFiles[file.path] = nil }
                return true
            }
            if unused { file.close() }
        }
    }

    /// Saves a dirty write handle as a revision. Caller holds the handle's lock.
    /// A failed save is reported again by every later flush until the file is written again.
    private func save(_ handle: WriteHandle) throws {
        if !handle.dirty, handle.failed, let error = handle.lastError { throw error }
        guard handle.dirty else { return }
        FuseMount.mayBlock()  // a commit and its fsync: others are answered meanwhile
        defer { dropPendingSave(of: handle) }  // saved, or refused (its text kept apart): not pending either way
        do {
            let revision: Revision
            switch handle {
            case let properties as PropertiesWriteHandle:
                let object: JSONObject
                do {
                    object = try parseProperties(properties.buffer)
                } catch {
                    keepRejected(properties.buffer, of: handle.docID, because: error)
                    throw error
                }
                do {
                    revision = try commit(handle.docID, base: handle.base, change: handle.change,
                                          seen: properties.seenProperties.map(Seen.properties) ?? .unknown) { $0.properties = object }
                } catch let error as SofaError where error.isRefusedByDesign {
                    // A validator's refusal keeps the text and its reason, as invalid JSON does.
                    keepRejected(properties.buffer, of: handle.docID, because: error)
                    throw error
                }
                clearRejected(of: handle.docID)
                properties.seenProperties = object
            case let attachment as AttachmentWriteHandle:
                // A file closed in a busy document is staged: its body is synced with the fold that saves it.
                let durable = !mayStage(handle.docID)
                let blob = try attachment.commitBody(durable: durable)
                let base = try saveAttachment(handle.docID, attachment.name, blob: blob, contentType: attachment.contentType,
                                              base: handle.base, seen: attachment.seenDigest, given: handle.given, synced: durable)
                attachment.seenDigest = blob.key.digestString
                withState { openedDigests[handle.path] = nil }
                handle.given = LocalAttributes()
                handle.base = base
                handle.dirty = false
                handle.emptiedAtOpen = false
                return
            default:
                return
            }
            handle.base = revision.revID
            handle.dirty = false
            handle.emptiedAtOpen = false
        } catch {
            handle.failed = true
            handle.lastError = error
            handle.dirty = false
            handle.emptiedAtOpen = false
            throw error
        }
    }

    static let rejectedName = "properties.rejected.json"
    static let rejectedReasonName = "properties.rejected.txt"

    /// A properties.json that could not be saved: its bytes are kept beside it in the document's
    /// folder (a scratch file, never replicated) and the reason in a text file next to them, so
    /// that nothing typed is lost and a file-manager user can read why.
    func keepRejected(_ bytes: [UInt8], of id: String, because error: Error) {
        let reason = """
            properties.json was not saved (\(ISO8601DateFormatter().string(from: Date()))): \(error)
            The document is unchanged. What was written is in \(DocumentFileSystem.rejectedName): fix it and save it as properties.json.

            """
        log.error("docs/\(FileNames.escape(id))/properties.json: not saved, the document is unchanged: \(error); the text is kept in \(DocumentFileSystem.rejectedName)")
        do {
            try writeScratch(scratchPath(id, DocumentFileSystem.rejectedName), bytes: bytes)
            try writeScratch(scratchPath(id, DocumentFileSystem.rejectedReasonName), bytes: Array(reason.utf8))
        } catch {
            log.error("docs/\(FileNames.escape(id))/properties.json: the refused text could not be kept in \(DocumentFileSystem.rejectedName) either: \(error)")
        }
    }

    /// After a good save: the rejected text and its reason go.
    func clearRejected(of id: String) {
        Glibc.unlink(scratchPath(id, DocumentFileSystem.rejectedName))
        Glibc.unlink(scratchPath(id, DocumentFileSystem.rejectedReasonName))
    }

    func parseProperties(_ bytes: [UInt8]) throws -> JSONObject {
        let value: JSONValue
        do { value = try JSONValue(parsing: bytes) } catch { throw SofaError.invalidJSON(error) }
        guard case .object(let object) = value else {
            throw SofaError.invalidDocument(reason: "properties.json must hold a JSON object, not \(value.kindName)")
        }
        return object
    }

    /// What a writer saw when it began: the attachment's digest (nil: absent) or the
    /// properties, so that a change made meanwhile is told without reloading the revision it
    /// began from (a document of many files keeps no bodies of its history).
    enum Seen {
        case unknown
        case attachment(String?)
        case properties(JSONObject)
    }

    /// Saves a change made from `base`: on top of the current revision when the
    /// change does not collide with what happened since, else as a conflicting
    /// branch from `base`. Removals under way (`rm -r`) and the document's staged files
    /// (`Bursts.swift`) are saved with it.
    func commit(_ id: String, base: RevisionID?, change: Change, seen: Seen = .unknown,
                _ apply: (inout RevisionDraft) throws -> Void) throws -> Revision {
        guard let revision = try commitChanges(id, base: base, change: change, seen: seen, apply) else {
            throw SofaError.documentNotFound(id)
        }
        return revision
    }

    /// `commit`, or with no `change`, a fold of the staged files alone. Returns the revision
    /// the change is in (the current one when it changed nothing).
    func commitChanges(_ id: String, base: RevisionID?, change: Change?, seen: Seen,
                       _ apply: (inout RevisionDraft) throws -> Void) throws -> Revision? {
        for _ in 0..<8 {
            let burst = withState { bursts[id] }
            let staged = (burst?.staged.values).map(Array.init) ?? []
            let current = try database.currentRevision(of: id)
            let live = current.flatMap { $0.deleted ? nil : $0 }
            let liveByName = Dictionary((live?.attachments ?? []).map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            // Staged files whose names nobody else changed since go on top of the current revision.
            // (One the current revision already holds, folded by a commit running beside this one, is neither.)
            let (fits, clashes) = staged.reduce(into: ([StagedAttachment](), [StagedAttachment]())) { parts, file in
                let current = liveByName[file.name]
                if live != nil && current?.digest == file.attachment.digest && current?.contentType == file.attachment.contentType { return }
                if live != nil && current?.digest == file.expectedDigest { parts.0.append(file) } else { parts.1.append(file) }
            }
            let onLive = change == nil || live?.revID == base || (base == nil && live == nil)
                || !collides(change!, base: base, seen: seen, live: live, liveByName: liveByName, burst: burst, id: id)
            var drafts: [(draft: RevisionDraft, allowConflict: Bool)] = []
            var liveDraft: RevisionDraft?
            if onLive && change != nil || !fits.isEmpty {
                var draft = try database.newRevision(of: id)
                for file in fits { try draft.setAttachment(file.attachment) }
                liveDraft = draft
            }
            var changeDraft: RevisionDraft? = nil
            if change != nil, !onLive { changeDraft = try conflictDraft(id, from: base, live: live) }
            let removal = removal(id)
            let aside = withState { setAside[id] ?? [:] }
            if var draft = changeDraft ?? liveDraft {
                if let removal {
                    for name in removal.attachments where draft.attachments[name] != nil { try draft.removeAttachment(name) }
                }
                for (name, set) in aside where draft.attachments[name]?.digest == set.digest { try draft.removeAttachment(name) }
                if change != nil { try apply(&draft) }
                if changeDraft != nil { changeDraft = draft } else { liveDraft = draft }
            }
            if let draft = liveDraft {
                if let live, live.revID == draft.parent, draft.repeats(live) {
                    // Nothing changed (rsync rewriting a file with the same bytes, a backup put back): no new revision.
                } else {
                    drafts.append((draft, false))
                }
            }
            if let draft = changeDraft { drafts.append((draft, true)) }
            if !clashes.isEmpty, let burst {
                // Changed elsewhere while staged (or the document went): kept as a branch of what the mount showed.
                var branch = try database.newRevision(of: id, from: burst.base.revID, like: burst.base)
                for file in clashes { try branch.setAttachment(file.attachment) }
                drafts.append((branch, true))
            }
            do {
                defer { if !drafts.isEmpty || !staged.isEmpty { documentChanged(id) } }
                try syncBodies(staged.compactMap(\.attachment.blobKey))
                let saved = try database.save(drafts.map { ($0.draft, $0.allowConflict) }, unstaging: staged.map(\.seq))
                for (index, draft) in drafts.enumerated() where draft.allowConflict {
                    log.warning("docs/\(FileNames.escape(id)): changed since it was written; saved as conflicting revision \(saved[index].revID)")
                }
                endSetAside(aside.keys, of: id)
                withState {
                    // What the mount showed is what the revision holds: nothing for the watcher to undo.
                    if clashes.isEmpty, drafts.count == 1, !drafts[0].allowConflict {
                        ownSaves[id] = saved[0].revID
                        if ownSaves.count > 10_000 { ownSaves.removeAll() }
                    }
                    if !drafts.isEmpty { removals[id] = nil }
                    if var burst = bursts[id] {
                        for file in staged where burst.staged[file.name]?.seq == file.seq {
                            burst.staged[file.name] = nil
                        }
                        if burst.staged.isEmpty { bursts[id] = nil } else {
                            burst.folders = Set(burst.staged.keys.flatMap(DocumentCache.Entry.folders(of:)))
                            bursts[id] = burst
                        }
                    }
                }
                if changeDraft != nil { return saved[drafts.firstIndex { $0.allowConflict }!] }
                if liveDraft != nil, let first = drafts.firstIndex(where: { !$0.allowConflict }) { return saved[first] }
                return live
            } catch SofaError.conflict {
                continue  // another writer saved in between: look again
            }
        }
        throw SofaError.conflict(docID: id, revID: base?.description, current: try database.currentRevision(of: id)?.revID.description ?? "(none)")
    }

    /// A draft for a change that collides: a branch from `base` with what `base` held, or,
    /// when the database no longer keeps `base`'s body (history of a large document), with
    /// what the current revision holds; a new document's branch without a base.
    private func conflictDraft(_ id: String, from base: RevisionID?, live: Revision?) throws -> RevisionDraft {
        guard let base else { return try database.newDocument(id) }
        do {
            return try database.newRevision(of: id, from: base)
        } catch SofaError.revisionNotFound {
            return try database.newRevision(of: id, from: base, like: live)
        }
    }

    /// Sets an attachment aside: renamed to a scratch name in its own document (an editor's
    /// backup, `gio copy -b`, emacs' first save), it leaves the view at once, but its removal
    /// waits for the document's next save (the new file at its name, usually within
    /// milliseconds) or `Tuning.setAsideGrace`, so that the rename and the new file make one
    /// revision, and no revision without the attachment reaches a replica in between.
    func setAside(_ attachment: Attachment, of id: String) {
        let since = Date()
        withState { setAside[id, default: [:]][attachment.name] = SetAside(digest: attachment.digest, since: since) }
        DispatchQueue.global().asyncAfter(deadline: .now() + Tuning.setAsideGrace) { [weak self] in
            self?.removeSetAside(of: id, setAsideBy: since)
        }
    }

    /// Saves the removal of what was set aside in document `id` by `date` (everything: nil).
    func removeSetAside(of id: String, setAsideBy date: Date? = nil) {
        let due = withState { (setAside[id] ?? [:]).filter { entry in date.map { entry.value.since <= $0 } ?? true }.keys }
        guard let name = due.first else { return }
        do {
            guard let live = try liveRevision(id) else {
                endSetAside(due, of: id)  // deleted meanwhile: nothing to remove
                return
            }
            // The save applies every set-aside removal of the document (see `commit`).
            _ = try commit(id, base: live.revID, change: .attachment(name)) { _ in }
        } catch {
            log.error("\(String.attachmentPath(id, name).dropFirst()): its removal (renamed to a scratch name) was not saved: \(error)")
        }
    }

    /// Saves every removal still waiting (the mount is ending).
    public func saveSetAsideRemovals() {
        for id in withState({ Array(setAside.keys) }) { removeSetAside(of: id) }
    }

    private func endSetAside(_ names: Dictionary<String, SetAside>.Keys, of id: String) {
        guard !names.isEmpty else { return }
        withState {
            for name in names { setAside[id]?[name] = nil }
            if setAside[id]?.isEmpty == true { setAside[id] = nil }
        }
    }

    /// Whether a change made from `base` touches what changed between `base` and `live` (staged
    /// files count as changed, as the mount shows them).
    private func collides(_ change: Change, base: RevisionID?, seen: Seen, live: Revision?, liveByName: [String: Attachment],
                          burst: Burst?, id: String) -> Bool {
        guard let live else { return base != nil }  // deleted since: keep the edit as a branch
        switch (change, seen) {
        case (.attachment(let name), .attachment(let digest)):
            return digest != (burst?.staged[name]?.attachment.digest ?? liveByName[name]?.digest)
        case (.properties, .properties(let properties)):
            return properties != live.properties
        default:
            break
        }
        guard let base else {
            switch change {
            case .properties: return !live.properties.isEmpty
            case .attachment(let name): return burst?.staged[name] != nil || liveByName[name] != nil
            }
        }
        let original: Revision
        do { original = try database.revision(base, of: id) } catch {
            // Its body is gone (pruned history) or unreadable: keep the edit as a branch, lose nothing.
            log.notice("docs/\(FileNames.escape(id)): cannot compare with revision \(base) (\(error)); the change is kept as a branch if it is not the current one")
            return true
        }
        switch change {
        case .properties: return original.properties != live.properties
        case .attachment(let name):
            return original.attachment(named: name)?.digest != (burst?.staged[name]?.attachment.digest ?? liveByName[name]?.digest)
        }
    }

    // MARK: - Namespace

    public func makeDirectory(_ path: String) throws {
        guard let node = Node(path: path) else { throw MountError.cannotMakeFolder(path) }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .document(let id):
            try DocumentID.validate(id)
            guard !DocumentID.isLocal(id) else { throw SofaError.invalidDocumentID(id, reason: "_local documents are not shown in the mount") }
            guard try !documentFolderExists(id) else { throw MountError.exists(path) }
            guard mkdir(scratchDirectory(id), 0o755) == 0 else { throw SofaError.system("mkdir", path: scratchDirectory(id), errno: errno) }
        case .attachment(let id, let folder):
            guard !folder.isEmpty else { throw MountError.exists(path) }
            try AttachmentName.validate(folder)
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            if try attributesIfPresent(of: path) != nil { throw MountError.exists(path) }
            _ = withState { keptFolders.insert(FolderKey(docID: id, folder: folder)) }
            // Recorded, so that the empty folder is there at the next mount too.
            let row = LocalAttributes.folderName(folder)
            let local = try database.updateLocalAttributes(docID: id, name: row) { $0.modified = FileTime.now.nanoseconds }
            cache.update(id) { $0.setLocal(row, local) }
            noteEntryChange(folder, in: id)
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let target = scratchPath(id, relative)
            try makeParents(of: target)
            guard mkdir(target, 0o755) == 0 else { throw SofaError.system("mkdir", path: target, errno: errno) }
        default:
            throw try attributesIfPresent(of: path) != nil ? MountError.exists(path) : MountError.cannotMakeFolder(path)
        }
    }

    public func removeDirectory(_ path: String) throws {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .document(let id):
            let scratch = scratchDirectory(id)
            if let revision = try liveRevision(id) {
                let removal = self.removal(id) ?? Removal()
                guard removal.properties, visibleAttachments(revision).isEmpty,
                      try database.revisionTree(of: id).conflicts.isEmpty,
                      scratchIsEmpty(scratch) else { throw MountError.notEmpty(path) }
                try deleteDocument(id)
            } else if !isDirectory(scratch) {
                throw MountError.notFound(path)
            }
            guard scratchIsEmpty(scratch) else { throw MountError.notEmpty(path) }
            // Empty: if it cannot go, it lists nothing, and the document folder goes all the same.
            try? FileManager.default.removeItem(atPath: scratch)
            withState {
                removals[id] = nil
                keptFolders = keptFolders.filter { $0.docID != id }
            }
        case .attachment(let id, let folder):
            guard let revision = try liveRevision(id) else {
                guard isDirectory(scratchDirectory(id)) else { throw MountError.notFound(path) }
                return
            }
            let attachments = visibleAttachments(revision)
            guard try attributes(of: path).kind == .directory else { throw MountError.notFolder(path) }
            func within(_ name: String) -> Bool { Node.lies(name, below: folder) }
            let recorded = try cached(id).recordedFolders
            let holdsFolders = withState { keptFolders.contains { $0.docID == id && within($0.folder) && $0.folder != folder } }
                || recorded.contains { $0 != folder && within($0) }
            let holdsPending = pendingFiles(inDocument: id).contains { ($0 as? AttachmentWriteHandle).map { within($0.name) } == true }
            let scratch = folder.isEmpty ? Node.attachmentsDirectoryName : folder == Node.blobsFolder ? Node.blobsDirectoryName : nil
            guard !attachments.contains(where: { within($0.name) }), !holdsFolders, !holdsPending,
                  scratch.map({ scratchIsEmpty(scratchPath(id, $0)) }) ?? true else {
                throw MountError.notEmpty(path)
            }
            _ = withState {
                keptFolders.remove(FolderKey(docID: id, folder: folder))
                folderChanges[FolderKey(docID: id, folder: folder)] = nil
            }
            try forgetLocalAttributes(of: LocalAttributes.folderName(folder), in: id)
            noteEntryChange(folder, in: id)
        case .conflict(let id, let rev):
            // `rm -r conflicts/<rev>`: resolve by deleting that branch.
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            var draft = try database.newRevision(of: id, from: conflict.revID)
            draft.deleted = true
            defer { documentChanged(id) }
            try database.save(draft, allowConflict: true)
        case .conflicts(let id):
            guard try liveRevision(id) != nil else { throw MountError.notFound(path) }
            guard try database.revisionTree(of: id).conflicts.isEmpty else { throw MountError.notEmpty(path) }
        case .conflictAttachment:
            // Part of `rm -r conflicts/<rev>`; the branch goes with its folder.
            guard try attributes(of: path).kind == .directory else { throw MountError.notFolder(path) }
        case .scratch(let id, let relative):
            guard rmdir(scratchPath(id, relative)) == 0 else { throw SofaError.system("rmdir", path: scratchPath(id, relative), errno: errno) }
        case .root, .docs, .statusDirectory:
            throw MountError.busy(path, why: "a document folder goes with rm of its properties.json, or of all it holds")
        case .properties, .statusFile, .conflictProperties:
            throw MountError.notFolder(path)
        }
    }

    /// Keeps the folders that held `names` visible until they are removed with rmdir,
    /// as a real directory stays when its last file goes.
    func keepFolders(of names: [String], in id: String) {
        withState {
            for name in names {
                var parts = name.split(separator: "/", omittingEmptySubsequences: false).dropLast()
                while !parts.isEmpty {
                    keptFolders.insert(FolderKey(docID: id, folder: parts.joined(separator: "/")))
                    parts = parts.dropLast()
                }
            }
        }
    }

    /// Whether a scratch folder holds no file (empty subfolders do not count).
    private func scratchIsEmpty(_ directory: String) -> Bool {
        guard let enumerator = FileManager.default.enumerator(atPath: directory) else { return true }
        for case let name as String in enumerator where !isDirectory("\(directory)/\(name)") { return false }
        return true
    }

    /// Tombstones every live leaf, so that no conflict resurrects the document.
    private func deleteDocument(_ id: String) throws {
        defer { documentChanged(id) }
        for _ in 0..<8 {
            guard let current = try database.document(withID: id) else { return }
            do { try database.deleteDocument(id, revID: current.revID) } catch SofaError.conflict { continue }
        }
    }

    public func unlink(_ path: String) throws {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        if let pending = pendingFile(at: path) {
            // Open and being written: its name goes now; what its descriptors write goes nowhere.
            // (Its folders are kept first: there is no moment when they are nowhere.)
            if case .attachment(let id, let name) = node {
                keepFolders(of: [name], in: id)
                noteEntryChange(name, in: id)
            }
            detach(pending)
            switch node {
            case .attachment(let id, let name):
                guard try liveRevision(id) != nil, try visibleAttachment(name, in: id) != nil else {
                    return  // never saved: nothing else to remove
                }
            case .properties(let id):
                guard try liveRevision(id) != nil else { return }
            default:
                break
            }
        }
        switch node {
        case .properties(let id):
            // Starts a removal: the document is deleted by the rmdir of its folder.
            guard try liveRevision(id) != nil, removal(id)?.properties != true else { throw MountError.notFound(path) }
            withState { removals[id, default: Removal()].properties = true }
        case .attachment(let id, let name):
            guard let revision = try liveRevision(id), try visibleAttachment(name, in: id) != nil else {
                throw try isDirectoryNode(path) ? MountError.isFolder(path) : MountError.notFound(path)
            }
            let removing = withState { () -> Bool in
                guard removals[id] != nil else { return false }
                removals[id]!.attachments.insert(name)
                return true
            }
            keepFolders(of: [name], in: id)
            if !removing {
                _ = try commit(id, base: revision.revID, change: .attachment(name)) { try $0.removeAttachment(name) }
            }
            try forgetLocalAttributes(of: name, in: id)
            noteEntryChange(name, in: id)
        case .conflictProperties(let id, let rev), .conflictAttachment(let id, let rev, _):
            // Part of `rm -r conflicts/<rev>`; the branch goes with the folder.
            guard try conflictRevision(id, rev) != nil else { throw MountError.notFound(path) }
        case .scratch(let id, let relative):
            guard Glibc.unlink(scratchPath(id, relative)) == 0 else { throw SofaError.system("unlink", path: scratchPath(id, relative), errno: errno) }
        case .statusFile:
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        case .root, .docs, .statusDirectory, .document, .conflicts, .conflict:
            throw MountError.isFolder(path)
        }
    }

    public func rename(_ from: String, to: String, flags: UInt32) throws {
        guard let source = Node(path: from), let target = Node(path: to) else { throw MountError.notFound(Node(path: from) == nil ? from : to) }
        guard !readOnly else { throw MountError.readOnly(from, why: .mount) }
        guard flags & renameExchange == 0 else { throw MountError.invalidArgument(from, why: "RENAME_EXCHANGE is not supported") }
        let noReplace = flags & renameNoReplace != 0
        if noReplace, try attributesIfPresent(of: to) != nil { throw MountError.exists(to) }
        // A file being written is saved first, so that the rename moves what it holds; its
        // descriptors then write to the new name.
        let moving = pendingFile(at: from)
        if let moving {
            try moving.lock.withLock {
                if moving.dirty || moving.emptiedAtOpen {
                    moving.dirty = true
                    try save(moving)
                }
            }
        }
        try renameSaved(source, target, from: from, to: to)
        if let replaced = pendingFile(at: to), replaced !== moving { detach(replaced) }
        if let moving { try follow(moving, to: to, target: target) }
    }

    /// A pending file's name is gone (unlinked, or replaced by a rename): it saves nothing more.
    func detach(_ file: WriteHandle) {
        file.lock.withLock {
            file.unlinked = true
            dropPendingSave(of: file)
            withState { if pendingFiles[file.path] === file { pendingFiles[file.path] = nil } }
        }
    }

    /// After a rename: a pending file now lives at `to` (an attachment or properties.json, as
    /// before), based on the revision the rename saved; moved anywhere else, it is detached.
    private func follow(_ file: WriteHandle, to path: String, target: Node) throws {
        var newBase: RevisionID?
        switch target {
        case .attachment(let id, _), .properties(let id): newBase = try liveRevision(id)?.revID
        default: break
        }
        file.lock.withLock {
            withState {
                if pendingFiles[file.path] === file { pendingFiles[file.path] = nil }
                switch (file, target) {
                case (let attachment as AttachmentWriteHandle, .attachment(let id, let name)):
                    attachment.name = name
                    attachment.docID = id
                case (is PropertiesWriteHandle, .properties(let id)):
                    file.docID = id
                default:
                    file.unlinked = true
                    return
                }
                file.path = path
                file.base = newBase
                pendingFiles[path] = file
            }
        }
    }

    private func renameSaved(_ source: Node, _ target: Node, from: String, to: String) throws {
        switch (source, target) {
        case let (.attachment(fromID, fromName), .attachment(toID, toName)) where !fromName.isEmpty && !toName.isEmpty:
            try renameAttachment(fromID, fromName, to: toID, toName)
        case let (.scratch(id, relative), .properties(toID)):
            guard try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let file = scratchPath(id, relative)
            let object: JSONObject
            let bytes = try readSmallFile(file)
            do {
                object = try parseProperties(bytes)
            } catch let error as SofaError {
                keepRejected(bytes, of: toID, because: error)
                // mv reads EINVAL from rename(2) as "cannot move to a subdirectory of itself".
                throw MountError.rejected(to, why: "not saved, the document is unchanged: \(error)")
            }
            _ = try commit(toID, base: try liveRevision(toID)?.revID, change: .properties) { $0.properties = object }
            clearRejected(of: toID)
            Glibc.unlink(file)
        case let (.scratch(id, relative), .attachment(toID, name)) where !name.isEmpty:
            try AttachmentName.validate(name)
            guard try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let file = scratchPath(id, relative)
            guard !isDirectory(file) else { throw MountError.isFolder(from) }
            var info = stat()
            var given = LocalAttributes()
            if stat(file, &info) == 0 {
                // The temporary file's time and mode (rsync and editors set them before the rename) are the attachment's.
                (given.modified, given.accessed) = (FileTime(info.st_mtim).nanoseconds, FileTime(info.st_atim).nanoseconds)
                given.mode = UInt32(info.st_mode & 0o7777)
            }
            let blob = try database.blobs.adopt(fileAt: file, keepingOriginal: true)
            let live = try liveRevision(toID)
            let existing = live == nil ? nil : try visibleAttachment(name, in: toID)
            _ = try saveAttachment(toID, name, blob: blob, contentType: existing?.contentType ?? MIMEType.forFileName(name),
                                   base: live?.revID, seen: existing?.digest, given: given)
            noteEntryChange(name, in: toID)
            Glibc.unlink(file)
        case let (.properties(id), .scratch(toID, relative)):
            guard let revision = try liveRevision(id), try documentFolderExists(toID) else { throw MountError.notFound(to) }
            try writeScratch(scratchPath(toID, relative), bytes: render(revision.properties))
        case let (.attachment(id, name), .scratch(toID, relative)) where !name.isEmpty:
            guard let revision = try liveRevision(id), let attachment = try visibleAttachment(name, in: id),
                  try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let reader = try database.openContent(of: attachment, docID: id)
            try copy(reader, toScratch: scratchPath(toID, relative))
            if toID == id {
                setAside(attachment, of: id)
            } else {
                _ = try commit(id, base: revision.revID, change: .attachment(name)) { try $0.removeAttachment(name) }
            }
        case let (.scratch(id, relative), .scratch(toID, toRelative)):
            guard try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let destination = scratchPath(toID, toRelative)
            try makeParents(of: destination)
            guard Glibc.rename(scratchPath(id, relative), destination) == 0 else { throw SofaError.system("rename", path: scratchPath(id, relative), errno: errno) }
        case let (.document(fromID), .document(toID)):
            try renameDocument(fromID, to: toID)
        case let (.document(id), .scratch(toID, relative)) where toID == Node.rootScratchID:
            try trashDocument(id, to: scratchPath(toID, relative))
        case let (.scratch(fromID, relative), .document(id)) where fromID == Node.rootScratchID:
            try restoreDocument(id, from: scratchPath(fromID, relative))
        default:
            // Anything else (properties.json to an attachment, a document into another folder…):
            // EXDEV makes mv copy and delete, which the tree supports.
            throw MountError.crossDevice(from, why: "this move would copy its bytes")
        }
    }

    private func renameAttachment(_ fromID: String, _ fromName: String, to toID: String, _ toName: String) throws {
        try AttachmentName.validate(toName)
        let fromPath = String.attachmentPath(fromID, fromName)
        let toPath = String.attachmentPath(toID, toName)
        let sourceKind = try attributes(of: fromPath).kind
        if let targetKind = try attributesIfPresent(of: toPath)?.kind {
            // As rename(2): a folder replaces only an empty folder, a file only a file.
            switch (sourceKind, targetKind) {
            case (.directory, .directory):
                var empty = true
                try readDirectory(toPath, after: ListingPosition.dotDot) { _ in
                    empty = false
                    return false
                }
                guard empty else { throw MountError.notEmpty("/docs/\(FileNames.escape(toID))/attachments/\(toName)") }
            case (.directory, _): throw MountError.notFolder("/docs/\(FileNames.escape(fromID))/attachments/\(fromName)")
            case (_, .directory): throw MountError.isFolder("/docs/\(FileNames.escape(toID))/attachments/\(toName)")
            default: break
            }
        }
        let prefix = fromName + "/"
        if sourceKind == .directory {
            // Folders made with mkdir move with it.
            withState {
                keptFolders.remove(FolderKey(docID: toID, folder: toName))  // the empty folder it replaces
                for key in keptFolders where key.docID == fromID && (key.folder == fromName || key.folder.hasPrefix(prefix)) {
                    keptFolders.remove(key)
                    keptFolders.insert(FolderKey(docID: toID, folder: toName + key.folder.dropFirst(fromName.count)))
                }
            }
        }
        if fromID == toID, sourceKind == .regularFile, try restageIfStaged(fromID, fromName, as: toName) {
            noteEntryChange(fromName, in: fromID)
            noteEntryChange(toName, in: toID)
            return
        }
        guard let source = try liveRevision(fromID) else { throw MountError.notFound("/docs/\(FileNames.escape(fromID))") }
        let attachments = visibleAttachments(source)
        // A file, or a whole folder of attachments.
        let moving = attachments.filter { $0.name == fromName || $0.name.hasPrefix(prefix) }
        guard !moving.isEmpty else {
            guard sourceKind == .directory else { throw MountError.notFound("/docs/\(FileNames.escape(fromID))/attachments/\(fromName)") }
            // A folder of empty folders: moved above, and its rows with it.
            try moveLocalAttributes(fromID, fromName, to: toID, toName, folder: true)
            noteEntryChange(fromName, in: fromID)
            noteEntryChange(toName, in: toID)
            return
        }
        func renamed(_ name: String) -> String { name == fromName ? toName : toName + "/" + name.dropFirst(prefix.count) }
        // The folders that held what moved stay, as on disk (kept before the save: there is
        // no moment when they are nowhere); a folder that moved does not.
        keepFolders(of: sourceKind == .directory ? [fromName] : moving.map(\.name), in: fromID)
        defer {
            noteEntryChange(fromName, in: fromID)
            noteEntryChange(toName, in: toID)
        }
        if fromID == toID {
            _ = try commit(fromID, base: source.revID, change: .attachment(toName)) { draft in
                for attachment in moving { try draft.renameAttachment(attachment.name, to: renamed(attachment.name)) }
            }
            try moveLocalAttributes(fromID, fromName, to: toID, toName, folder: sourceKind == .directory)
            return
        }
        guard try documentFolderExists(toID) else { throw MountError.notFound("/docs/\(FileNames.escape(toID))") }
        // No bytes move: the target refers to the same blobs.
        _ = try commit(toID, base: try liveRevision(toID)?.revID, change: .attachment(toName)) { draft in
            for attachment in moving { try draft.setAttachment(attachment.with(name: renamed(attachment.name), revpos: 0)) }
        }
        _ = try commit(fromID, base: source.revID, change: .attachment(fromName)) { draft in
            for attachment in moving { try draft.removeAttachment(attachment.name) }
        }
        try moveLocalAttributes(fromID, fromName, to: toID, toName, folder: sourceKind == .directory)
    }

    /// A document moved to the trash (`gio trash`, a file manager's Delete): its folder is
    /// written there as files (properties.json, attachments/, its scratch files), then the
    /// document is deleted (one tombstone). Restoring the folder saves it back.
    private func trashDocument(_ id: String, to folder: String) throws {
        guard let revision = try liveRevision(id) else { throw MountError.notFound("/docs/\(FileNames.escape(id))") }
        let attachments = visibleAttachments(revision)
        // A body that is not here cannot go to the trash: it would be lost. EXDEV: "delete permanently?".
        guard attachments.allSatisfy(\.contentAvailable) else {
            throw MountError.crossDevice("docs/\(FileNames.escape(id))", why: "it has attachments whose bodies are not here")
        }
        guard !FileManager.default.fileExists(atPath: folder) else { throw MountError.exists(folder) }
        do {
            try writeScratch(folder + "/" + Node.propertiesFileName, bytes: render(revision.properties))
            for attachment in attachments {
                try copy(try database.openContent(of: attachment, docID: id), toScratch: folder + "/" + .relativePath(ofAttachment: attachment.name))
            }
            let scratch = scratchDirectory(id)
            for name in try scratchNames(in: scratch) {
                try FileManager.default.moveItem(atPath: scratch + "/" + name, toPath: folder + "/" + name)
            }
        } catch {
            // Undone as far as it goes: the error thrown is the one that matters.
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
        try deleteDocument(id)
        // Its files were all moved out above: an empty folder left behind shows nothing.
        try? FileManager.default.removeItem(atPath: scratchDirectory(id))
    }

    /// A document folder back from the trash: properties.json and attachments/ become a
    /// revision (one), the other files its scratch files.
    private func restoreDocument(_ id: String, from folder: String) throws {
        try DocumentID.validate(id)
        guard try liveRevision(id) == nil else { throw MountError.notEmpty("/docs/\(FileNames.escape(id))") }
        let properties = try parseProperties(try readSmallFile(folder + "/" + Node.propertiesFileName))
        let attachmentsFolder = folder + "/" + Node.attachmentsDirectoryName
        let blobsFolder = folder + "/" + Node.blobsDirectoryName
        var bodies: [(String, StoredBlob)] = []
        for (directory, prefix) in [(attachmentsFolder, ""), (blobsFolder, Blobs.standInPrefix)] {
            guard let enumerator = FileManager.default.enumerator(atPath: directory) else { continue }
            for case let relative as String in enumerator where !isDirectory(directory + "/" + relative) {
                let name = prefix + FileNames.attachmentName(relative.split(separator: "/").map(String.init))
                bodies.append((name, try database.blobs.adopt(fileAt: directory + "/" + relative, keepingOriginal: true)))
            }
        }
        _ = try commit(id, base: nil, change: .properties) { draft in
            draft.properties = properties
            for (name, blob) in bodies {
                // A blob's type is in its dictionary; an attachment's is guessed from its name.
                try draft.setAttachment(name, blob: blob, contentType: Blobs.isStandInName(name) ? nil : MIMEType.forFileName(name))
            }
        }
        // Saved above: these copies of what the revision now holds may go or stay (absent ones are the usual case).
        try? FileManager.default.removeItem(atPath: folder + "/" + Node.propertiesFileName)
        try? FileManager.default.removeItem(atPath: attachmentsFolder)
        try? FileManager.default.removeItem(atPath: blobsFolder)
        let scratch = scratchDirectory(id)
        try? FileManager.default.removeItem(atPath: scratch)
        try FileManager.default.moveItem(atPath: folder, toPath: scratch)
    }

    private func renameDocument(_ fromID: String, to toID: String) throws {
        try DocumentID.validate(toID)
        guard !DocumentID.isLocal(toID) else { throw SofaError.invalidDocumentID(toID, reason: "_local documents are not shown in the mount") }
        guard try liveRevision(toID) == nil else { throw MountError.notEmpty("/docs/\(FileNames.escape(toID))") }
        let fromScratch = scratchDirectory(fromID), toScratch = scratchDirectory(toID)
        if isDirectory(toScratch) && !scratchIsEmpty(toScratch) { throw MountError.notEmpty("/docs/\(FileNames.escape(toID))") }
        if let source = try liveRevision(fromID) {
            // The same body and blobs under the new id; the old one is deleted.
            _ = try commit(toID, base: nil, change: .properties) { draft in
                draft.properties = source.properties
                for attachment in visibleAttachments(source) { try draft.setAttachment(attachment.with(revpos: 0)) }
            }
            try deleteDocument(fromID)
        } else if !isDirectory(fromScratch) {
            throw MountError.notFound("/docs/\(FileNames.escape(fromID))")
        }
        if isDirectory(fromScratch) {
            // The target's scratch folder is empty or absent (checked above); the rename says if it is in the way.
            try? FileManager.default.removeItem(atPath: toScratch)
            guard Glibc.rename(fromScratch, toScratch) == 0 else { throw SofaError.system("rename", path: fromScratch, errno: errno) }
        }
    }

    private func readSmallFile(_ path: String) throws -> [UInt8] {
        var info = stat()
        guard stat(path, &info) == 0 else { throw SofaError.system("stat", path: path, errno: errno) }
        guard info.st_size <= PropertiesWriteHandle.maximumSize else { throw MountError.tooLarge(path, limit: Int64(PropertiesWriteHandle.maximumSize)) }
        guard let data = FileManager.default.contents(atPath: path) else { throw SofaError.system("read", path: path, errno: EIO) }
        return [UInt8](data)
    }

    func writeScratch(_ path: String, bytes: [UInt8]) throws {
        try makeParents(of: path)
        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { throw SofaError.system("write", path: path, errno: EIO) }
    }

    private func copy(_ reader: BlobReader, toScratch path: String) throws {
        try makeParents(of: path)
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while case let count = try reader.read(into: buffer), count > 0 {
            guard Glibc.write(fd, buffer.baseAddress, count) == count else { throw SofaError.system("write", path: path, errno: errno) }
        }
    }
}
