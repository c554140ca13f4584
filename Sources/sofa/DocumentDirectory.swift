import DocumentModel
import DocumentStore
import Foundation

/// `sofa cp DB dir/` and `sofa cp dir/ DB`: a folder with one JSON file per document and its
/// attachments beside it, for grep, diff, git and hand-made seed data.
///
///     dir/<id>.json      {"_id", "_rev", "_revisions", properties…, "_attachments": {name: metadata}}
///     dir/<id>/<name>    each attachment's bytes ('/' in a name makes subfolders)
///
/// Ids and names are escaped as in the mount (`FileNames`). Only current, live revisions are
/// written. Reading back, a file with `_rev` is inserted with its history (the same revision,
/// so a round trip changes nothing), and its attachment files must be the bytes its digests
/// name; a file without `_rev` (hand-written, or edited with `_rev` removed) becomes a new
/// revision whose attachments are the files in its folder.
enum DocumentDirectory {
    struct Summary {
        var documents = 0
        var attachments = 0
        var bodiesNotPresent = 0
    }

    /// Writes every live document of `database` into `directory`, which must not exist or be
    /// empty. Built beside it and renamed into place, so a failure leaves nothing half-made.
    static func export(_ database: Database, to directory: String) throws -> Summary {
        let directory = directory.count > 1 && directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        // Absent (the usual case) or unreadable: the export below says which when it writes.
        if let names = try? FileManager.default.contentsOfDirectory(atPath: directory), !names.isEmpty {
            throw SofaError.invalidArgument("\(directory) is not empty; give an empty or new directory")
        }
        let staging = stagingLocation(for: directory).path
        try? FileManager.default.removeItem(atPath: staging)  // an earlier run's leftover, if any
        try makeDirectory(staging)
        var summary = Summary()
        var progress = Progress("copied")
        do {
            var after: String?
            while true {
                let page = try database.documents(after: after, limit: 500)
                guard let last = page.last else { break }
                after = last.docID
                for entry in page {
                    guard let revision = try database.document(withID: entry.docID) else { continue }
                    let history = try database.revisionTree(of: entry.docID).history(of: revision.revID)
                    let name = FileNames.escape(revision.docID)
                    try write(Array(JSONValue.object(try revision.couchJSON(history: history)).prettyPrinted().utf8),
                              to: "\(staging)/\(name).json")
                    for attachment in revision.attachments {
                        guard attachment.contentAvailable else {
                            summary.bodiesNotPresent += 1
                            continue
                        }
                        var path = "\(staging)/\(name)"
                        let components = FileNames.attachmentComponents(attachment.name)
                        for folder in components.dropLast() {
                            path += "/\(folder)"
                        }
                        try makeDirectories(path, under: staging)
                        try copy(database.openContent(of: attachment, docID: revision.docID), to: "\(path)/\(components.last!)")
                        summary.attachments += 1
                    }
                    summary.documents += 1
                    progress.update(summary.documents, unit: "documents")
                }
            }
            progress.finish()
            // rename(2) replaces an empty directory in one step.
            guard rename(staging, directory) == 0 else { throw SofaError.system("rename", path: directory, errno: errno) }
            return summary
        } catch {
            progress.finish()
            try? FileManager.default.removeItem(atPath: staging)  // emptied by the renames above
            throw error
        }
    }

    /// Reads every `*.json` file of `directory` (and its attachment folder) into `database`.
    /// Returns how many documents were read. Stops at the first bad file, naming it; the
    /// documents before it are saved (each is one revision, complete or absent).
    static func `import`(from directory: String, into database: Database) throws -> Int {
        let directory = directory.count > 1 && directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        let names = try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
        var batch: [ReplicatedRevision] = []
        func flush() throws {
            guard !batch.isEmpty else { return }
            try database.inBatch { writer in for revision in batch { try writer.insert(revision) } }
            batch.removeAll()
        }
        var count = 0
        var progress = Progress("copied")
        for name in names where name.hasSuffix(".json") && !name.hasPrefix(".") {
            let file = "\(directory)/\(name)"
            let folder = "\(directory)/\(name.dropLast(5))"
            do {
                var object = try parseJSONObject(try readFile(file), what: "a document file")
                if object["_id"] == nil { object["_id"] = .string(FileNames.unescape(String(name.dropLast(5)))) }
                let bodies = try attachmentFiles(in: folder)
                let listed = Set(object["_attachments"]?.objectValue?.keys.map { $0 } ?? [])
                if object["_rev"] != nil {
                    if let extra = bodies.keys.first(where: { !listed.contains($0) }) {
                        throw SofaError.invalidDocument(reason: "attachment file \(extra) is not in _attachments; remove _rev to save the document as a new revision")
                    }
                } else {
                    // A new revision: its attachments are the files in its folder.
                    var attachments = object["_attachments"]?.objectValue ?? [:]
                    for name in bodies.keys where attachments[name] == nil { attachments[name] = .object([:]) }
                    for name in attachments.keys where bodies[name] == nil {
                        throw SofaError.invalidDocument(reason: "attachment \(name) has no file in \(folder)")
                    }
                    object["_attachments"] = attachments.isEmpty ? nil : .object(attachments)
                }
                let hasRev = object["_rev"] != nil
                if let revision = try JSONLines.importDocument(object, into: database, replacingAttachments: true, flush: flush,
                                                               attachment: { name, meta, generation in
                    try attachment(name, meta: meta, generation: generation, body: bodies[name], exact: hasRev, database: database)
                }) {
                    batch.append(revision)
                    if batch.count >= Tuning.importBatchSize { try flush() }
                }
            } catch let error as SofaError {
                try flush()
                throw SofaError.invalidArgument("\(file): \(error)")
            }
            count += 1
            progress.update(count, unit: "documents")
        }
        try flush()
        progress.finish()
        return count
    }

    /// The attachment files under a document's folder, by attachment name.
    private static func attachmentFiles(in folder: String) throws -> [String: String] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), isDirectory.boolValue else { return [:] }
        var files: [String: String] = [:]
        guard let walker = FileManager.default.enumerator(atPath: folder) else { return [:] }
        while let relative = walker.nextObject() as? String {
            let path = "\(folder)/\(relative)"
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else { continue }
            let components = relative.split(separator: "/").map(String.init)
            guard !components.contains(where: { $0.hasPrefix(".") }) else { continue }  // editors' and tools' hidden files
            files[FileNames.attachmentName(components)] = path
        }
        return files
    }

    private static func attachment(_ name: String, meta: JSONValue, generation: Int, body: String?, exact: Bool,
                                   database: Database) throws -> Attachment {
        let contentType = meta["content_type"]?.stringValue ?? MIMEType.forFileName(name)
        let revpos = meta["revpos"]?.int64Value.map(Int.init) ?? generation
        let digest = meta["digest"]?.stringValue
        guard let body else {
            // Metadata only: a body that was not here when the folder was written (deferred).
            guard let digest, let length = meta["length"]?.int64Value else {
                throw SofaError.invalidDocument(reason: "attachment \(name) has neither a file nor a digest and length")
            }
            return Attachment(name: name, contentType: contentType, length: length, digest: digest,
                              blobKey: BlobKey(digestString: digest), revpos: revpos)
        }
        // An exact copy's bodies must be the ones its digests name: nothing else is stored.
        let expected = exact ? digest.flatMap { $0.hasPrefix("sha1-") ? BlobKey(digestString: $0) : nil } : nil
        let blob: StoredBlob
        do {
            blob = try database.blobs.write(contentsOf: body, expecting: expected)
        } catch SofaError.blobCorrupted {
            throw SofaError.invalidDocument(reason: "attachment file \(body) is not the body \(digest ?? "") names; remove _rev to save the document as a new revision")
        }
        // A remote digest (md5-…) is kept for an exact copy: it is how the remote knows this body.
        return Attachment(name: name, contentType: contentType, length: blob.length,
                          digest: exact ? (digest ?? blob.key.digestString) : blob.key.digestString,
                          blobKey: blob.key, revpos: exact ? revpos : generation, contentAvailable: true)
    }

    // MARK: - Files

    private static func makeDirectory(_ path: String) throws {
        guard mkdir(path, 0o755) == 0 || errno == EEXIST else { throw SofaError.system("create directory", path: path, errno: errno) }
    }

    private static func makeDirectories(_ path: String, under root: String) throws {
        var current = root
        for component in path.dropFirst(root.count).split(separator: "/") {
            current += "/\(component)"
            try makeDirectory(current)
        }
    }

    private static func readFile(_ path: String) throws -> [UInt8] {
        guard let data = FileManager.default.contents(atPath: path) else { throw SofaError.system("read", path: path, errno: errno) }
        return Array(data)
    }

    private static func write(_ bytes: [UInt8], to path: String) throws {
        let output = try BufferedOutput(path: path, sync: false)
        try output.write(bytes)
        try output.close()
    }

    /// Streams a body into a new file (the reader checks its digest at the end).
    private static func copy(_ reader: BlobReader, to path: String) throws {
        let output = try BufferedOutput(path: path, sync: false)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while case let count = try reader.read(into: buffer), count > 0 {
            try output.write(UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
        }
        try output.close()
    }
}
