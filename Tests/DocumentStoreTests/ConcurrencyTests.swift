import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

@Suite struct ConcurrencyTests {
    let directory = TemporaryDirectory()

    @Test func manyThreadsSavingAndReadingLoseNothing() throws {
        let db = try directory.makeDatabase()
        let threads = 8
        let savesPerThread = 50
        let failures = FailureLog()
        DispatchQueue.concurrentPerform(iterations: threads * 2) { index in
            do {
                if index < threads {
                    for n in 0..<savesPerThread {
                        // Own documents, plus a shared counter updated with retry on conflict.
                        var draft = try db.newRevision(of: "t\(index)-\(n)")
                        draft.properties = ["n": .integer(Int64(n))]
                        try db.save(draft)
                        while true {
                            var shared = try db.newRevision(of: "counter")
                            shared.properties = ["count": .integer((shared.properties["count"]?.int64Value ?? 0) + 1)]
                            do { try db.save(shared); break } catch SofaError.conflict { continue }
                        }
                    }
                } else {
                    for _ in 0..<200 {
                        // A reader never sees a torn document.
                        if let counter = try db.document(withID: "counter") {
                            let count = counter.properties["count"]?.int64Value ?? -1
                            if Int64(counter.revID.generation) != count { failures.record("torn read: \(counter.revID) has \(count)") }
                        }
                    }
                }
            } catch {
                failures.record("\(error)")
            }
        }
        #expect(failures.messages.isEmpty, "\(failures.messages.prefix(3))")
        #expect(try db.document(withID: "counter")?.properties["count"] == .integer(Int64(threads * savesPerThread)))
        #expect(try db.documents().count == threads * savesPerThread + 1)
    }
}

/// Collects failures from worker threads; assertions happen on the test thread.
final class FailureLog: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []

    func record(_ message: String) { lock.lock(); list.append(message); lock.unlock() }
    var messages: [String] { lock.lock(); defer { lock.unlock() }; return list }
}
