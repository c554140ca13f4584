import DocumentModel
import Foundation
import Testing

/// A `sofa serve` child process on a free port of 127.0.0.1.
public final class ServedDatabases: @unchecked Sendable {
    public let port: Int
    public let process: ChildProcess
    private let outputPath: String
    private var result: ProcessResult?

    /// Serves on `port`, or on a free one with 0.
    public init(_ arguments: [String], port requested: Int = 0, logLevel: String = "warning", environment: [String: String] = [:]) throws {
        outputPath = "/tmp/sofa-serve-\(UUID().uuidString).out"
        process = try ChildProcess([sofaBinary, "serve", "--port", String(requested)] + arguments, stdout: outputPath,
                                   environment: ["SOFA_LOG_LEVEL": logLevel].merging(environment) { $1 })
        let deadline = Date().addingTimeInterval(15)
        while true {
            let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
            if let range = text.range(of: #"127\.0\.0\.1:(\d+)/"#, options: .regularExpression) {
                self.port = Int(text[range].dropFirst("127.0.0.1:".count).dropLast())!
                break
            }
            var status: Int32 = 0
            if waitpid(process.pid, &status, WNOHANG) == process.pid || Date() > deadline {
                process.kill()
                unlink(outputPath)
                throw SofaError.invalidArgument("sofa serve did not start: \(process.errorOutput)")
            }
            usleep(10_000)
        }
    }

    deinit { _ = stop() }

    public func connect() throws -> HTTPConnection { try HTTPConnection(port: port) }

    /// SIGTERM, then what the process did; `maxRSS` is its peak (VmHWM) just before.
    @discardableResult
    public func stop() -> ProcessResult {
        if let result { return result }
        let peak = peakRSS(of: process.pid) ?? 0
        process.kill(SIGTERM)
        var finished = process.wait()
        finished.maxRSS = peak
        unlink(outputPath)
        result = finished
        recordSanitizerReports(finished, from: "sofa serve")
        return finished
    }
}

/// A response as read off the wire: chunked bodies are de-chunked, with their sizes kept.
public struct HTTPResponse: Sendable {
    public let status: Int
    public let reason: String
    public let headers: [(name: String, value: String)]
    public let body: [UInt8]
    /// Sizes of the chunks of a chunked body.
    public let chunkSizes: [Int]

    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    public var text: String { String(decoding: body, as: UTF8.self) }

    public var json: JSONValue? { try? JSONParser.parse(body) }
}

/// A plain HTTP/1.1 client connection for tests: raw bytes out, parsed responses in.
/// Reads time out after 60 s so a stuck server fails a test instead of hanging it.
/// After a response with `Connection: close`, the next request opens a new connection, as
/// real clients do.
public final class HTTPConnection {
    public private(set) var fd: Int32
    private var buffer: [UInt8] = []
    private var position = 0
    private let port: Int
    private let timeout: Int
    private var closedByServer = false

    public init(port: Int, timeout: Int = 60) throws {
        self.port = port
        self.timeout = timeout
        fd = try HTTPConnection.open(port: port, timeout: timeout)
    }

    /// A TCP connection to 127.0.0.1:`port` with a receive timeout.
    static func open(port: Int, timeout: Int) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let code = errno
            Glibc.close(fd)
            throw SofaError.io(operation: "connect", path: "127.0.0.1:\(port)", errno: code)
        }
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    deinit { Glibc.close(fd) }

    public func close() { shutdown(fd, Int32(SHUT_RDWR)) }

    public func send(_ bytes: [UInt8]) throws {
        if closedByServer {
            Glibc.close(fd)
            fd = try HTTPConnection.open(port: port, timeout: timeout)
            buffer = []
            position = 0
            closedByServer = false
        }
        var offset = 0
        while offset < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { throw SofaError.io(operation: "send", path: "socket", errno: errno) }
            offset += count
        }
    }

    public func send(_ text: String) throws { try send(Array(text.utf8)) }

    /// Sends a request with a Content-Length body and reads the response.
    public func request(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = [],
                        bodySink: ((ArraySlice<UInt8>) -> Void)? = nil) throws -> HTTPResponse {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if !body.isEmpty || method == "PUT" || method == "POST" { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try send(Array(head.utf8) + body)
        return try readResponse(isHead: method == "HEAD", bodySink: bodySink)
    }

    /// A JSON request; the body is serialised compactly.
    public func json(_ method: String, _ target: String, _ body: JSONValue? = nil, headers: [(String, String)] = []) throws -> HTTPResponse {
        var all = headers
        if body != nil { all.append(("Content-Type", "application/json")) }
        return try request(method, target, headers: all, body: body?.serialized() ?? [])
    }

    private func fill() throws {
        if position > 0 && position == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            position = 0
        }
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else {
            throw SofaError.io(operation: count == 0 ? "read (connection closed)" : "read", path: "socket", errno: count == 0 ? ECONNRESET : errno)
        }
        buffer.append(contentsOf: chunk[..<count])
    }

    private func line() throws -> String {
        while true {
            if let end = buffer[position...].firstIndex(of: 0x0A) {
                var bytes = buffer[position..<end]
                if bytes.last == 0x0D { bytes = bytes.dropLast() }
                position = end + 1
                return String(decoding: bytes, as: UTF8.self)
            }
            try fill()
        }
    }

    private func take(_ count: Int, into sink: (ArraySlice<UInt8>) -> Void) throws {
        var remaining = count
        while remaining > 0 {
            if position == buffer.count { try fill() }
            let available = min(remaining, buffer.count - position)
            sink(buffer[position..<(position + available)])
            position += available
            remaining -= available
        }
    }

    /// Reads one response; with `bodySink` the body is handed over in pieces instead of kept.
    public func readResponse(isHead: Bool = false, bodySink: ((ArraySlice<UInt8>) -> Void)? = nil) throws -> HTTPResponse {
        var statusLine = try line()
        var headers: [(String, String)] = []
        while true {
            headers = []
            while true {
                let text = try line()
                if text.isEmpty { break }
                let colon = text.firstIndex(of: ":")!
                headers.append((String(text[..<colon]), text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
            }
            guard statusLine.split(separator: " ")[1].hasPrefix("1") else { break }
            statusLine = try line()  // an interim 100 Continue
        }
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        let status = Int(parts[1])!
        let reason = parts.count > 2 ? String(parts[2]) : ""
        var body: [UInt8] = []
        var chunkSizes: [Int] = []
        let sink = bodySink ?? { body.append(contentsOf: $0) }
        let value = { (name: String) in headers.first { $0.0.lowercased() == name }?.1 }
        if isHead || status == 204 || status == 304 {
            // no body
        } else if value("transfer-encoding")?.lowercased() == "chunked" {
            while true {
                let size = Int(try line().split(separator: ";")[0], radix: 16)!
                if size == 0 { _ = try line(); break }
                chunkSizes.append(size)
                try take(size, into: sink)
                _ = try line()
            }
        } else if let length = value("content-length").flatMap(Int.init) {
            try take(length, into: sink)
        } else {
            while true {
                do { try fill() } catch { break }
            }
            sink(buffer[position...])
            position = buffer.count
        }
        if value("connection")?.lowercased() == "close" { closedByServer = true }
        return HTTPResponse(status: status, reason: reason, headers: headers.map { (name: $0.0, value: $0.1) }, body: body,
                            chunkSizes: chunkSizes)
    }
}
