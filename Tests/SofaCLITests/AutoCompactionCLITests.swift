import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// `sofa serve` and `sofa mount` compact the databases they hold open by themselves
/// (`--auto-compact SECONDS`, 60 by default), as CouchDB's compaction daemon does: a database
/// that grew by edits shrinks back while it is served or mounted, and what it shows stays.
@Suite struct AutoCompactionCLITests {
    let directory = TemporaryDirectory()

    @Test func aServedDatabaseIsCompactedByItselfAndServesTheSameDocuments() throws {
        let (db, current, named) = try makeWastefulDatabase(in: directory)
        let server = try ServedDatabases([db.path, "--auto-compact", "1"])
        let connection = try server.connect()
        // A database is opened at its first request; from then on it is looked after.
        #expect(try connection.request("GET", "/test/photo/photo.jpg").body == current)
        #expect(try waitUntil(120) { try blobFiles(db) == 2 }, "the nine old versions of the photo are freed")
        #expect(try connection.request("GET", "/test/photo/photo.jpg").body == current)
        #expect(try connection.request("GET", "/test/phone/blob_%2Favatar").body == named)
        #expect(server.stop().status == 0)
    }

    @Test func aMountedDatabaseIsCompactedByItselfAndShowsTheSameFiles() throws {
        #expect(isRoot, "mount tests need root (as CI has) for /dev/fuse and umount")
        let (db, current, _) = try makeWastefulDatabase(in: directory)
        let mount = try MountedDatabase(db.path, arguments: ["--auto-compact", "1"])
        #expect(try waitUntil(120) { try blobFiles(db) == 2 }, "the nine old versions of the photo are freed")
        #expect(FileManager.default.contents(atPath: mount.path("docs/photo/attachments/photo.jpg")).map(Array.init) == current)
    }

    @Test func offLeavesTheDatabaseAsItIsAndABadValueIsRefused() throws {
        let refused = try sofa("serve", directory.appending("none.sofa"), "--auto-compact", "soon")
        #expect(refused.status == 64 && refused.stderr.contains("--auto-compact soon: expected a number of seconds, or off"), "\(refused.stderr)")
        let (db, current, _) = try makeWastefulDatabase(in: directory)
        let server = try ServedDatabases([db.path, "--auto-compact", "off"])
        #expect(try server.connect().request("GET", "/test/photo/photo.jpg").body == current)
        // The same wait that sees the compaction above, here to see none (a second pass at 1 s
        // would have come and gone many times over).
        #expect(try !waitUntil(5) { try blobFiles(db) < 11 })
        #expect(server.stop().status == 0)
    }
}
