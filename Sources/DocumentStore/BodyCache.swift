import DocumentModel
import Foundation
import Logging

/// A body here that the cache of fetched bodies knows about.
public struct CachedBody: Hashable, Sendable {
    /// The digest its attachments give it.
    public let digest: String
    public let key: BlobKey
    public let length: Int64
    /// When it was last opened (seconds since 1970; its arrival if never since).
    public let lastRead: Double
    /// Fetched from the remote: it can be fetched again, so the cache may evict it.
    public let fetched: Bool
    public let pinned: Bool
}

/// How much of the disk the cache of fetched bodies uses (`sofa info`, `sofa cache`).
public struct CacheUse: Hashable, Sendable {
    /// The limit for fetched bodies and partial ones; nil: none.
    public var limit: Int64?
    /// Fetched bodies here that are not pinned: the ones the cache evicts.
    public var cachedCount = 0
    public var cachedBytes: Int64 = 0
    /// Bodies partly here (their bytes on disk).
    public var partialCount = 0
    public var partialBytes: Int64 = 0
    /// Pinned bodies here, and pinned bodies still to fetch.
    public var pinnedCount = 0
    public var pinnedBytes: Int64 = 0
    public var pinnedMissing = 0

    /// What counts against the limit.
    public var used: Int64 { cachedBytes + partialBytes }
}

/// What a trim of the cache evicted.
public struct CacheTrim: Hashable, Sendable {
    public var bodiesEvicted = 0
    public var partialsDropped = 0
    public var bytesFreed: Int64 = 0
    /// Bytes still counted against the limit afterwards.
    public var used: Int64 = 0
}

/// The cache of fetched bodies.
///
/// A body fetched from the remote (read through a mount or `sofa serve`, `sofa download`,
/// `sofa pin`) can be fetched again, so when a limit is set (`setCacheLimit`) the least
/// recently read of them go back to deferred to make room: their attachments keep their
/// metadata and the next read fetches them again. Never evicted: pinned bodies, bodies a
/// pull downloaded because its download rules said so, and any body this database saved
/// itself (one a local revision introduced is no longer "fetched", even if the same bytes
/// also came from the remote), so a body only this machine has, or one not yet pushed,
/// stays. Partial bodies count against the limit too, and are dropped oldest first when
/// nobody is fetching them.
extension Database {
    /// The limit of the cache, if one is set. A failed read throws: it is not "no limit".
    public func cacheLimit() throws -> Int64? {
        guard schema.has(CachedBody.schemaStep) else { return nil }
        return try read { try $0.query("SELECT value FROM meta WHERE key = 'cache_limit'") { $0.int64(0) }.first }
    }

    public func setCacheLimit(_ limit: Int64?) throws {
        try requireBodyCache()
        try write { connection in
            if let limit {
                try connection.run("INSERT OR REPLACE INTO meta (key, value) VALUES ('cache_limit', ?)", .integer(max(0, limit)))
            } else {
                try connection.run("DELETE FROM meta WHERE key = 'cache_limit'")
            }
        }
    }

    /// Notes that the body `digest` was opened: the cache evicts the least recently read first.
    /// Only while a limit is set (without one nothing is evicted, and eviction falls back on
    /// when bodies arrived); kept in memory and written in one transaction every few
    /// seconds (an open must not cost a write: `cat` of 10,000 small files took 2.6× as
    /// long with one each). Never fails.
    public func noteRead(digest: String) {
        guard schema.has(CachedBody.schemaStep), !isReadOnly else { return }
        let now = Date().timeIntervalSince1970
        let checkLimit = readNotesLock.withLock { now - readNotes.limitChecked > 5 }
        // A limit that cannot be read now counts as set: reads are noted, as they must be if it is.
        if checkLimit {
            let limited: Bool
            do { limited = try cacheLimit() != nil } catch { limited = true }
            readNotesLock.withLock {
                readNotes.limitChecked = now
                readNotes.limited = limited
            }
        }
        let due = readNotesLock.withLock { () -> [String: Double]? in
            guard readNotes.limited else { return nil }
            readNotes.pending[digest] = now
            guard now - readNotes.lastWrite >= 2 else { return nil }
            readNotes.lastWrite = now
            defer { readNotes.pending.removeAll() }
            return readNotes.pending
        }
        guard let due else { return }
        // Read times only order evictions: one not written leaves a body a little older than it is.
        try? write { connection in
            for (digest, time) in due {
                try connection.run("INSERT INTO body_cache (digest, last_read) VALUES (?, ?) ON CONFLICT (digest) DO UPDATE SET last_read = excluded.last_read",
                                   .text(digest), .real(time))
            }
        }
    }

    /// Reads noted and not written yet (`noteRead`). Guarded by `readNotesLock`.
    struct ReadNotes {
        var pending: [String: Double] = [:]
        var lastWrite: Double = 0
        var limitChecked: Double = 0
        var limited = false
    }

    /// Pins or unpins the body `digest`: a pinned body is never evicted.
    public func setPinned(_ pinned: Bool, digest: String) throws {
        try requireBodyCache()
        try write { connection in
            try connection.run("INSERT INTO body_cache (digest, pinned) VALUES (?, ?) ON CONFLICT (digest) DO UPDATE SET pinned = excluded.pinned",
                               .text(digest), .integer(pinned ? 1 : 0))
            try recordBodyEvent([digest], in: connection)
        }
    }

    public func isPinned(digest: String) throws -> Bool {
        guard schema.has(CachedBody.schemaStep) else { return false }
        return try read { try $0.query("SELECT pinned FROM body_cache WHERE digest = ?", .text(digest)) { $0.int(0) }.first } == 1
    }

    /// Bodies here that the cache knows (fetched or pinned).
    func cachedBodies() throws -> [CachedBody] {
        guard schema.has(CachedBody.schemaStep) else { return [] }
        let rows = try read { connection in
            try connection.query("""
                SELECT c.digest, c.last_read, c.fetched, c.pinned, MAX(a.blob_key), MAX(a.length) FROM body_cache c
                JOIN rev_attachments a ON a.digest = c.digest AND a.blob_key IS NOT NULL
                WHERE c.fetched = 1 OR c.pinned = 1 GROUP BY c.digest
                """) { ($0.text(0), $0.double(1), $0.int(2) == 1, $0.int(3) == 1, $0.text(4), $0.int64(5)) }
        }
        return rows.compactMap { digest, lastRead, fetched, pinned, hex, length in
            guard let key = BlobKey(hex: hex), blobs.contains(key) else { return nil }
            return CachedBody(digest: digest, key: key, length: length, lastRead: lastRead, fetched: fetched, pinned: pinned)
        }
    }

    public func cacheUse() throws -> CacheUse {
        var use = CacheUse(limit: try cacheLimit())
        for body in try cachedBodies() {
            if body.pinned {
                use.pinnedCount += 1
                use.pinnedBytes += body.length
            } else if body.fetched {
                use.cachedCount += 1
                use.cachedBytes += body.length
            }
        }
        for partial in blobs.partialBodies() {
            use.partialCount += 1
            use.partialBytes += partial.length
        }
        if schema.has(CachedBody.schemaStep) {
            use.pinnedMissing = try read { connection in
                try connection.query("""
                    SELECT COUNT(*) FROM body_cache c WHERE c.pinned = 1
                    AND NOT EXISTS (SELECT 1 FROM rev_attachments a WHERE a.digest = c.digest AND a.blob_key IS NOT NULL)
                    AND EXISTS (SELECT 1 FROM rev_attachments a WHERE a.digest = c.digest)
                    """) { $0.int(0) }[0]
            }
        }
        return use
    }

    /// Makes room for `extra` more bytes under the limit (nothing without one): evicts the
    /// least recently read fetched bodies and drops the oldest partial bodies nobody is
    /// fetching, except those named in `keeping`, until what is left plus `extra` fits.
    /// `canEvict` gets the last word on each body (the replicator checks that the remote
    /// still has it).
    @discardableResult
    public func trimCache(toFit extra: Int64 = 0, keeping: Set<String> = [],
                          canEvict: (CachedBody) -> Bool = { _ in true }) throws -> CacheTrim {
        var trim = CacheTrim()
        guard let limit = try cacheLimit() else { return trim }
        enum Victim { case body(CachedBody), partial(digest: String, bytes: Int64) }
        var victims: [(time: Double, victim: Victim)] = []
        var sizes: [String: Int64] = [:]
        for body in try cachedBodies() where body.fetched && !body.pinned {
            // What it takes on disk (whole blocks), as the limit is about the disk.
            var info = stat()
            let bytes = stat(blobs.path(for: body.key), &info) == 0 ? Int64(info.st_blocks) * 512 : body.length
            sizes[body.digest] = bytes
            trim.used += bytes
            if !keeping.contains(body.digest) { victims.append((body.lastRead, .body(body))) }
        }
        let keepingPartials = Set(keeping.compactMap(blobs.partialListing(of:)))
        for partial in blobs.partialBodies() {
            trim.used += partial.length
            if !keepingPartials.contains(partial.digest) {
                victims.append((blobs.partialModificationTime(of: partial.digest), .partial(digest: partial.digest, bytes: partial.length)))
            }
        }
        victims.sort { $0.time < $1.time }
        for (_, victim) in victims where trim.used + extra > limit {
            switch victim {
            case .body(let body):
                guard canEvict(body), let freed = try evict(body.digest) else { continue }
                trim.bodiesEvicted += 1
                trim.bytesFreed += freed
                trim.used -= sizes[body.digest] ?? body.length
            case .partial(let digest, let bytes):
                guard blobs.removePartialBody(digest: digest) else { continue }
                trim.partialsDropped += 1
                trim.bytesFreed += bytes
                trim.used -= bytes
            }
        }
        return trim
    }

    /// Sends one fetched, unpinned body back to deferred (checked in the same transaction).
    /// Returns the bytes freed, or nil when it may not be evicted (any more).
    func evict(_ digest: String) throws -> Int64? {
        try purgeBody(digest: digest) { connection in
            try connection.query("SELECT 1 FROM body_cache WHERE digest = ? AND fetched = 1 AND pinned = 0", .text(digest)) { $0.int(0) }
                .isEmpty == false
        }
    }

    /// Marks the body `digest` arrived from the remote. In the transaction that attached it.
    func noteFetched(_ digest: String, renaming oldDigest: String?, in connection: SQLiteConnection) throws {
        guard schema.has(CachedBody.schemaStep) else { return }
        if let oldDigest, oldDigest != digest {
            // A pin given under the name the remote used follows the body to the name it has here.
            try connection.run("UPDATE OR IGNORE body_cache SET digest = ? WHERE digest = ?", .text(digest), .text(oldDigest))
        }
        try connection.run("""
            INSERT INTO body_cache (digest, last_read, fetched) VALUES (?, ?, 1)
            ON CONFLICT (digest) DO UPDATE SET fetched = 1, last_read = excluded.last_read
            """, .text(digest), .real(Date().timeIntervalSince1970))
    }

    /// Bodies a local revision introduced are this machine's own, not the cache's.
    func noteSavedHere(_ digests: [String], in connection: SQLiteConnection) throws {
        guard schema.has(CachedBody.schemaStep) else { return }
        for digest in digests {
            try connection.run("UPDATE body_cache SET fetched = 0 WHERE digest = ? AND fetched = 1", .text(digest))
        }
    }

    /// Other names the body `key` is known by (`body_digests`: the digest of an encoded form).
    public func digestNames(of key: BlobKey) -> [String] {
        guard schema.has(Schema.bodyDigests) else { return [] }
        // Other names to recognise a body by (an ETag): a failed read only narrows the match.
        return (try? read { try $0.query("SELECT digest FROM body_digests WHERE blob_key = ?", .text(key.hex)) { $0.text(0) } }) ?? []
    }

    /// Attachments that use the body `digest`: (document, revision, name), current revisions first.
    public func attachmentsUsing(digest: String, limit: Int = Int.max) throws -> [(docID: String, revID: RevisionID, name: String)] {
        try read { connection in
            try connection.query("""
                SELECT d.doc_id, a.rev_id, a.name FROM rev_attachments a JOIN docs d ON d.doc_key = a.doc_key
                WHERE a.digest = ? ORDER BY a.rev_id = d.current_rev DESC LIMIT ?
                """, .text(digest), .integer(Int64(min(limit, Int(Int32.max))))) {
                ($0.text(0), try Database.revisionID($0.text(1)), $0.text(2))
            }
        }
    }

    private func requireBodyCache() throws {
        guard schema.has(CachedBody.schemaStep) else { throw SofaError.readOnlyFileSystem(path: databaseFilePath) }
    }
}

extension CachedBody {
    /// `body_cache` (version 4): per body digest, when it was last read, whether it was fetched
    /// from the remote (it can be fetched again, so it may be evicted), whether it is pinned.
    package static let schemaStep = SchemaStep("body cache", numberedVersion: 4, sql: """
        CREATE TABLE IF NOT EXISTS body_cache (
            digest TEXT PRIMARY KEY,
            last_read REAL NOT NULL DEFAULT 0,
            fetched INTEGER NOT NULL DEFAULT 0,
            pinned INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID;
        """)
}
