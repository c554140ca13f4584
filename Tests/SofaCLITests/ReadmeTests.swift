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
        // As written: its own port, and waits on conditions, not fixed sleeps.
        let script = try block(after: "## Quick start")
        #expect(!script.contains("& sleep") && !script.contains("sleep 2;"), "the quick start waits on conditions")
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

    /// README.md is read in five minutes: at most 300 lines, every page of docs/ linked from
    /// it, and every file it or those pages link to there.
    @Test func theReadmeIsShortAndReachesEveryPage() throws {
        let readme = try String(contentsOfFile: packageRoot + "/README.md", encoding: .utf8)
        #expect(readme.split(separator: "\n", omittingEmptySubsequences: false).count <= 300)
        let pages = try FileManager.default.contentsOfDirectory(atPath: packageRoot + "/docs").filter { $0.hasSuffix(".md") }
        #expect(pages.count >= 8)
        for page in pages { #expect(readme.contains("](docs/\(page)"), "README.md does not link docs/\(page)") }
        for (file, folder) in [("README.md", "")] + pages.map({ ("docs/\($0)", "docs/") }) {
            let text = try String(contentsOfFile: packageRoot + "/" + file, encoding: .utf8)
            for target in Self.localLinks(in: text) {
                let path = (packageRoot + "/" + folder + target as NSString).standardizingPath
                #expect(FileManager.default.fileExists(atPath: path), "\(file) links \(target), which is not there")
            }
        }
    }

    /// The targets of `](…)` links that are files of this repository (no scheme, no anchor alone).
    static func localLinks(in text: String) -> [String] {
        var links: [String] = []
        var rest = Substring(text)
        while let open = rest.range(of: "](") {
            rest = rest[open.upperBound...]
            guard let close = rest.firstIndex(of: ")") else { break }
            let target = String(rest[..<close].split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0])
            if !target.isEmpty, !target.contains("://"), !target.hasPrefix("mailto:") { links.append(target) }
            rest = rest[close...]
        }
        return links
    }
}
