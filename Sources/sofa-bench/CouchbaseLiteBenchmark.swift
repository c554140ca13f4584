import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench couchbase-lite`: Couchbase Lite's own replicator (LiteCore 3.2's `cblite`, BLIP
/// over a WebSocket) against `sofa serve`, beside Sofa's replicator over CouchDB's protocol and
/// over BLIP, on two datasets: `--documents` small documents (100,000 by default) and 2,000
/// documents with a 200 KB blob each. Three interleaved rounds, medians. The goals (#49):
///
/// - `cblite push` into `sofa serve` no slower than `sofa push http://` of the same into it;
/// - `sofa pull ws://` no slower than `cblite pull` from the same server;
/// - `cblite pull` from `sofa serve` no slower than `sofa pull http://` from it.
///
/// Ratios are the reference's time / the measured one's: higher is better, 1.00× is as fast.
func couchbaseLiteBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("couchbase-lite", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let small = options.documentsGiven ? options.documents : 100_000
    print("Couchbase Lite sync benchmark in \(work); server: sofa serve; medians of 3 interleaved rounds")
    print(String(repeating: "-", count: 110))
    try couchbaseLiteRun(work: "\(work)/small", label: "\(small) small documents", documents: small, blobSize: 0)
    try couchbaseLiteRun(work: "\(work)/blobs", label: "2,000 documents with a 200 KB blob", documents: 2_000, blobSize: 200_000)
}

private func couchbaseLiteRun(work: String, label: String, documents: Int, blobSize: Int) throws {
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    let sofa = sofaBinary
    let cblite = FileManager.default.currentDirectoryPath + "/../shared/peers/cblite"
    let rounds = 3
    // The dataset, made once; every target is made before the server starts (it serves a fixed list).
    let source = try Database.create(at: "\(work)/source.sofa")
    var state: UInt64 = 0x9E37_79B9_7F4A_7C15
    try source.inBatch { batch in
        for index in 0..<documents {
            var draft = try source.newRevision(of: String(format: "doc-%06d", index))
            draft.properties = ["n": .integer(Int64(index)), "title": .string("Document \(index)"), "tags": ["sync", "bench"]]
            if blobSize > 0 {
                var body = [UInt8](repeating: 0, count: blobSize)
                for position in body.indices {
                    state ^= state << 13; state ^= state >> 7; state ^= state << 17
                    body[position] = UInt8(truncatingIfNeeded: state)
                }
                try draft.setBlob(at: "/photo", blob: source.blobs.write(body), contentType: "image/jpeg")
            }
            try batch.save(draft)
        }
    }
    var databases = ["\(work)/source.sofa"]
    for round in 0..<rounds {
        for name in ["http-push-\(round)", "blip-push-\(round)"] {
            _ = try Database.create(at: "\(work)/\(name).sofa")
            databases.append("\(work)/\(name).sofa")
        }
    }
    let server = try ServeProcess(sofa: sofa, databases: databases, work: work)
    defer { server.stop() }
    let http = "http://127.0.0.1:\(server.port)", ws = "ws://127.0.0.1:\(server.port)"
    // What the pushes send: the dataset as each client keeps it (untimed).
    _ = try timeWithRSS([cblite, "--create", "--upgrade", "pull", "\(work)/app.cblite2", "\(ws)/source"])
    _ = try timeShell("\(sofa) create \(work)/local.sofa > /dev/null && \(sofa) pull \(work)/local.sofa \(http)/source > /dev/null")

    typealias Run = (seconds: Double, maxRSS: Int, cpuSeconds: Double)
    var runs: [String: [Run]] = [:]
    // Each job starts with the page cache's dirty pages written out (untimed): with 400 MB of
    // blobs a job, the jobs late in a round otherwise paid for the writeback of the early ones.
    func timed(_ arguments: [String]) throws -> Run {
        sync()
        return try timeWithRSS(arguments)
    }
    for round in 0..<rounds {
        // Pushes into new databases, each client's way.
        runs["sofa push http://", default: []].append(try timed([sofa, "push", "\(work)/local.sofa", "\(http)/http-push-\(round)"]))
        _ = try timeWithRSS([cblite, "--writeable", "pull", "\(work)/app.cblite2", "\(ws)/blip-push-\(round)"])  // introduces the URL
        runs["cblite push", default: []].append(try timed([cblite, "--writeable", "push", "\(work)/app.cblite2", "\(ws)/blip-push-\(round)"]))
        // Pulls of the source into new databases, the three ways, in turn.
        for (key, command) in [("sofa pull http://", "\(http)/source"), ("sofa pull ws://", "\(ws)/source")] {
            let target = "\(work)/pulled-\(round)-\(key.hasSuffix("ws://") ? "ws" : "http").sofa"
            _ = try timeShell("\(sofa) create \(target) > /dev/null")
            runs[key, default: []].append(try timed([sofa, "pull", target, command]))
        }
        runs["cblite pull", default: []].append(try timed([cblite, "--create", "--upgrade", "pull", "\(work)/pulled-\(round).cblite2",
                                                                 "\(ws)/source"]))
    }
    for round in 0..<rounds {
        for name in ["http-push-\(round)", "blip-push-\(round)"] {
            let count = try Database.open(at: "\(work)/\(name).sofa").changes(since: 0).count
            guard count == documents else { throw SofaError.invalidArgument("\(name) holds \(count) documents, not \(documents)") }
        }
    }
    let status = (try? String(contentsOfFile: "/proc/\(server.pid)/status", encoding: .utf8)) ?? ""
    let serverPeak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }.map { $0.dropFirst(6).trimmingCharacters(in: .whitespaces) } ?? "?"

    func median(_ key: String) -> Run { runs[key]!.sorted { $0.seconds < $1.seconds }[runs[key]!.count / 2] }
    print("\(label): \(documents) documents\(blobSize > 0 ? String(format: ", %.0f MB of blobs", Double(documents * blobSize) / 1e6) : "")")
    for key in ["sofa push http://", "cblite push", "sofa pull http://", "cblite pull", "sofa pull ws://"] {
        let run = median(key)
        print("  " + key.padding(toLength: 22, withPad: " ", startingAt: 0)
              + String(format: "%8.2f s  %8.0f docs/s  client peak RSS %4d MB  (rounds: %@)", run.seconds, Double(documents) / run.seconds,
                       run.maxRSS >> 20, runs[key]!.map { String(format: "%.2f", $0.seconds) }.joined(separator: ", ")))
    }
    func goal(_ what: String, _ measured: String, _ reference: String) {
        let ratio = median(reference).seconds / median(measured).seconds
        print("  goal: " + what.padding(toLength: 62, withPad: " ", startingAt: 0) + String(format: "%5.2f× %@", ratio, ratio >= 1 ? "(met)" : "(not met)"))
    }
    goal("cblite push ÷ sofa push http:// (into sofa serve)", "cblite push", "sofa push http://")
    goal("sofa pull ws:// ÷ cblite pull (from sofa serve)", "sofa pull ws://", "cblite pull")
    goal("cblite pull ÷ sofa pull http:// (from sofa serve)", "cblite pull", "sofa pull http://")
    print("  sofa serve peak RSS over the whole run: \(serverPeak)")
    print(String(repeating: "-", count: 110))
}
