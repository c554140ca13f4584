import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Saved Mango queries as folders, the desktop's saved searches over documents: a file
/// `queries/<name>.json` holds a query as CouchDB's `_find` takes it (`selector`, and `sort`,
/// `limit`, `skip` if wanted), and `queries/<name>/` beside it lists the matching documents, in
/// the query's order, as symbolic links to their folders in `docs/`.
///
/// - **The files are the user's**: written, edited, renamed and removed as on any disk (scratch
///   files of the mount's root, kept in the database folder, never replicated).
/// - **The results are the database's**: read-only, paged through `Database.find` (any number
///   of matches lists in constant memory), and fresh as views are: a results folder's time is
///   the later of the database's last commit and its query file's, and the kernel re-checks it
///   every `Tuning.viewAttributeTimeout`.
/// - **A query that is not one** (invalid JSON, an unknown operator, a sort no index serves)
///   makes its folder fail to list with EINVAL; the reason is in the log and `.sofa/status.json`.
extension DocumentFileSystem {
    /// A query file as last read, valid while the file's identity, size and time are these.
    struct SavedQuery {
        let stamp: [Int64]
        let query: MangoQuery
        /// `limit` and `skip` as written (none: every match).
        let limit: Int
        let skip: Int
        let modified: Double
    }

    var queriesDirectory: String { scratchPath(Node.rootScratchID, Node.queriesDirectoryName) }

    private func queryFile(_ name: String) -> String { scratch.path(queriesDirectory, name + QueryNode.fileExtension) }

    /// The query `queries/<name>.json` holds; ENOENT when there is no such file, EINVAL (with
    /// the file's name and Mango's reason) when it holds no query.
    func savedQuery(_ name: String, path: String) throws -> SavedQuery {
        let file = queryFile(name)
        let info = try queryFileStatus(name, path: path)
        let stamp = [Int64(info.st_ino), Int64(info.st_size), Int64(info.st_mtim.tv_sec), Int64(info.st_mtim.tv_nsec)]
        if let known = derived.savedQueries[name], known.stamp == stamp { return known }
        let shown = Node.queriesDirectoryName + "/" + name + QueryNode.fileExtension
        var query: MangoQuery
        let written: Bool
        let bytes = try readSmallFile(file)
        do {
            guard let object = try JSONParser.parse(bytes).objectValue else {
                throw SofaError.invalidQuery(error: "bad_request", reason: "a query is a JSON object, as _find takes it")
            }
            guard object["selector"] != nil else {
                throw SofaError.invalidQuery(error: "missing_required_key",
                                             reason: #"no "selector": a query file holds what _find takes, {"selector": {…}, …}"#)
            }
            query = try MangoQuery(object)
            written = object["limit"] != nil
        } catch {
            // JSON's or Mango's reason (nothing else is thrown above).
            throw MountError.invalidArgument(path, why: "\(shown) is not a Mango query: \(error)")
        }
        query.bookmark = nil
        query.fields = ["_id"]
        let saved = SavedQuery(stamp: stamp, query: query, limit: written ? query.limit : Int.max, skip: query.skip,
                               modified: FileTime(info.st_mtim).seconds)
        derived.savedQueries[name] = saved
        return saved
    }

    /// The query file's status: ENOENT when there is none (or it is no file), so that
    /// `queries/<name>/` is there exactly when `queries/<name>.json` is.
    private func queryFileStatus(_ name: String, path: String) throws -> stat {
        let file = queryFile(name)
        var info = stat()
        guard lstat(file, &info) == 0 else {
            guard [ENOENT, ENOTDIR, ENAMETOOLONG].contains(errno) else { throw SofaError.system("lstat", path: file, errno: errno) }
            throw MountError.notFound(path)
        }
        guard info.st_mode & S_IFMT == S_IFREG else { throw MountError.notFound(path) }
        return info
    }

    /// `../../docs/<id>`, from `queries/<name>/<id>`.
    static func queryLinkTarget(_ docID: String) -> String { "../../docs/" + FileNames.escape(docID) }

    /// A results folder is there whether or not its file holds a valid query: listing it says
    /// what is wrong.
    private func resultsFolder(_ name: String, path: String) throws -> FileAttributes {
        let modified = FileTime(try queryFileStatus(name, path: path).st_mtim)
        return viewFolder(max(databaseChangedAt(), modified.seconds))
    }

    // MARK: - Attributes

    func queryAttributes(_ node: QueryNode, path: String) throws -> FileAttributes {
        switch node {
        case .root:
            // A database never mounted writable has no such folder yet: an empty one is shown.
            guard isDirectory(queriesDirectory) else { return directory(mountTime, writable: false) }
            var attributes = try scratchAttributes(queriesDirectory)
            attributes.permissions = readOnly ? 0o555 : 0o755
            return attributes
        case .results(let name):
            return try resultsFolder(name, path: path)
        case .row(let name, let docID):
            let saved = try savedQuery(name, path: path)
            guard try matches(saved, named: name, docID, path: path) else { throw MountError.notFound(path) }
            return link(to: Self.queryLinkTarget(docID), max(databaseChangedAt(), saved.modified))
        }
    }

    /// A row's target follows from its name: the kernel asks only after a lookup found the row,
    /// so it is not looked for again.
    func queryLinkTarget(_ node: QueryNode, path: String) throws -> String {
        guard case .row(_, let docID) = node else { throw MountError.invalidArgument(path, why: "not a symbolic link") }
        return Self.queryLinkTarget(docID)
    }

    /// Whether the document is among the query's results.
    private func matches(_ saved: SavedQuery, named name: String, _ docID: String, path: String) throws -> Bool {
        guard saved.limit == Int.max && saved.skip == 0 else {
            // Cut by a limit or a skip: among the results the listing gives, read once for each
            // state of the database (`ls -l` looks up every name).
            let sequence = try store.lastSequence
            if let known = derived.queryMembers[name], known.stamp == saved.stamp, known.sequence == sequence {
                return known.members.contains(docID)
            }
            let members = try allResults(saved, path: path)
            derived.queryMembers[name] = (saved.stamp, sequence, members)
            return members.contains(docID)
        }
        // Otherwise the selector decides, on the document read by its id.
        return try store.matches(saved.query.selector, documentID: docID)
    }

    /// Runs a page of a saved query; Mango's refusal (a sort no index serves) says so.
    private func run(_ query: MangoQuery, path: String) throws -> FindResult {
        do {
            return try store.find(query)
        } catch SofaError.invalidQuery(_, let reason) {
            throw MountError.invalidArgument(path, why: "the query cannot be answered: \(reason)")
        }
    }

    /// The ids of every result, read a page at a time.
    private func allResults(_ saved: SavedQuery, path: String) throws -> Set<String> {
        var (ids, mark) = (Set<String>(), [UInt8]?.none)
        while true {
            let page = try resultPage(saved, after: mark, limit: Tuning.viewListingPage, path: path)
            ids.formUnion(page.map(\.docID))
            mark = page.last?.mark
            if page.count < Tuning.viewListingPage { return ids }
        }
    }

    /// Up to `limit` results after `mark`: each with its mark, "<how many so far> <bookmark>".
    private func resultPage(_ saved: SavedQuery, after mark: [UInt8]?, limit: Int, path: String) throws -> [(mark: [UInt8], docID: String)] {
        var query = saved.query
        var given = 0
        if let mark {
            let text = String(decoding: mark, as: UTF8.self)
            guard let space = text.firstIndex(of: " "), let count = Int(text[..<space]),
                  let bookmark = MangoQuery.Bookmark(token: String(text[text.index(after: space)...])) else {
                throw MountError.inconsistent(path, why: "a listing mark that is not one")
            }
            (given, query.bookmark, query.skip) = (count, bookmark, 0)
        }
        guard saved.limit > given else { return [] }
        query.limit = min(limit, saved.limit - given)
        let result = try run(query, path: path)
        return zip(result.documents, result.positions).enumerated().compactMap { offset, found in
            found.0["_id"]?.stringValue.map { (Array("\(given + offset + 1) \(found.1.token)".utf8), $0) }
        }
    }

    // MARK: - Listings

    /// `queries/`: the files in it, and a results folder for each query file.
    func queryFolderEntries() throws -> [DirectoryEntry] {
        let files = try scratchNames(in: queriesDirectory)
        var entries = files.map { name in named(name, attributes: try? scratchAttributes(scratch.path(queriesDirectory, name))) }
        let modified = databaseChangedAt()
        for file in files {
            guard let name = QueryNode.resultsName(ofFile: file), !files.contains(name) else { continue }
            entries.append(named(name, attributes: viewFolder(modified)))
        }
        return entries
    }

    /// Lists a results folder after `position`, a page at a time.
    /// A query that is not one is recorded with its reason (a listing that fails is otherwise
    /// logged only when the disk or the database failed).
    func listQueryResults(_ name: String, path: String, after position: UInt64, add: (DirectoryEntry) -> Bool) throws {
        do {
            let saved = try savedQuery(name, path: path)
            let modified = max(databaseChangedAt(), saved.modified)
            _ = try listPaged(path, after: position, add: add) { mark, limit in
                try resultPage(saved, after: mark, limit: limit, path: path).map { row in
                    (mark: row.mark, entry: (FileNames.escape(row.docID), link(to: Self.queryLinkTarget(row.docID), modified)))
                }
            }
        } catch let error as MountError {
            if case .invalidArgument = error {
                log.notice("readdir \(path): \(error)")
                failed("readdir", path: path, errno: error.errno, reason: "\(error)")
            }
            throw error
        }
    }
}
