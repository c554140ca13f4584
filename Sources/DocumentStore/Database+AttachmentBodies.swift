import DocumentModel
import Foundation

/// Attachment bodies: opening what is here, what is deferred, and bodies that arrive.
extension Database {
    /// Opens an attachment's body for streaming; the reader checks the hash at the end.
    public func openContent(of attachment: Attachment, docID: String) throws -> BlobReader {
        guard let key = attachment.blobKey, blobs.contains(key) else {
            throw SofaError.bodyNotAvailable(docID: docID, name: attachment.name)
        }
        return try blobs.openReader(key, expectedLength: attachment.length)
    }

    /// The path of an attachment's body file (read-only; never write to it), or nil if not here
    /// or if the file holds it sealed (an encrypted database: read it with `openContent`).
    public func contentPath(of attachment: Attachment) -> String? {
        guard !blobs.isSealed, let key = attachment.blobKey, blobs.contains(key) else { return nil }
        return blobs.path(for: key)
    }

    /// Records that the body known by `digest`, fetched from the remote, is now in the blob
    /// store, for every revision that refers to it without a body (the cache may evict it). Returns how many attachments gained it.
    /// With `storedDigest` (the digest of the bytes as stored, when `digest` named an
    /// encoded form), those attachments take that digest and `digest` stays known as an
    /// alias of the body (`body_digests`).
    @discardableResult
    public func attachBody(digest: String, blob: StoredBlob, storedDigest: String? = nil) throws -> Int {
        try write { connection in
            try connection.run("UPDATE rev_attachments SET blob_key = ?, digest = ? WHERE digest = ? AND length = ? AND (blob_key IS NULL OR blob_key != ?)",
                               .text(blob.key.hex), .text(storedDigest ?? digest), .text(digest), .integer(blob.length), .text(blob.key.hex))
            let changed = Int(connection.changes)
            if let storedDigest, storedDigest != digest { try recordAlias(digest, of: blob.key, in: connection) }
            try noteFetched(storedDigest ?? digest, renaming: digest, in: connection)
            try recordBodyEvent(Set([digest, storedDigest ?? digest]), in: connection)
            return changed
        }
    }

    /// Notes that the bodies named `digests` arrived or went, for mounts in other processes.
    func recordBodyEvent(_ digests: Set<String>, in connection: SQLiteConnection) throws {
        guard schema.has(Schema.bodyEvents) else { return }
        connection.wroteChanges = true
        for digest in digests.sorted() {
            try connection.run("INSERT INTO body_events (digest) VALUES (?)", .text(digest))
        }
        try connection.run("DELETE FROM body_events WHERE seq <= last_insert_rowid() - 1000")
    }

    /// The latest body event (0 for none).
    public func lastBodyEvent() throws -> Int64 {
        guard schema.has(Schema.bodyEvents) else { return 0 }
        return try read { try $0.query("SELECT COALESCE(MAX(seq), 0) FROM body_events") { $0.int64(0) }[0] }
    }

    /// Documents whose attachments (in any revision) use a body that arrived or went after
    /// event `seq`, and the latest event.
    public func documentsWithBodyEvents(after seq: Int64) throws -> (docIDs: [String], last: Int64) {
        guard schema.has(Schema.bodyEvents) else { return ([], seq) }
        return try read { connection in
            let events = try connection.query("SELECT seq, digest FROM body_events WHERE seq > ? ORDER BY seq", .integer(seq)) {
                ($0.int64(0), $0.text(1))
            }
            guard let last = events.last?.0 else { return ([], seq) }
            var ids = Set<String>()
            for digest in Set(events.map(\.1)) {
                ids.formUnion(try connection.query(
                    "SELECT DISTINCT d.doc_id FROM rev_attachments a JOIN docs d ON d.doc_key = a.doc_key WHERE a.digest = ?",
                    .text(digest)) { $0.text(0) })
            }
            return (ids.sorted(), last)
        }
    }

    /// Remembers that the body `key` is also known as `digest` (an encoded form's digest).
    public func recordAlias(_ digest: String, of key: BlobKey) throws {
        try write { try recordAlias(digest, of: key, in: $0) }
    }

    func recordAlias(_ digest: String, of key: BlobKey, in connection: SQLiteConnection) throws {
        guard schema.has(Schema.bodyDigests), digest != key.digestString else { return }
        try connection.run("INSERT OR REPLACE INTO body_digests (digest, blob_key) VALUES (?, ?)", .text(digest), .text(key.hex))
    }

    /// Turns a local body back into a deferred one: every revision that refers to the body
    /// under `digest` keeps its metadata and loses the body, which is deleted if nothing else
    /// uses it. Attachments that took the body's own digest when it arrived encoded (a gzip
    /// body from CouchDB, `body_digests`) get back the name the remote knows it by, so that it
    /// can be fetched again. Returns the bytes freed.
    @discardableResult
    public func purgeBody(digest: String) throws -> Int64 {
        try purgeBody(digest: digest, if: { _ in true }) ?? 0
    }

    /// `purgeBody`, if `allowed` (asked in the same transaction) says so; nil when it did not.
    func purgeBody(digest: String, if allowed: (SQLiteConnection) throws -> Bool) throws -> Int64? {
        let keys = try write { connection -> [String]? in
            guard try allowed(connection) else { return nil }
            let keys = try connection.query("SELECT DISTINCT blob_key FROM rev_attachments WHERE digest = ? AND blob_key IS NOT NULL",
                                            .text(digest)) { $0.text(0) }
            var names: Set<String> = [digest]
            if schema.has(Schema.bodyDigests), keys.count == 1,
               let remoteName = try connection.query("SELECT digest FROM body_digests WHERE blob_key = ? ORDER BY digest LIMIT 1",
                                                     .text(keys[0]), row: { $0.text(0) }).first {
                try connection.run("UPDATE rev_attachments SET blob_key = NULL, digest = ? WHERE digest = ?", .text(remoteName), .text(digest))
                if schema.has(CachedBody.schemaStep) {
                    try connection.run("UPDATE OR IGNORE body_cache SET digest = ? WHERE digest = ?", .text(remoteName), .text(digest))
                }
                names.insert(remoteName)
            } else {
                try connection.run("UPDATE rev_attachments SET blob_key = NULL WHERE digest = ?", .text(digest))
            }
            try recordBodyEvent(names, in: connection)
            // Keys still used under another digest stay.
            return try keys.filter { key in
                try connection.query("SELECT COUNT(*) FROM rev_attachments WHERE blob_key = ?", .text(key)) { $0.int(0) }[0] == 0
            }
        }
        guard let keys else { return nil }
        var freed: Int64 = 0
        for hex in keys {
            guard let key = BlobKey(hex: hex) else { continue }
            var info = stat()
            if stat(blobs.path(for: key), &info) == 0, unlink(blobs.path(for: key)) == 0 { freed += Int64(info.st_blocks) * 512 }
        }
        return freed
    }

    /// A body already here under `digest`: the digest of an attachment whose body is here,
    /// an alias recorded for a body (`recordAlias`), or a `sha1-` digest naming a blob.
    public func storedBody(digest: String) throws -> StoredBlob? {
        let keys = try read { connection in
            var keys = try connection.query("SELECT blob_key, length FROM rev_attachments WHERE digest = ? AND blob_key IS NOT NULL", .text(digest)) { row in
                (row.text(0), Optional(row.int64(1)))
            }
            if schema.has(Schema.bodyDigests) {
                keys += try connection.query("SELECT blob_key FROM body_digests WHERE digest = ?", .text(digest)) { row in
                    (row.text(0), Int64?.none)
                }
            }
            return keys
        }
        for (hex, length) in keys {
            guard let key = BlobKey(hex: hex), blobs.contains(key) else { continue }
            if let length { return StoredBlob(key: key, length: length) }
            if let size = blobs.size(of: key) { return StoredBlob(key: key, length: size) }
        }
        if let key = BlobKey(digestString: digest), let size = blobs.size(of: key) { return StoredBlob(key: key, length: size) }
        return nil
    }

    /// Attachments of current revisions whose bodies are not here: (document, revision, attachment).
    public func missingBodies() throws -> [(docID: String, revID: RevisionID, attachment: Attachment)] {
        let rows = try read { connection in
            try connection.query("""
                SELECT d.doc_id, d.current_rev FROM docs d
                WHERE d.deleted = 0 AND EXISTS (SELECT 1 FROM rev_attachments a WHERE a.doc_key = d.doc_key AND a.rev_id = d.current_rev)
                ORDER BY d.doc_id
                """) { ($0.text(0), try Database.revisionID($0.text(1))) }
        }
        var result: [(String, RevisionID, Attachment)] = []
        for (id, rev) in rows {
            guard let revision = try revisionIfPresent(rev, of: id) else { continue }  // replaced meanwhile
            for attachment in revision.attachments where !attachment.contentAvailable { result.append((id, rev, attachment)) }
        }
        return result
    }
}

extension Database {
    /// The body with `digest` (`sha1-…`, or a remote's digest of a body fetched here), opened
    /// for reading a chunk at a time; nil when it is not here.
    public func openBody(digest: String) throws -> BlobChunks? {
        if let blob = try storedBody(digest: digest) { return BlobChunks(try blobs.openReader(blob.key, expectedLength: blob.length)) }
        if let key = BlobKey(digestString: digest), blobs.contains(key) { return BlobChunks(try blobs.openReader(key)) }
        return nil
    }
}

/// A stored body read a chunk at a time by whichever task sends it (one at a time): the source
/// of a BLIP reply. The reader checks the bytes against their digest as they go.
public final class BlobChunks: @unchecked Sendable {
    // Sendable invariant: read by one sender at a time.
    private let reader: BlobReader

    public init(_ reader: BlobReader) { self.reader = reader }

    /// Up to `maximum` bytes; nil at the end.
    public func read(_ maximum: Int) throws -> [UInt8]? {
        var chunk = [UInt8](repeating: 0, count: maximum)
        let count = try chunk.withUnsafeMutableBytes { try reader.read(into: $0) }
        return count == 0 ? nil : Array(chunk[..<count])
    }

    /// BLIP's `proveAttachment`: the SHA-1 of the nonce's length, the nonce and the whole body,
    /// as a digest string, which shows the body is here without sending it.
    public func proof(nonce: [UInt8]) throws -> String {
        let hasher = MessageDigest(.sha1)
        hasher.update([UInt8(nonce.count)] + nonce)
        while let chunk = try read(64 * 1024) { hasher.update(chunk) }
        return "sha1-" + Data(hasher.finalize()).base64EncodedString()
    }
}

