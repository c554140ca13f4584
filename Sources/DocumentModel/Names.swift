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

    /// Whether `id` names a design document (stored and replicated; Mango indexes and
    /// queries leave them out).
    public static func isDesign(_ id: String) -> Bool { id.hasPrefix(designPrefix) }
}

public enum AttachmentName {
    /// Throws unless `name` may name an attachment: not empty, not starting with `_`.
    public static func validate(_ name: String) throws(SofaError) {
        guard !name.isEmpty else { throw .invalidAttachmentName(name, reason: "it is empty") }
        guard !name.hasPrefix("_") else { throw .invalidAttachmentName(name, reason: "it starts with '_'") }
        guard !name.utf8.contains(0) else { throw .invalidAttachmentName(name, reason: "it contains a NUL character") }
    }
}

/// Content types guessed from file name extensions, for attachments added from files: from
/// the system's table (`/etc/mime.types`, Debian's `media-types`: some 1,500 extensions, kept
/// up to date by the distribution), and from a short table of the common ones where the system
/// has none (a container without `media-types`).
public enum MIMEType {
    public static let fallback = "application/octet-stream"

    /// The system's table, read once.
    private static let system: [String: String] = table(fromFile: "/etc/mime.types")

    /// The extensions of a `mime.types` file (`type ext ext …` a line, `#` comments): the
    /// first type that names an extension wins, as in Apache's and nginx's reading. Empty
    /// when the file cannot be read.
    public static func table(fromFile path: String) -> [String: String] {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [:] }
        var table: [String: String] = [:]
        for line in text.split(whereSeparator: \.isNewline) where !line.hasPrefix("#") {
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard let type = fields.first, type.contains("/") else { continue }
            for ext in fields.dropFirst() where table[ext.lowercased()] == nil { table[ext.lowercased()] = String(type) }
        }
        return table
    }

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

    /// Whether bodies of this type usually shrink when deflated: text, JSON, XML,
    /// JavaScript, SVG (CouchDB's `compressible_types`, roughly). Images, audio, video and
    /// archives are compressed already.
    public static func isCompressible(_ contentType: String) -> Bool {
        let type = contentType.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? ""
        return type.hasPrefix("text/") || type.hasSuffix("+json") || type.hasSuffix("+xml")
            || ["application/json", "application/xml", "application/javascript", "application/x-ndjson",
                "application/x-javascript", "application/x-yaml", "application/yaml"].contains(type)
    }

    /// The content type for a file called `name`, or `application/octet-stream`.
    public static func forFileName(_ name: String) -> String {
        let base = name.split(separator: "/").last.map(String.init) ?? name
        guard let dot = base.lastIndex(of: "."), dot != base.startIndex else { return fallback }
        let ext = base[base.index(after: dot)...].lowercased()
        return system[ext] ?? byExtension[ext] ?? fallback
    }
}

/// Reversible mapping between document ids / attachment names and file names.
///
/// - A document id becomes one file name: `%` → `%25`, `/` → `%2F`, and a name
///   that would be `.` or `..` (or empty) is written with `%2E`.
/// - An attachment name becomes a path under `attachments/` (in the mount; beside a
///   document's JSON in `sofa cp DB dir/`): `/` separates folders and each part is escaped like an id. A name whose parts would not
///   make a clean path (an empty part, `.` or `..`) is kept as one file name
///   with its `/` written `%2F`.
///
/// Only `%25`, `%2F` and `%2E` are decoded, so every other `%` sequence stays
/// literal; nothing a remote sends can make a path leave its folder.
public enum FileNames {
    public static func escape(_ name: String) -> String {
        var result = ""
        result.reserveCapacity(name.utf8.count)
        for character in name {
            switch character {
            case "%": result += "%25"
            case "/": result += "%2F"
            default: result.append(character)
            }
        }
        if result.isEmpty || result == "." || result == ".." {
            result = String(repeating: "%2E", count: result.count)
        }
        return result.isEmpty ? "%2E%2E%2E" : result
    }

    public static func unescape(_ component: String) -> String {
        guard component.utf8.contains(UInt8(ascii: "%")) else { return component }
        if component == "%2E%2E%2E" { return "" }
        var bytes: [UInt8] = []
        var utf8 = Array(component.utf8)[...]
        while let byte = utf8.first {
            if byte == UInt8(ascii: "%"), utf8.count >= 3 {
                let code = String(decoding: utf8.dropFirst().prefix(2), as: UTF8.self).uppercased()
                let decoded: UInt8? = ["25": 0x25, "2F": 0x2F, "2E": 0x2E][code]
                if let decoded {
                    bytes.append(decoded)
                    utf8 = utf8.dropFirst(3)
                    continue
                }
            }
            bytes.append(byte)
            utf8 = utf8.dropFirst()
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The path components under `attachments/` for an attachment name.
    public static func attachmentComponents(_ name: String) -> [String] {
        let parts = name.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if parts.count > 1, parts.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." }) {
            return parts.map(escape)
        }
        return [escape(name)]
    }

    /// The attachment name for path components under `attachments/`.
    public static func attachmentName(_ components: [String]) -> String {
        components.map(unescape).joined(separator: "/")
    }
}
