import Foundation

/// Where the body of a streamed reply goes, chunk by chunk, as it arrives.
public protocol BLIPBodySink: AnyObject, Sendable {
    func write(_ bytes: [UInt8]) throws
}

/// Reads a body to send a chunk at a time: nil at its end.
public typealias BLIPBodyReader = @Sendable (_ maximum: Int) throws -> [UInt8]?

/// One BLIP connection over a transport that carries whole frames (a WebSocket's binary
/// messages): requests both ways, replies matched to them, frames of long messages interleaved,
/// and flow control by acknowledgements.
///
/// The transport reads frames and hands them to `receive(_:)`; `run(sending:)` writes the
/// frames this side produces until `close`. Incoming requests go to the handler, each in a
/// task of its own, which answers with `reply` or `replyError`.
public actor BLIPConnection {
    /// Bytes of message data per frame.
    public static let frameSize = 16 * 1024
    /// A message stops sending while this many of its bytes are unacknowledged (LiteCore's).
    public static let maximumUnacknowledged: UInt64 = 128_000

    public typealias Handler = @Sendable (BLIPConnection, BLIPMessage) async -> Void

    private let handler: Handler
    private let arrival: (@Sendable (BLIPMessage) -> Void)?
    private let reader = FrameReader()
    private var writer = FrameWriter()
    private var nextRequestNumber: UInt64 = 1
    /// Messages with frames left to send, in the order they take turns.
    private var outbox: [Outgoing] = []
    /// Acknowledgements, sent before anything else.
    private var urgentFrames: [[UInt8]] = []
    /// Requests sent whose replies have not come, by number.
    private var awaiting: [UInt64: CheckedContinuation<BLIPMessage, any Error>] = [:]
    private var sinks: [UInt64: any BLIPBodySink] = [:]
    private var sinkFailures: [UInt64: any Error] = [:]
    /// Bytes sent and acknowledged of each message still sending or waiting, by (is a reply, number).
    private var progress: [Key: (sent: UInt64, acknowledged: UInt64)] = [:]
    private var frameWaiter: CheckedContinuation<[UInt8]?, Never>?
    private var closedReason: String?
    /// Why the peer's frames ended the connection, if they did.
    public private(set) var protocolFailure: String?

    private struct Key: Hashable {
        let isReply: Bool
        let number: UInt64
    }

    private final class Outgoing {
        let number: UInt64
        let type: BLIPMessageType
        let flags: BLIPFlags
        var pending: [UInt8]
        var source: BLIPBodyReader?

        init(number: UInt64, type: BLIPMessageType, flags: BLIPFlags, pending: [UInt8], source: BLIPBodyReader?) {
            self.number = number
            self.type = type
            self.flags = flags
            self.pending = pending
            self.source = source
        }

        var key: Key { Key(isReply: type.isReply, number: number) }
    }

    /// `arrival` is called for each request as it arrives, in the order the other side sent
    /// them, before the handler's task starts (the handlers themselves run concurrently): a
    /// replication notes there which `changes` came first.
    public init(handler: @escaping Handler, arrival: (@Sendable (BLIPMessage) -> Void)? = nil) {
        self.handler = handler
        self.arrival = arrival
    }

    // MARK: - Sending

    /// Sends a request and waits for its reply; an error reply throws `BLIPError`. With `sink`,
    /// the reply's body goes there as it arrives instead of into the returned message.
    public func request(_ profile: String, properties: [(String, String)] = [], body: [UInt8] = [],
                        sink: (any BLIPBodySink)? = nil) async throws -> BLIPMessage {
        if let closedReason { throw BLIPProtocolError.closed(closedReason) }
        let number = nextRequestNumber
        nextRequestNumber += 1
        if let sink {
            sinks[number] = sink
            reader.stream(replyTo: number)
        }
        let reply: BLIPMessage = try await withCheckedThrowingContinuation { continuation in
            awaiting[number] = continuation
            enqueue(number: number, type: .request, flags: [], properties: [("Profile", profile)] + properties, body: body, source: nil)
        }
        sinks[number] = nil
        if let failure = sinkFailures.removeValue(forKey: number) { throw failure }
        if let error = reply.error { throw error }
        return reply
    }

    /// Sends a request that wants no reply.
    public func send(_ profile: String, properties: [(String, String)] = [], body: [UInt8] = []) {
        guard closedReason == nil else { return }
        let number = nextRequestNumber
        nextRequestNumber += 1
        enqueue(number: number, type: .request, flags: .noReply, properties: [("Profile", profile)] + properties, body: body, source: nil)
    }

    /// Answers `request`; the body is `body` followed by what `source` reads.
    public func reply(to request: BLIPMessage, properties: [(String, String)] = [], body: [UInt8] = [],
                      source: BLIPBodyReader? = nil) {
        guard !request.noReply, closedReason == nil else { return }
        enqueue(number: request.number, type: .response, flags: [], properties: properties, body: body, source: source)
    }

    public func replyError(to request: BLIPMessage, _ error: BLIPError) {
        guard !request.noReply, closedReason == nil else { return }
        enqueue(number: request.number, type: .error, flags: [],
                properties: [("Error-Domain", error.domain), ("Error-Code", String(error.code))],
                body: Array(error.message.utf8), source: nil)
    }

    private func enqueue(number: UInt64, type: BLIPMessageType, flags: BLIPFlags, properties: [(String, String)],
                         body: [UInt8], source: BLIPBodyReader?) {
        let encoded = BLIPProperties.encode(properties)
        let data = Varint.encode(UInt64(encoded.count)) + encoded + body
        let message = Outgoing(number: number, type: type, flags: flags, pending: data, source: source)
        progress[message.key] = (0, 0)
        outbox.append(message)
        wakeWriter()
    }

    /// The next frame to write, waiting for one; nil once the connection is closed.
    public func nextFrame() async -> [UInt8]? {
        while true {
            if closedReason != nil { return nil }
            if let frame = takeFrame() { return frame }
            let frame = await withCheckedContinuation { continuation in frameWaiter = continuation }
            if let frame { return frame }
        }
    }

    /// The frames ready to write, at least one (waiting for it) and as many more as are ready,
    /// up to about `maximumBytes`: written together, with one system call for many small
    /// messages. Nil once the connection is closed.
    public func nextFrames(upTo maximumBytes: Int) async -> [[UInt8]]? {
        guard let first = await nextFrame() else { return nil }
        var frames = [first]
        var bytes = first.count
        while bytes < maximumBytes, closedReason == nil, let frame = takeFrame() {
            frames.append(frame)
            bytes += frame.count
        }
        return frames
    }

    private func wakeWriter() {
        guard let waiter = frameWaiter, let frame = takeFrame() else { return }
        frameWaiter = nil
        waiter.resume(returning: frame)
    }

    /// Round robin over the messages that may send (not held back by unacknowledged bytes).
    private func takeFrame() -> [UInt8]? {
        if !urgentFrames.isEmpty { return urgentFrames.removeFirst() }
        guard let index = outbox.firstIndex(where: { message in
            let counts = progress[message.key] ?? (0, 0)
            return counts.sent - min(counts.sent, counts.acknowledged) < BLIPConnection.maximumUnacknowledged
        }) else { return nil }
        let message = outbox.remove(at: index)
        var data: [UInt8] = []
        if !message.pending.isEmpty {
            let count = min(BLIPConnection.frameSize, message.pending.count)
            data = Array(message.pending[..<count])
            message.pending.removeFirst(count)
        }
        if data.count < BLIPConnection.frameSize, let source = message.source {
            do {
                if let chunk = try source(BLIPConnection.frameSize - data.count), !chunk.isEmpty {
                    data += chunk
                } else {
                    message.source = nil
                }
            } catch {
                // The body cannot be read any further: the peer cannot be told in the middle of a
                // message, so the connection ends rather than sending a short body as whole.
                close("a body being sent could not be read: \(error)")
                return nil
            }
        }
        let more = !message.pending.isEmpty || message.source != nil
        var flags = message.flags
        if more { flags.insert(.moreComing) }
        let frame = writer.frame(number: message.number, type: message.type, flags: flags, data: data)
        progress[message.key]?.sent += UInt64(frame.count - Varint.encode(message.number).count - 1)
        if more {
            outbox.append(message)
        } else {
            progress[message.key] = nil
        }
        return frame
    }

    // MARK: - Receiving

    /// Takes one frame from the transport. A frame that breaks the protocol closes the
    /// connection and throws.
    public func receive(_ frame: [UInt8]) throws {
        guard closedReason == nil else { return }
        let events: [FrameEvent]
        do {
            events = try reader.read(frame)
        } catch {
            protocolFailure = "\(error)"
            close("\(error)")
            throw error
        }
        for event in events {
            switch event {
            case .acknowledge(let frame):
                urgentFrames.append(frame)
                wakeWriter()
            case .acknowledged(let type, let number, let bytes):
                let key = Key(isReply: type.isReply, number: number)
                if let counts = progress[key], bytes <= counts.sent {
                    progress[key]?.acknowledged = max(counts.acknowledged, bytes)
                    wakeWriter()
                }
            case .bodyChunk(let number, let bytes):
                guard sinkFailures[number] == nil, let sink = sinks[number] else { continue }
                do { try sink.write(bytes) } catch { sinkFailures[number] = error }
            case .message(let message):
                if message.type.isReply {
                    awaiting.removeValue(forKey: message.number)?.resume(returning: message)
                } else {
                    arrival?(message)
                    let handler = self.handler
                    Task { await handler(self, message) }
                }
            }
        }
    }

    /// Ends the connection because the other side broke the protocol (a message that cannot be
    /// read): as `close`, and the reason is the `protocolFailure` the transport reports (1002).
    public func fail(_ reason: String) {
        guard closedReason == nil else { return }
        protocolFailure = reason
        close(reason)
    }

    /// Ends the connection: waiting requests fail, the writer stops.
    public func close(_ reason: String) {
        guard closedReason == nil else { return }
        closedReason = reason
        for (_, continuation) in awaiting { continuation.resume(throwing: BLIPProtocolError.closed(reason)) }
        awaiting = [:]
        outbox = []
        frameWaiter?.resume(returning: nil)
        frameWaiter = nil
    }

    public var isClosed: Bool { closedReason != nil }

    /// Why the connection was closed, once it was.
    public var closeReason: String? { closedReason }
}
