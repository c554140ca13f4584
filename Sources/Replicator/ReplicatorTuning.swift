/// Every tunable of the replicator and of deferred bodies, with the reason for its value (as
/// couchbase-lite-core's `ReplicatorTuning.hh`). Per-run settings (`Replicator.batchSize`)
/// take their defaults from here; the HTTP transport's (retries, timeouts) are `HTTPTuning`.
public enum ReplicatorTuning {
    /// Changes asked for per `_changes` request, and so revisions per `_revs_diff`, `_bulk_get`
    /// and `_bulk_docs` round: CouchDB's own replicator uses 500 for the feed; 200 keeps a
    /// batch of documents with large attachments within a few MB of memory.
    public static let batchSize = 200

    /// Pages of changes read in one `_changes` request when the changes are read ahead: CouchDB
    /// spends ~0.58 s of CPU on a 10,000-change feed read 200 at a time and ~0.43 s 1,000 at a
    /// time (measured, one connection), and on a two-core machine the server's CPU is the
    /// pull's. The pages themselves stay `batchSize` long, so fetches and writes keep overlapping.
    public static let pagesPerChangesRequest = 5

    /// Seconds between two checkpoints of a running replication; it also saves one when it
    /// ends, caught up or on a failure. A checkpoint is a write on both peers (on CouchDB a
    /// `_local` PUT that waits for its fsync, ~3 ms of its CPU each); one per page of 200 made
    /// a deferred pull of 10,000 documents take 1.13–1.26 s, where it takes 1.02–1.08 s with
    /// these (three rounds each, by hand). A run killed outright asks again for at most this
    /// much, which `_revs_diff` makes cheap. CouchDB's replicator waits 30 s
    /// (`checkpoint_interval`), couchbase-lite-core 5 s (`kDefaultCheckpointSaveDelay`).
    public static let checkpointInterval: Double = 5

    /// Seconds between two looks at a Couchbase Lite file for a change (its default
    /// collection's last sequence, one indexed read) while a mount or a continuous sync
    /// follows it and inotify cannot tell when it is written: LiteCore tells other processes
    /// nothing. A quarter second keeps an app's change within the mount's "shows within a
    /// second".
    public static let filePollInterval: Double = 0.25

    /// Seconds between two looks at a followed Couchbase Lite file while inotify watches it:
    /// only for another file put in its place, which inotify on the old one may not tell.
    public static let fileSafetyInterval: Double = 5

    /// Pages waiting between two steps of a replication (changes read, revisions fetched,
    /// written): one keeps every step busy; more would only hold more in memory.
    public static let pagesAhead = 1

    /// Parts of a page's `_bulk_get` (with bodies) fetched at once, each on a connection of its
    /// own: CouchDB reads one request's documents in turn, so two keep it busy while Sofa
    /// stores what arrived. Measured (10,000 documents with 100 MB, curl into /dev/null):
    /// 1.71 s one request at a time, 1.37 s two, 1.19 s four; Sofa's pull 2.3–2.8 s with two
    /// and 2.8–3.0 s with four (two cores, shared with the CouchDB it pulls from).
    public static let bulkGetsInFlight = 2

    /// Requests with bodies a push sends at once, each on a connection of its own: a round
    /// trip and the server's commit per request, which in turn bound a push (measured:
    /// `Scripts/bench couchdb`); CouchDB's replicator runs 4 workers.
    public static let uploadsInFlight = 4

    /// Bodies up to this size travel inline (base64, streamed) in `_bulk_docs` requests, many
    /// documents per request and per commit of the server; larger ones each in a multipart
    /// PUT of their document, where base64's third more bytes and the server's decoding cost
    /// more than the request saves. Measured with CouchDB 3.4.3: 1,000 documents with a
    /// 100 KB body each, 7.95 s as PUTs 4 at a time (a curl process each, which costs too),
    /// 1.90 s as `_bulk_docs` of 50; Sofa's whole push of the benchmark (10,000 documents)
    /// 6.0–6.5 s with multipart PUTs 4 at a time, 4.8–5.4 s inline.
    public static let largestInlineBody: Int64 = 1 << 20

    /// Documents per `_bulk_docs` request of a push: a page in a few requests, sent at once
    /// (`uploadsInFlight`), keeps the server's cores busy; CouchDB's replicator sends 50.
    public static let documentsPerRequest = 50

    /// Bytes of bodies per `_bulk_docs` request with inline bodies (before base64): a few
    /// MB keeps each request's commit worth it and the server's memory for it small.
    public static let inlineBytesPerRequest: Int64 = 4 << 20

    /// The largest document JSON a `_bulk_get` answer may hold (bodies excluded, they stream):
    /// CouchDB refuses documents over 8 MB (`max_document_size`); a part past this is a
    /// server gone wrong, not a document to hold in memory.
    public static let largestDocumentJSON = 64 << 20

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
