import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit

/// Folders and removals: `mkdir`, `rmdir` and `unlink` of documents, attachments, folders of
/// attachments and scratch files.
extension DocumentFileSystem {
    public func makeDirectory(_ path: String) throws {
        guard let node = Node(path: path) else { throw MountError.cannotMakeFolder(path) }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .document(let id):
            try DocumentID.validate(id)
            guard !DocumentID.isLocal(id) else { throw SofaError.invalidDocumentID(id, reason: "_local documents are not shown in the mount") }
            guard try !documentFolderExists(id) else { throw MountError.exists(path) }
            try scratch.makeFolder(ofEscapedID: FileNames.escape(id))
        case .attachment(let id, let folder):
            // A document's attachments/ and blobs/ are always there. `cp -r` of a document
            // folder makes each folder it copies without looking first (it made the parent), so
            // an empty one is taken as made: nothing tells it from a folder just made.
            if folder.isEmpty || folder == Node.blobsFolder {
                guard try documentFolderExists(id), try folderIsEmpty(path) else { throw MountError.exists(path) }
                return
            }
            try AttachmentName.validate(folder)
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            if try attributesIfPresent(of: path) != nil { throw MountError.exists(path) }
            keptFolders.insert(folder, in: id)
            // Recorded, so that the empty folder is there at the next mount too.
            let row = LocalAttributes.folderName(folder)
            let local = try store.updateLocalAttributes(docID: id, name: row) { $0.modified = FileTime.now.nanoseconds }
            cache.setLocal(id, row, local)
            noteEntryChange(folder, in: id)
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            let target = scratchPath(id, relative)
            try makeParents(of: target)
            guard LongPath.mkdir(target, 0o755) == 0 else { throw SofaError.system("mkdir", path: target, errno: errno) }
        case .view:
            throw MountError.readOnly(path, why: .view)
        default:
            throw try attributesIfPresent(of: path) != nil ? MountError.exists(path) : MountError.cannotMakeFolder(path)
        }
    }

    /// Lookups as `attributes(of:)`, with one exception. Copying a folder into a folder it
    /// has just made, `cp` (and `mv` between file systems) makes each subfolder without
    /// looking, and the kernel answers EEXIST to a mkdir of a name a lookup found, before the
    /// mount is asked: `cp -r docs/a docs/b` failed with "File exists" on `b/attachments`. So
    /// to a `cp` or `mv` that made document folder `b` itself, an empty attachments/ or
    /// blobs/ in it is not there (no negative entry is kept: everyone else finds it); it then
    /// makes it (`makeDirectory` takes an empty one as made). Any other program, and a `cp`
    /// writing into a document folder it did not make, finds it as always.
    public func lookup(_ path: String, caller: pid_t) throws -> FileAttributes {
        let attributes = try attributes(of: path)
        // Every lookup passes here: only a name that can be a document's attachments/ or
        // blobs/ goes on to parse its path again.
        guard attributes.kind == .directory, path.hasSuffix("/" + Node.attachmentsDirectoryName) || path.hasSuffix("/" + Node.blobsDirectoryName),
              let node = Node(path: path), case .attachment(let id, let folder) = node,
              folder.isEmpty || folder == Node.blobsFolder,
              overlay.wasMade(id, by: caller, now: Date().timeIntervalSince1970),
              ["cp", "mv"].contains(Caller(tid: caller).program), try folderIsEmpty(path) else { return attributes }
        throw NotThereForThisCaller()
    }

    public func makeDirectory(_ path: String, caller: pid_t) throws {
        try makeDirectory(path)
        if case .document(let id) = Node(path: path) { overlay.noteMade(id, by: caller, at: Date().timeIntervalSince1970) }
    }

    /// Whether folder `path` lists nothing but "." and "..".
    private func folderIsEmpty(_ path: String) throws -> Bool {
        var empty = true
        try readDirectory(path, after: ListingPosition.dotDot) { _ in
            empty = false
            return false
        }
        return empty
    }

    public func removeDirectory(_ path: String) throws {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        guard !readOnly else { throw MountError.readOnly(path, why: .mount) }
        switch node {
        case .document(let id):
            let scratch = scratchDirectory(id)
            if let revision = try liveRevision(id) {
                let removal = self.removal(id) ?? Removal()
                // Empty properties go with the folder (`rm -r` may not have seen them: they are not
                // shown while the document fills); nothing is lost.
                guard removal.properties || revision.properties.isEmpty, visibleAttachments(revision).isEmpty,
                      try store.revisionTree(of: id).conflicts.isEmpty,
                      scratchIsEmpty(scratch) else { throw MountError.notEmpty(path) }
                try deleteDocument(id)
            } else if !isDirectory(scratch) {
                throw MountError.notFound(path)
            }
            guard scratchIsEmpty(scratch) else { throw MountError.notEmpty(path) }
            // Empty: if it cannot go, it lists nothing, and the document folder goes all the same.
            try? FileManager.default.removeItem(atPath: scratch)
            overlay.endRemoval(id)
            keptFolders.removeAll(in: id)
        case .attachment(let id, let folder):
            guard let revision = try liveRevision(id) else {
                guard isDirectory(scratchDirectory(id)) else { throw MountError.notFound(path) }
                return
            }
            let attachments = visibleAttachments(revision)
            guard try attributes(of: path).kind == .directory else { throw MountError.notFolder(path) }
            func within(_ name: String) -> Bool { Node.lies(name, below: folder) }
            let recorded = try cached(id).recordedFolders
            // (Any folder below it holds a member below it, or is one: its children say.)
            let holdsFolders = !keptFolders.children(of: folder, in: id).isEmpty || !recorded.children(of: folder).isEmpty
            let holdsPending = pendingFiles(inDocument: id).contains { ($0 as? AttachmentWriteHandle).map { within($0.name) } == true }
            let scratch = folder.isEmpty ? Node.attachmentsDirectoryName : folder == Node.blobsFolder ? Node.blobsDirectoryName : nil
            guard !attachments.contains(where: { within($0.name) }), !holdsFolders, !holdsPending,
                  scratch.map({ scratchIsEmpty(scratchPath(id, $0)) }) ?? true else {
                throw MountError.notEmpty(path)
            }
            keptFolders.remove(folder, in: id)
            keptFolders.forgetChange(folder, in: id)
            try forgetLocalAttributes(of: LocalAttributes.folderName(folder), in: id)
            noteEntryChange(folder, in: id)
        case .conflict(let id, let rev):
            // `rm -r conflicts/<rev>`: resolve by deleting that branch.
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            var draft = try store.newRevision(of: id, from: conflict.revID)
            draft.properties = [:]  // as CouchDB's DELETE: a tombstone of nothing
            draft.deleted = true
            defer { documentChanged(id) }
            _ = try store.save(draft, allowConflict: true)
        case .conflicts(let id):
            guard try liveRevision(id) != nil else { throw MountError.notFound(path) }
            guard try store.revisionTree(of: id).conflicts.isEmpty else { throw MountError.notEmpty(path) }
        case .conflictAttachment:
            // Part of `rm -r conflicts/<rev>`; the branch goes with its folder.
            guard try attributes(of: path).kind == .directory else { throw MountError.notFolder(path) }
        case .scratch(let id, let relative):
            guard LongPath.rmdir(scratchPath(id, relative)) == 0 else { throw SofaError.system("rmdir", path: scratchPath(id, relative), errno: errno) }
        case .root, .docs, .statusDirectory, .query(.root):
            throw MountError.busy(path, why: "the mount's own folders stay")
        case .properties, .statusFile, .conflictProperties:
            throw MountError.notFolder(path)
        case .view:
            throw MountError.readOnly(path, why: .view)
        case .query:
            throw MountError.readOnly(path, why: .queryResults)
        }
    }

    /// Keeps the folders that held `names` visible until they are removed with rmdir,
    /// as a real directory stays when its last file goes.
    func keepFolders(of names: [String], in id: String) {
        for name in names {
            let folder = DocumentCache.Entry.parent(of: name)
            if !folder.isEmpty { keptFolders.insertWithParents(folder, in: id) }
        }
    }

    /// Whether a scratch folder holds no file (empty subfolders do not count).
    func scratchIsEmpty(_ directory: String) -> Bool { scratch.holdsNoFile(directory) }

    /// Tombstones every live leaf, so that no conflict resurrects the document.
    func deleteDocument(_ id: String) throws {
        defer { documentChanged(id) }
        for _ in 0..<8 {
            guard let current = try store.document(withID: id) else { return }
            do { _ = try store.deleteDocument(id, revID: current.revID) } catch SofaError.conflict { continue }
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
            guard let revision = try liveRevision(id), showsProperties(of: id, revision) else { throw MountError.notFound(path) }
            overlay.startRemoval(id)
        case .attachment(let id, let name):
            guard let revision = try liveRevision(id), let shown = try visibleAttachment(name, in: id) else {
                throw try isDirectoryNode(path) ? MountError.isFolder(path) : MountError.notFound(path)
            }
            let removing = overlay.removeDuringRemoval(name, in: id)
            keepFolders(of: [name], in: id)
            if !removing {
                // The file as it was shown: a staged file that a fold put in a revision since is
                // that file, not a change made elsewhere (its unlink answered ENOENT, and `git`
                // then found its index.lock still there).
                _ = try commit(id, base: revision.revID, change: .attachment(name), seen: .attachment(shown.digest)) {
                    try $0.removeAttachment(name)
                }
            }
            try forgetLocalAttributes(of: name, in: id)
            noteEntryChange(name, in: id)
        case .conflictProperties(let id, let rev), .conflictAttachment(let id, let rev, _):
            // Part of `rm -r conflicts/<rev>`; the branch goes with the folder.
            guard try conflictRevision(id, rev) != nil else { throw MountError.notFound(path) }
        case .scratch(let id, let relative):
            guard LongPath.unlink(scratchPath(id, relative)) == 0 else { throw SofaError.system("unlink", path: scratchPath(id, relative), errno: errno) }
        case .statusFile, .view, .query(.row):
            throw MountError.readOnly(path, why: Self.readOnlyReason(node))
        case .root, .docs, .statusDirectory, .document, .conflicts, .conflict, .query:
            throw MountError.isFolder(path)
        }
    }
}
