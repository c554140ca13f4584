import BLIPReplication
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Logging

/// Fetching: one ranged GET (or the whole body, where the server ignores ranges) per
/// run of missing chunks, each run on the remote's work pool.
extension DeferredBody {
    func run(_ fetch: ChunkFetch) {
        var failure: (any Error)?
        do {
            if let stored = try owner.database.storedBody(digest: attachment.digest) {
                // Another process (or document) brought the body meanwhile.
                condition.withLock { blob = stored }
            } else if owner.remote.isBLIP {
                try transferOverBLIP(fetch)
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
        // Saved before the fetch counts as ended: a waiter may exit the process right after. A map
        // that cannot be saved costs only the record of what arrived (fetched again later).
        do { try condition.withLock { partial }.save(atMostEvery: 1) } catch {
            owner.log.warning("\(docID)/\(attachment.name): what arrived is not recorded, it will be fetched again: \(error)")
        }
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
    func transfer(_ fetch: ChunkFetch, client: HTTPClient) throws {
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

    /// From a Couchbase Lite endpoint, which has no ranges: `getAttachment` sends the whole
    /// body, streamed into the partial body as it arrives (readers waiting on its first bytes
    /// get them first) and checked against its SHA-1 digest when complete (the install).
    func transferOverBLIP(_ fetch: ChunkFetch) throws {
        let (source, stopped) = condition.withLock { () -> (PartialBody, Bool) in
            wholeOnly = true
            fetch.next = 0
            fetch.end = partial.chunkCount
            return (partial, fetch.stop)
        }
        guard !stopped else { throw ReplicationError.cancelled }
        let stream = IncomingChunks(body: source, fetch: fetch, from: 0, decoder: nil, md5: nil, room: owner.room)
        let (remote, database, caFile, log) = (owner.remote, owner.database, owner.caFile, owner.log)
        let (digest, docID) = (attachment.digest, self.docID)
        try Replicator.waitFor {
            let engine = try await Replicator.connect(remote, caFile: caFile, database: database, active: .init(watchOnly: true), log: log)
            do {
                try await engine.streamBody(digest: digest, docID: docID) { [self] bytes in
                    if condition.withLock({ fetch.stop }) { throw ReplicationError.cancelled }
                    try bytes.withUnsafeBytes { raw in
                        try stream.receive(raw) { [self] arrived in
                            let wake = condition.withLock { () -> Bool in
                                fetch.next = max(fetch.next, arrived)
                                return waiting > 0
                            }
                            if wake { condition.broadcast() }
                        }
                    }
                }
                await engine.close("body fetched")
            } catch let error as BLIPSyncError {
                await engine.close("body not fetched: \(error)")
                throw Replicator.replicationError(error, url: remote.url)
            } catch {
                await engine.close("body not fetched: \(error)")
                throw error
            }
        }
        guard condition.withLock({ fetch.next >= fetch.end }) else {
            throw ReplicationError.network("\(attachment.name): the body ended at byte \(stream.position) of \(attachment.length)")
        }
    }

    /// An answer tagged with another body's digest is another body: what is here is dropped.
    func checkTag(_ tag: String?, fetch: ChunkFetch) throws {
        guard let tag, tag.hasPrefix("\""), let dash = attachment.digest.firstIndex(of: "-") else { return }
        let expected = "\"\(attachment.digest[attachment.digest.index(after: dash)...])\""
        guard tag != expected else { return }
        condition.withLock { resetPartial(keeping: fetch) }
        throw ReplicationError.protocolError("\(attachment.name): the body the server sends (ETag \(tag)) does not match its digest "
                                             + "\(attachment.digest); what arrived of it is dropped")
    }

    /// Drops the partial body and starts an empty one: other fetches stop (they write into the
    /// old one), `current` starts its range again. Under `condition`.
    func resetPartial(keeping current: ChunkFetch? = nil) {
        partial.discard()
        do {
            partial = try PartialBody(store: owner.database.blobs, digest: attachment.digest, length: attachment.length)
        } catch {
            // The old file is gone from its name; its map says nothing is here, so nothing wrong is read.
            owner.log.error("\(docID)/\(attachment.name): cannot start the body again: \(error)")
        }
        for fetch in fetches where fetch !== current { fetch.stop = true }
        if let current { current.next = current.start }
    }
}
