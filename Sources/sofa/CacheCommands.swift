import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation
import Replicator

struct Pin: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep attachment bodies on this machine: the cache never evicts them, and those not here are downloaded now.",
        discussion: "In a mount: setfattr -n user.sofa.pinned -v true FILE (getfattr shows it; -v false or -x unpins).")

    @Argument(help: "The database.", completion: .directory) var database: String
    @Argument(help: "The document.") var id: String
    @Argument(help: "Only these attachments of it (default: all).") var names: [String] = []
    @Option(help: "Where to download bodies from (default: where the database last pulled from).") var remote: String?
    @OptionGroup var connection: ConnectionOptions
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let db = try Database.open(at: database)
        let attachments = try chosenAttachments(db, id: id, names: names)
        for attachment in attachments { try db.setPinned(true, digest: attachment.digest) }
        let missing = attachments.filter { !$0.contentAvailable }
        guard !missing.isEmpty else {
            Output.line("pinned \(counted(attachments.count, "attachment", "attachments")) of \(id)")
            return
        }
        guard let url = try remote ?? db.rememberedRemote else {
            throw SofaError.invalidArgument("pinned, but \(counted(missing.count, "body is", "bodies are")) not here and no remote is known "
                                            + "for \(database): give --remote URL, or run sofa download later")
        }
        let downloader = RemoteBodies(database: db, remote: try connection.remote(url), retry: connection.retryPolicy,
                                      caFile: connection.cacert)
        let signals = SignalWatcher([SIGINT, SIGTERM])
        defer { signals.cancel() }
        signals.onSignal { downloader.cancel() }
        let terminal = Verbosity.showsProgress
        let meter = TransferMeter()
        var bytes: Int64 = 0
        do {
            for attachment in missing {
                bytes += try downloader.downloadMissing(docID: id, name: attachment.name, bodyProgress: { body in
                    if terminal { Output.write(STDERR_FILENO, "\r\u{1B}[K" + meter.line(body)) }
                }).bytes
            }
        } catch {
            if terminal { Output.write(STDERR_FILENO, "\n") }
            throw SofaError.invalidArgument("pinned, but the download failed: \(error); sofa download resumes it")
        }
        if terminal { Output.write(STDERR_FILENO, "\r\u{1B}[K") }
        Output.line("pinned \(counted(attachments.count, "attachment", "attachments")) of \(id); downloaded "
                    + "\(counted(missing.count, "body", "bodies")) (\(formatBytes(bytes)))")
    }
}

struct Unpin: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Let the cache evict attachment bodies again (those fetched from the remote, when it needs room).")

    @Argument(help: "The database.", completion: .directory) var database: String
    @Argument(help: "The document.") var id: String
    @Argument(help: "Only these attachments of it (default: all).") var names: [String] = []
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let db = try Database.open(at: database)
        let attachments = try chosenAttachments(db, id: id, names: names)
        for attachment in attachments { try db.setPinned(false, digest: attachment.digest) }
        Output.line("unpinned \(counted(attachments.count, "attachment", "attachments")) of \(id)")
    }
}

/// The attachments of `id`'s current revision named in `names` (all if none), or a clear error.
private func chosenAttachments(_ db: Database, id: String, names: [String]) throws -> [Attachment] {
    guard let document = try db.document(withID: id), !document.deleted else { throw SofaError.documentNotFound(id) }
    guard !names.isEmpty else {
        guard !document.attachments.isEmpty else { throw SofaError.invalidArgument("\(id) has no attachments") }
        return document.attachments
    }
    return try names.map { name in
        guard let attachment = document.attachment(named: name) else { throw SofaError.attachmentNotFound(docID: id, name: name) }
        return attachment
    }
}

struct Cache: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show or limit the disk used by attachment bodies fetched from the remote.",
        discussion: """
            Bodies read through a mount or sofa serve, or fetched by sofa download, can be fetched again. With a limit, \
            the least recently read of them go back to deferred to make room (their metadata stays; the next read \
            fetches them again), after a check that the remote still has them. Pinned bodies (sofa pin), bodies a pull \
            downloaded by its download rules, and bodies saved here are never evicted.
            """)

    @Argument(help: "The database.", completion: .directory) var database: String
    @Option(help: "Set the limit (e.g. 500M, 2G), or \"none\"; evicts at once down to it.") var limit: String?
    @Flag(help: "Evict down to the limit now.") var trim = false
    @Option(help: "The remote that must still have a body before it is evicted (default: where the database last pulled from).")
    var remote: String?
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }
    @OptionGroup var connection: ConnectionOptions

    func execute() throws {
        let db = try Database.open(at: database)
        if let limit {
            if limit.lowercased() == "none" {
                try db.setCacheLimit(nil)
            } else {
                guard let bytes = parseSize(limit), bytes >= 0 else {
                    throw SofaError.invalidArgument("--limit: \(limit) is not a size (e.g. 500M, 2G) or none")
                }
                try db.setCacheLimit(bytes)
            }
        }
        var trimmed: CacheTrim?
        if (trim || limit != nil), try db.cacheLimit() != nil {
            guard let url = try remote ?? db.rememberedRemote else {
                throw SofaError.invalidArgument("no remote known for \(database) to fetch evicted bodies from: give --remote URL")
            }
            let bodies = RemoteBodies(database: db, remote: try connection.remote(url), retry: connection.retryPolicy,
                                      caFile: connection.cacert)
            trimmed = try bodies.trimCache()
        }
        let use = try db.cacheUse()
        if json {
            var object = cacheJSON(use)
            if let trimmed {
                object["evicted"] = .integer(Int64(trimmed.bodiesEvicted))
                object["partials_dropped"] = .integer(Int64(trimmed.partialsDropped))
                object["bytes_freed"] = .integer(trimmed.bytesFreed)
            }
            Output.json(.object(object))
            return
        }
        if let trimmed {
            Output.line("evicted \(counted(trimmed.bodiesEvicted, "body", "bodies")) and dropped "
                        + "\(counted(trimmed.partialsDropped, "partial body", "partial bodies")): \(formatBytes(trimmed.bytesFreed)) freed")
        }
        Output.line(cacheLines(use))
    }
}

func cacheJSON(_ use: CacheUse) -> JSONObject {
    ["limit": use.limit.map(JSONValue.integer) ?? .null, "used_bytes": .integer(use.used),
     "cached_bodies": .integer(Int64(use.cachedCount)), "cached_bytes": .integer(use.cachedBytes),
     "partial_bodies": .integer(Int64(use.partialCount)), "partial_bytes": .integer(use.partialBytes),
     "pinned_bodies": .integer(Int64(use.pinnedCount)), "pinned_bytes": .integer(use.pinnedBytes),
     "pinned_not_present": .integer(Int64(use.pinnedMissing))]
}

func cacheLines(_ use: CacheUse) -> String {
    var lines = ["Cache:         \(formatBytes(use.used)) of \(use.limit.map(formatBytes) ?? "no limit")"
                 + " (\(counted(use.cachedCount, "fetched body", "fetched bodies")), \(counted(use.partialCount, "partial", "partial")))"]
    if use.pinnedCount + use.pinnedMissing > 0 {
        lines.append("Pinned:        \(counted(use.pinnedCount, "body", "bodies")) (\(formatBytes(use.pinnedBytes)))"
                     + (use.pinnedMissing > 0 ? ", \(use.pinnedMissing) not downloaded yet" : ""))
    }
    return lines.joined(separator: "\n")
}
