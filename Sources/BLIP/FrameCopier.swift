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
        let allocator = context.channel.allocator
        context.fireChannelRead(wrapInboundOut(WebSocketFrame(fin: frame.fin, rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3,
                                                              opcode: frame.opcode, data: frame.unmaskedData.ownCopy(allocator),
                                                              extensionData: frame.unmaskedExtensionData.map { $0.ownCopy(allocator) })))
    }
}

extension ByteBuffer {
    /// The readable bytes in storage of their own (see `InboundFrameCopier`).
    public func ownCopy(_ allocator: ByteBufferAllocator) -> ByteBuffer {
        var copy = allocator.buffer(capacity: readableBytes)
        copy.writeImmutableBuffer(self)
        return copy
    }
}
