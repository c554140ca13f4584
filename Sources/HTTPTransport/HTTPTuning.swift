/// The HTTP transport's tunables, with the reason for each value. `RetryPolicy` and
/// `HTTPClient` take their defaults from here.
public enum HTTPTuning {
    /// Tries per request, the first included, before a replication step fails: with the delays
    /// below, a remote may be gone for about 15 s (a restart) and the run goes on.
    public static let attempts = 6

    /// The wait before the first retry (seconds); each later one waits twice the one before.
    public static let firstRetryDelay = 0.25

    /// No wait between retries is longer than this (seconds).
    public static let longestRetryDelay = 30.0

    /// A transfer that receives nothing for this long has failed (seconds; curl's low-speed
    /// limit), and is retried: CouchDB's replicator's `connection_timeout` (30 s). `--stall-timeout`
    /// sets it per command.
    public static let stallTimeout = 30

    /// Connecting to the remote may take this long (seconds) before the attempt fails.
    public static let connectTimeout = 10
}
