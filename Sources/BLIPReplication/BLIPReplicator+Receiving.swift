import BLIP
import DocumentModel
import DocumentStore

/// Taking revisions from the other side, in both roles: a server taking a client's push
/// (`proposeChanges` or `changes`, then `rev`), a client taking the changes it subscribed to.
/// The same steps either way: answer which revisions are wanted, gather each one's bodies (here
/// already, asked for with `getAttachment`, or on a client left on the server when its download
/// rules say so), save it through the `Inserter`, answer the `rev`.
extension BLIPReplicator {
    /// Called for each request in the order the other side sent it (see `BLIPConnection`).
    func arrived(_ message: BLIPMessage) {
        if !isPassive, message.profile == "changes" { pull.reserve(message.number) }
    }

    func receiveChanges(_ message: BLIPMessage) async throws {
        let profile = message.profile ?? "changes"
        let body = try Self.json(message, profile)
        guard let items = body == .null ? [] : body.arrayValue else {
            throw BLIPSyncError.protocolViolation("\(profile): the body is not a JSON array")
        }
        switch role {
        case .passive(let passive):
            guard !items.isEmpty else { return await connection.reply(to: message, body: Array("[]".utf8)) }
            if passive.readOnly { throw BLIPError(code: 403, message: "this server is read-only") }
            let answer = profile == "proposeChanges"
                ? try await answerProposals(items, conflictIncludesRev: message.flag("conflictIncludesRev"))
                : try await answerChanges(items).map(\.answer)
            await connection.reply(to: message, body: JSONValue.array(Self.trimmed(answer)).serialized())
        case .active(let active):
            guard profile == "changes" else { throw BLIPError(domain: "BLIP", code: 404, message: "\(profile) is answered by a server") }
            guard !items.isEmpty else {
                pull.read(message.number, [])
                pull.caughtUp()
                return await connection.reply(to: message, body: Array("[]".utf8))
            }
            if active.watchOnly {
                pull.read(message.number, items.map { (($0.arrayValue?.first ?? .null), "", "", false) })
                return await connection.reply(to: message, body: Array("[]".utf8))
            }
            let answers = try await answerChanges(items)
            pull.read(message.number, answers.map { ($0.sequence, $0.docID, $0.rev.description, $0.answer != .integer(0)) })
            await connection.reply(to: message, properties: [("maxHistory", "20"), ("blobs", "true")],
                                   body: JSONValue.array(Self.trimmed(answers.map(\.answer))).serialized())
        }
    }

    /// `changes`: `[[sequence, docID, revID, deleted?, size?], …]`; the answer names, for each,
    /// the revisions here it may follow (it is wanted), or 0 (it is here).
    private func answerChanges(_ items: [JSONValue]) async throws
        -> [(sequence: JSONValue, docID: String, rev: RevisionID, answer: JSONValue)] {
        let asked = try items.map { item -> (JSONValue, String, RevisionID) in
            guard let fields = item.arrayValue, fields.count >= 3, let id = fields[1].stringValue, !id.isEmpty,
                  let rev = fields[2].stringValue.flatMap(RevisionID.init) else {
                throw BLIPSyncError.protocolViolation("changes: an entry is not [sequence, docID, revID, …]: \(item.jsonString())")
            }
            return (fields[0], id, rev)
        }
        let db = database
        return try await pool.run {
            // One question for the whole message (one snapshot); entries keep their own answers
            // even when a document is listed twice.
            let missing = try db.revsDiff(asked.map { ($0.1, [$0.2]) })
            var byRevision: [String: MissingRevisions] = [:]
            for (id, entry) in missing {
                for rev in entry.missing { byRevision[id + "\u{0}" + rev.description] = entry }
            }
            return asked.map { sequence, id, rev in
                guard let entry = byRevision[id + "\u{0}" + rev.description] else { return (sequence, id, rev, .integer(0)) }
                return (sequence, id, rev, .array(entry.possibleAncestors.map { .string($0.description) }))
            }
        }
    }

    /// `proposeChanges`: `[[docID, revID, serverRevID?], …]`, what Couchbase Lite 3 pushes
    /// with. For each, 0 (send it), 304 (it is here) or 409 (it does not follow the current
    /// revision here; with `conflictIncludesRev`, `{"status": 409, "rev": CURRENT}`).
    private func answerProposals(_ items: [JSONValue], conflictIncludesRev: Bool) async throws -> [JSONValue] {
        let asked = try items.map { item -> (String, RevisionID, String) in
            guard let fields = item.arrayValue, fields.count >= 2, let id = fields[0].stringValue, !id.isEmpty,
                  let rev = fields[1].stringValue.flatMap(RevisionID.init) else {
                throw BLIPSyncError.protocolViolation("proposeChanges: an entry is not [docID, revID, …]: \(item.jsonString())")
            }
            return (id, rev, fields.count > 2 ? fields[2].stringValue ?? "" : "")
        }
        let db = database
        return try await pool.run {
            let here = try db.treesAndCurrentRevisions(of: asked.map(\.0))
            return asked.map { id, rev, known -> JSONValue in
                guard let (tree, current, deleted) = here[id] else { return .integer(0) }
                if tree.contains(rev) { return .integer(304) }
                if current.description == known || (deleted && known.isEmpty) { return .integer(0) }
                return conflictIncludesRev ? ["status": 409, "rev": .string(current.description)] : .integer(409)
            }
        }
    }

    /// Trailing zeros may go: the other side reads a missing answer as 0.
    private static func trimmed(_ answer: [JSONValue]) -> [JSONValue] {
        var answer = answer
        while answer.last == .integer(0) { answer.removeLast() }
        return answer
    }

    /// `rev`: one revision with its history; saved once its bodies are here (or, on a client,
    /// left on the server as its download rules say).
    func receiveRevision(_ message: BLIPMessage) async throws {
        let read: RevMessage
        do { read = try RevMessage(body: message.body, property: { message[$0] }) } catch .invalidJSON(let error) {
            throw BLIPSyncError.protocolViolation("rev: the body is not JSON (\(error))")
        } catch {
            throw BLIPSyncError.protocolViolation("\(error)")
        }
        if case .passive(let passive) = role, passive.readOnly { throw BLIPError(code: 403, message: "this server is read-only") }
        if !isPassive { pull.count { $0.revisionsRead += 1 } }
        do {
            let (revision, bodies) = try await withBodies(read)
            _ = try await inserter.insert(revision, noConflicts: isPassive && message.flag("noconflicts"), bodies: bodies)
            if !isPassive {
                pull.count { $0.revisionsWritten += 1 }
                pull.done(read.docID, read.revID.description)
            }
            await connection.reply(to: message)
        } catch {
            if !isPassive {
                let failure = replyError(error)
                pull.failed(DocumentFailure(docID: read.docID, rev: read.revID.description, error: Self.failureName(failure.code),
                                            reason: failure.message))
            }
            throw error
        }
    }

    /// `norev`: the server no longer has a revision it listed (a newer change follows), or
    /// (an active-only pull) will not send it.
    func receiveNoRevision(_ message: BLIPMessage) async {
        if !isPassive, let id = message["id"], let rev = message["rev"] { pull.done(id, rev) }
        await connection.reply(to: message)
    }

    /// The revision as the message names it, each body here: found here already, asked for,
    /// or (a client's pull whose rules leave it there) recorded as on the server.
    /// Returns it with the bodies received for it (not synced yet).
    private func withBodies(_ read: RevMessage) async throws -> (ReplicatedRevision, [BlobKey]) {
        // A blob is a blob whatever `_attachments` says (Couchbase Lite leaves it out when a
        // revision keeps its blobs): its body is needed as much as an attachment's.
        let blobs = (try? Blobs.find(in: read.properties, docID: read.docID, lenient: true)) ?? []
        let named = Set(read.attachments.map(\.digest))
        let unnamedBlobs = blobs.filter { !named.contains($0.key.digestString) }
        guard !read.attachments.isEmpty || !unnamedBlobs.isEmpty else {
            return (ReplicatedRevision(docID: read.docID, revID: read.revID, ancestors: read.history, deleted: read.deleted,
                                       properties: read.properties), [])
        }
        var received: [BlobKey] = []
        let db = database
        let ancestors = try await pool.run { try db.attachmentsForStubs(of: read.docID, ancestors: read.history) }
        var attachments: [Attachment] = []
        for item in read.attachments {
            let metadata = Attachment(name: item.name, contentType: item.contentType, length: item.length ?? -1, digest: item.digest,
                                      blobKey: nil, revpos: item.revpos)
            if let here = try await pool.run({ try db.localBody(for: metadata, ancestorsAttachments: ancestors) }) {
                attachments.append(Attachment(name: item.name, contentType: item.contentType, length: here.blob.length, digest: item.digest,
                                              blobKey: here.blob.key, revpos: item.revpos, contentAvailable: true))
            } else if try await fetches(metadata) {
                let blob = try await fetched(digest: item.digest, docID: read.docID)
                received.append(blob.key)
                attachments.append(Attachment(name: item.name, contentType: item.contentType, length: blob.length, digest: item.digest,
                                              blobKey: blob.key, revpos: item.revpos, contentAvailable: true))
            } else {
                guard item.length != nil else {
                    throw BLIPSyncError.protocolViolation("rev: attachment \(item.name) of \(read.docID) has no length")
                }
                pull.count { $0.bodiesDeferred += 1 }
                attachments.append(metadata)
            }
        }
        for blob in unnamedBlobs where !db.blobs.contains(blob.key) {
            // A body here gets its stand-in row as the revision is saved; one left on the server
            // is named here, by its digest, which `getAttachment` fetches it by.
            let metadata = Attachment(name: blob.standInName, contentType: blob.contentType ?? MIMEType.fallback,
                                      length: blob.length ?? -1, digest: blob.key.digestString, blobKey: nil, revpos: read.revID.generation)
            if try await fetches(metadata) {
                received.append(try await fetched(digest: blob.key.digestString, docID: read.docID).key)
            } else {
                pull.count { $0.bodiesDeferred += 1 }
                attachments.append(metadata)
            }
        }
        return (ReplicatedRevision(docID: read.docID, revID: read.revID, ancestors: read.history, deleted: read.deleted,
                                   properties: read.properties, attachments: attachments), received)
    }

    /// Whether this side fetches a body it lacks now: a server always (a pushed revision is
    /// saved whole), a client as its download rules say.
    private func fetches(_ attachment: Attachment) async throws -> Bool {
        switch role {
        case .passive: true
        case .active(let active): attachment.length < 0 || active.fetchesBody(attachment)
        }
    }

    private func fetched(digest: String, docID: String) async throws -> StoredBlob {
        let blob = try await fetchBody(digest: digest, docID: docID)
        if !isPassive { pull.count { $0.bodiesFetched += 1; $0.bodyBytesFetched += blob.length } }
        return blob
    }

    /// CouchDB's name for a refusal, by its code.
    static func failureName(_ code: Int) -> String {
        switch code {
        case 400: "bad_request"
        case 401: "unauthorized"
        case 403: "forbidden"
        case 404: "not_found"
        case 409: "conflict"
        default: code >= 500 ? "error" : "refused"
        }
    }
}
