import DocumentModel
import Foundation
import Testing

/// A database mounted by a real `sofa mount --foreground` child process.
/// Unmounts in `unmount()` or, at the latest, when released.
public final class MountedDatabase: @unchecked Sendable {
    public let databasePath: String
    public let mountPoint: String
    private let process: ChildProcess
    private var result: ProcessResult?
    private let lock = NSLock()

    public init(_ databasePath: String, arguments: [String] = [], environment: [String: String] = [:]) throws {
        MountedDatabase.sweepDeadMounts()
        self.databasePath = databasePath
        var template = Array("/tmp/sofa-mnt-XXXXXX".utf8CString)
        mountPoint = String(cString: mkdtemp(&template)!)
        process = try ChildProcess([sofaBinary, "mount", databasePath, mountPoint, "--foreground"] + arguments,
                                   environment: ["SOFA_LOG_LEVEL": "info"].merging(environment) { $1 })
        let deadline = Date().addingTimeInterval(15)
        while !MountedDatabase.isMounted(mountPoint) {
            var status: Int32 = 0
            if waitpid(process.pid, &status, WNOHANG) == process.pid || Date() > deadline {
                process.kill()
                let failed = process.wait()
                rmdir(mountPoint)
                throw SofaError.invalidArgument("sofa mount did not mount: \(failed.stderr)")
            }
            usleep(10_000)
        }
    }

    deinit { unmount() }

    /// A path inside the mount.
    public func path(_ relative: String) -> String { mountPoint + "/" + relative }

    /// Unmounts (as `fusermount3 -u` would) and returns what the mount process did.
    @discardableResult
    public func unmount() -> ProcessResult {
        lock.lock()
        defer { lock.unlock() }
        if let result { return result }
        if MountedDatabase.isMounted(mountPoint) {
            _ = try? shell("fusermount3 -u \(mountPoint) 2>/dev/null || umount -l \(mountPoint)")
        }
        let finished = process.wait()
        rmdir(mountPoint)
        result = finished
        recordSanitizerReports(finished, from: "the mount process")
        return finished
    }

    /// The mount process's peak resident memory so far, in bytes (its VmHWM).
    public var peakMemory: Int64? {
        guard let status = try? String(contentsOfFile: "/proc/\(process.pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kilobytes = line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap({ Int64($0) })
        else { return nil }
        return kilobytes << 10
    }

    /// The mount process's standard error so far (its log).
    public var log: String { process.errorOutput }

    public static func isMounted(_ path: String) -> Bool {
        guard let text = KernelFile.text("/proc/self/mountinfo") else { return false }
        return text.split(separator: "\n").contains { $0.split(separator: " ").dropFirst(4).first.map(String.init) == path }
    }

    /// Unmounts leftovers of earlier runs whose process died (stat fails with ENOTCONN).
    /// Live mounts of tests running in parallel are left alone.
    public static func sweepDeadMounts() {
        guard let text = KernelFile.text("/proc/self/mountinfo") else { return }
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: " ")
            guard fields.count > 4, fields[4].hasPrefix("/tmp/sofa-mnt-") else { continue }
            var info = stat()
            if stat(String(fields[4]), &info) != 0 && errno == ENOTCONN {
                _ = try? shell("fusermount3 -u -z \(fields[4]) 2>/dev/null || umount -l \(fields[4])")
            }
        }
    }
}
