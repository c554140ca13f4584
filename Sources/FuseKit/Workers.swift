@preconcurrency import CFuse3
import Foundation

/// The threads that serve a session: one reads `/dev/fuse` and answers what it reads itself;
/// more join only while requests block.
///
/// A request's round trip includes waking the thread that reads. With a pool of threads all
/// asleep in `read` (as `fuse_loop_mt` and Sofa's first loop did), the kernel wakes a
/// different one each time, and a pool cannot spin (`DeviceIO`): every thread would. So one
/// thread at a time reads, answers the request, and reads again.
///
/// A request that blocks (a read waiting for a download, a save's fsync) must not hold up the
/// others. Code that is about to wait says so (`FuseMount.mayBlock()`), and another thread
/// takes over the reading at once; a watchdog looks every `stallCheck` for requests that
/// block without saying so, and when every thread is held by one older than that and none
/// reads, it wakes an idle thread (or starts one, up to `maximum`) to read. A thread that
/// finishes while another reads goes idle. The watchdog parks after a second without
/// requests, so an idle mount wakes nothing.
final class Workers: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `condition`'s lock.
    private let session: OpaquePointer
    private let maximum: Int
    private let stallCheck: Double
    private let condition = NSCondition()
    private let watchdogWake = NSCondition()
    private let group = DispatchGroup()
    private var threads = 0
    /// Threads in `read` (or on their way there).
    private var reading = 0
    private var idle = 0
    /// When each busy thread took its request (monotonic nanoseconds), by thread number.
    private var busySince: [Int: UInt64] = [:]
    private var lastRequest: UInt64 = 0
    private var watchdogParked = false
    private var exiting = false

    init(session: OpaquePointer, maximum: Int, stallCheck: Double = 0.01) {
        self.session = session
        self.maximum = max(1, maximum)
        self.stallCheck = stallCheck
    }

    /// Serves until the session ends (the file system is unmounted).
    func run() {
        condition.withLock { startThread() }
        group.enter()
        let watchdog = Thread { [self] in
            watch()
            group.leave()
        }
        watchdog.name = "fuse-watchdog"
        watchdog.start()
        group.wait()
    }

    /// Starts one more serving thread. Under `condition`.
    private func startThread() {
        let number = threads
        threads += 1
        group.enter()
        let thread = Thread { [self] in
            serve(number)
            group.leave()
        }
        thread.name = "fuse-\(number)"
        thread.stackSize = 1 << 20
        thread.start()
    }

    private func serve(_ number: Int) {
        var buffer = fuse_buf()
        defer { free(buffer.mem) }
        pthread_setspecific(currentWorkersKey, Unmanaged.passUnretained(self).toOpaque())
        defer { pthread_setspecific(currentWorkersKey, nil) }
        while true {
            condition.lock()
            // Another thread reads: wait until the watchdog needs this one.
            while !exiting && reading > 0 {
                idle += 1
                condition.wait()
                idle -= 1
            }
            guard !exiting else {
                condition.unlock()
                return
            }
            reading += 1
            condition.unlock()

            let result = fuse_session_receive_buf(session, &buffer)

            condition.lock()
            reading -= 1
            if result == -EINTR || (result > 0 && fuse_session_exited(session) == 0) {
                let now = DispatchTime.now().uptimeNanoseconds
                busySince[number] = now
                lastRequest = now
                let wakeWatchdog = watchdogParked
                watchdogParked = false
                condition.unlock()
                if wakeWatchdog { watchdogWake.withLock { watchdogWake.signal() } }
                if result > 0 { fuse_session_process_buf(session, &buffer) }
                condition.withLock { busySince[number] = nil }
                continue
            }
            // ENODEV: unmounted (or the session was told to exit). Tell every thread.
            exiting = true
            condition.broadcast()
            condition.unlock()
            fuse_session_exit(session)
            watchdogWake.withLock { watchdogWake.signal() }
            return
        }
    }

    /// The request the calling thread answers is about to wait: if nobody else reads, another
    /// thread does from now on.
    func mayBlock() {
        condition.withLock { addReaderIfNoneReads() }
    }

    /// Wakes an idle thread, or starts one, when none reads. Under `condition`.
    private func addReaderIfNoneReads() {
        guard reading == 0, !exiting else { return }
        if idle > 0 { condition.signal() } else if threads < maximum { startThread() }
    }

    private func watch() {
        let interval = UInt32(stallCheck * 1_000_000)
        while true {
            usleep(interval)
            condition.lock()
            if exiting {
                condition.unlock()
                return
            }
            let now = DispatchTime.now().uptimeNanoseconds
            let stall = UInt64(stallCheck * 1e9)
            if !busySince.isEmpty, busySince.values.allSatisfy({ now - $0 >= stall }) {
                // Every thread is held by a request that takes long: one more reader, if nobody reads.
                addReaderIfNoneReads()
            }
            let quiet = busySince.isEmpty && now - lastRequest > 1_000_000_000
            if quiet { watchdogParked = true }
            condition.unlock()
            if quiet {
                watchdogWake.lock()
                // No timeout: whoever unparks it signals under `watchdogWake`, which this thread
                // holds from the check until `wait` releases it, so no signal is lost.
                while condition.withLock({ watchdogParked && !exiting }) { watchdogWake.wait() }
                watchdogWake.unlock()
            }
        }
    }
}

/// The `Workers` whose thread this is (nil on other threads).
let currentWorkersKey: pthread_key_t = {
    var key = pthread_key_t()
    pthread_key_create(&key, nil)
    return key
}()

extension FuseMount {
    /// Tells the mount that the request this thread answers is about to wait (for the network,
    /// a lock, an fsync), so that other requests are read meanwhile. Does nothing on threads
    /// that do not serve a mount.
    public static func mayBlock() {
        guard let workers = pthread_getspecific(currentWorkersKey) else { return }
        Unmanaged<Workers>.fromOpaque(workers).takeUnretainedValue().mayBlock()
    }
}
