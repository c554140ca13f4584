import Foundation

/// A mutual-exclusion lock. Built on `NSLock`: `Synchronization.Mutex` gave false
/// race reports under ThreadSanitizer on Linux (see NOTES.md).
final class Lock: @unchecked Sendable {
    private let lock = NSLock()

    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }
}
