import DocumentModel
import DocumentStore
import Foundation

/// CouchDB's `_replicator` database: a document `{"source": …, "target": …, "continuous": …,
/// "create_target": …, "doc_ids": […], "selector": {…}}` starts the replication it describes
/// (one side a database of this server, as `POST /_replicate`); changing or deleting it stops
/// that replication. A one-shot replication writes its end into the document, as CouchDB 3
/// does: `_replication_state` `completed` with `_replication_stats`, or `failed` with
/// `_replication_state_reason`; documents in either state are left alone. Running ones are
/// listed by `/_active_tasks` and `/_scheduler/jobs`, every one by `/_scheduler/docs`.
extension CouchServer {
    static let replicatorDatabase = "_replicator"
    /// CouchDB's third system database, made by its setup (and by client suites' fixtures).
    static let globalChangesDatabase = "_global_changes"

    /// Follows `_replicator`'s changes until the task is cancelled (when the server stops):
    /// woken by its commits, and by databases being created or deleted while it is absent.
    func runReplicatorDatabase() async {
        guard let replicator = configuration.replicator else { return }
        var since: Int64 = 0
        var following: Database?
        while !Task.isCancelled {
            let names = registry.namesChanged.current
            guard registry.path(of: CouchServer.replicatorDatabase) != nil else {
                await registry.namesChanged.next(after: names)
                continue
            }
            let db: Database
            do {
                db = try await database(CouchServer.replicatorDatabase)
            } catch {
                log.error("_replicator cannot be opened (its jobs wait until it is made again): \(error)")
                await registry.namesChanged.next(after: names)
                continue
            }
            // A new `_replicator` (deleted and made again) numbers its changes from 1.
            if following !== db { since = 0 }
            following = db
            let after = since
            do {
                let (position, changes) = try await blocking { (db.changeStream.current, try db.changes(since: after)) }
                for change in changes {
                    since = change.sequence
                    await reconcile(change.docID, db, replicator)
                }
                await db.changeStream.next(after: position)
            } catch {
                // A read that failed (a full disk, a locked file) is tried again at the next commit.
                log.warning("_replicator: \(error)")
                await db.changeStream.next(after: db.changeStream.current)
            }
        }
        for (_, running) in replications.all where running.docID != nil { running.job.cancel() }
    }

    private static func jobKey(_ docID: String) -> String { "\(replicatorDatabase)/\(docID)" }

    private func reconcile(_ docID: String, _ db: Database, _ replicator: @escaping @Sendable (ReplicationRequest) throws -> any ReplicationJob) async {
        guard !DocumentID.isDesign(docID) else { return }
        let key = CouchServer.jobKey(docID)
        let revision: Revision?
        do {
            revision = try await blocking { try db.document(withID: docID) }
        } catch {
            // Not "deleted": a job keeps running (or stays stopped) until its document can be read.
            log.error("_replicator/\(docID) cannot be read: \(error)")
            return
        }
        if let running = replications.entry(key) {
            if running.rev == revision?.revID { return }
            _ = replications.remove(key)
            running.job.cancel()
        }
        guard let revision, !revision.deleted else { return }
        let state = revision.properties["_replication_state"]?.stringValue
        guard state != "completed", state != "failed" else { return }
        let body = revision.properties
        let job: any ReplicationJob
        do {
            job = try await startReplication(body, using: replicator)
        } catch {
            let reason = (error as? HTTPError)?.reason ?? "\(error)"
            log.warning("_replicator/\(docID): \(reason)")
            await record(["_replication_state": "failed", "_replication_state_reason": .string(reason)], in: db, docID, from: revision.revID)
            return
        }
        // For the status list only: the job itself was made from the same endpoints above.
        let source = (try? CouchServer.endpoint("source", body)).map(redacted) ?? ""
        let target = (try? CouchServer.endpoint("target", body)).map(redacted) ?? ""
        _ = replications.add(key, .init(job: job, source: source, target: target, started: Date(), docID: docID, rev: revision.revID))
        guard body["continuous"]?.boolValue != true else { return }
        Task {
            var fields: JSONObject
            do {
                let outcome = try await blocking { try job.wait() }
                fields = ["_replication_state": "completed", "_replication_stats": .object(outcome)]
            } catch {
                fields = ["_replication_state": "failed", "_replication_state_reason": .string("\(error)")]
            }
            // Only if the document still describes this replication (it was not changed meanwhile).
            guard replications.entry(key)?.rev == revision.revID else { return }
            _ = replications.remove(key)
            await record(fields, in: db, docID, from: revision.revID)
        }
    }

    /// Writes a replication's state into its document (a new revision; none if it changed meanwhile).
    private func record(_ fields: JSONObject, in db: Database, _ docID: String, from rev: RevisionID) async {
        var fields = fields
        fields["_replication_state_time"] = .string(ISO8601DateFormatter().string(from: Date()))
        let state = fields
        do {
            _ = try await blocking {
                var draft = try db.newRevision(of: docID, from: rev)
                for (key, value) in state { draft.properties[key] = value }
                return try db.save(draft)
            }
        } catch {
            log.info("_replicator/\(docID) changed before its state was written: \(error)")
        }
    }

    /// `GET /_scheduler/docs`: every `_replicator` document and the state of its replication.
    func schedulerDocs(_ request: Request) async throws {
        guard request.method == .GET || request.method == .HEAD else { throw HTTPError.methodNotAllowed }
        var docs: [JSONValue] = []
        if registry.path(of: CouchServer.replicatorDatabase) != nil {
            let db = try await database(CouchServer.replicatorDatabase)
            let revisions = try await blocking { () -> [Revision] in
                try db.documents().filter { !DocumentID.isDesign($0.docID) }.compactMap { try db.document(withID: $0.docID) }
            }
            for revision in revisions where !revision.deleted {
                let properties = revision.properties
                let running = replications.entry(CouchServer.jobKey(revision.docID))
                let state = running != nil ? "running" : properties["_replication_state"]?.stringValue ?? "pending"
                // A document whose endpoints cannot be read shows them empty, as its state says why.
                var doc: JSONObject = ["database": .string(CouchServer.replicatorDatabase), "doc_id": .string(revision.docID),
                                       "id": .null, "node": "sofa", "state": .string(state), "error_count": 0,
                                       "source": .string((try? CouchServer.endpoint("source", properties)).map(redacted) ?? ""),
                                       "target": .string((try? CouchServer.endpoint("target", properties)).map(redacted) ?? "")]
                if let running { doc["info"] = .object(running.job.progress) } else {
                    doc["info"] = properties["_replication_stats"] ?? properties["_replication_state_reason"].map { ["error": $0] } ?? .null
                }
                docs.append(.object(doc))
            }
        }
        try await request.response.sendJSON(.ok, ["total_rows": .integer(Int64(docs.count)), "offset": 0, "docs": .array(docs)])
    }
}
