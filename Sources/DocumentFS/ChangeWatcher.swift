import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Follows the database's change stream for changes made behind the mount's back (the CLI,
/// the replicator, another process) and tells the kernel to forget what it cached for the
/// documents that changed, so the mount shows them as soon as they are committed.
/// Bodies that arrive or go (a download, a purge, an eviction) change no document,
/// so their events are watched too: every document using such a body is refreshed.
public final class ChangeWatcher: @unchecked Sendable {
    // Sendable invariant: `lastSequence` and `stopped` are only touched on the watcher thread or under `lock`.
    private let store: any MountStore
    private let invalidate: @Sendable (_ path: String, _ descendants: Bool) -> Void
    private let documentChanged: @Sendable (String) -> Void
    private let madeHere: @Sendable (DocumentStore.Change) -> Bool
    private var lastSequence: Int64
    private var lastBodyEvent: Int64
    private var lastPurge: Int64
    /// The stream's `lastDocumentChange` at the start.
    private let documentPosition: UInt64
    private var stopped = false
    private let lock = NSLock()
    private let log = Logger(label: "sofa.mount")

    /// `documentChanged` receives each changed document's id first (to drop what the
    /// file system caches), then `invalidate` the mount path that shows it. Changes
    /// `madeHere` (the mount's own saves, which the kernel has seen made) are passed over.
    public init(store: any MountStore,
                madeHere: @escaping @Sendable (DocumentStore.Change) -> Bool = { _ in false },
                documentChanged: @escaping @Sendable (String) -> Void,
                invalidate: @escaping @Sendable (_ path: String, _ descendants: Bool) -> Void) throws {
        self.store = store
        self.madeHere = madeHere
        self.documentChanged = documentChanged
        self.invalidate = invalidate
        _ = store.changeStream.current  // other processes' commits are watched from now on
        // Where the stream stood before the first read: a commit after it is looked at.
        documentPosition = store.changeStream.lastDocumentChange
        lastSequence = try store.lastSequence
        lastBodyEvent = try store.lastBodyEvent()
        lastPurge = try store.purgeSequence
    }

    public func start() {
        let stream = store.changeStream
        let thread = Thread { [self] in
            var lookedAt = documentPosition
            var retry = false
            while !isStopped && !stream.isClosed {
                // Commits of this process that changed no document and no body (a burst's staged
                // files: one commit per closed file) need no look, and do not wake this thread.
                // After a failed look, another one a second later even if nothing commits.
                let documents = stream.waitForDocuments(after: lookedAt, until: retry ? Date().addingTimeInterval(1) : nil,
                                                        unless: { isStopped })
                guard documents != lookedAt || retry else { continue }
                lookedAt = documents
                do {
                    try look()
                    retry = false
                } catch {
                    if !retry { log.error("cannot read the database's changes (trying again each second): \(error)") }
                    retry = true
                }
            }
        }
        thread.name = "sofa-watcher"
        thread.start()
    }

    public func stop() {
        lock.withLock { stopped = true }
        store.changeStream.wakeWaiters()
    }

    private var isStopped: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stopped
    }

    /// Invalidates the folders of documents changed since the last look, with all the kernel
    /// holds below them (attachments that are gone included), and the listing of /docs.
    /// A document purged away leaves no change to find: a purge drops the listing of /docs
    /// (the folder itself shows nothing once its document is gone: its number leads nowhere).
    public func look() throws {
        let purges = try store.purgeSequence
        if purges != lastPurge {
            lastPurge = purges
            invalidate("/docs", false)
        }
        let bodies = try store.documentsWithBodyEvents(after: lastBodyEvent)
        if bodies.last != lastBodyEvent {
            lastBodyEvent = bodies.last
            for id in bodies.docIDs {
                documentChanged(id)
                invalidate(String.documentPath(id), true)
            }
        }
        let changes = try store.changes(since: lastSequence)
        guard let last = changes.last else { return }
        lastSequence = last.sequence
        let foreign = changes.filter { !madeHere($0) }
        for change in foreign {
            documentChanged(change.docID)
            invalidate(String.documentPath(change.docID), true)
        }
        if !foreign.isEmpty { invalidate("/docs", false) }
    }
}
