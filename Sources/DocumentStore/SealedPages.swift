import CSQLite3
import CSeal
import DocumentModel
import Foundation

/// The key that seals an SQLite file's pages with AES-256-GCM on disk (the VFS shim in
/// `CSeal`; docs/encryption.md): a VFS of its own, registered for as long as this
/// lives and carrying a copy of the key, which it wipes when it goes. Connections opened with
/// it keep it alive.
///
/// Not yet reached from `Database.open` (issue #32): the blob store, key files and the
/// commands come next.
final class SealedPages: @unchecked Sendable {
    // Sendable invariant: immutable after init; the VFS it names is SQLite's, thread-safe.
    let vfsName: String

    init(key: SealingKey) throws {
        vfsName = "sofa-sealed-" + UUID().uuidString
        let code = sofa_sealed_vfs_register(vfsName, key.bytes)
        guard code == SQLITE_OK else {
            throw SofaError.sqlite(code: code, message: "cannot register the sealed-pages VFS", sql: nil)
        }
    }

    deinit { sofa_sealed_vfs_unregister(vfsName) }

    /// What a sealed connection needs before its first statement: a new file is made with
    /// the page size and the reserved bytes the seal takes, and temporary files stay in memory
    /// (the VFS refuses to write them).
    static func prepare(_ connection: SQLiteConnection, isNew: Bool) throws {
        try connection.execute("PRAGMA temp_store = MEMORY")
        guard isNew else { return }
        try connection.execute("PRAGMA page_size = \(SOFA_SEALED_PAGE_SIZE)")
        var reserve = Int32(SOFA_SEALED_RESERVE)
        let code = sqlite3_file_control(connection.handle, "main", SQLITE_FCNTL_RESERVE_BYTES, &reserve)
        guard code == SQLITE_OK else { throw connection.error(code, sql: "SQLITE_FCNTL_RESERVE_BYTES") }
    }
}
