import Foundation

/// A bounded pool of threads for blocking work (transfers of deferred bodies, their installs):
/// a burst of work queues, it does not spawn a thread per item. Threads start as work arrives,
/// up to `maximum`, and end after `idleLifetime` with nothing to do, so an idle process keeps
/// none. Work runs in the order it was submitted.
final class WorkPool: @unchecked Sendable {
    // Sendable invariant: `queue`, `head`, `threads` and `idle` are guarded by `condition`.
    let name: String
    let maximum: Int
    let idleLifetime: Double
    private let condition = NSCondition()
    private var queue: [@Sendable () -> Void] = []
    /// The next item of `queue` to run (items before it have been taken).
    private var head = 0
    private var threads = 0
    private var idle = 0

    init(name: String, maximum: Int, idleLifetime: Double = 5) {
        self.name = name
        self.maximum = max(1, maximum)
        self.idleLifetime = idleLifetime
    }

    /// Runs `work` on a thread of the pool: now if one is idle or another may start, else when
    /// one is free.
    func submit(_ work: @escaping @Sendable () -> Void) {
        let start = condition.withLock { () -> Bool in
            queue.append(work)
            // Each idle thread takes one item; more waiting items than idle threads start another.
            let start = queue.count - head > idle && threads < maximum
            if start { threads += 1 }
            condition.signal()
            return start
        }
        guard start else { return }
        let thread = Thread { [self] in serve() }
        thread.name = name
        thread.start()
    }

    /// Threads running now (for tests and status).
    var threadCount: Int { condition.withLock { threads } }

    private func serve() {
        condition.lock()
        while true {
            while head == queue.count {
                idle += 1
                let signalled = condition.wait(until: Date().addingTimeInterval(idleLifetime))
                idle -= 1
                if !signalled && head == queue.count {
                    threads -= 1
                    condition.unlock()
                    return
                }
            }
            let work = queue[head]
            head += 1
            if head == queue.count {
                queue.removeAll(keepingCapacity: true)
                head = 0
            }
            condition.unlock()
            work()
            condition.lock()
        }
    }
}

/// Runs `body(0)` … `body(count - 1)` at once, each on a thread of its own (`body(0)` on the
/// caller's), and returns when all have returned: a page's requests on their connections.
/// `body` must be safe to run from several threads at once for distinct indexes.
func runConcurrently(_ count: Int, _ body: @escaping (Int) -> Void) {
    guard count > 1 else {
        if count == 1 { body(0) }
        return
    }
    // Sendable invariant: `body` is safe to call concurrently, as the caller promises.
    final class Work: @unchecked Sendable {
        let body: (Int) -> Void
        init(_ body: @escaping (Int) -> Void) { self.body = body }
    }
    let work = Work(body)
    let done = DispatchGroup()
    for index in 1..<count {
        done.enter()
        Thread.detachNewThread {
            work.body(index)
            done.leave()
        }
    }
    body(0)
    done.wait()
}
