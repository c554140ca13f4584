import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Each consumer of a database's change stream reacts to a commit as it happens, where each
/// used to poll: the mount every 200 ms, a continuous push every 500 ms, `_changes` every
/// 100 ms for other processes' writes, `_replicator` every 250 ms. Each test makes nine changes
/// and waits for each to arrive (a missed wake-up fails it after 30 s). How fast they arrive is
/// measured by `Scripts/bench changes` (a return to polling shows there), never asserted here:
/// a busy machine makes any bound on time wrong (#51).
@Suite struct ChangeStreamConsumerTests {
    let directory = TemporaryDirectory()

    /// Nine changes, each followed by a wait until `arrived()` holds; throws when one never does.
    private func eachArrives(_ change: (Int) throws -> Void, arrived: (Int) throws -> Bool) throws {
        for n in 0..<9 {
            try change(n)
            let deadline = Date().addingTimeInterval(30)
            while try !arrived(n) {
                guard Date() < deadline else { throw SofaError.invalidArgument("change \(n) never arrived") }
                usleep(500)
            }
        }
    }

    @Test func theMountShowsAnotherProcesssChangeAsItCommits() throws {
        let db = try directory.makeDatabase()
        try db.put("doc", ["n": -1])
        let mount = try MountedDatabase(db.path)
        let file = mount.path("docs/doc/properties.json")
        try eachArrives({ n in
            _ = try String(contentsOfFile: file, encoding: .utf8)  // the kernel holds it now
            #expect(try sofa("put", db.path, "doc", "{\"n\":\(n)}").succeeded)
        }, arrived: { n in
            (try? String(contentsOfFile: file, encoding: .utf8))?.contains("\"n\": \(n)\n") == true
        })
    }

    @Test func aLongpollAnswersAnotherProcesssChangeAsItCommits() throws {
        let path = directory.appending("feed.sofa")
        #expect(try sofa("create", path).succeeded)
        let server = try ServedDatabases([path])
        var http: HTTPConnection?
        var since = "0"
        try eachArrives({ n in
            let connection = try server.connect()
            try connection.send("GET /feed/_changes?feed=longpoll&since=\(since)&timeout=20000 HTTP/1.1\r\nHost: x\r\n\r\n")
            usleep(100_000)  // the server is waiting now
            http = connection
            #expect(try sofa("put", path, "doc-\(n)", #"{"cli":true}"#).succeeded)
        }, arrived: { n in
            guard let connection = http else { return false }
            let answer = try connection.readResponse()
            http = nil
            #expect(answer.status == 200)
            #expect(answer.json?["results"]?[0]?["id"]?.stringValue == "doc-\(n)", "\(answer.text)")
            since = answer.json?["last_seq"]?.stringValue ?? since
            return true
        })
    }

    @Test func aContinuousPushSendsAChangeAsItCommits() throws {
        let remotePath = directory.appending("remote.sofa")
        #expect(try sofa("create", remotePath).succeeded)
        let server = try ServedDatabases([remotePath])
        let local = try directory.makeDatabase("local.sofa")
        let replication = try ChildProcess([sofaBinary, "push", local.path, "http://127.0.0.1:\(server.port)/remote", "--continuous"])
        defer {
            replication.kill(SIGTERM)
            recordSanitizerReports(replication.wait(), from: "sofa push")
        }
        let http = try server.connect()
        try eachArrives({ n in
            try local.put("doc-\(n)", ["n": .integer(Int64(n))])
        }, arrived: { n in
            try http.json("GET", "/remote/doc-\(n)").status == 200
        })
    }

    @Test func replicatorDocumentsStartAsTheyAreSaved() throws {
        let source = directory.appending("source.sofa")
        #expect(try sofa("create", source).succeeded)
        let server = try ServedDatabases([source, "--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("PUT", "/_replicator").status == 201)
        #expect(try http.json("PUT", "/source/doc", ["n": 1]).status == 201)
        try eachArrives({ n in
            let made = try http.json("PUT", "/_replicator/job-\(n)", ["source": "source", "target": .string("copy-\(n)"),
                                                                       "create_target": true])
            #expect(made.status == 201)
        }, arrived: { n in
            try http.json("GET", "/copy-\(n)/doc").status == 200
        })
    }
}
