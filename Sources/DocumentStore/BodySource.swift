import DocumentModel
import Foundation

/// Supplies attachment bodies that are not on this machine (`contentAvailable ==
/// false`): the replicator's `RemoteBodies`. The mount and the server ask it when
/// such a body is read.
public protocol BodySource: AnyObject, Sendable {
    /// Opens `attachment`'s body (as revision `revID` of `docID` has it) for reading at any
    /// offset: each read fetches the bytes it needs, once however many readers want them.
    func open(_ attachment: Attachment, docID: String, revID: RevisionID) throws -> any BodyReader

    /// Fetches all of `attachment`'s body into the blob store, if it is not here, and waits
    /// until it is installed; throws when it cannot be fetched (the remote is down, refuses it).
    func fetch(_ attachment: Attachment, docID: String, revID: RevisionID) throws

    /// Starts fetching all of `attachment`'s body, if it is not here, without waiting (a pin).
    func fetchInBackground(_ attachment: Attachment, docID: String, revID: RevisionID)

    /// How much of `attachment`'s body is here, when part of it is.
    func progress(of attachment: Attachment) -> BodyProgress?

    /// Stops every fetch and waits (at most `seconds`) until they ended and saved what
    /// arrived, and bodies complete were installed: called before the process exits.
    func shutDown(waitingAtMost seconds: Double)
}

/// An open deferred body. Thread-safe; each open keeps its own readahead.
public protocol BodyReader: AnyObject, Sendable {
    var length: Int64 { get }
    /// Reads up to `buffer.count` bytes at `offset` (0 past the end), waiting at most `timeout`
    /// seconds for them to arrive; `willWait` is called once first if it has to wait (a server
    /// answering on few threads lets others be answered meanwhile). Throws `bodyNotAvailable`
    /// when they cannot be fetched.
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, timeout: Double, willWait: () -> Void) throws -> Int
    /// Ends this reader; fetches nobody reads any more stop (what arrived stays).
    func close()
}

extension BodyReader {
    public func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, timeout: Double) throws -> Int {
        try read(into: buffer, at: offset, timeout: timeout, willWait: {})
    }
}

/// A body partly here: for `user.sofa.progress`, status files and progress lines.
public struct BodyProgress: Sendable {
    public let digest: String
    public let docID: String
    public let name: String
    /// Bytes here so far.
    public let present: Int64
    public let length: Int64
    /// Whether bytes are arriving now.
    public let fetching: Bool

    public init(digest: String, docID: String, name: String, present: Int64, length: Int64, fetching: Bool) {
        self.digest = digest
        self.docID = docID
        self.name = name
        self.present = present
        self.length = length
        self.fetching = fetching
    }
}
