import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Reading and writing the mount's own files beside the database (scratch files, copies
/// made for the trash), through `scratch`: sealed in an encrypted database.
extension DocumentFileSystem {
    func readSmallFile(_ path: String) throws -> [UInt8] {
        var info = stat()
        guard LongPath.stat(path, &info) == 0 else { throw SofaError.system("stat", path: path, errno: errno) }
        guard scratch.contentLength(ofStoredSize: Int64(info.st_size)) <= PropertiesWriteHandle.maximumSize else {
            throw MountError.tooLarge(path, limit: Int64(PropertiesWriteHandle.maximumSize))
        }
        return try scratch.contents(of: path)
    }

    func writeScratch(_ path: String, bytes: [UInt8]) throws {
        try makeParents(of: path)
        try scratch.write(bytes, to: path)
    }

    func copy(_ reader: BlobReader, toScratch path: String) throws {
        try makeParents(of: path)
        try scratch.copy(reader, to: path)
    }

    /// Scratch files an earlier version kept plain in an encrypted database (before names and
    /// contents were sealed): sealed where they are, under sealed names, once.
    func sealPlainScratchFiles() {
        guard scratch.isSealed else { return }
        do {
            let moved = try scratch.sealPlainFiles()
            if moved > 0 { log.notice("sealed \(moved) scratch file\(moved == 1 ? "" : "s") an earlier version had kept plain") }
        } catch {
            log.error("scratch files an earlier version kept plain are not sealed yet: \(error); they are tried again at the next mount")
        }
    }
}
