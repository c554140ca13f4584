import CGzip
import DocumentModel

/// Decodes a gzip (or zlib) stream piece by piece: CouchDB sends `text/*`
/// attachments gzip-encoded, and Sofa stores bodies decoded.
public final class GzipDecoder {
    private var stream = z_stream()
    private var ended = false

    public init() throws {
        guard cz_inflate_init_gzip(&stream) == Z_OK else { throw SofaError.invalidArgument("cannot start gzip decoding") }
    }

    deinit { inflateEnd(&stream) }

    /// Feeds compressed bytes; `output` receives the decoded pieces.
    public func decode(_ input: [UInt8], output: ([UInt8]) throws -> Void) throws {
        guard !input.isEmpty else { return }
        guard !ended else { throw SofaError.invalidArgument("data after the end of a gzip stream") }
        var out = [UInt8](repeating: 0, count: 64 * 1024)
        var input = input
        try input.withUnsafeMutableBufferPointer { inBuffer in
            stream.next_in = inBuffer.baseAddress
            stream.avail_in = UInt32(inBuffer.count)
            repeat {
                let (status, produced) = out.withUnsafeMutableBufferPointer { outBuffer -> (Int32, Int) in
                    stream.next_out = outBuffer.baseAddress
                    stream.avail_out = UInt32(outBuffer.count)
                    let status = inflate(&stream, Z_NO_FLUSH)
                    return (status, outBuffer.count - Int(stream.avail_out))
                }
                if produced > 0 { try output(Array(out[..<produced])) }
                if status == Z_STREAM_END { ended = true; break }
                guard status == Z_OK || status == Z_BUF_ERROR else { throw SofaError.invalidArgument("invalid gzip data") }
                if status == Z_BUF_ERROR && produced == 0 { break }
            } while stream.avail_in > 0 || stream.avail_out == 0
        }
    }

    /// Throws unless the whole stream was decoded.
    public func finish() throws {
        guard ended else { throw SofaError.invalidArgument("truncated gzip data") }
    }
}

/// zlib's deflate, fed piece by piece: raw (as zip entries hold it) or gzip-wrapped (as
/// CouchDB stores the bodies of the types it compresses).
final class Deflater {
    enum Format { case raw, gzip }

    private var stream = z_stream()
    private var output = [UInt8](repeating: 0, count: 256 * 1024)

    init(_ format: Format, level: Int32) throws {
        let status = switch format {
        case .raw: cz_deflate_init_raw(&stream, level)
        case .gzip: cz_deflate_init_gzip(&stream, level)
        }
        guard status == Z_OK else { throw SofaError.invalidArgument("cannot start deflate") }
    }

    deinit { deflateEnd(&stream) }

    /// Starts a new stream with the same settings, keeping the memory of this one.
    func reset() throws {
        guard deflateReset(&stream) == Z_OK else { throw SofaError.invalidArgument("cannot start deflate") }
    }

    func deflate(_ input: UnsafeRawBufferPointer, finish: Bool, into sink: ([UInt8]) throws -> Void) throws {
        stream.next_in = UnsafeMutablePointer(mutating: input.bindMemory(to: Bytef.self).baseAddress)
        stream.avail_in = uInt(input.count)
        while true {
            let (status, produced) = output.withUnsafeMutableBufferPointer { out -> (Int32, Int) in
                stream.next_out = out.baseAddress
                stream.avail_out = uInt(out.count)
                let status = CGzip.deflate(&stream, finish ? Z_FINISH : Z_NO_FLUSH)
                return (status, out.count - Int(stream.avail_out))
            }
            if produced > 0 { try sink(Array(output[..<produced])) }
            if finish {
                if status == Z_STREAM_END { return }
                guard status == Z_OK || status == Z_BUF_ERROR else { throw SofaError.invalidArgument("deflate failed (\(status))") }
            } else {
                guard status == Z_OK || status == Z_BUF_ERROR else { throw SofaError.invalidArgument("deflate failed (\(status))") }
                if stream.avail_in == 0 && stream.avail_out > 0 { return }
            }
        }
    }
}
