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

/// Polls `condition` until it holds or `timeout` passes; returns the seconds it took, or nil.
func eventually(timeout: Double = 3, _ condition: () throws -> Bool) rethrows -> Double? {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if try condition() { return Date().timeIntervalSince(start) }
        usleep(20_000)
    }
    return nil
}

extension Database {
    @discardableResult
    func put(_ id: String, _ properties: JSONObject, attachments: [String: [UInt8]] = [:]) throws -> Revision {
        var draft = try newRevision(of: id)
        draft.properties = properties
        for (name, bytes) in attachments { try draft.setAttachment(name, data: bytes) }
        return try save(draft)
    }
}
