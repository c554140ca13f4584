/// BLIP, the multiplexed request/response protocol Couchbase Lite replicates over (one
/// WebSocket binary message per frame). Version 3 as LiteCore speaks it: varint frame headers,
/// one raw-deflate stream per direction for compressed frames, a running CRC-32 after every
/// frame but acknowledgements, and per-message flow control by acknowledgements.

/// A message's kind: the low three bits of a frame's flags.
public enum BLIPMessageType: UInt8, Sendable {
    case request = 0
    case response = 1
    case error = 2
    case ackRequest = 4
    case ackResponse = 5

    var isAck: Bool { self == .ackRequest || self == .ackResponse }
    /// Responses and errors share the number space of the requests they answer.
    var isReply: Bool { self == .response || self == .error }
}

/// A frame's flags beside its type.
public struct BLIPFlags: OptionSet, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let compressed = BLIPFlags(rawValue: 0x08)
    public static let urgent = BLIPFlags(rawValue: 0x10)
    public static let noReply = BLIPFlags(rawValue: 0x20)
    public static let moreComing = BLIPFlags(rawValue: 0x40)

    static let typeMask: UInt8 = 0x07
}

/// A whole message: its properties (ordered UTF-8 pairs) and its body.
public struct BLIPMessage: Sendable {
    public var type: BLIPMessageType
    public var number: UInt64
    public var flags: BLIPFlags
    public var properties: [(String, String)]
    /// Empty when the body was streamed to a sink instead.
    public var body: [UInt8]

    public init(type: BLIPMessageType, number: UInt64 = 0, flags: BLIPFlags = [], properties: [(String, String)] = [],
                body: [UInt8] = []) {
        self.type = type
        self.number = number
        self.flags = flags
        self.properties = properties
        self.body = body
    }

    public subscript(_ name: String) -> String? { properties.first { $0.0 == name }?.1 }

    /// A request's `Profile`: what it asks (`rev`, `changes`, `getCheckpoint`…).
    public var profile: String? { self["Profile"] }

    /// A property as LiteCore reads a boolean: `true`/`YES`, or a non-zero integer.
    public func flag(_ name: String) -> Bool {
        guard let value = self[name]?.lowercased() else { return false }
        if value == "true" || value == "yes" { return true }
        return (Int(value) ?? 0) != 0
    }

    public var noReply: Bool { flags.contains(.noReply) }

    /// An error reply's domain, code and message.
    public var error: BLIPError? {
        guard type == .error else { return nil }
        return BLIPError(domain: self["Error-Domain"] ?? "BLIP", code: Int(self["Error-Code"] ?? "") ?? 0,
                         message: String(decoding: body, as: UTF8.self))
    }
}

/// An application-level failure carried in an error reply (`Error-Domain`, `Error-Code`, the
/// body as its message): "BLIP" uses HTTP's codes, as does "HTTP".
public struct BLIPError: Error, Sendable, CustomStringConvertible {
    public let domain: String
    public let code: Int
    public let message: String

    public init(domain: String = "HTTP", code: Int, message: String) {
        self.domain = domain
        self.code = code
        self.message = message
    }

    public var description: String { "\(domain) \(code): \(message)" }

    public static func badRequest(_ message: String) -> BLIPError { BLIPError(code: 400, message: message) }
    public static func notFound(_ message: String) -> BLIPError { BLIPError(code: 404, message: message) }
}

/// Why a connection cannot go on: a frame that breaks the protocol, or the connection's end.
public enum BLIPProtocolError: Error, Sendable, CustomStringConvertible {
    case malformedFrame(String)
    case badChecksum
    case badCompression(String)
    case closed(String)

    public var description: String {
        switch self {
        case .malformedFrame(let why): "malformed BLIP frame: \(why)"
        case .badChecksum: "BLIP frame checksum mismatch"
        case .badCompression(let why): "BLIP frame does not inflate: \(why)"
        case .closed(let why): "BLIP connection closed: \(why)"
        }
    }
}

/// Unsigned LEB128, as BLIP writes numbers.
enum Varint {
    static func append(_ value: UInt64, to bytes: inout [UInt8]) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(value & 0x7F) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    static func encode(_ value: UInt64) -> [UInt8] {
        var bytes: [UInt8] = []
        append(value, to: &bytes)
        return bytes
    }

    /// Reads one at `index`, moving it past; nil when the bytes end inside it or it overflows.
    static func read(_ bytes: [UInt8], at index: inout Int) -> UInt64? {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        var position = index
        while position < bytes.count, shift < 64 {
            let byte = bytes[position]
            position += 1
            result |= UInt64(byte & 0x7F) << shift
            if byte & 0x80 == 0 {
                index = position
                return result
            }
            shift += 7
        }
        return nil
    }
}

/// Properties as BLIP encodes them: NUL-terminated key and value strings, back to back.
enum BLIPProperties {
    static func encode(_ properties: [(String, String)]) -> [UInt8] {
        var bytes: [UInt8] = []
        for (key, value) in properties {
            bytes += Array(key.utf8); bytes.append(0)
            bytes += Array(value.utf8); bytes.append(0)
        }
        return bytes
    }

    static func decode(_ bytes: [UInt8]) throws(BLIPProtocolError) -> [(String, String)] {
        guard !bytes.isEmpty else { return [] }
        guard bytes.last == 0 else { throw .malformedFrame("message properties are not NUL-terminated") }
        let strings = bytes.dropLast().split(separator: 0, omittingEmptySubsequences: false)
        guard strings.count % 2 == 0 else { throw .malformedFrame("message properties have a key without a value") }
        var result: [(String, String)] = []
        for index in stride(from: 0, to: strings.count, by: 2) {
            guard let key = String(validating: strings[index], as: UTF8.self),
                  let value = String(validating: strings[index + 1], as: UTF8.self) else {
                throw .malformedFrame("a message property is not UTF-8")
            }
            result.append((key, value))
        }
        return result
    }
}
