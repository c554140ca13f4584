import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench serve`: `sofa serve` driven by curl, side by side with the same work
/// done in-process on the same database (documents) or with `cat` on the blob file
/// (attachment bodies).
func serveBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("serve", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let documents = options.documents
    let size = Int64(options.attachmentMiB) << 20
    print("Sofa serve benchmark: \(documents) documents, \(options.attachmentMiB) MiB attachment, in \(work)")
    print("HTTP is curl against sofa serve on 127.0.0.1; in-process is the Database API on the same disk")
    print(String(repeating: "-", count: 104))

    let db = try Database.create(at: "\(work)/bench.sofa")
    let source = "\(work)/source.bin"
    try writeSource(source, size: size)
    var draft = try db.newRevision(of: "big")
    try draft.setAttachment("big.bin", contentsOf: source)
    let big = try db.save(draft).attachment(named: "big.bin")!
    let blobPath = db.contentPath(of: big)!
    unlink(source)
    func body(_ i: Int) -> JSONObject {
        ["type": "note", "title": .string("Document number \(i)"), "n": .integer(Int64(i)), "tags": ["a", "b", "c"]]
    }
    // The documents for _changes and _bulk_get, written in-process (timed: the in-process rate for bulk saves).
    let batch = 500
    let inProcess = try measure {
        for start in stride(from: 0, to: documents, by: batch) {
            try db.inBatch { b in
                for i in start..<min(start + batch, documents) {
                    var d = try db.newRevision(of: String(format: "doc-%07d", i))
                    d.properties = body(i)
                    try b.save(d)
                }
            }
        }
    }

    // The server, on a free port.
    let server = try ServeProcess(sofa: sofa, databases: [db.path], work: work)
    defer { server.stop() }
    let (pid, port) = (server.pid, server.port)
    let url = "http://127.0.0.1:\(port)/bench"

    // _bulk_docs: the same number of new documents, in the same batch size, over HTTP.
    let requests = "\(work)/requests"
    try FileManager.default.createDirectory(atPath: requests, withIntermediateDirectories: true)
    let posted = min(documents, 20_000)
    for start in stride(from: 0, to: posted, by: batch) {
        let docs: [JSONValue] = (start..<min(start + batch, posted)).map { i in
            var doc = body(i)
            doc["_id"] = .string(String(format: "http-%07d", i))
            return .object(doc)
        }
        try Data(JSONValue.object(["docs": .array(docs)]).serialized()).write(to: URL(fileURLWithPath: "\(requests)/docs-\(start).json"))
        let ids: [JSONValue] = (start..<min(start + batch, posted)).map { ["id": .string(String(format: "doc-%07d", $0))] }
        try Data(JSONValue.object(["docs": .array(ids)]).serialized()).write(to: URL(fileURLWithPath: "\(requests)/get-\(start).json"))
    }
    let curl = "curl -sf -o /dev/null -H 'Content-Type: application/json'"
    let bulkDocs = try timeShell("for f in \(requests)/docs-*.json; do \(curl) -X POST --data-binary @$f \(url)/_bulk_docs || exit 1; done")
    let bulkGet = try timeShell("for f in \(requests)/get-*.json; do \(curl) -X POST --data-binary @$f '\(url)/_bulk_get?revs=true' || exit 1; done")
    let inProcessGet = try measure {
        for i in 0..<posted { _ = try db.document(withID: String(format: "doc-%07d", i)) }
    }
    let perSecond = { (count: Int, seconds: Double) in String(format: "%9.0f docs/s", Double(count) / seconds) }
    row("_bulk_docs, \(batch) per request", perSecond(posted, bulkDocs), "in-process " + perSecond(documents, inProcess),
        "ratio " + ratio((Double(posted) / bulkDocs) / (Double(documents) / inProcess)))
    row("_bulk_get, \(batch) per request", perSecond(posted, bulkGet), "in-process " + perSecond(posted, inProcessGet),
        "ratio " + ratio((Double(posted) / bulkGet) / (Double(posted) / inProcessGet)))

    // _changes over every document.
    let total = documents + posted + 1
    let changes = median(try (0..<3).map { _ in try timeShell("\(curl) '\(url)/_changes'") })
    let inProcessChanges = median(try (0..<3).map { _ in
        try measure {
            var since: Int64 = 0
            while let last = try db.changes(since: since, limit: 1000).last { since = last.sequence }
        }
    })
    row("_changes, \(total) rows", String(format: "%9.0f rows/s", Double(total) / changes),
        "in-process " + String(format: "%9.0f rows/s", Double(total) / inProcessChanges), "ratio " + ratio(inProcessChanges / changes))

    // Attachment GET against reading the blob file, warm cache, alternating who goes first.
    var direct: [Double] = [], served: [Double] = []
    for round in 0..<3 {
        for which in (round % 2 == 0 ? [0, 1] : [1, 0]) {
            if which == 0 { direct.append(try timeShell("cat \(blobPath) > /dev/null")) }
            else { served.append(try timeShell("curl -sf -o /dev/null \(url)/big/big.bin")) }
        }
    }
    // Sofa checks every byte it sends against the SHA-1 key, so sha1sum is the fair second reference.
    let hashed = median(try (0..<3).map { _ in try timeShell("sha1sum \(blobPath) > /dev/null") })
    row("attachment GET, \(options.attachmentMiB) MiB", mibps(size, median(served)), "cat " + mibps(size, median(direct)),
        "ratio " + ratio(median(direct) / median(served)))
    row("  the same, against sha1sum of the blob", mibps(size, median(served)), "sha1sum " + mibps(size, hashed),
        "ratio " + ratio(hashed / median(served)))
    let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
    let hwm = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }.map { $0.dropFirst(6).trimmingCharacters(in: .whitespaces) } ?? "?"
    print(String(repeating: "-", count: 104))
    row("sofa serve peak RSS", hwm)
}

/// `sofa serve` on a free port of 127.0.0.1, for the benchmarks.
final class ServeProcess {
    let pid: pid_t
    let port: Int

    init(sofa: String, databases: [String], work: String) throws {
        let output = "\(work)/serve.out"
        let arguments: [String] = [sofa, "serve"] + databases + ["--port", "0"]
        let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        var pid: pid_t = 0
        guard posix_spawn(&pid, sofa, &actions, nil, argv, environ) == 0 else { throw SofaError.invalidArgument("cannot start sofa serve") }
        self.pid = pid
        var port = 0
        for _ in 0..<500 where port == 0 {
            usleep(10_000)
            let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
            if let colon = text.range(of: "127.0.0.1:") { port = Int(text[colon.upperBound...].prefix { $0.isNumber }) ?? 0 }
        }
        self.port = port
        guard port > 0 else {
            kill(pid, SIGKILL)
            throw SofaError.invalidArgument("sofa serve did not start")
        }
    }

    func stop() {
        kill(pid, SIGTERM)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }
}
