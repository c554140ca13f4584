import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Views as folders in a real mount (#29): `views/<design>/<view>/<key>/<id>` links to
/// `docs/<id>`, `_reduce.json` holds the reduce, and the folders follow the documents.
@Suite struct MountViewTests {
    let directory = TemporaryDirectory()
    let db: Database

    init() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        db = try directory.makeDatabase()
        try db.put("_design/app", ["views": [
            "by_type": ["map": "function(d) { if (d.type) emit(d.type, 1); }", "reduce": "_count"],
            "by_month": ["map": "function(d) { if (d.year) emit([d.year, d.month], d.amount); }", "reduce": "_sum"],
            "plain": ["map": "function(d) { if (d.type) emit(null, d.type); }"],
        ]])
        // Mango's design documents have no JavaScript views: no folder.
        try db.put("_design/mango", ["language": "query", "views": ["i": ["map": ["fields": ["type": "asc"]], "reduce": "_count"]]])
        try db.put("inv-1", ["type": "invoice", "year": 2024, "month": 1, "amount": 10])
        try db.put("inv-2", ["type": "invoice", "year": 2024, "month": 2, "amount": 5])
        try db.put("odd", ["type": "12", "year": 2024, "month": 2, "amount": 1])
        try db.put("folder/doc", ["type": "_private"])
    }

    func ls(_ path: String) throws -> [String] {
        try sh("ls -A '\(path)'").split(separator: "\n").map(String.init)
    }

    @Test func aViewIsAFolderOfKeysEachAFolderOfLinksToItsDocuments() throws {
        let mount = try MountedDatabase(db.path)
        #expect(try ls(mount.mountPoint).contains("views"))
        #expect(try ls(mount.path("views")) == ["app"])
        #expect(try ls(mount.path("views/app")) == ["by_month", "by_type", "plain"])
        // Keys by name: strings as text unless they would read as another key or a file of the folder.
        #expect(try ls(mount.path("views/app/by_type")) == ["\"12\"", "\"_private\"", "_reduce.json", "invoice"])
        #expect(try ls(mount.path("views/app/by_month")) == ["[2024,1]", "[2024,2]", "_reduce.json"])
        #expect(try ls(mount.path("views/app/plain")) == ["null"], "no reduce, no _reduce.json")
        // Each row a link to its document's folder, which opens through it.
        #expect(try ls(mount.path("views/app/by_type/invoice")) == ["_reduce.json", "inv-1", "inv-2"])
        #expect(try sh("readlink '\(mount.path("views/app/by_type/invoice/inv-1"))'") == "../../../../docs/inv-1\n")
        #expect(try sh("readlink '\(mount.path("views/app/by_type/\"_private\"/folder%2Fdoc"))'") == "../../../../docs/folder%2Fdoc\n")
        let through = try sh("cat '\(mount.path("views/app/by_type/invoice/inv-2/properties.json"))'")
        #expect(try JSONParser.parse(Array(through.utf8))["amount"] == 5)
        #expect(try sh("stat -c %F '\(mount.path("views/app/by_month/[2024,2]/odd"))'") == "symbolic link\n")
        // find walks it without following the links: the keys' folders and their rows.
        let found = try sh("cd '\(mount.path("views/app/by_month"))' && find . -type l | sort")
        #expect(found == "./[2024,1]/inv-1\n./[2024,2]/inv-2\n./[2024,2]/odd\n")
        // The reduces: of the view, and of each key (as group=true gives them).
        #expect(try JSONParser.parse(Array(try sh("cat '\(mount.path("views/app/by_type/_reduce.json"))'").utf8)) == 4)
        #expect(try JSONParser.parse(Array(try sh("cat '\(mount.path("views/app/by_type/invoice/_reduce.json"))'").utf8)) == 2)
        #expect(try JSONParser.parse(Array(try sh("cat '\(mount.path("views/app/by_month/[2024,2]/_reduce.json"))'").utf8)) == 6)
        #expect(try sh("stat -c %s '\(mount.path("views/app/by_month/_reduce.json"))'") == "3\n", "16 and a newline")
        // What is not there, and what cannot be done.
        let quoted = mount.path("views/app/by_type/\"invoice\""), mango = mount.path("views/mango")
        #expect(!(try shell("ls '\(quoted)' 2>&1").succeeded), "one name per key")
        #expect(!(try shell("ls '\(mango)' 2>&1").succeeded))
        for command in ["mkdir '\(mount.path("views/app/new"))'", "touch '\(mount.path("views/app/by_type/new"))'",
                        "rm '\(mount.path("views/app/by_type/invoice/inv-1"))'", "rm '\(mount.path("views/app/by_type/_reduce.json"))'",
                        "mv '\(mount.path("views/app/by_type/invoice/inv-1"))' '\(mount.path("docs/moved"))'"] {
            let result = try shell(command + " 2>&1")
            #expect(!result.succeeded && result.stdout.contains("Read-only file system"), "\(command): \(result.stdout)")
        }
        #expect(try document(db, "inv-1") != nil, "nothing was removed")
    }

    @Test func viewFoldersFollowTheDocuments() throws {
        let mount = try MountedDatabase(db.path)
        let byType = mount.path("views/app/by_type")
        #expect(try ls(byType) == ["\"12\"", "\"_private\"", "_reduce.json", "invoice"])
        #expect(try ls(byType + "/invoice") == ["_reduce.json", "inv-1", "inv-2"])
        // Saved by another process (this one, through its own connection): a new key, a moved row.
        try db.put("rec-1", ["type": "receipt"])
        try db.put("inv-2", ["type": "receipt"])
        #expect(waitUntil(3) { (try? ls(byType)) == ["\"12\"", "\"_private\"", "_reduce.json", "invoice", "receipt"] },
                "\((try? ls(byType)) ?? [])")
        #expect(waitUntil(3) { (try? ls(byType + "/invoice")) == ["_reduce.json", "inv-1"] })
        #expect(try ls(byType + "/receipt") == ["_reduce.json", "inv-2", "rec-1"])
        #expect(try JSONParser.parse(Array(try sh("cat '\(byType)/receipt/_reduce.json'").utf8)) == 2)
        // Saved through the mount: the same.
        try sh("rm -r '\(mount.path("docs/odd"))'")
        #expect(waitUntil(3) { (try? ls(byType)) == ["\"_private\"", "_reduce.json", "invoice", "receipt"] }, "\((try? ls(byType)) ?? [])")
        // A view added to the design document is a folder at once; a design document deleted takes its folder.
        var design = try db.newRevision(of: "_design/app")
        var views = design.properties["views"]?.objectValue ?? [:]
        views["by_amount"] = ["map": "function(d) { if (d.amount) emit(d.amount, null); }"]
        design.properties["views"] = .object(views)
        try db.save(design)
        #expect(waitUntil(3) { (try? ls(mount.path("views/app")))?.contains("by_amount") == true })
        #expect(try ls(mount.path("views/app/by_amount")) == ["10"])
        try db.deleteDocument("_design/app")
        #expect(waitUntil(3) { (try? ls(mount.path("views"))) == [] })
    }
}
