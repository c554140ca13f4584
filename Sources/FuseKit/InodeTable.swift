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

    static let root: fuse_ino_t = 1
    private let lock = NSLock()
    private var nodes: [fuse_ino_t: Node] = [InodeTable.root: Node(parent: 0, name: "", lookups: 1)]
    /// The named nodes of each directory node.
    private var children: [fuse_ino_t: [String: fuse_ino_t]] = [:]
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
            if let ino = children[parent]?[name] {
                nodes[ino]!.lookups += 1
                return ino
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

    /// `name` in `parent` is now `newName` in `newParent` (swapped with it for an exchange).
    func renamed(_ parent: fuse_ino_t, _ name: String, to newParent: fuse_ino_t, _ newName: String, exchange: Bool) {
        lock.withLock {
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

    /// The number of the node at `path`, if the kernel knows it.
    func number(of path: String) -> fuse_ino_t? {
        lock.withLock {
            var ino = InodeTable.root
            for name in path.split(separator: "/") {
                guard let child = children[ino]?[String(name)] else { return nil }
                ino = child
            }
            return ino
        }
    }

    /// Every node the kernel knows below `ino`.
    func descendants(of ino: fuse_ino_t) -> [fuse_ino_t] {
        lock.withLock {
            var found: [fuse_ino_t] = [], pending = [ino]
            while let next = pending.popLast() {
                let below = Array((children[next] ?? [:]).values)
                found += below
                pending += below
            }
            return found
        }
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
