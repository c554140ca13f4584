import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

struct Find: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Find documents with a Mango selector, as CouchDB's _find does.",
        discussion: """
            Prints one matching document per line (JSON), in id order or --sort's. The selector is \
            CouchDB's: {"type": "note", "n": {"$gt": 3}}; --json prints _find's whole answer instead. \
            There are no indexes yet: every document is read.
            """)

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "The selector (JSON), or a whole _find query with \"selector\" in it.") var selector: String
    @Option(help: "At most this many documents (default: all).") var limit: Int?
    @Option(help: "Skip this many matches first.") var skip = 0
    @Option(help: "Order by these fields (comma-separated; FIELD:desc for descending).") var sort: String?
    @Option(help: "Keep only these fields (comma-separated dotted paths).") var fields: String?
    @Flag(help: "Print _find's answer: docs, bookmark, warning and execution_stats.") var json = false

    func execute() throws {
        let parsed = try parseJSONObject(Array(selector.utf8), what: "a selector")
        var body: JSONObject = parsed["selector"] != nil ? parsed : ["selector": .object(parsed)]
        if let limit { body["limit"] = .integer(Int64(limit)) } else if body["limit"] == nil { body["limit"] = .integer(Int64(Int32.max)) }
        if skip > 0 { body["skip"] = .integer(Int64(skip)) }
        if let sort {
            body["sort"] = .array(sort.split(separator: ",").map { item in
                let parts = item.split(separator: ":").map(String.init)
                return .object([parts[0]: .string(parts.count > 1 && parts[1] == "desc" ? "desc" : "asc")])
            })
        }
        if let fields { body["fields"] = .array(fields.split(separator: ",").map { .string(String($0)) }) }
        if json { body["execution_stats"] = true }
        let query = try MangoQuery(body)
        let started = Date()
        let result = try db.open().find(query)
        if json {
            Output.json(["docs": .array(result.documents.map { .object($0) }), "bookmark": .string(result.bookmark?.token ?? "nil"),
                         "warning": "No matching index found, create an index to optimize query time.",
                         "execution_stats": ["total_docs_examined": .integer(Int64(result.documentsExamined)),
                                             "results_returned": .integer(Int64(result.documents.count)),
                                             "execution_time_ms": .double(Date().timeIntervalSince(started) * 1000)]])
            return
        }
        for document in result.documents { Output.line(JSONValue.object(document).jsonString()) }
    }
}
