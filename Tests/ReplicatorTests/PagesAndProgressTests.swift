import DocumentModel
@testable import Replicator
import Testing

/// A `_changes` answer read in one request and fetched and written as pages of `batchSize`.
@Suite struct ChangePageTests {
    func batch(_ count: Int, isLast: Bool, pending: Int?) -> ChangeBatch {
        ChangeBatch(changes: (0..<count).map { PeerChange(sequence: .integer(Int64($0 + 1)), docID: "d\($0)", revs: []) },
                    lastSequence: .string("end"), isLast: isLast, pending: pending)
    }

    @Test func aBatchSplitsIntoPagesThatEachEndAtTheirLastChange() {
        let pages = batch(23, isLast: true, pending: 0).pages(of: 10)
        #expect(pages.map(\.changes.count) == [10, 10, 3])
        #expect(pages.map(\.lastSequence) == [.integer(10), .integer(20), .string("end")],
                "a page ends at its last change; the last page where the answer did")
        #expect(pages.map(\.isLast) == [false, false, true], "only the last page may end the feed")
        #expect(pages.map(\.pending) == [13, 3, 0], "what is left after each page")
        #expect(pages.flatMap(\.changes).map(\.docID) == (0..<23).map { "d\($0)" })
    }

    @Test func aFullAnswerIsNotTheLastPageAndASmallOneIsOnePage() {
        let pages = batch(20, isLast: false, pending: nil).pages(of: 10)
        #expect(pages.map(\.isLast) == [false, false])
        #expect(pages.map(\.pending) == [nil, nil], "a peer that does not tell stays silent")
        #expect(pages.last?.lastSequence == .string("end"))
        let one = batch(4, isLast: true, pending: 0).pages(of: 10)
        #expect(one.count == 1 && one[0].lastSequence == .string("end") && one[0].isLast)
        #expect(batch(0, isLast: true, pending: 0).pages(of: 10).count == 1, "an empty answer is still the page that ends the feed")
    }
}

/// The time left that `sofa pull` shows, from CouchDB's `pending` (every change left, filtered
/// out or not).
@Suite struct TimeLeftTests {
    /// A filtered pull of a 100,000-change feed that lets one change in 100 through: 500 rows
    /// read in 10 s while 50,000 changes went by. Timed by the rows read (as it was), 50,000
    /// left would take 1,000 s; at the pace the feed goes by, 10 s.
    @Test func aFilteredPullIsTimedByTheFeedItGoesThroughNotTheRowsItReads() throws {
        var estimate = TimeLeftEstimate()
        let first = estimate.update(pending: 99_000, elapsed: 0.2)
        #expect(first == nil, "no pace yet after one page")
        let estimated = estimate.update(pending: 50_000, elapsed: 10.0)
        let left = try #require(estimated)
        #expect(abs(left - 50_000 * 9.8 / 49_000) < 0.001, "\(left)")
        let done = estimate.update(pending: 0, elapsed: 20)
        #expect(done == 0)
    }

    @Test func withoutACountThereIsNoEstimate() {
        var estimate = TimeLeftEstimate()
        let estimates = [estimate.update(pending: nil, elapsed: 1), estimate.update(pending: 10, elapsed: 2),
                         estimate.update(pending: 10, elapsed: 3)]
        #expect(estimates == [nil, nil, nil], "no count, then one that has not gone down: no pace")
    }
}
