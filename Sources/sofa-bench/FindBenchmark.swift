import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench find`: Mango `_find` of `sofa serve` beside the live CouchDB 3.4.3
/// (`SOFA_COUCHDB_URL`) answering the same queries on the same documents in the same run:
/// an indexed field returning 100 rows, and the same shape of query on a field without an
/// index (a scan, which reads every document). Each timing is one curl process sending 50
/// (indexed) or 5 (scanning) queries on one connection;
/// three interleaved rounds, medians; ratio = CouchDB's time / Sofa's (higher is better).
func findBenchmark(_ options: Options) throws {
    let (base, admin) = try liveCouchDB(for: "find")
    let work = try makeWorkFolder("find", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let documents = options.documents
    let groups = max(1, documents / 100)
    print("Mango _find: sofa serve beside CouchDB 3.4.3 at \(base), \(documents) documents, \(groups) groups of 100; in \(work)")
    print(String(repeating: "-", count: 100))

    // The documents and the index, made in Sofa; the index travels to CouchDB with them (a design document).
    let db = try Database.create(at: "\(work)/find.sofa")
    let load = try measure {
        for start in stride(from: 0, to: documents, by: 1000) {
            try db.inBatch { batch in
                for i in start..<min(start + 1000, documents) {
                    var draft = try db.newRevision(of: String(format: "doc-%07d", i))
                    draft.properties = ["type": "reading", "group": .integer(Int64(i % groups)), "tag": .integer(Int64(i % groups)),
                                        "n": .integer(Int64(i)), "title": .string("Reading number \(i)")]
                    try batch.save(draft)
                }
            }
        }
    }
    let indexed = try measure { try db.createIndex(MangoIndex(request: ["index": ["fields": ["group"]], "ddoc": "bench", "name": "group"])) }
    print(String(format: "load %d documents in-process: %.2f s; build the index on them: %.2f s", documents, load, indexed))
    let name = "bench-find-\(getpid())"
    _ = try timeShell("\(sofa) push \(work)/find.sofa \(admin)/\(name) --create-target >/dev/null")
    defer { _ = try? timeShell("curl -sf -X DELETE '\(admin)/\(name)' >/dev/null") }
    let server = try ServeProcess(sofa: sofa, databases: [db.path], work: work)
    defer { server.stop() }
    let sofaURL = "http://127.0.0.1:\(server.port)/find"
    let couchURL = "\(admin)/\(name)"

    // 50 queries in one curl process, one connection; each returns 100 rows.
    func queries(_ field: String, count: Int) throws -> String {
        let path = "\(work)/\(field).curl"
        let lines = (0..<count).map { q -> String in
            // curl's config syntax: a double-quoted string with \" inside.
            let body = #"{\"selector\":{\"\#(field)\":\#((q * 37) % groups)},\"limit\":100}"#
            return "url = \"URL\"\nrequest = POST\nheader = \"Content-Type: application/json\"\ndata = \"\(body)\"\noutput = /dev/null"
        }
        try lines.joined(separator: "\nnext\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
    func run(_ url: String, _ config: String) throws -> Double {
        let filled = config + ".\(url.hashValue & 0xffff)"
        try String(contentsOfFile: config, encoding: .utf8).replacingOccurrences(of: "URL", with: url + "/_find")
            .write(toFile: filled, atomically: true, encoding: .utf8)
        return try timeShell("curl -sf --config \(filled)")
    }
    let (byIndex, byScan) = (try queries("group", count: 50), try queries("tag", count: 5))
    // Both answer the same 100 documents to the same query, or the timings mean nothing.
    for field in ["group", "tag"] {
        var answers: [[String]] = []
        for url in [sofaURL, couchURL] {
            let output = "\(work)/answer.json"
            _ = try timeShell("curl -sf -X POST '\(url)/_find' -H 'Content-Type: application/json' -d '{\"selector\":{\"\(field)\":7},\"limit\":100,\"fields\":[\"_id\"]}' -o \(output)")
            let answer = try JSONParser.parse(Array(try Data(contentsOf: URL(fileURLWithPath: output))))
            answers.append((answer["docs"]?.arrayValue ?? []).compactMap { $0["_id"]?.stringValue })
        }
        guard answers[0].count == 100, answers[0] == answers[1] else {
            throw SofaError.invalidArgument("sofa serve and CouchDB answer differently on \(field): \(answers[0].count) and \(answers[1].count) documents")
        }
    }
    // Warm both (CouchDB builds its index on the first query).
    let couchBuild = try run(couchURL, byIndex)
    _ = try run(sofaURL, byIndex)
    print(String(format: "CouchDB's first 50 indexed queries (its index built on the first): %.2f s", couchBuild))
    var times: [String: [Double]] = [:]
    for _ in 0..<3 {
        times["couch index", default: []].append(try run(couchURL, byIndex))
        times["sofa index", default: []].append(try run(sofaURL, byIndex))
        times["couch scan", default: []].append(try run(couchURL, byScan))
        times["sofa scan", default: []].append(try run(sofaURL, byScan))
    }
    func median(_ key: String) -> Double { times[key]!.sorted()[1] }
    func row(_ what: String, _ sofaKey: String, _ couchKey: String, queries: Double) {
        let (mine, theirs) = (median(sofaKey) / queries, median(couchKey) / queries)
        print(what.padding(toLength: 52, withPad: " ", startingAt: 0)
              + String(format: " Sofa %7.2f ms  CouchDB %7.2f ms  %5.2f×  (%.0f rows/s)", mine * 1000, theirs * 1000, theirs / mine, 100 / mine))
    }
    row("_find on an indexed field, 100 rows", "sofa index", "couch index", queries: 50)
    row("_find on a field without an index, 100 rows", "sofa scan", "couch scan", queries: 5)
    print("(per query: medians of 3 interleaved rounds of 50 indexed or 5 scanning queries on one connection; ratio = CouchDB's time / Sofa's)")
}
