import DocumentModel
import DocumentStore
import MountTables
import Foundation
import Testing
import TestSupport

/// Runs a shell command in the mount's context and expects it to succeed.
@discardableResult
func sh(_ command: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
    let result = try shell(command)
    #expect(result.succeeded, "\(command) failed: \(result.stderr)", sourceLocation: sourceLocation)
    return result.stdout
}

/// The current generation of a document, through the database, once the mount has folded
/// the files it staged (see `settled`).
func generation(_ db: Database, _ id: String) throws -> Int {
    try settled(db)
    return try db.currentRevision(of: id)?.revID.generation ?? 0
}

/// Waits until no mount has files staged in `db` (a burst of files written into a document
/// becomes one revision once the document is quiet: `Tuning.burstQuietWindow`), so that what a
/// test reads through the database is what the mount shows. Fails after 30 s: a fold of thousands
/// of files on a machine whose cores are busy with other work takes seconds, not a quiet window.
func settled(_ db: Database, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let deadline = Date().addingTimeInterval(30)
    while try !db.stagedAttachments().isEmpty {
        guard Date() < deadline else {
            Issue.record("files staged by the mount were not folded into a revision within 30 s", sourceLocation: sourceLocation)
            return
        }
        usleep(20_000)
    }
}


/// A live document through the database, once the mount has folded what it staged.
func document(_ db: Database, _ id: String) throws -> Revision? {
    try settled(db)
    return try db.document(withID: id)
}
