import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Other names of a stored body (`body_digests`): CouchDB's MD5 of a gzip form, kept so a
/// later pull that names the body so finds it; and the upgrade of version 1 databases.
@Suite struct BodyDigestTests {
    let directory = TemporaryDirectory()

    @Test func aBodyIsFoundUnderAnAliasAndTheAliasGoesWithTheBlob() throws {
        let db = try directory.makeDatabase()
        var draft = try db.newDocument("doc")
        try draft.setAttachment("a.txt", data: Array("some text".utf8), contentType: "text/plain")
        let saved = try db.save(draft)
        let key = try #require(saved.attachments.first?.blobKey)
        let alias = "md5-CzDfAHx884e72GgEVUS6Ug=="
        #expect(try db.storedBody(digest: alias) == nil)
        try db.recordAlias(alias, of: key)
        #expect(try db.storedBody(digest: alias)?.key == key)
        #expect(try db.storedBody(digest: alias)?.length == 9)
        // Once nothing refers to the body, compaction deletes it and its alias.
        _ = try db.deleteDocument("doc")
        var old = stat()
        stat(db.blobs.path(for: key), &old)
        var times = [timespec(tv_sec: 1, tv_nsec: 0), timespec(tv_sec: 1, tv_nsec: 0)]
        utimensat(AT_FDCWD, db.blobs.path(for: key), &times, 0)  // older than the grace period
        _ = try db.compact()
        #expect(!db.blobs.contains(key))
        #expect(try db.storedBody(digest: alias) == nil)
    }

    @Test func aVersionOneDatabaseGainsTheTableWhenOpened() throws {
        let path = directory.appending("old.sofa")
        do {
            let db = try Database.create(at: path)
            var draft = try db.newDocument("doc")
            try draft.setAttachment("a.bin", data: [1, 2, 3])
            try draft.setAttachment("pulled.txt", data: Array("hello world hello world hello world".utf8), contentType: "text/plain")
            try db.save(draft)
        }
        // What a database made before schema 2 looks like, with a text body pulled from CouchDB:
        // decoded bytes, but CouchDB's digest of its gzip form.
        let downgrade = try shell("""
            python3 -c "import sqlite3; c = sqlite3.connect('\(path)/db.sqlite3'); c.execute('DROP TABLE body_digests'); c.execute('DROP TABLE schema_steps'); \
            c.execute(\\"UPDATE rev_attachments SET digest = 'md5-CzDfAHx884e72GgEVUS6Ug==' WHERE name = 'pulled.txt'\\"); \
            c.execute('PRAGMA user_version = 1'); c.commit()"
            """)
        #expect(downgrade.succeeded, "\(downgrade.stderr)")
        let db = try Database.open(at: path)
        // The upgrade gave the text body the digest of its stored bytes, and kept CouchDB's as an alias.
        let pulled = try #require(try db.document(withID: "doc")?.attachment(named: "pulled.txt"))
        let bytes = Array("hello world hello world hello world".utf8)
        #expect(pulled.digest == "md5-" + Data(MessageDigest.hash(.md5, bytes)).base64EncodedString())
        #expect(try db.storedBody(digest: "md5-CzDfAHx884e72GgEVUS6Ug==")?.key == pulled.blobKey)
        let key = try #require(try db.document(withID: "doc")?.attachment(named: "a.bin")?.blobKey)
        try db.recordAlias("md5-AAAAAAAAAAAAAAAAAAAAAA==", of: key)
        #expect(try db.storedBody(digest: "md5-AAAAAAAAAAAAAAAAAAAAAA==")?.key == key)
        let version = try shell("python3 -c \"import sqlite3; print(sqlite3.connect('\(path)/db.sqlite3').execute('PRAGMA user_version').fetchone()[0])\"")
        #expect(version.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "8")
        // Version 8's columns: the attachments' order and CouchDB's MD5 of each body.
        let columns = try shell("python3 -c \"import sqlite3; print([r[1] for r in sqlite3.connect('\(path)/db.sqlite3').execute('PRAGMA table_info(rev_attachments)')])\"")
        #expect(columns.stdout.contains("'position'") && columns.stdout.contains("'couch_md5'"), "\(columns.stdout)")
    }
}
