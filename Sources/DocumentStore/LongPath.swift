import CLinux
import Glibc

/// System calls on paths of any length. The kernel takes at most `PATH_MAX` (4,096) bytes,
/// the final NUL included, in one path argument; a scratch file's path is the scratch folder's
/// own followed by the path a program gave the mount, which alone may be that long (pjdfstest
/// makes such paths, and a program's `mkdir -p` of deep folders does). Past the limit, the
/// path's folders are opened a stretch at a time (`O_PATH`, as `openat2` users do) and the call
/// is made relative to the last: the same file, the same answer, as a shorter path would give.
/// A path within the limit is passed to the call as it is, relative to `AT_FDCWD`.
///
/// Each function answers as its system call does: -1 and `errno` on failure, including a
/// failure to open one of the folders on the way (ENOENT, ENOTDIR, EACCES as the kernel says).
public enum LongPath {
    /// Linux's `O_PATH` (a GNU extension Glibc's module does not export): a folder opened
    /// only to name paths from, which needs search permission on it and no read permission.
    private static let openForPath: Int32 = 0o10000000

    /// `call(folder, relative)` with a descriptor and a path within the limit that name `path`.
    public static func at(_ path: String, _ call: (Int32, String) -> Int32) -> Int32 {
        var rest = Substring(path)
        guard rest.utf8.count >= Int(PATH_MAX) else { return call(AT_FDCWD, path) }
        var folder = AT_FDCWD
        defer { if folder != AT_FDCWD { close(folder) } }
        while rest.utf8.count >= Int(PATH_MAX) {
            // The longest run of whole folders that fits, leaving at least the last name.
            let bytes = rest.utf8
            let limit = bytes.index(bytes.startIndex, offsetBy: Int(PATH_MAX) - 1)
            guard let slash = bytes[..<limit].lastIndex(of: UInt8(ascii: "/")) else {
                errno = ENAMETOOLONG  // one name longer than a path: no file system takes it
                return -1
            }
            let stretch = slash == bytes.startIndex ? "/" : String(rest[..<slash])
            let next = openat(folder, stretch, openForPath | O_DIRECTORY | O_CLOEXEC)
            guard next >= 0 else { return -1 }
            if folder != AT_FDCWD { close(folder) }
            folder = next
            rest = rest[rest.index(after: slash)...]
        }
        let result = call(folder, String(rest))
        let saved = errno
        if folder != AT_FDCWD { close(folder) }
        folder = AT_FDCWD
        errno = saved
        return result
    }

    /// `call` with two paths each made short as `at` makes one.
    public static func at(_ first: String, _ second: String, _ call: (Int32, String, Int32, String) -> Int32) -> Int32 {
        at(first) { folder, relative in at(second) { call(folder, relative, $0, $1) } }
    }

    public static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0) -> Int32 {
        at(path) { openat($0, $1, flags | O_CLOEXEC, mode) }
    }

    public static func lstat(_ path: String, _ info: inout stat) -> Int32 {
        at(path) { fstatat($0, $1, &info, AT_SYMLINK_NOFOLLOW) }
    }

    public static func stat(_ path: String, _ info: inout stat) -> Int32 {
        at(path) { fstatat($0, $1, &info, 0) }
    }

    public static func mkdir(_ path: String, _ mode: mode_t) -> Int32 {
        at(path) { mkdirat($0, $1, mode) }
    }

    public static func rmdir(_ path: String) -> Int32 {
        at(path) { unlinkat($0, $1, AT_REMOVEDIR) }
    }

    public static func unlink(_ path: String) -> Int32 {
        at(path) { unlinkat($0, $1, 0) }
    }

    public static func rename(_ from: String, _ to: String) -> Int32 {
        at(from, to) { renameat($0, $1, $2, $3) }
    }

    /// A rename that fails with EEXIST instead of replacing `to` (`RENAME_NOREPLACE`); EINVAL
    /// where the file system cannot do it.
    public static func renameWithoutReplacing(_ from: String, _ to: String) -> Int32 {
        at(from, to) { renameat2($0, $1, $2, $3, 1 /* RENAME_NOREPLACE */) }
    }

    public static func link(_ from: String, _ to: String) -> Int32 {
        at(from, to) { linkat($0, $1, $2, $3, 0) }
    }

    public static func exists(_ path: String) -> Bool {
        at(path) { faccessat($0, $1, F_OK, 0) } == 0
    }

    public static func chmod(_ path: String, _ mode: mode_t) -> Int32 {
        at(path) { fchmodat($0, $1, mode, 0) }
    }

    public static func setTimes(_ path: String, _ times: inout [timespec]) -> Int32 {
        at(path) { utimensat($0, $1, &times, 0) }
    }

    public static func truncate(_ path: String, _ size: off_t) -> Int32 {
        let fd = open(path, O_WRONLY)
        guard fd >= 0 else { return -1 }
        let result = ftruncate(fd, size)
        let saved = errno
        close(fd)
        errno = saved
        return result
    }

    /// `opendir(3)` of `path`; nil and `errno` on failure.
    public static func openFolder(_ path: String) -> OpaquePointer? {
        let fd = open(path, O_RDONLY | O_DIRECTORY)
        guard fd >= 0 else { return nil }
        guard let folder = fdopendir(fd) else {
            let saved = errno
            close(fd)
            errno = saved
            return nil
        }
        return folder
    }

    /// `mkdir -p` of `path`'s folders (not `path`): each missing one is made with mode 0755.
    public static func makeParents(of path: String) -> Int32 {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")), slash != path.utf8.startIndex else { return 0 }
        let parent = String(path[..<slash])
        var info = Glibc.stat()
        if stat(parent, &info) == 0 { return info.st_mode & S_IFMT == S_IFDIR ? 0 : { errno = ENOTDIR; return -1 }() }
        guard errno == ENOENT, makeParents(of: parent) == 0 else { return -1 }
        return mkdir(parent, 0o755) == 0 || errno == EEXIST ? 0 : -1
    }
}
