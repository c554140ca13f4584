import DocumentModel
import DocumentStore
import Foundation
import Testing

/// A fresh directory under /tmp, removed when the value is released.
public final class TemporaryDirectory: @unchecked Sendable {
    public let path: String

    public init(_ label: String = "sofa-test") {
        var template = Array("/tmp/\(label)-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("mkdtemp failed: \(errno)") }
        path = String(cString: made)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    public func appending(_ name: String) -> String { "\(path)/\(name)" }

    /// A new, empty database `NAME.sofa` here, made by the real `sofa create`; its path.
    public func newDatabase(_ name: String) throws -> String {
        let database = appending("\(name).sofa")
        let made = try sofa("create", database)
        guard made.succeeded else { throw SofaError.invalidArgument("sofa create \(database): \(made.stderr)") }
        return database
    }

    /// A new database in this directory.
    public func makeDatabase(_ name: String = "test.sofa", revsLimit: Int = Tuning.defaultRevsLimit) throws -> Database {
        try Database.create(at: appending(name), revsLimit: revsLimit)
    }
}

/// The root of this package's checkout (where Package.swift is).
public let packageRoot: String = {
    var url = URL(fileURLWithPath: #filePath)
    for _ in 0..<3 { url.deleteLastPathComponent() }
    return url.path
}()

/// `../shared/fixtures` beside the checkout.
public let fixturesDirectory = packageRoot + "/../shared/fixtures"

/// The `sofa` binary built beside the test bundle.
public let sofaBinary: String = {
    let executable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: executable).deletingLastPathComponent().appendingPathComponent("sofa").path
}()

/// What a finished child process did.
public struct ProcessResult: Sendable {
    public let status: Int32
    /// The signal that killed it, if one did.
    public let signal: Int32?
    public let stdout: String
    public let stderr: String
    /// Peak resident set size in bytes, when it was measured (`measureMemory`, or
    /// `ServedDatabases.stop()`), else 0. Not from the rusage of wait4: Linux starts a spawned
    /// child's peak at its parent's (the test runner's), which says nothing about the child.
    public var maxRSS: Int = 0

    public var succeeded: Bool { status == 0 && signal == nil }
}

/// A child process started with posix_spawn; stdout and stderr go to files.
/// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34), which Swift's Glibc module does not export.
private let closeFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
        fatalError("glibc 2.34 or later is needed (posix_spawn_file_actions_addclosefrom_np)")
    }
    return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
}()

public final class ChildProcess: @unchecked Sendable {
    public let pid: pid_t
    private let outputPath: String
    private let errorPath: String
    private let keepOutput: Bool

    /// Where GNU time writes the peak RSS of a measured command.
    private let memoryReport: String?

    /// Starts `arguments[0]` (a path) with `arguments`. `stdin` is a path (default /dev/null);
    /// `stdout` a path to write to (default: captured). With `measureMemory` the command runs
    /// under GNU time, which reports its true peak RSS (signals then reach time, not the command).
    public init(_ arguments: [String], stdin: String = "/dev/null", stdout: String? = nil, environment: [String: String] = [:],
                measureMemory: Bool = false) throws {
        let scratch = TemporaryDirectory("sofa-child")
        memoryReport = measureMemory ? scratch.appending("rss") : nil
        let arguments = memoryReport.map { ["/usr/bin/time", "-f", "%M", "-o", $0] + arguments } ?? arguments
        outputPath = stdout ?? scratch.appending("out")
        errorPath = "/tmp/sofa-child-err-\(UUID().uuidString)"
        keepOutput = stdout == nil
        // Keep the scratch directory alive until the process is collected.
        self.scratch = scratch
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, errorPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        // Nothing else of this process's: tests run in parallel, and a file another test has open
        // in a mount, inherited by this child, would keep that mount busy (its unmount then waits
        // for this child, which may wait for that test).
        _ = closeFrom(&actions, 3)
        var env = ProcessInfo.processInfo.environment
        for (key, value) in environment { env[key] = value }
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = env.map { strdup("\($0)=\($1)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        // A clean signal mask and default handlers: a test thread's blocked signals would
        // otherwise be inherited, and a child like socat would never see SIGTERM.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGPIPE] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let code = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, envp)
        guard code == 0 else { throw SofaError.io(operation: "spawn", path: arguments[0], errno: code) }
        self.pid = pid
    }

    private let scratch: TemporaryDirectory

    public func kill(_ signal: Int32 = SIGKILL) { Glibc.kill(pid, signal) }

    /// Whether the process has ended (it may not be collected yet).
    public var hasEnded: Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return true }
        return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
    }

    /// What the process wrote to standard error so far.
    public var errorOutput: String { (try? String(contentsOfFile: errorPath, encoding: .utf8)) ?? "" }

    /// Waits for the process to end.
    public func wait() -> ProcessResult {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let signaled = (status & 0x7F) != 0 && (status & 0x7F) != 0x7F
        let output = keepOutput ? ((try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "") : ""
        let error = (try? String(contentsOfFile: errorPath, encoding: .utf8)) ?? ""
        unlink(errorPath)
        var result = ProcessResult(status: signaled ? -1 : (status >> 8) & 0xFF, signal: signaled ? status & 0x7F : nil,
                                   stdout: output, stderr: error)
        if let memoryReport {
            // The last line: GNU time writes "Command exited with non-zero status N" before it.
            let kilobytes = (try? String(contentsOfFile: memoryReport, encoding: .utf8))?.split(separator: "\n").last.flatMap { Int($0) }
            result.maxRSS = (kilobytes ?? 0) * 1024
        }
        return result
    }
}

/// Runs `sofa` with `arguments` and waits for it.
@discardableResult
public func sofa(_ arguments: String..., stdin: String = "/dev/null", stdout: String? = nil,
                 measureMemory: Bool = false) throws -> ProcessResult {
    try sofa(arguments, stdin: stdin, stdout: stdout, measureMemory: measureMemory)
}

@discardableResult
public func sofa(_ arguments: [String], stdin: String = "/dev/null", stdout: String? = nil,
                 measureMemory: Bool = false) throws -> ProcessResult {
    try ChildProcess([sofaBinary] + arguments, stdin: stdin, stdout: stdout, measureMemory: measureMemory).wait()
}

/// A running process's peak RSS in bytes (VmHWM), or nil once it is gone.
public func peakRSS(of pid: pid_t) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
          let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
          let kilobytes = Int(line.dropFirst(6).trimmingCharacters(in: .whitespaces).split(separator: " ")[0]) else { return nil }
    return kilobytes * 1024
}

/// Runs a shell command line (for mount, dd and friends) and waits.
@discardableResult
public func shell(_ command: String) throws -> ProcessResult {
    try ChildProcess(["/bin/sh", "-c", command]).wait()
}

/// Writes `count` bytes of a deterministic, incompressible-looking pattern to `path`
/// in 1 MiB chunks, and returns their SHA-1 key.
@discardableResult
public func writePatternFile(_ path: String, count: Int64, seed: UInt64 = 1) throws -> BlobKey {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    guard fd >= 0 else { throw SofaError.io(operation: "create", path: path, errno: errno) }
    defer { close(fd) }
    let digest = MessageDigest(.sha1)
    var state = seed &* 0x9E37_79B9_7F4A_7C15 | 1
    var chunk = [UInt64](repeating: 0, count: (1 << 20) / 8)
    var remaining = count
    while remaining > 0 {
        for index in chunk.indices {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17
            chunk[index] = state
        }
        let size = Int(min(remaining, Int64(1 << 20)))
        try chunk.withUnsafeBytes { buffer in
            let slice = UnsafeRawBufferPointer(rebasing: buffer[0..<size])
            digest.update(slice)
            guard write(fd, slice.baseAddress, size) == size else { throw SofaError.io(operation: "write", path: path, errno: errno) }
        }
        remaining -= Int64(size)
    }
    return BlobKey(digest: digest.finalize())
}

/// Whether this process may mount file systems (tests that need it fail, not skip, without it).
public var isRoot: Bool { geteuid() == 0 }

/// Under --sanitize=thread, child processes report races (and crashes) on their stderr:
/// each report fails the test that started the process.
public func recordSanitizerReports(_ result: ProcessResult, from what: String) {
    guard let start = result.stderr.range(of: "WARNING: ThreadSanitizer") else { return }
    // Both accesses' stacks, without each frame's address and build id (half of every line):
    // a report cut before the second stack (4,000 characters) could not be told apart.
    let report = result.stderr[start.lowerBound...].split(separator: "\n", omittingEmptySubsequences: false).map { line in
        line.replacing(#/ \([^()]*\+0x[0-9a-f]+\)( \(BuildId: [0-9a-f]+\))?/#, with: "")
    }.joined(separator: "\n")
    Issue.record("ThreadSanitizer report from \(what):\n\(report.prefix(24_000))")
}

/// Polls `condition` until it holds or `seconds` pass; true if it held. Tests wait for what
/// happens on another process's schedule this way rather than sleeping a guessed time.
public func waitUntil(_ seconds: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try condition() { return true }
        usleep(20_000)
    }
    return try condition()
}

extension Database {
    /// Saves `properties` (and attachments) as the next revision of `id`.
    @discardableResult
    public func put(_ id: String, _ properties: JSONObject, attachments: [String: [UInt8]] = [:]) throws -> Revision {
        var draft = try newRevision(of: id)
        draft.properties = properties
        for (name, bytes) in attachments { try draft.setAttachment(name, data: bytes) }
        return try save(draft)
    }
}

/// Whether this test process runs under ThreadSanitizer (its runtime is linked in): the sofa
/// it starts is then the sanitized build too, about ten times slower.
public let underThreadSanitizer: Bool = dlsym(dlopen(nil, RTLD_NOW), "__tsan_init") != nil
