import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench deferred`: deferred bodies read through the mount from `sofa serve` on
/// 127.0.0.1: the first byte of a 1 GiB body, `cat` of it against `curl -o FILE` of the
/// same body from the same server, `head -c 4096` of each of 100 deferred 50 MB bodies and
/// 2,000 scattered 4 KiB reads of the 1 GiB one, with the bytes the server sent (its
/// `/proc/PID/io` write count); `cat` of 20 of the 50 MB bodies with a 200 MB cache limit,
/// with the peak disk the bodies took; and the mount's peak RSS.
///
/// `--attachment-mib` sizes the big body (1024), `--documents` the number of 50 MB bodies (100).
func deferredBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("deferred", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let size = Int64(options.attachmentMiB) << 20
    let smallCount = options.documents == 100_000 ? 100 : options.documents
    let smallSize: Int64 = 50_000_000
    print("Sofa deferred-body benchmark: one \(options.attachmentMiB) MiB body, \(smallCount) bodies of 50 MB; "
          + "sofa serve on 127.0.0.1; in \(work)")
    print(String(repeating: "-", count: 104))

    // The server's database: the big body, and the small ones (each different).
    let source = try Database.create(at: "\(work)/source.sofa")
    let scratch = "\(work)/body.bin"
    try writeSource(scratch, size: size, seed: 1)
    var draft = try source.newRevision(of: "big")
    try draft.setAttachment("big.bin", contentsOf: scratch)
    try source.save(draft)
    for index in 0..<smallCount {
        try writeSource(scratch, size: smallSize, seed: UInt64(index) + 2)
        var small = try source.newRevision(of: String(format: "small-%03d", index))
        try small.setAttachment("body", contentsOf: scratch)
        try source.save(small)
    }
    let server = try ServeProcess(sofa: sofa, databases: [source.path], work: work)
    defer { server.stop() }
    let url = "http://127.0.0.1:\(server.port)/source"
    func bytesSent() -> Int64 { processIO(server.pid)["wchar"] ?? 0 }

    _ = try timeShell("\(sofa) create \(work)/deferred.sofa > /dev/null && \(sofa) pull \(work)/deferred.sofa \(url) --no-download-attachments > /dev/null")
    let mountPoint = "\(work)/mnt"
    try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
    let big = "\(mountPoint)/docs/big/attachments/big.bin"
    /// Forgets every byte fetched: the bodies are all deferred again.
    func forget() throws {
        _ = try timeShell("\(sofa) purge-attachment \(work)/deferred.sofa big big.bin > /dev/null 2>&1 || true")
        _ = try timeShell("rm -f \(work)/deferred.sofa/attachments/tmp/*")
    }
    var mountPeak = 0

    // First byte, each time with nothing of the body here.
    var firstByte: [Double] = []
    for _ in 0..<rounds {
        try forget()
        let mount = try MountProcess(sofa: sofa, database: "\(work)/deferred.sofa", at: mountPoint, remote: url)
        firstByte.append(try timeShell("head -c 1 \(big) > /dev/null"))
        mountPeak = max(mountPeak, mount.stop())
    }
    row("first byte of a deferred \(options.attachmentMiB) MiB body", String(format: "%8.1f ms", median(firstByte) * 1000))

    // cat of the whole body, against curl -o FILE on the same disk, alternating.
    var catTimes: [Double] = [], curlTimes: [Double] = []
    for _ in 0..<3 {
        curlTimes.append(try timeShell("curl -sf -o \(work)/curl.out \(url)/big/big.bin"))
        unlink("\(work)/curl.out")
        try forget()
        let mount = try MountProcess(sofa: sofa, database: "\(work)/deferred.sofa", at: mountPoint, remote: url)
        catTimes.append(try timeShell("cat \(big) > /dev/null"))
        mountPeak = max(mountPeak, mount.stop())
    }
    row("cat of it, deferred", mibps(size, median(catTimes)), "curl -o FILE " + mibps(size, median(curlTimes)),
        "ratio " + ratio(median(curlTimes) / median(catTimes)))

    // head -c 4096 of every small body.
    try forget()
    var mount = try MountProcess(sofa: sofa, database: "\(work)/deferred.sofa", at: mountPoint, remote: url)
    var before = bytesSent()
    let heads = try timeShell("for f in \(mountPoint)/docs/small-*/attachments/body; do head -c 4096 \"$f\" > /dev/null; done")
    let headBytes = bytesSent() - before
    let whole = Int64(smallCount) * smallSize
    row("head -c 4096 of \(smallCount) deferred 50 MB bodies", String(format: "%8.2f s", heads),
        "server sent \(formatMB(headBytes)) of \(formatMB(whole))", String(format: "%.3f %%", Double(headBytes) * 100 / Double(whole)))

    // 2,000 scattered 4 KiB reads of the big body, timed one by one.
    before = bytesSent()
    let fd = open(big, O_RDONLY)
    precondition(fd >= 0, "cannot open \(big)")
    var buffer = [UInt8](repeating: 0, count: 4096)
    var latencies: [Double] = []
    var generator = SystemRandomNumberGenerator()
    for _ in 0..<2000 {
        let offset = Int64.random(in: 0..<(size / 4096), using: &generator) * 4096
        let start = now()
        precondition(pread(fd, &buffer, 4096, off_t(offset)) == 4096, "a scattered read failed")
        latencies.append(now() - start)
    }
    close(fd)
    let scatteredBytes = bytesSent() - before
    latencies.sort()
    row("2,000 scattered 4 KiB reads of it", String(format: "p50 %.2f ms", latencies[1000] * 1000),
        String(format: "p99 %.2f ms", latencies[1980] * 1000),
        "server sent \(formatMB(scatteredBytes))", String(format: "%.1f %% of the body", Double(scatteredBytes) * 100 / Double(size)))
    mountPeak = max(mountPeak, mount.stop())

    // cat of 1 GB of the 50 MB bodies with a cache limit of 200 MB: the disk the bodies take, sampled.
    try forget()
    let limit: Int64 = 200_000_000
    let catCount = min(smallCount, 20)
    _ = try timeShell("\(sofa) cache \(work)/deferred.sofa --limit \(limit) > /dev/null")
    mount = try MountProcess(sofa: sofa, database: "\(work)/deferred.sofa", at: mountPoint, remote: url)
    let sampler = DiskSampler(folder: "\(work)/deferred.sofa/attachments")
    let catAll = try timeShell("for i in $(seq -f %03g 0 \(catCount - 1)); do cat \(mountPoint)/docs/small-$i/attachments/body > /dev/null; done")
    let peakDisk = sampler.stop()
    mountPeak = max(mountPeak, mount.stop())
    _ = try timeShell("\(sofa) cache \(work)/deferred.sofa --limit none > /dev/null")
    row("cat of \(catCount) 50 MB bodies, \(formatMB(limit)) cache", mibps(Int64(catCount) * smallSize, catAll),
        "peak disk \(formatMB(peakDisk))", String(format: "limit %+.0f KiB", Double(peakDisk - limit) / 1024))
    print(String(repeating: "-", count: 104))
    row("mount peak RSS (all of the above)", String(format: "%.0f MB", Double(mountPeak) / 1e6))
}

/// Samples, every 5 ms on its own thread, the bytes the files of a folder and its `tmp`
/// take on disk (blocks, so sparse files count what they hold); `stop` returns the peak.
final class DiskSampler: @unchecked Sendable {
    // Sendable invariant: `peak` and `running` are guarded by `lock`.
    private let lock = NSLock()
    private var peak: Int64 = 0
    private var running = true
    private let done = DispatchSemaphore(value: 0)

    init(folder: String) {
        Thread.detachNewThread { [self] in
            while lock.withLock({ running }) {
                let bytes = DiskSampler.bytes(in: folder) + DiskSampler.bytes(in: folder + "/tmp")
                lock.withLock { peak = max(peak, bytes) }
                usleep(5_000)
            }
            done.signal()
        }
    }

    func stop() -> Int64 {
        lock.withLock { running = false }
        done.wait()
        return lock.withLock { peak }
    }

    static func bytes(in folder: String) -> Int64 {
        guard let directory = opendir(folder) else { return 0 }
        defer { closedir(directory) }
        var total: Int64 = 0
        while let entry = readdir(directory) {
            var info = stat()
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if fstatat(dirfd(directory), name, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFREG {
                total += Int64(info.st_blocks) * 512
            }
        }
        return total
    }
}

func formatMB(_ bytes: Int64) -> String { String(format: "%.1f MB", Double(bytes) / 1e6) }

/// The counters of `/proc/PID/io` (rchar, wchar, …).
func processIO(_ pid: pid_t) -> [String: Int64] {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/io", encoding: .utf8) else { return [:] }
    var counters: [String: Int64] = [:]
    for line in text.split(separator: "\n") {
        let parts = line.split(separator: ":")
        if parts.count == 2 { counters[String(parts[0])] = Int64(parts[1].trimmingCharacters(in: .whitespaces)) }
    }
    return counters
}

/// `sofa mount --foreground` as a child process, mounted when init returns.
final class MountProcess {
    let pid: pid_t
    let mountPoint: String

    init(sofa: String, database: String, at mountPoint: String, remote: String?) throws {
        self.mountPoint = mountPoint
        let arguments = [sofa, "mount", database, mountPoint, "--foreground"] + (remote.map { ["--remote", $0] } ?? [])
        let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        guard posix_spawn(&pid, sofa, nil, nil, argv, environ) == 0 else { throw SofaError.invalidArgument("cannot start sofa mount") }
        self.pid = pid
        for _ in 0..<1500 {
            if (KernelFile.text("/proc/mounts") ?? "").contains(" \(mountPoint) ") { return }
            usleep(10_000)
        }
        kill(pid, SIGKILL)
        throw SofaError.invalidArgument("sofa mount did not mount")
    }

    /// Unmounts and waits; returns the peak RSS (VmHWM) the mount had.
    func stop() -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let peak = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }
            .flatMap { Int($0.dropFirst(6).trimmingCharacters(in: .whitespaces).dropLast(3).trimmingCharacters(in: .whitespaces)) } ?? 0
        _ = try? timeShell("fusermount3 -u \(mountPoint)")
        var code: Int32 = 0
        waitpid(pid, &code, 0)
        return peak * 1024
    }
}
