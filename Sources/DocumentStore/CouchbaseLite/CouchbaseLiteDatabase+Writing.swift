import DocumentModel
import Foundation

/// Writing revisions into a Couchbase Lite 3 database as LiteCore does: each document's row
/// holds its current revision (binary id in `version`, Fleece in `body`) and its revision tree
/// (`extra`, in LiteCore's priority order); a document whose current revision is deleted lives
/// in `kv_del_default`; every changed document takes the next sequence; new dictionary keys
/// join the shared-key table in the same transaction; blob bodies are files in `Attachments/`,
/// installed (synced, then renamed into place) before any row names them.
extension CouchbaseLiteDatabase {
    /// A revision to store with its history (ancestors parent first), its body as Couchbase
    /// Lite keeps it: blob dictionaries in place, attachments in `_attachments` by SHA-1.
    public struct IncomingRevision: Sendable {
        public let docID: String
        public let revID: RevisionID
        public let ancestors: [RevisionID]
        public let deleted: Bool
        public let body: JSONObject

        public init(docID: String, revID: RevisionID, ancestors: [RevisionID], deleted: Bool, body: JSONObject) {
            (self.docID, self.revID, self.ancestors, self.deleted, self.body) = (docID, revID, ancestors, deleted, body)
        }
    }

    /// Makes a new, empty Couchbase Lite 3 database at `path` (`NAME.cblite2`), with the tables,
    /// settings and identity LiteCore 3.2 gives one, and opens it for writing.
    public static func create(at path: String) throws -> CouchbaseLiteDatabase {
        var trimmed = path
        while trimmed.count > 1, trimmed.hasSuffix("/") { trimmed.removeLast() }
        guard access(trimmed, F_OK) != 0 else { throw SofaError.databaseExists(path: trimmed) }
        // Made beside, then renamed into place: a killed run leaves no half-made database.
        let partial = (trimmed as NSString).deletingLastPathComponent + "/." + (trimmed as NSString).lastPathComponent + ".partial-\(getpid())"
        try? FileManager.default.removeItem(atPath: partial)
        try FileManager.default.createDirectory(atPath: partial + "/Attachments", withIntermediateDirectories: true)
        do {
            let connection = try SQLiteConnection(path: partial + "/db.sqlite3", create: true)
            try connection.execute("""
                PRAGMA auto_vacuum = incremental;
                PRAGMA journal_mode = WAL;
                BEGIN;
                CREATE TABLE kvmeta (name TEXT PRIMARY KEY, lastSeq INTEGER DEFAULT 0, purgeCnt INTEGER DEFAULT 0) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS "kv_default" (  key TEXT PRIMARY KEY,  sequence INTEGER,  flags INTEGER DEFAULT 0,  version BLOB,  body BLOB,  extra BLOB, expiration INTEGER);
                CREATE TABLE IF NOT EXISTS "kv_del_default" (  key TEXT PRIMARY KEY,  sequence INTEGER,  flags INTEGER DEFAULT 0,  version BLOB,  body BLOB,  extra BLOB, expiration INTEGER);
                CREATE INDEX "kv_default_expiration" ON "kv_default" (expiration) WHERE expiration not null;
                CREATE INDEX "kv_del_default_expiration" ON "kv_del_default" (expiration) WHERE expiration not null;
                CREATE INDEX "kv_default_conflicts" ON "kv_default" (flags) WHERE (flags & 2) != 0;
                CREATE INDEX "kv_del_default_conflicts" ON "kv_del_default" (flags) WHERE (flags & 2) != 0;
                CREATE TABLE IF NOT EXISTS "kv_info" (  key TEXT PRIMARY KEY,  sequence INTEGER,  flags INTEGER DEFAULT 0,  version BLOB,  body BLOB,  extra BLOB);
                INSERT INTO kvmeta (name, lastSeq, purgeCnt) VALUES ('default', 0, 0);
                """)
            for key in ["publicUUID", "privateUUID"] {
                var uuid = UUID().uuid
                let bytes = withUnsafeBytes(of: &uuid) { Array($0) }
                try connection.run("INSERT INTO kv_info (key, body) VALUES (?, ?)", .text(key), .blob(bytes))
            }
            try connection.run("INSERT INTO kv_info (key, body) VALUES ('versioning', ?)", .blob([0, 0, 0, 0, 0, 0, 0, 1]))
            try connection.execute("COMMIT; PRAGMA user_version = 501;")
        } catch {
            try? FileManager.default.removeItem(atPath: partial)
            throw error
        }
        guard rename(partial, trimmed) == 0 else {
            let code = errno
            try? FileManager.default.removeItem(atPath: partial)
            throw SofaError.io(operation: "rename", path: trimmed, errno: code)
        }
        return try open(at: trimmed, writable: true)
    }

    /// Which of `revs` this database lacks, per document, with the leaves they may descend
    /// from (CouchDB's `_revs_diff`).
    public func revsDiff(_ revs: [(id: String, revs: [RevisionID])]) throws -> [(id: String, missing: MissingRevisions)] {
        try revs.compactMap { id, wanted in
            guard let document = try document(id) else {
                return (id, MissingRevisions(missing: wanted, possibleAncestors: []))
            }
            let tree = try revisionTree(of: document)
            let missing = wanted.filter { tree.index(of: $0) == nil }
            guard !missing.isEmpty else { return nil }
            let newest = missing.map(\.generation).max() ?? 0
            let ancestors = tree.revisions.filter { $0.isLeaf && $0.id.generation < newest }.map(\.id)
            return (id, MissingRevisions(missing: missing, possibleAncestors: ancestors))
        }
    }

    /// Installs the body at `path` (a store's file, whose bytes are `key`'s) into `Attachments/`
    /// as a hard link; false when it cannot be linked (another file system), for a copy instead.
    public func linkBlob(_ key: BlobKey, from path: String) -> Bool {
        let final = blobPath(key)
        if access(final, F_OK) == 0 { return true }
        try? FileManager.default.createDirectory(atPath: "\(self.path)/Attachments", withIntermediateDirectories: true)
        guard link(path, final) == 0 || errno == EEXIST else { return false }
        let folder = Foundation.open("\(self.path)/Attachments", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 {
            fsync(folder)
            close(folder)
        }
        return true
    }

    /// Installs a blob body into `Attachments/` from `reader`, checked against `key`: written
    /// beside, synced, renamed into place (a body there already is kept).
    public func installBlob(_ key: BlobKey, from reader: BlobReader) throws {
        let final = blobPath(key)
        guard access(final, F_OK) != 0 else { return }
        try FileManager.default.createDirectory(atPath: "\(path)/Attachments", withIntermediateDirectories: true)
        let temporary = "\(path)/Attachments/.incoming-\(getpid())-\(UUID().uuidString)"
        let fd = Foundation.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("create", path: temporary, errno: errno) }
        var closed = false
        defer {
            if !closed { close(fd) }
            unlink(temporary)
        }
        let digest = MessageDigest(.sha1)
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while case let count = try reader.read(into: buffer), count > 0 {
            let chunk = UnsafeRawBufferPointer(rebasing: buffer[0..<count])
            digest.update(chunk)
            var written = 0
            while written < count {
                let result = Foundation.write(fd, chunk.baseAddress! + written, count - written)
                guard result > 0 else { throw SofaError.system("write", path: temporary, errno: errno) }
                written += result
            }
        }
        guard BlobKey(digest: digest.finalize()) == key else { throw SofaError.blobCorrupted(key: key.hex, path: temporary) }
        guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: temporary, errno: errno) }
        close(fd)
        closed = true
        guard rename(temporary, final) == 0 else { throw SofaError.system("rename", path: final, errno: errno) }
        let folder = Foundation.open("\(path)/Attachments", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 {
            fsync(folder)
            close(folder)
        }
    }

    /// Stores revisions (with their histories) in one transaction, each document under a new
    /// sequence. A revision already here is skipped; returns how many were added.
    public func insert(_ revisions: [IncomingRevision]) throws -> Int {
        guard writable else { throw SofaError.invalidArgument("\(path) is open for reading only") }
        try connection.execute("BEGIN IMMEDIATE")
        do {
            var keys = SharedKeys(try Self.sharedKeys(connection, path: path))
            var lastSequence = try connection.query("SELECT lastSeq FROM kvmeta WHERE name = 'default'") { $0.int64(0) }.first ?? 0
            var added = 0
            for revision in revisions {
                var writer = FleeceWriter(sharedKeys: keys)
                guard try insert(revision, sequence: lastSequence + 1, writer: &writer) else { continue }
                keys = writer.keys
                lastSequence += 1
                added += 1
            }
            if keys.added > 0 {
                var writer = FleeceWriter(sharedKeys: SharedKeys([]))
                let table = writer.encode(.array(keys.keys.map { .string($0) }))
                try connection.run("INSERT OR REPLACE INTO kv_info (key, body) VALUES ('SharedKeys', ?)", .blob(table))
            }
            try connection.run("INSERT OR REPLACE INTO kvmeta (name, lastSeq, purgeCnt) VALUES ('default', ?, COALESCE((SELECT purgeCnt FROM kvmeta WHERE name = 'default'), 0))",
                               .integer(lastSequence))
            try connection.execute("COMMIT")
            sharedKeys = keys.keys
            return added
        } catch {
            try? connection.execute("ROLLBACK")
            throw error
        }
    }

    /// One revision into its document's tree; false when the tree has it already.
    private func insert(_ revision: IncomingRevision, sequence: Int64, writer: inout FleeceWriter) throws -> Bool {
        let existing = try document(revision.docID)
        var nodes: [MutableRevision] = []
        var currentBefore: RevisionID?
        var remotes: [Int: RevisionID] = [:]
        var rejected: [RevisionID] = []
        if let existing {
            let tree = try revisionTree(of: existing)
            for raw in tree.revisions {
                var body = raw.body
                if raw.id == existing.revID { body = existing.body }
                nodes.append(MutableRevision(id: raw.id, parent: raw.parent.map { tree.revisions[$0].id }, flags: raw.flags,
                                             sequence: raw.id == existing.revID ? existing.sequence : raw.sequence, body: body))
            }
            currentBefore = existing.revID
            remotes = tree.remotes.mapValues { tree.revisions[$0].id }
            rejected = tree.rejected.map { tree.revisions[$0].id }
        }
        guard !nodes.contains(where: { $0.id == revision.revID }) else { return false }

        // The history: the ancestors this tree lacks, down to the first one it has.
        let known = revision.ancestors.firstIndex { id in nodes.contains { $0.id == id } }
        let missingAncestors = revision.ancestors[..<(known ?? revision.ancestors.count)]
        var parent = known.map { revision.ancestors[$0] }
        for ancestor in missingAncestors.reversed() {
            nodes.append(MutableRevision(id: ancestor, parent: parent, flags: 0, sequence: 0, body: nil))
            parent = ancestor
        }
        if let parent, let index = nodes.firstIndex(where: { $0.id == parent }) {
            nodes[index].flags &= ~LiteCoreRevisionTree.leaf
        }
        let body = revision.deleted ? JSONObject() : revision.body
        var flags = LiteCoreRevisionTree.leaf | LiteCoreRevisionTree.keepBody
        if revision.deleted { flags |= LiteCoreRevisionTree.deleted }
        if Self.hasAttachments(body, docID: revision.docID) { flags |= LiteCoreRevisionTree.hasAttachments }
        // A live branch that does not continue the current revision is a conflict for the app to
        // resolve, as when LiteCore's own puller brings one; the current revision stays. (A
        // deleted one ends its branch: it conflicts with nothing.)
        if !revision.deleted, let currentBefore, let current = nodes.first(where: { $0.id == currentBefore }),
           current.flags & LiteCoreRevisionTree.leaf != 0, current.flags & LiteCoreRevisionTree.deleted == 0 {
            flags |= LiteCoreRevisionTree.isConflict
        }
        nodes.append(MutableRevision(id: revision.revID, parent: parent, flags: flags, sequence: 0, body: writer.encode(.object(body))))

        // Only one revision of a branch keeps its body past being a leaf; others lose theirs.
        for index in nodes.indices where nodes[index].flags & LiteCoreRevisionTree.leaf == 0 {
            nodes[index].flags &= ~LiteCoreRevisionTree.keepBody
            nodes[index].body = nil
        }
        nodes.sort(by: MutableRevision.goesFirst)
        // The current branch deleted while a conflicting one lives: the conflict is resolved in
        // the living branch's favour, which is no longer a conflict (LiteCore's own rule).
        if nodes[0].flags & LiteCoreRevisionTree.deleted != 0,
           let living = nodes.firstIndex(where: { $0.flags & (LiteCoreRevisionTree.leaf | LiteCoreRevisionTree.deleted) == LiteCoreRevisionTree.leaf }) {
            var branch: RevisionID? = nodes[living].id
            while let id = branch, let index = nodes.firstIndex(where: { $0.id == id }), nodes[index].flags & LiteCoreRevisionTree.isConflict != 0 {
                nodes[index].flags &= ~LiteCoreRevisionTree.isConflict
                branch = nodes[index].parent
            }
            nodes.sort(by: MutableRevision.goesFirst)
        }
        let current = nodes[0]
        let indexOf = Dictionary(nodes.enumerated().map { ($0.element.id, $0.offset) }, uniquingKeysWith: { first, _ in first })
        var extra: [UInt8] = []
        for node in nodes {
            let isCurrent = node.id == current.id
            var record: [UInt8] = []
            let parentIndex = node.parent.flatMap { indexOf[$0] } ?? 0xFFFF
            let storedBody = isCurrent ? nil : node.body
            let idBytes = Self.binary(node.id)
            record += [UInt8(parentIndex >> 8), UInt8(parentIndex & 0xFF)]
            record.append(node.flags | (storedBody != nil ? LiteCoreRevisionTree.hasData : 0))
            record.append(UInt8(idBytes.count))
            record += idBytes
            var sequenceValue = UInt64(isCurrent ? 0 : node.sequence)
            while sequenceValue >= 0x80 {
                record.append(UInt8(sequenceValue & 0x7F) | 0x80)
                sequenceValue >>= 7
            }
            record.append(UInt8(sequenceValue))
            record += storedBody ?? []
            let size = record.count + 4
            extra += [UInt8(size >> 24 & 0xFF), UInt8(size >> 16 & 0xFF), UInt8(size >> 8 & 0xFF), UInt8(size & 0xFF)] + record
        }
        extra += [0, 0, 0, 0]
        for (remote, id) in remotes.sorted(by: { $0.key < $1.key }) {
            guard let index = indexOf[id] else { continue }
            extra += [UInt8(remote >> 8), UInt8(remote & 0xFF), UInt8(index >> 8), UInt8(index & 0xFF)]
        }
        extra += [0, 0, 0, 0]
        for id in rejected {
            guard let index = indexOf[id] else { continue }
            extra += [0, 0, UInt8(index >> 8), UInt8(index & 0xFF)]
        }

        var documentFlags: DocumentFlags = []
        if current.flags & LiteCoreRevisionTree.deleted != 0 { documentFlags.insert(.deleted) }
        if current.flags & LiteCoreRevisionTree.hasAttachments != 0 { documentFlags.insert(.hasAttachments) }
        let liveConflict = LiteCoreRevisionTree.isConflict | LiteCoreRevisionTree.leaf
        if nodes.contains(where: { $0.flags & (liveConflict | LiteCoreRevisionTree.deleted) == liveConflict }) {
            documentFlags.insert(.conflicted)
        }
        let table = documentFlags.contains(.deleted) ? "kv_del_default" : "kv_default"
        let other = table == "kv_default" ? "kv_del_default" : "kv_default"
        try connection.run("DELETE FROM \(other) WHERE key = ?", .text(revision.docID))
        try connection.run("INSERT OR REPLACE INTO \(table) (key, sequence, flags, version, body, extra) VALUES (?, ?, ?, ?, ?, ?)",
                           .text(revision.docID), .integer(sequence), .integer(Int64(documentFlags.rawValue)),
                           .blob(Self.binary(current.id)), .blob(current.body ?? writer.encode(.object([:]))), .blob(extra))
        return true
    }

    /// Whether a body names a blob or an attachment (LiteCore's has-attachments flag, which
    /// its compaction goes by: a body without it keeps no blob alive).
    static func hasAttachments(_ body: JSONObject, docID: String) -> Bool {
        if body["_attachments"]?.objectValue?.isEmpty == false { return true }
        return (try? Blobs.find(in: body, docID: docID, lenient: true).isEmpty) == false
    }

    /// A revision id as LiteCore stores it: a varint generation and the digest's bytes.
    static func binary(_ id: RevisionID) -> [UInt8] {
        var bytes: [UInt8] = []
        var generation = UInt64(id.generation)
        while generation >= 0x80 {
            bytes.append(UInt8(generation & 0x7F) | 0x80)
            generation >>= 7
        }
        bytes.append(UInt8(generation))
        var iterator = id.suffix.utf8.makeIterator()
        while let high = iterator.next(), let low = iterator.next() {
            bytes.append((ASCII.hexValue(high) ?? 0) << 4 | (ASCII.hexValue(low) ?? 0))  // `canStore` checked them
        }
        return bytes
    }

    /// Whether LiteCore can store `id`: its digest must be an even number of lowercase hex digits.
    public static func canStore(_ id: RevisionID) -> Bool {
        let suffix = id.suffix.utf8
        return !suffix.isEmpty && suffix.count % 2 == 0 && suffix.count <= 64
            && suffix.allSatisfy(ASCII.isLowerHexDigit)
    }
}

/// A revision of a tree being rewritten.
struct MutableRevision {
    let id: RevisionID
    let parent: RevisionID?
    var flags: UInt8
    var sequence: Int64
    var body: [UInt8]?

    /// LiteCore's priority order (`compareRevs`): leaves, then not conflicts, then live, then not
    /// closed, then the higher revision id. The first is the current revision.
    static func goesFirst(_ a: MutableRevision, _ b: MutableRevision) -> Bool {
        func has(_ revision: MutableRevision, _ flag: UInt8) -> Bool { revision.flags & flag != 0 }
        if has(a, LiteCoreRevisionTree.leaf) != has(b, LiteCoreRevisionTree.leaf) { return has(a, LiteCoreRevisionTree.leaf) }
        if has(a, LiteCoreRevisionTree.isConflict) != has(b, LiteCoreRevisionTree.isConflict) { return !has(a, LiteCoreRevisionTree.isConflict) }
        if has(a, LiteCoreRevisionTree.deleted) != has(b, LiteCoreRevisionTree.deleted) { return !has(a, LiteCoreRevisionTree.deleted) }
        if has(a, LiteCoreRevisionTree.closed) != has(b, LiteCoreRevisionTree.closed) { return !has(a, LiteCoreRevisionTree.closed) }
        if a.id.generation != b.id.generation { return a.id.generation > b.id.generation }
        return CouchbaseLiteDatabase.binary(b.id).lexicographicallyPrecedes(CouchbaseLiteDatabase.binary(a.id))
    }
}
