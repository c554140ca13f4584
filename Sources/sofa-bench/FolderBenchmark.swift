import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench folders`: folders of many small files copied into a mount (`cp -r`, `tar x`,
/// `rsync -a`, and into one document `unzip` and `git clone`), beside the same into a plain folder on the same disk followed by `sync`; into
/// one document, and spread over documents; the SQLite file afterwards, with no compaction.
func folderBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("folders", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let large = options.documents >= 100_000 ? 10_000 : max(options.documents, 100)  // 10,000 unless --documents says
    let small = large / 10
    print("Sofa folder benchmark: \(small) and \(large) files of 4 KiB in 100 folders, in \(work)")
    print("ratios are plain time / mount time (1.00× = as fast as ext4 + sync); every time counts the job and a sync after it")
    print("saved: the mount's time until its unmount ends with the last fold saved as a revision (passthrough_ll's: job + sync)")
    if options.rounds > 1 { print("mount and passthrough_ll take turns \(options.rounds) times a job; medians") }
    if let device = unjournaledExt4Device(holding: work) {
        // ext4 without a journal (as on these machines) does not reuse an inode freed in the last
        // 60 s, or 300 s while its inode table block is unwritten: each file made meanwhile skips
        // such inodes one by one (`recently_deleted` in the kernel's ialloc.c). Right after a
        // removal of many files (the last run's work folder, a test suite), every create paid for
        // it, in the mount and in passthrough_ll alike: `cp -r` of 10,000 files into a mount took
        // 4.3–6.1 s after one, 1.6–2.1 s without (perf: a third of the mount's samples in
        // recently_deleted). So everything is written back and a minute passes first; nothing is
        // removed until the end (`compare`).
        print("\(device): ext4 without a journal; waiting 61 s for files removed before this run to be forgotten")
        sync()
        sleep(61)
    }
    print(String(repeating: "-", count: 96))

    /// A tree of `count` files of 4 KiB in 100 folders, and its tarball. `text`: `.txt` files of
    /// lines of words (CouchDB compresses text, so a revision id works out its gzip form's MD5).
    func makeTree(_ count: Int, spreadOver documents: Int? = nil, text: Bool = false) throws -> String {
        let root = "\(work)/src-\(count)-\(documents ?? 1)\(text ? "-text" : "")"
        var state: UInt64 = UInt64(count)
        for i in 0..<count {
            let folder = documents.map { "\(root)/doc-\(i % $0)/attachments/d\((i / $0) % 10)" } ?? "\(root)/d\(i % 100)"
            if i < (documents ?? 100) * 10 {  // every folder's first file
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            }
            var bytes = [UInt8](repeating: 0, count: 4096)
            let words = ["the", "mount", "saves", "each", "file", "as", "an", "attachment", "of", "one", "document", "and"]
            for j in stride(from: 0, to: 4096, by: 8) {
                state = state &* 6364136223846793005 &+ 1442695040888963407
                if text {
                    let word = Array((words[Int(state >> 60) % words.count] + (state & 7 == 0 ? "\n" : " ") + "        ").utf8.prefix(8))
                    bytes.replaceSubrange(j..<j + 8, with: word)
                } else {
                    withUnsafeBytes(of: state) { bytes.replaceSubrange(j..<j + 8, with: $0) }
                }
            }
            try Data(bytes).write(to: URL(fileURLWithPath: "\(folder)/f\(i).\(text ? "txt" : "bin")"))
        }
        _ = try timeShell("tar cf \(root).tar -C \(root) .")
        // The same tree as a zip file and as a git repository (one commit), for unzip and git clone.
        _ = try timeShell("cd \(root) && zip -qr \(root).zip .")
        _ = try timeShell("""
            git init -q \(root).repo && cp -r \(root)/. \(root).repo && cd \(root).repo && git add -A \
            && git -c user.name=bench -c user.email=bench@example.com commit -qm tree
            """)
        return root
    }

    var peak = 0
    var referenceMedians: [String: Double] = [:]

    /// Runs `job` into a fresh mount (`into` is the folder below the mount's root), beside the
    /// same job into a plain folder, and beside `passthrough_ll`, each followed by `sync`: with
    /// `--rounds N`, the mount and `passthrough_ll` take turns N times (3N for the smaller tree),
    /// each into a fresh folder, and their medians are compared. Returns the mount's (median) time.
    ///
    /// After `sync` the files are on disk in the mount too (its staging log and the bodies), but
    /// the last files closed are still staged: their revision is saved by the next fold, which
    /// the unmount waits for. So the time until the mount has ended is measured too ("saved"):
    /// what a user waits for between the job and a revision another process sees.
    ///
    /// `shows`: the tree the job copies, and whether it keeps the files' times (to the second).
    /// In the first of several turns, what the mount shows right after the job is compared
    /// with it file by file while the last fold runs (that turn's "saved" is not counted):
    /// two wrong answers during a fold (a time, a lock file) were found only this way.
    @discardableResult
    func compare(_ label: String, files: Int, job: (_ target: String) -> String, into: String,
                 shows: (tree: String, times: Bool)? = nil,
                 again: ((_ target: String) -> String)? = nil) throws -> Double {
        // passthrough_ll holds a descriptor per file it has seen: the 1,000-document trees (22,000
        // files and folders) pass the hard limit here, so it runs beside the one-document jobs only.
        let withReference = into != "docs"
        // Nothing is removed until the end: ext4 (without a journal, as here) skips inodes freed
        // in the last 60–300 s one by one when it makes a file, so a run after a removal pays for it.
        let plain = "\(work)/plain-\(label.filter(\.isLetter))-\(files)"
        try FileManager.default.createDirectory(atPath: "\(plain)/\(into)", withIntermediateDirectories: true)
        _ = try timeShell("sync")
        let plainTime = try timeShell("\(job("\(plain)/\(into)")) && sync")

        var mountTimes: [Double] = [], referenceTimes: [Double] = [], savedTimes: [Double] = [], lastFolds: [Double] = []
        var extra = "", bytes: Int64 = 0, documents = 0
        // A job of 1,000 files takes well under a second, and three turns of it moved 0.3–1.8×
        // from one to the next (run V): the smaller jobs take three times the turns.
        let rounds = withReference ? (files < large ? 3 * options.rounds : options.rounds) : 1
        for round in 0..<rounds {
            // Each goes first in every other round: a disk still busy with what came before
            // (writeback, inodes freed a moment ago) weighs on both alike.
            if withReference, round % 2 == 1, let reference = try referenceTime(label, files: files, round: round, job: job, into: into) {
                referenceTimes.append(reference)
            }
            let dbPath = "\(work)/bench-\(getpid())-\(label.filter(\.isLetter))-\(files)-\(round).sofa"
            _ = try Database.create(at: dbPath)
            let mountPoint = "\(work)/mnt"
            try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
            _ = try timeShell("\(sofaBinary) mount \(dbPath) \(mountPoint)")
            var unmounted = false
            defer { if !unmounted { _ = try? timeShell("fusermount3 -u \(mountPoint)") } }
            try FileManager.default.createDirectory(atPath: "\(mountPoint)/\(into)", withIntermediateDirectories: true)
            _ = try timeShell("sync")  // as before passthrough_ll's: nothing left of the run before
            mountTimes.append(try timeShell("\(job("\(mountPoint)/\(into)")) && sync"))
            let checked = round == 0 && rounds > 1 && shows != nil
            if checked, let shows {
                let (compared, differences) = try differencesShown(in: "\(mountPoint)/\(into)", from: shows.tree, times: shows.times)
                extra += "  shown during the last fold: " + (differences.isEmpty ? "\(compared) as the source" : "\(differences.count) of \(compared) differ")
                if !differences.isEmpty {
                    print("  \(label): \(differences.count) files shown otherwise than the source while the last fold ran; first of them (path, size, mtime: source | mount):\n    "
                          + differences.prefix(10).joined(separator: "\n    "))
                }
            }
            if let again, round == 0 {
                let output = try shellOutput(again("\(mountPoint)/\(into)"))
                let lines = output.split(separator: "\n")
                let sent = lines.first { $0.hasPrefix("Number of regular files transferred") }
                    .map { String($0.split(separator: ":").last ?? "").trimmingCharacters(in: .whitespaces) } ?? "?"
                extra += "  second run: \(sent) sent"
                if sent != "0" {
                    // What rsync found different and how (`-i`: `>f.st` size and time, `>f+++` new).
                    let itemized = lines.filter { $0.hasPrefix(">f") || $0.hasPrefix("<f") }
                    print("  second rsync sent \(sent) files; first of them, itemized:\n    " + itemized.prefix(10).joined(separator: "\n    "))
                }
            }
            let process = mountProcess(of: dbPath)
            peak = max(peak, process.map(peakRSS) ?? 0)
            let unmounting = now()
            _ = try timeShell("fusermount3 -u \(mountPoint)")
            unmounted = true
            // The mount process ends after the unmount, once its last fold is saved (10,000 text
            // files with both cores loaded: more than 5 s, gzip for each body's revision id);
            // wait for it to let go of the database, or the SQLite figure below is read before
            // the fold and the next job runs beside it. Watched by its pid, found before: a
            // `pgrep` each turn (a shell and a scan of /proc through Foundation's Process) made
            // the unmount of 1,000 files read 0.13 s where it takes 0.04-0.05 s.
            var waited = 0
            while let process, isRunning(process) {
                guard waited < 120_000 else { throw SofaError.invalidArgument("the mount of \(dbPath) did not end within 120 s of its unmount") }
                usleep(1_000)
                waited += 1
            }
            // The rsync run again before the unmount has had the first one's last fold done meanwhile.
            if (again == nil || round > 0) && !checked {
                lastFolds.append(now() - unmounting)
                savedTimes.append(mountTimes.last! + lastFolds.last!)
            }
            let info = try Database.open(at: dbPath).info()
            (bytes, documents) = (info.databaseBytes, info.documentCount)
            if withReference, round % 2 == 0, let reference = try referenceTime(label, files: files, round: round, job: job, into: into) {
                referenceTimes.append(reference)
            }
        }
        let mountTime = median(mountTimes)
        row(label, String(format: "plain %7.2f s", plainTime), String(format: "mount %7.2f s", mountTime),
            "ratio " + ratio(plainTime / mountTime),
            String(format: "SQLite %5.0f B/file", Double(bytes) / Double(files)),
            "\(documents) docs" + extra)
        if !referenceTimes.isEmpty {
            let reference = median(referenceTimes)
            referenceMedians[label] = reference
            let each = zip(referenceTimes, mountTimes).map { $0 / $1 }
            let spread = each.count > 1 ? String(format: "  (%d rounds, each %.2f–%.2f×)", each.count, each.min()!, each.max()!) : ""
            row("  libfuse's passthrough_ll, same job", "", String(format: "       %7.2f s", reference),
                "ratio " + ratio(plainTime / reference), "Sofa ÷ it " + ratio(reference / mountTime) + spread)
        }
        if !savedTimes.isEmpty {
            let saved = median(savedTimes)
            let beside = referenceMedians[label].map { "Sofa ÷ passthrough_ll " + ratio($0 / saved) } ?? ""
            row("  mount until saved (unmount ended)", "", String(format: "       %7.2f s", saved), "",
                beside + String(format: "  (unmount %.2f s)", median(lastFolds)))
        }
        return mountTime
    }

    /// How many files the source has, and the regular files below `mounted` whose size (and, with `times`, modification time to
    /// the second) is not the source's, and those in only one of them; a document folder's
    /// properties.json and a clone's `.git/` are the mount's own, not compared.
    func differencesShown(in mounted: String, from tree: String, times: Bool) throws -> (compared: Int, differences: [String]) {
        func files(_ root: String) throws -> [String: String] {
            let listing = try shellOutput("cd \(root) && find . -type f -printf '%P\\t%s\\t%T@\\n'")
            var found: [String: String] = [:]
            for line in listing.split(separator: "\n") {
                let fields = line.split(separator: "\t", omittingEmptySubsequences: false)
                guard fields.count == 3 else { continue }
                let path = String(fields[0])
                if path.hasPrefix(".git/") || path.hasSuffix("properties.json") { continue }
                let seconds = fields[2].split(separator: ".").first.map(String.init) ?? ""
                found[path] = times ? "\(fields[1]) \(seconds)" : String(fields[1])
            }
            return found
        }
        let (source, shown) = (try files(tree), try files(mounted))
        let differences = Set(source.keys).union(shown.keys).sorted().compactMap { path in
            source[path] == shown[path] ? nil : "\(path): \(source[path] ?? "(none)") | \(shown[path] ?? "(none)")"
        }
        return (source.count, differences)
    }

    func median(_ times: [Double]) -> Double {
        let sorted = times.sorted()
        return sorted.count % 2 == 1 ? sorted[sorted.count / 2] : (sorted[sorted.count / 2 - 1] + sorted[sorted.count / 2]) / 2
    }

    /// The same job through libfuse's own minimal C file system (its `passthrough_ll` example,
    /// which passes each call to a folder on the same disk), followed by `sync`: what FUSE alone
    /// costs on this machine, the floor under any FUSE file system's time. nil when the bench
    /// was not given it (`Scripts/bench folders` builds it from libfuse3-dev's examples).
    func referenceTime(_ label: String, files: Int, round: Int, job: (_ target: String) -> String, into: String) throws -> Double? {
        guard let binary = ProcessInfo.processInfo.environment["SOFA_BENCH_FUSE_REFERENCE"] else { return nil }
        let backing = "\(work)/reference-\(label.filter(\.isLetter))-\(files)-\(round)"
        let mountPoint = "\(work)/reference-mnt"
        try FileManager.default.createDirectory(atPath: "\(backing)/\(into)", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        // It keeps a descriptor open per file it has seen: 10,000 files pass the usual 1,024.
        _ = try timeShell("ulimit -n $(ulimit -Hn) && \(binary) -o source=\(backing) \(mountPoint)")
        defer { _ = try? timeShell("fusermount3 -u \(mountPoint)") }
        _ = try timeShell("sync")
        return try timeShell("\(job("\(mountPoint)/\(into)")) && sync")
    }

    /// `cp -r`, `tar x` and `rsync -a` (then again: what it sends) of `tree` into `into`, and
    /// into one document `unzip` and `git clone`; the `cp -r` time.
    func copyAll(_ tree: String, files: Int, into: String, _ what: String) throws -> Double {
        // Into docs/, cp -r runs per document: `cp -r` of DOC/attachments/ into docs/ fails, as every
        // document folder has attachments/ from its mkdir and cp makes it without looking (EEXIST).
        let copy = into == "docs" ? { (target: String) in
            "cd \(tree) && for d in *; do mkdir -p \(target)/$d/attachments && cp -r $d/attachments/. \(target)/$d/attachments/ || exit 1; done"
        } : { (target: String) in "cp -r \(tree)/. \(target)" }
        let time = try compare("cp -r, \(files) files, \(what)", files: files, job: copy, into: into, shows: (tree, false))
        try compare("tar x, \(files) files, \(what)", files: files, job: { "tar xf \(tree).tar -C \($0)" }, into: into, shows: (tree, true))
        try compare("rsync -a, \(files) files, \(what)", files: files, job: { "rsync -a \(tree)/ \($0)/" }, into: into,
                    shows: (tree, true), again: { "rsync -ai --stats \(tree)/ \($0)/" })
        if into != "docs" {
            // unzip writes each file in place; git clone writes its objects under .git/ (scratch
            // files in a mount: hidden names are local) through temporary names, then checks out.
            try compare("unzip, \(files) files, \(what)", files: files, job: { "unzip -q \(tree).zip -d \($0)" }, into: into, shows: (tree, false))
            try compare("git clone, \(files) files, \(what)", files: files,
                        job: { "git clone -q --no-hardlinks file://\(tree).repo \($0)" }, into: into, shows: (tree, false))
        }
        return time
    }

    let fewer = try copyAll(try makeTree(small), files: small, into: "docs/folder/attachments", "one document")
    let more = try copyAll(try makeTree(large), files: large, into: "docs/folder/attachments", "one document")
    let referenceGrowth = referenceMedians["cp -r, \(large) files, one document"].flatMap { more in
        referenceMedians["cp -r, \(small) files, one document"].map { String(format: " (passthrough_ll: %.1f×)", more / $0) }
    } ?? ""
    row("cp -r: \(large) files / \(small) files", String(format: "%.1f× the time for 10× the files", more / fewer) + referenceGrowth)
    let texts = try makeTree(large, text: true)
    try compare("cp -r, \(large) text files, one document", files: large, job: { "cp -r \(texts)/. \($0)" }, into: "docs/folder/attachments",
                shows: (texts, false))
    _ = try copyAll(try makeTree(large, spreadOver: large / 10), files: large, into: "docs", "\(large / 10) documents")
    print(String(repeating: "-", count: 96))
    row("peak RSS of the mount process (largest run)", String(format: "%.0f MB", Double(peak) / 1e6))
}

/// The device name of the ext4 file system without a journal that holds `path` (`vda`), or nil
/// for any other: `/proc/fs/ext4/NAME` is there for each ext4 file system, `/proc/fs/jbd2/NAME-8`
/// for each with a journal.
func unjournaledExt4Device(holding path: String) -> String? {
    var info = stat()
    guard stat(path, &info) == 0 else { return nil }
    let device = UInt64(info.st_dev)  // glibc's major() and minor(), which are macros
    let major = ((device >> 8) & 0xfff) | ((device >> 32) & ~0xfff), minor = (device & 0xff) | ((device >> 12) & ~0xff)
    let link = "/sys/dev/block/\(major):\(minor)"
    guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: link) else { return nil }
    let name = (target as NSString).lastPathComponent
    let exists = { (path: String) in access(path, F_OK) == 0 }
    return exists("/proc/fs/ext4/\(name)") && !exists("/proc/fs/jbd2/\(name)-8") ? name : nil
}
