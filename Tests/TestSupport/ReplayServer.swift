import Foundation

/// Serves recorded HTTP responses (byte for byte, as files of ../shared/fixtures hold
/// them) on 127.0.0.1: each request gets the response recorded for its method and path
/// (the query is ignored), or a CouchDB-style 404. Keep-alive; a thread per connection.
public final class ReplayServer: @unchecked Sendable {
    public let port: Int
    private let listener: Int32
    private let responses: [String: [UInt8]]
    private let lock = NSLock()
    /// "METHOD path?query" of every request, in order.
    public var requests: [String] { lock.withLock { received } }
    private var received: [String] = []
    /// Answers made per request: (method, path prefix, make) → the whole response's bytes, or
    /// nil to let the recorded ones answer. Checked before the recorded ones.
    public typealias Responder = @Sendable (_ target: String, _ body: [UInt8]) -> [UInt8]?
    private var responders: [(method: String, prefix: String, respond: Responder)] = []

    public func respond(to method: String, pathPrefix: String, with respond: @escaping Responder) {
        lock.withLock { responders.append((method, pathPrefix, respond)) }
    }

    /// A complete JSON response with Content-Length.
    public static func jsonResponse(_ status: String, _ body: [UInt8]) -> [UInt8] {
        Array("HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body
    }

    /// `responses`: "GET /db/doc/att" → the path of a `.response` file.
    public init(responses: [String: String]) throws {
        self.responses = try responses.mapValues { ReplayServer.reframed([UInt8](try Data(contentsOf: URL(fileURLWithPath: $0)))) }
        let (listener, port) = try listenOnLoopback(backlog: 16)
        self.listener = listener
        self.port = port
        Thread.detachNewThread { [self] in
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }
                Thread.detachNewThread { [self] in serve(client) }
            }
        }
    }

    deinit {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    /// The fixtures keep chunked bodies de-chunked under their original headers: those are
    /// sent with a Content-Length instead (as the fixtures' README suggests).
    static func reframed(_ response: [UInt8]) -> [UInt8] {
        guard let split = response.firstRange(of: Array("\r\n\r\n".utf8)) else { return response }
        let lines = String(decoding: response[..<split.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        guard lines.contains(where: { $0.lowercased() == "transfer-encoding: chunked" }) else { return response }
        let body = response[split.upperBound...]
        let head = lines.map { $0.lowercased() == "transfer-encoding: chunked" ? "Content-Length: \(body.count)" : $0 }
        return Array((head.joined(separator: "\r\n") + "\r\n\r\n").utf8) + body
    }

    private func serve(_ fd: Int32) {
        defer { close(fd) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            // One request head (and a Content-Length body, skipped).
            var headEnd = buffer.firstRange(of: Array("\r\n\r\n".utf8))
            while headEnd == nil {
                let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { return }
                buffer += chunk[..<count]
                headEnd = buffer.firstRange(of: Array("\r\n\r\n".utf8))
            }
            let head = String(decoding: buffer[..<headEnd!.lowerBound], as: UTF8.self)
            let lines = head.components(separatedBy: "\r\n")
            let bodyLength = lines.first { $0.lowercased().hasPrefix("content-length:") }
                .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
            while buffer.count < headEnd!.upperBound + bodyLength {
                let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard count > 0 else { return }
                buffer += chunk[..<count]
            }
            let body = Array(buffer[headEnd!.upperBound..<(headEnd!.upperBound + bodyLength)])
            buffer.removeSubrange(..<(headEnd!.upperBound + bodyLength))
            let parts = lines[0].split(separator: " ")
            guard parts.count >= 2 else { return }
            let target = String(parts[1])
            lock.withLock { received.append("\(parts[0]) \(target)") }
            let path = String(target.split(separator: "?", maxSplits: 1)[0])
            let key = "\(parts[0]) \(path)"
            let candidates = lock.withLock { responders.filter { $0.method == parts[0] && path.hasPrefix($0.prefix) } }
            let response = candidates.lazy.compactMap { $0.respond(target, body) }.first ?? responses[key]
                ?? ReplayServer.jsonResponse("404 Object Not Found", Array("{\"error\":\"not_found\",\"reason\":\"missing\"}\n".utf8))
            var sent = 0
            while sent < response.count {
                let count = response.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                guard count > 0 else { return }
                sent += count
            }
        }
    }
}
