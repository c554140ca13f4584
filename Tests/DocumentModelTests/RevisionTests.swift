import DocumentModel
import Foundation
import Testing

@Suite struct RevisionIDTests {
    @Test func parsesAndOrders() throws {
        let rev = try #require(RevisionID("3-abc"))
        #expect(rev.generation == 3 && rev.suffix == "abc")
        #expect(RevisionID("0-1") == nil)
        #expect(RevisionID("x-1") == nil)
        #expect(RevisionID("3-") == nil)
        #expect(RevisionID("3") == nil)
        #expect(RevisionID("2-b")! < RevisionID("10-a")!)
        #expect(RevisionID("2-a")! < RevisionID("2-b")!)
        #expect(throws: SofaError.invalidRevisionID("nope")) { try RevisionID.parse("nope") }
    }

    /// Ids CouchDB 3.4.3 gave these edits (recorded from the live server; CouchRevisionIDTests
    /// repeats them side by side in CI).
    @Test func derivesCouchDBsIDs() throws {
        func derive(_ parent: String?, deleted: Bool = false, _ json: String, _ attachments: [RevisionAttachmentIdentity] = []) throws -> String {
            let properties = try #require(JSONValue(parsing: json).objectValue)
            return RevisionID.derive(parent: parent.flatMap(RevisionID.init), deleted: deleted, properties: properties,
                                     attachments: attachments).description
        }
        let numbers = #"{"n":-5,"big":12345678901234567890,"neg":-300,"f":1.5,"f2":1.0,"e":1e2,"s":"h\u00e9llo \ud83d\ude00","nested":{"x":[1,2,300,[]],"y":{}},"t":true,"fa":false,"nu":null,"ints":[0,255,256]}"#
        #expect(try derive(nil, numbers) == "1-c032c5e61f589e1b6092ce2ca0ad8315")
        #expect(try derive("1-c032c5e61f589e1b6092ce2ca0ad8315", #"{"v":2}"#) == "2-fca1db26ae476c903c50e471cf1738cc")
        #expect(try derive("2-fca1db26ae476c903c50e471cf1738cc", deleted: true, "{}") == "3-6657c7d164511ffbac11127dddc168ef")
        let integers = #"{"arr":[1,2,3],"str":"","empty":[],"k":65536,"m":-2147483648,"mm":-2147483649,"x":4294967296}"#
        #expect(try derive(nil, integers) == "1-d6839f0301dbff2de7099873d2b71caf")
        #expect(try derive("1-d6839f0301dbff2de7099873d2b71caf", #"{"v":2}"#) == "2-de7459acbb68321e9381e595b3252c8d")
        #expect(try derive("2-de7459acbb68321e9381e595b3252c8d", deleted: true, "{}") == "3-bb94d940eb2874d3ca8e3a05d04e1978")
        // "hello" as text/plain (CouchDB keeps the MD5 of its gzip form) and as application/octet-stream.
        let text = RevisionAttachmentIdentity(name: "x.txt", contentType: "text/plain", md5: hex("88c6a20bcc2a885943d8d8cb4de9af09"))
        let binary = RevisionAttachmentIdentity(name: "y.bin", contentType: "application/octet-stream", md5: hex("5d41402abc4b2a76b9719d911017c592"))
        #expect(try derive(nil, #"{"a":1}"#, [text, binary]) == "1-7a10cd0954aea81a12b11ff2fa559ef5")
        // The same attachments kept as stubs, sent in the other order: the order counts.
        #expect(try derive("1-7a10cd0954aea81a12b11ff2fa559ef5", #"{"b":2}"#, [binary, text]) == "2-53a4ee8b707eb9091365625c8bff52a9")
        #expect(try derive("1-7a10cd0954aea81a12b11ff2fa559ef5", #"{"b":2}"#, [text, binary]) != "2-53a4ee8b707eb9091365625c8bff52a9")
        // A parent suffix that is not 32 hex digits is hashed as its text.
        #expect(try derive("1-abc", "{}") != derive("1-abd", "{}"))
        #expect(try derive(nil, "{}").hasPrefix("1-"))
    }

    private func hex(_ text: String) -> [UInt8] {
        stride(from: 0, to: text.count, by: 2).map { UInt8(text.dropFirst($0).prefix(2), radix: 16)! }
    }
}

@Suite struct RevisionTreeTests {
    func node(_ id: String, _ parent: String?, deleted: Bool = false, leaf: Bool = false) -> RevisionNode {
        RevisionNode(id: RevisionID(id)!, parent: parent.flatMap(RevisionID.init), deleted: deleted, isLeaf: leaf)
    }

    @Test func higherGenerationWinsThenHigherSuffix() {
        let tree = RevisionTree([node("1-a", nil), node("2-b", "1-a", leaf: true), node("2-c", "1-a"), node("3-a", "2-c", leaf: true)])
        #expect(tree.winner?.id == RevisionID("3-a"))
        #expect(tree.conflicts.map(\.id) == [RevisionID("2-b")!])
        let tie = RevisionTree([node("1-a", nil), node("2-b", "1-a", leaf: true), node("2-c", "1-a", leaf: true)])
        #expect(tie.winner?.id == RevisionID("2-c"))
    }

    @Test func liveBranchBeatsLongerDeletedBranch() {
        let tree = RevisionTree([node("1-a", nil), node("2-a", "1-a", leaf: true), node("2-b", "1-a"),
                                 node("3-b", "2-b", deleted: true, leaf: true)])
        #expect(tree.winner?.id == RevisionID("2-a"))
        #expect(tree.conflicts.isEmpty)  // a deleted leaf is not a conflict
    }

    @Test func allDeletedLeavesMeansDeletedDocument() {
        let tree = RevisionTree([node("1-a", nil), node("2-a", "1-a", deleted: true, leaf: true), node("2-b", "1-a", deleted: true, leaf: true)])
        #expect(tree.winner?.id == RevisionID("2-b"))
        #expect(tree.winner?.deleted == true)
    }

    @Test func historyAndPruning() {
        let tree = RevisionTree([node("1-a", nil), node("2-a", "1-a"), node("3-a", "2-a"), node("4-a", "3-a", leaf: true),
                                 node("2-x", "1-a", leaf: true)])
        #expect(tree.history(of: RevisionID("4-a")!).map(\.description) == ["4-a", "3-a", "2-a", "1-a"])
        // Keep 2 generations behind every leaf: 4-a, 3-a and 2-x, 1-a.
        #expect(tree.revisionsBeyond(limit: 2).map(\.description) == ["2-a"])
    }
}

@Suite struct NameTests {
    @Test func documentIDs() throws {
        try DocumentID.validate("plain")
        try DocumentID.validate("_design/app")
        try DocumentID.validate("_local/ckpt")
        try DocumentID.validate("folder/sub/doc")
        try DocumentID.validate("unicode-ünïcødé-文档-🚀")
        #expect(throws: SofaError.self) { try DocumentID.validate("") }
        #expect(throws: SofaError.self) { try DocumentID.validate("_users") }
        #expect(throws: SofaError.self) { try DocumentID.validate("_design/") }
        #expect(throws: SofaError.self) { try DocumentID.validate("a\u{0}b") }
    }

    @Test func attachmentNames() throws {
        try AttachmentName.validate("sub/dir/notes.txt")
        #expect(throws: SofaError.self) { try AttachmentName.validate("") }
        #expect(throws: SofaError.self) { try AttachmentName.validate("_hidden") }
    }

    @Test func digests() {
        let key = BlobKey.of(Array("hello\n".utf8))
        #expect(key.hex == "f572d396fae9206628714fb2ce00f72e94f2258f")
        #expect(key.digestString == "sha1-9XLTlvrpIGYocU+yzgD3LpTyJY8=")
        #expect(BlobKey(digestString: key.digestString) == key)
        #expect(BlobKey(digestString: "md5-abc") == nil)
        #expect(BlobKey.hexString(MessageDigest.hash(.md5, Array("".utf8))) == "d41d8cd98f00b204e9800998ecf8427e")
        #expect(MIMEType.forFileName("a/b/Photo.JPG") == "image/jpeg")
        #expect(MIMEType.forFileName("noext") == "application/octet-stream")
    }

    /// Types come from the system's `/etc/mime.types` (Debian's media-types, which Scripts/setup
    /// installs), the built-in table only where it has none.
    @Test func contentTypesComeFromTheSystemsTable() throws {
        try #require(FileManager.default.fileExists(atPath: "/etc/mime.types"), "/etc/mime.types is missing (media-types)")
        #expect(MIMEType.forFileName("book.epub") == "application/epub+zip", "an extension only the system knows")
        #expect(MIMEType.forFileName("letter.odt") == "application/vnd.oasis.opendocument.text")
        #expect(MIMEType.forFileName("app.js") == "text/javascript", "the system's answer wins (RFC 9239)")
        let file = "/tmp/sofa-mime-\(getpid()).types"
        try "# comment\ntext/x-one\tone uno\nimage/x-two two\ntext/x-late one\nnot-a-type three\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        #expect(MIMEType.table(fromFile: file) == ["one": "text/x-one", "uno": "text/x-one", "two": "image/x-two"],
                "the first type naming an extension wins; comments and lines without a type are passed over")
        #expect(MIMEType.table(fromFile: "/nonexistent/mime.types").isEmpty)
    }
}
