import NIOConcurrencyHelpers
import NIOCore
import NIOWebSocket

/// Hands a WebSocket connection's task each frame unmasked, in storage of its own. NIO reads
/// into pooled buffers, the decoders hand out slices of them, and NIO writes into such a buffer
/// again once nothing else holds it (`isKnownUniquelyReferenced`): a slice released by the
/// connection's task, on another thread, is synchronised with that reuse only by the runtime's
/// reference-count fences, which ThreadSanitizer does not model, and the TSan pass reported it
/// as a race (a few CI runs in twenty). Copied here, on the event loop, where the slice is also
/// released, NIO's buffers never leave the loop. Placed last, before the channel is wrapped in
/// an `NIOAsyncChannel` (`sofa serve`'s `_blipsync`, the replicator's BLIP client). Each copy
/// goes on `Handed` (see there).
public final class InboundFrameCopier: ChannelInboundHandler, RemovableChannelHandler, Sendable {
    public typealias InboundIn = WebSocketFrame
    public typealias InboundOut = Handed<WebSocketFrame>

    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        let allocator = context.channel.allocator
        context.fireChannelRead(wrapInboundOut(Handed(WebSocketFrame(fin: frame.fin, rsv1: frame.rsv1, rsv2: frame.rsv2, rsv3: frame.rsv3,
                                                                     opcode: frame.opcode, data: frame.unmaskedData.ownCopy(allocator),
                                                                     extensionData: frame.unmaskedExtensionData.map { $0.ownCopy(allocator) }))))
    }
}

/// A WebSocket connection as its task reads it: frames from `InboundFrameCopier`.
public typealias WebSocketChannel = NIOAsyncChannel<Handed<WebSocketFrame>, WebSocketFrame>

/// A value made on an event loop and read by a task, published under a lock of its own.
/// `NIOAsyncChannel` hands a waiting task its next element by resuming a continuation outside
/// its lock; when the task has not quite suspended yet, the Swift runtime orders the two threads
/// with atomics of its own that ThreadSanitizer does not see, and the TSan pass reported the
/// task's read of a frame as racing with the frame's making on the loop (CI, 2026-11-29). The
/// lock here is taken once after the value is made and once by each read, which orders them
/// where ThreadSanitizer can see it; the cost is an allocation and two uncontended locks per
/// element.
public struct Handed<Value: Sendable>: Sendable {
    private let box: NIOLockedValueBox<Value>

    public init(_ value: Value) {
        box = NIOLockedValueBox(value)
        box.withLockedValue { _ in }  // the publication the reader's lock pairs with
    }

    public var value: Value { box.withLockedValue { $0 } }
}

extension ByteBuffer {
    /// The readable bytes in storage of their own (see `InboundFrameCopier`).
    public func ownCopy(_ allocator: ByteBufferAllocator) -> ByteBuffer {
        var copy = allocator.buffer(capacity: readableBytes)
        copy.writeImmutableBuffer(self)
        return copy
    }
}
