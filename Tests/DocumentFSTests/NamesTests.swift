import DocumentModel
@testable import DocumentFS
import Testing

@Suite struct NamesTests {
    @Test func documentIDsBecomeOneFileNameReversibly() {
        let cases = ["plain": "plain", "folder/sub/doc": "folder%2Fsub%2Fdoc", "100%": "100%25", ".": "%2E", "..": "%2E%2E",
                     "../../etc": "..%2F..%2Fetc", "%2F": "%252F", "unicode-ünïcødé-文档-🚀": "unicode-ünïcødé-文档-🚀", "...": "..."]
        for (id, file) in cases {
            #expect(FileNames.escape(id) == file, "\(id)")
            #expect(FileNames.unescape(file) == id, "\(file)")
            #expect(!FileNames.escape(id).contains("/"))
        }
        #expect(FileNames.unescape("a%41b") == "a%41b")  // only %25, %2F and %2E are decoded
    }

    @Test func attachmentNamesBecomeSafePaths() {
        #expect(FileNames.attachmentComponents("sub/dir/notes.txt") == ["sub", "dir", "notes.txt"])
        #expect(FileNames.attachmentComponents("../evil") == ["..%2Fevil"])
        #expect(FileNames.attachmentComponents("a//b") == ["a%2F%2Fb"])
        #expect(FileNames.attachmentComponents("/abs") == ["%2Fabs"])
        #expect(FileNames.attachmentComponents("..") == ["%2E%2E"])
        for name in ["sub/dir/notes.txt", "../evil", "a//b", "/abs", "..", "100%/x"] {
            #expect(FileNames.attachmentName(FileNames.attachmentComponents(name)) == name, "\(name)")
        }
    }

    @Test func pathsParseIntoNodes() {
        #expect(Node(path: "/") == .root)
        #expect(Node(path: "/docs") == .docs)
        #expect(Node(path: "/docs/folder%2Fsub") == .document("folder/sub"))
        #expect(Node(path: "/docs/a/properties.json") == .properties("a"))
        #expect(Node(path: "/docs/a/attachments") == .attachment("a", name: ""))
        #expect(Node(path: "/docs/a/attachments/sub/x.txt") == .attachment("a", name: "sub/x.txt"))
        #expect(Node(path: "/docs/a/attachments/.x.txt.swp") == .scratch("a", relative: "attachments/.x.txt.swp"))
        #expect(Node(path: "/docs/a/notes.swp") == .scratch("a", relative: "notes.swp"))
        #expect(Node(path: "/docs/a/conflicts/2-b/properties.json") == .conflictProperties("a", rev: "2-b"))
        #expect(Node(path: "/docs/a/conflicts/2-b/attachments/x") == .conflictAttachment("a", rev: "2-b", name: "x"))
        #expect(Node(path: "/.sofa/status.json") == .statusFile("status.json"))
        #expect(Node(path: "/elsewhere") == nil)
    }

    @Test func toolTemporaryFilesAreRecognised() {
        for name in [".notes.txt.swp", "4913", "notes.txt~", ".goutputstream-ABC123", "sedAb12Cd", ".photo.jpg.aB3dE9", ".dat.nosync5519.ovoqlb"] {
            #expect(FileNames.isToolTemporary(name), "\(name)")
        }
        for name in [".x.tmp", ".#notes.txt", ".notes.txt.swx", "sed123456"] {
            #expect(FileNames.isToolTemporary(name), "\(name)")
        }
        for name in ["notes.txt", ".config.backup", "photo.jpg", "sediment.txt", ".hidden", ".photo.jpg.rÉsumé", ".photo.jpg.abcdef",
                     "~notes.txt", "notes.tmp", "sed12345", "", "."] {
            #expect(!FileNames.isToolTemporary(name), "\(name)")
        }
    }
}
