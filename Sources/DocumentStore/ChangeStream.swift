import CLinux
import DocumentModel
import Foundation
import Glibc
import Logging

/// The one way to learn that a database changed. Every commit, this process's own (published
/// by `Database.write`) or another process's (found by `ForeignCommits`), advances `position`
/// and wakes whoever waits; a waiter then reads what changed since it last looked (its own
/// cursor: `changes(since:)`, body events). Spurious wake-ups are harmless, missed ones are
/// not, so every wait is "after the position I last saw": a commit between a reader's look and
/// its wait is never lost.
///
/// The mount, a continuous push, `_changes` feeds and `_replicator` subscribe; nothing polls.
/// An idle database wakes nobody: another process's commits are found through inotify on the
/// write-ahead log, with a slow look every `Tuning.foreignChangeSafetyInterval` for file
/// systems that send no events (NFS).
public final class ChangeStream: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `condition`'s lock.
    private let condition = NSCondition()
    private var position: UInt64 = 0
    /// See `lastDocumentChange`.
    private var documentPosition: UInt64 = 0
    /// Threads blocked in `wait(after:)`, which every commit wakes.
    private var positionWaiters = 0
    private var closed = false
    private var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    /// The timer that ends each async wait at its deadline, cancelled when the wait ends first.
    /// (A dispatch source, not `Task.sleep`: a cancelled sleep leaves its timer to fire later,
    /// so each longpoll that a change ended early would still wake the process at its timeout.)
    private var timers: [UInt64: any DispatchSourceTimer] = [:]
    private var nextWaiter: UInt64 = 0
    /// Started by the first wait: a command that only writes never starts a thread.
    private var foreign: ForeignCommits?
    /// Starts `foreign`; set by the database once, before anyone waits.
    var foreignWatch: (() -> ForeignCommits?)? {
        get { condition.withLock { startForeign } }
        set { condition.withLock { startForeign = newValue } }
    }
    private var startForeign: (() -> ForeignCommits?)?
    private var foreignStarted = false
    /// Called at each publish (see `observe`).
    private var observers: [@Sendable (_ documents: Bool) -> Void] = []

    public init() {}

    /// Where the stream is now: pass it to the next `wait(after:)`.
    public var current: UInt64 {
        startForeignWatchIfNeeded()
        return condition.withLock { position }
    }

    /// Whether the database was closed: waits return at once.
    public var isClosed: Bool { condition.withLock { closed } }

    /// A commit happened (or may have): wakes every waiter. A stream that belongs to no
    /// database (`ChangeStream()`) is a plain signal its owner publishes.
    /// `documents`: whether it may have changed documents or bodies (a new sequence, a body
    /// event); false for this process's commits that did neither (a mount's staged file, a
    /// local document, a cache note). Another process's commit is always counted as one.
    public func publish(documents: Bool = true) {
        let (observers, wakeBlocked) = condition.withLock {
            position &+= 1
            if documents { documentPosition = position }
            return (self.observers, documents || positionWaiters > 0)
        }
        wakeWaiters(blocked: wakeBlocked)
        for observer in observers { observer(documents) }
    }

    /// Calls `observer` at every publish from now on, on the publishing thread (after the
    /// commit; it must be quick): for a subscriber that only counts changes and must not
    /// start the watch for other processes' commits that a wait starts (`_db_updates`).
    public func observe(_ observer: @escaping @Sendable (_ documents: Bool) -> Void) {
        condition.withLock { observers.append(observer) }
    }

    /// The position of the last commit that may have changed documents or bodies: a reader
    /// that only follows those passes over the others (a mount's own staged files, one commit
    /// per closed file in a burst, woke its watcher into two queries each).
    public var lastDocumentChange: UInt64 { condition.withLock { documentPosition } }

    /// Wakes every waiter without a change, so that one told to stop sees it.
    public func wakeWaiters() {
        wakeWaiters(blocked: true)
    }

    /// Wakes the async waiters, and the blocked threads too if `blocked` (a commit that changed no
    /// document wakes no thread that waits for documents: a burst's staged files woke the
    /// mount's watcher at each closed file).
    private func wakeWaiters(blocked: Bool) {
        let (woken, stopped) = condition.withLock { () -> ([CheckedContinuation<Void, Never>], [any DispatchSourceTimer]) in
            if blocked { condition.broadcast() }
            defer {
                waiters.removeAll()
                timers.removeAll()
            }
            return (Array(waiters.values), Array(timers.values))
        }
        for continuation in woken { continuation.resume() }
        for timer in stopped { timer.cancel() }
    }

    /// Ends the stream (the database closes or is deleted): every wait returns, now and later.
    public func close() {
        let watcher = condition.withLock { () -> ForeignCommits? in
            closed = true
            defer { foreign = nil }
            return foreign
        }
        watcher?.stop()
        wakeWaiters()
    }

    /// Blocks until the position moves past `seen`, `deadline` passes, the stream closes or
    /// `wakeWaiters()` is called. `stopped` is asked under the stream's lock before blocking,
    /// so a stop flag set before `wakeWaiters()` is never missed. Returns the position now.
    @discardableResult
    public func wait(after seen: UInt64, until deadline: Date? = nil, unless stopped: () -> Bool = { false }) -> UInt64 {
        startForeignWatchIfNeeded()
        return condition.withLock {
            if position == seen && !closed && !stopped() {
                positionWaiters += 1
                defer { positionWaiters -= 1 }
                if let deadline { _ = condition.wait(until: deadline) } else { condition.wait() }
            }
            return position
        }
    }

    /// `wait(after:)` for commits that may have changed documents or bodies only: blocks until
    /// `lastDocumentChange` moves past `seen` (or the deadline, the close, `wakeWaiters()`), and
    /// returns it. This process's other commits do not wake it.
    @discardableResult
    public func waitForDocuments(after seen: UInt64, until deadline: Date? = nil, unless stopped: () -> Bool = { false }) -> UInt64 {
        startForeignWatchIfNeeded()
        return condition.withLock {
            if documentPosition == seen && !closed && !stopped() {
                if let deadline { _ = condition.wait(until: deadline) } else { condition.wait() }
            }
            return documentPosition
        }
    }

    /// Returns when the position moves past `seen`, at `deadline`, when the stream closes,
    /// when `wakeWaiters()` is called, or when the task is cancelled. Returns the position now.
    @discardableResult
    public func next(after seen: UInt64, until deadline: ContinuousClock.Instant? = nil) async -> UInt64 {
        startForeignWatchIfNeeded()
        let id = condition.withLock { () -> UInt64? in
            guard position == seen, !closed else { return nil }
            nextWaiter += 1
            return nextWaiter
        }
        guard let id else { return condition.withLock { position } }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = condition.withLock { () -> Bool in
                    // Published, closed or cancelled between the check above and now.
                    if position != seen || closed || Task.isCancelled { return true }
                    waiters[id] = continuation
                    return false
                }
                if resumeNow { continuation.resume(); return }
                if let deadline {
                    let remaining = max(Duration.zero, deadline - .now).components
                    let nanoseconds = Int(clamping: remaining.seconds) &* 1_000_000_000 &+ Int(remaining.attoseconds / 1_000_000_000)
                    let timer = DispatchSource.makeTimerSource(queue: .global())
                    timer.setEventHandler { [weak self] in self?.resume(id) }
                    timer.schedule(deadline: .now() + .nanoseconds(max(0, nanoseconds)))
                    // Activated either way (libdispatch must never release an inactive source);
                    // its handler runs on another queue, after this lock is let go.
                    condition.withLock {
                        timer.activate()
                        if waiters[id] != nil { timers[id] = timer } else { timer.cancel() }
                    }
                }
            }
        } onCancel: {
            resume(id)
        }
        return condition.withLock { position }
    }

    private func resume(_ id: UInt64) {
        let (waiter, timer) = condition.withLock { (waiters.removeValue(forKey: id), timers.removeValue(forKey: id)) }
        waiter?.resume()
        timer?.cancel()
    }

    /// Not under `condition`: starting asks the database (its write lock), which publishes
    /// under that lock's order.
    private func startForeignWatchIfNeeded() {
        let start = condition.withLock { () -> (() -> ForeignCommits?)? in
            guard !foreignStarted, !closed, let startForeign else { return nil }
            foreignStarted = true
            return startForeign
        }
        guard let start else { return }
        let watcher = start()
        let closedMeanwhile = condition.withLock { () -> Bool in
            if !closed { foreign = watcher }
            return closed
        }
        if closedMeanwhile { watcher?.stop() }
    }
}

/// Finds the commits of other processes: inotify tells when the database's files are written
/// (a commit in WAL mode appends to `db.sqlite3-wal`), and the writer connection's
/// `PRAGMA data_version`, which changes only when another connection commits, says whether
/// one was. Each burst of events is looked at once it has been quiet for a moment (the last
/// frame of a commit is written just before the commit becomes visible), and again a little
/// later when that look found nothing, so a commit is never missed for a slow writer.
final class ForeignCommits: @unchecked Sendable {
    // Sendable invariant: the descriptors are set once; `stopPipe[1]` is written by `stop()`,
    // everything else is touched by the watching thread only.
    private let notify: Int32
    private let stopPipe: [Int32]
    private let watched: Set<String>
    private let changed: () -> Bool
    private let publish: () -> Void
    private static let log = Logger(label: "sofa.changes")

    /// Watches `directory` for writes to the files `names`. `changed` answers whether another
    /// process committed since it was last asked; `publish` is called when one did.
    init?(directory: String, names: Set<String>, changed: @escaping () -> Bool, publish: @escaping () -> Void) {
        let notify = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        var pipe: [Int32] = [-1, -1]
        guard notify >= 0 else {
            ForeignCommits.log.warning("inotify: \(String(cString: strerror(errno))); other processes' changes are found every \(Tuning.foreignChangeSafetyInterval) s")
            return nil
        }
        guard pipe2(&pipe, O_CLOEXEC | O_NONBLOCK) == 0 else {
            Glibc.close(notify)
            return nil
        }
        if inotify_add_watch(notify, directory, UInt32(IN_MODIFY | IN_CREATE | IN_MOVED_TO)) < 0 {
            // Still useful: the safety interval's look runs.
            ForeignCommits.log.warning("inotify on \(directory): \(String(cString: strerror(errno))); other processes' changes are found every \(Tuning.foreignChangeSafetyInterval) s")
        }
        self.notify = notify
        self.stopPipe = pipe
        self.watched = names
        self.changed = changed
        self.publish = publish
        let thread = Thread { [self] in run() }
        thread.name = "sofa-changes"
        thread.stackSize = 256 << 10
        thread.start()
    }

    func stop() {
        var byte: UInt8 = 1
        _ = Glibc.write(stopPipe[1], &byte, 1)
    }

    private func run() {
        defer {
            Glibc.close(notify)
            Glibc.close(stopPipe[0])
            Glibc.close(stopPipe[1])
        }
        let safety = Int32(Tuning.foreignChangeSafetyInterval * 1000)
        var recheck = false
        while true {
            // Asleep until an event, a stop, a recheck due, or the safety interval.
            guard let event = waitForEvent(timeout: recheck ? Int32(Tuning.foreignChangeRecheck * 1000) : safety) else { return }
            if event {
                // Let the burst settle: a commit writes its frames, then makes them visible. Looked
                // for once a settle period, not woken by each: a burst of the mount's own commits
                // writes the log several times a file, and each wake-up took a core from the writer.
                var more: Bool? = true
                while more == true {
                    usleep(UInt32(Tuning.foreignChangeSettle * 1_000_000))
                    more = waitForEvent(timeout: 0)
                }
                if more == nil || isStopped { return }
            }
            if changed() {
                publish()
                recheck = false
            } else {
                // Nothing yet: a look later, once (unless another event comes first).
                recheck = event
            }
        }
    }

    private var isStopped: Bool {
        var byte: UInt8 = 0
        return Glibc.read(stopPipe[0], &byte, 1) == 1
    }

    /// true: a watched file was written; false: the timeout passed; nil: stop.
    private func waitForEvent(timeout: Int32) -> Bool? {
        var fds = [pollfd(fd: notify, events: Int16(POLLIN), revents: 0), pollfd(fd: stopPipe[0], events: Int16(POLLIN), revents: 0)]
        let ready = poll(&fds, 2, timeout)
        if ready < 0 { return errno == EINTR ? false : nil }
        if fds[1].revents != 0 { return nil }
        guard fds[0].revents != 0 else { return false }
        return drain()
    }

    /// Reads every pending event; true if one is about a watched file.
    private func drain() -> Bool {
        var relevant = false
        let size = 4096
        let buffer = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 8)
        defer { buffer.deallocate() }
        while true {
            let count = Glibc.read(notify, buffer, size)
            guard count > 0 else { return relevant }
            var offset = 0
            while offset + MemoryLayout<inotify_event>.size <= count {
                let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                let nameStart = offset + MemoryLayout<inotify_event>.size
                if event.len > 0 {
                    let name = String(cString: buffer.advanced(by: nameStart).assumingMemoryBound(to: CChar.self))
                    if watched.contains(name) { relevant = true }
                }
                offset = nameStart + Int(event.len)
            }
        }
    }
}
