import DocumentModel
import Foundation

/// Writes all of `bytes` to `fd`, through short writes and EINTR. `path` names the file in
/// the error (a full disk, a closed pipe).
public func writeFully(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, path: String) throws {
    var offset = 0
    while offset < bytes.count {
        let count = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
        if count < 0 {
            if errno == EINTR { continue }
            throw SofaError.system("write", path: path, errno: errno)
        }
        offset += count
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
