/// Every tunable of the replicator and of deferred bodies, with the reason for its value (as
/// couchbase-lite-core's `ReplicatorTuning.hh`). Per-run settings (`Replicator.batchSize`)
/// take their defaults from here; the HTTP transport's (retries, timeouts) are `HTTPTuning`.
public enum ReplicatorTuning {
    /// Changes asked for per `_changes` request, and so revisions per `_revs_diff`, `_bulk_get`
    /// and `_bulk_docs` round: CouchDB's own replicator uses 500 for the feed; 200 keeps a
    /// batch of documents with large attachments within a few MB of memory.
    public static let batchSize = 200

    /// How long a continuous pull's longpoll waits on the remote before asking again (seconds):
    /// under CouchDB's and proxies' usual 60 s idle limits, long enough that an idle pull costs
    /// nothing. `stop()` ends it at once.
    public static let longpollTimeout = 25

    /// curl's receive buffer for deferred bodies: 512 KiB reads (its 16 KiB default costs a
    /// callback per 16 KiB of a 1 GiB body).
    public static let bodyReceiveBuffer = 512 << 10

    /// Logged-in HTTP clients of deferred-body fetches kept for reuse (each holds a connection).
    public static let idleBodyClients = 8

    /// Transfers of deferred bodies under way at once per remote (each holds a connection while
    /// it streams; a reader jumping around a body starts one per run of missing chunks). More
    /// wait for one to end, within their reader's timeout. Browsers keep 6 per host; readers
    /// of many bodies at once (a file manager drawing thumbnails) need more.
    public static let bodyTransfers = 32

    /// Bodies hashed and installed into the blob store at once: CPU-bound (SHA-1 at ~1 GiB/s),
    /// so the machine's two cores.
    public static let bodyInstalls = 2

    /// A deferred body read from its first byte gets this much fetched ahead of the read, then
    /// twice that at each read that follows on, up to `streamingWindow`.
    public static let firstReadahead: Int64 = 64 << 10

    /// Past this readahead the rest of the body streams in one transfer.
    public static let streamingWindow: Int64 = 4 << 20

    /// Reads this close to where the last one ended count as going forward (the kernel's
    /// readahead requests arrive a little out of order).
    public static let forwardSlack: Int64 = 128 << 10
}
