import DocumentModel
import Foundation

/// What `Database.find` returns: one page of matching documents, as CouchDB renders them
/// (`_id`, `_rev`, properties, attachment stubs), projected to the query's fields.
public struct FindResult: Sendable {
    public var documents: [JSONObject] = []
    /// Where the next page starts; nil when this one reached the end.
    public var bookmark: MangoQuery.Bookmark?
    /// Documents read to answer (every live one: there are no indexes yet).
    public var documentsExamined = 0
}

extension Database {
    /// Answers a Mango query by reading every live document's current revision in id order
    /// (CouchDB's `_all_docs` index). Without `sort` it stops as soon as the page is full and
    /// holds one page in memory; with `sort` it keeps every match to order them.
    public func find(_ query: MangoQuery) throws -> FindResult {
        var result = FindResult()
        var matches: [JSONObject] = []
        var cursor: String?
        var toSkip = query.skip
        if query.sort.isEmpty, let bookmark = query.bookmark {
            guard case .after(let id) = bookmark else { throw SofaError.invalidArgument("invalid bookmark for this query") }
            cursor = id
            toSkip = 0
        }
        scan: while true {
            let page = try documents(after: cursor, limit: 500)
            guard let last = page.last else { break }
            cursor = last.docID
            for summary in page {
                guard let revision = try document(withID: summary.docID) else { continue }
                result.documentsExamined += 1
                let rendered = try CouchFormat.render(revision, history: [revision.revID], options: CouchFormat.Options(),
                                                      readBody: { _ in [] }).json
                guard query.selector.matches(rendered) else { continue }
                if !query.sort.isEmpty {
                    matches.append(rendered)
                } else if toSkip > 0 {
                    toSkip -= 1
                } else if matches.count < query.limit {
                    matches.append(rendered)
                } else {
                    // One more match than the page holds: there is a next page.
                    result.bookmark = matches.last?["_id"]?.stringValue.map(MangoQuery.Bookmark.after)
                    break scan
                }
            }
        }
        if query.sort.isEmpty {
            result.documents = matches.map(query.project)
            return result
        }
        matches.sort(by: query.precedes)
        var start = query.skip
        if let bookmark = query.bookmark {
            guard case .offset(let offset) = bookmark else { throw SofaError.invalidArgument("invalid bookmark for this query") }
            start = offset
        }
        let page = matches.dropFirst(start).prefix(query.limit)
        result.documents = page.map(query.project)
        if start + page.count < matches.count { result.bookmark = .offset(start + page.count) }
        return result
    }
}
