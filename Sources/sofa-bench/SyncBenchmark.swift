import DocumentModel
import DocumentStore
import Foundation

/// Runs a command, returning its wall time and peak RSS. The peak comes from GNU time, which
/// forks the command from its own small process: the rusage of a child spawned from this one
/// would start from this process's peak (Linux keeps the old mm's high-water mark across exec,
/// and posix_spawn shares this process's mm until then).
func timeWithRSS(_ arguments: [String]) throws -> (seconds: Double, maxRSS: Int, cpuSeconds: Double) {
    let report = NSTemporaryDirectory() + "sofa-bench-rss-\(getpid())"
    defer { unlink(report) }
    let command = ["/usr/bin/time", "-f", "%M %U %S", "-o", report] + arguments
    let argv: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    var pid: pid_t = 0
    let start = now()
    guard posix_spawn(&pid, command[0], &actions, nil, argv, environ) == 0 else {
        throw SofaError.invalidArgument("cannot run \(command[0]) (apt-get install time)")
    }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let elapsed = now() - start
    guard status == 0 else { throw SofaError.invalidArgument("failed: \(arguments.joined(separator: " "))") }
    // The last line is time's own ("%M %U %S"): peak RSS in KiB, user and system CPU seconds.
    let fields = (try? String(contentsOfFile: report, encoding: .utf8))?.split(separator: "\n").last?.split(separator: " ") ?? []
    let kilobytes = fields.first.flatMap { Int($0) } ?? 0
    let cpu = fields.dropFirst().compactMap { Double($0) }.reduce(0, +)
    return (elapsed, kilobytes * 1024, cpu)
}

/// What the sync and copy benchmarks replicate: at most 10,000 small documents, every
/// tenth with a 100 KB attachment.
struct ReplicationDataset {
    let documents: Int
    let attachmentSize = 100_000
    var withAttachment: Int { documents / 10 }
    var summary: String { "\(documents) documents, \(withAttachment) with a \(attachmentSize / 1000) KB attachment" }

    /// 10,000 documents at most, unless `scale` and `--documents` say more (the CouchDB
    /// benchmark's large runs).
    init(_ options: Options, scale: Bool = false) {
        documents = scale && options.documentsGiven ? options.documents : min(options.documents, 10_000)
    }

    /// The dataset in a new database at `path`: random attachment bytes, so nothing compresses.
    /// `asBlobs`: each body is a Couchbase Lite blob (`/photo`) rather than an attachment.
    func makeSource(at path: String, asBlobs: Bool = false) throws -> Database {
        let source = try Database.create(at: path)
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        try source.inBatch { batch in
            for i in 0..<documents {
                var draft = try source.newRevision(of: String(format: "doc-%05d", i))
                draft.properties = ["n": .integer(Int64(i)), "title": .string("Document \(i)"), "tags": ["sync", "bench"]]
                if i % 10 == 0 {
                    var body = [UInt8](repeating: 0, count: attachmentSize)
                    for index in body.indices {
                        state ^= state << 13; state ^= state >> 7; state ^= state << 17
                        body[index] = UInt8(truncatingIfNeeded: state)
                    }
                    if asBlobs {
                        try draft.setBlob(at: "/photo", blob: source.blobs.write(body), contentType: "image/jpeg")
                    } else {
                        try draft.setAttachment("data.bin", data: body)
                    }
                }
                try batch.save(draft)
            }
        }
        return source
    }
}

/// `sofa-bench sync`: pull and push of 10,000 documents (1,000 with a 100 KB attachment)
/// against `sofa serve` on 127.0.0.1. (Deferred bodies read through the mount: `deferred`.)
func syncBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("sync", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let dataset = ReplicationDataset(options)
    let (documents, withAttachment, attachmentSize) = (dataset.documents, dataset.withAttachment, dataset.attachmentSize)
    print("Sofa sync benchmark: \(dataset.summary); in \(work)")
    print(String(repeating: "-", count: 104))

    _ = try dataset.makeSource(at: "\(work)/source.sofa")
    _ = try Database.create(at: "\(work)/pushed.sofa")

    // The server, on a free port, serving the source and an empty target for pushes.
    let server = try ServeProcess(sofa: sofa, databases: ["\(work)/source.sofa", "\(work)/pushed.sofa"], work: work)
    defer { server.stop() }
    let port = server.port
    let base = "http://127.0.0.1:\(port)"

    // Pull everything, then push it all to the empty database.
    _ = try timeShell("\(sofa) create \(work)/pulled.sofa > /dev/null")
    let pull = try timeWithRSS([sofa, "pull", "\(work)/pulled.sofa", "\(base)/source"])
    let push = try timeWithRSS([sofa, "push", "\(work)/pulled.sofa", "\(base)/pushed"])
    let megabytes = Double(withAttachment * attachmentSize) / 1e6
    for (label, run) in [("pull", pull), ("push", push)] {
        row("\(label) \(documents) docs, \(String(format: "%.0f", megabytes)) MB attachments",
            String(format: "%6.2f s", run.seconds), String(format: "%7.0f docs/s", Double(documents) / run.seconds),
            String(format: "%6.1f MB/s", megabytes / run.seconds), String(format: "peak RSS %.0f MB", Double(run.maxRSS) / 1e6))
    }
    let again = try timeWithRSS([sofa, "pull", "\(work)/pulled.sofa", "\(base)/source"])
    row("pull again, nothing new", String(format: "%6.2f s", again.seconds))
}
