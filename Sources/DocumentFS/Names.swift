import DocumentModel

extension FileNames {
    /// Names of the temporary files that editors and tools make beside the files
    /// they write. Inside `attachments/` such files are scratch files, not attachments.
    /// Asked of every path a lookup, `getattr` or `create` names: read as UTF-8 bytes (the
    /// names it knows are ASCII), since by characters it was a third of the cost of making a
    /// `Node` (rsync of 10,000 files: 4.5% of the mount's time).
    static func isToolTemporary(_ name: String) -> Bool {
        let bytes = name.utf8
        func has(prefix: StaticString) -> Bool { bytes.starts(with: UnsafeBufferPointer(start: prefix.utf8Start, count: prefix.utf8CodeUnitCount)) }
        func has(suffix: StaticString) -> Bool {
            bytes.count >= suffix.utf8CodeUnitCount
                && bytes.suffix(suffix.utf8CodeUnitCount).elementsEqual(UnsafeBufferPointer(start: suffix.utf8Start, count: suffix.utf8CodeUnitCount))
        }
        if bytes.last == UInt8(ascii: "~") || name == "4913" { return true }  // backups; vim's write test
        if bytes.first == UInt8(ascii: ".") {
            if has(suffix: ".swp") || has(suffix: ".swo") || has(suffix: ".swx") || has(suffix: ".swn") || has(suffix: ".tmp") { return true }
            // gedit, emacs locks, Foundation's atomic writes
            if has(prefix: ".goutputstream-") || has(prefix: ".#") || has(prefix: ".dat.nosync") { return true }
            // rsync: ".name.XXXXXX"
            if let dot = bytes.lastIndex(of: UInt8(ascii: ".")), dot != bytes.startIndex {
                let suffix = bytes[bytes.index(after: dot)...]
                // Random suffixes almost always hold a capital or a digit; ".config.backup" is no temp file.
                if suffix.count == 6 && suffix.allSatisfy(ASCII.isAlphanumeric)
                    && suffix.contains(where: { ASCII.isUpper($0) || ASCII.isDigit($0) }) { return true }
            }
        }
        // sed -i: "sedXXXXXX"
        return bytes.count == 9 && has(prefix: "sed")
    }
}

/// What a path in the mount names.
enum Node: Equatable {
    case root
    case docs
    case statusDirectory
    case statusFile(String)
    case document(String)
    case properties(String)
    /// `attachments/` itself (empty name) or a path below it: an attachment or a folder of them.
    /// Also `blobs/` (`blobsFolder`) and the paths below it, named by the stand-in attachments
    /// of the document's blob properties: `blobs/album/0` is `blob_/album/0`.
    case attachment(String, name: String)
    case conflicts(String)
    case conflict(String, rev: String)
    case conflictProperties(String, rev: String)
    case conflictAttachment(String, rev: String, name: String)
    /// Any other file in a document folder: kept on local disk, never replicated.
    case scratch(String, relative: String)
    /// `views/` and below: design documents' views as folders (`DocumentFileSystem+Views.swift`).
    case view(ViewNode)
    /// `queries/` and the results of the saved queries in it (`DocumentFileSystem+Queries.swift`);
    /// the query files themselves are scratch files of the mount's root.
    case query(QueryNode)

    static let propertiesFileName = "properties.json"
    static let attachmentsDirectoryName = "attachments"
    static let conflictsDirectoryName = "conflicts"
    /// Blob properties (Couchbase Lite 3.x) as files, at their JSON pointer: `blobs/avatar` is
    /// the property `avatar`, `blobs/album/0` the first element of `album`. File names are the
    /// pointer's segments, `~0` for `~` and `~1` for `/` as RFC 6901 writes them.
    static let blobsDirectoryName = "blobs"
    /// The attachment-name form of `blobs/` itself: stand-in names are this, `/` and a pointer.
    static let blobsFolder = "blob_"

    /// Whether the attachment-name form `name` is in `blobs/` (the folder itself or below it),
    /// which `attachments/` never shows.
    static func isInBlobs(_ name: String) -> Bool { name == blobsFolder || Blobs.isStandInName(name) }

    /// Whether `name` lies below `folder` ("" is `attachments/`, `blobsFolder` is `blobs/`).
    static func lies(_ name: String, below folder: String) -> Bool {
        folder.isEmpty ? !isInBlobs(name) : name.hasPrefix(folder + "/")
    }
    static let statusDirectoryName = ".sofa"
    static let viewsDirectoryName = "views"
    static let queriesDirectoryName = "queries"

    /// The scratch space of the mount's root, as the scratch folder of a document id no
    /// document can have: desktop trash folders (`.Trash-UID`, `.Trash`) live there.
    static let rootScratchID = "_mount-root"

    /// Names a folder may have at the mount's root besides `docs` and `.sofa`: the trash
    /// folders of the freedesktop.org trash specification, which file managers and
    /// `gio trash` make at the top of the mount they delete from.
    static func isRootScratchName(_ name: String) -> Bool {
        name == ".Trash" || (name.hasPrefix(".Trash-") && name.dropFirst(7).allSatisfy(\.isNumber) && name.count > 7)
    }

    init?(path: String) {
        // Split as bytes: "/" is one in UTF-8, and splitting by characters costs more than the rest.
        let pieces = path.utf8.split(separator: UInt8(ascii: "/"))
        let parts = pieces.map { String(Substring($0)) }
        /// The path from its `index`th part on, as it is (the kernel sends no empty parts).
        func from(_ index: Int) -> String { String(Substring(path.utf8[pieces[index].startIndex...])) }
        guard let first = parts.first else { self = .root; return }
        if Node.isRootScratchName(first) {
            self = .scratch(Node.rootScratchID, relative: from(0))
            return
        }
        if first == Node.statusDirectoryName {
            switch parts.count {
            case 1: self = .statusDirectory
            case 2: self = .statusFile(parts[1])
            default: return nil
            }
            return
        }
        if first == Node.viewsDirectoryName {
            guard let view = ViewNode(Array(parts[1...])) else { return nil }
            self = .view(view)
            return
        }
        if first == Node.queriesDirectoryName {
            if parts.count > 1 && QueryNode.isFileName(parts[1]) {
                self = .scratch(Node.rootScratchID, relative: from(0))
                return
            }
            guard let query = QueryNode(Array(parts[1...])) else { return nil }
            self = .query(query)
            return
        }
        guard first == "docs" else { return nil }
        guard parts.count >= 2 else { self = .docs; return }
        let id = FileNames.unescape(parts[1])
        guard parts.count >= 3 else { self = .document(id); return }
        let rest = Array(parts[3...])
        switch parts[2] {
        case Node.propertiesFileName where parts.count == 3:
            self = .properties(id)
        case Node.attachmentsDirectoryName:
            if let last = rest.last, FileNames.isToolTemporary(last) {
                self = .scratch(id, relative: from(2))
            } else {
                let name = FileNames.attachmentName(rest)
                // The stand-ins of blob properties are shown in blobs/, never here.
                guard !Node.isInBlobs(name) else { return nil }
                self = .attachment(id, name: name)
            }
        case Node.blobsDirectoryName:
            if let last = rest.last, FileNames.isToolTemporary(last) {
                self = .scratch(id, relative: from(2))
            } else {
                self = .attachment(id, name: rest.isEmpty ? Node.blobsFolder : Blobs.standInName("/" + FileNames.attachmentName(rest)))
            }
        case Node.conflictsDirectoryName:
            switch rest.count {
            case 0: self = .conflicts(id)
            case 1: self = .conflict(id, rev: rest[0])
            default:
                if rest.count == 2 && rest[1] == Node.propertiesFileName {
                    self = .conflictProperties(id, rev: rest[0])
                } else if rest[1] == Node.attachmentsDirectoryName {
                    let name = FileNames.attachmentName(Array(rest[2...]))
                    guard !Node.isInBlobs(name) else { return nil }
                    self = .conflictAttachment(id, rev: rest[0], name: name)
                } else if rest[1] == Node.blobsDirectoryName {
                    let pointer = rest.count > 2 ? "/" + FileNames.attachmentName(Array(rest[2...])) : ""
                    self = .conflictAttachment(id, rev: rest[0], name: Blobs.standInName(pointer))
                } else {
                    return nil
                }
            }
        default:
            self = .scratch(id, relative: from(2))
        }
    }

    /// The document this node belongs to, if any.
    var documentID: String? {
        switch self {
        case .root, .docs, .statusDirectory, .statusFile, .view, .query: nil
        case .document(let id), .properties(let id), .attachment(let id, _), .conflicts(let id), .conflict(let id, _),
             .conflictProperties(let id, _), .conflictAttachment(let id, _, _), .scratch(let id, _): id
        }
    }
}

extension String {
    /// The mount path of a document folder.
    static func documentPath(_ id: String) -> String { "/docs/" + FileNames.escape(id) }

    /// Where an attachment is in its document's folder: `attachments/<name>`, or for the
    /// stand-in of a blob property `blobs/<pointer>`.
    static func relativePath(ofAttachment name: String) -> String {
        if let pointer = Blobs.pointer(ofStandIn: name) {
            return Node.blobsDirectoryName + "/" + FileNames.attachmentComponents(String(pointer.dropFirst())).joined(separator: "/")
        }
        return Node.attachmentsDirectoryName + "/" + FileNames.attachmentComponents(name).joined(separator: "/")
    }

    /// The mount path of an attachment.
    static func attachmentPath(_ id: String, _ name: String) -> String { documentPath(id) + "/" + relativePath(ofAttachment: name) }
}

/// A path below `views/`: `views/<design>/<view>/<key>/<document id>`, where `<design>` is a
/// design document's name without `_design/`, `<key>` a key of the view (`ViewKeyNames`) and the
/// document a symbolic link to its folder in `docs/`. `_reduce.json` in a view's folder and in
/// each key's holds the view's reduce (of the whole view, and of that key as `group=true`).
enum ViewNode: Equatable {
    case root
    case design(String)
    case view(design: String, view: String)
    /// A key's folder, by its name (decoded where it is used: a name that is no key is not found).
    case key(design: String, view: String, name: String)
    case row(design: String, view: String, name: String, docID: String)
    /// `_reduce.json` of the view (key nil) or of one key.
    case reduce(design: String, view: String, name: String?)

    static let reduceFileName = "_reduce.json"

    var isReduceFile: Bool { if case .reduce = self { true } else { false } }

    init?(_ parts: [String]) {
        let names = parts.map(FileNames.unescape)
        switch parts.count {
        case 0: self = .root
        case 1: self = .design(names[0])
        case 2: self = .view(design: names[0], view: names[1])
        case 3 where parts[2] == ViewNode.reduceFileName: self = .reduce(design: names[0], view: names[1], name: nil)
        case 3: self = .key(design: names[0], view: names[1], name: parts[2])
        case 4 where parts[3] == ViewNode.reduceFileName: self = .reduce(design: names[0], view: names[1], name: parts[2])
        case 4: self = .row(design: names[0], view: names[1], name: parts[2], docID: names[3])
        default: return nil
        }
    }
}

/// A path below `queries/` that is not a file: `queries/<name>/` is the results of the saved
/// query `queries/<name>.json` (Mango's `_find` body), a symbolic link per matching document to
/// its folder in `docs/`, in the query's order. Files in `queries/` (`*.json`, hidden files, the
/// temporary files of editors) are the user's: scratch files kept beside the database.
enum QueryNode: Equatable {
    case root
    case results(String)
    case row(String, docID: String)

    static let fileExtension = ".json"

    /// Whether a name in `queries/` is a file kept as written rather than a results folder.
    static func isFileName(_ name: String) -> Bool {
        name.hasSuffix(fileExtension) || name.hasPrefix(".") || FileNames.isToolTemporary(name)
            || (name.hasPrefix("#") && name.hasSuffix("#"))  // emacs's auto-save
    }

    /// The name of the results folder of a query file, if `file` is one.
    static func resultsName(ofFile file: String) -> String? {
        guard file.hasSuffix(fileExtension), case let name = String(file.dropLast(fileExtension.count)),
              !name.isEmpty, !isFileName(name) else { return nil }
        return name
    }

    init?(_ parts: [String]) {
        switch parts.count {
        case 0: self = .root
        case 1: self = .results(parts[0])
        case 2: self = .row(parts[0], docID: FileNames.unescape(parts[1]))
        default: return nil
        }
    }
}

/// The file names of a view's keys. A string key is its own text, as people search for it
/// (`views/app/by_tag/travel`), unless that text would read as another key or as one of the
/// folder's own files: then it is written as JSON (`"12"`, `"true"`, `"_reduce.json"`). Any
/// other key is its JSON text (`2024`, `[2024,5]`, `null`). `/` and `%` are escaped as in
/// document ids. A key whose name would be longer than a file name may be (255 bytes) is not
/// shown.
enum ViewKeyNames {
    static func name(of key: JSONValue) -> String? {
        let text: String
        if case .string(let string) = key, isPlain(string) {
            text = string
        } else {
            text = key.jsonString()
        }
        let name = FileNames.escape(text)
        return name.utf8.count <= 255 ? name : nil
    }

    /// The key a name shows, or nil when no key has that name (so the path is not found).
    static func key(named name: String) -> JSONValue? {
        let text = FileNames.unescape(name)
        let key: JSONValue
        if let parsed = try? JSONParser.parse(Array(text.utf8)) {  // not JSON: a plain string
            key = parsed
        } else {
            key = .string(text)
        }
        // Only the name the listing shows: `[1, 2]` is no other name of the key [1,2]. (Not a
        // ternary: its `nil` would be JSON's null.)
        guard self.name(of: key) == name else { return nil }
        return key
    }

    private static func isPlain(_ string: String) -> Bool {
        guard let first = string.first, first != "_", first != "\"" else { return false }
        return (try? JSONParser.parse(Array(string.utf8))) == nil  // text that is not JSON reads as itself
    }
}

extension DocumentID {
    /// Whether `id` may be a stored document's (valid, and not a `_local` one, which has no
    /// folder): a name that cannot be is not looked for in the database.
    static func isStorable(_ id: String) -> Bool {
        !isLocal(id) && (try? validate(id)) != nil
    }
}

/// The nodes every saved document has — its folder, properties.json and attachments/ — are
/// numbered from the document's storage key (`FileAttributes.number`): the mount keeps nothing
/// for them while the kernel holds them, so `ls -l docs/` or a `find` through a million
/// documents takes no memory in the mount, and the number finds the path again.
struct DocumentPart: Equatable {
    enum Part: UInt64 { case folder = 0, properties = 1, attachments = 2 }
    let key: Int64
    let part: Part

    init(key: Int64, part: Part) {
        self.key = key
        self.part = part
    }

    init?(number: UInt64) {
        guard let part = Part(rawValue: number & 3) else { return nil }
        self.key = Int64(number >> 2)
        self.part = part
    }

    /// Two bits for the part; nil for a key too large to number (its nodes are kept instead).
    var number: UInt64? {
        key >= 0 && key < 1 << 45 ? UInt64(key) << 2 | part.rawValue : nil
    }

    func path(_ id: String) -> String {
        switch part {
        case .folder: String.documentPath(id)
        case .properties: String.documentPath(id) + "/" + Node.propertiesFileName
        case .attachments: String.documentPath(id) + "/" + Node.attachmentsDirectoryName
        }
    }

    /// The document and part a node is, if it is one of the numbered ones.
    static func of(_ node: Node) -> (id: String, part: Part)? {
        switch node {
        case .document(let id): (id, .folder)
        case .properties(let id): (id, .properties)
        case .attachment(let id, ""): (id, .attachments)
        default: nil
        }
    }
}
