import Foundation

/// Everything that can go wrong in Sofa, with the context to say what and why.
///
/// One type for every layer, so that one exhaustive `switch` decides the errno
/// of a file-system call and one the HTTP status of a server response. Tests
/// compare cases, never message text.
public enum SofaError: Error, Hashable, Sendable {
    case invalidJSON(JSONParseError)
    /// The JSON is well formed but not a valid document body.
    case invalidDocument(reason: String)
    case invalidDocumentID(String, reason: String)
    case invalidAttachmentName(String, reason: String)
    case invalidRevisionID(String)
    case documentNotFound(String)
    case revisionNotFound(docID: String, revID: String)
    case attachmentNotFound(docID: String, name: String)
    /// A blob property (Couchbase Lite 3.x) that cannot be saved as it is.
    case invalidBlob(docID: String, pointer: String, reason: String)
    /// Saving from `revID` (or from nothing) when the document's current revision is `current`.
    case conflict(docID: String, revID: String?, current: String)
    case notADatabase(path: String, reason: String)
    case databaseExists(path: String)
    /// An encrypted database that cannot be opened with the key given (or with none).
    case keyRejected(path: String, reason: String)
    case sqlite(code: Int32, message: String, sql: String?)
    case io(operation: String, path: String, errno: Int32)
    /// The disk (or quota) filled up while writing `path`.
    case diskFull(path: String)
    case readOnlyFileSystem(path: String)
    /// A blob file whose bytes don't hash to its name.
    case blobCorrupted(key: String, path: String)
    /// The attachment's body is not on this machine (`contentAvailable == false`).
    case bodyNotAvailable(docID: String, name: String)
    case invalidArgument(String)
    /// A Mango query or index, or a design document's views, CouchDB would refuse: its error name and reason.
    case invalidQuery(error: String, reason: String)
    /// A design document's `validate_doc_update` refused the change (`throw({forbidden: …})`).
    case forbidden(reason: JSONValue)
    /// A design document's `validate_doc_update` asked for a login (`throw({unauthorized: …})`).
    case unauthorized(reason: JSONValue)
    /// A design-document function failed (threw an exception, ran out of time or memory).
    case designFunctionFailed(error: String, reason: String)

    /// The error for a failed system call on `path`, naming the common cases.
    public static func system(_ operation: String, path: String, errno code: Int32) -> SofaError {
        switch code {
        case ENOSPC, EDQUOT: .diskFull(path: path)
        case EROFS: .readOnlyFileSystem(path: path)
        default: .io(operation: operation, path: path, errno: code)
        }
    }
}

extension SofaError: CustomStringConvertible, LocalizedError {
    public var description: String {
        switch self {
        case .invalidJSON(let error): "\(error)"
        case .invalidDocument(let reason): "invalid document: \(reason)"
        case .invalidDocumentID(let id, let reason): "invalid document id \(quoted(id)): \(reason)"
        case .invalidAttachmentName(let name, let reason): "invalid attachment name \(quoted(name)): \(reason)"
        case .invalidRevisionID(let rev): "invalid revision id \(quoted(rev)): expected GENERATION-SUFFIX"
        case .documentNotFound(let id): "no document \(quoted(id))"
        case .revisionNotFound(let id, let rev): "document \(quoted(id)) has no revision \(rev)"
        case .attachmentNotFound(let id, let name): "document \(quoted(id)) has no attachment \(quoted(name))"
        case .invalidBlob(let id, let pointer, let reason): "document \(quoted(id)), blob at \(pointer): \(reason)"
        case .conflict(let id, let rev, let current):
            "conflict: document \(quoted(id)) is at revision \(current), not \(rev ?? "(new document)")"
        case .notADatabase(let path, let reason): "\(path) is not a Sofa database: \(reason)"
        case .databaseExists(let path): "\(path) already exists"
        case .keyRejected(let path, let reason): "\(path) is encrypted and cannot be opened: \(reason)"
        case .sqlite(let code, let message, let sql):
            "SQLite error \(code): \(message)" + (sql.map { " (in \($0))" } ?? "")
        case .io(let operation, let path, let code): "\(operation) \(path): \(String(cString: strerror(code)))"
        case .diskFull(let path): "no space left on device while writing \(path)"
        case .readOnlyFileSystem(let path): "read-only file system: cannot write \(path)"
        case .blobCorrupted(let key, let path): "attachment body \(path) is corrupt: its bytes do not hash to \(key)"
        case .bodyNotAvailable(let id, let name):
            "the body of attachment \(quoted(name)) of document \(quoted(id)) is not on this machine (not downloaded)"
        case .invalidArgument(let message): message
        case .invalidQuery(_, let reason): reason
        case .forbidden(let reason): "refused by validate_doc_update: \(reason.stringValue ?? reason.jsonString())"
        case .unauthorized(let reason): "validate_doc_update asks for a login: \(reason.stringValue ?? reason.jsonString())"
        case .designFunctionFailed(let error, let reason): "a design document's function failed: \(error): \(reason)"
        }
    }

    public var errorDescription: String? { description }

    /// Whether a design document's function refused the change or failed on it: the writer's
    /// change is the reason, not the storage, so the other changes of a batch go on.
    public var isRefusedByDesign: Bool {
        switch self {
        case .forbidden, .unauthorized, .designFunctionFailed, .invalidQuery: true
        default: false
        }
    }

    /// A short name for programs (`sofa … --json` prints it as `error`), in CouchDB's style.
    public var name: String {
        switch self {
        case .invalidJSON: "invalid_json"
        case .invalidDocument: "invalid_document"
        case .invalidDocumentID: "invalid_document_id"
        case .invalidAttachmentName: "invalid_attachment_name"
        case .invalidRevisionID: "invalid_revision_id"
        case .documentNotFound, .revisionNotFound, .attachmentNotFound: "not_found"
        case .invalidBlob: "invalid_blob"
        case .conflict: "conflict"
        case .notADatabase: "not_a_database"
        case .databaseExists: "file_exists"
        case .keyRejected: "key_rejected"
        case .sqlite: "sqlite_error"
        case .io: "io_error"
        case .diskFull: "disk_full"
        case .readOnlyFileSystem: "read_only"
        case .blobCorrupted: "blob_corrupted"
        case .bodyNotAvailable: "body_not_available"
        case .invalidArgument: "invalid_argument"
        case .invalidQuery(let error, _): error
        case .forbidden: "forbidden"
        case .unauthorized: "unauthorized"
        case .designFunctionFailed(let error, _): error
        }
    }

    private func quoted(_ text: String) -> String { "\"\(text.escapingControlCharacters)\"" }
}

extension Unicode.Scalar {
    /// A character that acts on a terminal or on how a reader splits or shows lines: C0 and C1
    /// controls (U+009B is an 8-bit escape sequence, U+0085 a line end), DEL, U+2028 and
    /// U+2029, and the marks that reorder text (bidi overrides and isolates, which can make one
    /// name look like another). Every line-oriented output escapes them.
    public var actsOnTerminals: Bool {
        switch value {
        case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029, 0x200E, 0x200F, 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}

extension String {
    /// The text with the characters that act on terminals (`Unicode.Scalar.actsOnTerminals`)
    /// escaped (`\n`, `\u{1B}`, `\u{202E}`): a name put into a log line or a message cannot
    /// start another line, drive the terminal or reorder what follows.
    public var escapingControlCharacters: String {
        guard unicodeScalars.contains(where: \.actsOnTerminals) else { return self }
        var result = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\n": result += "\\n"
            case "\r": result += "\\r"
            case "\t": result += "\\t"
            case _ where scalar.actsOnTerminals: result += "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}
