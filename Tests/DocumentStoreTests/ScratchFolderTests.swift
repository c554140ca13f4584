import DocumentModel
@testable import DocumentStore
import Foundation
import Testing
import TestSupport

/// The mount's scratch folder of an encrypted database (#32): names sealed with AES-SIV and
/// written in base64url, contents sealed, in real files.
@Suite struct ScratchFolderTests {
    let directory = TemporaryDirectory()

    func folder(_ seed: UInt8) throws -> ScratchFolder {
        ScratchFolder(root: directory.path, key: try DatabaseKey(dataKey: (0..<32).map { $0 &* seed &+ 1 }))
    }

    @Test func base64urlIsFoundationsBase64WithTheURLAlphabetAndNoPadding() {
        var generator = SystemRandomNumberGenerator()
        for length in 0..<70 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let expected = Data(bytes).base64EncodedString()
                .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            #expect(ScratchFolder.base64url(bytes) == expected, "\(length) bytes")
            #expect(ScratchFolder.bytes(ofBase64url: expected) == bytes, "\(length) bytes")
        }
        #expect(ScratchFolder.bytes(ofBase64url: "QQ") == [0x41])
        #expect(ScratchFolder.bytes(ofBase64url: "QR") == nil, "another way to write the same byte")
        #expect(ScratchFolder.bytes(ofBase64url: "Q") == nil && ScratchFolder.bytes(ofBase64url: "QQ==") == nil
                && ScratchFolder.bytes(ofBase64url: "Q+8") == nil)
    }

    @Test func namesSealAlwaysTheSameWayOpenOnlyWithTheirKeyAndFitUpTo175Bytes() throws {
        let scratch = try folder(3), other = try folder(5)
        for name in [".notes.txt.swp", "attachments", "ünïcødé 文書", String(repeating: "n", count: 175), "a"] {
            let stored = scratch.storedName(name)
            #expect(stored == scratch.storedName(name), "looked up by its sealed form: the same each time")
            #expect(!(name.count > 3 && stored.contains(name)) && !stored.contains("/") && !stored.hasPrefix("~"))
            #expect(scratch.shownName(stored) == name)
            #expect(other.shownName(stored) == nil, "another key's name is not listed")
            #expect(stored.utf8.count <= Int(NAME_MAX))
        }
        #expect(scratch.storedName(String(repeating: "n", count: 176)).utf8.count > Int(NAME_MAX), "too long: ENAMETOOLONG from the file system")
        #expect(scratch.shownName("plain-name") == nil && scratch.shownName(".") == nil)
        var flipped = Array(scratch.storedName("swap").utf8)
        flipped[3] = flipped[3] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(scratch.shownName(String(decoding: flipped, as: UTF8.self)) == nil, "a changed name fails its tag")
        // A document id too long for a sealed name: its folder is named by an HMAC, and listed by ~name.
        let long = String(repeating: "d", count: 300)
        #expect(mkdir(scratch.root, 0o755) == 0 || errno == EEXIST)
        try scratch.makeFolder(ofEscapedID: long)
        try scratch.makeFolder(ofEscapedID: "short")
        #expect(scratch.folder(ofEscapedID: long).hasPrefix(scratch.root + "/~"))
        #expect(Set(try scratch.documentFolderNames()) == [long, "short"])
        #expect(scratch.holdsNoFile(scratch.folder(ofEscapedID: long)), "its ~name is not a file of the user's")
    }

    @Test func twoDescriptorsOfOneSealedFileSeeEachOthersWrites() throws {
        let scratch = try folder(7)
        let path = scratch.path(directory.path, "swap")
        let first = try scratch.open(path, flags: O_RDWR | O_CREAT)
        let second = try scratch.open(path, flags: O_RDWR)
        defer { first.close(); second.close() }
        _ = try [UInt8](repeating: 0x61, count: 5_000).withUnsafeBytes { try first.write($0, at: 0) }
        _ = try [UInt8](repeating: 0x62, count: 10).withUnsafeBytes { try second.write($0, at: 4_090) }
        _ = try [UInt8](repeating: 0x63, count: 3).withUnsafeBytes { try first.write($0, at: 9_000) }
        var expected = [UInt8](repeating: 0x61, count: 5_000) + [UInt8](repeating: 0, count: 4_000) + [0x63, 0x63, 0x63]
        expected.replaceSubrange(4_090..<4_100, with: [UInt8](repeating: 0x62, count: 10))
        #expect(try second.size() == 9_003 && first.size() == 9_003)
        var back = [UInt8](repeating: 0, count: 10_000)
        let count = try back.withUnsafeMutableBytes { try second.read(into: $0, at: 0) }
        #expect(Array(back.prefix(count)) == expected)
        #expect(try scratch.contents(of: path) == expected)
        // O_TRUNC empties it under a new salt; the other descriptor reads it empty.
        try scratch.open(path, flags: O_WRONLY | O_TRUNC).close()
        #expect(try first.size() == 0)
        #expect(try back.withUnsafeMutableBytes { try first.read(into: $0, at: 0) } == 0)
        // Nothing of what was written stays on disk: a header only (its random salt may hold any
        // byte, 0x61 too, so the check is for what was written, not for one byte value).
        let left = FileManager.default.contents(atPath: path) ?? Data()
        #expect(left.count < 100 && left.range(of: Data(repeating: 0x61, count: 8)) == nil, "\(left.count) bytes left")
    }
}
