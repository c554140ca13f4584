import DocumentModel
import Foundation

/// Tells a desktop user, through the freedesktop notification service, that a save in the
/// mount was lost: an editor or a file manager shows only the errno's words ("Error renaming
/// temporary file: Bad message"), the reason is in the log and in `.sofa/status.json`. Only
/// where a desktop session is present (a session bus to reach), and only for what costs the
/// user their change: a refused properties.json, a validator's refusal, a full disk, an I/O
/// error on a write or close. Bursts (a `cp -r` onto a full disk) become one notification every
/// few seconds that counts the rest. Sent with `gdbus` (GLib's, on every GTK desktop).
final class DesktopNotifier: @unchecked Sendable {
    /// For each operation that saves what a program wrote, the errors that mean the change did
    /// not make it: refused content (EINVAL at close, EBADMSG at a rename: invalid properties.json),
    /// a validator (EACCES), a full disk, a failed write.
    static let losses: [String: Set<Int32>] = [
        "close": [EINVAL, EACCES, ENOSPC, EDQUOT, EIO], "fsync": [EINVAL, EACCES, ENOSPC, EDQUOT, EIO],
        "rename": [EBADMSG, EINVAL, EACCES, ENOSPC, EDQUOT, EIO], "write": [ENOSPC, EDQUOT, EIO, EFBIG],
    ]
    /// At most one notification in this many seconds; the ones in between are counted in the next.
    static let interval: Double = 5

    private let gdbus: String
    private let environment: [String: String]
    private let lock = NSLock()
    private var waiting: [(path: String, reason: String)] = []
    private var sending = false

    /// nil where no desktop session is reachable or gdbus is missing.
    init?(environment: [String: String] = ProcessInfo.processInfo.environment) {
        let runtimeBus = environment["XDG_RUNTIME_DIR"].map { "\($0)/bus" }
        guard environment["DBUS_SESSION_BUS_ADDRESS"] != nil || runtimeBus.map({ access($0, F_OK) == 0 }) == true,
              let gdbus = ["/usr/bin/gdbus", "/bin/gdbus"].first(where: { (path: String) in access(path, X_OK) == 0 }) else { return nil }
        self.gdbus = gdbus
        self.environment = environment
    }

    /// A failed request, as the mount records it; notifies when it lost a save.
    func failed(_ operation: String, path: String, errno code: Int32, reason: String) {
        guard DesktopNotifier.losses[operation]?.contains(code) == true else { return }
        var text = reason
        if (code == EBADMSG || code == EINVAL) && path.hasSuffix("/properties.json") {
            text += ". What you wrote is kept in properties.rejected.json beside it."
        }
        let start = lock.withLock { () -> Bool in
            waiting.append((path, text))
            defer { sending = true }
            return !sending
        }
        if start { Thread.detachNewThread { [self] in drain() } }
    }

    /// Sends what waits, then waits `interval` before the next, until nothing is left.
    private func drain() {
        while true {
            let batch = lock.withLock { () -> [(path: String, reason: String)] in
                defer { waiting = [] }
                if waiting.isEmpty { sending = false }
                return waiting
            }
            guard let first = batch.first else { return }
            let summary = batch.count == 1 ? "Not saved: \((first.path as NSString).lastPathComponent)"
                : "\(batch.count) saves failed in the Sofa mount"
            var body = "\(first.path): \(first.reason)"
            if batch.count > 1 { body += "\n… and \(batch.count - 1) more (see .sofa/status.json)" }
            send(summary: summary, body: body)
            Thread.sleep(forTimeInterval: DesktopNotifier.interval)
        }
    }

    private func send(summary: String, body: String) {
        // Notify(app_name, replaces_id, app_icon, summary, body, actions, hints, expire_timeout),
        // each argument in GVariant's text form.
        let arguments = [gdbus, "call", "--session", "--timeout", "5", "--dest", "org.freedesktop.Notifications",
                         "--object-path", "/org/freedesktop/Notifications", "--method", "org.freedesktop.Notifications.Notify",
                         "--", DesktopNotifier.literal("Sofa"), "0", DesktopNotifier.literal("dialog-error"),
                         DesktopNotifier.literal(summary), DesktopNotifier.literal(body), "@as []", "@a{sv} {}", "-1"]
        let process = Process()
        process.executableURL = URL(fileURLWithPath: gdbus)
        process.arguments = Array(arguments.dropFirst())
        process.environment = environment
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do {
            try process.run()
            process.waitUntilExit()
            if process.terminationStatus != 0 { log.info("no desktop notification: gdbus exited \(process.terminationStatus)") }
        } catch {
            log.info("no desktop notification: \(error)")
        }
    }

    /// `text` as a GVariant string literal.
    static func literal(_ text: String) -> String {
        "'" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'")
            .replacingOccurrences(of: "\n", with: "\\n") + "'"
    }
}
