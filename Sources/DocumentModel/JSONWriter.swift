/// How `JSONValue` is written out.
public enum JSONFormat: Sendable {
    /// No whitespace, keys in stored order: how bodies are stored.
    case compact
    /// Two-space indentation, keys in stored order: what people read.
    case pretty
    /// No whitespace, object keys sorted by Unicode code point: a stable form to compare
    /// values by (revision ids are derived from CouchDB's term encoding instead).
    case canonical
}

extension JSONValue {
    /// The UTF-8 text of the value. Non-ASCII characters are written raw, `/` is
    /// not escaped, control characters are written as `\uXXXX` (or their short forms).
    public func serialized(_ format: JSONFormat = .compact) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(64)
        write(to: &output, format: format, indent: 0)
        return output
    }

    /// The value as a `String`, compact unless told otherwise.
    public func jsonString(_ format: JSONFormat = .compact) -> String {
        String(decoding: serialized(format), as: UTF8.self)
    }

    /// Pretty-printed with a trailing newline, as `properties.json` and `sofa cat` show it.
    public func prettyPrinted() -> String {
        jsonString(.pretty) + "\n"
    }

    private func write(to output: inout [UInt8], format: JSONFormat, indent: Int) {
        switch self {
        case .null: output.append(contentsOf: "null".utf8)
        case .bool(let value): output.append(contentsOf: (value ? "true" : "false").utf8)
        case .integer(let value): output.append(contentsOf: String(value).utf8)
        case .bigInteger(let digits): output.append(contentsOf: digits.utf8)
        case .double(let value): output.append(contentsOf: JSONValue.format(value).utf8)
        case .string(let value): JSONValue.writeString(value, to: &output)
        case .array(let elements):
            guard !elements.isEmpty else { output.append(contentsOf: "[]".utf8); return }
            output.append(UInt8(ascii: "["))
            for (position, element) in elements.enumerated() {
                if position > 0 { output.append(UInt8(ascii: ",")) }
                if format == .pretty { newline(&output, indent + 1) }
                element.write(to: &output, format: format, indent: indent + 1)
            }
            if format == .pretty { newline(&output, indent) }
            output.append(UInt8(ascii: "]"))
        case .object(let object):
            guard !object.isEmpty else { output.append(contentsOf: "{}".utf8); return }
            output.append(UInt8(ascii: "{"))
            let entries = format == .canonical
                ? object.entries.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
                : object.entries
            for (position, entry) in entries.enumerated() {
                if position > 0 { output.append(UInt8(ascii: ",")) }
                if format == .pretty { newline(&output, indent + 1) }
                JSONValue.writeString(entry.key, to: &output)
                output.append(UInt8(ascii: ":"))
                if format == .pretty { output.append(UInt8(ascii: " ")) }
                entry.value.write(to: &output, format: format, indent: indent + 1)
            }
            if format == .pretty { newline(&output, indent) }
            output.append(UInt8(ascii: "}"))
        }
    }

    private func newline(_ output: inout [UInt8], _ indent: Int) {
        output.append(0x0A)
        output.append(contentsOf: repeatElement(UInt8(ascii: " "), count: indent * 2))
    }

    /// Shortest round-tripping form, always with a fraction or exponent so it
    /// reads back as a double: `1.0`, `0.1`, `6.02e+23`, `1e-7`.
    static func format(_ value: Double) -> String {
        var text = value.description
        // Swift writes exponents as "e-07"; JSON readers prefer "e-7".
        if let e = text.firstIndex(of: "e") {
            let mantissa = text[..<e]
            var exponent = text[text.index(after: e)...]
            var sign = ""
            if let first = exponent.first, first == "-" || first == "+" {
                sign = String(first)
                exponent = exponent.dropFirst()
            }
            let digits = exponent.drop(while: { $0 == "0" })
            text = "\(mantissa)e\(sign)\(digits.isEmpty ? "0" : String(digits))"
        }
        return text
    }

    static func writeString(_ string: String, to output: inout [UInt8]) {
        output.append(UInt8(ascii: "\""))
        for byte in string.utf8 {
            switch byte {
            case UInt8(ascii: "\""): output.append(contentsOf: [0x5C, 0x22])
            case UInt8(ascii: "\\"): output.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: output.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: output.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: output.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0x08: output.append(contentsOf: [0x5C, UInt8(ascii: "b")])
            case 0x0C: output.append(contentsOf: [0x5C, UInt8(ascii: "f")])
            case 0x00..<0x20:
                let hex = Array("0123456789abcdef".utf8)
                output.append(contentsOf: [0x5C, UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: output.append(byte)
            }
        }
        output.append(UInt8(ascii: "\""))
    }
}

extension JSONValue: CustomStringConvertible {
    public var description: String { jsonString() }
}
