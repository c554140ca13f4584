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
    /// end; nil when it cannot be opened.
    public static func bytes(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return count == 0 ? bytes : nil }
            bytes += buffer[..<count]
        }
    }
}
