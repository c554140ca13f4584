import Foundation
import NIOCore

extension EventLoopFuture where Value: Sendable {
    /// `get()`, with the value handed over under a lock rather than through the continuation:
    /// ThreadSanitizer does not see the happens-before of a continuation resumed on an event loop
    /// (the concurrency runtime is not instrumented) and reported the channel it carried as a race.
    public func valueUnderLock() async throws -> Value {
        let box = HandoffBox<Result<Value, any Error>>()
        await withCheckedContinuation { (arrived: CheckedContinuation<Void, Never>) in
            whenComplete { result in
                box.set(result)
                arrived.resume()
            }
        }
        return try box.take().get()
    }
}

/// One value passed between threads under a mutex (which ThreadSanitizer understands).
final class HandoffBox<Value>: @unchecked Sendable {
    // Sendable invariant: `value` is only touched under `lock`.
    private let lock = NSLock()
    private var value: Value?

    func set(_ newValue: Value) { lock.withLock { value = newValue } }

    func take() -> Value { lock.withLock { value! } }
}
