import BLIP
import DocumentModel
import DocumentStore
import Foundation
import NIOCore
import NIOHTTP1

/// A CouchDB-style failure: the status, and the `{"error":…,"reason":…}` body.
struct HTTPError: Error, CustomStringConvertible {
    let status: HTTPResponseStatus
    let error: String
    let reason: String
    /// Extra headers (e.g. `Connection: close` after a body that could not be read).
    var closeConnection = false
    /// The reason when it is not text: a validator may refuse with any JSON value.
    var reasonValue: JSONValue?

    init(_ status: HTTPResponseStatus, _ error: String, _ reason: String, closeConnection: Bool = false) {
        self.status = status
        self.error = error
        self.reason = reason
        self.closeConnection = closeConnection
    }

    var description: String { "\(status.code) \(error): \(reason)" }

    /// The `reason` member of the answer.
    var reasonJSON: JSONValue { reasonValue ?? .string(reason) }

    /// An answer whose reason is a JSON value (a validator's `{forbidden: …}` or `{unauthorized: …}`).
    init(_ status: HTTPResponseStatus, _ error: String, reason: JSONValue) {
        self.init(status, error, reason.stringValue ?? reason.jsonString())
        reasonValue = reason
    }

    static func badRequest(_ reason: String) -> HTTPError { HTTPError(.badRequest, "bad_request", reason) }
    static let notFound = HTTPError(.notFound, "not_found", "missing")
    static let databaseNotFound = HTTPError(.notFound, "not_found", "Database does not exist.")
    static let methodNotAllowed = HTTPError(.methodNotAllowed, "method_not_allowed", "Only the methods listed in Allow are supported.")
    static let onlyPOST = HTTPError(.methodNotAllowed, "method_not_allowed", "Only POST allowed")
    static let invalidJSON = HTTPError(.badRequest, "bad_request", "invalid UTF-8 JSON")
    static let conflict = HTTPError(.conflict, "conflict", "Document update conflict.")
    static let unauthorized = HTTPError(.unauthorized, "unauthorized", "You are not authorized to access this db.")
    static let readOnly = HTTPError(.forbidden, "forbidden", "This server is read-only.")

    /// A CouchDB endpoint Sofa does not implement, named.
    static func notImplemented(_ endpoint: String) -> HTTPError {
        HTTPError(.notImplemented, "not_implemented", "Sofa does not implement \(endpoint).")
    }

    /// The HTTP view of a storage error.
    init(_ error: SofaError) {
        switch error {
        case .invalidJSON: self = .invalidJSON
        case .invalidDocument(let reason): self.init(.badRequest, "doc_validation", reason)
        case .invalidBlob: self.init(.badRequest, "doc_validation", "\(error)")
        case .invalidDocumentID(_, let reason): self.init(.badRequest, "illegal_docid", reason)
        case .invalidAttachmentName(_, let reason): self.init(.badRequest, "bad_request", "invalid attachment name: \(reason)")
        case .invalidRevisionID: self.init(.badRequest, "bad_request", "Invalid rev format")
        case .documentNotFound, .revisionNotFound: self = .notFound
        case .attachmentNotFound: self.init(.notFound, "not_found", "Document is missing attachment")
        case .conflict: self = .conflict
        case .databaseExists: self.init(.preconditionFailed, "file_exists", "The database could not be created, the file already exists.")
        case .notADatabase: self = .databaseNotFound
        case .keyRejected(_, let reason): self.init(.forbidden, "forbidden", "the database is encrypted and this server has no key for it: \(reason)")
        case .diskFull: self.init(.insufficientStorage, "insufficient_storage", "no space left on the server's disk")
        case .readOnlyFileSystem: self.init(.forbidden, "forbidden", "the database is on a read-only file system")
        case .bodyNotAvailable(let id, let name):
            self.init(.notFound, "not_found", "the body of attachment \(name) of \(id) was not downloaded to this server")
        case .invalidArgument(let message): self.init(.badRequest, "bad_request", message)
        case .invalidQuery(let error, let reason): self.init(.badRequest, error, reason)
        case .forbidden(let reason): self.init(.forbidden, "forbidden", reason: reason)
        case .unauthorized(let reason): self.init(.unauthorized, "unauthorized", reason: reason)
        case .designFunctionFailed(let error, let reason): self.init(.internalServerError, error, reason)
        case .blobCorrupted, .sqlite, .io: self.init(.internalServerError, "internal_server_error", "\(error)")
        }
    }

    static func from(_ error: any Error) -> HTTPError {
        if let error = error as? HTTPError { return error }
        if let error = error as? SofaError { return HTTPError(error) }
        if let error = error as? CouchFormatError { return HTTPError(.badRequest, error.error, error.reason) }
        if let error = error as? MissingStub {
            return HTTPError(.preconditionFailed, "missing_stub", "Invalid attachment stub in \(error.docID) for \(error.name)")
        }
        if let error = error as? JSONParseError { return HTTPError(SofaError.invalidJSON(error)) }
        if let error = error as? IncomingBodyMismatch {
            return HTTPError(.badRequest, "bad_request", "attachment body does not match its digest \(error.claimedDigest ?? "")")
        }
        if let error = error as? MultipartError { return HTTPError(.badRequest, "bad_request", "\(error)", closeConnection: true) }
        return HTTPError(.internalServerError, "internal_server_error", "\(error)")
    }
}

extension HTTPResponseStatus {
    /// CouchDB's (Erlang's) reason phrase, which some clients print.
    static let couchNotFound = HTTPResponseStatus.custom(code: 404, reasonPhrase: "Object Not Found")
}

/// A request's target split the CouchDB way: path segments percent-decoded one
/// by one (so `%2F` stays inside a segment), and the query as name → value.
struct RequestTarget {
    let segments: [String]
    let query: [String: String]

    init(_ uri: String) throws {
        let parts = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = parts.first.map(String.init) ?? "/"
        var segments = try path.split(separator: "/", omittingEmptySubsequences: false).dropFirst().map { raw -> String in
            guard let decoded = String(raw).removingPercentEncoding else {
                throw HTTPError.badRequest("invalid percent-encoding in the path")
            }
            return decoded
        }
        // "/db/" is "/db".
        while segments.last == "" { segments.removeLast() }
        self.segments = segments
        var query: [String: String] = [:]
        if parts.count > 1 {
            for pair in parts[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let name = String(kv[0]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(kv[0])
                let value = kv.count > 1 ? (String(kv[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String(kv[1])) : ""
                query[name] = value
            }
        }
        self.query = query
    }
}

/// The incoming parts of one HTTP connection, read by one request at a time.
final class InboundParts {
    private var iterator: NIOAsyncChannelInboundStream<Handed<HTTPServerRequestPart>>.AsyncIterator
    /// A head read while draining a previous body (pipelining).
    private var pendingHead: HTTPRequestHead?

    init(_ inbound: NIOAsyncChannelInboundStream<Handed<HTTPServerRequestPart>>) {
        iterator = inbound.makeAsyncIterator()
    }

    func nextHead() async throws -> HTTPRequestHead? {
        if let head = pendingHead {
            pendingHead = nil
            return head
        }
        while let part = try await iterator.next()?.value {
            if case .head(let head) = part { return head }
        }
        return nil
    }

    /// The next body chunk of the current request; nil at its end.
    func nextBodyChunk() async throws -> ByteBuffer? {
        guard let part = try await iterator.next()?.value else {
            throw HTTPError(.badRequest, "bad_request", "the client closed the connection mid-body", closeConnection: true)
        }
        switch part {
        case .body(let buffer): return buffer
        case .end: return nil
        case .head(let head):
            pendingHead = head
            return nil
        }
    }
}

/// The body of the request being handled, read once, chunk by chunk.
final class RequestBody {
    private let parts: InboundParts
    private(set) var finished = false
    /// The request's `Content-Length`, when it declared one.
    let declaredLength: Int?

    init(_ parts: InboundParts, declaredLength: Int? = nil) {
        self.parts = parts
        self.declaredLength = declaredLength
    }

    func next() async throws -> ByteBuffer? {
        guard !finished else { return nil }
        let chunk = try await parts.nextBodyChunk()
        if chunk == nil { finished = true }
        return chunk
    }

    /// The whole body, refused with 413 beyond `limit` bytes.
    func collect(limit: Int) async throws -> [UInt8] {
        // A declared length says it before a byte is read.
        if let declaredLength, declaredLength > limit {
            throw HTTPError(.payloadTooLarge, "too_large", "the request body is larger than \(limit) bytes", closeConnection: true)
        }
        var bytes: [UInt8] = []
        while var chunk = try await next() {
            guard bytes.count + chunk.readableBytes <= limit else {
                throw HTTPError(.payloadTooLarge, "too_large", "the request body is larger than \(limit) bytes", closeConnection: true)
            }
            bytes.append(contentsOf: chunk.readBytes(length: chunk.readableBytes) ?? [])
        }
        return bytes
    }

    /// The body parsed as JSON; 400 for anything else.
    func json(limit: Int) async throws -> JSONValue {
        let bytes = try await collect(limit: limit)
        do {
            return try JSONParser.parse(bytes)
        } catch where "\(error)".contains("nesting deeper") {
            throw HTTPError(.badRequest, "bad_request", "JSON nested deeper than \(JSONParser.maximumDepth) levels")
        } catch {
            throw HTTPError.invalidJSON
        }
    }

    /// Reads and drops what the handler left unread, so the connection can serve the next request.
    func drain() async throws {
        while try await next() != nil {}
    }
}

/// Writes one response: a whole body with Content-Length, or chunks.
final class ResponseWriter {
    private let outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>
    private let allocator = ByteBufferAllocator()
    let isHead: Bool
    /// False when the connection ends after this response (the client asked, or the request could not be read whole).
    var keepAlive: Bool
    private(set) var headSent = false
    private(set) var status: HTTPResponseStatus = .ok
    private(set) var bytesSent = 0
    private var chunked = false

    /// An HTTP/1.0 client keeps the connection only when the answer says so.
    let announceKeepAlive: Bool

    init(outbound: NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>, isHead: Bool, keepAlive: Bool, announceKeepAlive: Bool = false) {
        self.outbound = outbound
        self.isHead = isHead
        self.keepAlive = keepAlive
        self.announceKeepAlive = announceKeepAlive
    }

    static let serverName = "Sofa/\(SofaVersion.current) (CouchDB-compatible)"

    private func head(_ status: HTTPResponseStatus, _ headers: HTTPHeaders) -> HTTPResponseHead {
        var headers = headers
        headers.replaceOrAdd(name: "Server", value: ResponseWriter.serverName)
        headers.replaceOrAdd(name: "Date", value: httpDate(Date()))
        if !keepAlive {
            headers.replaceOrAdd(name: "Connection", value: "close")
        } else if announceKeepAlive {
            headers.replaceOrAdd(name: "Connection", value: "keep-alive")
        }
        return HTTPResponseHead(version: .http1_1, status: status, headers: headers)
    }

    /// A complete response.
    func send(_ status: HTTPResponseStatus, headers: HTTPHeaders = [:], body: [UInt8] = []) async throws {
        precondition(!headSent, "response already started")
        var headers = headers
        headers.replaceOrAdd(name: "Content-Length", value: String(body.count))
        headSent = true
        self.status = status
        try await outbound.write(.head(head(status, headers)))
        if !isHead && !body.isEmpty {
            var buffer = allocator.buffer(capacity: body.count)
            buffer.writeBytes(body)
            try await outbound.write(.body(.byteBuffer(buffer)))
            bytesSent += body.count
        }
        try await outbound.write(.end(nil))
    }

    /// A JSON response as CouchDB writes it: compact, ending with a newline.
    func sendJSON(_ status: HTTPResponseStatus = .ok, _ value: JSONValue, headers: HTTPHeaders = [:]) async throws {
        var headers = headers
        headers.replaceOrAdd(name: "Content-Type", value: "application/json")
        if headers["Cache-Control"].isEmpty { headers.add(name: "Cache-Control", value: "must-revalidate") }
        var body = value.serialized()
        body.append(0x0A)
        try await send(status, headers: headers, body: body)
    }

    func sendError(_ error: HTTPError) async throws {
        try await sendJSON(error.status == .notFound ? .couchNotFound : error.status,
                           ["error": .string(error.error), "reason": error.reasonJSON])
    }

    /// Starts a response whose body follows in chunks (or with a known length, if given).
    func start(_ status: HTTPResponseStatus, headers: HTTPHeaders, contentLength: Int64? = nil) async throws {
        precondition(!headSent, "response already started")
        var headers = headers
        if let contentLength {
            headers.replaceOrAdd(name: "Content-Length", value: String(contentLength))
        } else {
            headers.replaceOrAdd(name: "Transfer-Encoding", value: "chunked")
            chunked = true
        }
        headSent = true
        self.status = status
        try await outbound.write(.head(head(status, headers)))
    }

    /// One piece of the body. Each chunk goes out whole, in one write (CouchDB's
    /// replicator stalls when a chunk's size line and data arrive separately).
    func write(_ buffer: ByteBuffer) async throws {
        guard !isHead, buffer.readableBytes > 0 else { return }
        bytesSent += buffer.readableBytes
        try await outbound.write(.body(.byteBuffer(buffer)))
    }

    func write(_ bytes: [UInt8]) async throws {
        guard !isHead, !bytes.isEmpty else { return }
        var buffer = allocator.buffer(capacity: bytes.count)
        buffer.writeBytes(bytes)
        try await write(buffer)
    }

    func write(_ text: String) async throws { try await write(Array(text.utf8)) }

    func finish() async throws {
        try await outbound.write(.end(nil))
    }

    func buffer(capacity: Int) -> ByteBuffer { allocator.buffer(capacity: capacity) }
}

extension HTTPHeaders {
    /// The media type of Content-Type, lowercased, without parameters.
    var mediaType: String? {
        self["Content-Type"].first.map(MultipartParser.mediaType)
    }

    /// A parameter of Content-Type (e.g. the multipart `boundary`), unquoted.
    func contentTypeParameter(_ name: String) -> String? {
        guard let value = self["Content-Type"].first else { return nil }
        return MultipartParser.parameter(value, name)
    }
}

/// Ends a connection gently after a request that could not be parsed (oversized headers,
/// garbage): NIO answers it with 400 and closes, and closing a socket that still holds
/// unread bytes makes the kernel reset the connection, which can drop the 400 before it
/// leaves (it did, on a busy machine). Here that close becomes a half-close (FIN after the
/// answer), what the client still sends is read and dropped, and the socket closes at the
/// client's end of input or after `linger`.
final class LingeringClose: ChannelDuplexHandler, @unchecked Sendable {
    // Sendable invariant: used on its channel's event loop only.
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    static let linger = ServerTuning.lingerOnError
    /// Set when a parse error has been seen: the close that follows lingers.
    var lingerOnClose = false
    private var lingering = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !lingering else { return }
        context.fireChannelRead(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // The handlers after this one no longer ask for reads: keep reading until the end.
        guard !lingering else { return context.read() }
        context.fireChannelReadComplete()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if lingering {
            // Closes asked meanwhile (the request loop ending) wait for the lingering one.
            context.channel.closeFuture.cascade(to: promise)
            return
        }
        guard mode == .all, lingerOnClose, context.channel.isActive else {
            context.close(mode: mode, promise: promise)
            return
        }
        lingering = true
        context.channel.closeFuture.cascade(to: promise)
        let halfClosed = context.eventLoop.makePromise(of: Void.self)
        context.close(mode: .output, promise: halfClosed)
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)  // the callbacks run on that loop
        halfClosed.futureResult.whenFailure { _ in loopBound.value.close(promise: nil) }
        let deadline = context.eventLoop.scheduleTask(in: LingeringClose.linger) { loopBound.value.close(promise: nil) }
        context.channel.closeFuture.whenComplete { _ in deadline.cancel() }
        context.read()
    }
}

/// Tells `LingeringClose` that the request could not be parsed (placed after the decoder).
final class ParseErrorWatcher: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    // Sendable invariant: used on its channel's event loop only.
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    private let closer: LingeringClose

    init(_ closer: LingeringClose) { self.closer = closer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        if error is HTTPParserError { closer.lingerOnClose = true }
        context.fireErrorCaught(error)
    }
}

/// Closes a connection that is too slow to send a request: its head must arrive within
/// `header` of the previous response's end (or the connection's start), and its body may
/// not pause for longer than `body`. While a request is being answered (a long response,
/// a continuous feed) no deadline runs. Placed after the decoder.
final class RequestDeadlines: ChannelDuplexHandler, RemovableChannelHandler, @unchecked Sendable {
    // Sendable invariant: used on its channel's event loop only.
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let header: TimeAmount
    private let body: TimeAmount
    private var deadline: Scheduled<Void>?
    /// Requests whose head arrived and whose response has not ended.
    private var answering = 0

    init(header: TimeAmount, body: TimeAmount) {
        self.header = header
        self.body = body
    }

    private func arm(_ context: ChannelHandlerContext, _ amount: TimeAmount) {
        deadline?.cancel()
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: amount) { loopBound.value.close(promise: nil) }
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { arm(context, header) }
    }

    func channelActive(context: ChannelHandlerContext) {
        arm(context, header)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            answering += 1
            arm(context, body)
        case .body:
            arm(context, body)
        case .end:
            deadline?.cancel()
            deadline = nil
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) {
            answering = max(0, answering - 1)
            if answering == 0 { arm(context, header) }
        }
        context.write(data, promise: promise)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        context.fireChannelInactive()
    }

    /// Removed when the connection becomes a WebSocket: its deadlines are HTTP's.
    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }
}

/// The head of a connection's first request (and whether it ended), kept for `DroppedHeadRestorer`.
final class FirstRequestHead: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    // Sendable invariant: used on its channel's event loop only.
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    private(set) var head: HTTPRequestHead?
    private(set) var ended = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let first) where head == nil: head = first
        case .end where head != nil: ended = true
        default: break
        }
        context.fireChannelRead(data)
    }
}

/// Gives back what NIO's upgrade handler drops of a first request that names an `Upgrade` no
/// upgrader takes (a `_blipsync` without credentials, an `h2c`): swift-nio 2.101's state
/// machine forwards only what came after the head, and nothing at all when the upgrader
/// declined after the request's end arrived, so the request would never be answered. Placed
/// after the upgrade handler once it is known there is none.
final class DroppedHeadRestorer: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    // Sendable invariant: used on its channel's event loop only.
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    private let first: FirstRequestHead
    private var checked = false

    init(_ first: FirstRequestHead) { self.first = first }

    func handlerAdded(context: ChannelHandlerContext) {
        // After the upgrade handler has forwarded what it kept (at once, in this turn of the loop).
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.eventLoop.execute {
            guard !self.checked, let head = self.first.head, self.first.ended else { return }
            self.checked = true
            bound.value.fireChannelRead(self.wrapInboundOut(.head(head)))
            bound.value.fireChannelRead(self.wrapInboundOut(.end(nil)))
            bound.value.fireChannelReadComplete()
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if !checked {
            checked = true
            if case .head = unwrapInboundIn(data) {} else if let head = first.head {
                context.fireChannelRead(wrapInboundOut(.head(head)))
            }
        }
        context.fireChannelRead(data)
    }
}

/// Gives the request loop body bytes of their own, as `InboundFrameCopier` (BLIP) does a
/// WebSocket's frames and for the same reason: NIO's pooled receive buffers never leave the
/// event loop. A body is copied once more than before (a memcpy per chunk). Each part goes on
/// `Handed`, as each frame does.
final class InboundCopier: ChannelInboundHandler, RemovableChannelHandler, @unchecked Sendable {
    // Sendable invariant: stateless.
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = Handed<HTTPServerRequestPart>

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = unwrapInboundIn(data)
        guard case .body(let buffer) = part else { return context.fireChannelRead(wrapInboundOut(Handed(part))) }
        context.fireChannelRead(wrapInboundOut(Handed(.body(buffer.ownCopy(context.channel.allocator)))))
    }
}

/// An HTTP connection as its request loop reads it: parts from `InboundCopier`.
typealias HTTPChannel = NIOAsyncChannel<Handed<HTTPServerRequestPart>, HTTPServerResponsePart>
