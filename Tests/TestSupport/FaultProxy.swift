import Foundation

/// A TCP proxy on 127.0.0.1 between a client and a server that misbehaves on
/// demand: refuses connections, resets or stalls them partway through an answer,
/// or rewrites bytes of answers (a lying server). Each connection gets two threads.
public final class FaultProxy: @unchecked Sendable {
    public let port: Int
    private let upstreamPort: Int
    private let listener: Int32
    private let lock = NSLock()
    private var refuseCount = 0
    private var cut: (bytes: Int, count: Int, stall: Bool)?
    private var replacement: (from: [UInt8], to: [UInt8])?
    private var closed = false
    /// Connections accepted so far.
    public var connections: Int { lock.withLock { accepted } }
    private var accepted = 0
    /// Bytes forwarded from the server to clients so far.
    public var bytesFromServer: Int { lock.withLock { forwardedFromServer } }
    private var forwardedFromServer = 0

    public init(upstreamPort: Int) throws {
        self.upstreamPort = upstreamPort
        (listener, port) = try listenOnLoopback()
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    deinit { close() }

    public func close() {
        let first = lock.withLock { () -> Bool in
            defer { closed = true }
            return !closed
        }
        if first {
            shutdown(listener, Int32(SHUT_RDWR))
            Glibc.close(listener)
        }
    }

    /// The next `count` connections are closed as soon as they are accepted.
    public func refuseNext(_ count: Int) { lock.withLock { refuseCount = count } }

    /// The next `count` connections get `503 Service Unavailable` (a server restarting, a
    /// proxy without a backend) instead of the server's answer.
    public func refuseServiceNext(_ count: Int) { lock.withLock { unavailableCount = count } }
    private var unavailableCount = 0

    /// The next `count` connections are reset after `bytes` bytes of answers.
    public func resetNext(_ count: Int, afterBytes bytes: Int) { lock.withLock { cut = (bytes, count, false) } }

    /// The next `count` connections stop forwarding answers after `bytes` bytes and hang
    /// (a server gone silent) until `behave()` or `close()`.
    public func stallNext(_ count: Int, afterBytes bytes: Int) { lock.withLock { cut = (bytes, count, true) } }

    /// Rewrites `from` into `to` (same length) wherever it appears whole in one read of an answer.
    public func replace(_ from: String, with to: String) {
        precondition(from.utf8.count == to.utf8.count, "a replacement keeps lengths, so Content-Length stays true")
        lock.withLock { replacement = (Array(from.utf8), Array(to.utf8)) }
    }

    /// Rewrites `from` into `to` wherever it appears whole in one read of a request: for
    /// headers (a client's `Accept`), whose length no header counts.
    public func replaceInRequests(_ from: String, with to: String) {
        lock.withLock { requestReplacement = (Array(from.utf8), Array(to.utf8)) }
    }
    private var requestReplacement: (from: [UInt8], to: [UInt8])?

    /// Bytes travel at most `bytesPerSecond` each way (a slow link); nil: as fast as they come.
    public func limitRate(_ bytesPerSecond: Int?) { lock.withLock { rate = bytesPerSecond } }
    private var rate: Int?

    public func behave() {
        lock.withLock { refuseCount = 0; unavailableCount = 0; cut = nil; replacement = nil; requestReplacement = nil; stalling = false; rate = nil }
    }
    private var stalling = false

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                if lock.withLock({ closed }) { return }
                continue
            }
            let (refuse, limit) = lock.withLock { () -> (Bool, (bytes: Int, stall: Bool)?) in
                accepted += 1
                if refuseCount > 0 {
                    refuseCount -= 1
                    return (true, nil)
                }
                if unavailableCount > 0 {
                    unavailableCount -= 1
                    return (true, (0, false))
                }
                guard let cut else { return (false, nil) }
                self.cut = cut.count > 1 ? (cut.bytes, cut.count - 1, cut.stall) : nil
                if cut.stall { stalling = true }
                return (false, (cut.bytes, cut.stall))
            }
            if refuse, limit != nil {
                Thread.detachNewThread { FaultProxy.answerUnavailable(client) }
                continue
            }
            if refuse {
                abort(client)
                continue
            }
            let upstream = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = in_port_t(UInt16(upstreamPort).bigEndian)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(upstream, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else {
                abort(client)
                Glibc.close(upstream)
                continue
            }
            let pair = SocketPair(client, upstream)
            Thread.detachNewThread { [self] in
                pump(from: client, to: upstream, limit: nil, rewrite: false)
                pair.release()
            }
            Thread.detachNewThread { [self] in
                pump(from: upstream, to: client, limit: limit, rewrite: true)
                pair.release()
            }
        }
    }

    /// Reads the request's head and answers 503, then closes.
    private static func answerUnavailable(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var received: [UInt8] = []
        while received.firstRange(of: Array("\r\n\r\n".utf8)) == nil {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            received += buffer[..<count]
        }
        let body = #"{"error":"service_unavailable","reason":"the fault proxy says so"}"#
        let answer = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
        _ = Array(answer.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        shutdown(fd, Int32(SHUT_WR))
        // Drain what the client still sends (a body), so closing does not reset the answer away.
        var quiet = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &quiet, socklen_t(MemoryLayout<timeval>.size))
        while buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, 0) }) > 0 {}
        Glibc.close(fd)
    }

    /// Closes with a TCP reset rather than a clean end.
    private func abort(_ fd: Int32) {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        Glibc.close(fd)
    }

    private func pump(from source: Int32, to destination: Int32, limit: (bytes: Int, stall: Bool)?, rewrite: Bool) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        var forwarded = 0
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(source, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { break }
            var chunk = Array(buffer[..<count])
            if let replacement = lock.withLock({ rewrite ? replacement : requestReplacement }), let range = chunk.firstRange(of: replacement.from) {
                chunk.replaceSubrange(range, with: replacement.to)
            }
            if let limit, forwarded + chunk.count >= limit.bytes {
                let part = Array(chunk[..<max(0, limit.bytes - forwarded)])
                _ = part.withUnsafeBytes { send(destination, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                lock.withLock { forwardedFromServer += part.count }
                while limit.stall && lock.withLock({ stalling && !closed }) { usleep(20_000) }
                var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
                setsockopt(destination, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
                shutdown(destination, Int32(SHUT_RDWR))
                shutdown(source, Int32(SHUT_RDWR))
                return
            }
            var sent = 0
            while sent < chunk.count {
                let written = chunk.withUnsafeBytes { send(destination, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
                guard written > 0 else { break }
                sent += written
            }
            if sent < chunk.count { break }
            if let rate = lock.withLock({ rate }) { usleep(UInt32(min(1_000_000, chunk.count * 1_000_000 / max(1, rate)))) }
            forwarded += chunk.count
            if rewrite { lock.withLock { forwardedFromServer += chunk.count } }
        }
        shutdown(destination, Int32(SHUT_RDWR))
        shutdown(source, Int32(SHUT_RDWR))
    }
}

/// Two sockets closed when both pumps between them are done.
private final class SocketPair: @unchecked Sendable {
    private let fds: (Int32, Int32)
    private var users = 2
    private let lock = NSLock()

    init(_ a: Int32, _ b: Int32) { fds = (a, b) }

    func release() {
        let last = lock.withLock { () -> Bool in
            users -= 1
            return users == 0
        }
        if last {
            Glibc.close(fds.0)
            Glibc.close(fds.1)
        }
    }
}

/// A listening TCP socket on a free port of 127.0.0.1.
func listenOnLoopback(backlog: Int32 = 64) throws -> (fd: Int32, port: Int) {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var yes: Int32 = 1
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Int32 in
            guard bind(listener, pointer, length) == 0 else { return -1 }
            return getsockname(listener, pointer, &length)
        }
    }
    guard bound == 0, listen(listener, backlog) == 0 else {
        Glibc.close(listener)
        throw POSIXError(.EADDRINUSE)
    }
    return (listener, Int(UInt16(bigEndian: address.sin_port)))
}
