import Foundation

/// How many of one database's storage calls may hold the server's blocking threads at once:
/// all but one of them, so that work for one database (writers queued behind a slow
/// `validate_doc_update`, a view build, bodies waiting on a remote) never leaves another
/// database's requests without a thread. A call past the limit waits here, on no thread.
final class DatabaseSlots: @unchecked Sendable {
    // Sendable invariant: `used` and `waiting` are guarded by `lock` (a leaf lock: nothing is
    // called while it is held but a continuation's resume, after it is released).
    private let lock = NSLock()
    private var used: [String: Int] = [:]
    private var waiting: [String: [CheckedContinuation<Void, Never>]] = [:]
    let limit: Int

    init(limit: Int) { self.limit = max(1, limit) }

    /// Runs `work` once one of `database`'s slots is free.
    func withSlot<T>(_ database: String, _ work: () async throws -> T) async rethrows -> T {
        await acquire(database)
        defer { release(database) }
        return try await work()
    }

    private func acquire(_ database: String) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = lock.withLock { () -> Bool in
                guard used[database, default: 0] < limit else {
                    waiting[database, default: []].append(continuation)
                    return false
                }
                used[database, default: 0] += 1
                return true
            }
            if granted { continuation.resume() }
        }
    }

    private func release(_ database: String) {
        let next = lock.withLock { () -> CheckedContinuation<Void, Never>? in
            if var queue = waiting[database], !queue.isEmpty {
                let next = queue.removeFirst()  // the slot passes to it as it is
                waiting[database] = queue.isEmpty ? nil : queue
                return next
            }
            used[database, default: 1] -= 1
            if used[database] == 0 { used[database] = nil }
            return nil
        }
        next?.resume()
    }
}
