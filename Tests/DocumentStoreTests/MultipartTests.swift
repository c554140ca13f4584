import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `MultipartParser` fed as networks deliver (any split of the bytes), and `IncomingBody`'s checks.
@Suite struct MultipartTests {
    /// A `_bulk_get`-shaped body: a JSON part, a nested `multipart/related` with a binary part
    /// whose bytes hold near-delimiters, and an error part; then an epilogue.
    static let inner = "--3abf06b3ad74dc2f0c927ceba6f1eeef"
    static let binary: [UInt8] = Array("\r\n--3abf06b3ad74dc2f0c927ceba6f1eeeX\r\n-".utf8) + (0..<300).map { UInt8($0 % 256) } + Array("\r\n--".utf8)
    static let body: [UInt8] = {
        var bytes = Array("\r\n----outer\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"a\"}".utf8)
        bytes += Array("\r\n----outer\r\nContent-Type: multipart/related; boundary=\"\(inner)\"\r\n\r\n".utf8)
        bytes += Array("--\(inner)\r\nContent-Type: application/json\r\n\r\n{\"_id\":\"b\"}\r\n--\(inner)\r\nContent-Disposition: attachment; filename=\"x.bin\"\r\n\r\n".utf8)
        bytes += binary
        bytes += Array("\r\n--\(inner)--".utf8)
        bytes += Array("\r\n----outer\r\nContent-Type: application/json; error=\"true\"\r\n\r\n{\"error\":\"not_found\"}".utf8)
        bytes += Array("\r\n----outer--\r\nepilogue --outer".utf8)
        return bytes
    }()

    /// Parses `body` fed in pieces cut at `cuts`; returns each outer part as headers + bytes,
    /// the nested one read by a parser of its own.
    func parse(cuts: [Int]) throws -> [String] {
        var parts: [String] = []
        var current: (headers: [String: String], bytes: [UInt8])?
        var nested: MultipartParser?
        var nestedParts: [String] = []
        var nestedCurrent: (headers: [String: String], bytes: [UInt8])?
        let outer = MultipartParser(boundary: "--outer") { event in
            switch event {
            case .part(let headers):
                current = (headers, [])
                if let type = headers["content-type"], MultipartParser.mediaType(type) == "multipart/related" {
                    let boundary = try #require(MultipartParser.parameter(type, "boundary"))
                    nested = MultipartParser(boundary: boundary) { event in
                        switch event {
                        case .part(let headers): nestedCurrent = (headers, [])
                        case .bytes(let bytes): nestedCurrent?.bytes += bytes
                        case .partEnd:
                            nestedParts.append("\(nestedCurrent!.headers.sorted { $0.key < $1.key }) \(nestedCurrent!.bytes)")
                        }
                    }
                }
            case .bytes(let bytes):
                if let nested { try nested.feed(bytes) } else { current?.bytes += bytes }
            case .partEnd:
                if let nested {
                    try nested.finish()
                    parts.append("nested: " + nestedParts.joined(separator: " | "))
                } else {
                    parts.append("\(current!.headers.sorted { $0.key < $1.key }) \(String(decoding: current!.bytes, as: UTF8.self))")
                }
                nested = nil
            }
        }
        var start = 0
        for cut in cuts.sorted() + [MultipartTests.body.count] where cut >= start {
            try outer.feed(Array(MultipartTests.body[start..<cut]))
            start = cut
        }
        try outer.finish()
        return parts
    }

    @Test func everySplitOfTheBytesReadsTheSameParts() throws {
        let whole = try parse(cuts: [])
        #expect(whole.count == 3)
        #expect(whole[0].hasSuffix(#"{"_id":"a"}"#))
        #expect(whole[1].contains("x.bin") && whole[1].contains("\(MultipartTests.binary)"), "the binary part, near-delimiters and all")
        #expect(whole[2].contains("error=") && whole[2].hasSuffix(#"{"error":"not_found"}"#))
        // One cut anywhere, two cuts anywhere near the nested part, and one byte at a time.
        for cut in 0...MultipartTests.body.count { #expect(try parse(cuts: [cut]) == whole, "cut at \(cut)") }
        for first in stride(from: 100, to: 260, by: 3) {
            for second in stride(from: first, to: first + 60, by: 7) { #expect(try parse(cuts: [first, second]) == whole) }
        }
        #expect(try parse(cuts: Array(0..<MultipartTests.body.count)) == whole)
    }

    @Test func aBodyCutShortIsAnErrorNotAShortPart() throws {
        for end in [10, 60, MultipartTests.body.count - 30] {
            let parser = MultipartParser(boundary: "--outer") { _ in }
            try parser.feed(Array(MultipartTests.body[..<end]))
            #expect(throws: MultipartError.self) { try parser.finish() }
        }
        let endless = MultipartParser(boundary: "b") { _ in }
        try endless.feed(Array("--b\r\n".utf8))
        #expect(throws: MultipartError.self) {
            try endless.feed([UInt8](repeating: UInt8(ascii: "h"), count: MultipartParser.maximumHeaderBytes + 10))
        }
    }

    @Test func anIncomingBodyIsInstalledOnlyWhenItMatchesItsDigest() throws {
        let directory = TemporaryDirectory()
        let db = try Database.create(at: directory.appending("db.sofa"))
        let text = Array(String(repeating: "gzip me ", count: 5000).utf8)
        let gzipped = try gzip(text, in: directory)
        let md5OfGzip = "md5-" + Data(MessageDigest.hash(.md5, gzipped)).base64EncodedString()
        let md5OfText = "md5-" + Data(MessageDigest.hash(.md5, text)).base64EncodedString()
        // As CouchDB sends a body it stores gzip: the digest of the gzip bytes, decoded on the way in.
        let body = try IncomingBody(blobs: db.blobs, gzip: true)
        for piece in stride(from: 0, to: gzipped.count, by: 1000) { try body.write(Array(gzipped[piece..<min(piece + 1000, gzipped.count)])) }
        let (blob, digest) = try body.finish(claimedDigest: md5OfGzip, claimedLength: Int64(text.count))
        #expect(blob.length == Int64(text.count) && digest == md5OfText, "stored decoded, named by the decoded bytes' digest")
        // A wrong digest, a wrong length, a wrong sha1: nothing is installed.
        let before = try FileManager.default.contentsOfDirectory(atPath: directory.appending("db.sofa/attachments")).count
        for (claimed, length) in [(md5OfText.replacingOccurrences(of: "A", with: "B"), Int64(8)), (md5OfText, Int64(7)),
                                  ("sha1-" + Data(repeating: 1, count: 20).base64EncodedString(), Int64(8))] {
            let other = try IncomingBody(blobs: db.blobs, gzip: false)
            try other.write(Array("12345678".utf8))
            #expect(throws: IncomingBodyMismatch.self) { try other.finish(claimedDigest: claimed, claimedLength: length) }
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.appending("db.sofa/attachments")).count == before)
    }

    func gzip(_ bytes: [UInt8], in directory: TemporaryDirectory) throws -> [UInt8] {
        let path = directory.appending("plain")
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        #expect(try ChildProcess(["/bin/gzip", "-n", path]).wait().succeeded)
        return Array(try Data(contentsOf: URL(fileURLWithPath: path + ".gz")))
    }
}
