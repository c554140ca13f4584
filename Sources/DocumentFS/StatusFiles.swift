import DocumentModel
import DocumentStore
import Foundation

/// What `.sofa/` shows that only the mount knows: the status files open now, and the failures
/// last answered to programs. A part with its own state and lock (a leaf).
///
/// - A status file's size is its latest open's while any open is left: `fstat` of an open
///   file asks by path (the kernel sends no handle), and a new rendering could differ from
///   what the open reads, so a reader sizing its read by `fstat` (Foundation's
///   `Data(contentsOf:)`) would cut it off.
/// - Failures are kept newest last, at most `Tuning.recentFailures`.
final class StatusFiles: @unchecked Sendable {
    private var open: [String: (bytes: [UInt8], opens: Int)] = [:]
    private var failures: [JSONValue] = []
    private let lock = NSLock()

    /// A status file was opened with `bytes`.
    func opened(_ name: String, bytes: [UInt8]) {
        lock.withLock { open[name] = (bytes, (open[name]?.opens ?? 0) + 1) }
    }

    /// One open of a status file was closed.
    func closed(_ name: String) {
        lock.withLock {
            guard let file = open[name] else { return }
            open[name] = file.opens > 1 ? (file.bytes, file.opens - 1) : nil
        }
    }

    /// The bytes of the latest open of a status file open now.
    func openBytes(_ name: String) -> [UInt8]? {
        lock.withLock { open[name]?.bytes }
    }

    func noteFailure(_ entry: JSONValue) {
        lock.withLock {
            failures.append(entry)
            if failures.count > Tuning.recentFailures { failures.removeFirst(failures.count - Tuning.recentFailures) }
        }
    }

    var recentFailures: [JSONValue] {
        lock.withLock { failures }
    }
}
