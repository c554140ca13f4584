import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench views`: a map/reduce view of `sofa serve` beside the live CouchDB 3.4.3
/// (`SOFA_COUCHDB_URL`) on the same documents in the same run: building the index (the
/// first query, timed), keyed queries of 100 rows (200 on one connection, three interleaved
/// rounds, medians), and a grouped reduce over the whole view. Ratios = CouchDB's time ÷
/// Sofa's (higher is better). Peak memory of `sofa serve` and of its query-server processes.
func viewBenchmark(_ options: Options) throws {
    let (base, admin) = try liveCouchDB(for: "views")
    let work = try makeWorkFolder("views", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let documents = options.documents
    let groups = max(1, documents / 100)
    print("Views: sofa serve beside CouchDB 3.4.3 at \(base), \(documents) documents, \(groups) keys of 100 rows; in \(work)")
    print(String(repeating: "-", count: 100))

    let db = try Database.create(at: "\(work)/views.sofa")
    for start in stride(from: 0, to: documents, by: 1000) {
        try db.inBatch { batch in
            for i in start..<min(start + 1000, documents) {
                var draft = try db.newRevision(of: String(format: "doc-%07d", i))
                draft.properties = ["type": "reading", "group": .integer(Int64(i % groups)), "n": .integer(Int64(i)),
                                    "title": .string("Reading number \(i)")]
                try batch.save(draft)
            }
        }
    }
    let name = "bench-views-\(getpid())"
    _ = try timeShell("\(sofaBinary) push \(work)/views.sofa \(admin)/\(name) --create-target >/dev/null")
    defer { _ = try? timeShell("curl -sf -X DELETE '\(admin)/\(name)' >/dev/null") }
    let server = try ServeProcess(sofa: sofaBinary, databases: [db.path], work: work)
    defer { server.stop() }
    let sofaURL = "http://127.0.0.1:\(server.port)/views"
    let couchURL = "\(admin)/\(name)"
    let design = #"{"views":{"by_group":{"map":"function (doc) { if (doc.type === 'reading') emit(doc.group, doc.n); }","reduce":"_sum"}}}"#
    for url in [sofaURL, couchURL] {
        _ = try timeShell("curl -sf -X PUT '\(url)/_design/bench' -H 'Content-Type: application/json' -d '\(design)' >/dev/null")
    }
    let view = "_design/bench/_view/by_group"

    // Building: the first query waits for the index over every document.
    var build: [String: Double] = [:]
    for (label, url) in [("CouchDB", couchURL), ("Sofa", sofaURL)] {
        build[label] = try timeShell("curl -sf '\(url)/\(view)?key=7&reduce=false&limit=1' >/dev/null")
    }
    // Both answer the same rows, or the timings mean nothing.
    for query in ["key=7&reduce=false", "group=true"] {
        var answers: [String] = []
        for url in [sofaURL, couchURL] {
            answers.append(try shellOutput("curl -sf '\(url)/\(view)?\(query)'"))
        }
        guard answers[0] == answers[1], answers[0].contains("\"rows\"") else {
            throw SofaError.invalidArgument("sofa serve and CouchDB answer \(query) differently:\n\(answers[0].prefix(300))\n\(answers[1].prefix(300))")
        }
    }

    func keyed(_ url: String, count: Int) throws -> String {
        let path = "\(work)/keyed-\(url.hashValue & 0xffff).curl"
        let lines = (0..<count).map { q in "url = \"\(url)/\(view)?reduce=false&key=\((q * 37) % groups)\"\noutput = /dev/null" }
        try lines.joined(separator: "\nnext\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
    let (sofaKeyed, couchKeyed) = (try keyed(sofaURL, count: 200), try keyed(couchURL, count: 200))
    var times: [String: [Double]] = [:]
    for _ in 0..<3 {
        times["couch keyed", default: []].append(try timeShell("curl -sf --config \(couchKeyed)"))
        times["sofa keyed", default: []].append(try timeShell("curl -sf --config \(sofaKeyed)"))
        times["couch group", default: []].append(try timeShell("curl -sf '\(couchURL)/\(view)?group=true' >/dev/null"))
        times["sofa group", default: []].append(try timeShell("curl -sf '\(sofaURL)/\(view)?group=true' >/dev/null"))
    }
    func median(_ key: String) -> Double { times[key]!.sorted()[1] }
    func row(_ what: String, _ mine: Double, _ theirs: Double, _ unit: String) {
        print(what.padding(toLength: 46, withPad: " ", startingAt: 0)
              + String(format: " Sofa %8.3f s  CouchDB %8.3f s  %5.2f×  %@", mine, theirs, theirs / mine, unit))
    }
    row("build the index (first query)", build["Sofa"]!, build["CouchDB"]!,
        String(format: "(Sofa %.0f documents/s, CouchDB %.0f)", Double(documents) / build["Sofa"]!, Double(documents) / build["CouchDB"]!))
    row("200 keyed queries of 100 rows, one connection", median("sofa keyed"), median("couch keyed"),
        String(format: "(Sofa %.0f queries/s)", 200 / median("sofa keyed")))
    row("group=true over the whole view (\(groups) rows)", median("sofa group"), median("couch group"), "")
    func peak(_ pid: String) -> Double {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM") }),
              let kib = Double(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return 0 }
        return kib / 1024
    }
    let helpers = ((try? shellOutput("pgrep -P \(server.pid) -f sofa-js")) ?? "").split(separator: "\n").map { peak(String($0)) }
    print(String(format: "peak RSS: sofa serve %.0f MB; its query-server processes %@ MB", peak(String(server.pid)),
                 helpers.isEmpty ? "-" : helpers.map { String(format: "%.0f", $0) }.joined(separator: ", ")))
    print("(keyed and group: medians of 3 interleaved rounds; ratio = CouchDB's time / Sofa's)")
}
