import CGzip

/// What a received frame amounts to.
enum FrameEvent {
    /// A message is whole (a streamed reply's body went to its sink; `body` is then empty).
    case message(BLIPMessage)
    /// Body bytes of a reply whose body streams (see `FrameReader.stream(replyTo:)`).
    case bodyChunk(number: UInt64, bytes: [UInt8])
    /// The peer acknowledged `bytes` of one of our messages.
    case acknowledged(type: BLIPMessageType, number: UInt64, bytes: UInt64)
    /// A frame to send back at once: the acknowledgement of a long incoming message.
    case acknowledge(frame: [UInt8])
}

/// The receiving half of a connection: checks each frame's checksum, inflates compressed
/// ones through the direction's one inflate stream, and assembles messages.
final class FrameReader {
    /// How many bytes of an incoming message may arrive between two acknowledgements (LiteCore's).
    static let acknowledgeEvery: UInt64 = 50_000
    /// Encoded properties longer than this end the connection (LiteCore refuses them too).
    static let maximumPropertiesSize = 100 * 1024

    private var checksum: UInt32 = 0
    private var inflater = z_stream()
    private var inflaterReady = false
    /// Messages being received, by (is a reply, number).
    private var partial: [PartialKey: Partial] = [:]
    /// Replies whose bodies go out as chunks rather than into memory.
    private var streamed: Set<UInt64> = []
    /// Numbers of incoming requests already complete: a later frame under one is an error.
    private var highestCompleteRequest: UInt64 = 0

    private struct PartialKey: Hashable {
        let isReply: Bool
        let number: UInt64
    }

    private struct Partial {
        var type: BLIPMessageType
        var flags: BLIPFlags
        var propertiesLength: Int?
        var header: [UInt8] = []  // the properties' length and the properties, as they arrive
        var body: [UInt8] = []
        var rawBytes: UInt64 = 0
        var unacknowledged: UInt64 = 0
    }

    deinit {
        if inflaterReady { inflateEnd(&inflater) }
    }

    /// The body of the reply to request `number` will be handed over in chunks.
    func stream(replyTo number: UInt64) { streamed.insert(number) }

    func read(_ frame: [UInt8]) throws(BLIPProtocolError) -> [FrameEvent] {
        var index = 0
        guard let number = Varint.read(frame, at: &index), let flagValue = Varint.read(frame, at: &index) else {
            throw .malformedFrame("the header is cut short")
        }
        guard flagValue < 0x100, let type = BLIPMessageType(rawValue: UInt8(flagValue) & BLIPFlags.typeMask) else {
            throw .malformedFrame("unknown message type \(flagValue & 0x07)")
        }
        let flags = BLIPFlags(rawValue: UInt8(flagValue) & ~BLIPFlags.typeMask)
        let payload = Array(frame[index...])
        if type.isAck {
            var at = 0
            guard let bytes = Varint.read(payload, at: &at) else { throw .malformedFrame("an acknowledgement without a count") }
            return [.acknowledged(type: type == .ackRequest ? .request : .response, number: number, bytes: bytes)]
        }
        guard payload.count >= 4 else { throw .malformedFrame("no checksum") }
        let data = Array(payload[..<(payload.count - 4)])
        let sent = payload[(payload.count - 4)...].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let plain = flags.contains(.compressed) ? try inflate(data) : data
        checksum = plain.withUnsafeBufferPointer { UInt32(crc32(uLong(checksum), $0.baseAddress, uInt($0.count))) }
        guard checksum == sent else { throw .badChecksum }

        let key = PartialKey(isReply: type.isReply, number: number)
        if !type.isReply, partial[key] == nil, number <= highestCompleteRequest {
            throw .malformedFrame("request #\(number) was already received whole")
        }
        var message = partial[key] ?? Partial(type: type, flags: flags.subtracting(.moreComing))
        if partial[key] == nil, type.isReply { message.type = type }
        var events: [FrameEvent] = []
        message.rawBytes += UInt64(payload.count)
        message.unacknowledged += UInt64(payload.count)
        var rest = plain[...]
        if message.propertiesLength == nil || message.header.count < (message.propertiesLength ?? 0) + lengthPrefix(message) {
            message.header += rest
            rest = []
            var at = 0
            if message.propertiesLength == nil, let length = Varint.read(message.header, at: &at) {
                guard length <= UInt64(FrameReader.maximumPropertiesSize) else { throw .malformedFrame("properties of \(length) bytes") }
                message.propertiesLength = Int(length)
            }
            if let length = message.propertiesLength {
                let end = lengthPrefix(message) + length
                if message.header.count > end {
                    rest = message.header[end...]
                    message.header.removeSubrange(end...)
                }
            }
        }
        if !rest.isEmpty {
            if streamed.contains(number), type.isReply {
                events.append(.bodyChunk(number: number, bytes: Array(rest)))
            } else {
                message.body += rest
            }
        }
        let more = flags.contains(.moreComing)
        if more, message.unacknowledged >= FrameReader.acknowledgeEvery {
            message.unacknowledged = 0
            var ack = Varint.encode(number)
            let ackType: BLIPMessageType = type.isReply ? .ackResponse : .ackRequest
            Varint.append(UInt64(ackType.rawValue | BLIPFlags.urgent.rawValue | BLIPFlags.noReply.rawValue), to: &ack)
            Varint.append(message.rawBytes, to: &ack)
            events.append(.acknowledge(frame: ack))
        }
        if more {
            partial[key] = message
            return events
        }
        partial[key] = nil
        if type.isReply { streamed.remove(number) } else { highestCompleteRequest = max(highestCompleteRequest, number) }
        guard let length = message.propertiesLength, message.header.count == lengthPrefix(message) + length else {
            throw .malformedFrame("message #\(number) ends inside its properties")
        }
        let properties = try BLIPProperties.decode(Array(message.header[lengthPrefix(message)...]))
        events.append(.message(BLIPMessage(type: message.type, number: number, flags: message.flags,
                                           properties: properties, body: message.body)))
        return events
    }

    /// How many bytes the properties' length takes at the start of the message.
    private func lengthPrefix(_ message: Partial) -> Int {
        guard let length = message.propertiesLength else { return 0 }
        return Varint.encode(UInt64(length)).count
    }

    /// Inflates one compressed frame: its bytes plus the `00 00 FF FF` a sync flush ends with,
    /// which the sender leaves out.
    private func inflate(_ data: [UInt8]) throws(BLIPProtocolError) -> [UInt8] {
        if !inflaterReady {
            guard cz_inflate_init_raw(&inflater) == Z_OK else { throw .badCompression("zlib could not start") }
            inflaterReady = true
        }
        var input = data + [0, 0, 0xFF, 0xFF]
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        let status: Int32 = input.withUnsafeMutableBufferPointer { input in
            inflater.next_in = input.baseAddress
            inflater.avail_in = uInt(input.count)
            while true {
                let produced: (Int32, Int) = chunk.withUnsafeMutableBufferPointer { out in
                    inflater.next_out = out.baseAddress
                    inflater.avail_out = uInt(out.count)
                    let status = CGzip.inflate(&inflater, Z_SYNC_FLUSH)
                    return (status, out.count - Int(inflater.avail_out))
                }
                output += chunk[..<produced.1]
                if produced.0 != Z_OK && produced.0 != Z_BUF_ERROR { return produced.0 }
                if inflater.avail_in == 0 && inflater.avail_out != 0 { return Z_OK }
                if produced.0 == Z_BUF_ERROR && produced.1 == 0 { return Z_OK }
            }
        }
        guard status == Z_OK else { throw .badCompression("zlib status \(status)") }
        return output
    }
}

/// The sending half: frame headers and the running checksum (frames go out uncompressed).
struct FrameWriter {
    private var checksum: UInt32 = 0

    /// A frame of `data` (part of the message's encoded properties and body).
    mutating func frame(number: UInt64, type: BLIPMessageType, flags: BLIPFlags, data: [UInt8]) -> [UInt8] {
        var frame = Varint.encode(number)
        Varint.append(UInt64(type.rawValue | flags.subtracting(.compressed).rawValue), to: &frame)
        frame += data
        checksum = data.withUnsafeBufferPointer { UInt32(crc32(uLong(checksum), $0.baseAddress, uInt($0.count))) }
        frame += [UInt8(checksum >> 24), UInt8(checksum >> 16 & 0xFF), UInt8(checksum >> 8 & 0xFF), UInt8(checksum & 0xFF)]
        return frame
    }
}
