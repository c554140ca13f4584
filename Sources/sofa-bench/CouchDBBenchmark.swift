import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench couchdb`: Sofa's replicator against a live CouchDB 3.4.3 (`SOFA_COUCHDB_URL`,
/// admin/secret), each job beside CouchDB's own replicator doing the same copy on the same
/// node in the same round. Three interleaved rounds; medians; ratio = CouchDB's time / Sofa's
/// (the convention of every benchmark: Sofa's throughput as a fraction of the reference's).
func couchDBBenchmark(_ options: Options) throws {
    let (base, admin) = try liveCouchDB(for: "couchdb")
    let work = try makeWorkFolder("couchdb", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let dataset = ReplicationDataset(options, scale: true)
    // A large run (`--documents 200000`) is one round: CouchDB's replicator alone takes minutes.
    let rounds = dataset.documents > 10_000 ? 1 : 3
    print("Sofa against CouchDB 3.4.3 at \(base): \(dataset.summary); in \(work)")
    print(String(repeating: "-", count: 100))

    // The source database in CouchDB, loaded by a push of the dataset.
    let datasetDB = try dataset.makeSource(at: "\(work)/dataset.sofa")
    let source = "bench-source-\(getpid())"
    _ = try timeShell("\(sofa) push \(work)/dataset.sofa \(admin)/\(source) --create-target >/dev/null")

    // The limit of a pull: what the server can send. Every document and body in `_bulk_get`
    // requests of 200 (`multipart/mixed`, as Sofa asks), 4 at once, into /dev/null.
    let requests = "\(work)/bulk-get"
    try FileManager.default.createDirectory(atPath: requests, withIntermediateDirectories: true)
    for start in stride(from: 0, to: dataset.documents, by: 200) {
        let ids = (start..<min(start + 200, dataset.documents)).map { #"{"id":"\#(String(format: "doc-%05d", $0))"}"# }
        try #"{"docs":[\#(ids.joined(separator: ","))]}"#.write(toFile: String(format: "\(requests)/%06d.json", start), atomically: true, encoding: .utf8)
    }
    let limitCommand = "ls \(requests)/*.json | xargs -P 4 -I{} curl -sf -X POST '\(admin)/\(source)/_bulk_get?revs=true&attachments=true&att_encoding_info=true'"
        + " -H 'Accept: multipart/mixed' -H 'Content-Type: application/json' -d @{} -o /dev/null"
    // The limit of a push: what the server can take. The same documents, bodies inline, in
    // `_bulk_docs` with new_edits=false of 50 (as Sofa sends them), 4 at once, by curl.
    let pushRequests = "\(work)/bulk-docs"
    try FileManager.default.createDirectory(atPath: pushRequests, withIntermediateDirectories: true)
    var inline = CouchFormat.Options()
    inline.revisions = true
    inline.bodies = .inline
    var group: [String] = []
    var files = 0
    func writeGroup() throws {
        guard !group.isEmpty else { return }
        try #"{"new_edits":false,"docs":[\#(group.joined(separator: ","))]}"#
            .write(toFile: String(format: "\(pushRequests)/%06d.json", files), atomically: false, encoding: .utf8)
        (group, files) = ([], files + 1)
    }
    for summary in try datasetDB.documents() {
        let revision = try datasetDB.revision(summary.revID, of: summary.docID)
        let rendered = try CouchFormat.render(revision, tree: datasetDB.revisionTree(of: summary.docID), options: inline) { attachment in
            Array(try Data(contentsOf: URL(fileURLWithPath: datasetDB.contentPath(of: attachment) ?? "/nonexistent")))
        }
        group.append(JSONValue.object(rendered.json).jsonString())
        if group.count == 50 { try writeGroup() }
    }
    try writeGroup()
    func pushLimitCommand(_ round: Int) -> String {
        let target = "\(admin)/bench-limit-\(round)-\(getpid())"
        return "curl -sf -X PUT '\(target)' >/dev/null && ls \(pushRequests)/*.json | xargs -P 4 -I{} curl -sf -X POST '\(target)/_bulk_docs'"
            + " -H 'Content-Type: application/json' -d @{} -o /dev/null"
    }
    // Each job's wall time, and the CPU seconds of the client (Sofa, or curl) and of the
    // server (every beam.smp) while it ran: on this 2-core machine a job whose client and
    // server together keep both cores busy is bounded by CPU, not by the wire.
    struct Run { var seconds: Double; var client: Double; var server: Double }
    var couch: [Run] = [], pull: [Run] = [], deferred: [Run] = [], push: [Run] = [], limit: [Run] = [], pushLimit: [Run] = []
    var pullRSS = 0, deferredRSS = 0, pushRSS = 0
    func shell(_ command: String) throws -> Run {
        let before = cpuSeconds(ofProcessesNamed: "beam.smp")
        let (seconds, client) = try timeShellWithCPU(command)
        return Run(seconds: seconds, client: client, server: cpuSeconds(ofProcessesNamed: "beam.smp") - before)
    }
    func sofaJob(_ arguments: [String], _ rss: inout Int) throws -> Run {
        let before = cpuSeconds(ofProcessesNamed: "beam.smp")
        let measured = try timeWithRSS(arguments)
        rss = max(rss, measured.maxRSS)
        return Run(seconds: measured.seconds, client: measured.cpuSeconds, server: cpuSeconds(ofProcessesNamed: "beam.smp") - before)
    }
    for round in 0..<rounds {
        // CouchDB's replicator: the same documents and bodies into a new database of the node.
        let body = #"{"source":"\#(admin)/\#(source)","target":"\#(admin)/bench-couch-\#(round)-\#(getpid())","create_target":true}"#
        couch.append(try shell("curl -sf -X POST '\(admin)/_replicate' -H 'Content-Type: application/json' -d '\(body)' >/dev/null"))
        limit.append(try shell(limitCommand))
        pull.append(try sofaJob([sofa, "cp", "\(admin)/\(source)", "\(work)/pull-\(round).sofa"], &pullRSS))
        deferred.append(try sofaJob([sofa, "cp", "\(admin)/\(source)", "\(work)/deferred-\(round).sofa", "--no-download-attachments"], &deferredRSS))
        pushLimit.append(try shell(pushLimitCommand(round)))
        push.append(try sofaJob([sofa, "push", "\(work)/pull-\(round).sofa", "\(admin)/bench-push-\(round)-\(getpid())", "--create-target"], &pushRSS))
    }
    // The same jobs as if the server were another machine: CouchDB on one core, the client
    // (Sofa, or curl) on the other, so neither takes the other's CPU. A pull or push then
    // goes as fast as the server can serve it, and the limit rows say how close it comes.
    var pinnedPull: [Run] = [], pinnedDeferred: [Run] = [], pinnedPush: [Run] = [], pinnedLimit: [Run] = [], pinnedPushLimit: [Run] = []
    let pinned = ProcessInfo.processInfo.activeProcessorCount >= 2 && pinServer(toCPU: 0)
    if pinned {
        var unused = 0
        for round in 0..<rounds {
            pinnedLimit.append(try shell("taskset -c 1 sh -c \"\(limitCommand.replacingOccurrences(of: "\"", with: "\\\""))\""))
            pinnedPull.append(try sofaJob(["taskset", "-c", "1", sofa, "cp", "\(admin)/\(source)", "\(work)/pinned-\(round).sofa"], &unused))
            pinnedDeferred.append(try sofaJob(["taskset", "-c", "1", sofa, "cp", "\(admin)/\(source)", "\(work)/pinned-deferred-\(round).sofa",
                                               "--no-download-attachments"], &unused))
            pinnedPushLimit.append(try shell("taskset -c 1 sh -c \"\(pushLimitCommand(rounds + round).replacingOccurrences(of: "\"", with: "\\\""))\""))
            pinnedPush.append(try sofaJob(["taskset", "-c", "1", sofa, "push", "\(work)/pinned-\(round).sofa",
                                           "\(admin)/bench-push-\(rounds + round)-\(getpid())", "--create-target"], &unused))
        }
        _ = pinServer(toCPU: nil)
    }
    for name in [source] + (0..<(2 * rounds)).flatMap({ ["bench-couch-\($0)-\(getpid())", "bench-push-\($0)-\(getpid())", "bench-limit-\($0)-\(getpid())"] }) {
        _ = try? timeShell("curl -sf -X DELETE '\(admin)/\(name)' >/dev/null")
    }
    func median(_ runs: [Run]) -> Run { runs.sorted { $0.seconds < $1.seconds }[runs.count / 2] }
    let reference = median(couch).seconds
    func row(_ what: String, _ runs: [Run], _ rss: Int?) {
        let time = median(runs).seconds
        print(what.padding(toLength: 48, withPad: " ", startingAt: 0)
              + String(format: " %7.2f s  %5.2f× (CouchDB's %.2f s)", time, reference / time, reference)
              + (rss.map { String(format: "  peak RSS %d MB", $0 >> 20) } ?? ""))
    }
    row("CouchDB's replicator, source → new database", couch, nil)
    row("sofa pull (sofa cp URL DB), all bodies", pull, pullRSS)
    row("sofa pull --no-download-attachments", deferred, deferredRSS)
    row("sofa push into a new CouchDB database", push, pushRSS)
    let limitTime = median(limit).seconds, pushLimitTime = median(pushLimit).seconds
    print("server limit: _bulk_get ×4 into /dev/null".padding(toLength: 48, withPad: " ", startingAt: 0)
          + String(format: " %7.2f s  (sofa pull at %.2f of it)", limitTime, limitTime / median(pull).seconds))
    print("server limit: _bulk_docs of 50 inline ×4".padding(toLength: 48, withPad: " ", startingAt: 0)
          + String(format: " %7.2f s  (sofa push at %.2f of it)", pushLimitTime, pushLimitTime / median(push).seconds))
    print("(times are medians of \(rounds) interleaved round\(rounds == 1 ? "" : "s"); ratios are CouchDB's time / Sofa's: higher is better)")
    print("CPU seconds of the median run (client: Sofa, or curl and sh; server: CouchDB's beam.smp; cores: both over wall time, of \(ProcessInfo.processInfo.activeProcessorCount)):")
    for (what, runs) in [("CouchDB's replicator", couch), ("sofa pull, all bodies", pull), ("sofa pull, deferred", deferred),
                         ("sofa push", push), ("sending limit (curl)", limit), ("taking limit (curl)", pushLimit)] {
        let run = median(runs)
        print("  " + what.padding(toLength: 26, withPad: " ", startingAt: 0)
              + String(format: " wall %6.2f s  client %6.2f s  server %6.2f s  cores %.2f", run.seconds, run.client, run.server,
                       (run.client + run.server) / run.seconds))
    }
    guard pinned else {
        print("(the runs with the server on a core of its own need two cores and taskset: not run)")
        return
    }
    print("The server on core 0, the client on core 1 (as if on two machines); medians, server CPU as a share of its core:")
    for (what, runs, limitRuns) in [("sofa pull, all bodies", pinnedPull, pinnedLimit), ("sofa pull, deferred", pinnedDeferred, pinnedLimit),
                                    ("sofa push", pinnedPush, pinnedPushLimit), ("sending limit (curl)", pinnedLimit, nil),
                                    ("taking limit (curl)", pinnedPushLimit, nil)] as [(String, [Run], [Run]?)] {
        let run = median(runs)
        print("  " + what.padding(toLength: 26, withPad: " ", startingAt: 0)
              + String(format: " wall %6.2f s  client %6.2f s  server %6.2f s (%3.0f %% busy)", run.seconds, run.client, run.server,
                       100 * run.server / run.seconds)
              + (limitRuns.map { String(format: "  at %.2f of the limit", median($0).seconds / run.seconds) } ?? ""))
    }
}

/// Pins every thread of every CouchDB process (`beam.smp`) to one CPU, or back to all of them
/// (nil); false when taskset is missing or no CouchDB runs.
private func pinServer(toCPU cpu: Int?) -> Bool {
    let list = cpu.map(String.init) ?? "0-\(ProcessInfo.processInfo.activeProcessorCount - 1)"
    let command = "pids=$(pgrep -x beam.smp) && [ -n \"$pids\" ] && for p in $pids; do taskset -a -c -p \(list) $p >/dev/null || exit 1; done"
    return (try? timeShell(command)) != nil
}
