@preconcurrency import CFuse3
import Foundation

/// The kernel's inode numbers for the paths of a path-based `FileSystem`, with the
/// lookup counts of libfuse's low-level protocol: a node is remembered from the reply
/// that names it (lookup, create, mkdir, readdirplus) until the kernel forgets it.
/// A node stores its parent and name, so a rename moves everything under it at once.
final class InodeTable: @unchecked Sendable {
    // Sendable invariant: everything is guarded by `lock`.
    private struct Node {
        /// 0 once unlinked or replaced: the node lives on (open files) without a path.
        var parent: fuse_ino_t
        var name: String
        var lookups: UInt64
    }

    private struct Key: Hashable {
        let parent: fuse_ino_t
        let name: String
    }

    static let root: fuse_ino_t = 1
    private let lock = NSLock()
    private var nodes: [fuse_ino_t: Node] = [InodeTable.root: Node(parent: 0, name: "", lookups: 1)]
    private var children: [Key: fuse_ino_t] = [:]
    private var next: fuse_ino_t = 2

    /// The path of `ino`; nil for a node that has none any more (or is unknown).
    func path(_ ino: fuse_ino_t) -> String? {
        lock.withLock { unlockedPath(ino) }
    }

    /// The path of `name` in the directory `parent`.
    func path(_ parent: fuse_ino_t, _ name: String) -> String? {
        lock.withLock { unlockedPath(parent).map { $0 == "/" ? "/" + name : $0 + "/" + name } }
    }

    private func unlockedPath(_ ino: fuse_ino_t) -> String? {
        var names: [String] = []
        var current = ino
        while current != InodeTable.root {
            guard let node = nodes[current], node.parent != 0 else { return nil }
            names.append(node.name)
            current = node.parent
        }
        return "/" + names.reversed().joined(separator: "/")
    }

    /// Counts one lookup of `name` in `parent` and returns its number (a new node if needed).
    func remember(_ parent: fuse_ino_t, _ name: String) -> fuse_ino_t {
        lock.withLock {
            let key = Key(parent: parent, name: name)
            if let ino = children[key] {
                nodes[ino]!.lookups += 1
                return ino
            }
            let ino = next
            next += 1
            nodes[ino] = Node(parent: parent, name: name, lookups: 1)
            children[key] = ino
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
            let key = Key(parent: node.parent, name: node.name)
            if children[key] == ino { children[key] = nil }
        }
    }

    /// `name` in `parent` is gone (unlink, rmdir).
    func removed(_ parent: fuse_ino_t, _ name: String) {
        lock.withLock { detach(Key(parent: parent, name: name)) }
    }

    /// `name` in `parent` is now `newName` in `newParent` (swapped with it for an exchange).
    func renamed(_ parent: fuse_ino_t, _ name: String, to newParent: fuse_ino_t, _ newName: String, exchange: Bool) {
        lock.withLock {
            let from = Key(parent: parent, name: name), to = Key(parent: newParent, name: newName)
            let moving = children.removeValue(forKey: from)
            let replaced = children.removeValue(forKey: to)
            if let replaced {
                if exchange {
                    nodes[replaced]?.parent = parent
                    nodes[replaced]?.name = name
                    children[from] = replaced
                } else {
                    nodes[replaced]?.parent = 0
                }
            }
            if let moving {
                nodes[moving]?.parent = newParent
                nodes[moving]?.name = newName
                children[to] = moving
            }
        }
    }

    /// The number of the node at `path`, if the kernel knows it.
    func number(of path: String) -> fuse_ino_t? {
        lock.withLock {
            var ino = InodeTable.root
            for name in path.split(separator: "/") {
                guard let child = children[Key(parent: ino, name: String(name))] else { return nil }
                ino = child
            }
            return ino
        }
    }

    private func detach(_ key: Key) {
        guard let ino = children.removeValue(forKey: key) else { return }
        nodes[ino]?.parent = 0
    }
}
