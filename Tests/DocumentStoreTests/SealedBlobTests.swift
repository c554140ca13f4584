import DocumentModel
@testable import DocumentStore
import Foundation
import Testing
import TestSupport

/// Bodies sealed in 4 KiB blocks (#32, the second piece): real files, written as a stream in
/// odd chunks, read back whole and by ranges. Not yet used by the blob store.
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
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        #expect(descriptor >= 0)
        defer { close(descriptor) }
        let writer = try SealedBlobWriter(descriptor: descriptor, path: path, key: key ?? self.key)
        // In chunks that never line up with the blocks.
        for start in stride(from: 0, to: bytes.count, by: 1_000) {
            try bytes[start..<min(start + 1_000, bytes.count)].withUnsafeBytes { try writer.write($0) }
        }
        #expect(try writer.finish() == Int64(bytes.count))
        return path
    }

    func read(_ path: String, at offset: Int64, count: Int, key: SealingKey? = nil) throws -> [UInt8] {
        let descriptor = open(path, O_RDONLY)
        defer { close(descriptor) }
        let reader = try SealedBlobReader(descriptor: descriptor, path: path, key: key ?? self.key)
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
        flipped[32 + 2 * 4_112 + 7] ^= 1
        #expect(damaged(flipped, at: 2 * 4_096 + 10))
        #expect(try read(path, at: 0, count: 100) == Array(plain[0..<100]))
        // Cut at a block boundary: the block now last was not sealed as the last.
        #expect(damaged(Array(original.prefix(32 + 5 * 4_112)), at: 4 * 4_096))
        // Grown by a byte: the last block's tag is then read from the wrong place (the blocks
        // before it are what was sealed, and read as such); cut inside a tag: no body seals
        // to that size.
        #expect(damaged(original + [0], at: 5 * 4_096, count: 200))
        #expect(try read(path, at: 0, count: 100) == Array(plain[0..<100]))
        #expect(damaged(Array(original.prefix(32 + 5 * 4_112 + 10))))
        // Two blocks swapped.
        var swapped = original
        swapped.replaceSubrange((32 + 4_112)..<(32 + 2 * 4_112), with: original[(32 + 2 * 4_112)..<(32 + 3 * 4_112)])
        swapped.replaceSubrange((32 + 2 * 4_112)..<(32 + 3 * 4_112), with: original[(32 + 4_112)..<(32 + 2 * 4_112)])
        #expect(damaged(swapped, at: 4_096))
        // Another key.
        try Data(original).write(to: URL(fileURLWithPath: path))
        #expect(throws: SealedBlobDamaged.self) { _ = try read(path, at: 0, count: 10, key: try SealingKey([UInt8](repeating: 7, count: 32))) }
        #expect(try read(path, at: 0, count: plain.count) == plain)
    }
}
