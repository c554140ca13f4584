/// Why a JSON text was refused, and where.
public struct JSONParseError: Error, Hashable, Sendable, CustomStringConvertible {
    public let message: String
    /// Byte offset of the problem in the input.
    public let offset: Int
    /// 1-based line and column (in bytes) of the problem.
    public let line: Int
    public let column: Int

    public var description: String { "invalid JSON at line \(line), column \(column): \(message)" }
}

extension JSONValue {
    /// Parses one JSON text (RFC 8259). A leading UTF-8 byte order mark is skipped.
    public init(parsing text: String) throws(JSONParseError) {
        self = try JSONParser.parse(Array(text.utf8))
    }

    /// Parses one JSON text from UTF-8 bytes.
    public init(parsing bytes: [UInt8]) throws(JSONParseError) {
        self = try JSONParser.parse(bytes)
    }
}

/// A strict, iterative JSON parser: nesting depth costs heap, never stack.
public enum JSONParser {
    /// The deepest nesting accepted. Deeper input is refused with an error rather
    /// than risking the stack of the recursive writer or of value destruction.
    public static let maximumDepth = 256

    public static func parse(_ bytes: [UInt8]) throws(JSONParseError) -> JSONValue {
        var parser = Parser(bytes: bytes)
        return try parser.parseDocument()
    }
}

private enum Container {
    case array([JSONValue])
    case object(JSONObject, key: String)
}

private struct Parser {
    let bytes: [UInt8]
    var index = 0

    init(bytes: [UInt8]) {
        self.bytes = bytes
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3 }
    }

    mutating func parseDocument() throws(JSONParseError) -> JSONValue {
        var stack: [Container] = []
        var value: JSONValue
        parsing: while true {
            // Parse the start of a value; containers push and loop back here.
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input, expected a value") }
            switch bytes[index] {
            case UInt8(ascii: "{"):
                index += 1
                skipWhitespace()
                if peek == UInt8(ascii: "}") {
                    index += 1
                    value = .object(JSONObject())
                } else {
                    guard stack.count < JSONParser.maximumDepth else { throw error("nesting deeper than \(JSONParser.maximumDepth) levels") }
                    let key = try parseKey()
                    stack.append(.object(JSONObject(), key: key))
                    continue parsing
                }
            case UInt8(ascii: "["):
                index += 1
                skipWhitespace()
                if peek == UInt8(ascii: "]") {
                    index += 1
                    value = .array([])
                } else {
                    guard stack.count < JSONParser.maximumDepth else { throw error("nesting deeper than \(JSONParser.maximumDepth) levels") }
                    stack.append(.array([]))
                    continue parsing
                }
            case UInt8(ascii: "\""):
                value = .string(try parseString())
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                value = try parseNumber()
            case UInt8(ascii: "t"):
                try expectLiteral("true"); value = .bool(true)
            case UInt8(ascii: "f"):
                try expectLiteral("false"); value = .bool(false)
            case UInt8(ascii: "n"):
                try expectLiteral("null"); value = .null
            default:
                throw error("unexpected \(describe(bytes[index])), expected a value")
            }

            // A value is complete: add it to its container, closing containers as they end.
            while true {
                guard let top = stack.popLast() else {
                    skipWhitespace()
                    guard index == bytes.count else { throw error("unexpected \(describe(bytes[index])) after the end of the document") }
                    return value
                }
                skipWhitespace()
                let next = peek
                index += 1
                switch top {
                case .array(var elements):
                    elements.append(value)
                    if next == UInt8(ascii: ",") {
                        stack.append(.array(elements))
                        continue parsing
                    } else if next == UInt8(ascii: "]") {
                        value = .array(elements)
                    } else {
                        index -= 1
                        throw error(next == nil ? "unexpected end of input, expected ',' or ']'" : "expected ',' or ']' but found \(describe(next!))")
                    }
                case .object(var object, let key):
                    object[key] = value
                    if next == UInt8(ascii: ",") {
                        skipWhitespace()
                        let key = try parseKey()
                        stack.append(.object(object, key: key))
                        continue parsing
                    } else if next == UInt8(ascii: "}") {
                        value = .object(object)
                    } else {
                        index -= 1
                        throw error(next == nil ? "unexpected end of input, expected ',' or '}'" : "expected ',' or '}' but found \(describe(next!))")
                    }
                }
            }
        }
    }

    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return
            }
        }
    }

    /// Parses `"key"` and the `:` after it; `index` is at the opening quote.
    mutating func parseKey() throws(JSONParseError) -> String {
        guard peek == UInt8(ascii: "\"") else {
            throw error(peek == nil ? "unexpected end of input, expected a key" : "expected a string key but found \(describe(peek!))")
        }
        let key = try parseString()
        skipWhitespace()
        guard peek == UInt8(ascii: ":") else {
            throw error(peek == nil ? "unexpected end of input, expected ':'" : "expected ':' but found \(describe(peek!))")
        }
        index += 1
        return key
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let start = index
        let count = literal.utf8CodeUnitCount
        let matches = literal.withUTF8Buffer { expected in
            index + count <= bytes.count && bytes[index..<index + count].elementsEqual(expected)
        }
        guard matches else { throw error("invalid literal, expected '\(literal)'") }
        index = start + count
    }

    mutating func parseString() throws(JSONParseError) -> String {
        let open = index
        index += 1
        let start = index
        // Fast path: no escapes.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                guard let string = String(validating: bytes[start..<index], as: UTF8.self) else {
                    throw error("invalid UTF-8 in string", at: open)
                }
                index += 1
                return string
            }
            if byte == UInt8(ascii: "\\") || byte < 0x20 { break }
            index += 1
        }
        var buffer = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                guard let string = String(validating: buffer, as: UTF8.self) else {
                    throw error("invalid UTF-8 in string", at: open)
                }
                index += 1
                return string
            case UInt8(ascii: "\\"):
                index += 1
                guard let escape = peek else { break }
                index += 1
                switch escape {
                case UInt8(ascii: "\""): buffer.append(0x22)
                case UInt8(ascii: "\\"): buffer.append(0x5C)
                case UInt8(ascii: "/"): buffer.append(0x2F)
                case UInt8(ascii: "b"): buffer.append(0x08)
                case UInt8(ascii: "f"): buffer.append(0x0C)
                case UInt8(ascii: "n"): buffer.append(0x0A)
                case UInt8(ascii: "r"): buffer.append(0x0D)
                case UInt8(ascii: "t"): buffer.append(0x09)
                case UInt8(ascii: "u"):
                    let scalar = try parseUnicodeEscape()
                    buffer.append(contentsOf: Array(String(Character(scalar)).utf8))
                default:
                    index -= 2
                    throw error("invalid escape sequence '\\\(describeRaw(escape))'")
                }
            default:
                if byte < 0x20 { throw error("unescaped control character U+\(hex4(UInt16(byte))) in string") }
                buffer.append(byte)
                index += 1
            }
        }
        throw error("unterminated string", at: open)
    }

    /// Parses the hex digits of `\uXXXX` (index after the `u`), joining surrogate pairs.
    mutating func parseUnicodeEscape() throws(JSONParseError) -> Unicode.Scalar {
        let escapeStart = index - 2
        let high = try parseHex4()
        if (0xD800...0xDBFF).contains(high) {
            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                throw error("unpaired surrogate \\u\(hex4(high)) in string", at: escapeStart)
            }
            index += 2
            let low = try parseHex4()
            guard (0xDC00...0xDFFF).contains(low) else {
                throw error("unpaired surrogate \\u\(hex4(high)) in string", at: escapeStart)
            }
            let value = 0x10000 + ((UInt32(high) - 0xD800) << 10) + (UInt32(low) - 0xDC00)
            return Unicode.Scalar(value)!
        }
        guard let scalar = Unicode.Scalar(UInt32(high)) else {
            throw error("unpaired surrogate \\u\(hex4(high)) in string", at: escapeStart)
        }
        return scalar
    }

    mutating func parseHex4() throws(JSONParseError) -> UInt16 {
        var value: UInt16 = 0
        for _ in 0..<4 {
            guard let byte = peek else { throw error("unexpected end of input in \\u escape") }
            guard let digit = ASCII.hexValue(byte) else { throw error("invalid hex digit \(describe(byte)) in \\u escape") }
            value = value << 4 | UInt16(digit)
            index += 1
        }
        return value
    }

    mutating func parseNumber() throws(JSONParseError) -> JSONValue {
        let start = index
        var isInteger = true
        if peek == UInt8(ascii: "-") { index += 1 }
        guard let first = peek, isDigit(first) else { throw error("invalid number: expected a digit after '-'") }
        if first == UInt8(ascii: "0") {
            index += 1
            if let next = peek, isDigit(next) { throw error("invalid number: leading zeros are not allowed") }
        } else {
            skipDigits()
        }
        if peek == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard let next = peek, isDigit(next) else { throw error("invalid number: expected a digit after '.'") }
            skipDigits()
        }
        if peek == UInt8(ascii: "e") || peek == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if peek == UInt8(ascii: "+") || peek == UInt8(ascii: "-") { index += 1 }
            guard let next = peek, isDigit(next) else { throw error("invalid number: expected a digit in the exponent") }
            skipDigits()
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        if isInteger {
            if let value = Int64(text) { return .integer(value) }
            return .bigInteger(text)
        }
        guard let value = Double(text), value.isFinite else {
            throw error("number \(text) is out of range", at: start)
        }
        return .double(value)
    }

    mutating func skipDigits() {
        while let byte = peek, isDigit(byte) { index += 1 }
    }

    func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }

    func describe(_ byte: UInt8) -> String {
        (0x21...0x7E).contains(byte) ? "'\(Character(Unicode.Scalar(byte)))'" : "byte 0x\(String(byte, radix: 16, uppercase: true))"
    }

    func describeRaw(_ byte: UInt8) -> String {
        (0x21...0x7E).contains(byte) ? String(Character(Unicode.Scalar(byte))) : "\\x\(String(byte, radix: 16))"
    }

    func hex4(_ value: UInt16) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: 4 - digits.count) + digits
    }

    func error(_ message: String, at offset: Int? = nil) -> JSONParseError {
        let offset = min(offset ?? index, bytes.count)
        var line = 1
        var lineStart = 0
        for position in 0..<offset where bytes[position] == 0x0A {
            line += 1
            lineStart = position + 1
        }
        return JSONParseError(message: message, offset: offset, line: line, column: offset - lineStart + 1)
    }
}
