import DocumentModel
import DocumentStore
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

/// The current generation of a document, through the database.
func generation(_ db: Database, _ id: String) throws -> Int {
    try db.currentRevision(of: id)?.revID.generation ?? 0
}

