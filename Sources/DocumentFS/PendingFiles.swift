import Foundation

/// The files being written (pending files), by mount path and by document, with how many
/// descriptors share each; and the digest each attachment path had when it was last opened
/// for reading. A part with its own state and lock (a leaf).
///
/// - Every descriptor opened at a path while a file is pending there shares that one file
///   (`register`, `claim`); it stops being pending only when its last user is gone and it
///   saved what it had (`release`, `retire`), or when its name goes (`remove`).
/// - A file is found under its current path and its current document only: a rename moves it
///   in both indexes in one step (`move`).
/// - `users` of a `WriteHandle` is read and changed only here, under this lock.
final class PendingFiles: @unchecked Sendable {
    private var byPath: [String: WriteHandle] = [:]
    private var byDocument: [String: [String: WriteHandle]] = [:]
    private var openedDigests: [String: String] = [:]
    private let lock = NSLock()

    func file(at path: String) -> WriteHandle? {
        lock.withLock { byPath[path] }
    }

    /// The files pending in document `id` (a cost of their number, not of every pending file).
    func files(inDocument id: String) -> [WriteHandle] {
        lock.withLock { byDocument[id].map { Array($0.values) } ?? [] }
    }

    /// Makes `file` the pending file of its path unless one is there already; the one that is,
    /// with one more user.
    func register(_ file: WriteHandle) -> WriteHandle {
        lock.withLock {
            let winner = byPath[file.path] ?? file
            if winner === file { insert(file) }
            winner.users += 1
            return winner
        }
    }

    /// The file pending at `path`, with one more user, if there is one.
    func claim(at path: String) -> WriteHandle? {
        lock.withLock {
            guard let file = byPath[path] else { return nil }
            file.users += 1
            return file
        }
    }

    /// One user less; whether it was the last.
    func release(_ file: WriteHandle) -> Bool {
        lock.withLock {
            file.users -= 1
            return file.users == 0
        }
    }

    /// Stops `file` being pending if nobody uses it (none opened it again meanwhile): whether it stopped.
    func retire(_ file: WriteHandle) -> Bool {
        lock.withLock {
            guard file.users == 0 else { return false }
            removeIfPresent(file)
            return true
        }
    }

    /// Stops `file` being pending whoever uses it (its name is gone).
    func remove(_ file: WriteHandle) {
        lock.withLock { removeIfPresent(file) }
    }

    /// Moves `file` to `path` as `rename` changes it (`change` sets its new name and document
    /// and says whether it stays pending); in one step, so no lookup finds it at both paths
    /// or at neither. The caller holds the file's own lock.
    func move(_ file: WriteHandle, to path: String, change: (WriteHandle) -> Bool) {
        lock.withLock {
            removeIfPresent(file)
            guard change(file) else { return }
            file.path = path
            insert(file)
        }
    }

    /// Notes that the attachment at `path` was opened showing body `digest`: whether it showed
    /// that body at its last open too (the kernel may keep what it cached).
    func noteOpened(_ path: String, digest: String) -> Bool {
        lock.withLock {
            let same = openedDigests[path] == digest
            openedDigests[path] = digest
            return same
        }
    }

    /// The body at `path` changed: the next open starts the kernel's cache afresh.
    func forgetOpened(_ path: String) {
        lock.withLock { openedDigests[path] = nil }
    }

    private func insert(_ file: WriteHandle) {
        byPath[file.path] = file
        byDocument[file.docID, default: [:]][file.path] = file
    }

    private func removeIfPresent(_ file: WriteHandle) {
        guard byPath[file.path] === file else { return }
        byPath[file.path] = nil
        byDocument[file.docID]?[file.path] = nil
        if byDocument[file.docID]?.isEmpty == true { byDocument[file.docID] = nil }
    }
}
