import DocumentModel
import DocumentStore
import MountTables
import Foundation

/// What the mount has saved and is about to save: the staged files of each busy document
/// (its burst, see `Bursts.swift` for the rules), when each document last saved an attachment,
/// the bodies of staged files not synced to disk yet, and the revision each document's last
/// save here made current. A part with its own state and lock (a leaf: nothing is called while
/// it is held, and what it hands out are copies).
///
/// Invariants:
/// - A document has a burst only while it has staged files, or while a fold of it is under way
///   (the fold takes out exactly the files it saved; files staged meanwhile stay).
/// - A burst's `folders` are the folders its staged files' names make.
/// - A burst's `timer` is the one scheduled check that may fold it; a check with another
///   number does nothing.
/// - A body is in `unsynced` from its staging until a fold syncs it; a revision never refers
///   to a body still in it.
/// - An own save is recognised once (`takeOwnSave`): the change watcher then passes over it.
/// - `bodyMD5s` holds MD5s worked out as staged files were written (`StoredBlob.md5`), for
///   their fold's revision id; `compressedMD5s` those of text bodies gzipped as CouchDB stores
///   them, worked out in the background while the burst goes on (`CouchMD5sInBackground`),
///   for the bodies in `compressedMD5sAwaited` only: a fold that takes a body's MD5s ends the
///   wait for it (it works out what is missing itself). A body's go when a save takes its file
///   in, all of them when no burst is left. An MD5 missing there only means the fold reads the
///   body for it.
final class SaveLedger: @unchecked Sendable {
    private var bursts: [String: DocumentFileSystem.Burst] = [:]
    private var recentSaves: [String: Double] = [:]
    private var unsynced: Set<BlobKey> = []
    private var ownSaves: [String: RevisionID] = [:]
    private var bodyMD5s: [BlobKey: [UInt8]] = [:]
    private var compressedMD5s: [BlobKey: [UInt8]] = [:]
    private var compressedMD5sAwaited: Set<BlobKey> = []
    private let lock = NSLock()

    // MARK: Saves and bursts

    /// Document `id` saves an attachment at `now`: whether it was busy (a burst, or a save less
    /// than the quiet window before).
    func noteSave(_ id: String, at now: Double) -> Bool {
        lock.withLock {
            let busy = isBusy(id, at: now)
            if recentSaves.count > Tuning.mountRecentSaves {
                recentSaves = recentSaves.filter { now - $0.value < Tuning.burstQuietWindow }
            }
            recentSaves[id] = now
            return busy
        }
    }

    /// Whether a file closed in document `id` at `now` would be staged.
    func isBusy(_ id: String, now: Double) -> Bool {
        lock.withLock { isBusy(id, at: now) }
    }

    /// Whether document `id` has a burst, or this mount saved into it less than `seconds` before
    /// `now` (as long as `recentSaves` keeps it: past `Tuning.mountRecentSaves` documents, only
    /// those of the quiet window).
    func savedRecently(_ id: String, within seconds: Double, now: Double) -> Bool {
        lock.withLock { savedRecently(id, within: seconds, at: now) }
    }

    private func isBusy(_ id: String, at now: Double) -> Bool {
        savedRecently(id, within: Tuning.burstQuietWindow, at: now)
    }

    private func savedRecently(_ id: String, within seconds: Double, at now: Double) -> Bool {
        bursts[id] != nil || now - (recentSaves[id] ?? 0) < seconds
    }

    /// Adds a staged file to document `id`'s burst, begun now from `live` if there is none, in
    /// place of `replacing`. Returns the new burst's timer, to schedule its first check.
    /// `awaitsCompressedMD5`: its body's gzipped MD5 is being worked out in the background.
    func track(_ staged: StagedAttachment, in id: String, base live: Revision, replacing: StagedAttachment?, bodyMD5: [UInt8]?,
               awaitsCompressedMD5: Bool = false, at now: Double) -> Int? {
        lock.withLock {
            if let key = staged.attachment.blobKey {
                if let bodyMD5 { bodyMD5s[key] = bodyMD5 }
                if awaitsCompressedMD5 { compressedMD5sAwaited.insert(key) }
            }
            let isNew = bursts[id] == nil
            if isNew { bursts[id] = DocumentFileSystem.Burst(base: live, first: now, last: now, timer: 1) }
            // In place: a copy of the burst would copy its staged files, each time one more.
            if let replacing, bursts[id]!.staged[replacing.name]?.seq == replacing.seq { bursts[id]!.staged[replacing.name] = nil }
            if (bursts[id]!.staged[staged.name]?.seq ?? 0) < staged.seq { bursts[id]!.staged[staged.name] = staged }
            bursts[id]!.folders.insert(folderOf: staged.name)
            bursts[id]!.last = now
            return isNew ? bursts[id]!.timer : nil
        }
    }

    /// A burst of files that a stopped mount had staged, to be folded now.
    func adopt(_ files: [StagedAttachment], in id: String, base live: Revision, at now: Double) {
        lock.withLock {
            var burst = DocumentFileSystem.Burst(base: live, first: now, last: now)
            for file in files.sorted(by: { $0.seq < $1.seq }) { burst.staged[file.name] = file }
            burst.folders = FolderIndex(holding: burst.staged.keys)
            bursts[id] = burst
        }
    }

    func burst(_ id: String) -> DocumentFileSystem.Burst? {
        lock.withLock { bursts[id] }
    }

    func hasBurst(_ id: String) -> Bool {
        lock.withLock { bursts[id] != nil }
    }

    var documentsWithBursts: [String] {
        lock.withLock { Array(bursts.keys) }
    }

    /// The staged file at `name` in document `id`.
    func staged(_ name: String, in id: String) -> StagedAttachment? {
        lock.withLock { bursts[id]?.staged[name] }
    }

    /// The staged files of document `id`, by name.
    func stagedFiles(in id: String) -> [String: StagedAttachment]? {
        lock.withLock { bursts[id]?.staged }
    }

    /// Whether staged files of document `id` lie in `folder`.
    func holdsFolder(_ folder: String, in id: String) -> Bool {
        lock.withLock { bursts[id]?.folders.holds(folder) ?? false }
    }

    /// The folders directly in `folder` that staged files of document `id` make.
    func childFolders(of folder: String, in id: String) -> [String] {
        lock.withLock { bursts[id]?.folders.children(of: folder) ?? [] }
    }

    /// When the burst that check `timer` watches is due (nil: folded meanwhile, or another
    /// check's).
    func due(_ id: String, timer: Int) -> Double? {
        lock.withLock {
            guard let burst = bursts[id], burst.timer == timer else { return nil }
            return burst.due
        }
    }

    /// After check `timer` folded (or failed to) in `lastFold` seconds: files staged meanwhile
    /// start a burst of their own, checked by the returned timer (nil: nothing left, or another
    /// check's).
    func restart(_ id: String, timer: Int, at now: Double, lastFold: Double) -> Int? {
        lock.withLock {
            guard var burst = bursts[id], burst.timer == timer else { return nil }
            burst.first = now
            burst.lastFold = lastFold
            burst.timer += 1
            bursts[id] = burst
            return burst.timer
        }
    }

    /// A save of the mount made `own` the current revision of `id`, holding exactly what the
    /// mount shows: the change watcher passes it over. Noted before its commit (inside its
    /// transaction): the watcher wakes at the commit, and a note made after the save returned
    /// came too late now and then, so the mount forgot and invalidated all it had of the
    /// document (10,000 files after a `cp -r`).
    func noteOwnSave(_ own: RevisionID, of id: String) {
        lock.withLock {
            ownSaves[id] = own
            if ownSaves.count > Tuning.mountRecentSaves { ownSaves.removeAll() }
        }
    }

    /// A fold (or another save of the document) saved `folded`: they leave the burst, which
    /// ends when nothing is left in it.
    func saved(_ folded: [StagedAttachment], in id: String) {
        lock.withLock {
            guard var burst = bursts[id] else { return }
            for file in folded where burst.staged[file.name]?.seq == file.seq { burst.staged[file.name] = nil }
            for key in folded.compactMap(\.attachment.blobKey) {
                bodyMD5s[key] = nil
                compressedMD5s[key] = nil
                compressedMD5sAwaited.remove(key)
            }
            if burst.staged.isEmpty {
                bursts[id] = nil
                if bursts.isEmpty {
                    bodyMD5s = [:]
                    compressedMD5s = [:]
                    compressedMD5sAwaited = []
                }
            } else {
                burst.folders = FolderIndex(holding: burst.staged.keys)
                bursts[id] = burst
            }
        }
    }

    // MARK: Bodies not synced yet

    func noteUnsynced(_ key: BlobKey) {
        lock.withLock { _ = unsynced.insert(key) }
    }

    /// Those of `keys` stored without their fsync.
    func unsynced(among keys: some Collection<BlobKey>) -> [BlobKey] {
        lock.withLock { keys.filter { unsynced.contains($0) } }
    }

    func noteSynced(_ keys: [BlobKey]) {
        lock.withLock { unsynced.subtract(keys) }
    }

    /// The MD5s known of the bodies `keys`, of their bytes and of their gzip form (see
    /// `bodyMD5s`); the background no longer works out the others: the fold does.
    func bodyMD5s(of keys: some Sequence<BlobKey>) -> [(key: BlobKey, md5: [UInt8], compressed: Bool)] {
        lock.withLock {
            var known: [(key: BlobKey, md5: [UInt8], compressed: Bool)] = []
            for key in keys {
                if let md5 = bodyMD5s[key] { known.append((key, md5, false)) }
                if let md5 = compressedMD5s[key] { known.append((key, md5, true)) }
                compressedMD5sAwaited.remove(key)
            }
            return known
        }
    }

    /// Whether body `key`'s gzipped MD5 is still wanted from the background.
    func awaitsCompressedMD5(_ key: BlobKey) -> Bool {
        lock.withLock { compressedMD5sAwaited.contains(key) }
    }

    /// The background worked out body `key`'s gzipped MD5: kept if still wanted.
    func noteCompressedMD5(_ md5: [UInt8], of key: BlobKey) {
        lock.withLock {
            if compressedMD5sAwaited.remove(key) != nil { compressedMD5s[key] = md5 }
        }
    }

    // MARK: Own saves

    /// Whether `change` is the one this mount's last save of its document made; recognised once.
    func takeOwnSave(_ change: DocumentStore.Change) -> Bool {
        lock.withLock {
            guard ownSaves[change.docID] == change.revID else { return false }
            ownSaves[change.docID] = nil
            return true
        }
    }
}
