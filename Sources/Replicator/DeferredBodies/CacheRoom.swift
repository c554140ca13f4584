import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Keeps fetched bodies under the cache limit (`Database.trimCache`) as bytes arrive: before
/// a write, room is made for it by evicting the least recently read bodies (and partial
/// ones) this process is not reading, so the disk holds at most the limit plus the bytes
/// being written. The trims are counted against one headroom, so most writes cost nothing.
final class CacheRoom: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `lock`; one trim at a time.
    unowned let owner: RemoteBodies
    private let lock = NSLock()
    private var limit: Int64?
    private var limitRead = Date.distantPast
    /// Bytes that may still arrive before the next trim.
    private var headroom: Int64 = 0

    init(owner: RemoteBodies) { self.owner = owner }

    func reserve(_ count: Int64) {
        lock.lock()
        defer { lock.unlock() }
        if Date().timeIntervalSince(limitRead) > 2 {
            // Another process may change the limit (`sofa cache --limit`) while this one runs.
            do {
                limit = try owner.database.cacheLimit()
            } catch {
                // Not "no limit": the one known so far holds until the next look.
                owner.log.warning("cannot read the cache limit: \(error)")
            }
            limitRead = Date()
            headroom = 0
        }
        guard limit != nil else { return }
        if headroom >= count {
            headroom -= count
            return
        }
        trim(toFit: count)
    }

    /// Trims now (after a limit was lowered, or before a long transfer). Under `lock`.
    private func trim(toFit count: Int64) {
        guard let limit else { return }
        do {
            let result = try owner.database.trimCache(toFit: count, keeping: owner.activeDigests, canEvict: owner.remoteStillHas)
            if result.bodiesEvicted + result.partialsDropped > 0 {
                owner.log.info("cache: evicted \(result.bodiesEvicted) bodies and \(result.partialsDropped) partial ones, \(result.bytesFreed) bytes")
            }
            // Re-checked at least every 4 MiB: other processes fill the same disk.
            headroom = min(4 << 20, max(0, limit - result.used - count))
        } catch {
            owner.log.error("cache: cannot make room: \(error)")
            headroom = 0
        }
    }
}
