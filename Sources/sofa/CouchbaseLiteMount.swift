import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import Replicator

/// How `sofa mount APP.cblite2 DIR` works: the mount serves a Sofa database kept in step with
/// the Couchbase Lite file in both directions (saves pushed as they commit, the file's commits
/// pulled as inotify reports them), through the same replication interface
/// (`ReplicationPeer`) that reads and writes the file for `sofa cp` and `sofa pull|push`.
///
/// The file system needs what a `.cblite2` has no place for (staged files of a save, pending
/// saves, modes and times, scratch files, saved queries): the companion database keeps them,
/// and only documents, revisions and blob bodies cross into the file, in SQLite transactions
/// as LiteCore writes them. The companion lives in the user's cache folder
/// (`$XDG_CACHE_HOME/sofa/couchbase-lite/`), named after the file's path; nothing but documents
/// is written beside the app's database.
enum CouchbaseLiteMount {
    /// The companion's record of which file it is the companion of.
    static let identityDocument = "_local/couchbase-lite-file"

    /// The companion of the Couchbase Lite database at `path`.
    static func companionPath(for path: String) -> String {
        let full = URL(fileURLWithPath: path).standardizedFileURL.path
        let home = ProcessInfo.processInfo.environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        let cache = ProcessInfo.processInfo.environment["XDG_CACHE_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.cache"
        let tag = MessageDigest.hash(.sha1, Array(full.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
        let name = (URL(fileURLWithPath: full).lastPathComponent as NSString).deletingPathExtension
        return "\(cache)/sofa/couchbase-lite/\(name)-\(tag).sofa"
    }

    /// Makes the folder the companion lives in.
    static func prepareFolder(for path: String) throws {
        let folder = (companionPath(for: path) as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    }

    /// The companion, made if new and brought up to date with the file (a pull, then a push of
    /// what a mount stopped before sending), and whether the file can be written.
    static func open(_ path: String) throws -> (database: Database, writable: Bool) {
        try prepareFolder(for: path)
        let companion = companionPath(for: path)
        let uuid = try CouchbaseLiteDatabase.open(at: path).privateUUID
        var database = access(companion, F_OK) == 0 ? try Database.open(at: companion) : try Database.create(at: companion)
        // Another file in its place (an app reinstalled, a copy restored): the companion of the
        // old one is set aside, never pushed into the new one.
        let identity = try database.localDocument(withID: identityDocument)
        if let known = identity?.body["private_uuid"]?.stringValue, known != uuid {
            let aside = companion + ".replaced-\(Int(Date().timeIntervalSince1970))"
            guard rename(companion, aside) == 0 else { throw SofaError.system("rename", path: companion, errno: errno) }
            log.warning("\(path) is not the database \(companion) was made from (another private UUID): that one is kept as \(aside), a new one made")
            database = try Database.create(at: companion)
        }
        if identity?.body["private_uuid"]?.stringValue != uuid {
            _ = try database.replaceLocalDocument(identityDocument, body: ["private_uuid": .string(uuid), "path": .string(path)],
                                                  after: try database.localDocument(withID: identityDocument)?.rev)
        }
        let file = RemoteDatabase(file: path)
        let indexes = try CouchbaseLiteDatabase.open(at: path).queryIndexes
        let writable = indexes.isEmpty
        if !writable {
            log.warning("\(path) has query indexes (\(indexes.joined(separator: ", "))), kept by Couchbase Lite's own SQL functions: mounted read-only")
        }
        _ = try Replicator(database: database, remote: file, direction: .pull).run()
        if writable { _ = try Replicator(database: database, remote: file, direction: .push).run() }
        return (database, writable)
    }
}
