/// Every number the BLIP replication engine runs by, with the reason for each (couchbase-lite-core
/// keeps its own in `ReplicatorTuning.hh`).
public enum BLIPTuning {
    /// The WebSocket subprotocols taken, preferred first (Sync Gateway's; Couchbase Lite 3 offers both).
    public static let subprotocols = ["BLIP_3+CBMobile_3", "BLIP_3+CBMobile_2"]
    /// The largest WebSocket message taken: a BLIP frame is 16 KiB of data and a few bytes, but
    /// LiteCore may send up to its own limit in one; 1 MiB leaves room and bounds memory.
    public static let maximumFrameSize = 1 << 20
    /// `changes`/`proposeChanges` messages sent and not yet answered, at most: a few keep the
    /// other side busy while it looks up the next batch (LiteCore keeps up to 5 of its own).
    static let changesInFlight = 4
    /// `rev` messages sent and not yet answered, at most, by either role: enough to fill a
    /// connection whose round trip is a few milliseconds, small enough that a slow receiver
    /// holds only this many bodies in memory.
    static let revsInFlight = 32
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
