import DocumentModel
@testable import DocumentStore
import Foundation
import Testing
import TestSupport

/// Bodies sealed in 4 KiB blocks (#32): real files, written as a stream in odd chunks and at
/// random offsets, read back whole and by ranges.
@Suite struct SealedBlobTests {
    let directory = TemporaryDirectory()
    let key = try! SealingKey((0..<32).map { UInt8(255 - $0) })

    /// A body of `length` bytes: the marker text again and again, numbered.
    func body(_ length: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        var line = 0
        while bytes.count < length {
            bytes += Array("sofa-plaintext-marker line \(line)\n".utf8)
            line += 1
        }
        return Array(bytes.prefix(length))
    }

    func seal(_ bytes: [UInt8], _ name: String, key: SealingKey? = nil) throws -> String {
        let path = directory.appending(name)
        let descriptor = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        #expect(descriptor >= 0)
        defer { close(descriptor) }
        let writer = try SealedFile(creating: descriptor, path: path, key: key ?? self.key)
        // In chunks that never line up with the blocks.
        for start in stride(from: 0, to: bytes.count, by: 1_000) {
            try bytes[start..<min(start + 1_000, bytes.count)].withUnsafeBytes { try writer.write($0, at: Int64(start)) }
        }
        #expect(writer.length == Int64(bytes.count))
        return path
    }

    func read(_ path: String, at offset: Int64, count: Int, key: SealingKey? = nil) throws -> [UInt8] {
        let descriptor = open(path, O_RDONLY)
        defer { close(descriptor) }
        let reader = try SealedFile(opening: descriptor, path: path, key: key ?? self.key)
        var out = [UInt8](repeating: 0, count: count)
        let got = try out.withUnsafeMutableBytes { try reader.read(into: $0, at: offset) }
        return Array(out.prefix(got))
    }

    func fileBytes(_ path: String) -> [UInt8] { (try? [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))) ?? [] }

    @Test(arguments: [0, 1, 4_095, 4_096, 4_097, 3 * 4_096, (1 << 20) + 17])
    func aBodyComesBackWholeAndByRangesAndIsNowhereInTheClear(length: Int) throws {
        let plain = body(length)
        let path = try seal(plain, "body-\(length)")
        let sealed = fileBytes(path)
        #expect(Int64(sealed.count) == SealedBlob.sealedSize(ofPlain: Int64(length)))
        #expect(SealedBlob.plainSize(ofSealed: Int64(sealed.count)) == Int64(length))
        if length >= 64 {
            let marker = Array("sofa-plaintext-marker".utf8)
            #expect(!(0...(sealed.count - marker.count)).contains { sealed[$0..<($0 + marker.count)].elementsEqual(marker) })
        }
        #expect(try read(path, at: 0, count: length + 10) == plain)
        // Ranges across block boundaries, and past the end.
        for (offset, count) in [(0, 1), (4_095, 2), (4_096, 4_096), (1, 8_190), (length / 2, 5_000), (length, 10), (length + 5, 10)] {
            let start = min(offset, length), end = min(offset + count, length)
            #expect(try read(path, at: Int64(offset), count: count) == Array(plain[start..<max(start, end)]), "\(offset)+\(count) of \(length)")
        }
    }

    @Test func theSameBodyTwiceSealsToDifferentBytes() throws {
        let plain = body(10_000)
        let first = fileBytes(try seal(plain, "a")), second = fileBytes(try seal(plain, "b"))
        #expect(first.count == second.count)
        let same = zip(first.dropFirst(32), second.dropFirst(32)).filter { $0 == $1 }.count
        #expect(same < 200, "a salt of its own per file: \(same) equal bytes of \(first.count - 32)")
    }

    @Test func aDamagedCutGrownOrForeignFileIsAnErrorNeverOtherBytes() throws {
        let plain = body(5 * 4_096 + 100)
        let path = try seal(plain, "body")
        let original = fileBytes(path)
        func damaged(_ bytes: [UInt8], at offset: Int64 = 0, count: Int = 100) -> Bool {
            try? Data(bytes).write(to: URL(fileURLWithPath: path))
            do {
                _ = try read(path, at: offset, count: count)
                return false
            } catch is SealedBlobDamaged {
                return true
            } catch {
                Issue.record("not the damage error: \(error)")
                return false
            }
        }
        // A flipped byte in block 2: its reads fail, block 0's still read.
        var flipped = original
        flipped[32 + 2 * 4_124 + 7] ^= 1
        #expect(damaged(flipped, at: 2 * 4_096 + 10))
        #expect(try read(path, at: 0, count: 100) == Array(plain[0..<100]))
        // Cut at a block boundary: the file reads as a shorter body (each block is whole), which
        // the blob store refuses by the length it recorded (`EncryptedDatabaseTests`).
        try Data(original.prefix(32 + 5 * 4_124)).write(to: URL(fileURLWithPath: path))
        #expect(try read(path, at: 0, count: plain.count) == Array(plain.prefix(5 * 4_096)))
        // Grown by a byte: the last block's tag is then read from the wrong place (the blocks
        // before it are what was sealed, and read as such); cut inside a tag: no body seals
        // to that size.
        #expect(damaged(original + [0], at: 5 * 4_096, count: 200))
        #expect(try read(path, at: 0, count: 100) == Array(plain[0..<100]))
        #expect(damaged(Array(original.prefix(32 + 5 * 4_124 + 10))))
        // Two blocks swapped.
        var swapped = original
        swapped.replaceSubrange((32 + 4_124)..<(32 + 2 * 4_124), with: original[(32 + 2 * 4_124)..<(32 + 3 * 4_124)])
        swapped.replaceSubrange((32 + 2 * 4_124)..<(32 + 3 * 4_124), with: original[(32 + 4_124)..<(32 + 2 * 4_124)])
        #expect(damaged(swapped, at: 4_096))
        // Another key.
        try Data(original).write(to: URL(fileURLWithPath: path))
        #expect(throws: SealedBlobDamaged.self) { _ = try read(path, at: 0, count: 10, key: try SealingKey([UInt8](repeating: 7, count: 32))) }
        #expect(try read(path, at: 0, count: plain.count) == plain)
    }

    /// The mount's scratch files: writes anywhere, overwrites inside blocks, a gap past the end,
    /// cuts and growth, all read back as a plain file would hold them; every block written again
    /// is sealed under a new nonce.
    @Test func randomWritesOverwritesAndTruncationReadBackAsAPlainFileWould() throws {
        let path = directory.appending("scratch")
        let descriptor = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        defer { close(descriptor) }
        let file = try SealedFile(creating: descriptor, path: path, key: key)
        var model: [UInt8] = []
        var generator = SystemRandomNumberGenerator()
        func apply(_ bytes: [UInt8], at offset: Int) throws {
            if offset + bytes.count > model.count { model += [UInt8](repeating: 0, count: offset + bytes.count - model.count) }
            model.replaceSubrange(offset..<(offset + bytes.count), with: bytes)
            try bytes.withUnsafeBytes { try file.write($0, at: Int64(offset)) }
        }
        func check(_ step: String) throws {
            #expect(file.length == Int64(model.count), "\(step)")
            var out = [UInt8](repeating: 0, count: model.count + 100)
            let got = try out.withUnsafeMutableBytes { try file.read(into: $0, at: 0) }
            #expect(Array(out.prefix(got)) == model, "\(step)")
            let reopened = try SealedFile(opening: descriptor, path: path, key: key)
            #expect(reopened.length == Int64(model.count), "\(step): the length follows from the file's size")
        }
        try apply(body(10_000), at: 0)
        try check("stream")
        let before = fileBytes(path)
        try apply(Array(body(10_000)[4_100..<4_300]), at: 4_100)  // the same bytes again, in block 1
        let after = fileBytes(path)
        #expect(before.count == after.count)
        #expect(before[32..<44] == after[32..<44], "block 0 not written")
        #expect(before[(32 + 4_124)..<(32 + 4_124 + 12)] != after[(32 + 4_124)..<(32 + 4_124 + 12)], "a block written again gets a new nonce")
        try apply(Array("middle".utf8), at: 4_093)  // across a block boundary
        try check("overwrite")
        try apply(Array("after a gap".utf8), at: 30_000)
        try check("gap")
        for _ in 0..<40 {
            let offset = Int.random(in: 0..<40_000, using: &generator)
            try apply((0..<Int.random(in: 1..<9_000, using: &generator)).map { _ in UInt8.random(in: 0...255, using: &generator) }, at: offset)
        }
        try check("random writes")
        // Writes and reads of more than one batch (256 blocks) at once, starting inside a block.
        try apply((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }, at: 1_001)
        try check("three batches")
        for size in [12_345, 8_192, 8_191, 0, 5_000] {
            try file.truncate(to: Int64(size))
            if size < model.count { model.removeLast(model.count - size) } else { model += [UInt8](repeating: 0, count: size - model.count) }
            try check("truncate to \(size)")
        }
        try apply(Array("end".utf8), at: 5_000)
        try check("append after growth")
    }
}
