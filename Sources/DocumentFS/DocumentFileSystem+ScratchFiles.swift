import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Reading and writing the mount's own files beside the database (scratch files, copies
/// made for the trash).
extension DocumentFileSystem {
    func readSmallFile(_ path: String) throws -> [UInt8] {
        var info = stat()
        guard stat(path, &info) == 0 else { throw SofaError.system("stat", path: path, errno: errno) }
        guard info.st_size <= PropertiesWriteHandle.maximumSize else { throw MountError.tooLarge(path, limit: Int64(PropertiesWriteHandle.maximumSize)) }
        guard let data = FileManager.default.contents(atPath: path) else { throw SofaError.system("read", path: path, errno: EIO) }
        return [UInt8](data)
    }

    func writeScratch(_ path: String, bytes: [UInt8]) throws {
        try makeParents(of: path)
        guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { throw SofaError.system("write", path: path, errno: EIO) }
    }

    func copy(_ reader: BlobReader, toScratch path: String) throws {
        try makeParents(of: path)
        let fd = Glibc.open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("open", path: path, errno: errno) }
        defer { Glibc.close(fd) }
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
        defer { buffer.deallocate() }
        while case let count = try reader.read(into: buffer), count > 0 {
            guard Glibc.write(fd, buffer.baseAddress, count) == count else { throw SofaError.system("write", path: path, errno: errno) }
        }
    }
}
