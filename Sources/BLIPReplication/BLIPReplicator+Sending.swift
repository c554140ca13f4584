import BLIP
import DocumentModel
import DocumentStore
import Foundation

/// Sending this database's revisions, in both roles: a server answering a pull (`changes`
/// with sequences, then the revisions wanted) and a client pushing (`proposeChanges`, then the
/// revisions wanted). At most `BLIPTuning.revsInFlight` `rev` messages wait for an answer.
extension BLIPReplicator {
    /// One change to offer. `coverOnly`: a change an active-only pull filtered out, offered only
    /// so that the client's checkpoint covers its sequence; asked for, it is answered `norev`.
    struct Offered: Sendable {
        let change: Change
        var coverOnly = false
    }

    /// What became of an offered change.
    enum Outcome: Sendable {
        case sent
        case notWanted
        case failed(DocumentFailure)
    }

    /// Offers `changes` (as a server: `changes`; as a client: `proposeChanges`) and sends each
    /// revision wanted; returns each change's outcome, in order.
    /// Revisions read already, by `Loaded.key(docID, revID)`, with their ancestors (parent first).
    typealias Loaded = [String: (Revision, [RevisionID])]

    static func key(_ docID: String, _ revID: RevisionID) -> String { docID + "\u{0}" + revID.description }

    /// Reads the revisions of `changes` in one snapshot (one trip to the storage pool); those
    /// replaced since the changes were read are not there (the newer change is sent too).
    func load(_ changes: [Change]) async throws -> Loaded {
        let db = database
        return try await pool.run { () -> Loaded in
            var found: Loaded = [:]
            for (revision, ancestors) in try db.revisionsWithHistory(changes.map { ($0.docID, $0.revID) }) {
                found[BLIPReplicator.key(revision.docID, revision.revID)] = (revision, ancestors)
            }
            return found
        }
    }

    /// `preloaded`: the revisions of `changes`, read before they were offered (else read here).
    func send(_ changes: [Offered], preloaded: Loaded? = nil) async throws -> [Outcome] {
        guard !changes.isEmpty else { return [] }
        let proposing = !isPassive
        // A client proposes each revision with its parent: the revisions are read first, once.
        var preloaded = preloaded
        if proposing, preloaded == nil { preloaded = try await load(changes.map(\.change)) }
        var outcomes = [Outcome](repeating: .notWanted, count: changes.count)
        // Which are wanted, and the revisions the other side says it has of each.
        var wanted: [(index: Int, known: Set<String>)] = []
        var maxHistory = Int.max
        if proposing {
            let parents = changes.map { preloaded?[BLIPReplicator.key($0.change.docID, $0.change.revID)]?.1.first }
            let items: [JSONValue] = zip(changes, parents).map { offered, parent in
                var item: [JSONValue] = [.string(offered.change.docID), .string(offered.change.revID.description)]
                if let parent { item.append(.string(parent.description)) }
                return .array(item)
            }
            let reply = try await request("proposeChanges", [("conflictIncludesRev", "true")], body: JSONValue.array(items).serialized())
            let statuses = try Self.answers(reply, "proposeChanges")
            for (index, offered) in changes.enumerated() {
                let answer = index < statuses.count ? statuses[index] : .integer(0)
                let status = answer.int64Value ?? answer["status"]?.int64Value ?? (answer == .null ? 0 : -1)
                switch status {
                case 0: wanted.append((index, Set(parents[index].map { [$0.description] } ?? [])))
                case 304: outcomes[index] = .notWanted
                case 409:
                    outcomes[index] = try await conflict(offered.change, serverRev: answer["rev"]?.stringValue)
                default:
                    outcomes[index] = .failed(DocumentFailure(docID: offered.change.docID, rev: offered.change.revID.description,
                                                              error: Self.failureName(Int(status)),
                                                              reason: "the server refused it (\(answer.jsonString()))"))
                }
            }
        } else {
            let items: [JSONValue] = changes.map { offered in
                var item: [JSONValue] = [.integer(offered.change.sequence), .string(offered.change.docID), .string(offered.change.revID.description)]
                if offered.change.deleted { item.append(true) }
                return .array(item)
            }
            let reply = try await request("changes", body: JSONValue.array(items).serialized())
            maxHistory = Int(reply["maxHistory"] ?? "").map { max(1, $0) } ?? Int.max
            let answers = try Self.answers(reply, "changes")
            for (index, answer) in answers.enumerated() where index < changes.count {
                switch answer {
                case .array(let known): wanted.append((index, Set(known.compactMap(\.stringValue))))
                case .integer, .null: continue  // 0: it has it; a status: it will not take it (its conflict, its rules)
                default: throw BLIPSyncError.protocolViolation("the answer to changes has an entry that is neither revisions nor a status: \(answer.jsonString())")
                }
            }
        }
        // The revisions wanted, read in one go (unless they were before the offer).
        let read: Loaded
        if let preloaded { read = preloaded } else { read = try await load(wanted.filter { !changes[$0.index].coverOnly }.map { changes[$0.index].change }) }
        // Then sent, a window of them at a time.
        let historyLimit = maxHistory
        try await withThrowingTaskGroup(of: (Int, Outcome).self) { group in
            var next = 0
            func start() {
                let (index, known) = wanted[next]
                next += 1
                let loaded = read[BLIPReplicator.key(changes[index].change.docID, changes[index].change.revID)]
                group.addTask { (index, try await self.sendRevision(changes[index], loaded, known: known, maxHistory: historyLimit)) }
            }
            while next < wanted.count && next < BLIPTuning.revsInFlight { start() }
            while let (index, outcome) = try await group.next() {
                outcomes[index] = outcome
                if next < wanted.count { start() }
            }
        }
        return outcomes
    }

    /// The answer to `changes`/`proposeChanges`: a JSON array (empty: nothing wanted or all taken).
    private static func answers(_ reply: BLIPMessage, _ profile: String) throws -> [JSONValue] {
        guard !reply.body.isEmpty else { return [] }
        let answer = try json(reply, "the answer to \(profile)")
        guard let entries = answer == .null ? [] : answer.arrayValue else {
            throw BLIPSyncError.protocolViolation("the answer to \(profile) is not a JSON array")
        }
        return entries
    }

    /// `loaded`: the revision and its ancestors (parent first), or nil when it is no longer here.
    private func sendRevision(_ offered: Offered, _ loaded: (Revision, [RevisionID])?, known: Set<String>,
                              maxHistory: Int) async throws -> Outcome {
        let change = offered.change
        let sequence = String(change.sequence)
        guard !offered.coverOnly else {
            // (No reply wanted, as the protocol says of `norev`.)
            await connection.send("norev", properties: [("id", change.docID), ("rev", change.revID.description), ("sequence", sequence),
                                                        ("error", "404"), ("reason", "a deletion: the pull asked for active documents only")])
            return .sent
        }
        guard let (revision, ancestors) = loaded else {
            if isPassive {
                await connection.send("norev", properties: [("id", change.docID), ("rev", change.revID.description), ("sequence", sequence),
                                                            ("error", "404"), ("reason", "the revision is no longer here")])
            }
            return .notWanted
        }
        if !isPassive, let absent = revision.attachments.first(where: { !$0.contentAvailable }) {
            // The server would ask for a body this side cannot give: said as an HTTP push says it.
            return .failed(DocumentFailure(docID: change.docID, rev: change.revID.description, error: "body_not_here",
                                           reason: "the body of attachment \(absent.name) was never downloaded here (sofa download fetches it)"))
        }
        // The history stops at the first revision the other side has, or at its limit.
        var history: [RevisionID] = []
        for ancestor in ancestors.prefix(max(0, maxHistory - 1)) {
            history.append(ancestor)
            if known.contains(ancestor.description) { break }
        }
        let message = RevMessage.encode(docID: change.docID, revID: change.revID, deleted: revision.deleted,
                                        properties: revision.properties, attachments: revision.attachments, history: history,
                                        sequence: isPassive ? change.sequence : nil,
                                        extra: isPassive ? [] : [("noconflicts", "true")])
        do {
            _ = try await request("rev", message.properties, body: message.body)
            return .sent
        } catch BLIPSyncError.refused(let error) {
            let reason = error.message.isEmpty ? "the other side answered \(error.domain) \(error.code) without a reason" : error.message
            if isPassive { log.info("\(name): the client refused \(change.docID) \(change.revID): \(reason)") }
            return .failed(DocumentFailure(docID: change.docID, rev: change.revID.description, error: Self.failureName(error.code), reason: reason))
        }
    }

    /// A proposal the server refused as a conflict: its current revision is `serverRev`. When
    /// that revision is here and its branch was resolved here (it is no longer a live leaf), the
    /// resolution is moved onto it as a new revision, which the server takes, and that one is
    /// sent; otherwise the conflict is this document's failure: pull, resolve, push again.
    private func conflict(_ change: Change, serverRev: String?) async throws -> Outcome {
        let refused = DocumentFailure(docID: change.docID, rev: change.revID.description, error: "conflict",
                                      reason: "the server has \(serverRev ?? "another revision"): pull, resolve the conflict, push again")
        guard let serverRev, let branch = RevisionID(serverRev) else { return .failed(refused) }
        let db = database
        guard let rebased = try await pool.run({ try db.resolution(of: change.docID, onto: branch) }) else { return .failed(refused) }
        log.info("\(name): \(change.docID): the resolution \(change.revID) is sent as \(rebased.revID), on the server's \(branch)")
        let outcome = try await send([Offered(change: Change(docID: change.docID, revID: rebased.revID, deleted: rebased.deleted,
                                                              sequence: rebased.sequence))])
        return outcome.first ?? .failed(refused)
    }
}
