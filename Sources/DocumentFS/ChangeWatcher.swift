import DocumentModel
import DocumentStore
import Foundation

/// Watches the database for changes made behind the mount's back (the CLI, the
/// replicator, another process) and tells the kernel to forget what it cached
/// for the documents that changed, so the mount shows them within a second.
public final class ChangeWatcher: @unchecked Sendable {
    // Sendable invariant: `lastSequence` and `stopped` are only touched on the watcher thread or under `lock`.
    private let database: Database
    private let invalidate: @Sendable (String) -> Void
    private let interval: Double
    private var lastSequence: Int64
    private var stopped = false
    private let lock = NSLock()

    /// `invalidate` receives mount paths (`/docs/x`, `/docs/x/properties.json`, …).
    public init(database: Database, interval: Double = Tuning.changePollInterval, invalidate: @escaping @Sendable (String) -> Void) throws {
        self.database = database
        self.invalidate = invalidate
        self.interval = interval
        lastSequence = try database.lastSequence
    }

    public func start() {
        let thread = Thread { [self] in
            while !isStopped {
                Thread.sleep(forTimeInterval: interval)
                poll()
            }
        }
        thread.name = "sofa-watcher"
        thread.start()
    }

    public func stop() {
        lock.lock()
        stopped = true
        lock.unlock()
    }

    private var isStopped: Bool {
        lock.lock()
        defer { lock.unlock() }
        return stopped
    }

    /// Invalidates the paths of documents changed since the last poll.
    public func poll() {
        guard let changes = try? database.changes(since: lastSequence), let last = changes.last else { return }
        lastSequence = last.sequence
        for change in changes {
            let folder = String.documentPath(change.docID)
            var paths = [folder, folder + "/" + Node.propertiesFileName, folder + "/" + Node.attachmentsDirectoryName,
                         folder + "/" + Node.conflictsDirectoryName]
            if let revision = try? database.currentRevision(of: change.docID) {
                for attachment in revision.attachments {
                    paths.append(folder + "/" + Node.attachmentsDirectoryName + "/"
                                 + FileNames.attachmentComponents(attachment.name).joined(separator: "/"))
                }
            }
            paths.forEach(invalidate)
        }
        invalidate("/docs")
    }
}
