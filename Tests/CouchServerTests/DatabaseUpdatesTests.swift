import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `GET /_db_updates` (#28 item 3). The live CouchDB in CI has no `_global_changes` database
/// and so answers 404 there; with one, CouchDB 3.4.3 answered (recorded):
/// `{"results":[\n{"db_name":"gc-test1","type":"created","seq":"2-g1…"},\n…\n],\n"last_seq":"5-g1…"}\n`,
/// one row per database and kind at its latest sequence, and `feed=continuous` one row per
/// line then `{"last_seq":…}`. Sofa keeps that layout and those rules.
@Suite struct DatabaseUpdatesTests {
    let directory = TemporaryDirectory()

    struct Row: Equatable { let name: String, type: String }

    func rows(_ answer: HTTPResponse) -> [Row] {
        (answer.json?["results"]?.arrayValue ?? []).map { Row(name: $0["db_name"]?.stringValue ?? "", type: $0["type"]?.stringValue ?? "") }
    }

    @Test func createdUpdatedAndDeletedAsCouchDBListsThem() throws {
        let server = try ServedDatabases(["--directory", directory.path])
        let http = try server.connect()
        let empty = try http.request("GET", "/_db_updates")
        #expect(empty.status == 200 && rows(empty).isEmpty)
        #expect(empty.text.hasPrefix("{\"results\":[\n\n],\n\"last_seq\":\""), "\(empty.text)")
        #expect(try http.json("PUT", "/alpha").status == 201)
        #expect(try http.json("PUT", "/beta").status == 201)
        // Three writes are one `updated` row, at the last write's place.
        for n in 1...3 { #expect(try http.json("PUT", "/alpha/doc\(n)", ["n": .integer(Int64(n))]).status == 201) }
        #expect(try http.json("POST", "/beta/_bulk_docs", ["docs": [["_id": "x"]]]).status == 201)
        #expect(try http.json("DELETE", "/alpha").status == 200)
        let all = try http.request("GET", "/_db_updates")
        #expect(rows(all) == [Row(name: "alpha", type: "created"), Row(name: "beta", type: "created"), Row(name: "alpha", type: "updated"),
                              Row(name: "beta", type: "updated"), Row(name: "alpha", type: "deleted")], "\(all.text)")
        #expect(all.text.contains("},\n{\"db_name\":") && all.text.hasSuffix("\n],\n\"last_seq\":\"\(seqs(all).last ?? "")\"}\n"), "\(all.text)")
        // since, limit, since=now.
        let sequences = seqs(all)
        #expect(rows(try http.request("GET", "/_db_updates?since=\(sequences[1])")).map(\.type) == ["updated", "updated", "deleted"])
        #expect(rows(try http.request("GET", "/_db_updates?limit=1")) == [Row(name: "alpha", type: "created")])
        #expect(rows(try http.request("GET", "/_db_updates?since=now")).isEmpty)
        #expect(try http.request("GET", "/_db_updates?feed=sideways").status == 400)
        #expect(try http.request("GET", "/_db_updates?since=banana").status == 400)
    }

    /// Databases made in the served directory by other commands after `sofa serve` started
    /// are served at once: by name, in `_all_dbs`, and a PUT of their name is 412. They used to
    /// be 404 until a restart.
    @Test func databasesMadeInTheDirectoryByOtherCommandsAreServed() throws {
        let server = try ServedDatabases(["--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("GET", "/_all_dbs").json == [])
        #expect(try sofa("create", directory.appending("made.sofa")).succeeded)
        let db = try Database.open(at: directory.appending("made.sofa"))
        try db.put("doc", ["n": 1])
        #expect(try http.json("GET", "/made/doc").json?["n"] == 1, "served by name")
        #expect(try sofa("create", directory.appending("listed.sofa")).succeeded)
        #expect(try http.json("GET", "/_all_dbs").json == ["listed", "made"])
        #expect(try http.json("PUT", "/listed").status == 412)
        #expect(rows(try http.request("GET", "/_db_updates")).contains(Row(name: "listed", type: "created")))
        // A folder that is not a database yet is not served.
        try FileManager.default.createDirectory(atPath: directory.appending("half.sofa"), withIntermediateDirectories: false)
        #expect(try http.json("GET", "/half").status == 404)
        #expect(try http.json("GET", "/_all_dbs").json == ["listed", "made"])
    }

    /// `_global_changes`, CouchDB's third system database, is made as its setup (and client
    /// suites' fixtures) make it: PUT 201, then 412; listed; deleted. (It was 404 for every method.)
    @Test func globalChangesIsADatabaseThatCanBeMade() throws {
        let server = try ServedDatabases(["--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("GET", "/_global_changes").status == 404)
        #expect(try http.json("PUT", "/_global_changes").json == ["ok": true])
        #expect(try http.json("PUT", "/_global_changes").status == 412)
        #expect(try http.json("GET", "/_global_changes").json?["db_name"] == "_global_changes")
        #expect(try http.json("GET", "/_all_dbs").json == ["_global_changes"])
        #expect(try http.json("GET", "/_db_updates").status == 200)
        #expect(try http.json("PUT", "/_other").json?["error"] == "illegal_database_name")
        #expect(try http.json("DELETE", "/_global_changes").status == 200)
        #expect(try http.json("GET", "/_global_changes").status == 404)
    }

    private func seqs(_ answer: HTTPResponse) -> [String] {
        (answer.json?["results"]?.arrayValue ?? []).compactMap { $0["seq"]?.stringValue }
    }

    /// A longpoll ends with the event that comes, at once (the feed waits on the change stream,
    /// it does not poll); a continuous feed writes rows as lines and its last_seq at its timeout.
    @Test func feedsWaitForTheNextEvent() throws {
        let server = try ServedDatabases(["--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("PUT", "/first").status == 201)
        let answer = Locked<(HTTPResponse?, Double)>((nil, 0))
        let done = DispatchSemaphore(value: 0)
        let port = server.port
        Thread.detachNewThread {
            let started = Date()
            let response = try? HTTPConnection(port: port).request("GET", "/_db_updates?feed=longpoll&since=now&timeout=20000")
            answer.withLock { $0 = (response, Date().timeIntervalSince(started)) }
            done.signal()
        }
        usleep(300_000)
        #expect(try http.json("PUT", "/first/doc", [:]).status == 201)
        #expect(done.wait(timeout: .now() + 60) == .success)
        // Ended by the write, not by its timeout (which answers no rows).
        let (response, _) = answer.withLock { $0 }
        #expect(response.map(rows) == [Row(name: "first", type: "updated")], "\(response?.text ?? "none")")

        let continuous = try http.request("GET", "/_db_updates?feed=continuous&timeout=300")
        let lines = continuous.text.split(separator: "\n").map(String.init)
        #expect(lines.count == 3, "\(continuous.text)")
        #expect(lines.first?.hasPrefix("{\"db_name\":\"first\",\"type\":\"created\",\"seq\":\"") == true)
        #expect(lines.last?.hasPrefix("{\"last_seq\":\"") == true)
    }

    /// Only server admins may follow every database's updates, as in CouchDB.
    @Test func onlyServerAdmins() throws {
        let passwordFile = directory.appending("password")
        try "secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        let http = try server.connect()
        #expect(try http.request("GET", "/_db_updates").status == 401)
        let admin = [("Authorization", "Basic " + Data("admin:secret".utf8).base64EncodedString())]
        #expect(try http.request("GET", "/_db_updates", headers: admin).status == 200)
    }
}
