/// Every number the BLIP replication engine runs by, with the reason for each (couchbase-lite-core
/// keeps its own in `ReplicatorTuning.hh`).
public enum BLIPTuning {
    /// The WebSocket subprotocols taken, preferred first (Sync Gateway's; Couchbase Lite 3 offers both).
    public static let subprotocols = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"]
    /// The largest WebSocket message taken: a BLIP frame is 16 KiB of data and a few bytes, but
    /// LiteCore may send up to its own limit in one; 1 MiB leaves room and bounds memory.
    public static let maximumFrameSize = 1 << 20
    /// The frames written with one system call, at most about this many bytes of them: a
    /// `rev` or an answer each is a frame of a few hundred bytes, and a write (and its wake-up
    /// of the other side) per frame cost more than the frames (a third of a pull's CPU).
    static let writeBatchBytes = 256 * 1024
    /// `changes`/`proposeChanges` messages sent and not yet answered, at most: a few keep the
    /// other side busy while it looks up the next batch (LiteCore keeps up to 5 of its own).
    static let changesInFlight = 8
    /// `rev` messages of one `changes` batch sent and not yet answered, at most, by either
    /// role. LiteCore answers a `rev` only once it is saved, and saves every 25 ms: 32 unanswered
    /// held a `cblite pull` to 0.35 of `sofa pull http://`'s speed. A whole batch (200; with
    /// `changesInFlight` batches, 800 at most) stays under the 1,000 revisions a LiteCore puller
    /// takes before it stops reading (`kMaxPendingRevs`); bodies are not part of a `rev`.
    static let revsInFlight = 200
    /// Bodies asked for with `getAttachment` at once, by one connection: the other side sends
    /// the bodies asked for a frame of each in turn, so with every revision of a batch asking at
    /// once each body took as long as all of them, and the frames waiting filled memory.
    static let bodiesInFlight = 8
    /// Changes per `changes` message when the other side does not say (`batch`); 200 is
    /// Sync Gateway's and LiteCore's.
    public static let changesBatch = 200
    /// Revisions saved in one transaction when they arrive faster than they are saved: one
    /// commit (and its fsync) for many documents, as LiteCore's `Inserter` does; bounded so
    /// that one transaction never holds the writer long.
    static let insertionBatch = 100
    /// How long a client waits for a server that sends nothing while it waits for it.
    static let silence: Double = 120
    /// A document whose attachment body cannot be fetched from the database's remote holds the
    /// feed (it is not offered, nor anything after it): tried this many times, this far apart
    /// (seconds, doubled each time), before a one-shot pull is told it caught up without it;
    /// a continuous one keeps trying, up to `heldRetryMaximum` apart.
    static let heldRetries = 3
    static let heldRetryDelay: Double = 0.5
    static let heldRetryMaximum: Double = 30
    /// Seconds a body fetched for a pull may take to arrive from the remote before the document
    /// holds the feed.
    static let bodyFetchTimeout: Double = 30
    /// Where a client's checkpoints are kept on a server (`_local/checkpoint/CLIENT`, Sync
    /// Gateway's name).
    static func checkpointID(_ client: String) -> String { "_local/checkpoint/\(client)" }
}
