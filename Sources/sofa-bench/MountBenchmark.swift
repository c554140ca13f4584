import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench mount`: the mount against direct access to the same bytes on the
/// same disk (the blob files, and a plain directory tree of the same shape).
func mountBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("mount", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let documents = min(options.documents, 10_000)
    let size = Int64(options.attachmentMiB) << 20
    print("Sofa mount benchmark: \(options.attachmentMiB) MiB attachment, \(documents) documents, in \(work)")
    print("ratios are direct time / mount time (1.00× = as fast as direct access)")
    print(String(repeating: "-", count: 96))

    // The database: one big attachment, and `documents` small documents with one small attachment each.
    let db = try Database.create(at: "\(work)/bench.sofa")
    let source = "\(work)/source.bin"
    try writeSource(source, size: size)
    var draft = try db.newRevision(of: "big")
    try draft.setAttachment("big.bin", contentsOf: source)
    let big = try db.save(draft).attachment(named: "big.bin")!
    let blobPath = db.contentPath(of: big)!
    // The plain tree of the same shape, on the same disk.
    let plain = "\(work)/plain"
    try db.inBatch { batch in
        for i in 0..<documents {
            let id = String(format: "doc-%05d", i)
            var small = try db.newRevision(of: id)
            small.properties = ["title": .string("Document \(i)"), "n": .integer(Int64(i))]
            let body = Array("small attachment \(i)\n".utf8) + [UInt8](repeating: 0x2E, count: 1000)
            try small.setAttachment("small.txt", data: body)
            try batch.save(small)
            try FileManager.default.createDirectory(atPath: "\(plain)/docs/\(id)/attachments", withIntermediateDirectories: true)
            try Data(JSONValue.object(small.properties).prettyPrinted().utf8).write(to: URL(fileURLWithPath: "\(plain)/docs/\(id)/properties.json"))
            try Data(body).write(to: URL(fileURLWithPath: "\(plain)/docs/\(id)/attachments/small.txt"))
        }
    }

    let mountPoint = "\(work)/mnt"
    try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
    _ = try timeShell("\(sofa) mount \(db.path) \(mountPoint)")
    defer { _ = try? timeShell("fusermount3 -u \(mountPoint)") }
    let mounted = "\(mountPoint)/docs/big/attachments/big.bin"
    let canDrop = dropCaches()

    func compare(_ label: String, rounds: Int = 3, cold: Bool = false, direct: String, mount: String) throws {
        var directTimes: [Double] = [], mountTimes: [Double] = []
        for round in 0..<rounds {
            // Alternate who goes first; drop the caches before each when measuring cold.
            for which in (round % 2 == 0 ? [0, 1] : [1, 0]) {
                if cold { _ = dropCaches() }
                if which == 0 { directTimes.append(try timeShell(direct)) } else { mountTimes.append(try timeShell(mount)) }
            }
        }
        let d = median(directTimes), m = median(mountTimes)
        row(label, String(format: "direct %8.3f s", d), String(format: "mount %8.3f s", m), "ratio " + ratio(d / m))
    }

    if canDrop {
        try compare("sequential read \(options.attachmentMiB) MiB, cold", cold: true,
                    direct: "cat \(blobPath) > /dev/null", mount: "cat \(mounted) > /dev/null")
    } else {
        row("sequential read, cold", "skipped: dropping the page cache needs root")
    }
    _ = try timeShell("cat \(blobPath) \(mounted) > /dev/null")
    try compare("sequential read \(options.attachmentMiB) MiB, warm", rounds: 5,
                direct: "cat \(blobPath) > /dev/null", mount: "cat \(mounted) > /dev/null")

    // Random 4 KiB reads, warm, in this process (200,000: 20,000 took 25 ms, too short to compare).
    func randomReads(_ path: String) -> Double {
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        var state: UInt64 = 12345
        let blocks = UInt64(size / 4096)
        return measure {
            for _ in 0..<200_000 {
                state = state &* 6364136223846793005 &+ 1442695040888963407
                _ = pread(fd, &buffer, 4096, off_t((state >> 33) % blocks) * 4096)
            }
        }
    }
    var directRandom: [Double] = [], mountRandom: [Double] = []
    for _ in 0..<3 {
        directRandom.append(randomReads(blobPath))
        mountRandom.append(randomReads(mounted))
    }
    row("random 4 KiB reads ×200000, warm", String(format: "direct %8.3f s", median(directRandom)),
        String(format: "mount %8.3f s", median(mountRandom)), "ratio " + ratio(median(directRandom) / median(mountRandom)))

    // Writing a big file in: cp to a plain folder vs cp into attachments/ (hashed, fsynced, one revision).
    var cpDirect: [Double] = [], cpSync: [Double] = [], cpMount: [Double] = []
    for round in 0..<3 {
        sync()
        cpDirect.append(try timeShell("cp \(source) \(plain)/copy.bin"))
        unlink("\(plain)/copy.bin")
        sync()
        cpSync.append(try timeShell("cp \(source) \(plain)/copy.bin && sync \(plain)/copy.bin"))
        unlink("\(plain)/copy.bin")
        sync()
        cpMount.append(try timeShell("cp \(source) \(mountPoint)/docs/big/attachments/copy\(round).bin"))
        _ = try timeShell("rm \(mountPoint)/docs/big/attachments/copy\(round).bin")
    }
    row("cp \(options.attachmentMiB) MiB into the tree", String(format: "direct %8.3f s", median(cpDirect)),
        String(format: "mount %8.3f s", median(cpMount)), "ratio " + ratio(median(cpDirect) / median(cpMount)),
        "(to cp+sync " + ratio(median(cpSync) / median(cpMount)) + ")")

    // Metadata over many documents.
    let plainDocs = "\(plain)/docs", mountDocs = "\(mountPoint)/docs"
    if canDrop {
        try compare("ls -lR over \(documents) documents, cold", cold: true,
                    direct: "ls -lR \(plainDocs) > /dev/null", mount: "ls -lR \(mountDocs) > /dev/null")
    }
    try compare("ls -lR over \(documents) documents, warm", direct: "ls -lR \(plainDocs) > /dev/null", mount: "ls -lR \(mountDocs) > /dev/null")
    try compare("find over \(documents) documents, warm", direct: "find \(plainDocs) > /dev/null", mount: "find \(mountDocs) > /dev/null")
    _ = try timeShell("cd \(plainDocs) && find . -type f > \(work)/files.txt")
    try compare("stat of \(documents * 2) files, warm",
                direct: "cd \(plainDocs) && xargs -a \(work)/files.txt stat > /dev/null",
                mount: "cd \(mountDocs) && xargs -a \(work)/files.txt stat > /dev/null")
    _ = try timeShell("grep attachments \(work)/files.txt > \(work)/small.txt")
    if canDrop {
        try compare("open-read-close \(documents) small attachments, cold", cold: true,
                    direct: "cd \(plainDocs) && xargs -a \(work)/small.txt cat > /dev/null",
                    mount: "cd \(mountDocs) && xargs -a \(work)/small.txt cat > /dev/null")
    }
    try compare("open-read-close \(documents) small attachments, warm",
                direct: "cd \(plainDocs) && xargs -a \(work)/small.txt cat > /dev/null",
                mount: "cd \(mountDocs) && xargs -a \(work)/small.txt cat > /dev/null")

    print(String(repeating: "-", count: 96))
    let peak = mountProcess(of: db.path).map(peakRSS) ?? 0
    if peak > 0 { row("peak RSS of the mount process", "\(peak / 1024) kB") }
}

/// The process of the `sofa mount` serving the database at `path`, while one runs.
func mountProcess(of path: String) -> Int32? {
    // "[s]ofa": the shell running pgrep has the pattern in its own command line, but no match.
    let pids = (try? shellOutput("pgrep -f '[s]ofa mount \(path) '")) ?? ""
    return pids.split(separator: "\n").first.flatMap { Int32($0) }
}

/// Whether process `pid` still runs: not when it is gone, nor when it has ended and waits to be
/// reaped (a zombie: where nothing reaps orphans, it stays one).
func isRunning(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first != "Z"
}

/// The peak RSS (bytes) of process `pid`; 0 when it has ended.
func peakRSS(_ pid: Int32) -> Int {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM") }),
          let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return 0 }
    return kib * 1024
}

func shellOutput(_ command: String) throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/sh")
    process.arguments = ["-c", command]
    let pipe = Pipe()
    process.standardOutput = pipe
    try process.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return String(decoding: data, as: UTF8.self)
}
