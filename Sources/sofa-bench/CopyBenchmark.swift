import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench copy`: pre-built databases. `sofa copy`, `sofa snapshot` and installing a
/// snapshot, each beside the plain tool doing the same file work (cp, zip, unzip), and the
/// point of it all: the first pull of an installed snapshot against a full pull.
func copyBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("copy", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let dataset = ReplicationDataset(options)
    let size = Int64(options.attachmentMiB) << 20
    print("Sofa copy benchmark: \(dataset.summary), one of \(options.attachmentMiB) MiB; in \(work)")
    print(String(repeating: "-", count: 104))

    let source = try dataset.makeSource(at: "\(work)/source.sofa")
    let big = "\(work)/big.bin"
    try writeSource(big, size: size)
    var draft = try source.newRevision(of: "big")
    try draft.setAttachment("big.bin", contentsOf: big)
    try source.save(draft)
    unlink(big)
    _ = try source.compact()  // the WAL folded in, as a shipped database would be

    // The build machine pulls from the server and snapshots what it got.
    let server = try ServeProcess(sofa: sofa, databases: ["\(work)/source.sofa"], work: work)
    defer { server.stop() }
    let url = "http://127.0.0.1:\(server.port)/source"
    _ = try timeShell("\(sofa) create \(work)/built.sofa > /dev/null")
    let fullPull = try timeWithRSS([sofa, "pull", "\(work)/built.sofa", url])

    func three(_ body: (Int) throws -> Double) rethrows -> Double { median(try (0..<3).map(body)) }
    func clean(_ paths: String...) { paths.forEach { try? FileManager.default.removeItem(atPath: $0) } }
    /// `sofa ARGUMENTS` three times, its output (the last argument) removed before each:
    /// the median time and the largest peak RSS.
    func threeRuns(of arguments: [String]) throws -> (seconds: Double, maxRSS: Int) {
        var maxRSS = 0
        let seconds = try three { _ in
            clean(arguments.last!)
            let run = try timeWithRSS([sofa] + arguments)
            maxRSS = max(maxRSS, run.maxRSS)
            return run.seconds
        }
        return (seconds, maxRSS)
    }

    // A copy beside the original: VACUUM INTO and hard links, against cp -a and cp -al.
    let copy = try three { _ in
        clean("\(work)/copy.sofa")
        return try timeWithRSS([sofa, "copy", "\(work)/built.sofa", "\(work)/copy.sofa"]).seconds
    }
    let cpAll = try three { _ in
        clean("\(work)/cp.sofa")
        return try timeShell("cp -a \(work)/built.sofa \(work)/cp.sofa && sync")
    }
    let cpLinks = try three { _ in
        clean("\(work)/cpl.sofa")
        return try timeShell("cp -al \(work)/built.sofa \(work)/cpl.sofa && sync")
    }
    row("sofa copy (VACUUM INTO, hard links)", String(format: "%6.2f s", copy), String(format: "cp -a && sync %6.2f s", cpAll),
        String(format: "cp -al && sync %6.2f s", cpLinks), "ratio to cp -al " + ratio(cpLinks / copy))

    // Snapshot: one zip, bodies stored (random bytes), the SQLite file deflated; zip -n .blob does the same.
    let (snapshot, snapshotRSS) = try threeRuns(of: ["snapshot", "\(work)/built.sofa", "\(work)/snapshot.zip"])
    let zip = try three { _ in
        clean("\(work)/plain.zip")
        return try timeShell("cd \(work) && zip -q -r -n .blob plain.zip built.sofa && sync")
    }
    row("sofa snapshot", String(format: "%6.2f s", snapshot), String(format: "zip -r -n .blob && sync %6.2f s", zip),
        "ratio " + ratio(zip / snapshot), String(format: "peak RSS %.0f MB", Double(snapshotRSS) / 1e6))

    // Many small bodies: one zip entry each, the case a zip writer must not be quadratic in
    // (binary, so both sides store them).
    let many = try Database.create(at: "\(work)/many.sofa")
    try many.inBatch { batch in
        for i in 0..<20_000 {
            var draft = try many.newRevision(of: String(format: "small-%05d", i))
            try draft.setAttachment("small.bin", data: Array(#"{"i":\#(i),"pad":"\#(String(repeating: "x", count: 900))"}"#.utf8))
            try batch.save(draft)
        }
    }
    let manySnapshot = try threeRuns(of: ["snapshot", "\(work)/many.sofa", "\(work)/many.zip"]).seconds
    let manyZip = try three { _ in
        clean("\(work)/many-plain.zip")
        return try timeShell("cd \(work) && zip -q -r -n .blob many-plain.zip many.sofa && sync")
    }
    row("sofa snapshot, 20,000 bodies of 1 KB", String(format: "%6.2f s", manySnapshot),
        String(format: "zip -r -n .blob && sync %6.2f s", manyZip), "ratio " + ratio(manyZip / manySnapshot))

    // Installing it: unpack, hash every body, integrity check, new identity, sync.
    let (install, installRSS) = try threeRuns(of: ["copy", "\(work)/snapshot.zip", "\(work)/installed.sofa"])
    let unzip = try three { _ in
        clean("\(work)/unzipped")
        return try timeShell("unzip -q \(work)/snapshot.zip -d \(work)/unzipped && sync")
    }
    row("install the snapshot (sofa copy ZIP DB)", String(format: "%6.2f s", install), String(format: "unzip && sync %6.2f s", unzip),
        "ratio " + ratio(unzip / install), String(format: "peak RSS %.0f MB", Double(installRSS) / 1e6))

    // What it buys: a hundred new documents on the server, then the install's first pull.
    let liveSource = try Database.open(at: "\(work)/source.sofa")
    for i in 0..<100 {
        var later = try liveSource.newRevision(of: String(format: "later-%03d", i))
        later.properties = ["n": .integer(Int64(i))]
        try liveSource.save(later)
    }
    let firstPull = try timeWithRSS([sofa, "pull", "\(work)/installed.sofa", url])
    row("first pull of the install (100 new docs)", String(format: "%6.2f s", firstPull.seconds),
        String(format: "full pull %6.2f s", fullPull.seconds), "ratio " + ratio(fullPull.seconds / firstPull.seconds))
}
