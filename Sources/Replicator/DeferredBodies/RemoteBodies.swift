import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
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
    /// Transfers of chunks under way (`ReplicatorTuning.bodyTransfers` at once).
    let transfers = WorkPool(name: "sofa-fetch", maximum: ReplicatorTuning.bodyTransfers)
    /// Bodies complete being hashed and installed.
    let installs = WorkPool(name: "sofa-install", maximum: ReplicatorTuning.bodyInstalls)
    /// Pinned bodies fetched whole in the background, one at a time (each waits on its transfers).
    let pins = WorkPool(name: "sofa-pin", maximum: 1)

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

    public func fetch(_ attachment: Attachment, docID: String, revID: RevisionID) throws {
        let body = try acquire(attachment, docID: docID, revID: revID)
        defer { body.releaseUser() }
        try body.fetchAll(progress: nil)
    }

    public func fetchInBackground(_ attachment: Attachment, docID: String, revID: RevisionID) {
        let body: DeferredBody
        do { body = try acquire(attachment, docID: docID, revID: revID) } catch {
            log.error("\(docID)/\(attachment.name): cannot fetch the pinned body: \(error)")
            return
        }
        pins.submit { [self] in
            defer { body.releaseUser() }
            do { try body.fetchAll(progress: nil) } catch {
                log.error("\(docID)/\(attachment.name): cannot fetch the pinned body: \(error)")
            }
        }
    }

    public func progress(of attachment: Attachment) -> BodyProgress? {
        if let body = lock.withLock({ bodies[attachment.digest] }) { return body.progress }
        // For status files only: a failed look reads as "not here yet".
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
        client.receiveBufferSize = ReplicatorTuning.bodyReceiveBuffer
        try client.logIn()
        return client
    }

    func returnClient(_ client: HTTPClient) {
        lock.withLock { if idleClients.count < ReplicatorTuning.idleBodyClients { idleClients.append(client) } }
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
    /// Any failure (the remote unreachable, a read here) answers false: the body is kept, the
    /// safe way to be wrong.
    func remoteStillHas(_ body: CachedBody) -> Bool {
        guard let client = try? takeClient() else { return false }
        defer { returnClient(client) }
        let names = Set(database.digestNames(of: body.key) + [body.digest]).compactMap { digest -> String? in
            guard let dash = digest.firstIndex(of: "-") else { return nil }
            return "\"\(digest[digest.index(after: dash)...])\""
        }
        for use in (try? database.attachmentsUsing(digest: body.digest, limit: 4)) ?? [] {  // unknown uses: kept
            for revID in [Optional(use.revID), nil] {
                let url = url(docID: use.docID, name: use.name, revID: revID)
                // No answer: not confirmed, so kept.
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
        get throws { try localDocument(withID: Database.remoteDocument)?.body["url"]?.stringValue }
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
    public func downloadPolicy(for url: String) throws -> DownloadPolicy? {
        try localDocument(withID: Database.remoteDocument)?.body["downloads"]?[url].map(DownloadPolicy.init(json:))
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
