import Foundation

/// The index updates that `update=lazy` view queries ask for, run after their answer.
///
/// At most one runs per index at a time: a query that comes while its index is being updated
/// asks for one more run after it (which takes in what was saved meanwhile), never a run or a
/// thread of its own. At most `ServerTuning.lazyViewUpdaters` run at once, on threads of their
/// own, so that a burst of lazy queries neither grows the process by a thread each (300 queries
/// made 300 threads) nor takes the request pool's threads from other requests.
final class LazyViewUpdates: @unchecked Sendable {
    private enum State {
        case running
        case runningAndAskedAgain
    }

    private let queue: OperationQueue
    private var indexes: [String: State] = [:]
    private let lock = NSLock()

    init(concurrency: Int = ServerTuning.lazyViewUpdaters) {
        queue = OperationQueue()
        queue.name = "sofa-lazy-view-updates"
        queue.maxConcurrentOperationCount = concurrency
    }

    /// Runs `update` of the index named `key` soon: now, or after the run under way.
    func request(_ key: String, _ update: @escaping @Sendable () -> Void) {
        let start = lock.withLock { () -> Bool in
            switch indexes[key] {
            case nil:
                indexes[key] = .running
                return true
            case .running, .runningAndAskedAgain:
                indexes[key] = .runningAndAskedAgain
                return false
            }
        }
        guard start else { return }
        queue.addOperation { [self] in
            while true {
                update()
                let again = lock.withLock { () -> Bool in
                    if indexes[key] == .runningAndAskedAgain {
                        indexes[key] = .running
                        return true
                    }
                    indexes[key] = nil
                    return false
                }
                if !again { return }
            }
        }
    }

    /// How many indexes are being updated or wait for a run (for tests and status).
    var pending: Int {
        lock.withLock { indexes.count }
    }
}
