import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

/// `sofa blob`: Couchbase Lite 3.x blob properties, named by their JSON pointer.
struct Blob: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add, read, list or remove blob properties (Couchbase Lite 3.x attachments).",
        discussion: """
            A blob is a property anywhere in a document whose value is {"@type": "blob", "content_type": …, \
            "digest": "sha1-…", "length": …}; its body is in the blob store, like an attachment's. A blob is \
            named by the JSON pointer of its property (RFC 6901): /avatar, /album/0, /a~1b for the key "a/b". \
            The leading / may be left out, so album/0 is the path of its file in the mount's blobs/ folder.
            """,
        subcommands: [BlobSet.self, BlobCat.self, BlobRemove.self, BlobList.self])
}

/// A JSON pointer as the command line takes it: with or without its leading `/`.
struct BlobPointer: ParsableArguments {
    @Argument(help: "The blob's JSON pointer (/avatar, album/0).") var path: String

    var pointer: String {
        get throws {
            let pointer = path.hasPrefix("/") ? path : "/" + path
            guard let segments = JSONPointer.segments(pointer), !segments.contains(where: \.isEmpty) else {
                throw SofaError.invalidArgument("\"\(path)\" is not a JSON pointer to a property (RFC 6901: name/…, ~0 for ~, ~1 for /)")
            }
            return pointer
        }
    }
}

struct BlobSet: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "set",
        abstract: "Set a blob property from a file (streamed): the property and its body, one revision.",
        discussion: "Missing objects on the way are made; an array index one past the end appends. A property that is there and is not a blob is not replaced.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id (created if missing).") var id: String
    @OptionGroup var path: BlobPointer
    @Argument(help: "The file, or - for standard input.", completion: .file()) var file: String
    @Option(name: .customLong("type"), help: "Content type (default: the blob's, else from the name's extension).") var contentType: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let pointer = try path.pointer
        try saveBody(db.open(), id: id, what: pointer, from: file) { draft, blob in
            try draft.setBlob(at: pointer, blob: blob, contentType: contentType)
        }
    }
}

struct BlobCat: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "cat",
        abstract: "Stream a blob's body to standard output.",
        discussion: "The body's hash is checked as it streams. A body a pull left on the server is fetched with sofa download DB ID blob_/POINTER, or read in a mount with --remote.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @OptionGroup var path: BlobPointer
    @Option(help: "A specific revision.") var rev: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let pointer = try path.pointer
        let database = try db.open()
        let revision = try database.revision(of: id, rev: rev)
        guard let (_, attachment) = revision.blobAttachments.first(where: { $0.blob.pointer == pointer }) else {
            throw SofaError.invalidArgument("document \"\(id)\" has no blob at \(pointer)")
        }
        try streamToStandardOutput(try database.openContent(of: attachment, docID: id))
    }
}

struct BlobRemove: SofaCommand {
    static let configuration = CommandConfiguration(commandName: "rm", abstract: "Remove a blob property (saves a new revision).")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @OptionGroup var path: BlobPointer
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let pointer = try path.pointer
        try saveEdit(db.open(), id: id) { try $0.removeBlob(at: pointer) }
    }
}

struct BlobList: SofaCommand {
    static let configuration = CommandConfiguration(
        commandName: "ls",
        abstract: "List a document's blobs: pointer, size, content type, and whether the body is here.")

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "Document id.") var id: String
    @Option(help: "A specific revision.") var rev: String?
    @Flag(help: "Print JSON.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

    func execute() throws {
        let database = try db.open()
        let revision = try database.revision(of: id, rev: rev)
        let blobs = revision.blobAttachments
        if json {
            Output.line(JSONValue.array(blobs.map { blob, attachment in
                ["pointer": .string(blob.pointer), "content_type": .string(attachment.contentType), "length": .integer(attachment.length),
                 "digest": .string(blob.key.digestString), "here": .bool(attachment.contentAvailable)]
            }).jsonString())
            return
        }
        for (blob, attachment) in blobs {
            Output.line("\(blob.pointer)\t\(formatBytes(attachment.length))\t\(attachment.contentType)\t\(attachment.contentAvailable ? "here" : "deferred")")
        }
    }
}
