import DocumentModel
import DocumentStore
import Foundation

/// What `GET /_db_updates` lists: each database's last `created`, `updated` and `deleted`
/// event, in the order they last happened, as CouchDB's `_global_changes` keeps them (one
/// entry per database and kind, so the list grows with the number of databases, not with
/// their writes).
///
/// A database's writes are counted through its change stream (`ChangeStream.observe`), so
/// every write made through this server is seen, whichever endpoint made it; writes of other
/// processes are seen once this server has the database open and learns of them. The list
/// lives in memory: sequences start after the time the server started (in microseconds), so
/// a `since` from before a restart is below every new one and a client that follows the feed
/// across a restart is given every event since it (events from before it are gone).
final class DatabaseUpdates: @unchecked Sendable {
    enum Kind: String { case created, updated, deleted }

    struct Event {
        let sequence: Int64
        let database: String
        let kind: Kind

        var row: JSONValue {
            ["db_name": .string(database), "type": .string(kind.rawValue), "seq": .string(String(sequence))]
        }
    }

    // Sendable invariant: `latest` and `last` are guarded by `lock`.
    private let lock = NSLock()
    private var latest: [String: Event] = [:]
    private var last: Int64
    /// Published at each event: feeds wait on it.
    let stream = ChangeStream()

    init() {
        last = Int64(Date().timeIntervalSince1970 * 1_000_000)
    }

    var lastSequence: Int64 { lock.withLock { last } }

    func record(_ database: String, _ kind: Kind) {
        lock.withLock {
            last += 1
            latest["\(kind.rawValue):\(database)"] = Event(sequence: last, database: database, kind: kind)
        }
        stream.publish()
    }

    /// Counts the writes of `database` (named `name`) as `updated` events, from now on.
    func follow(_ database: Database, as name: String) {
        database.changeStream.observe { [weak self] documents in
            if documents { self?.record(name, .updated) }
        }
    }

    /// Events after `since`, oldest first, at most `limit`.
    func events(after since: Int64, limit: Int = .max) -> [Event] {
        let found = lock.withLock { latest.values.filter { $0.sequence > since } }
        return Array(found.sorted { $0.sequence < $1.sequence }.prefix(limit))
    }
}

extension CouchServer {
    /// `GET /_db_updates` (server admins): `feed=normal` (default), `longpoll`, `continuous`
    /// or `eventsource`, with `since` (a sequence or `now`), `limit`, `timeout` and
    /// `heartbeat` in milliseconds, laid out as CouchDB's.
    func databaseUpdates(_ request: Request) async throws {
        guard request.method == .GET else { throw HTTPError.methodNotAllowed }
        let updates = registry.updates
        let feed = request.query("feed") ?? "normal"
        guard ["normal", "longpoll", "continuous", "eventsource"].contains(feed) else {
            throw HTTPError.badRequest("Supported `feed` types: normal, continuous, longpoll, eventsource")
        }
        var since: Int64 = 0
        if let given = request.query("since") {
            if given == "now" {
                since = updates.lastSequence
            } else {
                // CouchDB's sequences are `N-…`; Sofa's are `N`, and the number is what counts.
                guard let number = Int64(given.split(separator: "-", maxSplits: 1).first ?? ""), number >= 0 else {
                    throw HTTPError.badRequest("Invalid `since` parameter: \(given)")
                }
                since = number
            }
        }
        let limit = try request.intQuery("limit") ?? .max
        guard limit >= 0 else { throw HTTPError.badRequest("`limit` must be a positive integer") }
        let heartbeat = request.query("heartbeat").flatMap { $0 == "true" ? 60 : Double($0).map { max($0, 50) / 1000 } }
        let timeout = request.query("timeout").flatMap(Double.init).map { min($0 / 1000, ServerTuning.maximumFeedTimeout) }
            ?? ServerTuning.defaultFeedTimeout
        let response = request.response
        let stream = updates.stream

        switch feed {
        case "normal", "longpoll":
            try await response.start(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"])
            try await response.write("{\"results\":[\n")
            var events: [DatabaseUpdates.Event] = []
            let deadline = ContinuousClock.now + .seconds(timeout)
            var lastBeat = ContinuousClock.now
            while true {
                let position = stream.current
                events = updates.events(after: since, limit: limit)
                if feed == "normal" || !events.isEmpty || limit == 0 || ContinuousClock.now >= deadline { break }
                if let heartbeat, ContinuousClock.now - lastBeat >= .seconds(heartbeat) {
                    try await response.write("\n")
                    lastBeat = ContinuousClock.now
                }
                await stream.next(after: position, until: [deadline, heartbeat.map { lastBeat + .seconds($0) }].compactMap { $0 }.min())
            }
            let rows = events.map { String(decoding: $0.row.serialized(), as: UTF8.self) }.joined(separator: ",\n")
            let lastSeq = events.last?.sequence ?? max(since, 0)
            try await response.write(rows + "\n],\n\"last_seq\":\"\(lastSeq)\"}\n")
            try await response.finish()
        default:
            let eventSource = feed == "eventsource"
            try await response.start(.ok, headers: ["Content-Type": eventSource ? "text/event-stream" : "application/json",
                                                    "Cache-Control": "no-cache"])
            var sent = 0
            var lastActivity = ContinuousClock.now
            var lastBeat = ContinuousClock.now
            while sent < limit {
                let position = stream.current
                let events = updates.events(after: since, limit: limit - sent)
                for event in events {
                    let row = String(decoding: event.row.serialized(), as: UTF8.self)
                    try await response.write(eventSource ? "data: \(row)\nid: \(event.sequence)\n\n" : row + "\n")
                    since = event.sequence
                }
                sent += events.count
                if !events.isEmpty { lastActivity = .now }
                if sent >= limit { break }
                let now = ContinuousClock.now
                if heartbeat == nil, now - lastActivity >= .seconds(timeout) { break }
                if let heartbeat, now - lastBeat >= .seconds(heartbeat) {
                    try await response.write("\n")
                    lastBeat = now
                }
                let wakeAt = [heartbeat == nil ? lastActivity + .seconds(timeout) : nil, heartbeat.map { lastBeat + .seconds($0) }]
                await stream.next(after: position, until: wakeAt.compactMap { $0 }.min())
            }
            if !eventSource { try await response.write("{\"last_seq\":\"\(since)\"}\n") }
            try await response.finish()
        }
    }
}
