import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Each consumer of a database's change stream reacts to a commit as it happens, where each
/// used to poll: the mount every 200 ms, a continuous push every 500 ms, `_changes` every
/// 100 ms for other processes' writes, `_replicator` every 250 ms. Each test takes the median
/// of nine changes and bounds it well under what the old interval gave (a poller's median is
/// about half its interval, plus the work), so a return to polling fails it. Under
/// ThreadSanitizer (everything ~10× slower, every suite at once) the bounds only catch a hang.
@Suite struct ChangeStreamConsumerTests {
    let directory = TemporaryDirectory()

    /// The median of nine latencies, each from `change()` returning until `arrived()` holds.
    private func medianLatency(_ change: (Int) throws -> Void, arrived: (Int) throws -> Bool) throws -> Double {
        var latencies: [Double] = []
        for n in 0..<9 {
            try change(n)
            let changed = Date()
            let deadline = changed.addingTimeInterval(30)
            while try !arrived(n) {
                guard Date() < deadline else { throw SofaError.invalidArgument("change \(n) never arrived") }
                usleep(500)
            }
            latencies.append(Date().timeIntervalSince(changed))
            usleep(100_000)
        }
        return latencies.sorted()[4]
    }

    private func bound(_ seconds: Double) -> Double { underThreadSanitizer ? seconds * 20 : seconds }

    @Test func theMountShowsAnotherProcesssChangeAsItCommits() throws {
        let db = try directory.makeDatabase()
        try db.put("doc", ["n": -1])
        let mount = try MountedDatabase(db.path)
        let file = mount.path("docs/doc/properties.json")
        let median = try medianLatency({ n in
            _ = try String(contentsOfFile: file, encoding: .utf8)  // the kernel holds it now
            #expect(try sofa("put", db.path, "doc", "{\"n\":\(n)}").succeeded)
        }, arrived: { n in
            (try? String(contentsOfFile: file, encoding: .utf8))?.contains("\"n\": \(n)\n") == true
        })
        #expect(median < bound(0.05), "median \(median) s from the CLI's commit to the mount (a 200 ms poll gives ~0.1 s)")
    }

    @Test func aLongpollAnswersAnotherProcesssChangeAsItCommits() throws {
        let path = directory.appending("feed.sofa")
        #expect(try sofa("create", path).succeeded)
        let server = try ServedDatabases([path])
        var http: HTTPConnection?
        var since = "0"
        let median = try medianLatency({ n in
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
        #expect(median < bound(0.03), "median \(median) s from the CLI's commit to the longpoll's answer (a 100 ms poll gives ~0.05 s)")
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
        let median = try medianLatency({ n in
            try local.put("doc-\(n)", ["n": .integer(Int64(n))])
        }, arrived: { n in
            try http.json("GET", "/remote/doc-\(n)").status == 200
        })
        #expect(median < bound(0.15), "median \(median) s from a local commit to the remote having it (a 500 ms poll gives ~0.25 s)")
    }

    @Test func replicatorDocumentsStartAsTheyAreSaved() throws {
        let source = directory.appending("source.sofa")
        #expect(try sofa("create", source).succeeded)
        let server = try ServedDatabases([source, "--directory", directory.path])
        let http = try server.connect()
        #expect(try http.json("PUT", "/_replicator").status == 201)
        #expect(try http.json("PUT", "/source/doc", ["n": 1]).status == 201)
        let median = try medianLatency({ n in
            let made = try http.json("PUT", "/_replicator/job-\(n)", ["source": "source", "target": .string("copy-\(n)"),
                                                                       "create_target": true])
            #expect(made.status == 201)
        }, arrived: { n in
            try http.json("GET", "/copy-\(n)/doc").status == 200
        })
        #expect(median < bound(0.15), "median \(median) s from a _replicator document to its copy (a 250 ms poll gives ~0.125 s + the replication)")
    }
}
