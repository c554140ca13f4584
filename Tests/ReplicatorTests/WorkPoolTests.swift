import Foundation
@testable import Replicator
import Testing

/// The bounded pool that runs transfers of deferred bodies (it was a thread per fetch): a burst
/// queues instead of spawning, every item runs, and an idle pool keeps no thread.
@Suite struct WorkPoolTests {
    /// Counts items running at once, and the most seen.
    final class Gauge: @unchecked Sendable {
        // Sendable invariant: every field is guarded by `lock`.
        private let lock = NSLock()
        private var running = 0
        private(set) var most = 0
        private(set) var done = 0
        func enter() { lock.withLock { running += 1; most = max(most, running) } }
        func leave() { lock.withLock { running -= 1; done += 1 } }
        var finished: Int { lock.withLock { done } }
        var peak: Int { lock.withLock { most } }
    }

    @Test func aBurstQueuesWithinTheLimitAndEveryItemRuns() throws {
        let pool = WorkPool(name: "test-pool", maximum: 3, idleLifetime: 0.2)
        let gauge = Gauge()
        for _ in 0..<40 {
            pool.submit {
                gauge.enter()
                usleep(5_000)  // a transfer that blocks
                gauge.leave()
            }
        }
        let deadline = Date().addingTimeInterval(30)
        while gauge.finished < 40 && Date() < deadline { usleep(10_000) }
        #expect(gauge.finished == 40, "every queued item ran")
        #expect(gauge.peak <= 3, "never more than the limit at once: \(gauge.peak)")
        #expect(gauge.peak >= 2, "items waiting start further threads, up to the limit: \(gauge.peak)")
        #expect(pool.threadCount <= 3)
        // Idle: the threads end after their idle lifetime.
        let idleDeadline = Date().addingTimeInterval(10)
        while pool.threadCount > 0 && Date() < idleDeadline { usleep(20_000) }
        #expect(pool.threadCount == 0, "an idle pool keeps no thread")
    }

    /// A long item (a body streaming for minutes) does not hold back the next one while the
    /// pool may still start threads: two quick submissions each get a thread.
    @Test func aLongItemDoesNotHoldBackTheNextWhileThereIsRoom() throws {
        let pool = WorkPool(name: "test-pool", maximum: 4, idleLifetime: 0.2)
        let release = DispatchSemaphore(value: 0)
        let started = DispatchSemaphore(value: 0)
        pool.submit {
            started.signal()
            release.wait()  // held until the end of the test
        }
        #expect(started.wait(timeout: .now() + 10) == .success)
        let second = DispatchSemaphore(value: 0)
        pool.submit { second.signal() }
        #expect(second.wait(timeout: .now() + 10) == .success, "the second item ran beside the first")
        release.signal()
    }
}
