import CLinux
import DocumentModel
import Foundation

/// Writes all of `bytes` to `fd`, through short writes and EINTR, at most
/// `Tuning.largestWrite` per call. `path` names the file in the error (a full disk, a closed pipe).
public func writeFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, path: String) throws {
    try writeInPieces(bytes, path: path) { Glibc.write(fd, $0, $1) }
}

/// Writes all of `bytes` to `fd` at `offset`, as `writeFully` does.
public func writeFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int64, path: String) throws {
    var position = offset
    try writeInPieces(bytes, path: path) { pointer, count in
        let written = pwrite(fd, pointer, count, off_t(position))
        if written > 0 { position += Int64(written) }
        return written
    }
}

private func writeInPieces(_ bytes: UnsafeRawBufferPointer, path: String, _ write: (UnsafeRawPointer, Int) -> Int) throws {
    var done = 0
    while done < bytes.count {
        let count = write(bytes.baseAddress! + done, min(bytes.count - done, Tuning.largestWrite))
        if count < 0 {
            if errno == EINTR { continue }
            throw SofaError.system("write", path: path, errno: errno)
        }
        done += count
    }
}

/// `syncfs` of the file system holding `path`: every file written on it, and its metadata.
func syncFileSystem(of path: String) throws {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
    defer { close(fd) }
    guard syncfs(fd) == 0 else { throw SofaError.system("sync", path: path, errno: errno) }
}

/// The bytes waiting to be written to any disk of the machine (`Dirty` and `Writeback` in
/// `/proc/meminfo`): what a `syncfs` may have to wait for besides what its caller wrote. nil
/// when it cannot be read.
func bytesWaitingForDisks() -> Int64? {
    guard let text = try? String(contentsOfFile: "/proc/meminfo", encoding: .utf8) else { return nil }
    var total: Int64 = 0, found = 0
    for line in text.split(separator: "\n") where line.hasPrefix("Dirty:") || line.hasPrefix("Writeback:") {
        let fields = line.split(separator: " ")
        guard fields.count >= 2, let kib = Int64(fields[1]) else { return nil }
        total += kib * 1024
        found += 1
    }
    return found == 2 ? total : nil
}

/// Where something bound for `destination` is built before one rename puts it in place:
/// `.NAME.partial-PID` in the same folder (`prefix` without the PID, to find stale ones).
public func stagingLocation(for destination: String) -> (directory: String, prefix: String, path: String) {
    let parent = (destination as NSString).deletingLastPathComponent
    let directory = parent.isEmpty ? "." : parent
    let prefix = ".\((destination as NSString).lastPathComponent).partial-"
    return (directory, prefix, "\(directory)/\(prefix)\(getpid())")
}
