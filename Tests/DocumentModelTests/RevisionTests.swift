import DocumentModel
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

    @Test func identicalEditsGiveIdenticalIDs() throws {
        let parent = RevisionID("1-abc")
        let a = RevisionID.derive(parent: parent, deleted: false, properties: ["x": 1, "y": "two"], attachments: [("a", "sha1-x"), ("b", "sha1-y")])
        let b = RevisionID.derive(parent: parent, deleted: false, properties: ["y": "two", "x": 1], attachments: [("b", "sha1-y"), ("a", "sha1-x")])
        #expect(a == b)
        #expect(a.generation == 2 && a.suffix.count == 32)
        #expect(a != RevisionID.derive(parent: parent, deleted: true, properties: ["x": 1, "y": "two"], attachments: [("a", "sha1-x"), ("b", "sha1-y")]))
        #expect(a != RevisionID.derive(parent: parent, deleted: false, properties: ["x": 1, "y": "two"], attachments: [("a", "sha1-z"), ("b", "sha1-y")]))
        #expect(a != RevisionID.derive(parent: RevisionID("1-abd"), deleted: false, properties: ["x": 1, "y": "two"], attachments: [("a", "sha1-x"), ("b", "sha1-y")]))
        #expect(RevisionID.derive(parent: nil, deleted: false, properties: [:], attachments: []).generation == 1)
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
}
