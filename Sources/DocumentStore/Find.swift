import DocumentModel
import Foundation

/// What `Database.find` returns: one page of matching documents, as CouchDB renders them
/// (`_id`, `_rev`, properties, attachment stubs), projected to the query's fields.
public struct FindResult: Sendable {
    public var documents: [JSONObject] = []
    /// Where each document is in the query's order: a page that starts after one goes on from it.
    public var positions: [MangoQuery.Bookmark] = []
    /// Where the next page starts; nil when this one reached the end.
    public var bookmark: MangoQuery.Bookmark?
    public var plan: QueryPlan
    /// Index entries read, and documents read to answer.
    public var keysExamined = 0
    public var documentsExamined = 0
    /// CouchDB's warnings (no index fit, `use_index` not used) and Sofa's (a `$regex` ran out of time).
    public var warnings: [String] {
        var warnings = plan.warnings
        // CouchDB's index_scan_warning_threshold (10).
        if !documents.isEmpty && documentsExamined > 10 * documents.count {
            warnings.append("The number of documents examined is high in proportion to the number of results returned. "
                            + "Consider adding a more specific index to improve this.")
        }
        if regexTimeouts > 0 { warnings.append("$regex ran out of time on \(regexTimeouts) documents, which did not match.") }
        return warnings
    }
    var regexTimeouts = 0
}

extension Database {
    /// Answers a Mango query: through the index `MangoQuery.plan` chooses, reading only its
    /// range of keys in its order, or through every document in id order. Either way each
    /// candidate is matched against the whole selector and the page stops as soon as it is
    /// full, so one page of documents is held in memory. Design documents never match.
    public func find(_ query: MangoQuery) throws -> FindResult {
        let plan = try query.plan(indexes: mangoIndexes())
        var result = FindResult(plan: plan)
        var toSkip = query.skip
        switch (query.bookmark, plan.index) {
        case (.after, .some), (.afterKey, nil):
            throw SofaError.invalidQuery(error: "invalid_bookmark", reason: "Invalid bookmark value: this bookmark is for another query")
        default: break
        }
        // CouchDB gives the position of the last document returned, also on the last page:
        // a page shorter than the limit is the last. With none returned, the one given.
        result.bookmark = query.bookmark
        let looksAtAttachments = query.selector.looksAtAttachments
        // Asked only for ids and revisions (the mount's saved queries), nothing is rendered.
        let onlyIdentity = query.fields.map { Set($0).isSubset(of: ["_id", "_rev"]) } ?? false
        try read { connection in
            let indexID = try plan.index.map { index in
                try connection.query("SELECT index_id FROM mango_indexes WHERE ddoc = ? AND name = ?",
                                     .text(index.designDocument), .text(index.name)) { $0.int64(0) }.first
            }
            var cursor = query.bookmark
            scan: while true {
                let page = try candidates(plan, indexID: indexID ?? nil, after: cursor, limit: 200, in: connection)
                guard let last = page.last else { break }
                cursor = last.key.map { .afterKey($0, last.docID) } ?? .after(last.docID)
                for candidate in page {
                    result.keysExamined += 1
                    // The indexed values settle the conditions on the indexed fields without reading the document.
                    if let index = plan.index, let values = candidate.values {
                        let partial = JSONObject(Array(zip(index.fields, values)))
                        guard query.selector.mayMatch(partial, known: Set(index.fields)) else { continue }
                    }
                    result.documentsExamined += 1
                    guard let rendered = try match(query.selector, candidate, looksAtAttachments: looksAtAttachments,
                                                   rendering: !onlyIdentity, in: connection) else { continue }
                    if toSkip > 0 {
                        toSkip -= 1
                    } else if result.documents.count < query.limit {
                        let position: MangoQuery.Bookmark = candidate.key.map { .afterKey($0, candidate.docID) } ?? .after(candidate.docID)
                        result.documents.append(query.project(rendered))
                        result.positions.append(position)
                        result.bookmark = position
                    } else {
                        break scan
                    }
                }
                if plan.onlyID != nil { break }
            }
        }
        result.regexTimeouts = query.selector.regexTimeouts
        return result
    }

    /// Whether the live document `id` matches `selector`, as `find` decides it for each
    /// candidate (design documents never match).
    public func matches(_ selector: Selector, documentID id: String) throws -> Bool {
        guard !id.hasPrefix(DocumentID.designPrefix) else { return false }
        let looksAtAttachments = selector.looksAtAttachments
        return try read { connection in
            try connection.query("""
                SELECT d.doc_key, d.doc_id, d.current_rev, NULL, NULL, r.body FROM docs d
                JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev WHERE d.doc_id = ? AND d.deleted = 0
                """, .text(id), row: Database.candidate).first.map {
                try match(selector, $0, looksAtAttachments: looksAtAttachments, rendering: false, in: connection) != nil
            } ?? false
        }
    }

    /// The candidate as `_find` renders it (attachment stubs), if it matches: matched on its
    /// properties with `_id` and `_rev`, rendered only when it matches (and `rendering`), or
    /// first when the selector looks at `_attachments`. Not rendering, a match is its `_id`
    /// and `_rev`.
    private func match(_ selector: Selector, _ candidate: Candidate, looksAtAttachments: Bool, rendering: Bool = true,
                       in connection: SQLiteConnection) throws -> JSONObject? {
        func render() throws -> JSONObject? {
            try loadRevision(docKey: candidate.docKey, docID: candidate.docID, revID: candidate.revID, in: connection).map {
                try CouchFormat.render($0, history: [$0.revID], options: CouchFormat.Options(), readBody: { _ in [] }).json
            }
        }
        if looksAtAttachments {
            guard let rendered = try render(), selector.matches(rendered) else { return nil }
            return rendered
        }
        guard selector.matches(try Database.indexedDocument(candidate.docID, revID: candidate.revID.description, body: candidate.body))
        else { return nil }
        return rendering ? try render() : ["_id": .string(candidate.docID), "_rev": .string(candidate.revID.description)]
    }

    private struct Candidate {
        let docKey: Int64
        let docID: String
        let revID: RevisionID
        /// The index key and the values it was made of (nil under `_all_docs`).
        let key: [UInt8]?
        let values: [JSONValue]?
        /// The current revision's properties (JSON).
        let body: [UInt8]
    }

    /// The next documents the plan reads after `cursor`, in its order.
    private func candidates(_ plan: QueryPlan, indexID: Int64?, after cursor: MangoQuery.Bookmark?, limit: Int,
                            in connection: SQLiteConnection) throws -> [Candidate] {
        let order = plan.descending ? "DESC" : "ASC"
        let beyond = plan.descending ? "<" : ">"
        guard let indexID else {
            // _all_docs: live documents by id, design documents aside.
            var conditions = ["d.deleted = 0", "substr(d.doc_id, 1, 8) <> '_design/'"]
            var arguments: [SQLValue] = []
            if let id = plan.onlyID {
                conditions.append("d.doc_id = ?")
                arguments.append(.text(id))
            }
            if case .after(let id) = cursor {
                conditions.append("d.doc_id \(beyond) ?")
                arguments.append(.text(id))
            }
            return try connection.query("""
                SELECT d.doc_key, d.doc_id, d.current_rev, NULL, NULL, r.body FROM docs d
                JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev WHERE \(conditions.joined(separator: " AND "))
                ORDER BY d.doc_id \(order) LIMIT \(limit)
                """, arguments, row: Database.candidate)
        }
        var conditions = ["m.index_id = ?", "d.deleted = 0"]
        var arguments: [SQLValue] = [.integer(indexID)]
        if let lower = plan.lower {
            conditions.append("m.key >= ?")
            arguments.append(.blob(lower))
        }
        if let upper = plan.upper {
            conditions.append("m.key < ?")
            arguments.append(.blob(upper))
        }
        if case .afterKey(let key, let id) = cursor {
            conditions.append("(m.key, m.doc_id) \(beyond) (?, ?)")
            arguments += [.blob(key), .text(id)]
        }
        return try connection.query("""
            SELECT d.doc_key, d.doc_id, d.current_rev, m.key, m.field_values, r.body FROM mango_keys m JOIN docs d ON d.doc_id = m.doc_id
            JOIN revs r ON r.doc_key = d.doc_key AND r.rev_id = d.current_rev WHERE \(conditions.joined(separator: " AND ")) ORDER BY m.key \(order), m.doc_id \(order) LIMIT \(limit)
            """, arguments, row: Database.candidate)
    }

    private static func candidate(_ row: SQLiteRow) throws -> Candidate {
        Candidate(docKey: row.int64(0), docID: row.text(1), revID: try revisionID(row.text(2)), key: row.isNull(3) ? nil : row.blob(3),
                  values: row.isNull(4) ? nil : try JSONParser.parse(row.bytes(4)).arrayValue, body: row.bytes(5))
    }
}
