import DocumentStore
import Foundation
import FuseKit

/// The names of large folders kept between the pages of one `readdir`. A part with its own
/// state and lock (a leaf).
///
/// The kernel reads a folder a page (4 KiB, some 25–100 names) at a time, each page a new
/// request that says only where to resume. Working out a folder of n names for each page
/// costs n²/page in all: `ls` of a folder of 10,000 attachments worked all 10,000 out
/// some 400 times. So a listing that starts (at its first position) works the folder out
/// once and keeps its entries here; a request that resumes takes the names that follow from
/// them and looks each up again (`DocumentFileSystem.readDirectory`), a page's cost.
///
/// - A resumed listing shows the names the folder held when it started that it still holds,
///   with their attributes as they are now: names added meanwhile are left out, as POSIX
///   allows a directory stream opened before they came; every new listing starts from the
///   folder as it is.
/// - Positions are tied to names, so a listing resumed from a newer listing of the same
///   folder neither repeats nor skips the names both hold.
/// - Only folders of at least `Tuning.listingSnapshotMinimum` names are kept, at most
///   `Tuning.listingSnapshots` of them, each for `Tuning.listingSnapshotLife` seconds.
final class ListingSnapshots: @unchecked Sendable {
    private var snapshots: [String: (made: Double, entries: [DirectoryEntry])] = [:]
    private let lock = NSLock()

    /// The entries of `path` kept by a listing that started less than the snapshot life ago.
    func entries(of path: String, now: Double) -> [DirectoryEntry]? {
        lock.withLock {
            guard let snapshot = snapshots[path] else { return nil }
            guard now - snapshot.made < Tuning.listingSnapshotLife else {
                snapshots[path] = nil
                return nil
            }
            return snapshot.entries
        }
    }

    /// Keeps what a listing of `path` that starts now shows (entries in position order).
    func keep(_ entries: [DirectoryEntry], of path: String, now: Double) {
        guard entries.count >= Tuning.listingSnapshotMinimum else { return }
        lock.withLock {
            snapshots = snapshots.filter { now - $0.value.made < Tuning.listingSnapshotLife }
            if snapshots[path] == nil, snapshots.count >= Tuning.listingSnapshots,
               let oldest = snapshots.min(by: { $0.value.made < $1.value.made })?.key {
                snapshots[oldest] = nil
            }
            snapshots[path] = (now, entries)
        }
    }
}
