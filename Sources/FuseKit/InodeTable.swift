@preconcurrency import CFuse3
import Foundation

/// The kernel's inode numbers for the paths of a path-based `FileSystem`, with the
/// lookup counts of libfuse's low-level protocol: a node is remembered from the reply
/// that names it (lookup, create, mkdir, readdirplus) until the kernel forgets it.
/// A node stores its parent and name, so a rename moves everything under it at once.
///
/// A node the file system numbers itself (`FileAttributes.number`) is not kept: its inode
/// number is `numbered + number`, and its path is asked of the file system when needed, so a
/// million document folders looked up by `ls -l` take no memory here. Such a node is kept
/// only when a rename moves it (its number no longer leads to its path); a name with a
/// node is always answered from the node, and a number that has a node is never derived again.
final class InodeTable: @unchecked Sendable {
    // Sendable invariant: everything is guarded by `lock`.
    private struct Node {
        /// 0 once unlinked or replaced: the node lives on (open files) without a path.
        var parent: fuse_ino_t
        var name: String
        var lookups: UInt64
    }

    static let root: fuse_ino_t = 1
    /// Numbers from here up are `numbered + FileAttributes.number`; nodes made here count up
    /// from 2 and never reach it.
    static let numbered: fuse_ino_t = 1 << 48
    /// Lookups of a numbered node are not counted; a node made for one when it moved is kept
    /// for the mount's life (the kernel's count of it is not known): a few bytes per document
    /// folder moved, or per properties.json an editor renames to a backup name.
    private static let uncounted: UInt64 = 1 << 62
    private let lock = NSLock()
    /// The path of a numbered node, and the number of a path (`FileSystem.path(ofNumber:)`,
    /// `FileSystem.number(ofPath:)`). Called without `lock` held.
    private let pathOfNumber: @Sendable (UInt64) throws -> String?
    private let numberOfPath: @Sendable (String) -> UInt64?
    private let numberedChildren: @Sendable (String) -> [(name: String, number: UInt64)]
    private var nodes: [fuse_ino_t: Node] = [InodeTable.root: Node(parent: 0, name: "", lookups: 1)]
    /// The named nodes of each directory node.
    private var children: [fuse_ino_t: [String: fuse_ino_t]] = [:]
    private var next: fuse_ino_t = 2

    init(pathOfNumber: @escaping @Sendable (UInt64) throws -> String? = { _ in nil },
         numberOfPath: @escaping @Sendable (String) -> UInt64? = { _ in nil },
         numberedChildren: @escaping @Sendable (String) -> [(name: String, number: UInt64)] = { _ in [] }) {
        self.pathOfNumber = pathOfNumber
        self.numberOfPath = numberOfPath
        self.numberedChildren = numberedChildren
    }

    /// The path of `ino`; nil for a node that has none any more (or is unknown). Throws what
    /// the file system throws when it cannot tell a numbered node's path.
    func path(_ ino: fuse_ino_t) throws -> String? {
        // The names up to the root, or up to a numbered node, whose path the file system gives.
        var names: [String] = []
        let top: fuse_ino_t? = lock.withLock {
            var current = ino
            while current != InodeTable.root {
                guard let node = nodes[current] else { return current >= InodeTable.numbered ? current : nil }
                guard node.parent != 0 else { return nil }
                names.append(node.name)
                current = node.parent
            }
            return InodeTable.root
        }
        guard let top else { return nil }
        let base: String
        if top == InodeTable.root {
            base = ""
        } else {
            guard let path = try pathOfNumber(top - InodeTable.numbered) else { return nil }
            base = path
        }
        guard !names.isEmpty else { return base.isEmpty ? "/" : base }
        var path = base
        path.reserveCapacity(names.reduce(base.utf8.count) { $0 + 1 + $1.utf8.count })
        for name in names.reversed() {
            path += "/"
            path += name
        }
        return path
    }

    /// The path of `name` in the directory `parent`.
    func path(_ parent: fuse_ino_t, _ name: String) throws -> String? {
        try path(parent).map { $0 == "/" ? "/" + name : $0 + "/" + name }
    }

    /// Counts one lookup of `name` in `parent` and returns its number: the node's, else the
    /// file system's `number` for it (nothing kept), else a new node's.
    func remember(_ parent: fuse_ino_t, _ name: String, number: UInt64? = nil) -> fuse_ino_t {
        lock.withLock {
            if let ino = children[parent]?[name] {
                nodes[ino]!.lookups += 1
                return ino
            }
            if let number, number < InodeTable.numbered, nodes[InodeTable.numbered + number] == nil {
                return InodeTable.numbered + number
            }
            let ino = next
            next += 1
            nodes[ino] = Node(parent: parent, name: name, lookups: 1)
            children[parent, default: [:]][name] = ino
            return ino
        }
    }

    /// The kernel dropped `count` lookups of `ino`.
    func forget(_ ino: fuse_ino_t, _ count: UInt64) {
        lock.withLock {
            guard ino != InodeTable.root, var node = nodes[ino] else { return }
            node.lookups -= min(count, node.lookups)
            guard node.lookups == 0 else {
                nodes[ino] = node
                return
            }
            nodes[ino] = nil
            if children[node.parent]?[node.name] == ino { take(node.parent, node.name) }
        }
    }

    /// `name` in `parent` is gone (unlink, rmdir).
    func removed(_ parent: fuse_ino_t, _ name: String) {
        lock.withLock { _ = detach(parent, name) }
    }

    /// The numbered nodes a rename of `name` in `parent` (at `path`) moves: numbers no longer
    /// lead to their paths once moved, so `renamed` keeps nodes for them. Asked before the rename.
    struct Moving {
        /// The node's own number, when it has no node.
        var number: UInt64?
        /// The numbered nodes below it, parents first, by their names from it.
        var below: [(names: [String], number: UInt64)] = []
    }

    func moving(_ parent: fuse_ino_t, _ name: String, at path: String) -> Moving {
        var result = Moving(number: hasNode(parent, name) ? nil : numberOfPath(path))
        var pending: [(names: [String], path: String)] = [([], path)]
        while !pending.isEmpty {
            let (names, path) = pending.removeFirst()
            for child in numberedChildren(path) {
                result.below.append((names + [child.name], child.number))
                pending.append((names + [child.name], path + "/" + child.name))
            }
        }
        return result
    }

    /// `name` in `parent` is now `newName` in `newParent` (swapped with it for an exchange).
    /// `moved` is `moving` of the name before the rename, `swapped` of the new name (an exchange).
    func renamed(_ parent: fuse_ino_t, _ name: String, to newParent: fuse_ino_t, _ newName: String, exchange: Bool,
                 moved: Moving = Moving(), swapped: Moving = Moving()) {
        lock.withLock {
            keep(parent, name, moved)
            if exchange { keep(newParent, newName, swapped) }
            let moving = take(parent, name)
            if exchange, let replaced = take(newParent, newName) {
                nodes[replaced]?.parent = parent
                nodes[replaced]?.name = name
                children[parent, default: [:]][name] = replaced
            } else {
                detach(newParent, newName)
            }
            if let moving {
                nodes[moving]?.parent = newParent
                nodes[moving]?.name = newName
                children[newParent, default: [:]][newName] = moving
            }
        }
    }

    /// `ino` keeps its path but the path no longer leads to it: the next lookup of its name makes
    /// a new node (a file open through passthrough is tied to its inode's backing file, so later
    /// opens of the name, for writing too, need an inode of their own). Returns its parent and name.
    func retire(_ ino: fuse_ino_t) -> (parent: fuse_ino_t, name: String)? {
        lock.withLock {
            guard let node = nodes[ino], node.parent != 0, children[node.parent]?[node.name] == ino else { return nil }
            take(node.parent, node.name)
            return (node.parent, node.name)
        }
    }

    /// The number of the node at `path`, if the kernel may know it (a numbered node's number
    /// is given whether or not the kernel has looked it up: telling it about one it does not
    /// know does nothing).
    func number(of path: String) -> fuse_ino_t? {
        var ino = InodeTable.root
        var walked = ""
        for name in path.split(separator: "/") {
            walked += "/" + name
            if let child = lock.withLock({ children[ino]?[String(name)] }) {
                ino = child
                continue
            }
            guard let number = numberOfPath(walked), number < InodeTable.numbered,
                  lock.withLock({ nodes[InodeTable.numbered + number] == nil }) else { return nil }
            ino = InodeTable.numbered + number
        }
        return ino
    }

    /// How many nodes are kept (the root aside).
    var count: Int {
        lock.withLock { nodes.count - 1 }
    }

    /// Whether `ino` has a node here (else it is a numbered one, or unknown).
    func isKept(_ ino: fuse_ino_t) -> Bool {
        lock.withLock { nodes[ino] != nil }
    }

    /// Whether `name` in `parent` has a node (else it is unknown, or a numbered one).
    func hasNode(_ parent: fuse_ino_t, _ name: String) -> Bool {
        lock.withLock { children[parent]?[name] != nil }
    }

    /// Every node the kernel may know below `ino` at `path`: those kept, and the numbered ones.
    func descendants(of ino: fuse_ino_t, at path: String) -> [fuse_ino_t] {
        var found: [fuse_ino_t] = [], pending = [(ino, path)]
        while let (next, path) = pending.popLast() {
            var below = lock.withLock { (children[next] ?? [:]).map { ($0.value, path + "/" + $0.key) } }
            for child in numberedChildren(path) where child.number < InodeTable.numbered {
                let numbered = InodeTable.numbered + child.number
                if lock.withLock({ children[next]?[child.name] == nil && nodes[numbered] == nil }) {
                    below.append((numbered, path + "/" + child.name))
                }
            }
            found += below.map(\.0)
            pending += below
        }
        return found
    }

    /// Keeps nodes for `name` in `parent` and the numbered nodes below it (see `moving`).
    private func keep(_ parent: fuse_ino_t, _ name: String, _ moving: Moving) {
        pin(parent, name, moving.number)
        guard let top = children[parent]?[name] else { return }
        below: for (names, number) in moving.below {
            var ino = top
            for name in names.dropLast() {
                guard let next = children[ino]?[name] else { continue below }
                ino = next
            }
            pin(ino, names.last!, number)
        }
    }

    /// Gives the numbered node `name` in `parent` a node, kept until its name goes.
    private func pin(_ parent: fuse_ino_t, _ name: String, _ number: UInt64?) {
        guard children[parent]?[name] == nil, let number, number < InodeTable.numbered else { return }
        let ino = InodeTable.numbered + number
        guard nodes[ino] == nil else { return }
        nodes[ino] = Node(parent: parent, name: name, lookups: InodeTable.uncounted)
        children[parent, default: [:]][name] = ino
    }

    /// Removes `name` from `parent`'s children and returns its node.
    @discardableResult
    private func take(_ parent: fuse_ino_t, _ name: String) -> fuse_ino_t? {
        guard let ino = children[parent]?.removeValue(forKey: name) else { return nil }
        if children[parent]?.isEmpty == true { children[parent] = nil }
        return ino
    }

    /// `name` in `parent` is gone: its node lives on without a path while the kernel holds it.
    @discardableResult
    private func detach(_ parent: fuse_ino_t, _ name: String) -> fuse_ino_t? {
        guard let ino = take(parent, name) else { return nil }
        nodes[ino]?.parent = 0
        return ino
    }
}
