import CGzip
import DocumentModel
import Foundation

/// Writes a zip file in one pass, each entry streamed from a file: local header, data (stored
/// or raw deflate), and the central directory at the end, with ZIP64 records where a size, an
/// offset or the entry count needs them. Names are UTF-8 (flag bit 11).
///
/// Snapshots are written with this rather than ZIPFoundation's `Archive.addEntry`, which
/// reads and rewrites the whole central directory on every entry: quadratic, 7 s for a
/// snapshot of 20,000 bodies that this writes in a fraction of a second. ZIPFoundation
/// still reads them (and `unzip` does).
final class ZipWriter {
    private let path: String
    private let fd: Int32
    private var buffer: [UInt8] = []
    /// File offset of `buffer[0]`.
    private var bufferStart: UInt64 = 0
    private var central: [UInt8] = []
    private var entryCount = 0
    /// Below this, sizes and offsets use the classic 32-bit fields. Tests lower it to
    /// exercise the ZIP64 records without writing 4 GiB.
    let zip64Threshold: UInt64

    private static let chunkSize = 1 << 20

    init(path: String, zip64Threshold: UInt64 = 0xFFFF_FFFF) throws {
        self.path = path
        self.zip64Threshold = zip64Threshold
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SofaError.system("create", path: path, errno: errno) }
        buffer.reserveCapacity(ZipWriter.chunkSize * 2)
    }

    deinit { close(fd) }

    private var offset: UInt64 { bufferStart + UInt64(buffer.count) }

    /// Adds the file at `source` as `name`. Deflated when `compress` (and smaller than the
    /// ZIP64 threshold, so that its compressed size is known to fit), stored otherwise.
    func add(_ name: String, contentsOf source: String, compress: Bool, modified: Date = Date()) throws {
        let input = open(source, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw SofaError.system("open", path: source, errno: errno) }
        defer { close(input) }
        var info = stat()
        guard fstat(input, &info) == 0 else { throw SofaError.system("stat", path: source, errno: errno) }
        let length = UInt64(info.st_size)
        // Deflate's worst case adds a few bytes per 16 KiB block: leave a margin under the limit.
        let deflate = compress && length < zip64Threshold - zip64Threshold / 64
        let large = length >= zip64Threshold  // stored, so both sizes are `length`
        let nameBytes = Array(name.utf8)
        let (time, date) = ZipWriter.dosDateTime(modified)
        let headerOffset = offset
        let needed: UInt16 = large ? 45 : 20

        // Local header; CRC and sizes are filled in once the data is written.
        var header: [UInt8] = []
        header.append(le32: 0x0403_4B50)
        header.append(le16: needed)
        header.append(le16: 0x0800)
        header.append(le16: deflate ? 8 : 0)
        header.append(le16: time)
        header.append(le16: date)
        let fieldsAt = header.count
        header.append(le32: 0)  // CRC-32
        header.append(le32: large ? 0xFFFF_FFFF : 0)
        header.append(le32: large ? 0xFFFF_FFFF : 0)
        header.append(le16: UInt16(nameBytes.count))
        header.append(le16: large ? 20 : 0)
        header += nameBytes
        if large {
            header.append(le16: 0x0001)
            header.append(le16: 16)
            header.append(le64: length)
            header.append(le64: length)
        }
        try write(header)

        // The data, with its CRC.
        let dataStart = offset
        var crc: UInt = crc32(0, nil, 0)
        var read: UInt64 = 0
        let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: ZipWriter.chunkSize, alignment: 16)
        defer { chunk.deallocate() }
        var deflater: Deflater? = deflate ? try Deflater(.raw, level: Z_DEFAULT_COMPRESSION) : nil
        while true {
            let count = Glibc.read(input, chunk.baseAddress, chunk.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw SofaError.system("read", path: source, errno: errno)
            }
            if count == 0 { break }
            let piece = UnsafeRawBufferPointer(rebasing: chunk[0..<count])
            crc = crc32(crc, piece.bindMemory(to: Bytef.self).baseAddress, uInt(count))
            read += UInt64(count)
            if let deflater { try deflater.deflate(piece, finish: false) { try write($0) } } else { try write(piece) }
        }
        try deflater?.deflate(UnsafeRawBufferPointer(start: nil, count: 0), finish: true) { try write($0) }
        deflater = nil
        guard read == length else { throw SofaError.invalidArgument("\(source) changed size while it was zipped") }
        let compressed = offset - dataStart

        var fields: [UInt8] = []
        fields.append(le32: UInt32(crc))
        if !large {
            fields.append(le32: UInt32(compressed))
            fields.append(le32: UInt32(length))
        }
        try patch(fields, at: headerOffset + UInt64(fieldsAt))

        // Its central directory record.
        let offsetIsLarge = headerOffset >= zip64Threshold
        var extra: [UInt8] = []
        if large || offsetIsLarge {
            extra.append(le16: 0x0001)
            extra.append(le16: UInt16((large ? 16 : 0) + (offsetIsLarge ? 8 : 0)))
            if large {
                extra.append(le64: length)
                extra.append(le64: compressed)
            }
            if offsetIsLarge { extra.append(le64: headerOffset) }
        }
        central.append(le32: 0x0201_4B50)
        central.append(le16: 3 << 8 | 45)  // made by Unix, spec 4.5
        central.append(le16: large || offsetIsLarge ? 45 : needed)
        central.append(le16: 0x0800)
        central.append(le16: deflate ? 8 : 0)
        central.append(le16: time)
        central.append(le16: date)
        central.append(le32: UInt32(crc))
        central.append(le32: large ? 0xFFFF_FFFF : UInt32(compressed))
        central.append(le32: large ? 0xFFFF_FFFF : UInt32(length))
        central.append(le16: UInt16(nameBytes.count))
        central.append(le16: UInt16(extra.count))
        central.append(le16: 0)  // comment
        central.append(le16: 0)  // disk
        central.append(le16: 0)  // internal attributes
        central.append(le32: UInt32(0o100644) << 16)  // a regular file, rw-r--r--
        central.append(le32: offsetIsLarge ? 0xFFFF_FFFF : UInt32(headerOffset))
        central += nameBytes
        central += extra
        entryCount += 1
    }

    /// Writes the central directory and the end records, syncs and closes the file.
    func finish() throws {
        let directoryOffset = offset
        let directorySize = UInt64(central.count)
        try write(central)
        central = []
        let needsZip64 = entryCount >= 0xFFFF || directoryOffset >= zip64Threshold || directorySize >= zip64Threshold
        var end: [UInt8] = []
        if needsZip64 {
            let recordOffset = offset
            end.append(le32: 0x0606_4B50)
            end.append(le64: 44)
            end.append(le16: 3 << 8 | 45)
            end.append(le16: 45)
            end.append(le32: 0)
            end.append(le32: 0)
            end.append(le64: UInt64(entryCount))
            end.append(le64: UInt64(entryCount))
            end.append(le64: directorySize)
            end.append(le64: directoryOffset)
            end.append(le32: 0x0706_4B50)  // the locator
            end.append(le32: 0)
            end.append(le64: recordOffset)
            end.append(le32: 1)
        }
        end.append(le32: 0x0605_4B50)
        end.append(le16: 0)
        end.append(le16: 0)
        end.append(le16: needsZip64 ? 0xFFFF : UInt16(entryCount))
        end.append(le16: needsZip64 ? 0xFFFF : UInt16(entryCount))
        end.append(le32: needsZip64 ? 0xFFFF_FFFF : UInt32(directorySize))
        end.append(le32: needsZip64 ? 0xFFFF_FFFF : UInt32(directoryOffset))
        end.append(le16: 0)
        try write(end)
        try flush()
        guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: path, errno: errno) }
    }

    // MARK: - Output

    private func write(_ bytes: some Collection<UInt8>) throws {
        buffer.append(contentsOf: bytes)
        if buffer.count >= ZipWriter.chunkSize { try flush() }
    }

    private func flush() throws {
        try buffer.withUnsafeBytes { try writeFully(fd, $0, path: path) }
        bufferStart += UInt64(buffer.count)
        buffer.removeAll(keepingCapacity: true)
    }

    /// Overwrites bytes already written: in the buffer if they are still there, else in the file.
    private func patch(_ bytes: [UInt8], at position: UInt64) throws {
        if position >= bufferStart {
            let start = Int(position - bufferStart)
            buffer.replaceSubrange(start..<(start + bytes.count), with: bytes)
            return
        }
        let count = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(position)) }
        guard count == bytes.count else { throw SofaError.system("write", path: path, errno: errno) }
    }

    /// MS-DOS time and date fields, in local time as zip tools expect.
    static func dosDateTime(_ date: Date) -> (time: UInt16, date: UInt16) {
        var seconds = time_t(date.timeIntervalSince1970)
        var parts = tm()
        localtime_r(&seconds, &parts)
        let year = max(0, Int(parts.tm_year) + 1900 - 1980)
        let time = UInt16(parts.tm_hour) << 11 | UInt16(parts.tm_min) << 5 | UInt16(parts.tm_sec / 2)
        let day = UInt16(year) << 9 | UInt16(parts.tm_mon + 1) << 5 | UInt16(parts.tm_mday)
        return (time, day)
    }
}

private extension Array where Element == UInt8 {
    mutating func append(le16 value: UInt16) { append(UInt8(value & 0xFF)); append(UInt8(value >> 8)) }
    mutating func append(le32 value: UInt32) { for shift in stride(from: 0, to: 32, by: 8) { append(UInt8((value >> UInt32(shift)) & 0xFF)) } }
    mutating func append(le64 value: UInt64) { for shift in stride(from: 0, to: 64, by: 8) { append(UInt8((value >> UInt64(shift)) & 0xFF)) } }
}
