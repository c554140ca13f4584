import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Snapshot zips as Sofa writes them (its own one-pass zip writer) and reads them back
/// (ZIPFoundation), checked by Info-ZIP's `unzip -t` too.
@Suite struct SnapshotTests {
    let directory = TemporaryDirectory()

    /// A database with a text body (deflated in the zip), a binary one (stored) and a deferred one.
    func makeDatabase() throws -> Database {
        let db = try directory.makeDatabase("notes.sofa")
        var draft = try db.newRevision(of: "doc")
        draft.properties = ["title": "ünïcødé 😀"]
        try draft.setAttachment("notes/read me.txt", data: Array(String(repeating: "all work and no play ", count: 5000).utf8),
                                contentType: "text/plain")
        let binary = directory.appending("binary.bin")
        try writePatternFile(binary, count: 300_000)
        try draft.setAttachment("binary.bin", contentsOf: binary)
        try draft.setAttachment(Attachment(name: "elsewhere.jpg", contentType: "image/jpeg", length: 42,
                                           digest: "md5-AAAAAAAAAAAAAAAAAAAAAA==", blobKey: nil, revpos: 1))
        try db.save(draft)
        for i in 0..<50 {
            var plain = try db.newRevision(of: String(format: "n-%02d", i))
            plain.properties = ["n": .integer(Int64(i))]
            try db.save(plain)
        }
        return db
    }

    func contents(_ db: Database) throws -> [String: String] {
        var result: [String: String] = [:]
        for summary in try db.documents() {
            let revision = try #require(try db.document(withID: summary.docID))
            result[summary.docID] = "\(revision.revID) " + JSONValue.object(revision.properties).jsonString(.canonical) + " "
                + revision.attachments.map { "\($0.name)=\($0.digest):\($0.contentAvailable)" }.joined(separator: ",")
        }
        return result
    }

    @Test(arguments: [UInt64(0xFFFF_FFFF), 1000])
    func aSnapshotZipsAndInstallsWithEverythingChecked(zip64Threshold: UInt64) throws {
        let db = try makeDatabase()
        let zip = directory.appending("notes-\(zip64Threshold).zip")
        let report = try db.writeSnapshot(to: zip, zip64Threshold: zip64Threshold)
        #expect(report.documentCount == 51 && report.bodyCount == 2 && report.bodiesNotPresent == 1, "\(report)")

        // Info-ZIP agrees that the zip is sound (with ZIP64 records when the threshold forces them).
        let tested = try shell("unzip -t '\(zip)'")
        #expect(tested.succeeded && tested.stdout.contains("No errors detected"), "\(tested.stdout)\(tested.stderr)")
        let listing = try shell("zipinfo -v '\(zip)'").stdout
        #expect(listing.contains("compression method:                             none (stored)"))
        if zip64Threshold < 0xFFFF_FFFF {
            // Everything from 1000 bytes on is stored with 64-bit sizes and offsets.
            #expect(listing.components(separatedBy: "PKWARE 64-bit sizes").count - 1 == 3, "\(listing.prefix(3000))")
        } else {
            #expect(!listing.contains("PKWARE 64-bit sizes"))
            #expect(listing.contains("compression method:                             deflated"))
            #expect(report.zipBytes < report.bodyBytes, "the text body is deflated")
        }

        let installed = try Database.install(snapshot: zip, at: directory.appending("installed-\(zip64Threshold).sofa"))
        #expect(try contents(installed) == contents(db))
        #expect(try installed.previousPrivateUUIDs == [db.privateUUID])
        #expect(installed.privateUUID != db.privateUUID && installed.publicUUID != db.publicUUID)
        #expect(try installed.check().isEmpty)
    }

    @Test func manySmallBodiesRoundTrip() throws {
        let db = try directory.makeDatabase("many.sofa")
        try db.inBatch { batch in
            for i in 0..<1000 {
                var draft = try db.newRevision(of: String(format: "d-%05d", i))
                try draft.setAttachment("a.json", data: Array(#"{"i":\#(i)}"#.utf8), contentType: "application/json")
                try batch.save(draft)
            }
        }
        let zip = directory.appending("many.zip")
        let report = try db.writeSnapshot(to: zip)
        #expect(report.bodyCount == 1000)
        #expect(try shell("unzip -tq '\(zip)'").succeeded)
        let installed = try Database.install(snapshot: zip, at: directory.appending("many-installed.sofa"))
        #expect(try installed.counts().documents == 1000)
        #expect(try installed.info().missingBodyCount == 0)
    }
}
