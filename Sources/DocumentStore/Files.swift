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
