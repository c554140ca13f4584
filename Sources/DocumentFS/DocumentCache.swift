import DocumentModel
import DocumentStore
import MountTables
import Foundation

/// What the mount needs to know about a document for most lookups, kept in memory
/// so that `ls -lR` and `stat` do not reload and re-render revisions from SQLite.
///
/// An entry is dropped when the mount saves the document, and when the change
/// watcher sees another process change it (as the commit is published on its change stream),
/// the same freshness the kernel's own attribute cache gives.
final class DocumentCache: @unchecked Sendable {
    struct Entry {
        /// The live current revision; nil when the document does not exist or is deleted.
        let revision: Revision?
        /// The document's storage key, when it is live: what its folder's numbers are made of
        /// (`DocumentPart`).
        let key: Int64?
        /// properties.json as rendered.
        let rendered: [UInt8]
        let hasConflicts: Bool
        /// When the revision that last changed each attachment was saved (seconds since 1970).
        let revisionTimes: [String: Double]
        /// Times and modes given to its files and folders (`Database.localAttributes`), by row name.
        private(set) var local: [String: LocalAttributes]
        /// The folders that have a row there (made with mkdir, or given a time or mode).
        private(set) var recordedFolders = FolderIndex()
        /// The revision's attachments by name, and every folder their names make
        /// (`a/b/c` makes `a` and `a/b`): a lookup in a folder of 10,000 files costs what
        /// one in a folder of ten does.
        let byName: [String: Attachment]
        let folders: FolderIndex

        init(revision: Revision?, key: Int64? = nil, rendered: [UInt8], hasConflicts: Bool, revisionTimes: [String: Double] = [:],
             local: [String: LocalAttributes] = [:]) {
            self.revision = revision
            self.key = key
            self.rendered = rendered
            self.hasConflicts = hasConflicts
            self.revisionTimes = revisionTimes
            self.local = local
            for row in local.keys { if let folder = Entry.folder(ofRow: row) { recordedFolders.insert(folder) } }
            let attachments = revision?.attachments ?? []
            byName = Dictionary(attachments.map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            folders = FolderIndex(holding: attachments.map(\.name))
        }

        /// Changes the row of a file or folder (in place, after the database's).
        mutating func setLocal(_ row: String, _ attributes: LocalAttributes?) {
            local[row] = attributes
            if let folder = Entry.folder(ofRow: row) {
                if attributes == nil { recordedFolders.remove(folder) } else { recordedFolders.insert(folder) }
            }
        }

        /// The folder a row of `local` is about (not attachments/ itself); nil for a file's.
        static func folder(ofRow row: String) -> String? {
            row.count > 1 && row.hasSuffix("/") ? String(row.dropLast()) : nil
        }

        /// The folder a name lies in ("" for attachments/ itself).
        static func parent(of name: String) -> String {
            name.lastIndex(of: "/").map { String(name[..<$0]) } ?? ""
        }

        /// The folders a name lies in: `a/b/c` → `a`, `a/b`.
        static func folders(of name: String) -> [String] {
            var result: [String] = []
            var index = name.startIndex
            while let slash = name[index...].firstIndex(of: "/") {
                if slash > name.startIndex { result.append(String(name[..<slash])) }
                index = name.index(after: slash)
            }
            return result
        }

        /// The number of one of the live document's own nodes (`FileAttributes.number`).
        func number(_ part: DocumentPart.Part) -> UInt64? {
            key.flatMap { DocumentPart(key: $0, part: part).number }
        }
    }

    // Guarded by `lock` (a leaf lock).
    private var entries: [String: Entry] = [:]
    /// Counts `forget`s, in stripes by document id: a load that a forget of its stripe
    /// overtook may predate the change the forget announced, so it is done again.
    private var forgets = [UInt64](repeating: 0, count: DocumentCache.stripes)
    private static let stripes = 64
    /// The rows changed (`setLocal`) in documents being loaded, in order, with where each load
    /// under way began: a load read its rows before some of them (the row of a file `rsync`
    /// gave its time, then renamed), and takes them in before it is kept. Without this, such a
    /// load kept the row as it was: the file showed its revision's time until the next save,
    /// and a second `rsync -a` sent it again.
    private var loading: [String: Loads] = [:]

    /// The changes of one document that loads under way still need. Positions count every
    /// change since the first of these loads began; those before the oldest load still running
    /// are dropped, so loads that overlap without end keep only what they need.
    private struct Loads {
        /// Where each load under way began (its position), oldest first.
        var starts: [Int] = []
        /// How many changes were dropped from the front of `changes`.
        var dropped = 0
        var changes: [(row: String, attributes: LocalAttributes?)] = []
        var end: Int { dropped + changes.count }
    }
    private let lock = NSLock()
    static let capacity = Tuning.mountDocumentCache

    /// Loads a document a fold saved meanwhile at most this many times before one load is used
    /// uncached (a document saved again and again while it is read).
    private static let loadAttempts = 4

    func entry(_ id: String, load: () throws -> Entry) rethrows -> Entry {
        let stripe = DocumentCache.stripe(of: id)  // not `forgets.count`: read outside the lock, a race
        var attempt = 1
        while true {
            lock.lock()
            if let entry = entries[id] {
                lock.unlock()
                return entry
            }
            let before = forgets[stripe]
            let start = loading[id]?.end ?? 0
            loading[id, default: Loads()].starts.append(start)
            lock.unlock()
            var entry: Entry
            do { entry = try load() } catch {
                lock.withLock { endLoad(id, start) }
                throw error
            }
            lock.lock()
            let loads = loading[id]!
            for change in loads.changes[(start - loads.dropped)...] { entry.setLocal(change.row, change.attributes) }
            endLoad(id, start)
            let overtaken = forgets[stripe] != before
            if !overtaken {
                if entries.count >= DocumentCache.capacity { entries.removeAll(keepingCapacity: true) }
                entries[id] = entry
            }
            lock.unlock()
            // Overtaken, it may hold the revision from before a fold, and its caller compose it
            // with the staged files after the fold: the fold's files in neither, a lookup
            // answering ENOENT for a file that is there.
            if !overtaken || attempt == DocumentCache.loadAttempts { return entry }
            attempt += 1
        }
    }

    /// Sets rows of a document's `local` in place (a time given to an attachment, after the
    /// database's or the staging log's), without the reload a `forget` would cost: in its
    /// cached entry, and in what loads under way of it read before.
    func setLocal(_ id: String, _ changes: [(row: String, attributes: LocalAttributes?)]) {
        lock.lock()
        if entries[id] != nil { for change in changes { entries[id]!.setLocal(change.row, change.attributes) } }
        if loading[id] != nil { loading[id]!.changes += changes }
        lock.unlock()
    }

    func setLocal(_ id: String, _ row: String, _ attributes: LocalAttributes?) {
        setLocal(id, [(row, attributes)])
    }

    /// Under `lock`: the load of `id` that began at `start` ended; the changes no load under
    /// way needs go.
    private func endLoad(_ id: String, _ start: Int) {
        loading[id]!.starts.remove(at: loading[id]!.starts.firstIndex(of: start)!)
        guard let oldest = loading[id]!.starts.first else {
            loading[id] = nil
            return
        }
        if oldest > loading[id]!.dropped {
            loading[id]!.changes.removeFirst(oldest - loading[id]!.dropped)
            loading[id]!.dropped = oldest
        }
    }

    /// How many changes of `id` are kept for loads under way (for tests).
    func changesKeptForLoads(of id: String) -> Int {
        lock.withLock { loading[id]?.changes.count ?? 0 }
    }

    private static func stripe(of id: String) -> Int {
        Int(UInt(bitPattern: id.hashValue) % UInt(stripes))
    }

    func forget(_ id: String) {
        lock.lock()
        entries[id] = nil
        forgets[DocumentCache.stripe(of: id)] &+= 1
        lock.unlock()
    }
}
