import BLIP
import DocumentModel
import NIOCore
import NIOWebSocket

/// Carries one BLIP connection's frames over an upgraded WebSocket, both ways, until either side
/// ends it: the same pump for a server (`sofa serve`'s `_blipsync`) and a client (`sofa pull
/// ws://`). Binary messages are BLIP frames; a ping is answered; a text message or a frame BLIP
/// cannot read ends the connection with a close frame that says why (1003, 1002), and a close
/// from here says why too (the reason `BLIPConnection.close` was given).
public enum WebSocketPump {
    public enum Side: Sendable {
        /// Frames go masked, as RFC 6455 wants from a client; an end from here is a normal closure.
        case client
        /// An end from here is "going away" (the server stopping, a sync that failed).
        case server
    }

    /// Runs until the connection ends; returns why, in words for a log.
    public static func run(_ channel: WebSocketChannel, _ blip: BLIPConnection, side: Side) async -> String {
        let mask: @Sendable () -> WebSocketMaskingKey? = { side == .client ? .random() : nil }
        // The one close frame this side sends: the reader's choice when the other side broke the
        // protocol, the writer's when this side ended it, none when the other side closed first
        // (the reader echoes its close).
        let closing = Locked<(code: WebSocketErrorCode, reason: String)?>(nil)
        let reason: String
        do {
            reason = try await channel.executeThenClose { inbound, outbound in
                try await withThrowingTaskGroup(of: (fromReader: Bool, reason: String).self) { group in
                    @Sendable func read(_ inbound: NIOAsyncChannelInboundStream<Handed<WebSocketFrame>>) async throws -> (fromReader: Bool, reason: String) {
                        for try await handed in inbound {
                            let frame = handed.value
                            switch frame.opcode {
                            case .binary:
                                do {
                                    try await blip.receive(Array(buffer: frame.unmaskedData))
                                } catch {
                                    // `receive` closed the connection and named the failure: the writer sends 1002.
                                    return (true, "the other side broke the protocol: \(error)")
                                }
                            case .ping:
                                try await outbound.write(WebSocketFrame(fin: true, opcode: .pong, maskKey: mask(), data: frame.unmaskedData))
                            case .connectionClose:
                                var data = frame.unmaskedData
                                let code = data.readInteger(as: UInt16.self)
                                let said = data.readString(length: data.readableBytes) ?? ""
                                closing.withLock { $0 = (.normalClosure, "") }  // echoed here, nothing more from the writer
                                try? await outbound.write(WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: mask(),
                                                                         data: ByteBuffer(integer: code ?? 1000)))
                                return (true, "the other side closed the connection (\(code.map(String.init) ?? "no code")\(said.isEmpty ? "" : ": \(said)"))")
                            case .text:
                                let why = "a text message arrived: BLIP takes binary messages only"
                                closing.withLock { $0 = (.unacceptableData, why) }
                                return (true, why)
                            default:
                                continue
                            }
                        }
                        return (true, "the connection ended")
                    }
                    // Neither task throws: a task group waits for all of its tasks before a throw
                    // leaves it, and the writer waits on `blip`, which only `close` below wakes.
                    group.addTask {
                        while let frames = await blip.nextFrames(upTo: BLIPTuning.writeBatchBytes) {
                            do {
                                try await outbound.write(contentsOf: frames.map {
                                    WebSocketFrame(fin: true, opcode: .binary, maskKey: mask(), data: ByteBuffer(bytes: $0))
                                })
                            } catch {
                                return (false, "the connection failed: \(error)")
                            }
                        }
                        let ended = await blip.closeReason ?? "closed"
                        let failure = await blip.protocolFailure
                        let close = closing.withLock { chosen -> (code: WebSocketErrorCode, reason: String)? in
                            if let chosen { return chosen.code == .normalClosure && chosen.reason.isEmpty ? nil : chosen }
                            if let failure { return (.protocolError, failure) }
                            return (side == .client ? .normalClosure : .goingAway, ended)
                        }
                        if let close { try? await outbound.write(closeFrame(close.code, close.reason, mask: mask())) }
                        return (false, "closed by this side: \(ended)")
                    }
                    group.addTask {
                        do {
                            return try await read(inbound)
                        } catch {
                            return (true, "the connection failed: \(error)")
                        }
                    }
                    let first = try await group.next() ?? (true, "the connection ended")
                    await blip.close(first.reason)
                    // The reader ended it: the writer, woken by `close`, sends the close frame and returns.
                    if first.fromReader { _ = try? await group.next() }
                    group.cancelAll()
                    return first.reason
                }
            }
        } catch {
            reason = "the connection failed: \(error)"
        }
        await blip.close(reason)
        return reason
    }

    static func closeFrame(_ code: WebSocketErrorCode, _ reason: String, mask: WebSocketMaskingKey?) -> WebSocketFrame {
        var data = ByteBuffer()
        data.write(webSocketErrorCode: code)
        data.writeString(String(reason.utf8.prefix(120)) ?? "closed")
        return WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: mask, data: data)
    }
}
