import CLinux
import DocumentModel
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Why a design-document function could not give an answer.
public enum QueryServerError: Error, CustomStringConvertible, Sendable {
    /// The query server answered `["error", error, reason]`: the function threw, or did not compile.
    case function(error: String, reason: String)
    /// No answer within the time limit: the process was killed.
    case timeout(seconds: Double)
    /// The process ended (a crash, or its heap limit) or answered something that is not JSON.
    case failed(String)
    /// No query server could be started.
    case unavailable(String)

    public var description: String {
        switch self {
        case .function(let error, let reason): "\(error): \(reason)"
        case .timeout(let seconds): "the JavaScript function did not return within \(seconds) s (os_process_timeout)"
        case .failed(let reason): "the query server failed: \(reason)"
        case .unavailable(let reason): "no JavaScript query server: \(reason)"
        }
    }
}

/// One query-server process (`sofa-js`, or CouchDB's `couchjs`, or any program that speaks
/// CouchDB's query-server protocol): JSON commands written one per line to its stdin, one
/// JSON answer per line read from its stdout. `["log", …]` lines are passed to `log`.
/// Not thread-safe: a `QueryServerPool` lends a process to one caller at a time.
public final class QueryServerProcess {
    public let pid: pid_t
    private let input: Int32, output: Int32
    /// Bytes read and not yet returned as lines, from `bufferStart`.
    private var buffer: [UInt8] = []
    private var bufferStart = 0
    /// Where each read lands, kept: a call should not allocate 64 KiB.
    private var chunk = [UInt8](repeating: 0, count: 64 * 1024)
    /// The revision of each design document sent with `["ddoc", "new", …]`.
    var loadedDesignDocuments: [String: String] = [:]
    private(set) var alive = true
    /// Reaped already (its pid may belong to another process now: never signal it again).
    private var reaped = false

    public init(command: [String]) throws {
        guard let program = command.first else { throw QueryServerError.unavailable("no command") }
        _ = QueryServerProcess.ignoreBrokenPipes
        var toChild: [Int32] = [0, 0], fromChild: [Int32] = [0, 0]
        guard pipe2(&toChild, O_CLOEXEC) == 0 else { throw QueryServerError.unavailable("pipe: \(String(cString: strerror(errno)))") }
        guard pipe2(&fromChild, O_CLOEXEC) == 0 else {
            close(toChild[0]); close(toChild[1])
            throw QueryServerError.unavailable("pipe: \(String(cString: strerror(errno)))")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, toChild[0], 0)
        posix_spawn_file_actions_adddup2(&actions, fromChild[1], 1)
        let arguments = command.map { strdup($0) } + [nil]
        defer { for argument in arguments { free(argument) } }
        var child: pid_t = 0
        let status = posix_spawnp(&child, program, &actions, nil, arguments, environ)
        close(toChild[0])
        close(fromChild[1])
        guard status == 0 else {
            close(toChild[1]); close(fromChild[0])
            throw QueryServerError.unavailable("cannot start \(program): \(String(cString: strerror(status)))")
        }
        pid = child
        input = toChild[1]
        output = fromChild[0]
    }

    deinit { stop() }

    /// Writing to a query server that has died must fail with EPIPE, not end this program.
    private static let ignoreBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN) }()

    /// Ends the process (killed: it may be stuck in a loop) and reaps it.
    public func stop() {
        guard alive else { return }
        alive = false
        close(input)
        close(output)
        guard !reaped else { return }
        kill(pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        reaped = true
    }

    /// Sends one command and returns its answer; `["log", message]` lines on the way go to `log`.
    /// Throws `.function` for an `["error", …]` answer; any other failure stops the process.
    public func call(_ command: JSONValue, timeout: Double, log: (String) -> Void = { _ in }) throws -> JSONValue {
        guard alive else { throw QueryServerError.failed("the process has ended") }
        do {
            try write(command.serialized() + [0x0A])
            let answer = try readAnswer(until: Date().addingTimeInterval(timeout), timeout: timeout, log: log)
            if case .array(let items) = answer, items.first == "error", items.count == 3 {
                let reason = items[2].stringValue ?? items[2].jsonString()
                // Out of memory is the process's failure, not the function's (CouchDB's
                // os_process_error), and the process goes: SpiderMonkey keeps the heap it took.
                if reason.contains("out of memory") { throw QueryServerError.failed("the function ran out of memory (\(reason))") }
                throw QueryServerError.function(error: items[1].stringValue ?? items[1].jsonString(), reason: reason)
            }
            return answer
        } catch let error as QueryServerError {
            if case .function = error {} else { stop() }
            throw error
        }
    }

    /// Its resident memory in bytes (`/proc/PID/statm`), or nil when it cannot be read.
    public var residentBytes: Int? {
        guard alive, let text = try? String(contentsOfFile: "/proc/\(pid)/statm", encoding: .utf8) else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return nil }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
    }

    private func write(_ bytes: [UInt8]) throws {
        if let problem = QueryServerProcess.writeAll(input, bytes) {
            throw QueryServerError.failed("it stopped reading (\(problem))\(exitDescription())")
        }
    }

    /// Writes every byte to `fd`; the reason when it cannot.
    private static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> String? {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if written < 0 {
                if errno == EINTR { continue }
                return String(cString: strerror(errno))
            }
            offset += written
        }
        return nil
    }

    /// Sends several commands at once, each given as its JSON text: a thread writes them while
    /// the answers are read, so the query server works on the next ones while this process
    /// handles those already back (one wait per batch, not per command, and both processes
    /// busy at once). Returns the answers in order, each within `timeout` of the one before;
    /// an `["error", …]` answer is thrown once every answer is read, so the stream stays in step.
    public func callPipelined(_ commands: [[UInt8]], timeout: Double, log: (String) -> Void = { _ in }) throws -> [JSONValue] {
        guard alive else { throw QueryServerError.failed("the process has ended") }
        guard !commands.isEmpty else { return [] }
        var payload: [UInt8] = []
        payload.reserveCapacity(commands.reduce(0) { $0 + $1.count + 1 })
        for command in commands {
            payload += command
            payload.append(0x0A)
        }
        let writerFailure = Locked<String?>(nil)
        let written = DispatchSemaphore(value: 0)
        let fd = input
        Thread.detachNewThread { [payload] in
            if let problem = QueryServerProcess.writeAll(fd, payload) { writerFailure.withLock { $0 = problem } }
            written.signal()
        }
        var answers: [JSONValue] = []
        var refusal: QueryServerError?
        do {
            for _ in commands {
                let answer = try readAnswer(until: Date().addingTimeInterval(timeout), timeout: timeout, log: log)
                if case .array(let items) = answer, items.first == "error", items.count == 3 {
                    refusal = refusal ?? .function(error: items[1].stringValue ?? items[1].jsonString(),
                                                   reason: items[2].stringValue ?? items[2].jsonString())
                }
                answers.append(answer)
            }
        } catch {
            // Killed first: the writer, if it still waits on a full pipe, then fails and ends
            // before its descriptor is closed.
            kill(pid, SIGKILL)
            written.wait()
            stop()
            throw error
        }
        written.wait()
        if let problem = writerFailure.withLock({ $0 }) {
            stop()
            throw QueryServerError.failed("it stopped reading (\(problem))")
        }
        if let refusal { throw refusal }
        return answers
    }

    /// The next answer line as JSON; `["log", …]` lines on the way go to `log`.
    private func readAnswer(until deadline: Date, timeout: Double, log: (String) -> Void) throws -> JSONValue {
        while true {
            let line = try readLine(until: deadline, timeout: timeout)
            let answer: JSONValue
            do { answer = try JSONParser.parse(line) } catch {
                throw QueryServerError.failed("it answered something that is not JSON: \(String(decoding: line.prefix(200), as: UTF8.self))")
            }
            if case .array(let items) = answer, items.first == "log", items.count == 2 {
                log(items[1].stringValue ?? items[1].jsonString())
                continue
            }
            return answer
        }
    }

    /// The next line of the answer, without its newline.
    private func readLine(until deadline: Date, timeout: Double) throws -> [UInt8] {
        while true {
            if let newline = buffer[bufferStart...].firstIndex(of: 0x0A) {
                let line = Array(buffer[bufferStart..<newline])
                bufferStart = newline + 1
                if bufferStart == buffer.count {
                    buffer.removeAll(keepingCapacity: true)
                    bufferStart = 0
                }
                return line
            }
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { throw QueryServerError.timeout(seconds: timeout) }
            var poller = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(min(remaining * 1000 + 1, Double(Int32.max))))
            if ready < 0 {
                if errno == EINTR { continue }
                throw QueryServerError.failed("poll: \(String(cString: strerror(errno)))")
            }
            if ready == 0 { continue }
            let count = chunk.withUnsafeMutableBytes { read(output, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw QueryServerError.failed("read: \(String(cString: strerror(errno)))")
            }
            if count == 0 { throw QueryServerError.failed("it ended\(exitDescription())") }
            buffer.append(contentsOf: chunk[..<count])
        }
    }

    /// How the process ended, once it has (it is reaped then; `stop` closes the pipes).
    private func exitDescription() -> String {
        var status: Int32 = 0
        guard waitpid(pid, &status, WNOHANG) == pid else { return "" }
        reaped = true
        let signal = status & 0x7F
        return signal == 0 ? " (exit status \((status >> 8) & 0xFF))" : " (signal \(signal))"
    }
}

/// Query-server processes shared by every database of this program, lent one caller at a
/// time and kept between calls (a process remembers the design documents it was given).
public final class QueryServerPool: @unchecked Sendable {
    // Sendable invariant: `idle` is guarded by `lock`; a lent process belongs to its borrower.
    public static let shared = QueryServerPool()

    /// Seconds a function may run before its process is killed (CouchDB's `os_process_timeout`).
    public let timeout: Double
    private let lock = NSLock()
    private var idle: [QueryServerProcess] = []
    private let keep = 4
    /// A process that has grown past this is not kept for the next caller but ended, so that
    /// the memory a large view or a greedy function took returns to the machine: an idle
    /// `sofa-js` holds ~18 MB, one that has mapped a document of a few MB ~170 MB, and
    /// SpiderMonkey gives nothing back once taken (measured by hand).
    public static let largestKept = 64 << 20

    /// The processes kept for the next caller (for status and tests).
    public var idleProcessIDs: [pid_t] { lock.withLock { idle.map(\.pid) } }

    init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        timeout = environment["SOFA_QUERY_SERVER_TIMEOUT"].flatMap(Double.init) ?? 5
    }

    /// The command that starts a JavaScript query server: `SOFA_QUERY_SERVER_JAVASCRIPT` (or
    /// CouchDB's own `COUCHDB_QUERY_SERVER_JAVASCRIPT`) when set, split at spaces as CouchDB
    /// does; else `sofa-js` beside this program, else on the PATH.
    public static func javascriptCommand(environment: [String: String] = ProcessInfo.processInfo.environment) -> [String] {
        for name in ["SOFA_QUERY_SERVER_JAVASCRIPT", "COUCHDB_QUERY_SERVER_JAVASCRIPT"] {
            if let command = environment[name]?.split(separator: " ").map(String.init), !command.isEmpty { return command }
        }
        // No /proc: sofa-js is looked for on PATH instead.
        if let executable = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            let beside = (executable as NSString).deletingLastPathComponent + "/sofa-js"
            if access(beside, X_OK) == 0 { return [beside] }
        }
        return ["sofa-js"]
    }

    /// Runs `body` with a process of its own: one from the pool, or a new one.
    public func withProcess<T>(_ body: (QueryServerProcess) throws -> T) throws -> T {
        let process = try lock.withLock { idle.popLast() } ?? QueryServerProcess(command: QueryServerPool.javascriptCommand())
        defer {
            if process.alive, (process.residentBytes ?? 0) <= QueryServerPool.largestKept {
                let kept = lock.withLock { () -> Bool in
                    guard idle.count < keep else { return false }
                    idle.append(process)
                    return true
                }
                if !kept { process.stop() }
            } else {
                process.stop()
            }
        }
        return try body(process)
    }

    /// Runs a design-document function: `["ddoc", id, path, arguments]`, sending the design
    /// document first to a process that does not have this revision of it.
    public func run(designDocument id: String, revision: String, body: JSONValue, path: [String], arguments: [JSONValue],
                    log: (String) -> Void = { _ in }) throws -> JSONValue {
        try withDesignDocument(id, revision: revision, body: body, log: log) { process in
            try process.call(["ddoc", .string(id), .array(path.map(JSONValue.string)), .array(arguments)], timeout: timeout, log: log)
        }
    }

    /// Runs `body` with a process that has this revision of the design document (sent first
    /// when it has not): for exchanges of several commands, such as a list function's rows.
    public func withDesignDocument<T>(_ id: String, revision: String, body: JSONValue, log: (String) -> Void = { _ in },
                                      _ work: (QueryServerProcess) throws -> T) throws -> T {
        try withProcess { process in
            if process.loadedDesignDocuments[id] != revision {
                _ = try process.call(["ddoc", "new", .string(id), body], timeout: timeout, log: log)
                process.loadedDesignDocuments[id] = revision
            }
            return try work(process)
        }
    }
}
