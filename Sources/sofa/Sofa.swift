import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation
import Logging

/// `sofa`: the command line of Sofa databases, in the spirit of Couchbase's `cblite`.
/// Every command takes the database path first.
@main
struct Sofa: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sofa",
        abstract: "A document database with revision histories and attachments, used through the file system.",
        discussion: """
            Every command takes -v/--verbose (log what happens; -vv: debug) and -q/--quiet (errors only, \
            no progress lines). Environment: SOFA_LOG_LEVEL=trace|debug|info|notice|warning|error.

            Encrypted databases (sofa create --encrypt): every command opens one with --key-file PATH \
            (its key file, or a file holding its passphrase) or --key-fd N (read from that descriptor), \
            or asks for its passphrase on the terminal.
            """,
        version: SofaVersion.current,
        subcommands: [
            Create.self, Info.self, List.self, Cat.self, Find.self, Index.self, Put.self, Remove.self, Revs.self,
            Attach.self, Detach.self, CatAttachment.self, Blob.self, Compact.self, Encrypt.self, Decrypt.self, Rekey.self, Check.self, Export.self, Import.self, Mount.self, MountGuard.self, Serve.self, Pull.self, Push.self, Sync.self, Download.self, DownloadRules.self, Pin.self, Unpin.self, Cache.self, PurgeAttachment.self, Copy.self, Cp.self, Snapshot.self,
        ]
    )

    static func main() {
        let arguments = Verbosity.take(from: Array(CommandLine.arguments.dropFirst()))
        LoggingSystem.bootstrap { label in
            OneLineLogHandler(label: label, level: Verbosity.logLevel
                ?? ProcessInfo.processInfo.environment["SOFA_LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .warning)
        }
        do {
            var command: ParsableCommand
            if MountHelper.names.contains(URL(fileURLWithPath: CommandLine.arguments[0]).lastPathComponent) {
                guard let translated = try MountHelper.translate(arguments) else { return }
                command = try parseAsRoot(try KeyOptions.take(from: translated))
            } else {
                command = try parseAsRoot(try KeyOptions.take(from: arguments))
            }
            try command.run()
        } catch {
            exit(withError: error)
        }
    }
}

let log = Logger(label: "sofa")

/// The options every command takes (`Verbosity` and `KeyOptions` read them from the command
/// line before the command is parsed, anywhere before `--`): declared here too so that each
/// command's `--help`, its manual page and the shell completions show them.
struct GlobalOptions: ParsableArguments {
    @Flag(name: .shortAndLong, help: "Log what happens on standard error (-vv: debug).") var verbose: Int
    @Flag(name: .shortAndLong, help: "Errors only: no progress lines.") var quiet = false
    @Option(help: ArgumentHelp("An encrypted database's key file, or a file whose first line is its passphrase.", valueName: "path"),
            completion: .file())
    var keyFile: String?
    @Option(help: ArgumentHelp("Read the key (or passphrase) from this open file descriptor.", valueName: "n")) var keyFd: Int?
}

/// `-v`/`--verbose` (twice: debug) and `-q`/`--quiet`, accepted anywhere before `--`
/// by every command: they say how much Sofa tells on standard error, never what a
/// command prints as its result.
enum Verbosity {
    nonisolated(unsafe) private static var level = 0  // set once in main, before any thread

    /// Removes the flags from `arguments`, remembering them.
    static func take(from arguments: [String]) -> [String] {
        var kept: [String] = []
        var passedSeparator = false
        for argument in arguments {
            if argument == "--" { passedSeparator = true }
            switch passedSeparator ? "" : argument {
            case "-v", "--verbose": level += 1
            case "-vv": level += 2
            case "-q", "--quiet": level = -1
            default: kept.append(argument)
            }
        }
        return kept
    }

    /// The log level the flags ask for (nil: SOFA_LOG_LEVEL, or warnings).
    static var logLevel: Logger.Level? {
        switch level {
        case ..<0: .error
        case 0: nil
        case 1: .info
        default: .debug
        }
    }

    /// Progress lines: on a terminal, unless quiet.
    static var showsProgress: Bool { level >= 0 && isatty(STDERR_FILENO) == 1 }
}

/// Catches `signals` for a long-running command (mount, serve, continuous replication):
/// they are blocked in the calling thread, and so in every thread started after it, and
/// a thread of its own takes them with `sigwait` and runs the action.
///
/// Create it first thing, before the command starts threads. (`SIG_IGN` plus a
/// DispatchSource lost the signal when a thread had not blocked it; a `sigaction`
/// handler never ran under ThreadSanitizer while the main thread waited.)
final class SignalWatcher: @unchecked Sendable {
    // Sendable invariant: `action`, `pending` and `cancelled` are guarded by `lock`.
    private let lock = NSLock()
    private var action: (@Sendable () -> Void)?
    private var pending = false
    private var cancelled = false
    private var received: Int32?

    init(_ signals: [Int32]) {
        var set = sigset_t()
        sigemptyset(&set)
        for signalNumber in signals { sigaddset(&set, signalNumber) }
        pthread_sigmask(SIG_BLOCK, &set, nil)
        let waited = set
        Thread.detachNewThread { [self] in
            var set = waited
            var number: Int32 = 0
            while sigwait(&set, &number) == 0 {
                let run = lock.withLock { () -> (@Sendable () -> Void)? in
                    guard !cancelled else { return nil }
                    if received == nil { received = number }
                    if action == nil { pending = true }
                    return action
                }
                run?()
            }
        }
    }

    /// What a signal does from now on; runs at once if one came before.
    func onSignal(_ action: @escaping @Sendable () -> Void) {
        let missed = lock.withLock { () -> Bool in
            self.action = action
            defer { pending = false }
            return pending
        }
        if missed { action() }
    }

    func cancel() { lock.withLock { cancelled = true } }

    /// The first signal that came: what a command stopped by it names and exits with.
    var stoppedBy: Int32? { lock.withLock { received } }

    /// The shell's status for a command stopped by that signal: 128 + its number (130 for
    /// Ctrl-C, 143 for SIGTERM), as a process killed by it would report.
    var exitStatus: Int32 { 128 + (stoppedBy ?? SIGINT) }

    /// The signal's name for messages and `--json` (`SIGINT`, `SIGTERM`, `SIGHUP`).
    var reason: String {
        switch stoppedBy ?? SIGINT {
        case SIGTERM: "SIGTERM"
        case SIGHUP: "SIGHUP"
        default: "SIGINT"
        }
    }
}

/// A subcommand whose failures print as `sofa: <what failed and why>` and exit 1; with
/// `--json` (`printsJSON`) also as `{"ok": false, "error": …, "reason": …}` on standard output,
/// so that a program reading it always gets an answer.
protocol SofaCommand: ParsableCommand {
    func execute() throws
    /// Whether the command was asked for JSON (`--json`).
    var printsJSON: Bool { get }
}

extension SofaCommand {
    var printsJSON: Bool { false }

    func run() throws {
        do {
            try execute()
            // Output that did not arrive (a full disk, a closed pipe) fails the command too.
            if let failure = Output.standardOutputFailure { throw failure }
        } catch let error where !(error is ExitCode || error is CleanExit || error is ValidationError) {
            let failure = CommandFailure(error)
            if printsJSON { Output.line(failure.json.jsonString()) }
            Output.error(failure.reason)
            throw ExitCode(1)
        }
    }
}

/// Why a command failed, for people (`reason`) and programs (`error`, and what was done).
struct CommandFailure {
    let error: String
    var reason: String
    /// What a replication had done when it failed (its counts).
    var partial: JSONValue?

    init(_ error: any Error) {
        switch error {
        case let error as SofaError:
            (self.error, reason) = (error.name, "\(error)")
            if case .notADatabase(let path, "no such file or directory") = error {
                reason += " (`sofa create \(path)` makes an empty one)"
            }
        case let error as ReplicationFailure:
            (self.error, reason, partial) = (error.name, "\(error)", error.partial?.json)
        case let error as JSONParseError:
            (self.error, reason) = ("invalid_json", "\(error)")
        case let error as CouchFormatError:
            (self.error, reason) = (error.error, "\(error)")
        case is MissingStub:
            (self.error, reason) = ("missing_stub", "\(error)")
        default:
            (self.error, reason) = ("error", "\(error)")
        }
    }

    var json: JSONValue {
        var object: JSONObject = ["ok": false, "error": .string(error), "reason": .string(reason)]
        if let partial { object["partial"] = partial }
        return .object(object)
    }
}

/// Writing to the standard streams.
enum Output {
    static func line(_ text: String) {
        write(STDOUT_FILENO, text + "\n")
    }

    static func error(_ text: String) {
        write(STDERR_FILENO, "sofa: \(text)\n")
    }

    static func write(_ fd: Int32, _ text: String) {
        write(fd, Array(text.utf8))
    }

    static func write(_ fd: Int32, _ bytes: [UInt8]) {
        bytes.withUnsafeBytes { writeAll(fd, $0) }
    }

    /// Writes all of `bytes`. A failure on standard output is kept for the end of the
    /// command (`standardOutputFailure`); one on standard error has nowhere to go.
    static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) {
        do {
            try writeFully(fd, bytes, path: fd == STDOUT_FILENO ? "standard output" : "standard error")
        } catch let error as SofaError where fd == STDOUT_FILENO {
            failure.withLock { $0 = $0 ?? error }
        } catch {}
    }

    private static let failure = Locked<SofaError?>(nil)

    /// The first write to standard output that failed, if one did.
    static var standardOutputFailure: SofaError? { failure.withLock { $0 } }

    static func json(_ value: JSONValue) {
        write(STDOUT_FILENO, value.prettyPrinted())
    }
}

/// A progress line on standard error, shown only when it is a terminal.
struct Progress {
    let label: String
    private let enabled = Verbosity.showsProgress
    private var lastUpdate = Date.distantPast

    init(_ label: String) { self.label = label }

    mutating func update(_ count: Int, unit: String) {
        guard enabled, Date().timeIntervalSince(lastUpdate) > 0.1 else { return }
        lastUpdate = Date()
        Output.write(STDERR_FILENO, "\r\(label): \(count) \(unit)\u{1B}[K")
    }

    mutating func update(bytes: Int64) {
        guard enabled, Date().timeIntervalSince(lastUpdate) > 0.1 else { return }
        lastUpdate = Date()
        Output.write(STDERR_FILENO, "\r\(label): \(formatBytes(bytes))\u{1B}[K")
    }

    mutating func update(bytes: Int64, of total: Int64) {
        guard enabled, Date().timeIntervalSince(lastUpdate) > 0.1 else { return }
        lastUpdate = Date()
        let percent = total > 0 ? " (\(done(bytes, of: total)) %)" : ""
        Output.write(STDERR_FILENO, "\r\(label): \(formatBytes(bytes)) of \(formatBytes(total))\(percent)\u{1B}[K")
    }

    private func done(_ bytes: Int64, of total: Int64) -> Int { Int(min(bytes, total) * 100 / total) }

    func finish() {
        if enabled { Output.write(STDERR_FILENO, "\r\u{1B}[K") }
    }
}

/// Options shared by every command that opens a database.
struct DatabaseArgument: ParsableArguments {
    @Argument(help: "The database directory (NAME.sofa).", completion: .directory)
    var database: String

    func open() throws -> Database { try Database.open(at: database) }
}

extension Database {
    /// The revision `rev` of a document, or its current one; errors name what is missing.
    func revision(of id: String, rev: String?) throws -> Revision {
        if let rev { return try revision(RevisionID.parse(rev), of: id) }
        guard let current = try document(withID: id) else { throw SofaError.documentNotFound(id) }
        return current
    }

    /// An attachment of a document's current revision; errors name what is missing.
    func currentAttachment(_ name: String, of id: String) throws -> Attachment {
        guard let attachment = try revision(of: id, rev: nil).attachment(named: name) else {
            throw SofaError.attachmentNotFound(docID: id, name: name)
        }
        return attachment
    }
}

extension Revision {
    /// The document as CouchDB shows it: `_id`, `_rev`, the properties, `_attachments` stubs,
    /// and `_revisions` when a history is given.
    func couchJSON(history: [RevisionID]? = nil) throws -> JSONObject {
        var options = CouchFormat.Options()
        options.revisions = history != nil
        return try CouchFormat.render(self, history: history ?? [revID], options: options, readBody: { _ in [] }).json
    }
}

func parseJSONObject(_ bytes: [UInt8], what: String) throws -> JSONObject {
    let value: JSONValue
    do {
        value = try JSONValue(parsing: bytes)
    } catch {
        throw SofaError.invalidJSON(error)
    }
    guard case .object(let object) = value else {
        throw SofaError.invalidDocument(reason: "\(what) must be a JSON object, not \(value.kindName)")
    }
    return object
}

/// Reads all of standard input (for document bodies, which are small).
func readStandardInput() -> [UInt8] {
    var bytes: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let count = read(STDIN_FILENO, &buffer, buffer.count)
        if count < 0 && errno == EINTR { continue }
        if count <= 0 { return bytes }
        bytes.append(contentsOf: buffer[0..<count])
    }
}

/// "1 document", "2 documents" (or the plural given).
func counted(_ count: Int, _ noun: String, _ plural: String? = nil) -> String {
    "\(count) \(count == 1 ? noun : plural ?? noun + "s")"
}

func formatBytes(_ bytes: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(bytes) B" : String(format: "%.1f", value) + " " + units[unit]
}

/// Lets this process open as many files as the system allows it (the soft limit raised to the
/// hard one): a mount holds a descriptor per open file, a server one per connection.
func raiseDescriptorLimit() {
    var files = rlimit()
    let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    if getrlimit(resource, &files) == 0, files.rlim_cur < files.rlim_max {
        files.rlim_cur = files.rlim_max
        setrlimit(resource, &files)
    }
}
