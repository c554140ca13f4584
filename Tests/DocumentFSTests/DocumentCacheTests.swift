@testable import DocumentFS
import DocumentModel
import DocumentStore
import MountTables
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

    /// A file is given its time (`rsync -a` on its temporary name) and renamed while the
    /// document is loaded, the load having read its rows before: the entry kept holds both
    /// changes, not the rows as the load read them (the file showed its revision's time until
    /// the next save, and a second `rsync -a` sent it again). Rows changed in another document
    /// are not taken in.
    @Test func rowsChangedWhileALoadRunsAreInTheEntryItKeeps() {
        let cache = DocumentCache()
        let given = LocalAttributes(digest: "md5-a", modified: 1_234_567_890_000_000_000)
        let got = cache.entry("doc") {
            // What the load read: the temporary name with no time yet.
            let read = DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false, local: [".a.txt.X1": LocalAttributes(digest: "md5-a")])
            cache.setLocal("doc", ".a.txt.X1", given)  // utimensat, after the load read the rows
            cache.setLocal("doc", [("a.txt", given), (".a.txt.X1", nil)])  // the rename
            cache.setLocal("other", "a.txt", LocalAttributes(digest: "md5-b", modified: 1))
            return read
        }
        #expect(got.local["a.txt"] == given && got.local[".a.txt.X1"] == nil)
        let kept = cache.entry("doc") { DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false) }
        #expect(kept.local == ["a.txt": given])
        let other = cache.entry("other") { DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false) }
        #expect(other.local.isEmpty, "a change made while no load of it ran is not kept for a later load")
    }

    /// Loads of one document that overlap, the oldest ending first (lookups on several threads
    /// while folds go on): each takes in the changes made since it began, and the changes no
    /// load under way needs are dropped, so that loads overlapping without end keep only those.
    @Test func changesKeptForLoadsGoOnceNoLoadUnderWayNeedsThem() {
        let cache = DocumentCache()
        func row(_ n: Int) -> LocalAttributes { LocalAttributes(digest: "md5-\(n)", modified: Int64(n)) }
        let aStarted = DispatchSemaphore(value: 0), aGo = DispatchSemaphore(value: 0), aDone = DispatchSemaphore(value: 0)
        let bStarted = DispatchSemaphore(value: 0), bGo = DispatchSemaphore(value: 0), bDone = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var gotA: DocumentCache.Entry?, gotB: DocumentCache.Entry?
        Thread.detachNewThread {
            gotA = cache.entry("doc") { aStarted.signal(); aGo.wait(); return DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false) }
            aDone.signal()
        }
        aStarted.wait()
        cache.setLocal("doc", "c1", row(1))
        Thread.detachNewThread {
            gotB = cache.entry("doc") { bStarted.signal(); bGo.wait(); return DocumentCache.Entry(revision: nil, rendered: [], hasConflicts: false) }
            bDone.signal()
        }
        bStarted.wait()
        cache.setLocal("doc", "c2", row(2))
        #expect(cache.changesKeptForLoads(of: "doc") == 2)
        aGo.signal(); aDone.wait()
        #expect(gotA?.local == ["c1": row(1), "c2": row(2)])
        #expect(cache.changesKeptForLoads(of: "doc") == 1, "c1 was made before the load still under way began")
        cache.setLocal("doc", "c3", row(3))
        bGo.signal(); bDone.wait()
        #expect(gotB?.local == ["c2": row(2), "c3": row(3)], "the load that began after c1 takes in what came after it")
        #expect(cache.changesKeptForLoads(of: "doc") == 0)
    }
}
