import Foundation

/// The whole text of a file the kernel makes as it is read (`/proc/self/mountinfo`,
/// `/proc/locks`). Foundation's `String(contentsOfFile:)` trusts their size of 0 and keeps the
/// first read only, one page (4,063 bytes of mountinfo here): a mount table longer than that,
/// as on most desktops, lost its last mounts, and with them the one just made.
public enum KernelFile {
    /// The text of `path`, read to its end; nil when it cannot be opened.
    public static func text(_ path: String) -> String? {
        bytes(path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The bytes of `path` (`/proc/PID/cmdline` separates arguments with NULs), read to its
    /// end; nil when it cannot be opened or read.
    public static func bytes(_ path: String) -> [UInt8]? {
        (try? contents(of: path)) ?? nil
    }

    /// The bytes of `path`, read to its end; nil when there is no such file. Another failure to
    /// open or read it is thrown (a caller for whom "unreadable" must not read as "empty").
    public static func contents(of path: String) throws -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw SofaError.system("open", path: path, errno: errno)
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count >= 0 else { throw SofaError.system("read", path: path, errno: errno) }
            if count == 0 { return bytes }
            bytes += buffer[..<count]
        }
    }
}
