import ArgumentParser
import DocumentStore
import Foundation

/// `--auto-compact`, for the commands that keep databases open (`serve`, `mount`).
struct AutoCompactionOption: ParsableArguments {
    @Option(name: .customLong("auto-compact"), help: ArgumentHelp(
        "Seconds between looks at each open database for automatic compaction, or off.",
        discussion: "A database nobody wrote for a whole interval is compacted when that frees at least half of it, or 512 MiB, "
            + "and at least 1 MiB (CouchDB's defaults); `sofa compact` compacts at once.",
        valueName: "seconds|off"))
    var autoCompact = "\(Int(Tuning.autoCompactionInterval))"

    func validate() throws {
        _ = try policy()
    }

    /// The policy asked for; nil: off.
    func policy() throws -> AutoCompaction.Policy? {
        if autoCompact.lowercased() == "off" { return nil }
        guard let seconds = Double(autoCompact), seconds > 0, seconds.isFinite else {
            throw ValidationError("--auto-compact \(autoCompact): expected a number of seconds, or off")
        }
        return AutoCompaction.Policy(interval: seconds)
    }

    /// Starts the daemon over `databases` (nil when off); each compaction is logged with what it freed.
    func start(_ databases: @escaping @Sendable () -> [Database]) throws -> AutoCompaction? {
        guard let policy = try policy() else { return nil }
        let daemon = AutoCompaction(policy: policy, databases: databases) { database, result in
            switch result {
            case .success(let report):
                log.info("""
                    \(database.path): compacted automatically: \(formatBytes(report.bytesFreed)) freed \
                    (\(report.bodiesDropped) old revision bodies, \(report.revisionsPruned) revisions past the limit, \
                    \(report.blobsDeleted) blobs of \(formatBytes(report.blobBytesFreed)); SQLite file \
                    \(formatBytes(report.databaseBytesBefore)) -> \(formatBytes(report.databaseBytesAfter)))
                    """)
            case .failure(let error):
                log.warning("\(database.path): automatic compaction failed (nothing is lost; it is tried again after the next change): \(error)")
            }
        }
        daemon.start()
        return daemon
    }
}
