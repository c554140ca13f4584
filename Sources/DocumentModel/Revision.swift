/// A revision id, `GENERATION-SUFFIX` (`3-9b2f…`).
///
/// Sofa derives the suffix from the parent id, the deleted flag and a canonical
/// encoding of the body and attachment digests, so identical edits made on two
/// replicas get identical ids. Revisions from other servers keep their own suffixes.
public struct RevisionID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let generation: Int
    public let suffix: String

    public init(generation: Int, suffix: String) {
        self.generation = generation
        self.suffix = suffix
    }

    /// Parses `GEN-SUFFIX`; nil unless GEN is a positive decimal and SUFFIX is not empty.
    public init?(_ text: String) {
        guard let dash = text.firstIndex(of: "-"),
              let generation = Int(text[..<dash]), generation >= 1,
              text[..<dash].allSatisfy(\.isASCII),
              text.index(after: dash) < text.endIndex else { return nil }
        self.generation = generation
        self.suffix = String(text[text.index(after: dash)...])
    }

    /// Parses or throws `SofaError.invalidRevisionID`.
    public static func parse(_ text: String) throws(SofaError) -> RevisionID {
        guard let rev = RevisionID(text) else { throw .invalidRevisionID(text) }
        return rev
    }

    public var description: String { "\(generation)-\(suffix)" }

    /// CouchDB's order: by generation, then by suffix bytes.
    public static func < (lhs: RevisionID, rhs: RevisionID) -> Bool {
        lhs.generation != rhs.generation ? lhs.generation < rhs.generation : lhs.suffix.utf8.lexicographicallyPrecedes(rhs.suffix.utf8)
    }

    /// The id of a new revision with this content on top of `parent`.
    ///
    /// `attachments` are (name, digest) pairs; their order does not matter.
    public static func derive(parent: RevisionID?, deleted: Bool, properties: JSONObject,
                              attachments: [(name: String, digest: String)]) -> RevisionID {
        let sorted = attachments.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        let encoding: JSONValue = .array([
            parent.map { .string($0.description) } ?? .null,
            .bool(deleted),
            .object(properties),
            .array(sorted.map { .array([.string($0.name), .string($0.digest)]) }),
        ])
        let digest = MessageDigest.hash(.md5, encoding.serialized(.canonical))
        return RevisionID(generation: (parent?.generation ?? 0) + 1, suffix: BlobKey.hexString(digest))
    }
}

/// One revision in a document's tree.
public struct RevisionNode: Hashable, Sendable {
    public let id: RevisionID
    /// The parent id, or nil for a root (or when history above was pruned).
    public let parent: RevisionID?
    public let deleted: Bool
    public let isLeaf: Bool

    public init(id: RevisionID, parent: RevisionID?, deleted: Bool, isLeaf: Bool) {
        self.id = id
        self.parent = parent
        self.deleted = deleted
        self.isLeaf = isLeaf
    }
}

/// A document's revision tree: every known revision with its parent.
///
/// The winner follows CouchDB so that all replicas agree: a live leaf beats a
/// deleted one, then the higher generation wins, then the higher suffix.
public struct RevisionTree: Sendable {
    public let nodes: [RevisionID: RevisionNode]

    public init(_ nodes: [RevisionNode]) {
        self.nodes = Dictionary(nodes.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
    }

    public var leaves: [RevisionNode] { nodes.values.filter(\.isLeaf).sorted(by: RevisionTree.winsOver) }

    /// The current revision; nil only for an empty tree.
    public var winner: RevisionNode? { leaves.first }

    /// Live leaves other than the winner: the document's conflicts.
    public var conflicts: [RevisionNode] { leaves.dropFirst().filter { !$0.deleted } }

    public func contains(_ id: RevisionID) -> Bool { nodes[id] != nil }

    /// `id` and its known ancestors, newest first.
    public func history(of id: RevisionID) -> [RevisionID] {
        var result: [RevisionID] = []
        var current: RevisionID? = id
        while let rev = current, let node = nodes[rev], result.count <= nodes.count {
            result.append(rev)
            current = node.parent
        }
        return result
    }

    /// The revisions to forget so that at most `limit` generations stay behind every leaf.
    public func revisionsBeyond(limit: Int) -> [RevisionID] {
        var keep = Set<RevisionID>()
        for leaf in nodes.values where leaf.isLeaf {
            keep.formUnion(history(of: leaf.id).prefix(limit))
        }
        return nodes.keys.filter { !keep.contains($0) }.sorted()
    }

    /// Whether `a` beats `b` for the winner: live first, then higher revision id.
    public static func winsOver(_ a: RevisionNode, _ b: RevisionNode) -> Bool {
        if a.deleted != b.deleted { return !a.deleted }
        return b.id < a.id
    }
}
