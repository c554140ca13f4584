/// Classes of ASCII bytes, for text read as UTF-8 bytes where reading characters costs too
/// much or says nothing more: each path the mount is asked about, each attachment type a fold
/// looks at, hex digests and escapes.
public enum ASCII {
    @inlinable public static func isDigit(_ byte: UInt8) -> Bool { byte &- UInt8(ascii: "0") < 10 }
    @inlinable public static func isUpper(_ byte: UInt8) -> Bool { byte &- UInt8(ascii: "A") < 26 }
    @inlinable public static func isLower(_ byte: UInt8) -> Bool { byte &- UInt8(ascii: "a") < 26 }
    @inlinable public static func isAlphanumeric(_ byte: UInt8) -> Bool { isDigit(byte) || isUpper(byte) || isLower(byte) }

    /// `byte` with an upper-case letter made lower-case; any other byte as it is.
    @inlinable public static func lowercased(_ byte: UInt8) -> UInt8 { isUpper(byte) ? byte | 0x20 : byte }

    /// The value of a hex digit of either case; nil for any other byte.
    @inlinable public static func hexValue(_ byte: UInt8) -> UInt8? {
        if isDigit(byte) { return byte &- UInt8(ascii: "0") }
        let lower = byte | 0x20
        return lower &- UInt8(ascii: "a") < 6 ? lower &- UInt8(ascii: "a") &+ 10 : nil
    }

    /// Whether `byte` is a hex digit as digests are written here: `0-9`, `a-f`.
    @inlinable public static func isLowerHexDigit(_ byte: UInt8) -> Bool { isDigit(byte) || byte &- UInt8(ascii: "a") < 6 }
}
