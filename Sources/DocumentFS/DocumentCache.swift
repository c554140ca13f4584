import DocumentModel
import DocumentStore
import Foundation

/// What the mount needs to know about a document for most lookups, kept in memory
/// so that `ls -lR` and `stat` do not reload and re-render revisions from SQLite.
///
/// An entry is dropped when the mount saves the document, and when the change
/// watcher sees another process change it (within `Tuning.changePollInterval`),
/// the same freshness the kernel's own attribute cache gives.
final class DocumentCache: @unchecked Sendable {
    struct Entry {
        /// The live current revision; nil when the document does not exist or is deleted.
        let revision: Revision?
        /// properties.json as rendered.
        let rendered: [UInt8]
        let hasConflicts: Bool
        /// When each attachment last changed (or the time given to it).
        var attachmentTimes: [String: Double] = [:]
    }

    // Guarded by `lock` (a leaf lock).
    private var entries: [String: Entry] = [:]
    /// Counts `forget`s: a load that a forget overtook is returned but not kept (it may
    /// predate the change the forget announced).
    private var forgets: UInt64 = 0
    private let lock = NSLock()
    static let capacity = 20_000

    func entry(_ id: String, load: () throws -> Entry) rethrows -> Entry {
        lock.lock()
        if let entry = entries[id] {
            lock.unlock()
            return entry
        }
        let before = forgets
        lock.unlock()
        let entry = try load()
        lock.lock()
        if forgets == before {
            if entries.count >= DocumentCache.capacity { entries.removeAll(keepingCapacity: true) }
            entries[id] = entry
        }
        lock.unlock()
        return entry
    }

    func forget(_ id: String) {
        lock.lock()
        entries[id] = nil
        forgets &+= 1
        lock.unlock()
    }
}
