import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

struct Attach: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add or replace an attachment from a file (streamed, never loaded whole).")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id (created if missing).") var id: String
    @Argument(help: "Attachment name.") var name: String
    @Argument(help: "The file to attach, or - for standard input.", completion: .file()) var file: String
    @Option(name: .customLong("type"), help: "Content type (default: from the name's extension).") var contentType: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        try AttachmentName.validate(name)
        if let pointer = Blobs.pointer(ofStandIn: name) {
            throw SofaError.invalidAttachmentName(name, reason: "blob_/ names are the stand-ins of blob properties; "
                                                  + "use sofa blob set \(db.database) \(id) \(pointer) FILE")
        }
        try saveBody(db.open(), id: id, what: name, from: file) { draft, blob in
            try draft.setAttachment(name, blob: blob, contentType: contentType)
        }
    }
}

/// Streams `file` (or standard input for `-`) into the blob store, lets `apply` put it in a
/// draft of document `id`, and saves that draft, unless it repeats the current revision (the
/// same bytes and type again change nothing, as in the mount). Prints the revision id.
func saveBody(_ database: Database, id: String, what: String, from file: String,
              _ apply: (inout RevisionDraft, StoredBlob) throws -> Void) throws {
    var draft = try database.newRevision(of: id)
    var progress = Progress("attaching \(what)")
    let report: (Int64) -> Void = { progress.update(bytes: $0) }
    let blob = file == "-"
        ? try database.blobs.write(fromDescriptor: STDIN_FILENO, name: "standard input", progress: report)
        : try database.blobs.write(contentsOf: file, progress: report)
    progress.finish()
    try apply(&draft, blob)
    if let current = try database.document(withID: id), draft.parent == current.revID, draft.repeats(current) {
        Output.error("\(what) is unchanged: no new revision")
        Output.line(current.revID.description)
        return
    }
    Output.line(try database.save(draft).revID.description)
}

/// Streams a body to standard output; the reader checks its hash at the end.
func streamToStandardOutput(_ reader: BlobReader) throws {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
    defer { buffer.deallocate() }
    while case let count = try reader.read(into: buffer), count > 0 {
        // A full disk or a closed pipe behind stdout is an error, not a silently short copy.
        try writeFully(STDOUT_FILENO, UnsafeRawBufferPointer(rebasing: buffer[0..<count]), path: "standard output")
    }
}

struct Detach: SofaCommand {
    static let configuration = CommandConfiguration(abstract: "Remove an attachment (saves a new revision).")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Argument(help: "Attachment name.") var name: String
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        try saveEdit(db.open(), id: id) { try $0.removeAttachment(name) }
    }
}

/// Saves `edit` of the current revision of document `id`, which must exist, and prints the new revision id.
func saveEdit(_ database: Database, id: String, _ edit: (inout RevisionDraft) throws -> Void) throws {
    guard try database.document(withID: id) != nil else { throw SofaError.documentNotFound(id) }
    var draft = try database.newRevision(of: id)
    try edit(&draft)
    Output.line(try database.save(draft).revID.description)
}

struct CatAttachment: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stream an attachment's body to standard output.",
        discussion: "The body's hash is checked as it streams; a corrupt body ends with an error and exit status 1.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Argument(help: "Attachment name.") var name: String
    @Option(help: "A specific revision.") var rev: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let database = try db.open()
        let revision = try database.revision(of: id, rev: rev)
        guard let attachment = revision.attachment(named: name) else { throw SofaError.attachmentNotFound(docID: id, name: name) }
        try streamToStandardOutput(try database.openContent(of: attachment, docID: id))
    }
}
