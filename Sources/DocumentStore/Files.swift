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

/// Where something bound for `destination` is built before one rename puts it in place:
/// `.NAME.partial-PID` in the same folder (`prefix` without the PID, to find stale ones).
public func stagingLocation(for destination: String) -> (directory: String, prefix: String, path: String) {
    let parent = (destination as NSString).deletingLastPathComponent
    let directory = parent.isEmpty ? "." : parent
    let prefix = ".\((destination as NSString).lastPathComponent).partial-"
    return (directory, prefix, "\(directory)/\(prefix)\(getpid())")
}
