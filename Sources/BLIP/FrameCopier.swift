import NIOCore
import NIOWebSocket

/// Hands a WebSocket connection's task each frame unmasked, in storage of its own. NIO reads
/// into pooled buffers, the decoders hand out slices of them, and NIO writes into such a buffer
/// again once nothing else holds it (`isKnownUniquelyReferenced`): a slice released by the
/// connection's task, on another thread, is synchronised with that reuse only by the runtime's
/// reference-count fences, which ThreadSanitizer does not model, and the TSan pass reported it
/// as a race (a few CI runs in twenty). Copied here, on the event loop, where the slice is also
/// released, NIO's buffers never leave the loop. Placed last, before the channel is wrapped in
/// an `NIOAsyncChannel` (`sofa serve`'s `_blipsync`, the replicator's BLIP client).
public final class InboundFrameCopier: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    public typealias InboundIn = WebSocketFrame
    public typealias InboundOut = WebSocketFrame

    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        func copy(_ buffer: ByteBuffer) -> ByteBuffer {
            var copy = context.channel.allocator.buffer(capacity: buffer.readableBytes)
            copy.writeImmutableBuffer(buffer)
            return copy
        }
        context.fireChannelRead(wrapInboundOut(WebSocketFrame(fin: frame.fin, rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3,
                                                              opcode: frame.opcode, data: copy(frame.unmaskedData),
                                                              extensionData: frame.unmaskedExtensionData.map(copy))))
    }
}
