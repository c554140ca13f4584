import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit

/// renameat2(2) flags (not exported by Glibc's module).
private let renameNoReplace: UInt32 = 1
private let renameExchange: UInt32 = 2

/// `rename`: attachments within and between documents (no bytes copied), documents,
/// scratch files onto properties.json or into attachments/, files being written.
extension DocumentFileSystem {
    public func rename(_ from: String, to: String, flags: UInt32) throws {
        guard let source = Node(path: from), let target = Node(path: to) else { throw MountError.notFound(Node(path: from) == nil ? from : to) }
        guard !readOnly else { throw MountError.readOnly(from, why: .mount) }
        for (node, path) in [(source, from), (target, to)] {
            if case .view = node { throw MountError.readOnly(path, why: .view) }
            if case .query = node { throw MountError.readOnly(path, why: .queryResults) }
        }
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
            pending.remove(file)
        }
    }

    /// After a rename: a pending file now lives at `to` (an attachment or properties.json, as
    /// before), based on the revision the rename saved; moved anywhere else, it is detached.
    func follow(_ file: WriteHandle, to path: String, target: Node) throws {
        var newBase: RevisionID?
        switch target {
        case .attachment(let id, _), .properties(let id): newBase = try liveRevision(id)?.revID
        default: break
        }
        file.lock.withLock {
            pending.move(file, to: path) { file in
                switch (file, target) {
                case (let attachment as AttachmentWriteHandle, .attachment(let id, let name)):
                    attachment.name = name
                    attachment.docID = id
                case (is PropertiesWriteHandle, .properties(let id)):
                    file.docID = id
                default:
                    file.unlinked = true
                    return false
                }
                file.base = newBase
                return true
            }
        }
    }

    func renameSaved(_ source: Node, _ target: Node, from: String, to: String) throws {
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
            _ = LongPath.unlink(file)
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
            // Into a busy document (rsync, unzip) it is likely staged: its body is synced by the fold, as a closed file's.
            let durable = !mayStage(toID)
            let blob = try store.blobs.adopt(fileAt: file, keepingOriginal: true, durable: durable)
            let live = try liveRevision(toID)
            let existing = live == nil ? nil : try visibleAttachment(name, in: toID)
            _ = try saveAttachment(toID, name, blob: blob, contentType: existing?.contentType ?? MIMEType.forFileName(name),
                                   base: live?.revID, seen: existing?.digest, given: given, synced: durable)
            noteEntryChange(name, in: toID)
            _ = LongPath.unlink(file)
        case let (.properties(id), .scratch(toID, relative)):
            guard let revision = try liveRevision(id), try documentFolderExists(toID) else { throw MountError.notFound(to) }
            try writeScratch(scratchPath(toID, relative), bytes: render(revision.properties))
        case let (.attachment(id, name), .scratch(toID, relative)) where !name.isEmpty:
            guard let revision = try liveRevision(id), let attachment = try visibleAttachment(name, in: id),
                  try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let reader = try store.openContent(of: attachment, docID: id)
            try copy(reader, toScratch: scratchPath(toID, relative))
            if toID == id {
                setAside(attachment, of: id)
            } else {
                _ = try commit(id, base: revision.revID, change: .attachment(name), seen: .attachment(attachment.digest)) {
                    try $0.removeAttachment(name)
                }
            }
        case let (.scratch(id, relative), .scratch(toID, toRelative)):
            guard try documentFolderExists(toID) else { throw MountError.notFound(to) }
            let destination = scratchPath(toID, toRelative)
            try makeParents(of: destination)
            guard LongPath.rename(scratchPath(id, relative), destination) == 0 else { throw SofaError.system("rename", path: scratchPath(id, relative), errno: errno) }
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

    func renameAttachment(_ fromID: String, _ fromName: String, to toID: String, _ toName: String) throws {
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
                guard empty else { throw MountError.notEmpty(.attachmentPath(toID, toName)) }
            case (.directory, _): throw MountError.notFolder(.attachmentPath(fromID, fromName))
            case (_, .directory): throw MountError.isFolder(.attachmentPath(toID, toName))
            default: break
            }
        }
        let prefix = fromName + "/"
        if sourceKind == .directory {
            // Folders made with mkdir move with it.
            keptFolders.move(fromName, in: fromID, to: toName, in: toID)
        }
        if fromID == toID, sourceKind == .regularFile, try restageIfStaged(fromID, fromName, as: toName) {
            noteEntryChange(fromName, in: fromID)
            noteEntryChange(toName, in: toID)
            return
        }
        guard let source = try liveRevision(fromID) else { throw MountError.notFound(.documentPath(fromID)) }
        let attachments = visibleAttachments(source)
        // A file, or a whole folder of attachments.
        let moving = attachments.filter { $0.name == fromName || $0.name.hasPrefix(prefix) }
        guard !moving.isEmpty else {
            guard sourceKind == .directory else { throw MountError.notFound(.attachmentPath(fromID, fromName)) }
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
        // A file goes onto the file shown at its new name (or none), and leaves the one shown at
        // its old: a fold since that put either in a revision is this mount's own, not a change
        // made elsewhere (as `unlink`).
        let file = sourceKind == .regularFile
        let target: Seen = file ? .attachment(try visibleAttachment(toName, in: toID)?.digest) : .unknown
        if fromID == toID {
            _ = try commit(fromID, base: source.revID, change: .attachment(toName), seen: target) { draft in
                for attachment in moving { try draft.renameAttachment(attachment.name, to: renamed(attachment.name)) }
            }
            try moveLocalAttributes(fromID, fromName, to: toID, toName, folder: sourceKind == .directory)
            return
        }
        guard try documentFolderExists(toID) else { throw MountError.notFound(.documentPath(toID)) }
        // No bytes move: the target refers to the same blobs.
        _ = try commit(toID, base: try liveRevision(toID)?.revID, change: .attachment(toName), seen: target) { draft in
            for attachment in moving { try draft.setAttachment(attachment.with(name: renamed(attachment.name), revpos: 0)) }
        }
        _ = try commit(fromID, base: source.revID, change: .attachment(fromName), seen: file ? .attachment(moving[0].digest) : .unknown) { draft in
            for attachment in moving { try draft.removeAttachment(attachment.name) }
        }
        try moveLocalAttributes(fromID, fromName, to: toID, toName, folder: sourceKind == .directory)
    }

    func renameDocument(_ fromID: String, to toID: String) throws {
        try DocumentID.validate(toID)
        guard !DocumentID.isLocal(toID) else { throw SofaError.invalidDocumentID(toID, reason: "_local documents are not shown in the mount") }
        guard try liveRevision(toID) == nil else { throw MountError.notEmpty(.documentPath(toID)) }
        let fromScratch = scratchDirectory(fromID), toScratch = scratchDirectory(toID)
        if isDirectory(toScratch) && !scratchIsEmpty(toScratch) { throw MountError.notEmpty(.documentPath(toID)) }
        if let source = try liveRevision(fromID) {
            // The same body and blobs under the new id; the old one is deleted.
            _ = try commit(toID, base: nil, change: .properties) { draft in
                draft.properties = source.properties
                for attachment in visibleAttachments(source) { try draft.setAttachment(attachment.with(revpos: 0)) }
            }
            try deleteDocument(fromID)
        } else if !isDirectory(fromScratch) {
            throw MountError.notFound(.documentPath(fromID))
        }
        if isDirectory(fromScratch) {
            // The target's scratch folder is empty or absent (checked above); the rename says if it is in the way.
            try? FileManager.default.removeItem(atPath: toScratch)
            guard Glibc.rename(fromScratch, toScratch) == 0 else { throw SofaError.system("rename", path: fromScratch, errno: errno) }
            try scratch.nameFolder(ofEscapedID: FileNames.escape(toID))
        }
    }
}
