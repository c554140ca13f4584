import DocumentStore
import MountTables
import Foundation

/// What a document's folder shows that its revisions do not say yet: a removal under way
/// (`rm -r` of the folder: properties.json and attachments unlinked one by one, the document
/// deleted by the `rmdir`), and attachments set aside (renamed to a scratch name in their own
/// document, removed with its next save). A part with its own state and lock (a leaf).
///
/// - A removal starts with properties.json and ends with the document's deletion or its next
///   saved revision; attachments unlinked meanwhile are hidden, removed by that revision.
/// - A set-aside attachment is hidden from the moment of its rename; the save that removes
///   it removes it only while it still has the body that was set aside.
/// - `compose` is the one place that lays these and the staged files over a revision: every
///   folder listing and every lookup sees the same thing.
final class NamespaceOverlay: @unchecked Sendable {
    struct Removal {
        var properties = false
        var attachments: Set<String> = []
    }

    struct SetAside {
        /// The body set aside: a save by another process meanwhile is not removed.
        let digest: String
        let since: Date
    }

    private var removals: [String: Removal] = [:]
    private var setAside: [String: [String: SetAside]] = [:]
    /// Document folders made by mkdir, by document id: by which thread, and when.
    private var made: [String: (caller: pid_t, at: Double)] = [:]
    private let lock = NSLock()

    /// Document folder `id` was made by `caller`'s mkdir (`DocumentFileSystem.lookup`).
    func noteMade(_ id: String, by caller: pid_t, at now: Double) {
        lock.withLock {
            if made.count >= Tuning.recentFolderMakers { made = made.filter { now - $0.value.at < Tuning.recentFolderMakerLife } }
            made[id] = (caller, now)
        }
    }

    /// Whether `caller` made document folder `id` with mkdir, less than a while ago.
    func wasMade(_ id: String, by caller: pid_t, now: Double) -> Bool {
        lock.withLock { made[id].map { $0.caller == caller && now - $0.at < Tuning.recentFolderMakerLife } ?? false }
    }

    func removal(_ id: String) -> Removal? {
        lock.withLock { removals[id] }
    }

    /// properties.json of `id` was unlinked: its removal starts.
    func startRemoval(_ id: String) {
        lock.withLock { removals[id, default: Removal()].properties = true }
    }

    /// Hides attachment `name` of `id` if a removal is under way there: whether one is.
    func removeDuringRemoval(_ name: String, in id: String) -> Bool {
        lock.withLock {
            guard removals[id] != nil else { return false }
            removals[id]!.attachments.insert(name)
            return true
        }
    }

    /// The document was deleted, or saved a revision that holds its removals.
    func endRemoval(_ id: String) {
        lock.withLock { removals[id] = nil }
    }

    func setAside(_ name: String, digest: String, since: Date, in id: String) {
        lock.withLock { setAside[id, default: [:]][name] = SetAside(digest: digest, since: since) }
    }

    /// What is set aside in `id`, by name.
    func setAside(in id: String) -> [String: SetAside] {
        lock.withLock { setAside[id] ?? [:] }
    }

    /// The names set aside in `id` by `date` (all of them: nil).
    func setAside(in id: String, by date: Date?) -> [String] {
        lock.withLock { (setAside[id] ?? [:]).filter { entry in date.map { entry.value.since <= $0 } ?? true }.map(\.key) }
    }

    var documentsWithSetAside: [String] {
        lock.withLock { Array(setAside.keys) }
    }

    /// Their removal was saved (or the document went).
    func endSetAside(_ names: some Sequence<String>, in id: String) {
        lock.withLock {
            for name in names { setAside[id]?[name] = nil }
            if setAside[id]?.isEmpty == true { setAside[id] = nil }
        }
    }

    /// Whether attachment `name` of `id` is hidden by a removal under way, and whether it is set aside.
    func hides(_ name: String, in id: String) -> (removing: Bool, setAside: Bool) {
        lock.withLock { (removals[id]?.attachments.contains(name) == true, setAside[id]?[name] != nil) }
    }

    /// What document `id`'s attachments folder shows: `attachments` (a revision's) with the
    /// `staged` files over them, less what is hidden; only the names below `folder` of
    /// attachments/ when given (`Node.lies`); in name order.
    func compose(_ attachments: [Attachment], staged: [String: StagedAttachment]?, in id: String,
                 below folder: String? = nil) -> [Attachment] {
        let (removal, aside) = lock.withLock { (removals[id], setAside[id]) }
        var shown = attachments
        if let staged, !staged.isEmpty {
            shown = shown.filter { staged[$0.name] == nil } + staged.values.map(\.attachment)
        }
        if let folder { shown = shown.filter { Node.lies($0.name, below: folder) } }
        // A revision keeps CouchDB's order; a folder lists by name.
        shown.sort { $0.name < $1.name }
        guard removal != nil || aside != nil else { return shown }
        return shown.filter { !(removal?.attachments.contains($0.name) ?? false) && aside?[$0.name] == nil }
    }
}
