import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `sofa blob set|cat|ls|rm`, and what the other commands do with blob properties.
@Suite struct BlobCommandTests {
    let directory = TemporaryDirectory()

    @Test func blobsAreSetReadListedAndRemovedByPointer() throws {
        let db = directory.appending("blobs.sofa")
        #expect(try sofa("create", db).succeeded)
        let file = directory.appending("page.txt")
        let bytes = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 % 251) }
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        #expect(try sofa("put", db, "book", #"{"title":"t","pages":[],"a/b":{}}"#).succeeded)

        let set = try sofa("blob", "set", db, "book", "/pages/0", file, "--type", "text/plain")
        #expect(set.succeeded && set.stdout.hasPrefix("2-"), "\(set.stderr)")
        #expect(try sofa("blob", "set", db, "book", "a~1b/cover", "-", stdin: file).succeeded, "from standard input")
        let again = try sofa("blob", "set", db, "book", "pages/0", file)
        #expect(again.stdout.hasPrefix("3-") && again.stderr.contains("unchanged"), "the same bytes save nothing: \(again.stderr)")

        let listed = try sofa("blob", "ls", db, "book")
        #expect(listed.stdout == "/pages/0\t293.0 KiB\ttext/plain\there\n/a~1b/cover\t293.0 KiB\tapplication/octet-stream\there\n", "\(listed.stdout)")
        let json = try JSONValue(parsing: try sofa("blob", "ls", db, "book", "--json").stdout)
        #expect(json[0]?["digest"]?.stringValue == BlobKey.of(bytes).digestString)
        let out = directory.appending("out.txt")
        #expect(try sofa("blob", "cat", db, "book", "pages/0", stdout: out).succeeded)
        #expect(FileManager.default.contents(atPath: out) == Data(bytes))

        // cat shows the document as CouchDB would: the blob dictionary and its stand-in.
        let doc = try JSONValue(parsing: try sofa("cat", db, "book").stdout)
        #expect(doc["pages"]?[0]?["digest"]?.stringValue == BlobKey.of(bytes).digestString)
        #expect(doc["_attachments"]?["blob_/pages/0"]?["stub"] == true)

        #expect(try sofa("blob", "rm", db, "book", "/pages/0").succeeded)
        let after = try #require(try Database.open(at: db).currentRevision(of: "book"))
        #expect(after.properties["pages"] == [])
        #expect(after.attachmentNames == ["blob_/a~1b/cover"])
    }

    @Test func badBlobsAndPointersAreRefusedWithAReason() throws {
        let db = directory.appending("bad.sofa")
        #expect(try sofa("create", db).succeeded)
        let file = directory.appending("f.bin")
        #expect(FileManager.default.createFile(atPath: file, contents: Data([1, 2, 3])))
        #expect(try sofa("put", db, "d", #"{"name":"x","list":[]}"#).succeeded)

        func refusal(_ arguments: String...) throws -> String {
            let result = try sofa(arguments)
            #expect(result.status == 1, "\(arguments) succeeded")
            return result.stderr
        }
        #expect(try refusal("blob", "set", db, "d", "bad~2", file).contains("is not a JSON pointer"))
        #expect(try refusal("blob", "set", db, "d", "name", file).contains("blob at /name: a string that is not a blob is there"))
        #expect(try refusal("blob", "set", db, "d", "list/3", file).contains("\"3\" is not an index of an array of 0"))
        #expect(try refusal("blob", "cat", db, "d", "name").contains("document \"d\" has no blob at /name"))
        #expect(try refusal("blob", "rm", db, "d", "nothing").contains("has no blob at /nothing"))
        #expect(try refusal("attach", db, "d", "blob_/x", file).contains("use sofa blob set"))
        // Properties naming a body that is not here, a bad digest, a wrong length, a negative one.
        let digest = BlobKey.of([9, 9, 9]).digestString
        #expect(try refusal("put", db, "d", #"{"p":{"@type":"blob","digest":"\#(digest)","length":3}}"#)
            .contains("blob at /p: no body with digest \(digest) is here"))
        #expect(try refusal("put", db, "d", #"{"p":[{"@type":"blob","digest":"sha1-xyz"}]}"#)
            .contains("blob at /p/0: its digest \"sha1-xyz\" is not sha1-"))
        let here = BlobKey.of([1, 2, 3]).digestString
        #expect(try sofa("blob", "set", db, "other", "x", file).succeeded)
        #expect(try refusal("put", db, "d", #"{"p":{"@type":"blob","digest":"\#(here)","length":4}}"#)
            .contains("its length is 4 but its body has 3 bytes"))
        #expect(try refusal("put", db, "d", #"{"p":{"@type":"blob","digest":"\#(here)","length":-3}}"#)
            .contains("its length -3 is not a whole number of bytes"))
        // A body that is here may be named by put alone; two properties share one body.
        #expect(try sofa("put", db, "d", #"{"p":{"@type":"blob","digest":"\#(here)","length":3},"q":{"@type":"blob","digest":"\#(here)"}}"#).succeeded)
        let saved = try #require(try Database.open(at: db).currentRevision(of: "d"))
        #expect(saved.attachmentNames == ["blob_/p", "blob_/q"])
        #expect(Set(saved.attachments.compactMap(\.blobKey)).count == 1)
        #expect(try sofa("check", db).succeeded)
    }
}
