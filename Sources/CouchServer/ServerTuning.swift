import Foundation
import NIOCore

/// Every tunable of `sofa serve`, with the reason for its value. (CouchDB's own protocol limits,
/// such as `_revs_diff`'s, stay where they are checked: they are answers, not tuning.)
enum ServerTuning {
    /// A JSON body (a document, `_bulk_docs`, `_revs_diff`…). CouchDB's default
    /// `max_document_size` is 8 MB; bulk requests carry many documents.
    static let jsonBody = 64 * 1024 * 1024

    /// How long a longpoll or continuous feed waits by default, and at most (seconds): CouchDB's
    /// default is 60 s; an hour bounds what a client can ask for.
    static let defaultFeedTimeout: Double = 60
    static let maximumFeedTimeout: Double = 3600

    /// Sessions last ten minutes, as CouchDB's do; each authenticated request renews them.
    static let sessionLifetime: TimeInterval = 600

    /// A password that matched is remembered this long (seconds) and for this many users, so
    /// that basic auth on every request does not pay PBKDF2's 600,000 rounds each time.
    static let verifiedPasswordLifetime: TimeInterval = 600
    static let verifiedPasswords = 10_000

    /// Descriptors kept back from connections (database files, blobs, SQLite's journal, the
    /// event loops'): the connection limit is the process's descriptor limit less this.
    static let descriptorReserve = 128

    /// A connection is closed to make room for another only once it has been idle this long
    /// (seconds): a client that just connected, or just got its answer, is about to send; one
    /// silent for half a second is an idle socket. (Closed sooner, a client lost the answer it
    /// was reading.)
    static let idleBeforeClosing = 0.5

    /// How long requests in progress (a continuous feed, a big upload) may run on after `stop()`.
    static let stopGracePeriod: TimeAmount = .seconds(5)

    /// After an unparsable request, the connection reads (and drops) what the client still
    /// sends for this long before closing, so that the client reads the 400 instead of a reset.
    static let lingerOnError = TimeAmount.seconds(5)

    /// Default header and body timeouts of a connection (`CouchServer.Configuration`): a client
    /// that sends nothing for this long is closed; CouchDB's `chttpd` idles out after 60 s too.
    static let headerTimeout: TimeAmount = .seconds(60)
    static let bodyTimeout: TimeAmount = .seconds(60)

    /// Changes read from the database per step of a filtered or long feed, and rows of
    /// `_all_docs` per step: each step is one read transaction, short enough never to hold
    /// the log back, long enough that a step costs little.
    static let changesPage = 1000
    static let documentsPage = 500
    static let descendingDocumentsPage = 1000

    /// How long a request for an attachment whose body is deferred waits for each piece to
    /// arrive from the remote (seconds) before it fails.
    static let deferredReadTimeout: Double = 30

    /// Index updates that `update=lazy` view queries leave behind, run at once (each index has
    /// at most one; `LazyViewUpdates`). Two: a second database's index is not held up by a long
    /// first one, and a burst of queries takes at most two cores from the requests.
    static let lazyViewUpdaters = 2

    /// Bytes of an attachment body sent per write to the client.
    static let bodyPiece = 256 * 1024
}
