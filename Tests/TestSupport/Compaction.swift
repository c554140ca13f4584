import DocumentModel
import DocumentStore
import Foundation
import Testing

/// Every blob file of `db` an hour old: past `Tuning.blobGracePeriod`, as bodies left by edits
/// long ago, which a compaction that is not alone frees.
public func ageBlobs(_ db: Database) throws {
    for name in try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory) where name.hasSuffix(".blob") {
        var times = [timespec(tv_sec: time(nil) - 3600, tv_nsec: 0), timespec(tv_sec: time(nil) - 3600, tv_nsec: 0)]
        #expect(utimensat(AT_FDCWD, db.blobs.directory + "/" + name, &times, 0) == 0)
    }
}

/// How many blob files `db` holds.
public func blobFiles(_ db: Database) throws -> Int {
    try FileManager.default.contentsOfDirectory(atPath: db.blobs.directory).count { $0.hasSuffix(".blob") }
}

/// A database worth compacting (`AutoCompaction`'s tests): a photo edited ten times (each
/// version 300 KB, the nine old ones orphaned by the edits, aged), and a Couchbase Lite-style
/// document whose blob is named only by a dictionary in its body. Returns the photo's current
/// bytes and the named blob's.
public func makeWastefulDatabase(in directory: TemporaryDirectory) throws -> (Database, current: [UInt8], named: [UInt8]) {
    let db = try directory.makeDatabase()
    var current: [UInt8] = []
    for version in 0..<10 {
        current = [UInt8](repeating: UInt8(version), count: 300_000)
        var draft = try db.newRevision(of: "photo")
        try draft.setAttachment("photo.jpg", data: current)
        draft.properties = ["version": .integer(Int64(version))]
        _ = try db.save(draft)
    }
    let named = Array("a body named only by a blob dictionary".utf8)
    _ = try db.blobs.write(named)
    var draft = try db.newRevision(of: "phone")
    draft.properties = ["avatar": .object(Blobs.dictionary(key: BlobKey.of(named), length: Int64(named.count), contentType: "image/png"))]
    _ = try db.save(draft)
    try ageBlobs(db)
    return (db, current, named)
}
