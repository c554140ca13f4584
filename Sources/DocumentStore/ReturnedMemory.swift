import CLinux
import DocumentModel
import Foundation

/// Memory the allocator keeps after a burst of large allocations, given back to the system.
/// glibc keeps freed memory for reuse (per thread arena, and in the middle of a heap where it
/// cannot shrink), so a process that once held 200 MB of rows stays at that size: measured
/// with `Scripts/bench isolation`, `sofa serve` went from 45 MB to 209 MB for a view of 5 MB
/// rows and stayed at 188 MB. `trim()` after such work asks glibc to release it.
public enum ReturnedMemory {
    private static let lastTrim = Locked<Double>(0)

    /// Trims at most once a second (a trim walks every arena: a few milliseconds for a large
    /// heap); work that allocated little need not call it.
    public static func trim() {
        let now = Date().timeIntervalSince1970
        let due = lastTrim.withLock { last -> Bool in
            guard now - last >= 1 else { return false }
            last = now
            return true
        }
        if due { _ = malloc_trim(0) }
    }
}
