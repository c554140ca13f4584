import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Fetches deferred attachment bodies from the remote, as much of them as readers need.
///
/// A read of a body that is not here fetches the chunks it covers with an HTTP `Range`
/// into the body's `PartialBody` (a sparse file and a map of the chunks here, kept across
/// runs). A reader going forward gets a readahead that doubles with each read until the
/// rest of the body streams ahead of it; a reader jumping around gets what it reads. When
/// every chunk is here the body is hashed against its digest and becomes a blob.
///
/// A server that answers a range with the whole body (CouchDB does for the bodies it
/// keeps compressed) gets one streamed transfer instead, checked as it arrives. Each
/// answer's ETag must name the body's digest: a body that changed on the server is
/// never mixed with the bytes already here. One transfer per chunk however many wait.
public final class RemoteBodies: BodySource, @unchecked Sendable {
    // Sendable invariant: `bodies` and `idleClients` are guarded by `lock`.
    public let database: Database
    public let remote: RemoteDatabase
    let retry: RetryPolicy
    let caFile: String?
    /// Stops every transfer; what has arrived stays for the next read.
    public let cancellation = Cancellation()
    let log = Logger(label: "sofa.download")
    private let lock = NSLock()
    private var bodies: [String: DeferredBody] = [:]
    private var idleClients: [HTTPClient] = []
    /// Keeps the cache under its limit as bytes arrive.
    private(set) lazy var room = CacheRoom(owner: self)

    public init(database: Database, remote: RemoteDatabase, retry: RetryPolicy = RetryPolicy(), caFile: String? = nil) {
        self.database = database
        self.remote = remote
        self.retry = retry
        self.caFile = caFile
    }

    public func open(_ attachment: Attachment, docID: String, revID: RevisionID) throws -> any BodyReader {
        database.noteRead(digest: attachment.digest)
        return DeferredBodyReader(body: try acquire(attachment, docID: docID, revID: revID))
    }

    public func fetchInBackground(_ attachment: Attachment, docID: String, revID: RevisionID) {
        guard let body = try? acquire(attachment, docID: docID, revID: revID) else { return }
        let thread = Thread { [self] in
            defer { body.releaseUser() }
            do { try body.fetchAll(progress: nil) } catch {
                log.error("\(docID)/\(attachment.name): cannot fetch the pinned body: \(error)")
            }
        }
        thread.name = "sofa-pin"
        thread.start()
    }

    public func progress(of attachment: Attachment) -> BodyProgress? {
        if let body = lock.withLock({ bodies[attachment.digest] }) { return body.progress }
        if (try? database.storedBody(digest: attachment.digest)) != nil {
            // Arrived a moment ago (the mount's watcher has not said so yet).
            return BodyProgress(digest: attachment.digest, docID: "", name: attachment.name, present: attachment.length,
                                length: attachment.length, fetching: false)
        }
        // Nobody reads it now: what earlier reads left, as its saved map says.
        return PartialBody.savedBytes(in: database.blobs, digest: attachment.digest, length: attachment.length).map {
            BodyProgress(digest: attachment.digest, docID: "", name: attachment.name, present: $0, length: attachment.length,
                         fetching: false)
        }
    }

    /// Bodies partly here that are open or arriving now, for status files.
    public var active: [BodyProgress] {
        lock.withLock { Array(bodies.values) }.map(\.progress).sorted { $0.docID < $1.docID }
    }

    /// Stops every fetch under way; what arrived stays for the next read.
    public func cancel() { cancellation.cancel() }

    public func shutDown(waitingAtMost seconds: Double) {
        cancel()
        let deadline = Date().addingTimeInterval(seconds)
        // Cancelled: no fetch starts from now on, so those under way are all there is to wait for.
        for body in lock.withLock({ Array(bodies.values) }) where !body.waitUntilIdle(until: deadline) { break }
    }

    /// The body of `digest`, shared by everyone reading it, with one more user.
    func acquire(_ attachment: Attachment, docID: String, revID: RevisionID) throws -> DeferredBody {
        try lock.withLock {
            if let body = bodies[attachment.digest], body.retain() { return body }
            let body = try DeferredBody(owner: self, attachment: attachment, docID: docID, revID: revID)
            _ = body.retain()
            bodies[attachment.digest] = body
            return body
        }
    }

    /// Forgets a body nobody uses any more (it closed its file).
    func release(_ body: DeferredBody) {
        lock.withLock {
            if bodies[body.attachment.digest] === body { bodies[body.attachment.digest] = nil }
        }
    }

    /// A client logged in to the remote, from the pool of idle ones.
    func takeClient() throws -> HTTPClient {
        if let client = lock.withLock({ idleClients.popLast() }) { return client }
        let client = try HTTPClient(remote: remote)
        client.caFile = caFile
        client.retry = retry
        client.cancellation = cancellation
        client.receiveBufferSize = 512 << 10
        try client.logIn()
        return client
    }

    func returnClient(_ client: HTTPClient) {
        lock.withLock { if idleClients.count < 8 { idleClients.append(client) } }
    }

    /// The URL of an attachment at a revision (nil: the remote's current one).
    func url(docID: String, name: String, revID: RevisionID?) -> String {
        let path = name.split(separator: "/", omittingEmptySubsequences: false).map { percentEncodedPathSegment(String($0)) }
            .joined(separator: "/")
        return remote.url("\(percentEncodedPathSegment(docID))/\(path)" + (revID.map { "?rev=\($0)" } ?? ""))
    }

    /// Evicts down to the cache limit (`Database.trimCache`), each body checked on the remote first.
    public func trimCache() throws -> CacheTrim {
        try database.trimCache(keeping: activeDigests, canEvict: remoteStillHas)
    }

    /// Digests of bodies open or arriving in this process: the cache leaves them alone.
    var activeDigests: Set<String> { lock.withLock { Set(bodies.keys) } }

    /// Whether the remote still has `body`, so that it may be evicted: a HEAD of an
    /// attachment that uses it (at the revision that has it, or the remote's current one)
    /// answers with its digest as ETag.
    func remoteStillHas(_ body: CachedBody) -> Bool {
        guard let client = try? takeClient() else { return false }
        defer { returnClient(client) }
        let names = Set(database.digestNames(of: body.key) + [body.digest]).compactMap { digest -> String? in
            guard let dash = digest.firstIndex(of: "-") else { return nil }
            return "\"\(digest[digest.index(after: dash)...])\""
        }
        for use in (try? database.attachmentsUsing(digest: body.digest, limit: 4)) ?? [] {
            for revID in [Optional(use.revID), nil] {
                let url = url(docID: use.docID, name: use.name, revID: revID)
                guard let answer = try? client.send("HEAD", url, headers: ["Accept": "*/*"]), answer.status < 300 else { continue }
                if let tag = answer.headers["etag"], names.contains(tag) { return true }
            }
        }
        log.info("\(body.digest): kept in the cache: the remote no longer has it")
        return false
    }

    /// Downloads every deferred body of the current revisions (of one document, or one
    /// attachment), one at a time; `progress` gets (done, total, bytes) after each body and
    /// `bytesProgress` the body's bytes here while it arrives.
    public func downloadMissing(docID: String? = nil, name: String? = nil,
                                bodyProgress: ((BodyProgress) -> Void)? = nil,
                                progress: ((Int, Int, Int64) -> Void)? = nil) throws -> (count: Int, bytes: Int64) {
        let missing = try database.missingBodies().filter { entry in
            (docID == nil || entry.docID == docID) && (name == nil || entry.attachment.name == name)
        }
        var seen = Set<String>()
        let total = Set(missing.map { $0.attachment.digest }).count
        var bytes: Int64 = 0
        var done = 0
        for (id, rev, attachment) in missing where seen.insert(attachment.digest).inserted {
            if cancellation.isCancelled { throw ReplicationError.cancelled }
            let body = try acquire(attachment, docID: id, revID: rev)
            defer { body.releaseUser() }
            try body.fetchAll(progress: bodyProgress)
            bytes += attachment.length
            done += 1
            progress?(done, total, bytes)
        }
        return (done, bytes)
    }
}

extension Database {
    private static let remoteDocument = "_local/sofa-remote"

    /// The remote this database last pulled from (no credentials), where deferred bodies are fetched.
    public var rememberedRemote: String? {
        (try? localDocument(withID: Database.remoteDocument))??.body["url"]?.stringValue
    }

    public func rememberRemote(_ url: String) throws {
        let current = try localDocument(withID: Database.remoteDocument)
        guard current?.body["url"]?.stringValue != url else { return }
        var body = current?.body ?? [:]
        body["url"] = .string(url)
        _ = try replaceLocalDocument(Database.remoteDocument, body: body, after: current?.rev)
    }

    /// The download rules pulls from `url` (no credentials) were last given, if any: later
    /// pulls, syncs and mounts that give none follow them.
    public func downloadPolicy(for url: String) -> DownloadPolicy? {
        (try? localDocument(withID: Database.remoteDocument))??.body["downloads"]?[url].map(DownloadPolicy.init(json:))
    }

    public func setDownloadPolicy(_ policy: DownloadPolicy, for url: String) throws {
        let current = try localDocument(withID: Database.remoteDocument)
        var body = current?.body ?? [:]
        var policies = body["downloads"]?.objectValue ?? [:]
        guard policies[url] != policy.json else { return }
        policies[url] = policy.json
        body["downloads"] = .object(policies)
        _ = try replaceLocalDocument(Database.remoteDocument, body: body, after: current?.rev)
    }
}

/// One open of a deferred body, with its own readahead: a read that starts where the last
/// one ended (give or take the kernel's reordering) doubles the window fetched beyond it,
/// from 64 KiB, until the window reaches the end of the body; any other read fetches
/// only the chunks it covers.
final class DeferredBodyReader: BodyReader, @unchecked Sendable {
    // Sendable invariant: the readahead state is guarded by `lock`.
    let body: DeferredBody
    private let lock = NSLock()
    private var nextOffset: Int64 = 0
    private var window: Int64 = 0
    private var closed = false

    static let firstWindow: Int64 = 64 << 10
    /// Past this window, the rest of the body streams.
    static let streamingWindow: Int64 = 4 << 20
    /// Reads this close to where the last one ended count as going forward (or the current
    /// window, if bigger: the kernel's readahead requests arrive a little out of order).
    static let slack: Int64 = 128 << 10

    init(body: DeferredBody) { self.body = body }

    var length: Int64 { body.attachment.length }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, timeout: Double, willWait: () -> Void) throws -> Int {
        let ahead = lock.withLock { () -> Int64 in
            let end = offset + Int64(buffer.count)
            if abs(offset - nextOffset) <= max(DeferredBodyReader.slack, window) {
                window = window == 0 ? DeferredBodyReader.firstWindow : min(window * 2, DeferredBodyReader.streamingWindow)
                nextOffset = max(nextOffset, end)
            } else {
                window = 0
                nextOffset = end
            }
            return window >= DeferredBodyReader.streamingWindow ? Int64.max / 2 : window
        }
        return try body.read(into: buffer, at: offset, ahead: ahead, timeout: timeout, willWait: willWait)
    }

    func close() {
        let first = lock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        if first { body.releaseUser() }
    }

    deinit { close() }
}

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
    private let condition = NSCondition()
    private var partial: PartialBody
    private var fetches: [ChunkFetch] = []
    private var blob: StoredBlob?
    /// Counts fetches that failed for good, so a waiting reader notices one.
    private var failures = 0
    private var lastFailure: (any Error)?
    /// The server answers ranges with the whole body: fetch it in one stream.
    private var wholeOnly = false
    /// The remote lacks `revID`: ask for the document's current revision.
    private var atCurrentRevision = false
    /// A whole stream arrived and matched the digest as it came (a gzip stream, named by its MD5).
    private var verifiedWhole = false
    private var finishing = false
    private var completeReader: BlobReader?
    /// Readers waiting for chunks: arrivals wake them only if there are some.
    private var waiting = 0
    private var users = 0
    private var released = false

    init(owner: RemoteBodies, attachment: Attachment, docID: String, revID: RevisionID) throws {
        self.owner = owner
        self.attachment = attachment
        self.docID = docID
        self.revID = revID
        partial = try PartialBody(store: owner.database.blobs, digest: attachment.digest, length: attachment.length)
        if let stored = try? owner.database.storedBody(digest: attachment.digest) { blob = stored }
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
    private func closeIfIdle() {
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
                if let (complete, verified) = claim { Thread.detachNewThread { [self] in install(complete, verified: verified) } }
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
    private func blobReader(_ blob: StoredBlob) throws -> BlobReader {
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
    private func isArriving(_ chunk: Int) -> Bool {
        fetches.contains { $0.next <= chunk && chunk < $0.end }
    }

    /// Starts fetches for the chunks of `needed`, and `ahead` chunks after them, that are
    /// neither here nor arriving: one ranged GET per run of them. Under `condition`.
    private func schedule(_ needed: Range<Int>, ahead: Int) {
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

    private func start(_ chunks: Range<Int>) {
        let fetch = ChunkFetch(chunks)
        fetches.append(fetch)
        let thread = Thread { [self] in run(fetch) }
        thread.name = "sofa-fetch"
        thread.start()
    }

    // MARK: Fetching

    private func run(_ fetch: ChunkFetch) {
        var failure: (any Error)?
        do {
            if let stored = try? owner.database.storedBody(digest: attachment.digest) {
                // Another process (or document) brought the body meanwhile.
                condition.withLock { blob = stored }
            } else {
                let client = try owner.takeClient()
                defer { owner.returnClient(client) }
                client.onRetry = { [owner, docID, attachment] error, attempt in
                    owner.log.warning("\(docID)/\(attachment.name): retrying after attempt \(attempt): \(error)")
                }
                do {
                    try client.withRetry { try transfer(fetch, client: client) }
                } catch ReplicationError.http(404, _, _, _) where !condition.withLock({ atCurrentRevision }) {
                    // The remote does not have this revision (a local edit not pushed yet, or its
                    // history compacted): the body may still be its current one (the ETag says).
                    condition.withLock { atCurrentRevision = true }
                    try client.withRetry { try transfer(fetch, client: client) }
                }
            }
        } catch {
            failure = error
        }
        // Saved before the fetch counts as ended: a waiter may exit the process right after.
        try? condition.withLock { partial }.save(atMostEvery: 1)
        // The install is claimed as the fetch ends, in one step: a reader closing in between
        // would otherwise release the body (closing its partial file) before it is installed.
        let claim = condition.withLock { () -> (PartialBody, Bool)? in
            fetches.removeAll { $0 === fetch }
            // A fetch stopped because nobody reads any more is no failure; any other end without the bytes is.
            if let failure, !fetch.unread {
                failures += 1
                lastFailure = failure
                return nil
            }
            return claimFinish()
        }
        condition.broadcast()
        if let (source, verified) = claim { install(source, verified: verified) }
        closeIfIdle()
    }

    /// One GET of the chunks `fetch` still has to deliver: a ranged one, or the whole
    /// body when the server ignores ranges.
    private func transfer(_ fetch: ChunkFetch, client: HTTPClient) throws {
        let (from, end, whole, source, stopped) = condition.withLock { (fetch.next, fetch.end, wholeOnly, partial, fetch.stop) }
        guard !stopped else { throw ReplicationError.cancelled }
        guard from < end else { return }
        let length = attachment.length
        let first = Int64(from) * Int64(PartialBody.chunkSize)
        let last = min(Int64(end) * Int64(PartialBody.chunkSize), length) - 1
        var headers = ["Accept": "*/*", "Accept-Encoding": "gzip"]
        if !whole { headers["Range"] = "bytes=\(first)-\(last)" }
        let url = owner.url(docID: docID, name: attachment.name, revID: condition.withLock { atCurrentRevision } ? nil : revID)
        var stream: IncomingChunks?
        let answer = try client.send("GET", url, headers: headers) { [self] bytes, status, responseHeaders in
            guard status < 300 else { return false }
            if stream == nil {
                try checkTag(responseHeaders["etag"], fetch: fetch)
                if status == 206 {
                    guard responseHeaders["content-encoding"] == nil,
                          let range = responseHeaders["content-range"].flatMap(ContentRange.init),
                          range.first == first, range.last <= last, range.total == length else {
                        // A server that gets ranges wrong gets asked for the whole body (the retry).
                        condition.withLock { wholeOnly = true }
                        throw ReplicationError.protocolError("\(attachment.name): asked for bytes \(first)-\(last)/\(length), "
                                                             + "got \(responseHeaders["content-range"] ?? "no Content-Range")")
                    }
                    stream = IncomingChunks(body: source, fetch: fetch, from: first, decoder: nil, md5: nil, room: owner.room)
                } else {
                    // The whole body: from now on this fetch delivers every chunk, and so do later ones.
                    condition.withLock {
                        wholeOnly = true
                        fetch.next = 0
                        fetch.end = source.chunkCount
                    }
                    let gzip = responseHeaders["content-encoding"]?.lowercased() == "gzip"
                    stream = IncomingChunks(body: source, fetch: fetch, from: 0, decoder: gzip ? try GzipDecoder() : nil,
                                            md5: attachment.digest.hasPrefix("md5-") ? MessageDigest(.md5) : nil, room: owner.room)
                }
            }
            if condition.withLock({ fetch.stop }) { throw ReplicationError.cancelled }
            try stream!.receive(bytes) { [self] arrived in
                let wake = condition.withLock { () -> Bool in
                    fetch.next = max(fetch.next, arrived)
                    return waiting > 0
                }
                if wake { condition.broadcast() }
            }
            return true
        }
        guard answer.status < 300 else { throw client.httpError(answer, url: url) }
        guard let stream else { throw ReplicationError.protocolError("\(attachment.name): an empty answer") }
        try stream.finish()
        let delivered = condition.withLock { fetch.next >= fetch.end }
        guard delivered else {
            throw ReplicationError.network("\(attachment.name): the answer ended at byte \(stream.position) of \(length)")
        }
        if stream.from == 0 && stream.position == length, let md5 = stream.md5 {
            let sent = "md5-" + Data(md5.finalize()).base64EncodedString()
            guard sent == attachment.digest else {
                // Not this body: none of what is here can be trusted.
                condition.withLock { resetPartial(keeping: fetch) }
                throw ReplicationError.protocolError("\(attachment.name): the body received does not match its digest \(attachment.digest)")
            }
            if stream.decoder != nil { condition.withLock { verifiedWhole = true } }
        }
    }

    /// An answer tagged with another body's digest is another body: what is here is dropped.
    private func checkTag(_ tag: String?, fetch: ChunkFetch) throws {
        guard let tag, tag.hasPrefix("\""), let dash = attachment.digest.firstIndex(of: "-") else { return }
        let expected = "\"\(attachment.digest[attachment.digest.index(after: dash)...])\""
        guard tag != expected else { return }
        condition.withLock { resetPartial(keeping: fetch) }
        throw ReplicationError.protocolError("\(attachment.name): the body the server sends (ETag \(tag)) does not match its digest "
                                             + "\(attachment.digest); what arrived of it is dropped")
    }

    /// Drops the partial body and starts an empty one: other fetches stop (they write into the
    /// old one), `current` starts its range again. Under `condition`.
    private func resetPartial(keeping current: ChunkFetch? = nil) {
        partial.discard()
        if let fresh = try? PartialBody(store: owner.database.blobs, digest: attachment.digest, length: attachment.length) {
            partial = fresh
        }
        for fetch in fetches where fetch !== current { fetch.stop = true }
        if let current { current.next = current.start }
    }

    /// Once every chunk is here: hash, install as a blob, and tell the database.
    private func finishIfComplete() {
        guard let (source, verified) = condition.withLock({ claimFinish() }) else { return }
        install(source, verified: verified)
    }

    /// Whether the body is ready to install, and if so, the claim to do it. Under `condition`.
    private func claimFinish() -> (PartialBody, Bool)? {
        guard blob == nil, !finishing, !released, fetches.isEmpty, partial.isComplete else { return nil }
        finishing = true
        return (partial, verifiedWhole)
    }

    private func install(_ source: PartialBody, verified: Bool) {
        defer {
            condition.withLock { finishing = false }
            condition.broadcast()
            closeIfIdle()
        }
        do {
            if let stored = try? owner.database.storedBody(digest: attachment.digest) {
                // Installed meanwhile by another process reading the same body.
                condition.withLock { blob = stored }
                return
            }
            let (stored, digest) = try source.finish(verified: verified)
            try owner.database.attachBody(digest: attachment.digest, blob: stored, storedDigest: digest)
            condition.withLock { blob = stored }
        } catch {
            owner.log.error("\(docID)/\(attachment.name): \(error); fetching it again as one stream")
            condition.withLock {
                resetPartial()
                wholeOnly = true
                failures += 1
                lastFailure = error
            }
        }
    }
}

/// `Content-Range: bytes FIRST-LAST/TOTAL`.
struct ContentRange {
    let first: Int64
    let last: Int64
    let total: Int64

    init?(_ header: String) {
        guard header.hasPrefix("bytes ") else { return nil }
        let parts = header.dropFirst(6).split(separator: "/")
        guard parts.count == 2, let total = Int64(parts[1]) else { return nil }
        let bounds = parts[0].split(separator: "-")
        guard bounds.count == 2, let first = Int64(bounds[0]), let last = Int64(bounds[1]), first <= last else { return nil }
        (self.first, self.last, self.total) = (first, last, total)
    }
}

/// Bytes of one answer written where they belong in the partial body; each chunk they
/// complete is marked present and reported (`arrived` gets the next chunk expected).
final class IncomingChunks {
    let body: PartialBody
    let fetch: ChunkFetch
    let from: Int64
    let decoder: GzipDecoder?
    let md5: MessageDigest?
    let room: CacheRoom
    private(set) var position: Int64

    init(body: PartialBody, fetch: ChunkFetch, from: Int64, decoder: GzipDecoder?, md5: MessageDigest?, room: CacheRoom) {
        self.body = body
        self.fetch = fetch
        self.from = from
        self.decoder = decoder
        self.md5 = md5
        self.room = room
        position = from
    }

    func receive(_ bytes: UnsafeRawBufferPointer, arrived: (Int) -> Void) throws {
        md5?.update(bytes)
        if let decoder {
            var pieces: [[UInt8]] = []
            try decoder.decode(Array(bytes)) { pieces.append($0) }
            for piece in pieces { try piece.withUnsafeBytes { try write($0, arrived: arrived) } }
        } else {
            try write(bytes, arrived: arrived)
        }
    }

    private func write(_ bytes: UnsafeRawBufferPointer, arrived: (Int) -> Void) throws {
        guard position + Int64(bytes.count) <= body.length else {
            throw ReplicationError.protocolError("\(body.digest): more bytes than the body's \(body.length)")
        }
        room.reserve(Int64(bytes.count))
        try body.write(bytes, at: position)
        let before = Int(position / Int64(PartialBody.chunkSize))
        position += Int64(bytes.count)
        let complete = position == body.length ? body.chunkCount : Int(position / Int64(PartialBody.chunkSize))
        if complete > before {
            body.markPresent(before..<complete)
            arrived(complete)
        }
    }

    func finish() throws {
        guard let decoder else { return }
        do { try decoder.finish() } catch {
            throw ReplicationError.protocolError("\(body.digest): truncated gzip body")
        }
    }
}

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
