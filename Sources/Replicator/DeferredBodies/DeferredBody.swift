import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// One ranged GET under way: it delivers chunks `next..<end` in order.
final class ChunkFetch: @unchecked Sendable {
    // Sendable invariant: fields are guarded by the owning `DeferredBody`'s condition.
    let start: Int
    var next: Int
    var end: Int
    /// Set to stop the transfer at its next bytes.
    var stop = false
    /// Set (with `stop`) when nobody reads the body any more: stopping is then no failure.
    var unread = false

    init(_ chunks: Range<Int>) {
        start = chunks.lowerBound
        next = chunks.lowerBound
        end = chunks.upperBound
    }
}

/// A deferred body while someone reads or downloads it: its partial file, the fetches
/// filling it, and the readers waiting for chunks.
final class DeferredBody: @unchecked Sendable {
    // Sendable invariant: every mutable field is guarded by `condition`.
    let attachment: Attachment
    let docID: String
    let revID: RevisionID
    unowned let owner: RemoteBodies
    let condition = NSCondition()
    var partial: PartialBody
    var fetches: [ChunkFetch] = []
    var blob: StoredBlob?
    /// Counts fetches that failed for good, so a waiting reader notices one.
    var failures = 0
    var lastFailure: (any Error)?
    /// The server answers ranges with the whole body: fetch it in one stream.
    var wholeOnly = false
    /// The remote lacks `revID`: ask for the document's current revision.
    var atCurrentRevision = false
    /// A whole stream arrived and matched the digest as it came (a gzip stream, named by its MD5).
    var verifiedWhole = false
    var finishing = false
    var completeReader: BlobReader?
    /// Readers waiting for chunks: arrivals wake them only if there are some.
    var waiting = 0
    var users = 0
    var released = false

    init(owner: RemoteBodies, attachment: Attachment, docID: String, revID: RevisionID) throws {
        self.owner = owner
        self.attachment = attachment
        self.docID = docID
        self.revID = revID
        partial = try PartialBody(store: owner.database.blobs, digest: attachment.digest, length: attachment.length)
        if let stored = try owner.database.storedBody(digest: attachment.digest) { blob = stored }
    }

    /// Adds a user; false once the body was released (the caller makes a new one).
    func retain() -> Bool {
        condition.withLock {
            guard !released else { return false }
            users += 1
            return true
        }
    }

    func releaseUser() {
        let idle = condition.withLock { () -> Bool in
            users -= 1
            guard users == 0 else { return false }
            for fetch in fetches {
                fetch.stop = true
                fetch.unread = true
            }
            return fetches.isEmpty
        }
        if idle { closeIfIdle() }
    }

    /// Closes the partial file once nobody reads and nothing arrives.
    func closeIfIdle() {
        let close = condition.withLock { () -> Bool in
            guard users == 0, fetches.isEmpty, !finishing, !released else { return false }
            released = true
            return true
        }
        guard close else { return }
        owner.release(self)
        partial.close()
        // A body that is a blob needs no partial file (it was renamed into the store, or
        // never written when the blob came from elsewhere).
        if condition.withLock({ blob != nil }) { partial.discard() }
    }

    /// Waits until nothing arrives or is being installed (every fetch's end and every install's
    /// are broadcast); false if `deadline` came first.
    func waitUntilIdle(until deadline: Date) -> Bool {
        condition.withLock {
            while !(fetches.isEmpty && !finishing) {
                if !condition.wait(until: deadline) { return fetches.isEmpty && !finishing }
            }
            return true
        }
    }

    var progress: BodyProgress {
        condition.withLock {
            BodyProgress(digest: attachment.digest, docID: docID, name: attachment.name,
                         present: blob != nil ? attachment.length : partial.presentBytes, length: attachment.length,
                         fetching: !fetches.isEmpty)
        }
    }

    // MARK: Reading

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, ahead: Int64, timeout: Double,
              willWait: () -> Void) throws -> Int {
        let length = attachment.length
        guard offset < length else { return 0 }
        let count = Int(min(Int64(buffer.count), length - offset))
        let target = UnsafeMutableRawBufferPointer(rebasing: buffer[0..<count])
        let deadline = Date().addingTimeInterval(timeout)
        let aheadChunks = Int(min(Int64(Int32.max), (ahead + Int64(PartialBody.chunkSize) - 1) / Int64(PartialBody.chunkSize)))
        condition.lock()
        let failuresBefore = failures
        var scheduled = false
        var warned = false
        while true {
            if let blob {
                let reader: BlobReader
                do { reader = try blobReader(blob) } catch {
                    condition.unlock()
                    throw error
                }
                condition.unlock()
                return try reader.read(into: target, at: offset)
            }
            let source = partial
            let needed = source.chunks(covering: offset, count: Int64(count))
            if source.arePresent(needed) {
                // Keep a reader going forward ahead of itself.
                if aheadChunks > 0 { schedule(needed.upperBound..<needed.upperBound, ahead: aheadChunks) }
                // Complete but not installed (an earlier run's chunks): install it, not in this read's time.
                let claim = claimFinish()
                condition.unlock()
                if let (complete, verified) = claim { owner.installs.submit { [self] in install(complete, verified: verified) } }
                return try source.read(into: target, at: offset)
            }
            if failures != failuresBefore && !needed.contains(where: isArriving) {
                let error = lastFailure
                condition.unlock()
                owner.log.error("\(docID)/\(attachment.name): cannot fetch bytes \(offset)..<\(offset + Int64(count)): \(error.map { "\($0)" } ?? "failed")")
                throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
            }
            if !scheduled || !needed.allSatisfy({ source.isPresent($0) || isArriving($0) }) {
                schedule(needed, ahead: aheadChunks)
                scheduled = true
            }
            if !warned {
                // Said outside the lock (it may wake a thread); the loop looks at everything again.
                warned = true
                condition.unlock()
                willWait()
                condition.lock()
                continue
            }
            waiting += 1
            let woken = condition.wait(until: deadline)
            waiting -= 1
            if !woken && Date() >= deadline {
                condition.unlock()
                owner.log.error("\(docID)/\(attachment.name): bytes \(offset)..<\(offset + Int64(count)) did not arrive within \(timeout) s")
                throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
            }
        }
    }

    /// The blob, once the body is one. Under `condition`.
    func blobReader(_ blob: StoredBlob) throws -> BlobReader {
        if let reader = completeReader { return reader }
        let reader = try owner.database.blobs.openReader(blob.key, expectedLength: blob.length)
        completeReader = reader
        return reader
    }

    /// Fetches every chunk not here yet and waits for the body to become a blob.
    func fetchAll(progress: ((BodyProgress) -> Void)?) throws {
        condition.lock()
        let failuresBefore = failures
        var lastReport = Date.distantPast
        while blob == nil {
            if owner.cancellation.isCancelled {
                // Let the fetches stop (within a second) and save what arrived.
                let deadline = Date().addingTimeInterval(5)
                while !fetches.isEmpty && condition.wait(until: deadline) {}
                condition.unlock()
                throw ReplicationError.cancelled
            }
            if failures != failuresBefore && fetches.isEmpty && !finishing {
                let error = lastFailure
                condition.unlock()
                throw error ?? SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
            }
            if !finishing && fetches.isEmpty && partial.isComplete {
                // Every chunk is here (an empty body, or one an earlier run fetched but did not install).
                condition.unlock()
                finishIfComplete()
                condition.lock()
                continue
            }
            if !finishing { schedule(0..<partial.chunkCount, ahead: 0) }
            if let progress, Date().timeIntervalSince(lastReport) >= 0.5 {
                lastReport = Date()
                let report = BodyProgress(digest: attachment.digest, docID: docID, name: attachment.name,
                                          present: partial.presentBytes, length: attachment.length, fetching: true)
                condition.unlock()
                progress(report)
                condition.lock()
                continue
            }
            waiting += 1
            _ = condition.wait(until: Date().addingTimeInterval(0.5))
            waiting -= 1
        }
        condition.unlock()
    }

    /// Whether a fetch under way will deliver `chunk`. Under `condition`.
    func isArriving(_ chunk: Int) -> Bool {
        fetches.contains { $0.next <= chunk && chunk < $0.end }
    }

    /// Starts fetches for the chunks of `needed`, and `ahead` chunks after them, that are
    /// neither here nor arriving: one ranged GET per run of them. Under `condition`.
    func schedule(_ needed: Range<Int>, ahead: Int) {
        guard blob == nil, !finishing else { return }
        if wholeOnly {
            if fetches.isEmpty { start(0..<partial.chunkCount) }
            return
        }
        let limit = min(partial.chunkCount, needed.upperBound + ahead)
        var chunk = needed.lowerBound
        while chunk < limit, let missing = partial.firstMissing(from: chunk, before: limit) {
            if let fetch = fetches.first(where: { $0.next <= missing && missing < $0.end }) {
                chunk = fetch.end
                continue
            }
            var end = partial.firstPresent(from: missing + 1, before: limit) ?? limit
            for fetch in fetches where fetch.next > missing && fetch.next < end { end = fetch.next }
            start(missing..<end)
            chunk = end
        }
    }

    func start(_ chunks: Range<Int>) {
        let fetch = ChunkFetch(chunks)
        fetches.append(fetch)
        owner.transfers.submit { [self] in run(fetch) }
    }
}
