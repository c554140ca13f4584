import ArgumentParser
import DocumentFS
import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport
import FuseKit
import Replicator

struct Mount: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a database as a directory tree.",
        discussion: """
            /docs/<id>/properties.json and /docs/<id>/attachments/<name>; writes create revisions. \
            Unmount with `fusermount3 -u MOUNTPOINT`, or Ctrl-C / SIGTERM in the foreground: \
            pending saves finish first. A killed mount leaves no dead mount point behind. \
            mount(8) mounts databases too, from /etc/fstab or with `mount -t fuse.sofa DB MOUNTPOINT -o remote=URL,sync`, \
            through /sbin/mount.fuse.sofa (a link to sofa that the package and Scripts/install make). \
            A Couchbase Lite database (APP.cblite2) mounts too, read and write (docs/couchbase-lite.md).
            """)

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "An empty directory to mount on.", completion: .directory) var mountPoint: String
    @Flag(help: "Refuse every change.") var readOnly = false
    @Flag(name: [.short, .customLong("foreground")], help: "Stay in the foreground until unmounted.") var foreground = false
    @Flag(help: "Say in JSON on standard output whether the background mount started ({\"ok\": true, \"mount_point\", \"log\"}) or why not.")
    var json = false
    var printsJSON: Bool { json }
    @Option(name: .short, help: "Mount options, comma-separated: FUSE's (allow_other, auto_unmount, ...), nonempty (mount over files), uid=N, gid=N and umask=OCTAL (the owner and permissions every file shows, as sshfs's).")
    var options: [String] = []
    @Option(help: "Fetch bodies that are not here from this database URL (default: where the database last pulled from).")
    var remote: String?
    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Seconds a read waits for a body being downloaded before failing with EIO.") var fetchTimeout = Tuning.mountFetchTimeout
    @Option(help: ArgumentHelp(
        "Thumbnailers (what file managers start to draw icons) fetch bodies that are not here only up to this size (e.g. 512K, 4M; 0: never; all: any).",
        valueName: "size"))
    var thumbnailFetchMax = "1M"
    @Flag(help: "With --remote: pull from it when mounted (continuously with --continuous).") var pull = false
    @Flag(help: "With --remote: push the revisions made here to it.") var push = false
    @Flag(help: "With --remote: pull and push.") var sync = false
    @Flag(help: "Keep replicating while mounted; edits made offline go out when the remote returns.") var continuous = false
    @OptionGroup(title: "With --pull or --sync: which bodies to download (default: the rules the database's last pull was given)")
    var downloads: DownloadOptions
    @Option(help: "When the database does not exist, create it from this snapshot (.zip) or database, as `sofa copy` does.")
    var seed: String?
    @Flag(help: "Serve every read through the mount, also where the kernel could read a stored body itself (FUSE passthrough).")
    var noPassthrough = false

    /// The `-o` options, one by one. `nonempty` is Sofa's (libfuse 3 has none: it mounts anywhere).
    @OptionGroup var compaction: AutoCompactionOption
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var fuseOptions: [String] { options.flatMap { $0.split(separator: ",").map(String.init) } }

    var directions: [Replicator.Direction] {
        (pull || sync ? [.pull] : []) + (push || sync ? [.push] : [])
    }

    /// The Couchbase Lite database being mounted (its full path), or nil for a Sofa database.
    var couchbaseLite: String? {
        CouchbaseLiteDatabase.isCouchbaseLite(at: db.database) ? URL(fileURLWithPath: db.database).standardizedFileURL.path : nil
    }

    func validate() throws {
        _ = try MountOwnership(fuseOptions)
        if CouchbaseLiteDatabase.isCouchbaseLite(at: db.database), remote != nil || seed != nil || !directions.isEmpty {
            throw ValidationError("a Couchbase Lite database is mounted in step with its own file: --remote, --seed, --pull, --push and --sync are for Sofa databases")
        }
        if !directions.isEmpty && remote == nil { throw ValidationError("--pull, --push and --sync need --remote URL") }
        if continuous && directions.isEmpty { throw ValidationError("--continuous needs --pull, --push or --sync") }
        do { _ = try browsingPolicy() } catch { throw ValidationError("\(error)") }
    }

    func execute() throws {
        let mountPoint = URL(fileURLWithPath: self.mountPoint).standardizedFileURL.path
        var info = stat()
        guard stat(mountPoint, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
            throw SofaError.invalidArgument("mount point \(mountPoint) is not a directory")
        }
        guard !MountTable.contains(mountPoint) else {
            throw SofaError.invalidArgument("\(mountPoint) is already a mount point (unmount it with fusermount3 -u)")
        }
        func refuseNonEmpty() throws {
            // A mount point that cannot be listed is left to FUSE's own mount, which says why.
            guard !fuseOptions.contains("nonempty"), let entries = try? FileManager.default.contentsOfDirectory(atPath: mountPoint),
                  !entries.isEmpty else { return }
            throw SofaError.invalidArgument("mount point \(mountPoint) is not empty: the mount would hide its "
                + "\(counted(entries.count, "entry", "entries")) (use an empty directory, or -o nonempty to mount over them anyway)")
        }
        if let seed, access(db.database, F_OK) != 0 {
            try refuseNonEmpty()
            let copy = try copyDatabase(from: seed, to: db.database, replacing: false)
            Output.error("created \(copy.path) from \(seed)")
        }
        // A bad database fails here, in the foreground, with its reason.
        if let couchbaseLite { _ = try CouchbaseLiteDatabase.open(at: couchbaseLite) } else { _ = try db.open() }
        try refuseNonEmpty()
        if !foreground { return try daemonize(mountPoint) }
        let signals = SignalWatcher([SIGINT, SIGTERM, SIGHUP])  // before any thread starts
        raiseDescriptorLimit()  // every open file of the mount holds a descriptor here

        let database: Database
        var fileReadOnly = false
        var session: ReplicationSession?
        if let couchbaseLite {
            // Mounted through its companion, kept in step both ways while mounted.
            let (companion, writable) = try CouchbaseLiteMount.open(couchbaseLite)
            (database, fileReadOnly) = (companion, !writable)
            session = ReplicationSession(database: companion, remote: RemoteDatabase(file: couchbaseLite),
                                         directions: readOnly || !writable ? [.pull] : [.pull, .push], continuous: true)
        } else {
            database = try db.open()
        }
        var downloader: RemoteBodies?
        if couchbaseLite == nil, let url = try remote ?? database.rememberedRemote {
            let remoteDatabase = try connection.remote(url)
            downloader = RemoteBodies(database: database, remote: remoteDatabase, retry: connection.retryPolicy, caFile: connection.cacert)
            if !directions.isEmpty {
                session = ReplicationSession(database: database, remote: remoteDatabase, directions: directions, continuous: continuous)
                session?.downloads = try downloads.policy(for: database, url: url)
                session?.retry = connection.retryPolicy
                session?.caFile = connection.cacert
            }
        }
        let fileSystem = try DocumentFileSystem(store: database, readOnly: readOnly || fileReadOnly, bodySource: downloader, fetchTimeout: fetchTimeout,
                                                browsing: try browsingPolicy())
        // A desktop user learns of a lost save from a notification (where a session bus is).
        if let notifier = DesktopNotifier() { fileSystem.onFailure = notifier.failed }
        let mounted = Locked<FuseMount?>(nil)
        fileSystem.statusProvider = { [downloader, session, mounted] in
            var status: JSONObject = [:]
            if let mount = mounted.withLock({ $0 }) {
                let files = mount.passthroughFiles
                status["fuse"] = .object(["passthrough": .string(mount.passthrough), "passthrough_open_files": .integer(Int64(files.open)),
                                          "passthrough_opened": .integer(Int64(files.opened)),
                                          "read_requests": .integer(Int64(mount.readRequests)),
                                          "kept_nodes": .integer(Int64(mount.keptNodes))])
            }
            if let session { status["replication"] = .object(session.status.json) }
            if let couchbaseLite { status["couchbase_lite"] = .string(couchbaseLite) }
            if let downloader {
                status["downloads"] = .array(downloader.active.map { body in
                    .object(["id": .string(body.docID), "name": .string(body.name), "digest": .string(body.digest),
                             "length": .integer(body.length), "received": .integer(body.present), "fetching": .bool(body.fetching)])
                })
                // Status only: a cache that cannot be measured now is left out of it.
                if let use = try? downloader.database.cacheUse() { status["cache"] = .object(cacheJSON(use)) }
            }
            return status
        }
        var configuration = FuseMount.Configuration()
        // default_permissions: the kernel checks mode bits itself (`test -x` of a 0644 file is false, even for root).
        let owner = try MountOwnership(fuseOptions)
        configuration.uid = owner.uid ?? configuration.uid
        configuration.gid = owner.gid ?? configuration.gid
        configuration.umask = owner.umask ?? configuration.umask
        configuration.options = ["default_permissions"] + owner.others.filter { $0 != "nonempty" } + (readOnly || fileReadOnly ? ["ro"] : [])
        configuration.fileSystemName = "sofa:" + URL(fileURLWithPath: couchbaseLite ?? database.path).lastPathComponent
        configuration.passthrough = !noPassthrough
        // The mount's links (the rows of views and saved queries) lead where their names say.
        configuration.cacheSymbolicLinks = true
        // Whatever ends this process, the mount does not outlive it as a dead one. The guard starts
        // before the mount and is told its device as soon as it exists; killed before that, the
        // mount leaves the guard to find a dead Sofa mount there (`MountGuard.detachIfDead`).
        let guardPipe = try? MountGuard.start(for: mountPoint)  // without it, auto_unmount-style cleanup after a kill is lost, not the mount
        defer { guardPipe.flatMap { $0 }.map { _ = close($0) } }
        let mount: FuseMount
        do {
            mount = try FuseMount(fileSystem: fileSystem, at: mountPoint, configuration: configuration)
        } catch let error as FileSystemError {
            throw SofaError.invalidArgument("cannot mount on \(mountPoint): \(error)")
        }
        if let pipe = guardPipe.flatMap({ $0 }) { MountGuard.arm(pipe, mountPoint: mountPoint) }
        mounted.withLock { $0 = mount }
        let watcher = try ChangeWatcher(store: database, madeHere: { [fileSystem] change in fileSystem.madeHere(change) },
                                        documentChanged: { [fileSystem] id in fileSystem.documentChanged(id) },
                                        invalidate: { [mount] path, descendants in mount.invalidate(path, descendants: descendants) })
        watcher.start()

        // Ctrl-C, SIGTERM, SIGHUP: unmount lazily; open files finish their saves, then run() returns.
        signals.onSignal { mount.unmount() }
        log.info("mounted \(database.path) on \(mountPoint)")
        session?.start()
        let compactor = readOnly || fileReadOnly ? nil : try compaction.start { [database] in [database] }
        mount.run()
        // Unmounted: the guard's work is done. A new mount at the same point may already be there,
        // and may have this one's device number (the kernel hands the lowest free one out again).
        if let pipe = guardPipe.flatMap({ $0 }) { MountGuard.disarm(pipe) }
        compactor?.stop()
        fileSystem.saveSetAsideRemovals()
        fileSystem.foldAllBursts()
        session?.stop()
        session?.wait()
        // Fetches still running end (and save what arrived) before the process does.
        downloader?.shutDown(waitingAtMost: 30)
        watcher.stop()
        signals.cancel()
        do { try database.checkpoint() } catch { log.warning("\(database.path): the write-ahead log was not moved into the database file: \(error)") }
    }

    /// `--thumbnail-fetch-max`: a size, or `all`.
    func browsingPolicy() throws -> BrowsingPolicy {
        if thumbnailFetchMax.lowercased() == "all" { return BrowsingPolicy(thumbnailFetchMax: nil) }
        guard let size = parseSize(thumbnailFetchMax), size >= 0 else {
            throw SofaError.invalidArgument("--thumbnail-fetch-max \(thumbnailFetchMax): expected a size (512K, 4M, 0) or all")
        }
        return BrowsingPolicy(thumbnailFetchMax: size)
    }

    /// Runs this command again in the foreground as a detached child, and returns once it is mounted.
    private func daemonize(_ mountPoint: String) throws {
        var arguments = [sofaExecutable, "mount", db.database, mountPoint, "--foreground"]
        if readOnly { arguments.append("--read-only") }
        for option in options { arguments += ["-o", option] }
        if let remote { arguments += ["--remote", remote] }
        arguments += connection.arguments
        arguments += ["--fetch-timeout", String(fetchTimeout), "--thumbnail-fetch-max", thumbnailFetchMax]
        if pull { arguments.append("--pull") }
        if push { arguments.append("--push") }
        if sync { arguments.append("--sync") }
        if continuous { arguments.append("--continuous") }
        if noPassthrough { arguments.append("--no-passthrough") }
        if downloads.noDownloadAttachments { arguments.append("--no-download-attachments") }
        if downloads.downloadAttachments { arguments.append("--download-attachments") }
        if let max = downloads.downloadAttachmentsMax { arguments += ["--download-attachments-max", max] }
        if let types = downloads.downloadAttachmentsTypes { arguments += ["--download-attachments-types", types] }
        // Detached from the caller's streams (a caller reading them to EOF must not hang);
        // the log goes beside the database, and is shown if mounting fails. An encrypted
        // database's goes to the user's runtime folder (memory) instead: its lines may name
        // documents, and nothing beside the database is to hold them in the clear.
        let unlock = try Database.encryptionUnlock(at: db.database)
        let encrypted = unlock != nil
        var logPath = encrypted ? MountCommandLog.runtimePath(for: db.database) : URL(fileURLWithPath: db.database).standardizedFileURL.path + "/mount.log"
        if let couchbaseLite {
            // Nothing but documents goes into the app's database folder: the log is the companion's.
            try CouchbaseLiteMount.prepareFolder(for: couchbaseLite)
            logPath = CouchbaseLiteMount.companionPath(for: couchbaseLite) + ".mount.log"
        }
        let logWritable = logPath.map { access(($0 as NSString).deletingLastPathComponent, W_OK) == 0 } ?? false
        // An encrypted database's key goes to the child through a pipe, never its arguments.
        var keyPipe: Int32?
        if let unlock {
            guard let secret = try KeyOptions.secret(for: db.database, unlock: unlock, confirming: false) else {
                throw SofaError.keyRejected(path: db.database, reason: "no key given (--key-file, --key-fd, or run it on a terminal)")
            }
            var ends: [Int32] = [0, 0]
            guard pipe(&ends) == 0 else { throw SofaError.system("pipe", path: db.database, errno: errno) }
            defer { close(ends[1]) }
            try secret.withBytes { try writeFully(ends[1], $0, path: "the key pipe") }
            keyPipe = ends[0]
            arguments += ["--key-fd", "0"]
        }
        defer { if let keyPipe { close(keyPipe) } }
        // Each mount starts a log of its own (the last one kept as `.1`): a failure shows this
        // attempt's lines, never an earlier attempt's, and the log does not grow without end.
        if logWritable, let logPath { _ = rename(logPath, logPath + ".1") }
        let pid = try spawnDetached(arguments, stdin: keyPipe, stderr: logWritable ? logPath : nil)
        if encrypted, let logPath, logWritable { log.info("the mount's log is \(logPath) (an encrypted database keeps none beside it)") }
        // Wait until the mount appears, or the child gives up.
        for _ in 0..<200 {
            if MountTable.contains(mountPoint) {
                if json {
                    Output.line(JSONValue.object(["ok": true, "mount_point": .string(mountPoint), "pid": .integer(Int64(pid)),
                                                  "log": logWritable ? logPath.map(JSONValue.string) ?? .null : .null]).jsonString())
                }
                return
            }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                let log = logPath.flatMap { try? String(contentsOfFile: $0, encoding: .utf8) } ?? ""  // the child's log, for the message; none is still an error
                let lines = log.split(separator: "\n").suffix(5).joined(separator: "\n")
                if !lines.isEmpty { FileHandle.standardError.write(Data((lines + "\n").utf8)) }
                if json {
                    // This attempt's lines (each mount starts its own log), as one reason.
                    let reason = log.split(separator: "\n").suffix(5).map { $0.hasPrefix("sofa: ") ? String($0.dropFirst(6)) : String($0) }
                    Output.line(JSONValue.object(["ok": false, "error": "mount_failed",
                                                  "reason": .string(reason.isEmpty ? "the mount process ended" : reason.joined(separator: "; "))]).jsonString())
                }
                throw ExitCode((status >> 8) & 0xFF == 0 ? 1 : (status >> 8) & 0xFF)
            }
            usleep(50_000)
        }
        throw SofaError.invalidArgument("timed out waiting for the mount on \(mountPoint)")
    }
}

/// Where a background mount of an encrypted database logs: the user's runtime folder
/// (`$XDG_RUNTIME_DIR`, or /run for root: memory, gone at logout or restart), in a `sofa` folder
/// readable by its owner only. Nil when there is none (the log is then not kept; `--foreground`
/// shows it).
enum MountCommandLog {
    static func runtimePath(for database: String) -> String? {
        let base = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"].flatMap { $0.isEmpty ? nil : $0 } ?? (geteuid() == 0 ? "/run" : nil)
        guard let base else { return nil }
        let folder = base + "/sofa"
        guard mkdir(folder, 0o700) == 0 || errno == EEXIST else { return nil }
        let full = URL(fileURLWithPath: database).standardizedFileURL.path
        let tag = MessageDigest.hash(.sha1, Array(full.utf8)).prefix(6).map { String(format: "%02x", $0) }.joined()
        return "\(folder)/\(URL(fileURLWithPath: full).lastPathComponent)-\(tag).mount.log"
    }
}

/// Reads /proc/self/mountinfo.
enum MountTable {
    static func contains(_ mountPoint: String) -> Bool { device(of: mountPoint) != nil }

    /// The device ("MAJOR:MINOR") of the mount at `mountPoint`, if something is mounted there.
    static func device(of mountPoint: String) -> String? {
        entry(at: mountPoint).map { String($0[2]) }
    }

    /// The file system type ("fuse.sofa") of the mount at `mountPoint`, if something is mounted there.
    static func type(of mountPoint: String) -> String? {
        // The fields after " - ": type, source, options.
        entry(at: mountPoint).flatMap { fields in fields.firstIndex(of: "-").map { String(fields[$0 + 1]) } }
    }

    /// The fields of the topmost mountinfo line of `mountPoint`.
    private static func entry(at mountPoint: String) -> [Substring]? {
        guard let text = KernelFile.text("/proc/self/mountinfo") else { return nil }  // no /proc: nothing known mounted
        return text.split(separator: "\n").lazy.map { $0.split(separator: " ") }.last { fields in
            fields.count > 4 && fields[4].replacingOccurrences(of: "\\040", with: " ") == mountPoint
                && fields.firstIndex(of: "-").map { $0 + 1 < fields.count } == true
        }
    }
}

/// Spawns `arguments` in a session of its own (a kill of the caller's process group does not
/// reach it), reading `stdin` (nil: /dev/null), writing `stderr` (a path; nil: /dev/null),
/// with nothing else of the caller's open.
func spawnDetached(_ arguments: [String], executable: String? = nil, environment: [String: String] = [:],
                   stdin: Int32? = nil, stderr: String? = nil) throws -> pid_t {
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    posix_spawnattr_setflags(&attributes, 0x80)  // POSIX_SPAWN_SETSID (glibc), not exported to Swift
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    if let stdin { posix_spawn_file_actions_adddup2(&actions, stdin, 0) } else {
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    }
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 2, stderr ?? "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0o644)
    // Nothing else the caller left open (Foundation's Process waits for EOF on a socket it passes down).
    // (glibc 2.34+; not exported to Swift, so looked up.)
    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>?, Int32) -> Int32
    if let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") {
        _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
    }
    let argv = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var variables = ProcessInfo.processInfo.environment
    for (name, value) in environment { variables[name] = value }
    let envp = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
    defer { envp.forEach { free($0) } }
    var pid: pid_t = 0
    let path = executable ?? arguments[0]
    let code = posix_spawnp(&pid, path, &actions, &attributes, argv, envp)
    guard code == 0 else { throw SofaError.io(operation: "spawn", path: path, errno: code) }
    return pid
}

var sofaExecutable: String {
    (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]  // no /proc: as invoked
}

/// Unmounts a mount whose process died, however it died: a process of its own session
/// (started by the mount, `sofa mount-guard`) that waits for the mount process's end (EOF
/// on a pipe only the mount holds) and then, if the same mount is still there, detaches it.
/// libfuse's `auto_unmount` helper shares the mount's process group, so `kill -9 -PGID`,
/// `timeout -s KILL` or a terminal's hang-up took it down too and left a dead mount.
///
/// Its command line and process name hold neither "sofa" nor the database's name (the mount
/// point and device come in its environment), so `pkill -f sofa` or `pkill -f notes.sofa`,
/// which also kill libfuse's helper (its arguments say `fsname=sofa:notes.sofa`), spare it.
struct MountGuard: SofaCommand {
    static let configuration = CommandConfiguration(commandName: "fuse-guard", shouldDisplay: false)

    static let variable = "SOFA_GUARDED_MOUNT"

    /// Starts the guard of a mount about to be made at `mountPoint`; the returned descriptor
    /// must stay open for as long as the mount runs (the process's end closes it), and is
    /// given the mount's device with `arm` once it is mounted.
    static func start(for mountPoint: String) throws -> Int32? {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return nil }
        for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        defer { close(fds[0]) }
        _ = try spawnDetached(["fuse-guard", "fuse-guard"], executable: sofaExecutable,
                              environment: [variable: mountPoint], stdin: fds[0])
        return fds[1]
    }

    /// Tells the guard which mount is its own: the device now mounted at `mountPoint`.
    static func arm(_ pipe: Int32, mountPoint: String) {
        guard let device = MountTable.device(of: mountPoint) else { return }
        send(device, to: pipe)
    }

    /// Tells the guard the mount ended cleanly (it was unmounted): nothing is left to detach.
    static func disarm(_ pipe: Int32) {
        send(unmounted, to: pipe)
    }

    private static let unmounted = "unmounted"

    private static func send(_ line: String, to pipe: Int32) {
        let bytes = Array((line + "\n").utf8)
        _ = bytes.withUnsafeBytes { write(pipe, $0.baseAddress, $0.count) }
    }

    func execute() throws {
        // The process name (what `pkill sofa` matches) too; the main thread's is the process's.
        try? "fuse-guard".write(toFile: "/proc/self/comm", atomically: false, encoding: .utf8)  // a name for ps only
        guard let mountPoint = ProcessInfo.processInfo.environment[MountGuard.variable] else {
            throw SofaError.invalidArgument("fuse-guard is started by sofa mount")
        }
        // The device arrives as one line once mounted, "unmounted" after a clean end; the end of
        // the pipe without it is a mount process that died (killed, crashed).
        var lines: [String] = []
        var received: [UInt8] = []
        var byte: UInt8 = 0
        while lines.last != MountGuard.unmounted {
            let count = read(0, &byte, 1)
            if count == 0 || (count < 0 && errno != EINTR) { break }
            guard count == 1 else { continue }
            if byte == UInt8(ascii: "\n") {
                lines.append(String(decoding: received, as: UTF8.self))
                received = []
            } else {
                received.append(byte)
            }
        }
        guard lines.last != MountGuard.unmounted else { return }
        // Only a dead mount is detached: one that answers is another process's, made at the same
        // point after this one ended, even with the same device number. Without a device (killed
        // between the mount and telling this guard), any dead Sofa mount there is this one's.
        MountGuard.detachIfDead(mountPoint, device: lines.first)
    }

    private static func detach(_ mountPoint: String) {
        guard let pid = try? spawnDetached(["fusermount3", "-u", "-z", mountPoint]) else { return }  // the guard's last resort: nothing else to try
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }

    /// Detaches a Sofa mount at `mountPoint` whose process is gone: `statvfs` of it fails with
    /// ENOTCONN (the kernel keeps no answer to it, unlike attributes). One that answers is left
    /// alone, and so is anything that is not a Sofa mount or (given `device`) not this device.
    /// Asks for up to 5 s, as the ended process's descriptors are closed one by one (slowly on a
    /// busy machine).
    static func detachIfDead(_ mountPoint: String, device: String? = nil) {
        for _ in 0..<100 {
            guard MountTable.type(of: mountPoint) == "fuse.sofa" else { return }
            if let device, MountTable.device(of: mountPoint) != device { return }
            var info = statvfs()
            if statvfs(mountPoint, &info) != 0 && errno == ENOTCONN {
                detach(mountPoint)
                return
            }
            usleep(50_000)
        }
    }
}

/// `-o uid=N,gid=N,umask=OCTAL`, as sshfs and rclone take them: who every file shows as owned
/// by and which permission bits none shows (libfuse's low-level mount knows none of them:
/// they are Sofa's, applied to what the mount answers). The other options go on to FUSE.
struct MountOwnership {
    var uid: uid_t?
    var gid: gid_t?
    var umask: mode_t?
    var others: [String] = []

    init(_ options: [String]) throws {
        for option in options {
            let parts = option.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2, ["uid", "gid", "umask"].contains(parts[0]) else {
                others.append(option)
                continue
            }
            switch parts[0] {
            case "uid":
                guard let value = UInt32(parts[1]) else { throw ValidationError("-o \(option): a user id is a number (id -u NAME)") }
                uid = value
            case "gid":
                guard let value = UInt32(parts[1]) else { throw ValidationError("-o \(option): a group id is a number (id -g NAME)") }
                gid = value
            default:
                guard let value = UInt32(parts[1], radix: 8), value <= 0o777 else {
                    throw ValidationError("-o \(option): a umask is octal permission bits, 000 to 777 (022: others may not write)")
                }
                umask = mode_t(value)
            }
        }
    }
}
