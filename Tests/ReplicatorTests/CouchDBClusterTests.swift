import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Replication with a real CouchDB 3.4.3 cluster of three nodes (q=8, n=3: every document on
/// every node), as users who outgrow one machine run it: `sofa push`, `sofa pull` and a
/// continuous `sofa sync` with nodes stopped under them, and conflicts made on two nodes.
@Suite(.serialized) struct CouchDBClusterTests {
    let cluster = LiveCouchDBCluster.shared
    let directory = TemporaryDirectory()

    /// 20,000 documents, 200 of them with a 20 KB attachment, in batches of 1,000 a transaction.
    func makeSource() throws -> Database {
        let db = try directory.makeDatabase("source.sofa")
        var generator = SystemRandomNumberGenerator()
        for start in stride(from: 0, to: 20_000, by: 1_000) {
            try db.inBatch { batch in
                for n in start..<(start + 1_000) {
                    var draft = try db.newRevision(of: String(format: "doc-%05d", n))
                    draft.properties = ["n": .integer(Int64(n)), "text": "a document of the cluster test"]
                    if n % 100 == 0 {
                        try draft.setAttachment("photo.bin", data: (0..<20_000).map { _ in UInt8.random(in: 0...255, using: &generator) })
                    }
                    try batch.save(draft)
                }
            }
        }
        return db
    }

    func newClusterDatabase(_ label: String) throws -> String {
        let name = "\(label)-\(UUID().uuidString.prefix(8).lowercased())"
        let made = try cluster.request("PUT", "/\(name)", node: 0)
        guard made.status == 201 || made.status == 202 else { throw TestFailure("PUT /\(name): \(made.status) \(made.text)") }
        return name
    }

    /// A pull from one node while another is stopped under it, a push, and both compared
    /// document by document (every leaf, body and attachment) with where they came from.
    @Test func pushAndPullGoOnWhileANodeIsDown() throws {
        let source = try makeSource()
        let name = try newClusterDatabase("cluster")
        let push = try sofa("push", source.path, cluster.url(name, node: 0), "--json")
        #expect(push.succeeded, "\(push.stderr)")

        // Pull from the third node; stop the second once documents are arriving.
        let target = directory.appending("target.sofa")
        #expect(try sofa("create", target).succeeded)
        let output = directory.appending("pull.out")
        let pull = try ChildProcess([sofaBinary, "pull", target, cluster.url(name, node: 2), "--json", "--batch-size", "500"], stdout: output)
        #expect(waitUntil(120) { (try? String(contentsOfFile: output, encoding: .utf8))?.contains(#""event":"progress""#) == true })
        try cluster.stop(1)
        let pulled = pull.wait()
        // It goes on (two copies of every shard are left), or it fails saying why and the next run resumes.
        if !pulled.succeeded {
            #expect(!pulled.stderr.isEmpty, "a failed pull says why")
            let again = try sofa("pull", target, cluster.url(name, node: 2), "--json")
            #expect(again.succeeded, "\(again.stderr)")
        }
        try cluster.start(1)
        #expect(try ReplicationTests().snapshot(Database.open(at: target)) == ReplicationTests().snapshot(source),
                "what came back from the cluster is what went in")
        let info = try cluster.request("GET", "/\(name)", node: 1)
        #expect(info.json?["doc_count"]?.int64Value == 20_000, "the restarted node serves all of it: \(info.text.prefix(300))")
    }

    /// A continuous sync with the cluster goes on while a node it does not talk to is down,
    /// waits while the node it talks to is down, and catches up when that node is back.
    @Test func aContinuousSyncRidesOutNodesGoingDown() throws {
        let name = try newClusterDatabase("continuous")
        let local = try directory.makeDatabase("local.sofa")
        let sync = try ChildProcess([sofaBinary, "sync", local.path, cluster.url(name, node: 0), "--continuous", "--retry-delay", "0.2"])
        defer { sync.kill(SIGINT); _ = sync.wait() }
        func putOnCluster(_ ids: Range<Int>, node: Int) throws {
            let docs = ids.map { n -> JSONValue in ["_id": .string("remote-\(n)"), "n": .integer(Int64(n))] }
            let answer = try cluster.request("POST", "/\(name)/_bulk_docs", ["docs": .array(docs)], node: node)
            guard answer.status == 201 || answer.status == 202 else { throw TestFailure("_bulk_docs: \(answer.status) \(answer.text)") }
        }
        func localCount(_ prefix: String) throws -> Int { try local.documents().filter { $0.docID.hasPrefix(prefix) }.count }
        func clusterHas(_ id: String, node: Int) -> Bool { (try? cluster.request("GET", "/\(name)/\(id)", node: node).status) == 200 }

        // A node Sofa does not talk to goes down: both directions go on.
        try cluster.stop(1)
        try putOnCluster(0..<100, node: 2)
        #expect(try waitUntil(120) { try localCount("remote-") == 100 }, "the pull went on with a node down")
        for n in 0..<100 { try local.put("local-\(n)", ["n": .integer(Int64(n))]) }
        #expect(waitUntil(120) { clusterHas("local-99", node: 2) }, "the push went on with a node down")
        try cluster.start(1)

        // The node Sofa talks to goes down: edits made meanwhile on both sides cross once it is back.
        try cluster.stop(0)
        try putOnCluster(100..<200, node: 2)
        for n in 100..<200 { try local.put("local-\(n)", ["n": .integer(Int64(n))]) }
        try cluster.start(0)
        #expect(try waitUntil(180) { try localCount("remote-") == 200 }, "the pull caught up once its node was back")
        #expect(waitUntil(180) { clusterHas("local-199", node: 1) }, "the push caught up once its node was back")
        #expect(sync.hasEnded == false, "a continuous sync does not give up on a node that went away")
    }

    /// Branches written on two nodes at once (replicated writes, as other replicas send them)
    /// make a conflict in the cluster; a pull brings every branch and the same winner.
    @Test func conflictsMadeOnTwoNodesComeBackAsTheClusterKeepsThem() throws {
        let name = try newClusterDatabase("conflicts")
        func branch(_ rev: String, _ value: Int, node: Int) throws {
            let answer = try cluster.request("POST", "/\(name)/_bulk_docs", [
                "new_edits": false,
                "docs": [["_id": "shared", "_rev": .string(rev), "side": .integer(Int64(value)),
                          "_revisions": ["start": 2, "ids": [.string(String(rev.dropFirst(2))), "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0"]]]],
            ], node: node)
            guard answer.status == 201 || answer.status == 202 else { throw TestFailure("_bulk_docs: \(answer.status) \(answer.text)") }
        }
        try branch("2-b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1", 1, node: 0)
        try branch("2-b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2", 2, node: 2)
        // Each node forwards to the others; wait until one answers with both branches.
        var doc: JSONValue?
        #expect(waitUntil(60) {
            doc = try? cluster.request("GET", "/\(name)/shared?conflicts=true", node: 1).json
            return doc?["_conflicts"]?.arrayValue?.count == 1
        }, "the cluster keeps both branches: \(doc.map { $0.jsonString() } ?? "nothing")")
        let target = directory.appending("conflicts.sofa")
        #expect(try sofa("create", target).succeeded)
        let pulled = try sofa("pull", target, cluster.url(name, node: 1), "--json")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let db = try Database.open(at: target)
        let tree = try db.revisionTree(of: "shared")
        #expect(Set(tree.leaves.map(\.id.description)) == ["2-b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1", "2-b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"])
        #expect(try db.currentRevision(of: "shared")?.revID.description == doc?["_rev"]?.stringValue, "the same winner as the cluster's")
    }
}
