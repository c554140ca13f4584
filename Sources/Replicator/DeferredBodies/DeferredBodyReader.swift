import DocumentModel
import DocumentStore
import Foundation
import Logging

/// One open of a deferred body, with its own readahead: a read that starts where the last
/// one ended (give or take the kernel's reordering) doubles the window fetched beyond it,
/// from 64 KiB, until the window reaches the end of the body; any other read fetches
/// only the chunks it covers.
final class DeferredBodyReader: BodyReader, @unchecked Sendable {
    // Sendable invariant: the readahead state is guarded by `lock`.
    let body: DeferredBody
    private let lock = NSLock()
    private var nextOffset: Int64 = 0
    private var window: Int64 = 0
    private var closed = false

    static let firstWindow = ReplicatorTuning.firstReadahead
    /// Past this window, the rest of the body streams.
    static let streamingWindow = ReplicatorTuning.streamingWindow
    /// Reads this close to where the last one ended count as going forward (or the current
    /// window, if bigger).
    static let slack = ReplicatorTuning.forwardSlack

    init(body: DeferredBody) { self.body = body }

    var length: Int64 { body.attachment.length }

    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, timeout: Double, willWait: () -> Void) throws -> Int {
        let ahead = lock.withLock { () -> Int64 in
            let end = offset + Int64(buffer.count)
            if abs(offset - nextOffset) <= max(DeferredBodyReader.slack, window) {
                window = window == 0 ? DeferredBodyReader.firstWindow : min(window * 2, DeferredBodyReader.streamingWindow)
                nextOffset = max(nextOffset, end)
            } else {
                window = 0
                nextOffset = end
            }
            return window >= DeferredBodyReader.streamingWindow ? Int64.max / 2 : window
        }
        return try body.read(into: buffer, at: offset, ahead: ahead, timeout: timeout, willWait: willWait)
    }

    func close() {
        let first = lock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        if first { body.releaseUser() }
    }

    deinit { close() }
}
