import CGzip
import DocumentModel
import Foundation

/// The mount's staging logs as every opener must know them (the log itself, its records and
/// its folds are MountTables' `StagingLog`): where they are, how a record is framed, and which
/// bodies they hold, so that a `sofa compact` or `sofa encrypt` that never links the mount
/// still keeps the bodies a running or killed mount staged.
///
/// A log is `staging/PID-TOKEN.log` in the database's folder, written by one mount process,
/// which holds an exclusive `flock` on it while it runs. It is a run of frames:
/// `[payload length: UInt32 LE][CRC-32 of the payload: UInt32 LE][payload]`. A reader stops at
/// the first frame that is short or whose CRC does not match (the tail a power loss can tear).
/// A payload is fields written by `LogRecord`; a record of a staged file (`stagedFileKind`)
/// starts with its blob key's hex, which is all compaction reads.
package enum StagingLogFiles {
    package static let directoryName = "staging"
    package static let suffix = ".log"
    /// The kind byte of a staged file's record.
    package static let stagedFileKind: UInt8 = 1

    package static func directory(ofDatabaseAt path: String) -> String { "\(path)/\(directoryName)" }

    /// The paths of the logs in `directory` (none when it does not exist; another failure to
    /// read it is thrown: compaction must not take "unreadable" for "holds nothing").
    package static func paths(in directory: String) throws -> [String] {
        guard let folder = opendir(directory) else {
            if errno == ENOENT { return [] }
            throw SofaError.system("read directory", path: directory, errno: errno)
        }
        defer { closedir(folder) }
        var names: [String] = []
        while let entry = readdir(folder) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name.hasSuffix(suffix) { names.append(name) }
        }
        return names.sorted().map { "\(directory)/\($0)" }
    }

    /// `payload` framed for a log.
    package static func frame(_ payload: [UInt8]) -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(payload.count + 8)
        LogRecord.appendUInt32(UInt32(payload.count), to: &bytes)
        LogRecord.appendUInt32(checksum(payload[...]), to: &bytes)
        bytes += payload
        return bytes
    }

    /// The payloads of the whole frames of `bytes`, in order; the first torn or damaged frame
    /// ends them.
    package static func payloads(_ bytes: [UInt8]) -> [ArraySlice<UInt8>] {
        var result: [ArraySlice<UInt8>] = []
        var offset = 0
        while bytes.count - offset >= 8 {
            let length = Int(LogRecord.uint32(bytes, at: offset)), sum = LogRecord.uint32(bytes, at: offset + 4)
            guard length <= bytes.count - offset - 8 else { break }
            let payload = bytes[(offset + 8)..<(offset + 8 + length)]
            guard checksum(payload) == sum else { break }
            result.append(payload)
            offset += 8 + length
        }
        return result
    }

    /// The whole of a log (empty when it is gone: removed by its mount, or taken in by another).
    package static func contents(of path: String) throws -> [UInt8] {
        try KernelFile.contents(of: path) ?? []
    }

    /// The blob keys (hex) named by the staged files' records of every log in `directory`:
    /// folded ones too (a revision names them anyway; the log is emptied once all are folded).
    package static func heldBlobKeys(ofDatabaseAt databasePath: String) throws -> Set<String> {
        var keys = Set<String>()
        for path in try paths(in: directory(ofDatabaseAt: databasePath)) {
            for payload in payloads(try contents(of: path)) {
                var reader = LogRecord.Reader(payload)
                guard (try? reader.byte()) == stagedFileKind, let key = try? reader.string() else { continue }
                keys.insert(key)
            }
        }
        return keys
    }

    /// A mark that changes whenever a log is written, emptied, made or removed.
    package static func activity(ofDatabaseAt databasePath: String) throws -> [Int64] {
        var count: Int64 = 0, bytes: Int64 = 0, latest: Int64 = 0
        for path in try paths(in: directory(ofDatabaseAt: databasePath)) {
            var info = stat()
            guard stat(path, &info) == 0 else { continue }
            count += 1
            bytes += Int64(info.st_size)
            latest = max(latest, Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec))
        }
        return [count, bytes, latest]
    }

    static func checksum(_ bytes: ArraySlice<UInt8>) -> UInt32 {
        bytes.withUnsafeBufferPointer { UInt32(crc32(0, $0.baseAddress, uInt($0.count))) }
    }
}

/// The fields of a log record: integers as 8 bytes little-endian, strings as a 4-byte length
/// and their UTF-8, optional ones after a byte saying whether they are there.
package struct LogRecord {
    package private(set) var bytes: [UInt8] = []

    package init(kind: UInt8) {
        bytes.reserveCapacity(256)
        bytes.append(kind)
    }

    package mutating func append(_ value: Int64) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    package mutating func append(_ value: String) {
        LogRecord.appendUInt32(UInt32(value.utf8.count), to: &bytes)
        bytes += value.utf8
    }

    package mutating func append(_ value: String?) {
        bytes.append(value == nil ? 0 : 1)
        if let value { append(value) }
    }

    package mutating func append(_ value: Int64?) {
        bytes.append(value == nil ? 0 : 1)
        if let value { append(value) }
    }

    static func appendUInt32(_ value: UInt32, to bytes: inout [UInt8]) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }

    static func uint32(_ bytes: [UInt8], at offset: Int) -> UInt32 {
        (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[offset + $1]) << (8 * UInt32($1)) }
    }

    /// Reads the fields back in the order they were written; a record shorter than its fields
    /// throws.
    package struct Reader {
        private let bytes: ArraySlice<UInt8>
        private var offset: Int

        package init(_ bytes: ArraySlice<UInt8>) { (self.bytes, offset) = (bytes, bytes.startIndex) }

        package mutating func byte() throws -> UInt8 {
            guard offset < bytes.endIndex else { throw Self.short }
            defer { offset += 1 }
            return bytes[offset]
        }

        package mutating func int64() throws -> Int64 {
            guard bytes.endIndex - offset >= 8 else { throw Self.short }
            defer { offset += 8 }
            return (0..<8).reduce(Int64(0)) { $0 | Int64(bytes[offset + $1]) << (8 * Int64($1)) }
        }

        package mutating func string() throws -> String {
            guard bytes.endIndex - offset >= 4 else { throw Self.short }
            let length = (0..<4).reduce(0) { $0 | Int(bytes[offset + $1]) << (8 * $1) }
            guard bytes.endIndex - offset - 4 >= length else { throw Self.short }
            defer { offset += 4 + length }
            return String(decoding: bytes[(offset + 4)..<(offset + 4 + length)], as: UTF8.self)
        }

        package mutating func optionalString() throws -> String? { try byte() == 0 ? nil : try string() }
        package mutating func optionalInt64() throws -> Int64? { try byte() == 0 ? nil : try int64() }

        static let short = SofaError.invalidArgument("a staging log record is shorter than its fields")
    }
}

extension Database {
    /// The folder of the mount's staging logs.
    package var stagingLogDirectory: String { StagingLogFiles.directory(ofDatabaseAt: path) }
}
