/// DocumentFS: a Sofa database as a tree of folders and files.
///
/// ```
/// /docs/<id>/properties.json          the current revision's properties
/// /docs/<id>/attachments/<name>       one file per attachment ('/' in a name = subfolders)
/// /docs/<id>/conflicts/<rev>/…        losing branches (read-only; rm -r resolves)
/// /docs/<id>/<anything else>          scratch files: local only, never replicated
/// /views/<ddoc>/<view>/<key>/<id>    a view's rows: links to their documents (read-only)
/// /queries/<name>.json                a saved Mango query (a scratch file of the mount's root)
/// /queries/<name>/<id>                its results: links to their documents (read-only)
/// /.sofa/status.json                  read-only status
/// ```
///
/// Closing a written file saves one revision. A file written from a revision that
/// is no longer current is merged onto the current one when the edits touch
/// different things (two attachments), and saved as a conflicting branch when
/// they touch the same thing; nothing is lost. `rm -r docs/x` deletes the
/// document: unlinking properties.json starts the removal and the final `rmdir`
/// saves one tombstone. Unsupported cross-kind renames answer EXDEV, so `mv`
/// falls back to copy and delete.
///
/// This module never imports FUSE: `FuseKit` calls it through `FileSystem`.

import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit
import Logging

public final class DocumentFileSystem: FileSystem, @unchecked Sendable {
    // Sendable invariant: no mutable state of its own; each part (below) guards its own, and
    // handles guard theirs.

    /// The database shown, through what the mount may ask of it (MountStore.swift).
    public let store: any MountStore
    public let readOnly: Bool
    /// Where scratch files are kept (sealed in an encrypted database).
    let scratch: ScratchFolder
    var scratchRoot: String { scratch.root }
    let handles = HandleTable()
    let cache = DocumentCache()
    let log = Logger(label: "sofa.mount")
    let mountTime = Date().timeIntervalSince1970

    /// Removals under way (`rm -r`) and attachments set aside, laid over what revisions show.
    let overlay = NamespaceOverlay()
    /// Attachment folders that exist whatever they hold (made with mkdir, or left by the
    /// removal of their last attachment, as on disk), and when each folder's entries changed.
    let keptFolders = KeptFolders()
    /// Files being written, by mount path and document (every descriptor opened at a path
    /// shares one), and the digest each attachment path had when last opened.
    let pending = PendingFiles()
    /// The status files open now, and the failures last answered to programs.
    let status = StatusFiles()
    /// What the mount remembers of `views/` and `queries/` between calls.
    let derived = DerivedFolders()
    /// Large folders' listings kept between the kernel's pages (ListingSnapshots.swift).
    let listings = ListingSnapshots()
    /// Staged files per document (Bursts.swift), recent saves, unsynced bodies, own saves.
    let ledger = SaveLedger()
    /// Where this mount's staged files are recorded (nil: in SQLite rows, as an encrypted
    /// database keeps them).
    let stagingLog: StagingLog?
    /// Where bursts are checked and folded, one at a time.
    let burstQueue = DispatchQueue(label: "sofa-bursts")
    /// One of this mount's saves of a document at a time.
    let saveTurns = DocumentSaveTurns()
    /// Works out staged text files' CouchDB MD5s while their burst goes on, for its fold.
    let md5sAhead: CouchMD5sInBackground
    typealias Removal = NamespaceOverlay.Removal

    /// Where bodies that are not here come from (the replicator's downloader), if anywhere.
    public let bodySource: BodySource?
    /// How long a read waits for the bytes of a body being downloaded before failing with EIO.
    public let fetchTimeout: Double
    /// Which readers may fetch bodies that are not here (thumbnailers only small ones).
    public let browsing: BrowsingPolicy

    /// Extra fields of `/.sofa/status.json` (replication state, downloads), from the mount command.
    public var statusProvider: (@Sendable () -> JSONObject)?
    /// Told of every failure `failed` records (the mount command's desktop notifications).
    public var onFailure: (@Sendable (_ operation: String, _ path: String, _ errno: Int32, _ reason: String) -> Void)?

    public init(store: any MountStore, readOnly: Bool = false, bodySource: BodySource? = nil, fetchTimeout: Double = Tuning.mountFetchTimeout,
                browsing: BrowsingPolicy = BrowsingPolicy()) throws {
        self.browsing = browsing
        self.store = store
        self.bodySource = bodySource
        self.fetchTimeout = fetchTimeout
        self.readOnly = readOnly || store.isReadOnly
        stagingLog = self.readOnly ? nil : store.makeStagingLog()
        md5sAhead = CouchMD5sInBackground(blobs: store.blobs, wanted: { [ledger] in ledger.awaitsCompressedMD5($0) },
                                          found: { [ledger] in ledger.noteCompressedMD5($1, of: $0) })
        scratch = store.makeScratchFolder()
        if !self.readOnly, mkdir(scratchRoot, 0o755) != 0, errno != EEXIST {
            throw SofaError.system("create directory", path: scratchRoot, errno: errno)
        }
        if !self.readOnly {
            mkdir(scratchDirectory(Node.rootScratchID), 0o755)
            mkdir(queriesDirectory, 0o755)
            sealPlainScratchFiles()
        }
        // The system's table of types is read on first use (9 ms here): before the first file is
        // made, not while a program waits for its create.
        if !self.readOnly { DispatchQueue.global(qos: .utility).async { _ = MIMEType.forFileName("first.txt") } }
        recoverPendingSaves()
        do { try recoverStagedAttachments() } catch {
            log.error("files a stopped mount had written are not saved yet: \(error); they stay staged for the next mount")
        }
    }


    // MARK: - Lookups

    func scratchDirectory(_ id: String) -> String { scratch.folder(ofEscapedID: FileNames.escape(id)) }
    func scratchPath(_ id: String, _ relative: String) -> String { scratch.path(scratchDirectory(id), relative) }

    /// What the cache knows of a document, loading it if needed.
    func cached(_ id: String) throws -> DocumentCache.Entry {
        try cache.entry(id) {
            // An id that is not valid is not a document the mount shows (its name is just absent).
            guard DocumentID.isStorable(id), let revision = try store.document(withID: id) else {
                return DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false)
            }
            // Staged files' times and modes are in the log until their fold stores them: read
            // first, so that a fold in between leaves them in one or the other.
            let staged = stagingLog?.attributes(in: id) ?? [:]
            let local = try store.localAttributes(ofDocument: id).merging(staged) { $1 }
            return DocumentCache.Entry(revision: revision, key: try store.storageKey(of: id), rendered: render(revision.properties),
                                       hasConflicts: !(try store.revisionTree(of: id).conflicts.isEmpty),
                                       revisionTimes: try store.revisionTimes(of: revision), local: local)
        }
    }

    /// The live current revision (from the cache).
    func liveRevision(_ id: String) throws -> Revision? {
        try cached(id).revision
    }

    /// Whether a change is one this mount made (`SaveLedger.takeOwnSave`); each is recognised once.
    public func madeHere(_ change: DocumentStore.Change) -> Bool {
        ledger.takeOwnSave(change)
    }

    /// Forgets what is cached about a document that changed (saved here, or seen by the watcher).
    public func documentChanged(_ id: String) {
        cache.forget(id)
    }

    func removal(_ id: String) -> Removal? { overlay.removal(id) }

    /// Whether document `id`'s properties.json is shown: not once `rm` removed it (a removal
    /// under way), and not while this mount is filling a document whose properties are empty.
    /// There, `{}` would stand where `cp -r` of a document folder from a disk creates
    /// properties.json (with O_EXCL: it made the folder), after the attachments when the
    /// source lists those first; the file appears, `{}`, once the document has been quiet for
    /// `Tuning.emptyPropertiesUnshownFor`.
    func showsProperties(of id: String, _ revision: Revision) -> Bool {
        guard removal(id)?.properties != true else { return false }
        return !(revision.properties.isEmpty
                 && ledger.savedRecently(id, within: Tuning.emptyPropertiesUnshownFor, now: Date().timeIntervalSince1970))
    }

    /// The file being written at `path`, if one is.
    func pendingFile(at path: String) -> WriteHandle? { pending.file(at: path) }

    func pendingFiles(inDocument id: String) -> [WriteHandle] {
        pending.files(inDocument: id)
    }

    /// Attachments visible in the folder of a live revision, with the document's staged files
    /// (Bursts.swift), in name order; only those that lie below `folder` of its attachments/
    /// when given (`Node.lies`), which a folder's listing sorts alone.
    func visibleAttachments(_ revision: Revision, below folder: String? = nil) -> [Attachment] {
        overlay.compose(revision.attachments, staged: ledger.stagedFiles(in: revision.docID), in: revision.docID, below: folder)
    }

    /// Whether `path` is a folder of the mount (false when it is something else or nothing).
    func isDirectoryNode(_ path: String) throws -> Bool {
        do {
            return try attributes(of: path).kind == .directory
        } catch let error as any ErrnoConvertible where error.errno == ENOENT {
            return false
        }
    }

    func documentFolderExists(_ id: String) throws -> Bool {
        if try liveRevision(id) != nil { return true }
        return isDirectory(scratchDirectory(id))
    }

    func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return LongPath.stat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR
    }

    func render(_ properties: JSONObject) -> [UInt8] {
        Array(JSONValue.object(properties).prettyPrinted().utf8)
    }

    /// A folder. Its link count is 1, "not counted", as btrfs says of its directories: tools
    /// that skip subfolders of a folder whose count is 2 (find's leaf optimisation) then look.
    func directory(_ modified: Double, writable: Bool = true) -> FileAttributes {
        FileAttributes(kind: .directory, permissions: (writable && !readOnly) ? 0o755 : 0o555, modified: FileTime(seconds: modified), linkCount: 1)
    }

    /// A saved document's folder. Its number is the document's storage key: the kernel's inode
    /// of the folder is found again from it (`path(ofNumber:)`), so the mount keeps no node for
    /// each of the documents the kernel holds.
    func documentFolder(_ document: StoredDocument) -> FileAttributes {
        var attributes = directory(document.modified.timeIntervalSince1970)
        attributes.number = DocumentPart(key: document.key, part: .folder).number
        return attributes
    }

    public func path(ofNumber number: UInt64) throws -> String? {
        guard let part = DocumentPart(number: number), let id = try store.documentID(storageKey: part.key) else { return nil }
        return part.path(id)
    }

    public func number(ofPath path: String) -> UInt64? {
        guard let node = Node(path: path), let (id, part) = DocumentPart.of(node), DocumentID.isStorable(id),
              let key = storageKeyForInvalidation(of: id, at: path) else { return nil }
        return DocumentPart(key: key, part: part).number
    }

    public func numberedChildren(of path: String) -> [(name: String, number: UInt64)] {
        guard case .document(let id) = Node(path: path), DocumentID.isStorable(id), let key = storageKeyForInvalidation(of: id, at: path)
        else { return [] }
        return [(Node.propertiesFileName, DocumentPart.Part.properties), (Node.attachmentsDirectoryName, .attachments)].compactMap { name, part in
            DocumentPart(key: key, part: part).number.map { (name, $0) }
        }
    }

    /// A document's storage key, for telling the kernel about a change: nil when it has none,
    /// and nil, logged, when the database cannot say (the kernel's cached view of `path` may
    /// then stay stale until it looks the node up again; nothing else depends on it).
    private func storageKeyForInvalidation(of id: String, at path: String) -> Int64? {
        do {
            return try store.storageKey(of: id)
        } catch {
            log.error("cannot tell the kernel about a change of \(path.escapingControlCharacters): \(error)")
            return nil
        }
    }

    func file(_ size: Int64, _ modified: Double, writable: Bool = true) -> FileAttributes {
        FileAttributes(kind: .regularFile, size: size, permissions: (writable && !readOnly) ? 0o644 : 0o444, modified: FileTime(seconds: modified))
    }

    /// Whether some attachment name lies below `folder` ("" is attachments/ itself).
    func isFolder(_ folder: String, docID: String) throws -> Bool {
        if folder.isEmpty || folder == Node.blobsFolder { return true }
        let prefix = folder + "/"
        if try cached(docID).folders.holds(folder) {
            // (A folder whose every file is being removed or set aside shows while they go.)
            return true
        }
        if hasStagedFolder(folder, in: docID) { return true }
        // Made with mkdir, or given a time or mode: it stays, empty, across mounts.
        if try cached(docID).local[LocalAttributes.folderName(folder)] != nil { return true }
        if pendingFiles(inDocument: docID).contains(where: { ($0 as? AttachmentWriteHandle)?.name.hasPrefix(prefix) == true }) { return true }
        return keptFolders.contains(folder, in: docID)
    }

    /// Whether a document folder lists `blobs/`: when the document has blob properties, or
    /// something is being made there (scratch files of `blobs/` are the caller's to see, in the
    /// scratch listing it reads anyway). It can be entered, and written into, in any document.
    func hasBlobsFolder(_ revision: Revision) -> Bool {
        let id = revision.docID
        return revision.attachments.contains { Blobs.isStandInName($0.name) }
            || pendingFiles(inDocument: id).contains { ($0 as? AttachmentWriteHandle).map { Blobs.isStandInName($0.name) } == true }
            || keptFolders.contains(in: id, where: Blobs.isStandInName)
    }

    func conflictRevision(_ id: String, _ rev: String) throws -> Revision? {
        guard let revID = RevisionID(rev), try store.revisionTree(of: id).conflicts.contains(where: { $0.id == revID }) else { return nil }
        return try store.revision(revID, of: id)
    }

    // MARK: - Attributes

    /// The attributes of `path`, or nil when nothing is there (ENOENT, or ENOTDIR below a
    /// file). Any other failure, a disk's or SQLite's, is passed up: it never reads as "absent".
    func attributesIfPresent(of path: String) throws -> FileAttributes? {
        do {
            return try attributes(of: path)
        } catch let error as any ErrnoConvertible where error.errno == ENOENT || error.errno == ENOTDIR {
            return nil
        }
    }

    public func attributes(of path: String) throws -> FileAttributes {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        if let writer = pendingFile(at: path) {
            // Being written: its time is now, or the one given to it; once saved (its last close
            // still to come), the saved attachment's.
            let (size, changed, given) = writer.lock.withLock { (writer.size, writer.dirty || writer.emptiedAtOpen, writer.given) }
            var shown = file(size, Date().timeIntervalSince1970)
            if case .attachment(let id, let name) = node, try liveRevision(id) != nil, let saved = try visibleAttachment(name, in: id) {
                let savedAttributes = try attachmentAttributes(saved, in: id)
                shown.permissions = savedAttributes.permissions
                if !changed { (shown.modified, shown.accessed) = (savedAttributes.modified, savedAttributes.accessed) }
            }
            if let modified = given.modified { shown.modified = FileTime(nanoseconds: modified) }
            if let accessed = given.accessed { shown.accessed = FileTime(nanoseconds: accessed) }
            if let mode = given.mode { shown.permissions = permissions(mode) }
            return shown
        }
        switch node {
        case .root, .docs: return directory(mountTime)
        case .statusDirectory: return directory(mountTime, writable: false)
        case .statusFile(let name):
            guard let bytes = try status.openBytes(name) ?? statusFile(name) else { throw MountError.notFound(path) }
            var attributes = file(Int64(bytes.count), Date().timeIntervalSince1970, writable: false)
            attributes.volatile = true
            return attributes
        case .document(let id):
            // A folder's time and number are all a stat needs: the document is not loaded for it
            // (`ls -l docs/` after `ls docs/` looks up every name).
            if DocumentID.isStorable(id), let stored = try store.storedDocument(live: id) {
                return documentFolder(stored)
            }
            guard isDirectory(scratchDirectory(id)) else { throw MountError.notFound(path) }
            return directory(mountTime)
        case .properties(let id):
            let entry = try cached(id)
            guard let revision = entry.revision, showsProperties(of: id, revision) else { throw MountError.notFound(path) }
            var attributes = file(Int64(entry.rendered.count), revision.savedAt.timeIntervalSince1970)
            attributes.number = entry.number(.properties)
            return attributes
        case .attachment(let id, let name):
            guard try liveRevision(id) != nil else {
                // A document folder made with mkdir and not saved yet: its attachments/, and the
                // folders made in it (`mkdir docs/new && cp -r photos/. docs/new/attachments/`).
                guard isDirectory(scratchDirectory(id)), try name.isEmpty || name == Node.blobsFolder || isFolder(name, docID: id)
                else { throw MountError.notFound(path) }
                return try folderAttributes(name, in: id)
            }
            if let attachment = try visibleAttachment(name, in: id) {
                return try attachmentAttributes(attachment, in: id)
            }
            guard try isFolder(name, docID: id) else { throw MountError.notFound(path) }
            return try folderAttributes(name, in: id)
        case .conflicts(let id):
            guard let revision = try liveRevision(id) else { throw MountError.notFound(path) }
            return directory(revision.savedAt.timeIntervalSince1970, writable: false)
        case .conflict(let id, let rev):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            return directory(conflict.savedAt.timeIntervalSince1970, writable: false)
        case .conflictProperties(let id, let rev):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            return file(Int64(render(conflict.properties).count), conflict.savedAt.timeIntervalSince1970, writable: false)
        case .conflictAttachment(let id, let rev, let name):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            if let attachment = conflict.attachment(named: name) {
                return file(attachment.length, conflict.savedAt.timeIntervalSince1970, writable: false)
            }
            guard name.isEmpty || conflict.attachments.contains(where: { $0.name.hasPrefix(name + "/") }) else { throw MountError.notFound(path) }
            return directory(conflict.savedAt.timeIntervalSince1970, writable: false)
        case .scratch(let id, let relative):
            guard try documentFolderExists(id) else { throw MountError.notFound(path) }
            return try scratchAttributes(scratchPath(id, relative))
        case .view(let view):
            return try viewAttributes(view, path: path)
        case .query(let query):
            return try queryAttributes(query, path: path)
        }
    }

    public func readLink(_ path: String) throws -> String {
        switch Node(path: path) {
        case .view(let view): return try viewLinkTarget(view, path: path)
        case .query(let query): return try queryLinkTarget(query, path: path)
        default: throw MountError.invalidArgument(path, why: "not a symbolic link")
        }
    }

    public func attributes(ofHandle number: UInt64) throws -> FileAttributes {
        let handle = try handles.get(number)
        let size = handle.guardLock.withLock { handle.size }
        if let writer = handle as? WriterDescriptor {
            // As its path shows it (its mode, times given); unlinked, with what was given to it.
            let (path, unlinked, given) = writer.file.lock.withLock { (writer.file.path, writer.file.unlinked, writer.file.given) }
            if !unlinked, var attributes = try? self.attributes(of: path), attributes.kind == .regularFile {
                attributes.size = size
                return attributes
            }
            var attributes = file(size, Date().timeIntervalSince1970)
            if let mode = given.mode { attributes.permissions = permissions(mode) }
            return attributes
        }
        var attributes = file(size, Date().timeIntervalSince1970, writable: handle is ScratchHandle)
        if handle is StatusFileHandle { attributes.volatile = true }
        return attributes
    }

    func scratchAttributes(_ path: String) throws -> FileAttributes {
        var info = stat()
        guard LongPath.lstat(path, &info) == 0 else { throw SofaError.system("lstat", path: path, errno: errno) }
        let kind: FileAttributes.Kind = info.st_mode & S_IFMT == S_IFDIR ? .directory : .regularFile
        return FileAttributes(kind: kind, size: kind == .directory ? 0 : scratch.contentLength(ofStoredSize: Int64(info.st_size)), permissions: UInt32(info.st_mode & 0o7777),
                              modified: FileTime(info.st_mtim), accessed: FileTime(info.st_atim),
                              linkCount: kind == .directory ? UInt32(info.st_nlink) : 1)
    }

    // MARK: - Directories

    /// Lists a folder. The kernel opens folders itself and keeps their listings (the change
    /// watcher drops those another process changes), so nothing is held between calls: each
    /// entry's position says where to go on. "." and ".." come first; then, in /docs, the
    /// documents a page at a time in the order they were first stored (constant memory for
    /// any number of them); then every other entry by a hash of its name, as ext4 lists.
    public func readDirectory(_ path: String, after position: UInt64, add: (DirectoryEntry) -> Bool) throws {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        guard try attributes(of: path).kind == .directory else { throw MountError.notFolder(path) }
        for entry in [DirectoryEntry(name: ".", position: ListingPosition.dot),
                      DirectoryEntry(name: "..", position: ListingPosition.dotDot)] where entry.position > position {
            guard add(entry) else { return }
        }
        if case .view(let view) = node { return try listView(view, path: path, after: position, add: add) }
        if case .query(.results(let name)) = node { return try listQueryResults(name, path: path, after: position, add: add) }
        if node == .docs, position < ListingPosition.firstName {
            var after = ListingPosition.documentKey(after: position)
            while true {
                let page = try store.documentsInStorageOrder(afterKey: after, limit: Tuning.documentListingPage)
                for document in page {
                    let entry = DirectoryEntry(name: FileNames.escape(document.docID), attributes: documentFolder(document),
                                               position: ListingPosition.document(key: document.key))
                    guard add(entry) else { return }
                    after = document.key
                }
                if page.count < Tuning.documentListingPage { break }
            }
        }
        let now = Date().timeIntervalSince1970
        // A large folder's listing resumed: its names as the listing started, each looked up
        // again, so that a page never shows a name removed or a size changed since (readdirplus
        // would have the kernel believe it).
        if position > ListingPosition.dotDot, let kept = listings.entries(of: path, now: now) {
            for entry in kept where entry.position > position {
                guard let fresh = try refreshed(entry, in: path) else { continue }
                guard add(fresh) else { return }
            }
            return
        }
        let entries = try listEntries(node, path: path).sorted(by: { $0.position < $1.position })
        if position <= ListingPosition.dotDot { listings.keep(entries, of: path, now: now) }
        for entry in entries where entry.position > position {
            guard add(entry) else { return }
        }
    }

    /// `entry` of folder `path` with its attributes as they are now; nil when it has gone.
    private func refreshed(_ entry: DirectoryEntry, in path: String) throws -> DirectoryEntry? {
        guard entry.attributes != nil else { return entry }
        do {
            let attributes = try attributes(of: path == "/" ? "/" + entry.name : path + "/" + entry.name)
            return DirectoryEntry(name: entry.name, attributes: attributes, position: entry.position)
        } catch let error as any ErrnoConvertible where error.errno == ENOENT {
            return nil
        }
    }

    private func listEntries(_ node: Node, path: String) throws -> [DirectoryEntry] {
        switch node {
        case .root:
            return [named("docs", attributes: directory(mountTime)),
                    named(Node.viewsDirectoryName, attributes: directory(mountTime, writable: false)),
                    named(Node.queriesDirectoryName, attributes: try queryAttributes(.root, path: "/" + Node.queriesDirectoryName)),
                    named(Node.statusDirectoryName, attributes: directory(mountTime, writable: false))]
                + (try scratchEntries(scratchDirectory(Node.rootScratchID))).filter { Node.isRootScratchName($0.name) }
        case .docs:
            // Documents that exist only as folders (mkdir, nothing saved yet); the others are paged.
            let rootScratch = FileNames.escape(Node.rootScratchID)
            // A database read that fails fails the listing (it read as "no document" and listed it twice).
            let pending = try scratch.documentFolderNames().filter {
                try $0 != rootScratch && liveRevision(FileNames.unescape($0)) == nil
            }
            return pending.map { named($0, attributes: directory(mountTime)) }
        case .statusDirectory:
            return ["status.json"].map { named($0) }
        case .document(let id):
            var entries: [DirectoryEntry] = []
            let entry = try cached(id)
            let scratch = try scratchEntries(scratchDirectory(id))
            if let revision = entry.revision {
                let modified = revision.savedAt.timeIntervalSince1970
                // properties.json first, so that `rm -r` starts the removal before it empties attachments/.
                if showsProperties(of: id, revision) {
                    var attributes = file(Int64(entry.rendered.count), modified)
                    attributes.number = entry.number(.properties)
                    entries.append(DirectoryEntry(name: Node.propertiesFileName, attributes: attributes, position: ListingPosition.first))
                }
                entries.append(named(Node.attachmentsDirectoryName, attributes: try folderAttributes("", in: id)))
                if hasBlobsFolder(revision) || scratch.contains(where: { $0.name == Node.blobsDirectoryName }) {
                    entries.append(named(Node.blobsDirectoryName, attributes: directory(modified)))
                }
                if entry.hasConflicts {
                    entries.append(named(Node.conflictsDirectoryName, attributes: directory(modified, writable: false)))
                }
            } else {
                entries.append(named(Node.attachmentsDirectoryName, attributes: try folderAttributes("", in: id)))
            }
            entries += scratch.filter { ![Node.attachmentsDirectoryName, Node.blobsDirectoryName].contains($0.name) }
            return entries
        case .attachment(let id, let folder):
            var entries: [DirectoryEntry] = []
            var seen = Set<String>()
            let revision = try liveRevision(id)
            let attachments = revision.map { visibleAttachments($0, below: folder) } ?? []
            // Attachments, files being written, and folders made with mkdir (a folder of its own).
            var names = attachments.map { ($0.name, Optional($0), false) }
            names += pendingFiles(inDocument: id).compactMap { ($0 as? AttachmentWriteHandle).map { ($0.name, nil, false) } }
            names += keptFolders.folders(in: id).map { ($0, nil, true) }
            names += try cached(id).recordedFolders.members.map { ($0, nil, true) }
            let prefix = folder.isEmpty ? "" : folder + "/"
            for (name, attachment, isFolder) in names where Node.lies(name, below: folder) {
                let components = FileNames.attachmentComponents(String(name.dropFirst(prefix.count)))
                    .filter { !$0.isEmpty }
                guard let first = components.first, seen.insert(first).inserted else { continue }
                if components.count == 1, let attachment {
                    entries.append(named(first, attributes: try attachmentAttributes(attachment, in: id)))
                } else if components.count > 1 || isFolder {
                    entries.append(named(first, attributes: try folderAttributes(prefix + first, in: id)))
                } else {
                    entries.append(named(first))
                }
            }
            if folder.isEmpty || folder == Node.blobsFolder {
                let directory = folder.isEmpty ? Node.attachmentsDirectoryName : Node.blobsDirectoryName
                entries += try scratchEntries(scratchPath(id, directory)).filter { !seen.contains($0.name) }
            }
            return entries
        case .conflicts(let id):
            return (try store.revisionTree(of: id).conflicts.map { named($0.id.description) })
        case .conflict(let id, let rev):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            let modified = conflict.savedAt.timeIntervalSince1970
            var entries = [named(Node.propertiesFileName,
                                 attributes: file(Int64(render(conflict.properties).count), modified, writable: false)),
                           named(Node.attachmentsDirectoryName, attributes: directory(modified, writable: false))]
            if conflict.attachments.contains(where: { Blobs.isStandInName($0.name) }) {
                entries.append(named(Node.blobsDirectoryName, attributes: directory(modified, writable: false)))
            }
            return entries
        case .conflictAttachment(let id, let rev, let folder):
            guard let conflict = try conflictRevision(id, rev) else { throw MountError.notFound(path) }
            let prefix = folder.isEmpty ? "" : folder + "/"
            var seen = Set<String>()
            return conflict.attachments.filter { Node.lies($0.name, below: folder) }
                .compactMap { attachment in
                let components = FileNames.attachmentComponents(String(attachment.name.dropFirst(prefix.count)))
                guard let first = components.first, seen.insert(first).inserted else { return nil }
                return named(first)
            }
        case .scratch(let id, let relative):
            return try scratchEntries(scratchPath(id, relative))
        case .properties, .statusFile, .conflictProperties:
            throw MountError.notFolder(path)
        case .view:
            return []  // listed a page at a time (listView)
        case .query(.root):
            return try queryFolderEntries()
        case .query(.results):
            return []  // listed a page at a time (listQueryResults)
        case .query(.row):
            throw MountError.notFolder(path)
        }
    }

    private func scratchEntries(_ directory: String) throws -> [DirectoryEntry] {
        try scratchNames(in: directory).map { name in
            // Removed between the listing and this stat: listed without attributes, as a plain
            // file system lists what it read; the kernel asks for them and gets ENOENT.
            named(name, attributes: try? scratchAttributes(scratch.path(directory, name)))
        }
    }

    /// The names in a scratch folder; none when it does not exist (a document with no scratch
    /// file has none). Any other failure (permissions, a disk error) is passed up.
    func scratchNames(in directory: String) throws -> [String] { try scratch.names(in: directory) }

    /// An entry of a folder but "." and "..", at the position of its name.
    func named(_ name: String, attributes: FileAttributes? = nil) -> DirectoryEntry {
        DirectoryEntry(name: name, attributes: attributes, position: ListingPosition.name(name))
    }

    // MARK: - Status

    func statusFile(_ name: String) throws -> [UInt8]? {
        guard name == "status.json" else { return nil }
        var status: JSONObject = [
            "database": .string(store.path),
            "read_only": .bool(readOnly),
            "mounted_at": .string(ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: mountTime))),
            "last_sequence": .integer(try store.lastSequence),
            "replication": ["state": "none"],
            "downloads": [],
        ]
        for (key, value) in statusProvider?() ?? [:] { status[key] = value }
        status["recent_errors"] = .array(self.status.recentFailures)
        return Array(JSONValue.object(status).prettyPrinted().utf8)
    }

    /// Keeps a failure answered to a program, with its reason, for `.sofa/status.json`: a
    /// program prints only the errno's words ("Permission denied"); the reason (a validator's,
    /// a full disk's, a server that did not answer) is here and in the log.
    public func failed(_ operation: String, path: String, errno code: Int32, reason: String) {
        let entry: JSONValue = [
            "time": .string(ISO8601DateFormatter().string(from: Date())),
            "operation": .string(operation), "path": .string(path),
            "error": .string(String(cString: strerror(code))), "reason": .string(reason),
        ]
        status.noteFailure(entry)
        onFailure?(operation, path, code, reason)
    }

    // MARK: - Statistics, times, xattrs

    public func statistics(of path: String) throws -> statvfs {
        var result = statvfs()
        guard statvfs(store.path, &result) == 0 else { throw SofaError.system("statvfs", path: store.path, errno: errno) }
        return result
    }

    static let revisionAttribute = "user.sofa.rev"
    static let digestAttribute = "user.sofa.digest"
    static let availableAttribute = "user.sofa.available"
    /// While a body is downloading: `RECEIVED/LENGTH` bytes.
    static let progressAttribute = "user.sofa.progress"
    /// `true` keeps the body here (the cache never evicts it; a deferred one is fetched);
    /// settable with `setfattr -n user.sofa.pinned -v true`, `false` or `setfattr -x` unpins.
    static let pinnedAttribute = "user.sofa.pinned"
    static let contentTypeAttribute = "user.mime_type"
    /// The JSON pointer of the blob property a file in blobs/ is.
    static let blobAttribute = "user.sofa.blob"

    /// The extended attributes of a node, by name.
    func extendedAttributes(of path: String) throws -> [String: String] {
        guard let node = Node(path: path) else { throw MountError.notFound(path) }
        switch node {
        case .document(let id), .properties(let id):
            guard let revision = try liveRevision(id) else { _ = try attributes(of: path); return [:] }
            return [DocumentFileSystem.revisionAttribute: revision.revID.description]
        case .attachment(let id, let name):
            guard let revision = try liveRevision(id), let attachment = try visibleAttachment(name, in: id) else {
                _ = try attributes(of: path)
                return [:]
            }
            return try attachmentAttributes(attachment, revision: revision.revID)
        case .conflictAttachment(let id, let rev, let name):
            guard let conflict = try conflictRevision(id, rev), let attachment = conflict.attachment(named: name) else {
                _ = try attributes(of: path)
                return [:]
            }
            return try attachmentAttributes(attachment, revision: conflict.revID)
        case .conflict(let id, let rev), .conflictProperties(let id, let rev):
            guard try conflictRevision(id, rev) != nil else { throw MountError.notFound(path) }
            return [DocumentFileSystem.revisionAttribute: rev]
        default:
            _ = try attributes(of: path)
            return [:]
        }
    }

    private func attachmentAttributes(_ attachment: Attachment, revision: RevisionID) throws -> [String: String] {
        // Asked of the store, not only of the revision cached: a body evicted or purged by another
        // process a moment ago is gone before the watcher says so.
        let here = attachment.contentAvailable && attachment.blobKey.map(store.blobs.contains) == true
        var attributes = [DocumentFileSystem.revisionAttribute: revision.description,
                          DocumentFileSystem.digestAttribute: attachment.digest,
                          DocumentFileSystem.availableAttribute: here ? "true" : "false",
                          DocumentFileSystem.contentTypeAttribute: attachment.contentType,
                          DocumentFileSystem.pinnedAttribute: try store.isPinned(digest: attachment.digest) ? "true" : "false"]
        if let pointer = Blobs.pointer(ofStandIn: attachment.name) { attributes[DocumentFileSystem.blobAttribute] = pointer }
        if !here, let progress = bodySource?.progress(of: attachment) {
            if progress.present == attachment.length {
                attributes[DocumentFileSystem.availableAttribute] = "true"
            } else {
                attributes[DocumentFileSystem.progressAttribute] = "\(progress.present)/\(attachment.length)"
            }
        }
        return attributes
    }

    public func extendedAttribute(_ name: String, of path: String) throws -> [UInt8] {
        // `ls -l` asks security.selinux and the POSIX ACL of every file until one answer says the
        // file system does not support them (ENOTSUP, not ENODATA): then it stops asking for the
        // whole device, two round trips in all instead of two per file. No lookup is needed to say so.
        guard name.hasPrefix("user.") else { throw MountError.notUserAttribute(path, name: name) }
        guard let value = try extendedAttributes(of: path)[name] else { throw MountError.noAttribute(path, name: name) }
        return Array(value.utf8)
    }

    public func extendedAttributeNames(of path: String) throws -> [String] {
        try extendedAttributes(of: path).keys.sorted()
    }

    public func setExtendedAttribute(_ name: String, of path: String, to value: [UInt8], flags: Int32) throws {
        let current = try extendedAttributes(of: path)
        if name == DocumentFileSystem.pinnedAttribute, current[name] != nil {
            let text = String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).lowercased()
            switch text {
            case "true", "1", "yes", "on": try pin(path, true)
            case "false", "0", "no", "off", "": try pin(path, false)
            default: throw MountError.invalidArgument(path, why: "\(name) takes true or false, not \(text)")
            }
            return
        }
        guard name == DocumentFileSystem.contentTypeAttribute, case .attachment(let id, let attachmentName) = Node(path: path),
              current[name] != nil else {
            // user.sofa.* are derived: copying them (cp -a, rsync -X) is accepted and changes nothing.
            if name.hasPrefix("user.sofa.") { return }
            throw MountError.notSupported(path, why: "\(name) cannot be set here (user.mime_type on an attachment can)")
        }
        guard !readOnly else { throw SofaError.readOnlyFileSystem(path: path) }
        let type = String(decoding: value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !type.isEmpty, type != current[name] else { return }
        let base = try liveRevision(id)?.revID
        // The file as shown (as `unlink`): a fold since that put it in a revision is this mount's own.
        _ = try commit(id, base: base, change: .attachment(attachmentName), seen: .attachment(current[DocumentFileSystem.digestAttribute])) { draft in
            try draft.setContentType(type, ofAttachment: attachmentName)
        }
    }

    public func removeExtendedAttribute(_ name: String, of path: String) throws {
        if name == DocumentFileSystem.pinnedAttribute, try extendedAttributes(of: path)[name] != nil {
            try pin(path, false)
            return
        }
        _ = try attributes(of: path)
        throw MountError.notSupported(path, why: "\(name) cannot be removed (only user.sofa.pinned can)")
    }

    /// Pins or unpins the body of the attachment at `path`; pinning one not here starts fetching it.
    private func pin(_ path: String, _ pinned: Bool) throws {
        guard !readOnly else { throw SofaError.readOnlyFileSystem(path: path) }
        let found: (Attachment, String, RevisionID)?
        switch Node(path: path) {
        case .attachment(let id, let name):
            found = try liveRevision(id).flatMap { revision in
                try visibleAttachment(name, in: id).map { ($0, id, revision.revID) }
            }
        case .conflictAttachment(let id, let rev, let name):
            found = try conflictRevision(id, rev).flatMap { conflict in conflict.attachment(named: name).map { ($0, id, conflict.revID) } }
        default:
            found = nil
        }
        guard let (attachment, docID, revID) = found else { throw MountError.notFound(path) }
        try store.setPinned(pinned, digest: attachment.digest)
        if pinned && !attachment.contentAvailable { bodySource?.fetchInBackground(attachment, docID: docID, revID: revID) }
    }
}

/// Where entries sit in a listing (`DirectoryEntry.position`), so that a listing can go on
/// from any entry without state, and entries that come and go meanwhile move no other one.
enum ListingPosition {
    static let dot: UInt64 = 1
    static let dotDot: UInt64 = 2
    /// An entry listed before the others (properties.json in a document folder).
    static let first: UInt64 = 3
    /// Documents in /docs: after "." and "..", by their storage key (a new document comes last).
    static func document(key: Int64) -> UInt64 { 3 + UInt64(key) }
    /// The storage key to list documents after, for a listing that goes on after `position`.
    static func documentKey(after position: UInt64) -> Int64 { position > 3 ? Int64(position - 3) : 0 }
    /// Every other entry: a hash of its name (64-bit FNV-1a), from 2^62 to 2^63 - 1, above any
    /// storage key and below the sign bit of the kernel's offsets. Two names of one folder share
    /// a position once in 2^62 / n² folders of n names.
    static let firstName: UInt64 = 1 << 62
    static func name(_ name: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in name.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        return firstName | hash >> 2
    }
}
