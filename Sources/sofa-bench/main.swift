// sofa-bench: measures Sofa against plain tools on the same disk, in one run,
// and prints ratios (these machines are shared and noisy; absolute numbers drift).
// Every ratio is the reference's time / Sofa's (Sofa's throughput as a fraction of the
// reference's): higher is better, 1.00× is as fast (BENCHMARKS.md).
//
// `try?` here is only for clean-up (a work folder, a mount, a test database on CouchDB) and
// for /proc readings of a process that may have ended (its peak RSS then reads 0, and is
// printed so): neither can change a time or a ratio.
//
//   sofa-bench storage|mount|serve|sync [--dir DIR] [--documents N] [--attachment-mib N]

@preconcurrency import Glibc
import DocumentModel
import DocumentStore
import Foundation

struct Options {
    var suite = "storage"
    var directory = "/var/tmp"
    var documents = 100_000
    /// `--documents` was given (benchmarks with a smaller default then take it as it is).
    var documentsGiven = false
    var attachmentMiB = 1024
    /// `folders`: how many times each job runs through the mount and through `passthrough_ll`,
    /// in turn; the medians are compared (these machines are shared and noisy).
    var rounds = 1

    init(_ arguments: [String]) {
        var iterator = arguments.dropFirst().makeIterator()
        while let argument = iterator.next() {
            switch argument {
            case "--dir": directory = iterator.next() ?? directory
            case "--documents":
                documents = iterator.next().flatMap(Int.init) ?? documents
                documentsGiven = true
            case "--attachment-mib": attachmentMiB = iterator.next().flatMap(Int.init) ?? attachmentMiB
            case "--rounds": rounds = max(1, iterator.next().flatMap(Int.init) ?? rounds)
            case "storage", "mount", "serve", "sync", "copy", "couchdb", "deferred", "find", "folders", "views", "couchbase-lite", "encryption": suite = argument
            default:
                FileHandle.standardError.write(Data("usage: sofa-bench storage|mount|serve|sync|copy|couchdb|deferred|find|folders|views|couchbase-lite|encryption [--dir DIR] [--documents N] [--attachment-mib N] [--rounds N]\n".utf8))
                exit(2)
            }
        }
    }
}

func now() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

@discardableResult
func measure(_ body: () throws -> Void) rethrows -> Double {
    let start = now()
    try body()
    return now() - start
}

/// Runs a shell command and returns its wall time. (posix_spawn and a blocking waitpid:
/// Foundation's Process polls its run loop and rounds short runs up to ~50 ms.)
func timeShell(_ command: String) throws -> Double {
    try timeShellWithCPU(command).seconds
}

/// Runs `command` with /bin/sh; its wall time and the CPU seconds (user + system) of the
/// shell and everything it waited for.
func timeShellWithCPU(_ command: String) throws -> (seconds: Double, cpuSeconds: Double) {
    let arguments: [String] = ["/bin/sh", "-c", command]
    let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    let start = now()
    guard posix_spawn(&pid, "/bin/sh", nil, nil, argv, environ) == 0 else {
        throw SofaError.invalidArgument("cannot run: \(command)")
    }
    var status: Int32 = 0
    var usage = rusage()
    while wait4(pid, &status, 0, &usage) < 0 && errno == EINTR {}
    let elapsed = now() - start
    guard status == 0 else { throw SofaError.invalidArgument("benchmark command failed: \(command)") }
    return (elapsed, usage.cpuSeconds)
}

extension rusage {
    var cpuSeconds: Double {
        Double(ru_utime.tv_sec) + Double(ru_utime.tv_usec) / 1e6 + Double(ru_stime.tv_sec) + Double(ru_stime.tv_usec) / 1e6
    }
}

/// CPU seconds (user + system) used so far by every process of the given command name
/// (`beam.smp`: a CouchDB node), from /proc; the difference of two readings is what the
/// server spent on a job in between.
func cpuSeconds(ofProcessesNamed name: String) -> Double {
    let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
    var total = 0.0
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] where Int(entry) != nil {
        guard let stat = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
              let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")"),
              stat[stat.index(after: open)..<close] == name else { continue }
        // Fields after the command: state is field 3; utime and stime are fields 14 and 15.
        let fields = stat[stat.index(close, offsetBy: 2)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { continue }
        total += (user + system) / ticks
    }
    return total
}

func dropCaches() -> Bool {
    sync()
    return (try? "3\n".write(toFile: "/proc/sys/vm/drop_caches", atomically: false, encoding: .utf8)) != nil
}

func peakRSS() -> Int {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return usage.ru_maxrss * 1024
}

func rate(_ count: Int, _ seconds: Double) -> String { String(format: "%10.0f/s", Double(count) / seconds) }
func mibps(_ bytes: Int64, _ seconds: Double) -> String { String(format: "%7.0f MiB/s", Double(bytes) / 1_048_576 / seconds) }
func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }
let rounds = 5

/// The `sofa` binary built beside this one.
let sofaBinary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("sofa").path

/// A new work folder for one benchmark under `options.directory`; the caller removes it.
/// The live CouchDB a benchmark runs beside (`SOFA_COUCHDB_URL`, set by `Scripts/bench`): its
/// URL, and the same with the admin's credentials.
func liveCouchDB(for suite: String) throws -> (base: String, admin: String) {
    guard let base = ProcessInfo.processInfo.environment["SOFA_COUCHDB_URL"], let port = base.split(separator: ":").last else {
        throw SofaError.invalidArgument("SOFA_COUCHDB_URL is not set (Scripts/bench \(suite) starts a node)")
    }
    return (base, "http://admin:secret@127.0.0.1:\(port)")
}

func makeWorkFolder(_ benchmark: String, _ options: Options) throws -> String {
    let work = "\(options.directory)/sofa-bench-\(benchmark)-\(getpid())"
    try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
    return work
}

func ratio(_ value: Double) -> String { String(format: "%.2f×", value) }

func row(_ label: String, _ values: String...) {
    // Long labels push the values right instead of being cut.
    print(label.padding(toLength: max(44, label.count + 2), withPad: " ", startingAt: 0) + values.joined(separator: "  "))
}

func storage(_ options: Options) throws {
    let work = try makeWorkFolder("storage", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let n = options.documents
    print("Sofa storage benchmark: \(n) documents, \(options.attachmentMiB) MiB attachment, in \(work)")
    print(String(repeating: "-", count: 80))

    // Documents: one transaction, then one transaction per save.
    func body(_ i: Int) -> JSONObject {
        ["type": "note", "title": .string("Note number \(i)"), "count": .integer(Int64(i)), "tags": ["a", "b"], "score": 0.5]
    }
    let batchDB = try Database.create(at: "\(work)/batch.sofa")
    let batchTime = try measure {
        try batchDB.inBatch { batch in
            for i in 0..<n {
                var draft = try batchDB.newRevision(of: "doc-\(i)")
                draft.properties = body(i)
                try batch.save(draft)
            }
        }
    }
    row("save, \(n) docs in one transaction", rate(n, batchTime))

    let singleDB = try Database.create(at: "\(work)/single.sofa")
    let singleTime = try measure {
        for i in 0..<n {
            var draft = try singleDB.newRevision(of: "doc-\(i)")
            draft.properties = body(i)
            try singleDB.save(draft)
        }
    }
    row("save, \(n) docs one transaction each", rate(n, singleTime))

    var ids = (0..<n).map { "doc-\($0)" }
    ids.shuffle()
    var found = 0
    let readTime = try measure {
        for id in ids where try batchDB.document(withID: id) != nil { found += 1 }
    }
    precondition(found == n)
    row("read by id, \(n) docs in random order", rate(n, readTime))

    // Attachments: a big file written into the blob store vs cp, read back vs cat.
    let size = Int64(options.attachmentMiB) << 20
    let source = "\(work)/source.bin"
    try writeSource(source, size: size)
    _ = try timeShell("cat \(source) > /dev/null")  // the source is read from the cache by every contender
    let blobDB = try Database.create(at: "\(work)/blobs.sofa")
    var attachment: Attachment?
    // Contenders alternate over several rounds; medians are reported.
    var cpTimes: [Double] = [], cpSyncTimes: [Double] = [], writeTimes: [Double] = []
    let contenders: [() throws -> Void] = [
        { cpTimes.append(try timeShell("cp \(source) \(work)/copy.bin")); unlink("\(work)/copy.bin") },
        { cpSyncTimes.append(try timeShell("cp \(source) \(work)/copy.bin && sync \(work)/copy.bin")); unlink("\(work)/copy.bin") },
        {
            if let key = attachment?.blobKey { unlink(blobDB.blobs.path(for: key)) }  // so every round writes the blob anew
            sync()
            writeTimes.append(try measure {
                var draft = try blobDB.newRevision(of: "big")
                try draft.setAttachment("big.bin", contentsOf: source)
                draft.properties = ["round": .integer(Int64(writeTimes.count))]
                attachment = try blobDB.save(draft).attachment(named: "big.bin")
            })
        },
    ]
    // Rotate the order: whoever runs right after a large unlink pays for it.
    for round in 0..<rounds {
        for index in 0..<contenders.count {
            sync()
            try contenders[(index + round) % contenders.count]()
        }
    }
    let writeTime = median(writeTimes), cpTime = median(cpTimes), cpSyncTime = median(cpSyncTimes)
    row("write \(options.attachmentMiB) MiB attachment (hash+fsync)", mibps(size, writeTime),
        "cp " + mibps(size, cpTime), "ratio to cp " + ratio(cpTime / writeTime), "to cp+sync " + ratio(cpSyncTime / writeTime))

    let blobPath = blobDB.contentPath(of: attachment!)!
    func sofaRead() throws -> Double {
        try measure {
            let reader = try blobDB.openContent(of: attachment!, docID: "big")
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: BlobStore.chunkSize, alignment: 16)
            defer { buffer.deallocate() }
            while try reader.read(into: buffer) > 0 {}
        }
    }
    func sofaPread() throws -> Double {
        try measure {
            let reader = try blobDB.openContent(of: attachment!, docID: "big")
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 128 * 1024, alignment: 16)
            defer { buffer.deallocate() }
            var offset: Int64 = 0
            while case let count = try reader.read(into: buffer, at: offset), count > 0 { offset += Int64(count) }
        }
    }
    _ = try timeShell("cat \(blobPath) > /dev/null")  // warm the cache
    var catWarm: [Double] = [], sofaWarm: [Double] = [], preadWarm: [Double] = []
    for _ in 0..<rounds {
        catWarm.append(try timeShell("cat \(blobPath) > /dev/null"))
        sofaWarm.append(try sofaRead())
        preadWarm.append(try sofaPread())
    }
    row("read it back, warm cache (hash checked)", mibps(size, median(sofaWarm)), "cat " + mibps(size, median(catWarm)),
        "ratio to cat " + ratio(median(catWarm) / median(sofaWarm)))
    row("read it back, warm, 128 KiB preads (no hash)", mibps(size, median(preadWarm)), "cat " + mibps(size, median(catWarm)),
        "ratio to cat " + ratio(median(catWarm) / median(preadWarm)))
    if dropCaches() {
        var catCold: [Double] = [], sofaCold: [Double] = []
        for _ in 0..<rounds {
            _ = dropCaches()
            catCold.append(try timeShell("cat \(blobPath) > /dev/null"))
            _ = dropCaches()
            sofaCold.append(try sofaRead())
        }
        row("read it back, cold cache (hash checked)", mibps(size, median(sofaCold)), "cat " + mibps(size, median(catCold)),
            "ratio to cat " + ratio(median(catCold) / median(sofaCold)))
    } else {
        row("read it back, cold cache", "skipped: dropping the page cache needs root")
    }
    print(String(repeating: "-", count: 80))
    row("peak RSS of this process", String(format: "%.0f MB", Double(peakRSS()) / 1e6))
}

/// Writes `size` bytes of an incompressible pattern; another `seed`, other bytes.
func writeSource(_ path: String, size: Int64, seed: UInt64 = 0) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    precondition(fd >= 0)
    defer { close(fd) }
    var state: UInt64 = 0x9E37_79B9_7F4A_7C15 &+ seed &* 0x2545_F491_4F6C_DD1D
    var chunk = [UInt64](repeating: 0, count: (1 << 20) / 8)
    var remaining = size
    while remaining > 0 {
        for index in chunk.indices {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17
            chunk[index] = state
        }
        let count = Int(min(remaining, 1 << 20))
        _ = chunk.withUnsafeBytes { write(fd, $0.baseAddress, count) }
        remaining -= Int64(count)
    }
    fsync(fd)
}

setvbuf(stdout, nil, _IOLBF, 0)
let options = Options(CommandLine.arguments)
do {
    switch options.suite {
    case "mount": try mountBenchmark(options)
    case "serve": try serveBenchmark(options)
    case "sync": try syncBenchmark(options)
    case "copy": try copyBenchmark(options)
    case "couchdb": try couchDBBenchmark(options)
    case "deferred": try deferredBenchmark(options)
    case "find": try findBenchmark(options)
    case "folders": try folderBenchmark(options)
    case "views": try viewBenchmark(options)
    case "couchbase-lite": try couchbaseLiteBenchmark(options)
    case "encryption": try encryptionBenchmark(options)
    default: try storage(options)
    }
} catch {
    FileHandle.standardError.write(Data("sofa-bench: \(error)\n".utf8))
    exit(1)
}
