import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// The README's quick start, run as a newcomer would paste it into a shell.
@Suite struct ReadmeTests {
    let directory = TemporaryDirectory()

    /// The first ```sh block after `heading` in README.md.
    func block(after heading: String) throws -> String {
        let readme = try String(contentsOfFile: packageRoot + "/README.md", encoding: .utf8)
        let section = try #require(readme.range(of: "\n" + heading + "\n"), "README.md has no \(heading)")
        let rest = readme[section.upperBound...]
        let start = try #require(rest.range(of: "```sh\n"))
        let end = try #require(rest[start.upperBound...].range(of: "\n```"))
        return String(rest[start.upperBound..<end.lowerBound])
    }

    @Test func theQuickStartRunsAsWritten() throws {
        #expect(isRoot, "the quick start mounts (root, as CI has)")
        var script = try block(after: "## Quick start")
        // Two changes only: a free port instead of 5984 (tests run side by side), and a wait
        // for the continuous push instead of a fixed two seconds (the sanitizer pass is slow).
        let port = try freePort()
        #expect(script.contains("sofa serve notes.sofa &"))
        script = script.replacingOccurrences(of: "sofa serve notes.sofa &", with: "sofa serve notes.sofa --port \(port) &")
        script = script.replacingOccurrences(of: "5984", with: String(port))
        script = script.replacingOccurrences(of: "sleep 2; ", with: "for i in $(seq 120); do curl -s localhost:\(port)/notes/hello | grep -q laptop && break; sleep 0.5; done; ")
        let file = directory.appending("quickstart.sh")
        try ("set -e\ntrap 'status=$?; set +e; fusermount3 -u notes 2>/dev/null; fusermount3 -u laptop 2>/dev/null; kill %1 2>/dev/null; exit $status' EXIT\n" + script + "\n")
            .write(toFile: file, atomically: true, encoding: .utf8)
        let path = URL(fileURLWithPath: sofaBinary).deletingLastPathComponent().path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "")
        let run = try ChildProcess(["/bin/bash", "-c", "cd '\(directory.path)' && bash quickstart.sh 2>&1"], environment: ["PATH": path]).wait()
        #expect(run.succeeded, "\(run.stdout)")
        let lines = run.stdout.split(separator: "\n")
        #expect(lines.contains("todo.txt"), "\(run.stdout)")
        let served = lines.filter { $0.hasPrefix("{\"_id\":\"hello\"") }
        #expect(served.count == 2, "\(run.stdout)")
        #expect(served.first?.contains("\"_rev\":\"4-") == true && served.first?.contains("Hello again") == true, "\(run.stdout)")
        #expect(served.last?.contains("from the laptop") == true, "\(run.stdout)")
    }

    func freePort() throws -> Int {
        let probe = try FaultProxy(upstreamPort: 9)  // only to borrow a free port number
        defer { probe.close() }
        return probe.port
    }
}
