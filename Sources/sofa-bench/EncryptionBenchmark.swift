import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench encryption`: an encrypted database beside a plain one in the same run (#32):
/// saves, reads by id, and a big attachment written and read through the mount. Ratios are
/// the plain database's time / the encrypted one's (1.00× = as fast as plain). The mount's
/// reads of a plain database go through FUSE passthrough by default, which an encrypted body
/// cannot; the goal compares the mount's own read path (`--no-passthrough`) for both, and the
/// passthrough row shows what a plain database gets on top.
func encryptionBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("encryption", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let documents = options.documentsGiven ? options.documents : 10_000
    let size = Int64(options.attachmentMiB) << 20
    print("Sofa encryption benchmark: \(documents) documents, a \(options.attachmentMiB) MiB attachment, in \(work)")
    print("ratios are plain time / encrypted time (1.00× = as fast as a plain database); goals: reads through the mount ≥ 0.70×, writes ≥ 0.80×")
    print(String(repeating: "-", count: 110))

    let keyFile = "\(work)/bench.key"
    let key = try DatabaseSecret.newKeyFile()
    try key.withBytes { try Data($0).write(to: URL(fileURLWithPath: keyFile)) }
    let plain = try Database.create(at: "\(work)/plain.sofa")
    let encrypted = try Database.create(at: "\(work)/encrypted.sofa", encryptedWith: (key, .keyFile))
    let databases = [("plain", plain, ""), ("encrypted", encrypted, " --key-file \(keyFile)")]

    func compare(_ label: String, rounds: Int = 3, goal: Double? = nil, _ body: (_ database: Database, _ keyArgument: String, _ round: Int) throws -> Double) rethrows {
        var times: [[Double]] = [[], []]
        for round in 0..<rounds {
            for which in (round % 2 == 0 ? [0, 1] : [1, 0]) {
                times[which].append(try body(databases[which].1, databases[which].2, round))
            }
        }
        let p = median(times[0]), e = median(times[1])
        let verdict = goal.map { p / e >= $0 ? "  goal met" : String(format: "  below the %.2f× goal", $0) } ?? ""
        row(label, String(format: "plain %8.3f s", p), String(format: "encrypted %8.3f s", e), "ratio " + ratio(p / e) + verdict)
    }

    // Saves: one document a transaction, then a batch of all of them.
    let singles = min(documents, 2_000)
    try compare("\(singles) saves, one a transaction") { database, _, round in
        try measure {
            for i in 0..<singles {
                var draft = try database.newRevision(of: "single-\(round)-\(i)")
                draft.properties = ["title": .string("Document \(i)"), "n": .integer(Int64(i)), "text": .string(String(repeating: "x", count: 200))]
                try database.save(draft)
            }
        }
    }
    try compare("\(documents) saves in one batch", goal: 0.8) { database, _, round in
        try measure {
            try database.inBatch { batch in
                for i in 0..<documents {
                    var draft = try database.newRevision(of: String(format: "doc-%d-%06d", round, i))
                    draft.properties = ["title": .string("Document \(i)"), "n": .integer(Int64(i)), "text": .string(String(repeating: "x", count: 200))]
                    try batch.save(draft)
                }
            }
        }
    }
    // Reads by id, in a scattered order (a prime step through all of them), warm.
    let step = [7_919, 7_927, 7_933].first { documents % $0 != 0 } ?? 1
    try compare("\(documents) reads by id", goal: 0.7) { database, _, _ in
        try measure {
            for i in 0..<documents { _ = try database.document(withID: String(format: "doc-0-%06d", i * step % documents)) }
        }
    }

    // A big attachment through the mount: written with cp, read with cat.
    let source = "\(work)/source.bin"
    try writeSource(source, size: size)
    var mountPoints: [String] = []
    defer { for point in mountPoints { _ = try? timeShell("fusermount3 -u \(point)") } }
    func mount(_ database: Database, _ keyArgument: String, passthrough: Bool) throws -> String {
        let point = "\(work)/mnt-\(mountPoints.count)"
        try FileManager.default.createDirectory(atPath: point, withIntermediateDirectories: true)
        _ = try timeShell("\(sofaBinary) mount \(database.path) \(point)\(keyArgument)\(passthrough ? "" : " --no-passthrough")")
        mountPoints.append(point)
        try FileManager.default.createDirectory(atPath: "\(point)/docs/big", withIntermediateDirectories: true)
        return point
    }
    let readPath = try [mount(plain, "", passthrough: false), mount(encrypted, " --key-file \(keyFile)", passthrough: false)]
    let passthrough = try mount(plain, "", passthrough: true)
    try compare("write \(options.attachmentMiB) MiB through the mount (cp)", goal: 0.8) { database, _, round in
        let point = readPath[database === plain ? 0 : 1]
        return try timeShell("cp \(source) \(point)/docs/big/attachments/big-\(round).bin")
    }
    let canDrop = dropCaches()
    for cold in canDrop ? [true, false] : [false] {
        try compare("read \(options.attachmentMiB) MiB through the mount's read path (cat), \(cold ? "cold" : "warm")", goal: 0.7) { database, _, _ in
            let point = readPath[database === plain ? 0 : 1]
            if cold { _ = dropCaches() } else { _ = try timeShell("cat \(point)/docs/big/attachments/big-0.bin > /dev/null") }
            return try timeShell("cat \(point)/docs/big/attachments/big-0.bin > /dev/null")
        }
    }
    if !canDrop { row("cold reads", "skipped: dropping the page cache needs root") }
    // What a plain database gets on top: the kernel reading its blob directly.
    _ = try timeShell("cat \(passthrough)/docs/big/attachments/big-0.bin > /dev/null")
    let direct = median(try (0..<3).map { _ in try timeShell("cat \(passthrough)/docs/big/attachments/big-0.bin > /dev/null") })
    let sealed = median(try (0..<3).map { _ in try timeShell("cat \(readPath[1])/docs/big/attachments/big-0.bin > /dev/null") })
    row("read, plain with passthrough vs encrypted, warm", String(format: "plain %8.3f s", direct), String(format: "encrypted %8.3f s", sealed),
        "ratio " + ratio(direct / sealed))

    // rsync: each file is written under a temporary name (a scratch file: sealed, its name
    // sealed) and renamed into attachments/; vim's swap file is a scratch file as well.
    let tree = "\(work)/tree"
    for i in 0..<1_000 {
        if i < 10 { try FileManager.default.createDirectory(atPath: "\(tree)/d\(i)", withIntermediateDirectories: true) }
        try Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ i) }).write(to: URL(fileURLWithPath: "\(tree)/d\(i % 10)/f\(i).bin"))
    }
    try compare("rsync -a of 1,000 files of 4 KiB into one document") { database, _, round in
        let point = readPath[database === plain ? 0 : 1]
        return try timeShell("mkdir -p \(point)/docs/tree-\(round)/attachments && rsync -a \(tree)/ \(point)/docs/tree-\(round)/attachments/")
    }
    try compare("vim: edit a 4 KiB attachment and save, 20 times (swap file, backup)") { database, _, round in
        let point = readPath[database === plain ? 0 : 1]
        let file = "\(point)/docs/tree-0/attachments/d0/f0.bin"
        return try timeShell("for i in $(seq 1 20); do vim -es -N -u NONE -i NONE -c 'set swapfile backup writebackup' -c 'normal Gox' -c wq \(file) || exit 1; done")
    }
}
