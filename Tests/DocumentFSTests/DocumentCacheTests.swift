@testable import DocumentFS
import DocumentModel
import DocumentStore
import Foundation
import Testing

/// The mount's cache of documents, alone: a load that a save of its document overtook is not
/// used, as it may show the document from before the save.
@Suite struct DocumentCacheTests {
    func entry(_ rendered: String) -> DocumentCache.Entry {
        DocumentCache.Entry(revision: nil, rendered: Array(rendered.utf8), hasConflicts: false)
    }

    /// A fold forgets the document while a lookup loads it (the load read the revision from
    /// before the fold): the lookup loads it again and gets what the fold saved, and that is
    /// what stays cached. A forget of another document does not cost a reload.
    @Test func aLoadOvertakenByASaveOfItsDocumentIsDoneAgain() {
        let cache = DocumentCache()
        var loads = 0
        let got = cache.entry("doc") {
            loads += 1
            if loads == 1 { cache.forget("doc") }  // the fold's commit, while this load ran
            return entry(loads == 1 ? "before the fold" : "after the fold")
        }
        #expect(loads == 2)
        #expect(got.rendered == Array("after the fold".utf8))
        #expect(cache.entry("doc") { entry("not loaded again") }.rendered == Array("after the fold".utf8))

        var otherLoads = 0
        let other = cache.entry("other") {
            otherLoads += 1
            // Another document's forget (in another stripe of the counters).
            var another = 0
            while UInt(bitPattern: "x\(another)".hashValue) % 64 == UInt(bitPattern: "other".hashValue) % 64 { another += 1 }
            cache.forget("x\(another)")
            return entry("other")
        }
        #expect(otherLoads == 1 && other.rendered == Array("other".utf8))
    }

    /// A document saved at every load is loaded a bounded number of times, the last load used.
    @Test func aDocumentSavedAtEveryLoadIsLoadedABoundedNumberOfTimes() {
        let cache = DocumentCache()
        var loads = 0
        let got = cache.entry("busy") {
            loads += 1
            cache.forget("busy")
            return entry("load \(loads)")
        }
        #expect(loads == 4 && got.rendered == Array("load 4".utf8))
        var again = 0
        _ = cache.entry("busy") { again += 1; return entry("kept") }
        #expect(again == 1, "an overtaken load is not kept")
    }
}
