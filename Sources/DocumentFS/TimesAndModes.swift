import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit

/// Times and modes: what `stat` shows of attachments and their folders beyond their bytes.
///
/// - An attachment's mtime is the time given to it (`touch -d`, `cp -a`, `rsync -a`, `tar x`;
///   to the nanosecond) while it keeps the body it had then, else when the revision that last
///   changed it was saved. Its atime is the one given with it, else its mtime: reads do not
///   change it (as `noatime`). ctime is the mtime.
/// - A folder's mtime is when an entry was last made, removed or renamed in it while mounted,
///   or the time given to it (what `rsync -a` and `tar x` do last), else its revision's.
/// - Permission bits given (`chmod`, a file created with mode 0755 by a linker or `install`)
///   are kept; the default is 0644 for files and 0755 for folders.
/// - A folder's link count is 2 plus its subfolders, as on ext4.
///
/// Given times and modes are `LocalAttributes` in the database: kept across mounts, never
/// replicated.
extension DocumentFileSystem {
    /// An attachment as `stat` shows it.
    func attachmentAttributes(_ attachment: Attachment, in id: String) throws -> FileAttributes {
        let entry = try cached(id)
        let local = entry.local[attachment.name]
        var attributes = file(attachment.length, 0)
        if let local, local.digest == attachment.digest, let modified = local.modified {
            attributes.modified = FileTime(nanoseconds: modified)
        } else {
            attributes.modified = FileTime(seconds: entry.revisionTimes[attachment.name] ?? entry.revision?.savedAt.timeIntervalSince1970 ?? mountTime)
        }
        if let local, local.digest == attachment.digest, let accessed = local.accessed {
            attributes.accessed = FileTime(nanoseconds: accessed)
        }
        attributes.permissions = permissions(local?.mode ?? LocalAttributes.defaultFileMode)
        return attributes
    }

    /// A folder of attachments (`""`: attachments/ itself) as `stat` shows it.
    func folderAttributes(_ folder: String, in id: String, writable: Bool = true) throws -> FileAttributes {
        let entry = try cached(id)
        let local = entry.local[LocalAttributes.folderName(folder)]
        let changed = keptFolders.changed(folder, in: id)
        var attributes = directory(entry.revision?.savedAt.timeIntervalSince1970 ?? mountTime, writable: writable)
        if let changed {
            attributes.modified = changed
        } else if let modified = local?.modified {
            attributes.modified = FileTime(nanoseconds: modified)
            attributes.accessed = local?.accessed.map(FileTime.init(nanoseconds:))
        }
        if writable { attributes.permissions = permissions(local?.mode ?? LocalAttributes.defaultFolderMode) }
        attributes.linkCount = 2 + UInt32(try subfolders(of: folder, in: id, entry: entry).count)
        if folder.isEmpty { attributes.number = entry.number(.attachments) }
        return attributes
    }

    /// The permission bits shown for a mode given (no write bits in a read-only mount).
    func permissions(_ mode: UInt32) -> UInt32 {
        readOnly ? mode & ~0o222 : mode
    }

    /// The folders directly in `folder`: those the document's names make, staged files', files
    /// being written, and folders made with mkdir.
    private func subfolders(of folder: String, in id: String, entry: DocumentCache.Entry) throws -> Set<String> {
        var found = Set(entry.folders.children(of: folder))
        found.formUnion(ledger.childFolders(of: folder, in: id))
        found.formUnion(keptFolders.children(of: folder, in: id))
        found.formUnion(entry.recordedFolders.children(of: folder))
        for case let pending as AttachmentWriteHandle in pendingFiles(inDocument: id) {
            for candidate in DocumentCache.Entry.folders(of: pending.name) where DocumentCache.Entry.parent(of: candidate) == folder {
                found.insert(candidate)
            }
        }
        return found
    }

    /// An entry was made, removed or renamed in the folder holding `name` (POSIX changes its
    /// mtime; the kernel asks for its attributes again).
    func noteEntryChange(_ name: String, in id: String) {
        let now = FileTime.now
        keptFolders.noteChange(DocumentCache.Entry.parent(of: name), in: id, at: now)
    }

    // MARK: - utimensat, chmod

    public func setTimes(_ path: String, accessed: timespec?, modified: timespec?) throws {
        let node = Node(path: path)
        if case .scratch(let id, let relative) = node {
            let omit = timespec(tv_sec: 0, tv_nsec: Self.utimeOmit)
            var times = [accessed ?? omit, modified ?? omit]
            guard LongPath.setTimes(scratchPath(id, relative), &times) == 0 else { throw SofaError.system("utimensat", path: scratchPath(id, relative), errno: errno) }
            return
        }
        let kind = try attributes(of: path).kind
        // Times of attachments and their folders are kept; other times come from revisions, and the call is accepted.
        guard case .attachment(let id, let name) = node, !readOnly else { return }
        let now = FileTime.now
        /// nil: left as it is (UTIME_OMIT).
        func given(_ time: timespec?) -> Int64? {
            guard let time, time.tv_nsec != Self.utimeOmit else { return nil }
            return time.tv_nsec == Self.utimeNow ? now.nanoseconds : FileTime(time).nanoseconds
        }
        let (newModified, newAccessed) = (given(modified), given(accessed))
        guard newModified != nil || newAccessed != nil else { return }
        if kind == .directory {
            let row = LocalAttributes.folderName(name)
            // A folder given only an atime keeps the mtime it shows (read first: no part's lock is held while the database is asked).
            let changed = keptFolders.forgetChange(name, in: id)
            let local = try store.updateLocalAttributes(docID: id, name: row) { attributes in
                if let modified = newModified ?? changed?.nanoseconds { attributes.modified = modified }
                if let newAccessed { attributes.accessed = newAccessed }
            }
            cache.setLocal(id, row, local)
            return
        }
        if let pending = pendingFile(at: path) {
            let waiting = pending.lock.withLock { () -> Bool in
                guard pending.dirty || pending.emptiedAtOpen else { return false }
                // Recorded with the body it saves.
                if let newModified { pending.given.modified = newModified }
                if let newAccessed { pending.given.accessed = newAccessed }
                return true
            }
            if waiting { return }
        }
        guard try liveRevision(id) != nil, let attachment = try visibleAttachment(name, in: id) else { return }
        // Given only an atime, it keeps the mtime it shows.
        let shown = try attachmentAttributes(attachment, in: id)
        try recordGiven(LocalAttributes(modified: newModified ?? shown.modified.nanoseconds, accessed: newAccessed),
                        of: name, in: id, digest: attachment.digest)
    }

    public func setPermissions(_ path: String, _ mode: UInt32) throws {
        let node = Node(path: path)
        if case .scratch(let id, let relative) = node {
            guard LongPath.chmod(scratchPath(id, relative), mode_t(mode)) == 0 else { throw SofaError.system("chmod", path: scratchPath(id, relative), errno: errno) }
            return
        }
        let kind = try attributes(of: path).kind
        // Modes of attachments and their folders are kept; others are fixed, and the call is accepted.
        guard case .attachment(let id, let name) = node else { return }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        let bits = mode & 0o7777
        if kind == .regularFile, let pending = pendingFile(at: path) {
            pending.lock.withLock { pending.given.mode = bits }
        }
        let row = kind == .directory ? LocalAttributes.folderName(name) : name
        let standard = kind == .directory ? LocalAttributes.defaultFolderMode : LocalAttributes.defaultFileMode
        if kind == .regularFile {
            guard try liveRevision(id) != nil, try visibleAttachment(name, in: id) != nil else { return }  // not saved yet
        }
        let local = try updateLocalAttributes(of: row, in: id) { $0.mode = bits == standard ? nil : bits }
        cache.setLocal(id, row, local)
    }

    /// Records times and a mode given to an attachment whose body is `digest` (a file being
    /// written had them given before its save). The cache changes in place: a forget would
    /// reload the whole document for each file `cp -a` or `rsync -a` touches.
    func recordGiven(_ given: LocalAttributes, of name: String, in id: String, digest: String) throws {
        guard given != LocalAttributes() else { return }
        let local = try updateLocalAttributes(of: name, in: id) { $0.take(given, forBody: digest) }
        cache.setLocal(id, name, local)
    }

    /// Changes the times or mode of attachment `name`: in the staging log while it is staged
    /// there (`tar` and `rsync` give each file its time after its close), else in its row.
    func updateLocalAttributes(of name: String, in id: String, _ change: (inout LocalAttributes) -> Void) throws -> LocalAttributes? {
        if let stagingLog, let staged = ledger.staged(name, in: id), staged.log != nil,
           let local = try stagingLog.updateAttributes(of: staged, change) {
            return local == LocalAttributes(digest: local.digest) ? nil : local
        }
        return try store.updateLocalAttributes(docID: id, name: name, change)
    }

    /// Renamed files and folders take their times and modes along; those of a file or empty
    /// folder replaced go.
    func moveLocalAttributes(_ fromID: String, _ fromName: String, to toID: String, _ toName: String, folder: Bool) throws {
        let local = try cached(fromID).local
        var moves: [(from: String, to: String)] = []
        if folder {
            let prefix = fromName + "/"
            for row in local.keys where row.hasPrefix(prefix) {
                moves.append((row, toName + "/" + row.dropFirst(prefix.count)))
            }
        } else if local[fromName] != nil {
            moves.append((fromName, toName))
        }
        let replaced = folder ? LocalAttributes.folderName(toName) : toName
        if fromID == toID {
            try store.moveLocalAttributes(docID: fromID, moves: moves, toDocument: nil, removing: [replaced])
        } else {
            try store.moveLocalAttributes(docID: toID, moves: [], toDocument: nil, removing: [replaced])
            try store.moveLocalAttributes(docID: fromID, moves: moves, toDocument: toID, removing: [])
        }
        documentChanged(fromID)
        if toID != fromID { documentChanged(toID) }
    }

    /// A removed file's mode and times go with it (a new file of the same name starts afresh).
    func forgetLocalAttributes(of name: String, in id: String) throws {
        guard try cached(id).local[name] != nil else { return }
        // Staged still (a removal under way saves it later): its fold would store them again.
        _ = try updateLocalAttributes(of: name, in: id) { $0 = LocalAttributes() }
        try store.moveLocalAttributes(docID: id, moves: [], toDocument: nil, removing: [name])
        cache.setLocal(id, name, nil)
    }

    static let utimeNow = (1 << 30) - 1
    static let utimeOmit = (1 << 30) - 2
}
