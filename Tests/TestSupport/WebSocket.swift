import DocumentModel
import Foundation

/// A bare WebSocket client on 127.0.0.1 for tests that send what a real client never would:
/// the handshake as given, then frames of any kind, masked as a client must.
public final class WebSocketClient {
    public let status: Int
    public let responseHead: String
    public let responseBody: String
    private let fd: Int32
    private var buffer: [UInt8] = []

    /// Opens the connection and sends the upgrade request (`headers` added to the usual ones).
    public init(port: Int, path: String, protocols: String? = "BLIP_3+CBMobile_3", headers: [(String, String)] = [],
                timeout: Int = 10) throws {
        let fd = try HTTPConnection.open(port: port, timeout: timeout)
        self.fd = fd
        var request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        if let protocols { request += "Sec-WebSocket-Protocol: \(protocols)\r\n" }
        for (name, value) in headers { request += "\(name): \(value)\r\n" }
        request += "\r\n"
        var sent = 0
        let bytes = Array(request.utf8)
        while sent < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { throw SofaError.io(operation: "send", path: "socket", errno: errno) }
            sent += count
        }
        // The response head, then (when it is not a switch) its body up to Content-Length.
        var head: [UInt8] = []
        var buffer: [UInt8] = []
        var scratch = [UInt8](repeating: 0, count: 4096)
        while true {
            if let end = WebSocketClient.find([13, 10, 13, 10], in: head) {
                buffer = Array(head[(end + 4)...])
                head = Array(head[..<end])
                break
            }
            let count = recv(fd, &scratch, scratch.count, 0)
            guard count > 0 else { throw SofaError.io(operation: "read the upgrade's answer", path: "socket", errno: errno) }
            head += scratch[..<count]
        }
        responseHead = String(decoding: head, as: UTF8.self)
        status = Int(responseHead.split(separator: " ").dropFirst().first ?? "") ?? 0
        var body = ""
        if status != 101, let line = responseHead.split(separator: "\r\n").first(where: { $0.lowercased().hasPrefix("content-length:") }),
           let length = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) {
            while buffer.count < length {
                let count = recv(fd, &scratch, scratch.count, 0)
                guard count > 0 else { break }
                buffer += scratch[..<count]
            }
            body = String(decoding: buffer.prefix(length), as: UTF8.self)
        }
        responseBody = body
        self.buffer = buffer
    }

    deinit { close(fd) }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for index in 0...(haystack.count - needle.count) where Array(haystack[index..<(index + needle.count)]) == needle {
            return index
        }
        return nil
    }

    /// One frame: `opcode` 2 binary, 1 text, 8 close; masked as a client's must be.
    public func send(opcode: UInt8 = 2, _ payload: [UInt8], fin: Bool = true) throws {
        var frame: [UInt8] = [(fin ? 0x80 : 0) | opcode]
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else if payload.count < 65536 {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        } else {
            frame.append(0x80 | 127)
            for shift in stride(from: 56, through: 0, by: -8) { frame.append(UInt8((payload.count >> shift) & 0xFF)) }
        }
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        var sent = 0
        while sent < frame.count {
            let count = frame.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            guard count > 0 else { throw SofaError.io(operation: "send", path: "socket", errno: errno) }
            sent += count
        }
    }

    /// The next frame from the server: its opcode and payload; nil when the connection ended.
    public func receive() throws -> (opcode: UInt8, payload: [UInt8])? {
        func need(_ count: Int) -> Bool {
            var scratch = [UInt8](repeating: 0, count: 65536)
            while buffer.count < count {
                let read = recv(fd, &scratch, scratch.count, 0)
                guard read > 0 else { return false }
                buffer += scratch[..<read]
            }
            return true
        }
        guard need(2) else { return nil }
        let opcode = buffer[0] & 0x0F
        var length = Int(buffer[1] & 0x7F)
        var offset = 2
        if length == 126 {
            guard need(4) else { return nil }
            length = Int(buffer[2]) << 8 | Int(buffer[3])
            offset = 4
        } else if length == 127 {
            guard need(10) else { return nil }
            length = (2..<10).reduce(0) { $0 << 8 | Int(buffer[$1]) }
            offset = 10
        }
        guard need(offset + length) else { return nil }
        let payload = Array(buffer[offset..<(offset + length)])
        buffer.removeFirst(offset + length)
        return (opcode, payload)
    }

    /// Frames until the server closes: the close frame's code and reason, if it sent one.
    public func closeFrame() throws -> (code: Int, reason: String)? {
        while let frame = try receive() {
            if frame.opcode == 8 {
                let code = frame.payload.count >= 2 ? Int(frame.payload[0]) << 8 | Int(frame.payload[1]) : 1005
                return (code, String(decoding: frame.payload.dropFirst(2), as: UTF8.self))
            }
        }
        return nil
    }

    /// Closes the socket at once, as a vanishing peer would.
    public func vanish() { shutdown(fd, Int32(SHUT_RDWR)) }
}
