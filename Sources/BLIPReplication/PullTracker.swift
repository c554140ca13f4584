import DocumentModel
import DocumentStore
import Foundation

/// Where an active pull stands: the changes the server listed, in the order it sent them, and
/// which of them are saved. The checkpoint may move past a change only once it and every change
/// listed before it are done; a document that failed (its body could not be fetched, the
/// database refused it) holds it there for good in this run, so the next run asks again, as
/// LiteCore's puller keeps its `_missingSequences`.
///
/// `changes` messages are handled concurrently, so each is noted in arrival order first
/// (`reserve`), and the walk stops at one noted but not read yet.
final class PullTracker: Sendable {
    enum EntryState: Sendable { case pending, done, failed }

    struct Entry: Sendable {
        let sequence: JSONValue
        var state: EntryState
    }

    /// What the pull did so far (its `checkpoint` is set by `snapshot`).
    typealias Counts = BLIPReplicator.Report

    private struct State {
        /// `changes` messages in arrival order: nil entries until the message is read.
        var blocks: [(number: UInt64, entries: [Entry]?, front: Int)] = []
        /// Where each pending revision sits ("docID rev" → block number, index).
        var places: [String: (UInt64, Int)] = [:]
        /// The last sequence every earlier change is done by.
        var checkpoint: JSONValue?
        var held = false
        var caughtUp = false
        var ended: BLIPSyncError?
        var counts = Counts()
        var version = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Locked(State())

    static func key(_ docID: String, _ rev: String) -> String { docID + "\u{0}" + rev }

    /// A `changes` message arrived (before it is read): the changes it lists come after those
    /// of every message noted before it.
    func reserve(_ number: UInt64) {
        state.withLock { $0.blocks.append((number, nil, 0)) }
    }

    /// The changes of message `number`, each wanted or not (those not wanted are done).
    func read(_ number: UInt64, _ changes: [(sequence: JSONValue, docID: String, rev: String, wanted: Bool)]) {
        update { state in
            guard let block = state.blocks.firstIndex(where: { $0.number == number }) else { return }
            state.blocks[block].entries = changes.enumerated().map { index, change in
                if change.wanted { state.places[PullTracker.key(change.docID, change.rev)] = (number, index) }
                return Entry(sequence: change.sequence, state: change.wanted ? .pending : .done)
            }
            state.counts.changesRead += changes.count
        }
    }

    /// The server said it has sent everything there was (an empty `changes`).
    func caughtUp() { update { $0.caughtUp = true } }

    /// A listed revision is saved (or the server said it no longer has it: a newer change follows).
    func done(_ docID: String, _ rev: String) { finish(docID, rev, .done) }

    /// A listed revision could not be saved: the checkpoint stays before it.
    func failed(_ failure: DocumentFailure) {
        update { $0.counts.failures.append(failure) }
        finish(failure.docID, failure.rev ?? "", .failed)
    }

    func count(_ change: (inout Counts) -> Void) { update { change(&$0.counts) } }

    /// Ends the pull: a lost connection, a protocol error. The first reason stays.
    func fail(_ error: BLIPSyncError) { update { if $0.ended == nil { $0.ended = error } } }

    private func finish(_ docID: String, _ rev: String, _ outcome: EntryState) {
        update { state in
            guard let (number, index) = state.places.removeValue(forKey: PullTracker.key(docID, rev)),
                  let block = state.blocks.firstIndex(where: { $0.number == number }) else { return }
            state.blocks[block].entries?[index].state = outcome
        }
    }

    private func update(_ change: (inout State) -> Void) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            change(&state)
            PullTracker.advance(&state)
            state.version += 1
            defer { state.waiters = [] }
            return state.waiters
        }
        waiters.forEach { $0.resume() }
    }

    /// Moves the checkpoint over the done changes at the front.
    private static func advance(_ state: inout State) {
        while !state.held, let first = state.blocks.first, let entries = first.entries {
            var front = first.front
            while front < entries.count, entries[front].state == .done {
                state.checkpoint = entries[front].sequence
                front += 1
            }
            if front < entries.count, entries[front].state == .failed { state.held = true }
            if front == entries.count {
                state.blocks.removeFirst()
            } else {
                state.blocks[0].front = front
                break
            }
        }
    }

    struct Snapshot: Sendable {
        let checkpoint: JSONValue?
        let finished: Bool
        let ended: BLIPSyncError?
        let counts: Counts
        let version: Int
    }

    var snapshot: Snapshot {
        state.withLock { state in
            let pending = state.blocks.contains { block in block.entries.map { $0.contains { $0.state == .pending } } ?? true }
            return Snapshot(checkpoint: state.checkpoint, finished: state.caughtUp && !pending, ended: state.ended,
                            counts: state.counts, version: state.version)
        }
    }

    /// Waits until something changed after `version`, or `seconds` passed.
    func wait(after version: Int, atMost seconds: Double) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let now = self.state.withLock { state -> Bool in
                        if state.version != version { return true }
                        state.waiters.append(continuation)
                        return false
                    }
                    if now { continuation.resume() }
                }
            }
            group.addTask { try? await Task.sleep(nanoseconds: UInt64(seconds * 1e9)) }
            await group.next()
            group.cancelAll()
            // The sleeper ended first: wake the waiter so the group can end.
            self.update { _ in }
        }
    }
}
