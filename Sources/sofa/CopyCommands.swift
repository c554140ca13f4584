import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation
import Replicator

/// The one rule of every command that writes a database or a file where one may be: an
/// existing one is replaced only with --force (export, cp, copy, snapshot alike).
func refuseExisting(_ path: String, force: Bool) throws {
    if !force, access(path, F_OK) == 0 { throw SofaError.invalidArgument("\(path) already exists (--force replaces it)") }
}

/// Opens a database copied from `source`: a database folder or a snapshot zip.
func copyDatabase(from source: String, to destination: String, replacing: Bool) throws -> Database {
    try refuseExisting(destination, force: replacing)
    var info = stat()
    guard stat(source, &info) == 0 else { throw SofaError.notADatabase(path: source, reason: "no such file or directory") }
    if info.st_mode & S_IFMT == S_IFREG {
        var progress = Progress("unpacked")
        defer { progress.finish() }
        return try Database.install(snapshot: source, at: destination, replacing: replacing) { done, total in
            progress.update(bytes: done, of: total)
        }
    }
    return try Database.open(at: source).copy(to: destination, replacing: replacing)
}

/// What `sofa copy` and `sofa cp` say of a copy.
func describeCopy(from source: String, _ copy: Database) throws -> String {
    "copied \(source) to \(copy.path) (new private UUID; remembers \(try copy.previousPrivateUUIDs.count) earlier)"
}

/// What `sofa snapshot` and `sofa cp` say of a snapshot of `database`.
func describeSnapshot(_ report: SnapshotReport, of database: Database) -> String {
    var line = "wrote \(report.path): \(counted(report.documentCount, "document")), \(counted(report.bodyCount, "attachment body", "attachment bodies")) "
        + "(\(formatBytes(report.bodyBytes))), \(formatBytes(report.zipBytes)) zipped"
    if report.bodiesNotPresent > 0 {
        line += "; \(report.bodiesNotPresent) bodies are not in \(database.path) (deferred) and are fetched when read"
    }
    return line
}

struct Copy: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy a database (or a snapshot zip) with a new identity that remembers the old one.",
        discussion: """
            The copy's first pull resumes from the checkpoints the original left, so it fetches only \
            newer changes. A copy of a copy keeps the chain. SRC may be a zip made by `sofa snapshot`: \
            it is unpacked beside DST, checked (CRCs, every body's SHA-1, SQLite's integrity check) and \
            renamed into place.
            """)

    @Argument(help: "The database to copy, or a snapshot .zip.", completion: .file()) var source: String
    @Argument(help: "Where the copy goes (must not exist unless --force).", completion: .file()) var destination: String
    @Flag(help: "Replace an existing database at the destination.") var force = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        Output.line(try describeCopy(from: source, copyDatabase(from: source, to: destination, replacing: force)))
    }
}

struct Snapshot: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write a consistent snapshot of a database into a zip, to ship with an application.",
        discussion: """
            Install it with `sofa copy SNAPSHOT.zip DB` or `sofa mount --seed SNAPSHOT.zip DB MNT --remote URL`: \
            each installed copy gets its own identity and its first pull fetches only what changed since the \
            snapshot. The database may be in use (even mounted) while the snapshot is taken.
            """)

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "The zip file to write.", completion: .file(extensions: ["zip"])) var output: String
    @Flag(help: "Replace an existing file.") var force = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        try refuseExisting(output, force: force)
        let database = try db.open()
        var progress = Progress("snapshot")
        let report = try database.writeSnapshot(to: output, replacing: force) { done, _ in progress.update(bytes: done) }
        progress.finish()
        Output.line(describeSnapshot(report, of: database))
    }
}

struct Cp: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy between a database and another database, a snapshot zip, a server, JSON lines or a folder.",
        discussion: """
            One side is a database (NAME.sofa); the other is picked by its form:
              DB.sofa             a copy with a new identity (as `sofa copy`)
              FILE.zip            a snapshot (as `sofa snapshot`; from a zip, as `sofa copy`)
              http(s)://host/db   push to it, or pull from it (a new DB is created)
              FILE.jsonl          one document per line (as `sofa export` / `sofa import`)
              DIR/                one JSON file per document, attachments beside it in DIR/<id>/
              APP.cblite2         a Couchbase Lite 3 database (a new one, to it): ids, revision ids,
                                  histories, deletions, conflicts and blobs are kept
            """)

    @Argument(help: "What to copy from.", completion: .file()) var source: String
    @Argument(help: "What to copy to.", completion: .file()) var destination: String
    @Flag(help: "Replace an existing database, zip or JSON lines file at the destination.") var force = false
    @Flag(help: "Say what would be copied where (and what replaced); change nothing.") var dryRun = false
    @Flag(help: ArgumentHelp("Encrypt the database cp creates (from a server, JSON lines or a folder).",
                             discussion: "With --key-file PATH (made with a new random key if it does not exist) or --passphrase, as `sofa create --encrypt`."))
    var encrypt = false
    @OptionGroup var remote: RemoteOptions
    @OptionGroup var pulls: PullOptions
    @OptionGroup var pushes: PushOptions
    @OptionGroup var downloads: DownloadOptions

    enum Endpoint {
        case database(String), zip(String), url(String), jsonLines(String), directory(String), couchbaseLite(String), unknown(String)

        var isKnown: Bool {
            if case .unknown = self { return false }
            return true
        }

        var kind: String {
            switch self {
            case .database: "the database"
            case .zip: "the snapshot"
            case .url: "the remote database"
            case .jsonLines: "the JSON lines file"
            case .directory: "the folder"
            case .couchbaseLite: "the Couchbase Lite database"
            case .unknown: "?"
            }
        }

        init(_ text: String) {
            let lower = text.lowercased()
            var isDirectory: ObjCBool = false
            let exists = FileManager.default.fileExists(atPath: text, isDirectory: &isDirectory)
            let isDatabase = exists && isDirectory.boolValue && access("\(text)/db.sqlite3", F_OK) == 0
            if lower.hasPrefix("http://") || lower.hasPrefix("https://") {
                self = .url(text)
            } else if lower.hasSuffix(".zip") {
                self = .zip(text)
            } else if lower.hasSuffix(".jsonl") || lower.hasSuffix(".ndjson") {
                self = .jsonLines(text)
            } else if lower.hasSuffix(".cblite2") || lower.hasSuffix(".cblite2/") || (isDatabase && CouchbaseLiteDatabase.isCouchbaseLite(at: text)) {
                self = .couchbaseLite(text)
            } else if isDatabase || lower.hasSuffix(".sofa") || lower.hasSuffix(".sofa/") {
                self = .database(text)
            } else if text.hasSuffix("/") || (exists && isDirectory.boolValue) {
                self = .directory(text)
            } else {
                self = .unknown(text)
            }
        }
    }
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let (from, to) = (Endpoint(source), Endpoint(destination))
        if dryRun, from.isKnown, to.isKnown {
            let replacing = access(destination, F_OK) == 0 ? (force ? ", replacing what is there" : "; it exists: refused without --force") : ""
            Output.line("would copy \(from.kind) \(source) to \(to.kind) \(destination)\(replacing)")
            return
        }
        if encrypt {
            switch (from, to) {
            case (.url, .database(let to)), (.jsonLines, .database(let to)), (.directory, .database(let to)), (.couchbaseLite, .database(let to)):
                guard access(to, F_OK) != 0 else { throw SofaError.invalidArgument("--encrypt is for a database cp creates: \(to) exists (sofa encrypt encrypts it)") }
            default:
                throw SofaError.invalidArgument(
                    "--encrypt is for a database cp creates from a server, JSON lines or a folder (a copy of a database or snapshot keeps its own key, or none: sofa encrypt encrypts it)")
            }
        }
        switch (from, to) {
        case (.database(let from), .database(let to)), (.zip(let from), .database(let to)):
            Output.line(try describeCopy(from: from, copyDatabase(from: from, to: to, replacing: force)))
        case (.database(let from), .zip(let to)):
            try refuseExisting(to, force: force)
            let database = try Database.open(at: from)
            Output.line(describeSnapshot(try database.writeSnapshot(to: to, replacing: force), of: database))
        case (.url(let url), .database(let to)), (.couchbaseLite(let url), .database(let to)):
            let (database, created) = try openOrCreate(to)
            do {
                let replicator = try remote.makeReplicator(.pull, database: database, url: url, pulls: pulls, pushes: nil)
                replicator.downloads = try downloads.policy(for: database, url: url)
                try report([("pull", try replicate(replicator, json: remote.json))], json: remote.json)
            } catch {
                // A new database that received nothing is removed; one that received some keeps
                // it, and running the same command again resumes from its checkpoint.
                // Unknown whether it holds anything: it stays (the run's error is what is reported).
                if created, (try? database.counts().lastSequence) == 0 { try? FileManager.default.removeItem(atPath: database.path) }
                throw error
            }
        case (.database(let from), .couchbaseLite(let file)):
            guard access(file, F_OK) != 0 else {
                throw SofaError.invalidArgument("\(file) exists: `sofa push \(from) \(file)` adds to it what it lacks")
            }
            let replicator = try remote.makeReplicator(.push, database: try Database.open(at: from), url: file, pulls: nil, pushes: pushes)
            replicator.createTarget = true
            try report([("push", try replicate(replicator, json: remote.json))], json: remote.json)
        case (.database(let from), .url(let url)):
            let replicator = try remote.makeReplicator(.push, database: try Database.open(at: from), url: url, pulls: nil, pushes: pushes)
            try report([("push", try replicate(replicator, json: remote.json))], json: remote.json)
        case (.jsonLines(let file), .database(let to)):
            let count = try importing(into: to) { try JSONLines.import(from: file, into: $0) }
            Output.line("copied \(counted(count, "document")) from \(file) to \(to)")
        case (.database(let from), .jsonLines(let file)):
            try refuseExisting(file, force: force)
            let count = try JSONLines.export(try Database.open(at: from), to: file, attachments: true)
            Output.line("copied \(counted(count, "document")) from \(from) to \(file)")
        case (.directory(let folder), .database(let to)):
            let count = try importing(into: to) { try DocumentDirectory.import(from: folder, into: $0) }
            Output.line("copied \(counted(count, "document")) from \(folder) to \(to)")
        case (.database(let from), .directory(let folder)):
            let summary = try DocumentDirectory.export(try Database.open(at: from), to: folder)
            var line = "copied \(counted(summary.documents, "document")) and \(counted(summary.attachments, "attachment")) from \(from) to \(folder)"
            if summary.bodiesNotPresent > 0 { line += "; \(summary.bodiesNotPresent) attachment bodies were not here (deferred): metadata only" }
            Output.line(line)
        case (_, .unknown(let name)), (.unknown(let name), _):
            throw SofaError.invalidArgument("""
                \(name) is not something cp knows: name a database NAME.sofa, a snapshot .zip, JSON lines .jsonl, \
                a folder dir/ or an http(s) URL
                """)
        default:
            throw SofaError.invalidArgument("""
                cp copies between a database and a database, a .zip, an http(s) URL, a .jsonl file or a dir/; \
                neither \(source) nor \(destination) is a database
                """)
        }
    }

    /// Opens `path`, creating an empty database there when nothing is; true if created.
    private func openOrCreate(_ path: String) throws -> (Database, Bool) {
        if access(path, F_OK) == 0 { return (try Database.open(at: path), false) }
        return (try Database.create(at: path, encryptedWith: try KeyOptions.newDatabaseKey(for: path, encrypt: encrypt)), true)
    }

    /// Runs an import into `path`; a database created for it is removed again if it fails.
    private func importing(into path: String, _ work: (Database) throws -> Int) throws -> Int {
        let (database, created) = try openOrCreate(path)
        do {
            return try work(database)
        } catch {
            if created { try? FileManager.default.removeItem(atPath: database.path) }  // undone as far as it goes; the error is rethrown
            throw error
        }
    }
}
