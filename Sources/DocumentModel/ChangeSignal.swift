import Foundation

/// Wakes those waiting for a change: a database signals each commit, and `_changes` feeds
/// wait on it rather than sleeping their poll interval out (they still poll, for writes
/// made by other processes).
public final class ChangeSignal: @unchecked Sendable {
    // Sendable invariant: `waiters` is only touched under `lock`.
    private let lock = NSLock()
    private var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    private var next: UInt64 = 0

    public init() {}

    /// Wakes everyone waiting now.
    public func signal() {
        let woken = lock.withLock { () -> [CheckedContinuation<Void, Never>] in
            defer { waiters.removeAll() }
            return Array(waiters.values)
        }
        for continuation in woken { continuation.resume() }
    }

    /// Returns at the next signal, or after `duration`, whichever comes first.
    public func wait(atMost duration: Duration) async {
        let id = lock.withLock { () -> UInt64 in
            next += 1
            return next
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            lock.withLock { waiters[id] = continuation }
            Task {
                try? await Task.sleep(for: duration)
                self.lock.withLock { self.waiters.removeValue(forKey: id) }?.resume()
            }
        }
    }
}
