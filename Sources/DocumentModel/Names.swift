/// Rules for document ids and attachment names, as CouchDB has them.
public enum DocumentID {
    public static let designPrefix = "_design/"
    public static let localPrefix = "_local/"

    /// Throws unless `id` may name a document: not empty, and starting with `_`
    /// only as `_design/…` or `_local/…`.
    public static func validate(_ id: String) throws(SofaError) {
        guard !id.isEmpty else { throw .invalidDocumentID(id, reason: "it is empty") }
        guard !id.utf8.contains(0) else { throw .invalidDocumentID(id, reason: "it contains a NUL character") }
        if id.hasPrefix("_") {
            for prefix in [designPrefix, localPrefix] where id.hasPrefix(prefix) {
                guard id.count > prefix.count else { throw .invalidDocumentID(id, reason: "nothing follows \(prefix)") }
                return
            }
            throw .invalidDocumentID(id, reason: "only _design/ and _local/ ids may start with '_'")
        }
    }

    /// Whether `id` names a `_local` document, which has no revision tree and never replicates.
    public static func isLocal(_ id: String) -> Bool { id.hasPrefix(localPrefix) }
}

public enum AttachmentName {
    /// Throws unless `name` may name an attachment: not empty, not starting with `_`.
    public static func validate(_ name: String) throws(SofaError) {
        guard !name.isEmpty else { throw .invalidAttachmentName(name, reason: "it is empty") }
        guard !name.hasPrefix("_") else { throw .invalidAttachmentName(name, reason: "it starts with '_'") }
        guard !name.utf8.contains(0) else { throw .invalidAttachmentName(name, reason: "it contains a NUL character") }
    }
}

/// Content types guessed from file name extensions, for attachments added from files.
public enum MIMEType {
    public static let fallback = "application/octet-stream"

    private static let byExtension: [String: String] = [
        "txt": "text/plain", "text": "text/plain", "md": "text/markdown", "csv": "text/csv",
        "html": "text/html", "htm": "text/html", "css": "text/css", "xml": "application/xml",
        "js": "application/javascript", "json": "application/json", "pdf": "application/pdf",
        "png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
        "webp": "image/webp", "svg": "image/svg+xml", "ico": "image/x-icon", "bmp": "image/bmp",
        "mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg", "mp4": "video/mp4",
        "webm": "video/webm", "zip": "application/zip", "gz": "application/gzip",
        "tar": "application/x-tar", "bin": "application/octet-stream",
    ]

    /// The content type for a file called `name`, or `application/octet-stream`.
    public static func forFileName(_ name: String) -> String {
        let base = name.split(separator: "/").last.map(String.init) ?? name
        guard let dot = base.lastIndex(of: "."), dot != base.startIndex else { return fallback }
        return byExtension[base[base.index(after: dot)...].lowercased()] ?? fallback
    }
}
