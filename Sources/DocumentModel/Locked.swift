import Foundation

/// A value guarded by a lock (the command line's output state, tests' shared counters).
public final class Locked<Value>: @unchecked Sendable {
    // Sendable invariant: `value` is only touched under `lock`.
    private let lock = NSLock()
    private var value: Value
    public init(_ value: Value) { self.value = value }
    public func withLock<T>(_ body: (inout Value) throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
