import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// #28 item 4: the same edit made in CouchDB and in Sofa gets the same revision id, so an
/// identical change made on both sides is not a conflict. Every request goes to the live
/// CouchDB and to `sofa serve`, and the answers (with their revision ids) must be equal.
extension CouchDBInteropTests {
    /// One server under test: JSON requests and raw uploads, with its credentials.
    struct Target {
        let port: Int
        let headers: [(String, String)]

        func json(_ method: String, _ path: String, _ body: JSONValue? = nil) throws -> HTTPResponse {
            let connection = try HTTPConnection(port: port)
            defer { connection.close() }
            return try connection.json(method, path, body, headers: headers)
        }

        func upload(_ path: String, _ bytes: [UInt8], contentType: String) throws -> HTTPResponse {
            let connection = try HTTPConnection(port: port)
            defer { connection.close() }
            return try connection.request("PUT", path, headers: headers + [("Content-Type", contentType)], body: bytes)
        }
    }

    /// Runs `scenario` against the live CouchDB and against a fresh `sofa serve`, each in a
    /// database of its own, and expects the same lines (the CouchDB database's name is read as
    /// Sofa's where an answer quotes it). Returns CouchDB's lines.
    @discardableResult
    func sideBySide(_ label: String, sourceLocation: SourceLocation = #_sourceLocation,
                    _ scenario: (Target, String) throws -> [String]) throws -> [String] {
        let server = try ServedDatabases(["--directory", directory.path])
        let couchDB = "\(label)-\(UUID().uuidString.prefix(8).lowercased())"
        let auth = [("Authorization", "Basic " + Data("\(couch.user):\(couch.password)".utf8).base64EncodedString())]
        let expected = try scenario(Target(port: couch.port, headers: auth), couchDB)
        let actual = try scenario(Target(port: server.port, headers: []), "\(label)-sofa")
        #expect(actual.count == expected.count, sourceLocation: sourceLocation)
        for (mine, theirs) in zip(actual, expected) {
            #expect(mine == theirs.replacingOccurrences(of: couchDB, with: "\(label)-sofa"), sourceLocation: sourceLocation)
        }
        return expected
    }

    func revisionIDScenario(_ target: Target, db: String) throws -> [String] {
        var seen: [String] = []
        func record(_ label: String, _ response: HTTPResponse) -> String {
            let rev = response.json?["rev"]?.stringValue ?? ""
            seen.append("\(label): \(response.status) \(rev)")
            return rev
        }
        /// The document's `_rev` and its attachments' names in the order the server keeps.
        func show(_ id: String) throws {
            let document = try target.json("GET", "/\(db)/\(id)").json?.objectValue ?? [:]
            let names = document["_attachments"]?.objectValue?.entries.map(\.key) ?? []
            seen.append("GET \(id): \(document["_rev"]?.stringValue ?? "-") \(names)")
        }
        func parse(_ json: String) throws -> JSONValue { try JSONParser.parse(Array(json.utf8)) }
        func base64(_ text: String) -> JSONValue { .string(Data(text.utf8).base64EncodedString()) }

        #expect(try target.json("PUT", "/\(db)").status == 201)
        // Bodies: numbers of every size and kind, unicode, nesting, byte lists, empty values.
        let bodies = [
            #"{"n":-5,"big":12345678901234567890,"neg":-300,"f":1.5,"f2":1.0,"e":1e2,"tiny":-1.25e-7}"#,
            #"{"s":"h\u00e9llo \ud83d\ude00 日本","nested":{"x":[1,2,300,[]],"y":{},"z":[{"a":null}]},"t":true,"fa":false,"nu":null}"#,
            #"{"arr":[1,2,3],"str":"","empty":[],"k":65536,"m":-2147483648,"mm":-2147483649,"x":4294967296,"huge":-123456789012345678901234567890}"#,
            #"{"b":1,"a":2}"#, #"{"a":2,"b":1}"#, #"{}"#,
        ]
        for (index, body) in bodies.enumerated() {
            let rev = record("PUT body \(index)", try target.json("PUT", "/\(db)/body\(index)", try parse(body)))
            let next = record("edit body \(index)", try target.json("PUT", "/\(db)/body\(index)", ["_rev": .string(rev), "v": 2]))
            let gone = record("DELETE body \(index)", try target.json("DELETE", "/\(db)/body\(index)?rev=\(next)"))
            // Made again on its tombstone, without a _rev.
            _ = record("PUT again body \(index)", try target.json("PUT", "/\(db)/body\(index)", try parse(body)))
            _ = gone
        }
        // A deletion that carries properties: CouchDB's id covers them.
        let kept = record("PUT keep", try target.json("PUT", "/\(db)/keep", ["x": 1]))
        _ = record("PUT _deleted with body", try target.json("PUT", "/\(db)/keep", ["_rev": .string(kept), "_deleted": true, "why": "done"]))
        // Attachments inline: CouchDB keeps text and JSON compressed and derives from that MD5.
        // Text up to CouchAttachmentMD5's limit (1 MiB) is gzipped for its MD5; 3 MiB of other bytes span three reads.
        let longText = (0..<17_000).map { "line \($0) of a text attachment, \($0 * 7919 % 10007)\n" }.joined()
        let noise = Data((0..<(3 << 20)).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) }).base64EncodedString()
        let attachments: JSONValue = [
            "notes.txt": ["content_type": "text/plain", "data": base64("hello")],
            "raw.bin": ["content_type": "application/octet-stream", "data": base64("hello")],
            "data.json": ["content_type": "application/json; charset=utf-8", "data": base64(#"{"a":[1,2,3]}"#)],
            "page.HTML": ["content_type": "TEXT/HTML", "data": base64("<p>hi</p>")],
            "empty.txt": ["content_type": "text/plain", "data": ""],
            "long.txt": ["content_type": "text/plain", "data": base64(longText)],
            "image.png": ["content_type": "image/png", "data": "iVBORw0KGgo="],
            "noise.jpg": ["content_type": "image/jpeg", "data": .string(noise)],
            // Which types CouchDB compresses: any case, parameters ignored, "text" alone is no prefix.
            "feed.xml": ["content_type": "Application/XML", "data": base64("<feed/>")],
            "app.js": ["content_type": "application/javascript;charset=utf-8", "data": base64("let a = 1")],
            "odd.txt": ["content_type": "textual/plain", "data": base64("hello")],
        ]
        var rev = record("PUT attachments", try target.json("PUT", "/\(db)/files", ["kind": "files", "_attachments": attachments]))
        try show("files")
        // Kept as stubs, listed in another order: the order is CouchDB's and the id follows it.
        let stubs = JSONValue.object(JSONObject(["image.png", "long.txt", "raw.bin", "noise.jpg", "notes.txt", "data.json", "page.HTML", "empty.txt"]
            .map { ($0, ["stub": true] as JSONValue) }))
        rev = record("PUT stubs reordered", try target.json("PUT", "/\(db)/files", ["_rev": .string(rev), "kind": "files", "v": 2, "_attachments": stubs]))
        try show("files")
        // One attachment PUT on its own goes first; one replaced moves first; one removed goes.
        rev = record("PUT new attachment", try target.upload("/\(db)/files/extra.txt?rev=\(rev)", Array("extra".utf8), contentType: "text/plain"))
        rev = record("PUT replaced attachment", try target.upload("/\(db)/files/raw.bin?rev=\(rev)", [0, 1, 2, 255], contentType: "application/x-thing"))
        try show("files")
        rev = record("DELETE attachment", try target.json("DELETE", "/\(db)/files/notes.txt?rev=\(rev)"))
        try show("files")
        // A document without _attachments drops them.
        rev = record("PUT without attachments", try target.json("PUT", "/\(db)/files", ["_rev": .string(rev), "kind": "none"]))
        // An attachment PUT makes a new document; _bulk_docs saves as PUT does.
        _ = record("PUT attachment new doc", try target.upload("/\(db)/fresh/a%20b.txt", Array("fresh".utf8), contentType: "text/plain"))
        let bulk = try target.json("POST", "/\(db)/_bulk_docs", ["docs": [["_id": "bulk1", "n": 1],
                                                                          ["_id": "bulk2", "_attachments": ["x": ["content_type": "text/csv", "data": base64("a,b\n")]]]]])
        seen.append("bulk: \(bulk.status) \((bulk.json?.arrayValue ?? []).map { $0["rev"]?.stringValue ?? "-" })")
        // COPY keeps the source's attachments in its order.
        let copy = try target.json("COPY", "/\(db)/bulk2", nil)
        seen.append("COPY without destination: \(copy.status)")
        let connection = try HTTPConnection(port: target.port)
        defer { connection.close() }
        let copied = try connection.request("COPY", "/\(db)/bulk2", headers: target.headers + [("Destination", "bulk3")])
        _ = record("COPY", copied)
        return seen
    }

    @Test func revisionIDsAreCouchDBs() throws {
        let expected = try sideBySide("revids") { try revisionIDScenario($0, db: $1) }
        #expect(expected.filter { $0.contains(": 20") }.count > 30, "\(expected)")
    }

    /// Branches whose ids are not all 32 hex digits (Couchbase Lite's are 40; replicated or
    /// `new_edits=false` ones any text): CouchDB orders them by the bytes it keeps, 16 for 32
    /// hex digits, the text for anything else, so the winner, `_conflicts` and `open_revs`
    /// follow that order (aiocouch's suite found `_conflicts` in another order).
    @Test func branchesAreOrderedByTheBytesCouchDBKeeps() throws {
        let expected = try sideBySide("order") { target, db in
            var seen: [String] = []
            #expect(try target.json("PUT", "/\(db)").status == 201)
            let first = try target.json("PUT", "/\(db)/c", ["v": "1"]).json?["rev"]?.stringValue ?? ""
            _ = try target.json("PUT", "/\(db)/c?rev=\(first)", ["v": "2"])
            // 32 hex digits (16 bytes: 0x9a… beats the text "a1…", whose first byte is 0x61),
            // 40 hex digits (Couchbase Lite's), 33 letters.
            let leaves = ["2-9a000000000000000000000000000000", "2-a1b2c3d4e5f60718293a4b5c6d7e8f9012345678",
                          "1-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "1-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz", "1-0000000000000000000000000000000b",
                          "3-AB000000000000000000000000000000"]
            for rev in leaves {
                let generation = Int(rev.prefix { $0 != "-" })!
                let suffix = String(rev.drop { $0 != "-" }.dropFirst())
                let ids: [JSONValue] = [.string(suffix)] + (generation > 1 ? [.string(String(first.drop { $0 != "-" }.dropFirst()))] : [])
                let body: JSONValue = ["_id": "c", "_rev": .string(rev), "v": .string(rev),
                                       "_revisions": ["start": .integer(Int64(generation)), "ids": .array(Array(ids.prefix(generation)))]]
                let put = try target.json("PUT", "/\(db)/c?new_edits=false", body)
                seen.append("PUT \(rev): \(put.status)")
                let current = try target.json("GET", "/\(db)/c?conflicts=true")
                seen.append("then: \(current.status) " + (current.json ?? .null).jsonString(.canonical))
            }
            let connection = try HTTPConnection(port: target.port)
            defer { connection.close() }
            let open = try connection.json("GET", "/\(db)/c?open_revs=all", headers: target.headers + [("Accept", "application/json")])
            seen.append("open_revs: \(open.status) " + (open.json ?? .null).jsonString(.canonical))
            let changes = try target.json("GET", "/\(db)/_changes?style=all_docs")
            seen.append("changes: " + (changes.json?["results"]?.arrayValue?.first?["changes"] ?? .null).jsonString(.canonical))
            let info = try target.json("GET", "/\(db)/c?revs_info=true&deleted_conflicts=true&conflicts=true")
            seen.append("revs_info: \(info.status) " + (info.json ?? .null).jsonString(.canonical))
            return seen
        }
        #expect(expected.filter { $0.contains("\"_conflicts\":[\"") }.count == 7, "CouchDB's answers hold the branches: \(expected)")
    }

    /// JSON or multipart, by the Accept header as CouchDB reads it: with none or `*/*` (curl,
    /// Python's requests) a document with `attachments=true` and `open_revs` come as multipart,
    /// `_bulk_get` as JSON; `application/json` always gets JSON; `multipart/*` and q=0 count.
    @Test func answersAreJSONOrMultipartByTheAcceptHeaderAsCouchDBs() throws {
        let expected = try sideBySide("accept") { target, db in
            var seen: [String] = []
            #expect(try target.json("PUT", "/\(db)").status == 201)
            let rev = try target.json("PUT", "/\(db)/with", ["n": 1]).json?["rev"]?.stringValue ?? ""
            #expect(try target.upload("/\(db)/with/a.txt?rev=\(rev)", Array("hello".utf8), contentType: "text/plain").status == 201)
            #expect(try target.json("PUT", "/\(db)/without", ["n": 2]).status == 201)
            let accepts = [nil, "*/*", "application/json", "multipart/mixed", "multipart/related", "multipart/*",
                           "application/json, multipart/mixed", "application/json;q=0.5, */*;q=0.1", "multipart/mixed;q=0, */*",
                           "text/html"]  // (a q that is not a number: CouchDB fails with 500; Sofa takes none of the types)
            for accept in accepts {
                var answers: [String] = []
                for (method, path, body) in [("GET", "/\(db)/with?attachments=true", nil), ("GET", "/\(db)/without?attachments=true", nil),
                                             ("GET", "/\(db)/with?open_revs=all", nil),
                                             ("POST", "/\(db)/_bulk_get", ["docs": [["id": "with"]]] as JSONValue?)] {
                    let connection = try HTTPConnection(port: target.port)
                    defer { connection.close() }
                    let response = try connection.json(method, path, body, headers: target.headers + (accept.map { [("Accept", $0)] } ?? []))
                    let type = response.header("Content-Type")?.split(separator: ";").first.map(String.init) ?? "-"
                    answers.append("\(response.status) \(type)")
                }
                seen.append("Accept \(accept ?? "(none)"): " + answers.joined(separator: ", "))
            }
            return seen
        }
        #expect(expected.contains { $0.contains("multipart/related") } && expected.contains { $0.contains("multipart/mixed") }, "\(expected)")
    }
}

extension CouchDBInteropTests {
    /// Edits through the CLI and the mount get the ids CouchDB gives the same edits.
    @Test func cliAndMountEditsGetCouchDBsIDs() throws {
        let couchDB = try couch.newDatabase("revids-local")
        func couchRev(_ response: HTTPResponse) -> String { response.json?["rev"]?.stringValue ?? "\(response.status) \(response.text)" }
        func lastLine(_ result: ProcessResult) -> String {
            result.stdout.split(separator: "\n").last.map(String.init) ?? "exit \(result.status): \(result.stderr)"
        }
        let path = directory.appending("local.sofa")
        #expect(try sofa("create", path).succeeded)

        // The CLI: put, attach, rm.
        let body = #"{"title":"from the CLI","n":[1,2,300],"nested":{"é":1.5}}"#
        let cliRev = lastLine(try sofa("put", path, "cli", body))
        var theirs = couchRev(try couch.request("PUT", "/\(couchDB)/cli", try JSONParser.parse(Array(body.utf8))))
        #expect(cliRev == theirs)
        let file = directory.appending("notes.txt")
        let text = String(repeating: "attached by the CLI\n", count: 500)
        try text.write(toFile: file, atomically: true, encoding: .utf8)
        let attached = lastLine(try sofa("attach", path, "cli", "notes.txt", file, "--type", "text/plain"))
        theirs = couchRev(try couch.upload("/\(couchDB)/cli/notes.txt?rev=\(theirs)", Array(text.utf8), contentType: "text/plain"))
        #expect(attached == theirs)
        let removed = lastLine(try sofa("rm", path, "cli"))
        theirs = couchRev(try couch.request("DELETE", "/\(couchDB)/cli?rev=\(theirs)"))
        #expect(removed == theirs)

        // The mount: a new document's properties.json, a file added, the file removed.
        let mount = try MountedDatabase(path)
        let database = try Database.open(at: path)
        func current() throws -> Revision? { try database.currentRevision(of: "m") }
        #expect(mkdir(mount.path("docs/m"), 0o755) == 0)
        let properties = #"{"z":"last key first","a":[{"b":null}],"n":-7}"#
        try properties.write(toFile: mount.path("docs/m/properties.json"), atomically: false, encoding: .utf8)
        #expect(try waitUntil { try current() != nil })
        theirs = couchRev(try couch.request("PUT", "/\(couchDB)/m", try JSONParser.parse(Array(properties.utf8))))
        #expect(try current()?.revID.description == theirs)
        try "hello from the mount\n".write(toFile: mount.path("docs/m/attachments/hello.txt"), atomically: false, encoding: .utf8)
        #expect(try waitUntil { try current()?.attachments.count == 1 })
        let type = try #require(try current()?.attachments.first?.contentType)
        theirs = couchRev(try couch.upload("/\(couchDB)/m/hello.txt?rev=\(theirs)", Array("hello from the mount\n".utf8), contentType: type))
        #expect(try current()?.revID.description == theirs)
        #expect(unlink(mount.path("docs/m/attachments/hello.txt")) == 0)
        #expect(try waitUntil { try current()?.attachments.isEmpty == true })
        theirs = couchRev(try couch.request("DELETE", "/\(couchDB)/m/hello.txt?rev=\(theirs)"))
        #expect(try current()?.revID.description == theirs)
        #expect(mount.unmount().succeeded)
    }
}
