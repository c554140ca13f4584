import DocumentModel
import Foundation

/// Works out, in the background, the MD5 CouchDB keeps for bodies of the types it compresses
/// (gzip at level 8, then MD5: `CouchAttachmentMD5`), for a save that comes later. A mount
/// hands it each text file closed in a burst; the fold that saves them then finds most MD5s
/// known instead of working them all out at its end. 10,000 text files of 4 KiB are ~2 s of
/// gzip on one core here, most of what a user waited for after `cp -r` of them, while the
/// copy itself left a third of both cores idle.
///
/// One thread at most, started when there is work and ended when there is none, at the lowest
/// priority (nice 19): the copy's own threads come first. It still costs the copy a little:
/// `cp -r` of 10,000 text files took 2-19 % longer beside it, and was saved 0.5-1.0 s sooner
/// (on tmpfs, where the disk does not blur it). Bodies are taken in the order given; `wanted`
/// is asked just before each (the fold may have taken it meanwhile, working it out itself),
/// and `found` gets each MD5. A body that cannot be read is passed over: the save decides.
public final class CouchMD5sInBackground: @unchecked Sendable {
    private let blobs: BlobStore
    private let wanted: @Sendable (BlobKey) -> Bool
    private let found: @Sendable (BlobKey, [UInt8]) -> Void
    private let lock = NSLock()
    private var queue: [BlobKey] = []
    private var head = 0
    private var running = false

    public init(blobs: BlobStore, wanted: @escaping @Sendable (BlobKey) -> Bool,
                found: @escaping @Sendable (BlobKey, [UInt8]) -> Void) {
        self.blobs = blobs
        self.wanted = wanted
        self.found = found
    }

    /// Whether a body of `contentType` and `length` is one a save would gzip for its MD5:
    /// the only ones worth working out here (any other's MD5 is worked out as it is written).
    public static func isWorthIt(contentType: String, length: Int64) -> Bool {
        CouchAttachmentMD5.isCompressible(contentType) && length <= CouchAttachmentMD5.exactLimit(compressible: true)
    }

    /// Adds body `key` (of a type CouchDB compresses) to the work.
    public func add(_ key: BlobKey) {
        let start = lock.withLock {
            queue.append(key)
            defer { running = true }
            return !running
        }
        if start {
            let thread = Thread { [self] in work() }
            thread.name = "sofa-md5-ahead"
            thread.start()
        }
    }

    private func next() -> BlobKey? {
        lock.withLock {
            guard head < queue.count else {
                queue.removeAll(keepingCapacity: false)
                head = 0
                running = false
                return nil
            }
            defer {
                head += 1
                if head > 4096, head * 2 > queue.count {  // what was taken, dropped now and then
                    queue.removeFirst(head)
                    head = 0
                }
            }
            return queue[head]
        }
    }

    private func work() {
        // Who 0 is the calling thread on Linux: each thread has its own nice value. (SCHED_IDLE
        // was tried: the copies it ran beside were slower than beside nice 19.)
        setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)
        let worker = CouchAttachmentMD5.Worker()
        while let key = next() {
            guard wanted(key), let md5 = try? worker.md5(of: CouchAttachmentMD5.Body(key: key, compressible: true), in: blobs) else { continue }
            found(key, md5)
        }
    }
}
