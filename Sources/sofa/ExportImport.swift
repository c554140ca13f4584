import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

/// JSON lines: one document revision per line, as CouchDB shows it with
/// `_id`, `_rev`, `_revisions` (the history) and `_attachments` (inline base64
/// `data`, or stubs). Every leaf revision is a line, so conflicts survive the trip.
/// `_local` documents are per-replica state (checkpoints) and are not exported.
struct Export: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Write every document as JSON lines.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "The output file, or - (the default) for standard output.", completion: .file()) var file = "-"
    @Flag(help: "Write attachment stubs (metadata only) instead of inline base64 bodies.") var noAttachments = false
    @Flag(help: "Replace an existing output file.") var force = false
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        if file != "-" { try refuseExisting(file, force: force) }
        let count = try JSONLines.export(try db.open(), to: file, attachments: !noAttachments)
        // As sofa import does: what it wrote (unless the lines themselves are the output).
        if file != "-" { Output.line("exported \(counted(count, "document")) to \(file)") }
    }
}

struct Import: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Read documents from JSON lines (as written by export).",
        discussion: "Lines with _rev keep their revision ids and history; lines without become new revisions.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "The input file, or - (the default) for standard input.", completion: .file()) var file = "-"
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let count = try JSONLines.import(from: file, into: try db.open())
        Output.line("imported \(counted(count, "document"))")
    }
}

/// The JSON lines format of export and import (and of `sofa cp` with a `.jsonl` file).
enum JSONLines {
    /// Writes every document of `database` to `path` (- for standard output); returns how many.
    static func export(_ database: Database, to path: String, attachments: Bool) throws -> Int {
        let output = try BufferedOutput(path: path)
        var progress = Progress("exported")
        var count = 0
        var after: String?
        while true {
            let page = try database.documents(after: after, limit: 500, includeDeleted: true)
            guard let last = page.last else { break }
            after = last.docID
            for summary in page {
                let tree = try database.revisionTree(of: summary.docID)
                for leaf in tree.leaves {
                    let revision = try database.revision(leaf.id, of: summary.docID)
                    try write(revision, history: tree.history(of: leaf.id), attachments: attachments, database: database, to: output)
                }
                count += 1
                progress.update(count, unit: "documents")
            }
        }
        try output.close()
        progress.finish()
        return count
    }

    private static func write(_ revision: Revision, history: [RevisionID], attachments: Bool, database: Database,
                              to output: BufferedOutput) throws {
        var head = try revision.couchJSON(history: history)
        let inline = attachments ? revision.attachments.filter(\.contentAvailable) : []
        if inline.isEmpty {
            try output.write(JSONValue.object(head).serialized() + [0x0A])
            return
        }
        // Stream bodies as base64 so that memory stays flat whatever their size.
        head["_attachments"] = nil
        try output.write(JSONValue.object(head).serialized().dropLast() + Array(#","_attachments":{"#.utf8))
        for (index, attachment) in revision.attachments.enumerated() {
            var meta = CouchFormat.stub(attachment)
            meta["stub"] = nil
            let hasData = inline.contains(attachment)
            if !hasData { meta["stub"] = true }
            var prefix = index > 0 ? [UInt8(ascii: ",")] : []
            prefix += JSONValue.string(attachment.name).serialized() + [UInt8(ascii: ":")]
            let metaBytes = JSONValue.object(meta).serialized()
            guard hasData else {
                try output.write(prefix + metaBytes)
                continue
            }
            try output.write(prefix + metaBytes.dropLast() + Array(#","data":""#.utf8))
            try streamBase64(database.openContent(of: attachment, docID: revision.docID), to: output)
            try output.write(Array("\"}".utf8))
        }
        try output.write(Array("}}\n".utf8))
    }

    private static func streamBase64(_ reader: BlobReader, to output: BufferedOutput) throws {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 3 << 18, alignment: 16)
        defer { buffer.deallocate() }
        var pending: [UInt8] = []
        while case let count = try reader.read(into: buffer), count > 0 {
            pending.append(contentsOf: buffer[0..<count])
            let usable = pending.count / 3 * 3
            try output.write(Array(Data(pending[0..<usable]).base64EncodedString().utf8))
            pending.removeFirst(usable)
        }
        try output.write(Array(Data(pending).base64EncodedString().utf8))
    }

    /// Reads JSON lines from `file` (- for standard input) into `database`; returns how many documents.
    static func `import`(from file: String, into database: Database) throws -> Int {
        guard let stream = file == "-" ? fdopen(dup(STDIN_FILENO), "r") : fopen(file, "r") else {
            throw SofaError.system("open", path: file, errno: errno)
        }
        defer { fclose(stream) }
        var progress = Progress("imported")
        var batch: [ReplicatedRevision] = []
        var count = 0
        var lineNumber = 0
        func flush() throws {
            guard !batch.isEmpty else { return }
            try database.inBatch { writer in for revision in batch { try writer.insert(revision) } }
            batch.removeAll()
        }
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        while case let length = getline(&line, &capacity, stream), length >= 0 {
            lineNumber += 1
            let bytes = Array(UnsafeRawBufferPointer(start: line, count: length))
            guard bytes.contains(where: { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }) else { continue }
            do {
                if let revision = try importLine(bytes, into: database, flush: flush) {
                    batch.append(revision)
                    if batch.count >= Tuning.importBatchSize { try flush() }
                }
            } catch let error as SofaError {
                try flush()
                throw SofaError.invalidArgument("\(file == "-" ? "standard input" : file), line \(lineNumber): \(error)")
            }
            count += 1
            progress.update(count, unit: "documents")
        }
        try flush()
        progress.finish()
        return count
    }

    /// Returns the revision to insert with history, or nil when the line was saved directly.
    private static func importLine(_ bytes: [UInt8], into database: Database, flush: () throws -> Void) throws -> ReplicatedRevision? {
        try importDocument(try parseJSONObject(bytes, what: "each line"), into: database, flush: flush) { name, meta, generation in
            try importAttachment(name, meta, generation: generation, database: database)
        }
    }

    /// One document as CouchDB shows it (`_id`, `_rev`, `_revisions`, `_deleted`, `_attachments`):
    /// with `_rev`, the revision to insert with its history (returned); without, a new revision
    /// saved on top of the current one (nil returned, after `flush`), which keeps the current
    /// attachments unless `replacingAttachments`. `attachment` makes each entry of
    /// `_attachments` an `Attachment`, storing its body.
    static func importDocument(_ document: JSONObject, into database: Database, replacingAttachments: Bool = false,
                               flush: () throws -> Void,
                               attachment: (_ name: String, _ meta: JSONValue, _ generation: Int) throws -> Attachment) throws -> ReplicatedRevision? {
        let parsed: IncomingDocument
        do { parsed = try IncomingDocument(.object(document)) } catch let error as CouchFormatError {
            throw SofaError.invalidDocument(reason: error.reason)
        }
        guard let id = parsed.id else { throw SofaError.invalidDocument(reason: "missing _id") }
        try DocumentID.validate(id)
        if DocumentID.isLocal(id) {
            try database.putLocalDocument(id, body: parsed.properties)
            return nil
        }
        let rev = document["_rev"] == nil ? nil : parsed.rev
        var attachments: [Attachment] = []
        for (name, meta) in document["_attachments"]?.objectValue ?? [:] {
            try AttachmentName.validate(name)
            attachments.append(try attachment(name, meta, rev?.generation ?? 1))
        }
        guard let rev else {
            try flush()
            var draft = try database.newRevision(of: id)
            draft.properties = parsed.properties
            draft.deleted = parsed.deleted
            if replacingAttachments { for name in Array(draft.attachments.keys) { try draft.removeAttachment(name) } }
            for attachment in attachments { try draft.setAttachment(attachment) }
            draft.orderAttachments(attachments.map(\.name))  // as the file lists them, as CouchDB keeps them
            // What is already the current revision is not saved again: reading the same file
            // twice makes one revision, not two.
            if let current = try database.currentRevision(of: id), draft.repeats(current) { return nil }
            try database.save(draft)
            return nil
        }
        if let history = parsed.history, history.first != rev {
            throw SofaError.invalidDocument(reason: "_revisions does not match _rev \(rev)")
        }
        return ReplicatedRevision(docID: id, revID: rev, ancestors: parsed.ancestors, deleted: parsed.deleted,
                                  properties: parsed.properties, attachments: attachments)
    }

    private static func importAttachment(_ name: String, _ meta: JSONValue, generation: Int, database: Database) throws -> Attachment {
        let contentType = meta["content_type"]?.stringValue ?? MIMEType.forFileName(name)
        let revpos = meta["revpos"]?.int64Value.map(Int.init) ?? generation
        let digest = meta["digest"]?.stringValue
        if let data = meta["data"]?.stringValue {
            guard let bytes = Data(base64Encoded: data) else {
                throw SofaError.invalidDocument(reason: "attachment \(name) has invalid base64 data")
            }
            let blob = try database.blobs.write(bytes)
            if let digest, digest.hasPrefix("sha1-"), digest != blob.key.digestString {
                throw SofaError.invalidDocument(reason: "attachment \(name): data does not match its digest \(digest)")
            }
            // The digest describes the bytes as stored (see CouchFormat); an md5 of another form
            // (CouchDB's gzip) stays known as an alias of the body.
            var stored = digest ?? blob.key.digestString
            if let digest, digest.hasPrefix("md5-") {
                stored = "md5-" + Data(MessageDigest.hash(.md5, [UInt8](bytes))).base64EncodedString()
                if stored != digest { try database.recordAlias(digest, of: blob.key) }
            }
            return Attachment(name: name, contentType: contentType, length: blob.length, digest: stored,
                              blobKey: blob.key, revpos: revpos, contentAvailable: true)
        }
        guard let digest, let length = meta["length"]?.int64Value else {
            throw SofaError.invalidDocument(reason: "attachment \(name) has neither data nor digest and length")
        }
        return Attachment(name: name, contentType: contentType, length: length, digest: digest,
                          blobKey: BlobKey(digestString: digest), revpos: revpos)
    }
}

/// Buffered writes to a file or standard output that report failures (a full disk, a closed pipe).
final class BufferedOutput {
    private let fd: Int32
    private let path: String
    private let sync: Bool
    private var buffer: [UInt8] = []

    /// `sync: false` leaves the fsync at close to the caller (many small files synced at once).
    init(path: String, sync: Bool = true) throws {
        self.path = path == "-" ? "standard output" : path
        self.sync = sync
        if path == "-" {
            fd = STDOUT_FILENO
        } else {
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
            guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        }
        buffer.reserveCapacity(1 << 20)
    }

    func write(_ bytes: some Collection<UInt8>) throws {
        buffer.append(contentsOf: bytes)
        if buffer.count >= 1 << 20 { try flush() }
    }

    func flush() throws {
        try buffer.withUnsafeBytes { try writeFully(fd, $0, path: path) }
        buffer.removeAll(keepingCapacity: true)
    }

    func close() throws {
        try flush()
        if fd != STDOUT_FILENO {
            guard !sync || fsync(fd) == 0, Glibc.close(fd) == 0 else { throw SofaError.system("close", path: path, errno: errno) }
        }
    }
}
