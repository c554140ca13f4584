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
    for url in [sofaURL, couchURL] { try putDesign(design, at: "\(url)/_design/bench", work: work) }
    let view = "_design/bench/_view/by_group"

    // Building: the first query waits for the index over every document.
    var build: [String: Double] = [:]
    for (label, url) in [("CouchDB", couchURL), ("Sofa", sofaURL)] {
        build[label] = try timeShell("curl -sf '\(url)/\(view)?key=7&reduce=false&limit=1' >/dev/null")
    }
    // Both answer the same rows, and the rows the documents make, or the timings mean nothing.
    for (query, rows) in [("key=7&reduce=false", (0..<documents).count { $0 % groups == 7 % groups }), ("group=true", min(groups, documents))] {
        var answers: [String] = []
        for url in [sofaURL, couchURL] {
            answers.append(try shellOutput("curl -sf '\(url)/\(view)?\(query)'"))
        }
        let counted = (try JSONParser.parse(Array(answers[0].utf8)))["rows"]?.arrayValue?.count
        guard answers[0] == answers[1], counted == rows else {
            throw SofaError.invalidArgument("sofa serve and CouchDB answer \(query) with \(counted ?? -1) rows (\(rows) expected) or differently:\n\(answers[0].prefix(300))\n\(answers[1].prefix(300))")
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
    try viewFolders(db: db, serve: sofaURL, view: "by_group", documents: documents, groups: groups, work: work)
}

/// The same index as folders in the mount (`views/<ddoc>/<view>/<key>/<id>`), beside a plain
/// folder tree of the same shape on the same disk: a view of one key per document (a folder
/// per key), and the benchmark's view (`groups` keys of 100 links each). Ratios = the plain
/// tree's time ÷ the mount's (1 = as fast as the disk).
private func viewFolders(db: Database, serve url: String, view: String, documents: Int, groups: Int, work: String) throws {
    let keys = #"{"views":{"by_n":{"map":"function (doc) { if (doc.type === 'reading') emit(doc.n, null); }"}}}"#
    try putDesign(keys, at: "\(url)/_design/keys", work: work)
    let plain = "\(work)/plain"
    for path in ["\(plain)/by_n", "\(plain)/\(view)", "\(plain)/queries/all", "\(plain)/queries/group7", "\(work)/mnt"] {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    for g in 0..<groups { mkdir("\(plain)/\(view)/\(g)", 0o755) }
    for i in 0..<documents {
        let id = String(format: "doc-%07d", i)
        mkdir("\(plain)/by_n/\(i)", 0o755)
        symlink("../../../../docs/\(id)", "\(plain)/by_n/\(i)/\(id)")
        symlink("../../../../docs/\(id)", "\(plain)/\(view)/\(i % groups)/\(id)")
        symlink("../../docs/\(id)", "\(plain)/queries/all/\(id)")
        if i % groups == 7 { symlink("../../docs/\(id)", "\(plain)/queries/group7/\(id)") }
    }
    let mount = try MountProcess(sofa: sofaBinary, database: db.path, at: "\(work)/mnt", remote: nil)
    do {
        try timeViewFolders(mounted: "\(work)/mnt/views", plain: plain, view: view, documents: documents, groups: groups)
        try timeQueryFolders(mounted: "\(work)/mnt/queries", plain: "\(plain)/queries", documents: documents, groups: groups)
    } catch {
        _ = mount.stop()
        throw error
    }
    print(String(format: "peak RSS of the mount: %.0f MB", Double(mount.stop()) / 1_048_576))
}

private func timeViewFolders(mounted: String, plain: String, view: String, documents: Int, groups: Int) throws {
    // The same folders in each tree: (the mount's, the plain tree's).
    let keys = ("\(mounted)/keys/by_n", "\(plain)/by_n"), grouped = ("\(mounted)/bench/\(view)", "\(plain)/\(view)")
    print(String(repeating: "-", count: 100))
    print("Views as folders in the mount, beside a plain folder tree of the same shape (ratio = plain's time / the mount's)")
    // The first listing of a new view builds its index.
    let first = try timeShell("ls \(keys.0) > /dev/null")
    print("ls of a new view of \(documents) keys".padding(toLength: 46, withPad: " ", startingAt: 0)
          + String(format: " %8.3f s (builds the index of %d documents, then lists)", first, documents))
    // Both list the same entries, or the timings mean nothing.
    func lines(_ command: String) throws -> Int { Int(try shellOutput(command + " | wc -l").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1 }
    for (mine, theirs) in [keys, grouped] {
        let (a, b) = (try lines("find \(mine) -mindepth 1 -not -name _reduce.json"), try lines("find \(theirs) -mindepth 1"))
        guard a == b else {
            let said = (try? shellOutput("find \(mine) -mindepth 1 2>&1 | head -3")) ?? ""
            throw SofaError.invalidArgument("the mount lists \(a) entries in \(mine), the plain tree \(b): \(said)")
        }
    }
    func compare(_ what: String, _ folders: (String, String), _ command: (String) -> String) throws {
        // The mount's view attributes are trusted for a second: each timed run asks for them again.
        usleep(1_100_000)
        let mine = try timeShell(command(folders.0))
        let theirs = try timeShell(command(folders.1))
        print(what.padding(toLength: 46, withPad: " ", startingAt: 0) + String(format: " mount %8.3f s  plain %8.3f s  %5.2f×", mine, theirs, theirs / mine))
    }
    try compare("ls of \(documents) keys", keys) { "ls \($0) > /dev/null" }
    try compare("ls -l of \(documents) keys (a stat each)", keys) { "ls -l \($0) > /dev/null" }
    try compare("find of \(groups) keys × \(documents / groups) links", grouped) { "find \($0) > /dev/null" }
    try compare("ls -l of one key's \(documents / groups) links", grouped) { "ls -l \($0)/7 > /dev/null" }
}

/// Saved queries as folders (`queries/<name>/`), beside plain folders of the same links: one
/// that every document matches, and one of a hundred found by a scan (no index serves it).
private func timeQueryFolders(mounted: String, plain: String, documents: Int, groups: Int) throws {
    try #"{"selector": {"type": "reading"}}"#.write(toFile: "\(mounted)/all.json", atomically: false, encoding: .utf8)
    try #"{"selector": {"group": 7}}"#.write(toFile: "\(mounted)/group7.json", atomically: false, encoding: .utf8)
    print(String(repeating: "-", count: 100))
    print("Saved queries as folders in the mount, beside plain folders of the same links (ratio = plain's time / the mount's)")
    for name in ["all", "group7"] {
        let (a, b) = (try shellOutput("ls \(mounted)/\(name) | md5sum"), try shellOutput("ls \(plain)/\(name) | md5sum"))
        guard a == b else { throw SofaError.invalidArgument("queries/\(name) lists other entries than the plain folder") }
    }
    func compare(_ what: String, _ name: String, _ command: (String) -> String) throws {
        usleep(1_100_000)  // trusted for a second, as views are: each timed run asks again
        let mine = try timeShell(command("\(mounted)/\(name)"))
        let theirs = try timeShell(command("\(plain)/\(name)"))
        print(what.padding(toLength: 46, withPad: " ", startingAt: 0) + String(format: " mount %8.3f s  plain %8.3f s  %5.2f×", mine, theirs, theirs / mine))
    }
    try compare("ls of a query matching all \(documents)", "all") { "ls \($0) > /dev/null" }
    try compare("ls -l of it (a lookup each)", "all") { "ls -l \($0) > /dev/null" }
    try compare("ls of \(documents / groups) found by a scan of \(documents)", "group7") { "ls \($0) > /dev/null" }
    try compare("ls -l of those (a lookup each)", "group7") { "ls -l \($0) > /dev/null" }
}

/// PUTs a design document's JSON from a file: its functions' quotes never meet a shell. (Given
/// inline in single quotes, `'reading'` lost its quotes and every map function threw, so both
/// servers built empty indexes, and this benchmark timed those until 2026-11-26.)
private func putDesign(_ json: String, at url: String, work: String) throws {
    let file = "\(work)/design.json"
    try json.write(toFile: file, atomically: true, encoding: .utf8)
    _ = try timeShell("curl -sf -X PUT '\(url)' -H 'Content-Type: application/json' --data-binary @\(file) >/dev/null")
}
