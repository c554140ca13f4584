import DocumentStore
import Foundation

/// What the mount remembers of the folders it derives from the database (`views/`,
/// `queries/`) between calls: a part with its own state and lock.
///
/// Each is a cache: what it holds says when it was true (a database sequence, a query file's
/// stamp), the caller checks that before using it, and nothing is lost when one is dropped.
/// Each holds at most `Tuning.viewListingCursors` entries and is emptied when full.
final class DerivedFolders: @unchecked Sendable {
    /// Views as last opened, valid while the database's sequence is theirs.
    let openViews = BoundedCache<ViewKey, DocumentFileSystem.OpenView>()
    /// Where the listing of each view folder read last stopped, to go on from there through
    /// the index (`DocumentFileSystem+Views.swift`), by path.
    let viewListings = BoundedCache<String, ViewListingCursor>()
    /// `_reduce.json` files as last computed, by path, with the index sequence they reflect.
    let reducedFiles = BoundedCache<String, (sequence: Int64, bytes: [UInt8])>()
    /// Saved queries as last read, by name (`DocumentFileSystem+Queries.swift`).
    let savedQueries = BoundedCache<String, DocumentFileSystem.SavedQuery>()
    /// The results of saved queries cut by a limit or a skip, by name, with the query file's
    /// stamp and the database sequence they reflect.
    let queryMembers = BoundedCache<String, (stamp: [Int64], sequence: Int64, members: Set<String>)>()
}

/// A map of at most `capacity` entries, emptied when a new key would pass it. Its lock is a
/// leaf: values are handed out as copies.
final class BoundedCache<Key: Hashable, Value>: @unchecked Sendable {
    private var entries: [Key: Value] = [:]
    private let capacity: Int
    private let lock = NSLock()

    init(capacity: Int = Tuning.viewListingCursors) {
        self.capacity = capacity
    }

    subscript(key: Key) -> Value? {
        get { lock.withLock { entries[key] } }
        set {
            lock.withLock {
                if newValue != nil, entries[key] == nil, entries.count >= capacity { entries.removeAll() }
                entries[key] = newValue
            }
        }
    }

    /// Forgets everything (what a full cache does).
    func removeAll() {
        lock.withLock { entries.removeAll() }
    }
}
