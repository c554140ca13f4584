import DocumentModel
import DocumentStore
import Foundation

/// `sofa-bench couchbase-lite`: Couchbase Lite's own replicator (LiteCore 3.2's `cblite`, BLIP
/// over a WebSocket) pulling 10,000 documents, 1,000 with a 100 KB blob, from `sofa serve`,
/// beside `sofa pull` of the same database over CouchDB's protocol; then both pushing it back.
func couchbaseLiteBenchmark(_ options: Options) throws {
    let work = try makeWorkFolder("couchbase-lite", options)
    defer { try? FileManager.default.removeItem(atPath: work) }
    let sofa = sofaBinary
    let cblite = FileManager.default.currentDirectoryPath + "/../shared/peers/cblite"
    let dataset = ReplicationDataset(options)
    let (documents, withBlob, blobSize) = (dataset.documents, dataset.withAttachment, dataset.attachmentSize)
    print("Couchbase Lite sync benchmark: \(documents) documents, \(withBlob) with a \(blobSize / 1000) KB blob; in \(work)")
    print(String(repeating: "-", count: 104))
    _ = try dataset.makeSource(at: "\(work)/source.sofa", asBlobs: true)
    for name in ["pushed-blip", "pushed-couch", "pushed-sofa-blip"] { _ = try Database.create(at: "\(work)/\(name).sofa") }
    let server = try ServeProcess(sofa: sofa, databases: ["\(work)/source.sofa", "\(work)/pushed-blip.sofa", "\(work)/pushed-couch.sofa",
                                                          "\(work)/pushed-sofa-blip.sofa"], work: work)
    defer { server.stop() }
    let http = "http://127.0.0.1:\(server.port)"
    let ws = "ws://127.0.0.1:\(server.port)"
    let megabytes = Double(withBlob * blobSize) / 1e6

    _ = try timeShell("\(sofa) create \(work)/pulled.sofa > /dev/null")
    let sofaPull = try timeWithRSS([sofa, "pull", "\(work)/pulled.sofa", "\(http)/source"])
    let blipPull = try timeWithRSS([cblite, "--create", "--upgrade", "pull", "\(work)/app.cblite2", "\(ws)/source"])
    let sofaPush = try timeWithRSS([sofa, "push", "\(work)/pulled.sofa", "\(http)/pushed-couch"])
    // Sofa's own replicator over BLIP.
    _ = try timeShell("\(sofa) create \(work)/pulled-blip.sofa > /dev/null")
    let sofaBlipPull = try timeWithRSS([sofa, "pull", "\(work)/pulled-blip.sofa", "\(ws)/source"])
    let sofaBlipPush = try timeWithRSS([sofa, "push", "\(work)/pulled-blip.sofa", "\(ws)/pushed-sofa-blip"])
    // (cblite's push needs the remote introduced by a pull first: nothing to pull from an empty database.)
    _ = try timeWithRSS([cblite, "--writeable", "pull", "\(work)/app.cblite2", "\(ws)/pushed-blip"])
    let blipPush = try timeWithRSS([cblite, "--writeable", "push", "\(work)/app.cblite2", "\(ws)/pushed-blip"])
    let again = try timeWithRSS([cblite, "--writeable", "pull", "\(work)/app.cblite2", "\(ws)/source"])
    let pushedCount = try Database.open(at: "\(work)/pushed-blip.sofa").changes(since: 0).count
    guard pushedCount == documents else { throw SofaError.invalidArgument("the BLIP push carried \(pushedCount) documents, not \(documents)") }

    func line(_ label: String, _ run: (seconds: Double, maxRSS: Int, cpuSeconds: Double)) {
        row(label, String(format: "%6.2f s", run.seconds), String(format: "%7.0f docs/s", Double(documents) / run.seconds),
            String(format: "%6.1f MB/s", megabytes / run.seconds), String(format: "client peak RSS %.0f MB", Double(run.maxRSS) / 1e6))
    }
    line("pull: sofa pull (CouchDB protocol)", sofaPull)
    line("pull: cblite pull (BLIP, Couchbase Lite)", blipPull)
    row("  BLIP / CouchDB protocol", String(format: "%.2f×", blipPull.seconds / sofaPull.seconds))
    line("pull: sofa pull ws:// (BLIP, Sofa)", sofaBlipPull)
    line("push: sofa push (CouchDB protocol)", sofaPush)
    line("push: cblite push (BLIP, Couchbase Lite)", blipPush)
    row("  BLIP / CouchDB protocol", String(format: "%.2f×", blipPush.seconds / sofaPush.seconds))
    line("push: sofa push ws:// (BLIP, Sofa)", sofaBlipPush)
    row("cblite pull again, nothing new", String(format: "%6.2f s", again.seconds))
}
