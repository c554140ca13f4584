import DocumentModel
import Foundation

/// Supplies attachment bodies that are not on this machine (`contentAvailable ==
/// false`): the replicator's downloader. The mount asks it when such a body is read.
public protocol BodySource: AnyObject, Sendable {
    /// Starts the transfer of `attachment`'s body (as revision `revID` of `docID` has it),
    /// or joins the one under way: one transfer per body however many ask.
    func fetch(_ attachment: Attachment, docID: String, revID: RevisionID) -> BodyTransfer

    /// The transfer of the body known by `digest`, if one is under way.
    func transfer(digest: String) -> BodyTransfer?
}

/// A body on its way into the blob store, readable as far as it has arrived.
///
/// The producer writes the bytes, in order, to `partialPath` (a blob writer's
/// temporary file, which becomes the blob itself when complete) and reports progress;
/// readers wait for the range they need.
public final class BodyTransfer: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `condition`.
    public let attachment: Attachment
    private let condition = NSCondition()
    private var received: Int64 = 0
    private var path: String?
    private var blob: StoredBlob?
    private var failure: (any Error)?
    private var finishHandlers: [@Sendable (StoredBlob?) -> Void] = []

    public init(attachment: Attachment) {
        self.attachment = attachment
    }

    /// A transfer that is already complete (the body arrived earlier).
    public convenience init(attachment: Attachment, blob: StoredBlob) {
        self.init(attachment: attachment)
        self.blob = blob
    }

    // MARK: Producer

    /// Bytes are (again) being written from the start, to `path`.
    public func started(writingTo path: String) {
        condition.withLock {
            self.path = path
            received = 0
            failure = nil
        }
    }

    public func progressed(to bytes: Int64) {
        condition.withLock { received = bytes }
        condition.broadcast()
    }

    public func finished(_ blob: StoredBlob) {
        let handlers = condition.withLock { () -> [@Sendable (StoredBlob?) -> Void] in
            self.blob = blob
            received = blob.length
            defer { finishHandlers = [] }
            return finishHandlers
        }
        condition.broadcast()
        handlers.forEach { $0(blob) }
    }

    public func failed(_ error: any Error) {
        let handlers = condition.withLock { () -> [@Sendable (StoredBlob?) -> Void] in
            failure = error
            defer { finishHandlers = [] }
            return finishHandlers
        }
        condition.broadcast()
        handlers.forEach { $0(nil) }
    }

    // MARK: Consumers

    public enum State: Sendable {
        case transferring(received: Int64)
        case complete(StoredBlob)
        case failed(String)
    }

    public var state: State {
        condition.withLock {
            if let blob { return .complete(blob) }
            if let failure { return .failed("\(failure)") }
            return .transferring(received: received)
        }
    }

    /// Runs `handler` once the transfer ends (with the blob, or nil on failure); at once if it has.
    public func onFinish(_ handler: @escaping @Sendable (StoredBlob?) -> Void) {
        let ended = condition.withLock { () -> StoredBlob?? in
            if let blob { return .some(blob) }
            if failure != nil { return .some(nil) }
            finishHandlers.append(handler)
            return .none
        }
        if let ended { handler(ended) }
    }

    /// Waits until the body is a blob (its file renamed into the store and the transfer told),
    /// the transfer fails, or `timeout` seconds pass; throws `bodyNotAvailable` in the last two cases.
    public func waitForBlob(timeout: Double, docID: String) throws -> StoredBlob {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            if let blob { return blob }
            if failure != nil || !condition.wait(until: deadline) && Date() >= deadline {
                throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
            }
        }
    }

    /// Where bytes up to `end` can be read: the finished blob, or the file being written.
    public enum Readable: Sendable {
        case blob(StoredBlob)
        case partial(path: String)
    }

    /// Waits until the first `end` bytes have arrived (or the whole body), the transfer
    /// fails, or `timeout` seconds pass; throws `bodyNotAvailable` in the last two cases.
    public func wait(forBytes end: Int64, timeout: Double, docID: String) throws -> Readable {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            if let blob { return .blob(blob) }
            if let path, received >= end { return .partial(path: path) }
            if failure != nil || !condition.wait(until: deadline) && Date() >= deadline {
                throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
            }
        }
    }
}
