/// The bytes CouchDB hashes to name a new revision: Erlang's external term format
/// (`term_to_binary(Term, [{minor_version, 1}])`) of
/// `[Deleted, OldStart, OldRev, Body, Atts]`, as `couch_db:new_revid/1` builds it.
///
/// Only what a document can hold is written: atoms `true`/`false`/`null`, integers of any
/// size, floats, binaries (strings), lists and the tuples EJSON wraps objects in
/// (`{[{Key, Value}, …]}`). Erlang writes a list whose elements are all integers 0…255 as a
/// byte string (`STRING_EXT`), so `[1,2,3]` and `[1,2,300]` are written differently, as
/// there. Verified against CouchDB 3.4.3 side by side (RevisionIDTests, CouchRevisionIDTests).
struct CouchRevisionTerm {
    private(set) var bytes: [UInt8] = [131]  // the format's version

    private enum Tag: UInt8 {
        case newFloat = 70, smallInteger = 97, integer = 98, atom = 100, smallTuple = 104, empty = 106,
             byteString = 107, list = 108, binary = 109, smallBig = 110, largeBig = 111
    }

    mutating func atom(_ name: String) {
        tag(.atom)
        uint16(UInt16(name.utf8.count))
        bytes += name.utf8
    }

    mutating func integer(_ value: Int64) {
        if (0...255).contains(value) {
            tag(.smallInteger)
            bytes.append(UInt8(value))
        } else if (Int64(Int32.min)...Int64(Int32.max)).contains(value) {
            tag(.integer)
            uint32(UInt32(bitPattern: Int32(value)))
        } else {
            bigInteger(magnitude: littleEndianBytes(of: value.magnitude), negative: value < 0)
        }
    }

    /// An integer given by its decimal digits, with a leading `-` when negative.
    mutating func integer(decimal: String) {
        let negative = decimal.hasPrefix("-")
        var magnitude: [UInt8] = []  // little-endian base 256
        for digit in decimal.utf8.dropFirst(negative ? 1 : 0) {
            var carry = Int(digit) - 48
            for index in magnitude.indices {
                let value = Int(magnitude[index]) * 10 + carry
                magnitude[index] = UInt8(value & 0xff)
                carry = value >> 8
            }
            while carry > 0 {
                magnitude.append(UInt8(carry & 0xff))
                carry >>= 8
            }
        }
        if magnitude.count <= 8 {
            var value: UInt64 = 0
            for byte in magnitude.reversed() { value = value << 8 | UInt64(byte) }
            if !negative, value <= UInt64(Int64.max) { return integer(Int64(value)) }
            if negative, value <= UInt64(Int64.max) + 1 { return integer(value == UInt64(Int64.max) + 1 ? Int64.min : -Int64(value)) }
        }
        bigInteger(magnitude: magnitude, negative: negative)
    }

    mutating func float(_ value: Double) {
        tag(.newFloat)
        let bits = value.bitPattern
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: bits >> UInt64(shift))) }
    }

    mutating func binary(_ data: some Collection<UInt8>) {
        tag(.binary)
        uint32(UInt32(data.count))
        bytes += data
    }

    mutating func tuple(arity: Int) {
        tag(.smallTuple)
        bytes.append(UInt8(arity))
    }

    /// A list whose elements `element(i)` writes; `[]` is Erlang's empty list.
    mutating func list(count: Int, _ element: (inout CouchRevisionTerm, Int) -> Void) {
        guard count > 0 else { return tag(.empty) }
        tag(.list)
        uint32(UInt32(count))
        for index in 0..<count { element(&self, index) }
        tag(.empty)
    }

    /// A JSON value as EJSON: objects `{[{K, V}…]}`, strings binaries, `true`/`false`/`null` atoms.
    mutating func json(_ value: JSONValue) {
        switch value {
        case .null: atom("null")
        case .bool(let flag): atom(flag ? "true" : "false")
        case .integer(let number): integer(number)
        case .bigInteger(let digits): integer(decimal: digits)
        case .double(let number): float(number)
        case .string(let text): binary(text.utf8)
        case .object(let object): self.object(object)
        case .array(let elements):
            if !elements.isEmpty, elements.count <= Int(UInt16.max), let small = smallIntegers(elements) {
                tag(.byteString)
                uint16(UInt16(small.count))
                bytes += small
            } else {
                list(count: elements.count) { $0.json(elements[$1]) }
            }
        }
    }

    mutating func object(_ object: JSONObject) {
        tuple(arity: 1)
        let entries = object.entries
        list(count: entries.count) { term, index in
            term.tuple(arity: 2)
            term.binary(entries[index].key.utf8)
            term.json(entries[index].value)
        }
    }

    private func smallIntegers(_ elements: [JSONValue]) -> [UInt8]? {
        var result: [UInt8] = []
        result.reserveCapacity(elements.count)
        for element in elements {
            guard case .integer(let value) = element, (0...255).contains(value) else { return nil }
            result.append(UInt8(value))
        }
        return result
    }

    private mutating func bigInteger(magnitude: [UInt8], negative: Bool) {
        if magnitude.count <= 255 {
            tag(.smallBig)
            bytes.append(UInt8(magnitude.count))
        } else {
            tag(.largeBig)
            uint32(UInt32(magnitude.count))
        }
        bytes.append(negative ? 1 : 0)
        bytes += magnitude
    }

    private func littleEndianBytes(of value: UInt64) -> [UInt8] {
        var result: [UInt8] = []
        var rest = value
        while rest > 0 {
            result.append(UInt8(rest & 0xff))
            rest >>= 8
        }
        return result
    }

    private mutating func tag(_ tag: Tag) { bytes.append(tag.rawValue) }

    private mutating func uint16(_ value: UInt16) {
        bytes.append(UInt8(value >> 8))
        bytes.append(UInt8(value & 0xff))
    }

    private mutating func uint32(_ value: UInt32) {
        for shift in stride(from: 24, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: value >> UInt32(shift))) }
    }
}
