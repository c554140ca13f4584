import DocumentModel
import Foundation

/// What `sofa info` and `GET /db` tell about the database.
extension Database {
    public func info() throws -> DatabaseInfo {
        let blobList = try blobs.allBlobs()
        return try read { connection in
            let counts = try connection.query("SELECT COALESCE(SUM(deleted = 0), 0), COALESCE(SUM(deleted), 0) FROM docs") { ($0.int(0), $0.int(1)) }[0]
            var missing = 0
            try connection.forEach("""
                SELECT a.blob_key FROM rev_attachments a JOIN docs d ON a.doc_key = d.doc_key AND a.rev_id = d.current_rev
                """) { row in
                guard let key = row.optionalText(0).flatMap(BlobKey.init(hex:)), blobs.contains(key) else {
                    missing += 1
                    return
                }
            }
            return DatabaseInfo(
                path: path, documentCount: counts.0, deletedCount: counts.1,
                lastSequence: try Database.lastSequence(in: connection),
                publicUUID: publicUUID, privateUUID: privateUUID, revsLimit: try Database.revsLimit(in: connection),
                databaseBytes: databaseFileBytes(), blobCount: blobList.count,
                blobBytes: blobList.reduce(0) { $0 + $1.size }, missingBodyCount: missing)
        }
    }

    func databaseFileBytes() -> Int64 {
        ["", "-wal"].reduce(Int64(0)) { total, suffix in
            var info = stat()
            return total + (stat(databaseFilePath + suffix, &info) == 0 ? Int64(info.st_size) : 0)
        }
    }
}
