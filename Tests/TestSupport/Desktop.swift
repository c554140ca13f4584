import DocumentModel
import Foundation

/// A virtual X display (Xvfb) for driving desktop programs as a user would, with xdotool.
/// Stopped when released.
public final class VirtualDisplay: @unchecked Sendable {
    public let name: String
    private let server: ChildProcess
    private let home = TemporaryDirectory("sofa-desktop")

    public init() throws {
        let numberFile = home.appending("display")
        // -displayfd: Xvfb picks a free display and writes its number when it is ready.
        server = try ChildProcess(["/usr/bin/Xvfb", "-displayfd", "1", "-screen", "0", "1024x768x24", "-nolisten", "tcp", "-noreset"],
                                  stdout: numberFile)
        let deadline = Date().addingTimeInterval(30)
        while true {
            let text = (try? String(contentsOfFile: numberFile, encoding: .utf8)) ?? ""
            if let number = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                name = ":\(number)"
                break
            }
            guard Date() < deadline else {
                server.kill()
                throw SofaError.invalidArgument("Xvfb did not start: \(server.errorOutput)")
            }
            usleep(20_000)
        }
    }

    deinit {
        server.kill(SIGTERM)
        _ = server.wait()
    }

    /// What a desktop program started on this display needs: its own home and settings,
    /// no session bus, no accessibility bus.
    public var environment: [String: String] {
        ["DISPLAY": name, "HOME": home.path, "XDG_CONFIG_HOME": home.appending("config"), "XDG_DATA_HOME": home.appending("data"),
         "XDG_CACHE_HOME": home.appending("cache"), "GSETTINGS_BACKEND": "memory", "NO_AT_BRIDGE": "1"]
    }

    /// Starts a program on this display.
    public func start(_ arguments: [String]) throws -> ChildProcess {
        try ChildProcess(arguments, environment: environment)
    }

    /// Runs xdotool with `arguments` (a shell word list) on this display; its output.
    @discardableResult
    public func xdotool(_ arguments: String) throws -> ProcessResult {
        try ChildProcess(["/bin/sh", "-c", "xdotool \(arguments)"], environment: ["DISPLAY": name]).wait()
    }

    /// The visible window whose title matches `pattern` (a regular expression), once there is one.
    /// (90 s: a GTK program opening a file through a mount under ThreadSanitizer, beside the
    /// rest of the suite, has taken more than 30.)
    public func window(named pattern: String, within seconds: Double = 90) throws -> String? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let found = try xdotool("search --onlyvisible --name '\(pattern)'").stdout.split(separator: "\n").first
            if let found { return String(found) }
            usleep(100_000)
        }
        return nil
    }

    /// The titles of the visible windows, for a failure's message.
    public func visibleTitles() throws -> [String] {
        let ids = try xdotool("search --onlyvisible --name ''").stdout.split(separator: "\n")
        return try ids.map { try title(of: String($0)) }
    }

    public func title(of window: String) throws -> String {
        try xdotool("getwindowname \(window)").stdout.trimmingCharacters(in: .newlines)
    }

    /// Gives `window` the keyboard (there is no window manager to do it) and presses `keys` there.
    public func press(_ keys: String, in window: String) throws {
        try xdotool("windowfocus --sync \(window)")
        try xdotool("key --delay 30 \(keys)")
    }

    /// Types `text` into `window`.
    public func type(_ text: String, in window: String) throws {
        try xdotool("windowfocus --sync \(window)")
        try xdotool("type --delay 20 '\(text)'")
    }
}
