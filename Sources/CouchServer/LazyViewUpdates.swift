import Foundation

/// The index updates that `update=lazy` view queries ask for, run after their answer.
///
/// At most one runs per index at a time: a query that comes while its index is being updated
/// asks for one more run after it (which takes in what was saved meanwhile), never a run or a
/// thread of its own. At most `ServerTuning.lazyViewUpdaters` threads run them, taking the
/// indexes in the order they were asked for, so that a burst of lazy queries neither grows the
/// process by a thread each (300 queries made 300 threads) nor takes the request pool's
/// threads from other requests.
final class LazyViewUpdates: @unchecked Sendable {
    // Guarded by `lock` (a leaf).
    /// The updates asked for and not started, oldest first, by index key.
    private var waiting: [(key: String, update: @Sendable () -> Void)] = []
    /// Indexes being updated now; `true` when one more run was asked for meanwhile.
    private var running: [String: Bool] = [:]
    private var threads = 0
    private let maximumThreads: Int
    private let lock = NSLock()

    init(threads: Int = ServerTuning.lazyViewUpdaters) {
        maximumThreads = threads
    }

    /// Runs `update` of the index named `key` soon: now, or after the run under way.
    func request(_ key: String, _ update: @escaping @Sendable () -> Void) {
        let startThread = lock.withLock { () -> Bool in
            if running[key] != nil {
                running[key] = true
                return false
            }
            if waiting.contains(where: { $0.key == key }) { return false }
            waiting.append((key, update))
            guard threads < maximumThreads else { return false }
            threads += 1
            return true
        }
        if startThread { Thread.detachNewThread { [self] in work() } }
    }

    /// One updater thread: takes the oldest waiting index, runs it (again while asked), until
    /// nothing waits.
    private func work() {
        while let (key, update) = lock.withLock({ () -> (String, @Sendable () -> Void)? in
            guard !waiting.isEmpty else {
                threads -= 1
                return nil
            }
            let next = waiting.removeFirst()
            running[next.key] = false
            return (next.key, next.update)
        }) {
            while true {
                update()
                let again = lock.withLock { () -> Bool in
                    if running[key] == true {
                        running[key] = false
                        return true
                    }
                    running[key] = nil
                    return false
                }
                if !again { break }
            }
        }
    }
}
