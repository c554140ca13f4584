import Foundation
import FuseKit

/// The attachment folders a document shows beyond those its names make, and when each folder's
/// entries last changed. A part of the mount with its own state and lock.
///
/// - A folder is *kept* when it was made with mkdir or held the last file removed from it, as
///   on disk: it stays until rmdir, a rename moves it, or its document goes.
/// - `children(of:in:)` answers from an index (`FolderIndex`): a folder's link count costs
///   what its own subfolders cost, never what the document or the mount holds.
/// - `changed(_:in:)` is the folder's mtime since this mount began (or since a time was given
///   to it): when an entry was last made, removed or renamed there.
///
/// Invariant: a document has an index here only while it keeps a folder; a time only while
/// its folder changed since the mount began or was last given a time.
/// Its lock is a leaf: nothing is called while it is held.
final class KeptFolders: @unchecked Sendable {
    private var documents: [String: FolderIndex] = [:]
    private var changes: [String: [String: FileTime]] = [:]
    private let lock = NSLock()

    /// Keeps `folder` of document `id`; false when it was kept already.
    @discardableResult
    func insert(_ folder: String, in id: String) -> Bool {
        lock.withLock { documents[id, default: FolderIndex()].insert(folder) }
    }

    /// Keeps `folder` and every folder above it.
    func insertWithParents(_ folder: String, in id: String) {
        lock.withLock {
            var folder = Substring(folder)
            while !folder.isEmpty {
                documents[id, default: FolderIndex()].insert(String(folder))
                folder = folder.lastIndex(of: "/").map { folder[..<$0] } ?? ""
            }
        }
    }

    func remove(_ folder: String, in id: String) {
        lock.withLock {
            documents[id]?.remove(folder)
            if documents[id]?.isEmpty == true { documents[id] = nil }
        }
    }

    /// The document went: none of its folders is kept, and their times go.
    func removeAll(in id: String) {
        lock.withLock {
            documents[id] = nil
            changes[id] = nil
        }
    }

    func contains(_ folder: String, in id: String) -> Bool {
        lock.withLock { documents[id]?.contains(folder) ?? false }
    }

    /// Whether a kept folder of document `id` satisfies `test`.
    func contains(in id: String, where test: (String) -> Bool) -> Bool {
        lock.withLock { documents[id]?.members.contains(where: test) ?? false }
    }

    /// Every kept folder of document `id`.
    func folders(in id: String) -> [String] {
        lock.withLock { documents[id].map { Array($0.members) } ?? [] }
    }

    /// The folders directly in `parent` ("" is attachments/) that are kept or hold a kept folder.
    func children(of parent: String, in id: String) -> [String] {
        lock.withLock { documents[id]?.children(of: parent) ?? [] }
    }

    /// Moves `folder` and the kept folders under it to `toFolder` of document `toID` (a rename);
    /// a kept empty folder at `toFolder`, which the move replaces, goes.
    func move(_ folder: String, in id: String, to toFolder: String, in toID: String) {
        let prefix = folder + "/"
        lock.withLock {
            documents[toID]?.remove(toFolder)
            let moving = documents[id]?.members.filter { $0 == folder || $0.hasPrefix(prefix) } ?? []
            for name in moving {
                documents[id]?.remove(name)
                documents[toID, default: FolderIndex()].insert(toFolder + name.dropFirst(folder.count))
            }
            for document in [id, toID] where documents[document]?.isEmpty == true { documents[document] = nil }
        }
    }

    /// When an entry was last made, removed or renamed in `folder`, since this mount began.
    func changed(_ folder: String, in id: String) -> FileTime? {
        lock.withLock { changes[id]?[folder] }
    }

    /// An entry was made, removed or renamed in `folder` at `time`.
    func noteChange(_ folder: String, in id: String, at time: FileTime) {
        lock.withLock { changes[id, default: [:]][folder] = time }
    }

    /// The folder was given a time, or went: its own time counts from now on. Returns the time it had.
    @discardableResult
    func forgetChange(_ folder: String, in id: String) -> FileTime? {
        lock.withLock {
            let time = changes[id]?.removeValue(forKey: folder)
            if changes[id]?.isEmpty == true { changes[id] = nil }
            return time
        }
    }
}

/// A set of attachment folders (`a/b` for attachments/a/b), with the folders each lies in:
/// what a folder holds is found in what it holds, not by looking through the whole set.
///
/// Invariant: `below[p][c]` is the number of members at or under `c`, for each folder `c`
/// whose parent is `p` ("" for attachments/); nothing else is in `below`.
struct FolderIndex: Sendable {
    private(set) var members: Set<String> = []
    private var below: [String: [String: Int]] = [:]

    init() {}

    /// The folders that hold `names` (file names: `a/b/f` makes `a/b`, and with it `a`).
    init(holding names: some Sequence<String>) {
        for name in names { insert(folderOf: name) }
    }

    var isEmpty: Bool { members.isEmpty }

    /// Adds `folder`; false when it is a member already.
    @discardableResult
    mutating func insert(_ folder: String) -> Bool {
        guard !folder.isEmpty, members.insert(folder).inserted else { return false }
        count(folder, by: 1)
        return true
    }

    /// Adds the folder that holds the file `name`, if it is in one.
    mutating func insert(folderOf name: String) {
        if let slash = name.lastIndex(of: "/") { insert(String(name[..<slash])) }
    }

    /// Removes `folder` (the folders above it stay while they hold other members).
    @discardableResult
    mutating func remove(_ folder: String) -> Bool {
        guard members.remove(folder) != nil else { return false }
        count(folder, by: -1)
        return true
    }

    /// Whether `folder` was added itself.
    func contains(_ folder: String) -> Bool { members.contains(folder) }

    /// Whether `folder` is a member or lies above one.
    func holds(_ folder: String) -> Bool {
        below[DocumentCache.Entry.parent(of: folder)]?[folder] != nil
    }

    /// The members, and folders above members, directly in `parent`.
    func children(of parent: String) -> [String] {
        below[parent].map { Array($0.keys) } ?? []
    }

    /// Adds `delta` to the count of `folder` and of every folder above it.
    private mutating func count(_ folder: String, by delta: Int) {
        var child = Substring(folder)
        while !child.isEmpty {
            let parent = child.lastIndex(of: "/").map { child[..<$0] } ?? ""
            let key = String(parent)
            let count = (below[key]?[String(child)] ?? 0) + delta
            below[key, default: [:]][String(child)] = count > 0 ? count : nil
            if below[key]?.isEmpty == true { below[key] = nil }
            child = parent
        }
    }
}
