import ArgumentParser
import DocumentModel
import DocumentStore
import Foundation

struct Find: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "Find documents with a Mango selector, as CouchDB's _find does.",
        discussion: """
            Prints one matching document per line (JSON). The selector is CouchDB's: \
            {"type": "note", "n": {"$gt": 3}}. A query is answered through the index that fits it \
            (see `sofa index`), or by reading every document, in id order, with a warning on standard \
            error; --sort needs an index on its fields, as in CouchDB. --json prints _find's whole answer.
            """)

    @OptionGroup var db: DatabaseArgument
    @Argument(help: "The selector (JSON), or a whole _find query with \"selector\" in it.") var selector: String
    @Option(help: "At most this many documents (default: all).") var limit: Int?
    @Option(help: "Skip this many matches first.") var skip = 0
    @Option(help: "Order by these fields (comma-separated; FIELD:desc for descending).") var sort: String?
    @Option(help: "Keep only these fields (comma-separated dotted paths).") var fields: String?
    @Flag(help: "Print _find's answer: docs, bookmark, warning and execution_stats.") var json = false
    @OptionGroup(title: "Global options") var global: GlobalOptions
    var printsJSON: Bool { json }

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
        let query = try MangoQuery(body)
        let started = Date()
        let result = try db.open().find(query)
        guard json else {
            for warning in result.warnings { Output.error("warning: \(warning)") }
            for document in result.documents { Output.line(JSONValue.object(document).jsonString()) }
            return
        }
        var answer: JSONObject = ["docs": .array(result.documents.map { .object($0) }), "bookmark": .string(result.bookmark?.token ?? "nil")]
        if !result.warnings.isEmpty { answer["warning"] = .string(result.warnings.joined(separator: "\n")) }
        answer["index"] = .object(result.plan.index?.listing ?? MangoIndex.allDocsListing)
        answer["execution_stats"] = ["total_keys_examined": .integer(Int64(result.keysExamined)),
                                     "total_docs_examined": .integer(Int64(result.documentsExamined)),
                                     "results_returned": .integer(Int64(result.documents.count)),
                                     "execution_time_ms": .double(Date().timeIntervalSince(started) * 1000)]
        Output.json(.object(answer))
    }
}

/// `sofa index`: Mango JSON indexes, kept in query design documents as CouchDB keeps them.
struct Index: SofaCommand {
    static let configuration = CommandConfiguration(
        abstract: "List, create or delete Mango indexes (what `sofa find` and _find use).",
        discussion: """
            With no option, lists the indexes. An index lives in a design document with \
            "language": "query", as in CouchDB, so it replicates both ways; it is built when it is \
            created (or pulled) and kept up to date with every save.
            """)

    @OptionGroup var db: DatabaseArgument
    @Option(help: "Create an index on these fields (comma-separated dotted paths).") var create: String?
    @Option(help: "With --create: its design document (default: a digest of the definition).") var ddoc: String?
    @Option(help: "With --create: its name (default: a digest of the definition).") var name: String?
    @Option(help: "With --create: index only documents matching this selector (JSON).") var partial: String?
    @Option(help: "Delete the index DDOC/NAME.") var delete: String?
    @OptionGroup(title: "Global options") var global: GlobalOptions

    func execute() throws {
        let database = try db.open()
        if let create {
            var definition: JSONObject = ["fields": .array(create.split(separator: ",").map { .string(String($0)) })]
            if let partial { definition["partial_filter_selector"] = .object(try parseJSONObject(Array(partial.utf8), what: "a selector")) }
            var request: JSONObject = ["index": .object(definition)]
            if let ddoc { request["ddoc"] = .string(ddoc) }
            if let name { request["name"] = .string(name) }
            let index = try MangoIndex(request: request)
            let created = try database.createIndex(index)
            Output.line("\(created ? "created" : "exists"): \(index.designDocument) \(index.name)")
        } else if let delete {
            let parts = delete.split(separator: "/").map(String.init).filter { $0 != "_design" }
            guard parts.count == 2 else { throw SofaError.invalidArgument("--delete takes DDOC/NAME, as `sofa index` lists them") }
            guard try database.deleteIndex(designDocument: "_design/" + parts[0], name: parts[1]) else {
                throw SofaError.invalidArgument("no index \(parts[1]) in _design/\(parts[0])")
            }
            Output.line("deleted: _design/\(parts[0]) \(parts[1])")
        } else {
            for index in try database.mangoIndexes() {
                let filter = index.partialFilter.map { "  where " + JSONValue.object($0).jsonString() } ?? ""
                Output.line("\(index.designDocument.dropFirst(8))/\(index.name)  \(index.fields.joined(separator: ","))\(filter)")
            }
        }
    }
}
