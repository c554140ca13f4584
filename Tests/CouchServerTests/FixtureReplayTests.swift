import DocumentModel
import Foundation
import Testing
import TestSupport

/// Replays byte-exact requests recorded against CouchDB 3.4.3 (../shared/fixtures)
/// against `sofa serve`, and checks that every answer has the status and shape
/// CouchDB gave: the same JSON keys and ids/revisions, the same multipart layout
/// and attachment bytes.
///
/// The scenario data is loaded by replaying CouchDB's own replicator pushing it
/// (`replicator-push`, revision ids and all), so later folders find the revisions
/// their requests name.
@Suite(.serialized) struct FixtureReplayTests {
    static let root = fixturesDirectory + "/couchdb-3.4.3"
    /// The fixture password is masked with six '*'; the server is given exactly that.
    static let password = "******"

    /// Exchanges whose answers differ from CouchDB's on purpose.
    static let knownDifferences: [String: String] = [
        // The scenario reached Sofa through replication, which carries only leaf revisions'
        // bodies; CouchDB still had the body of an old revision it made itself.
        "client-source/015-bulk-get-json": "CouchDB returns the body of a non-leaf revision (updated-3x 2-…) that replication never sent",
        "client-source/016-bulk-get-multipart": "the same request as 015, as multipart",
        "client-source/032-get-doc-revs-revs-info": "_revs_info: the old revisions' bodies never reached Sofa, so they are missing",
        // Sequences belong to each server: another server's sequence (and the order its
        // changes were made in) cannot select the same rows here.
        "client-source/005-changes-normal-since-middle": "since= carries CouchDB's own sequence",
        "client-source/006-changes-normal-limit-3": "the first three changes follow each server's write order",
        "client-source/008-changes-longpoll-since-0-immediate": "limit=2: the first two changes follow each server's write order",
        // Sofa stores attachment bodies decoded, so it has no gzip form; CouchDB ignores Range on gzip bodies.
        "client-source/047-att-get-text-accept-gzip": "Sofa sends identity bytes even when the client accepts gzip",
        "client-source/048-att-get-text-range": "an identity body honours Range (206) where CouchDB's gzip one cannot",
        // Several ranges: Sofa answers with the whole body (allowed by RFC 9110), not multipart/byteranges.
        "client-source/043-att-get-binary-multi-range": "several ranges are answered with the whole body",
    ]

    final class Replay {
        let server: ServedDatabases
        let connection: HTTPConnection
        var cookie: String?
        var mismatches: [String] = []
        var compared = 0
        /// CouchDB's `last_seq` values → the ones this server gave for the same feed, so a
        /// client passing a sequence back (`since=`) passes the one this server made.
        var sequences: [String: String] = [:]

        init(directory: TemporaryDirectory) throws {
            let passwordFile = directory.appending("password")
            try FixtureReplayTests.password.write(toFile: passwordFile, atomically: true, encoding: .utf8)
            server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
            connection = try server.connect()
        }

        var basic: String { "Basic " + Data("admin:\(FixtureReplayTests.password)".utf8).base64EncodedString() }

        /// Sends one recorded request (credentials and database names rewritten) and compares the answer.
        func replay(_ folder: String, _ exchange: JSONValue, renaming: [String: String] = [:]) throws {
            let name = "\(folder)/\(exchange["request_file"]!.stringValue!.replacingOccurrences(of: ".request", with: ""))"
            let expectedStatus = Int(exchange["status"]!.int64Value!)
            var raw = [UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(root)/\(folder)/\(exchange["request_file"]!.stringValue!)")))
            let split = raw.firstRange(of: Array("\r\n\r\n".utf8))!
            let body = Array(raw[split.upperBound...])
            var lines = String(decoding: raw[..<split.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
            for (old, new) in renaming { lines[0] = lines[0].replacingOccurrences(of: old, with: new) }
            for (couch, ours) in sequences { lines[0] = lines[0].replacingOccurrences(of: "since=\(couch)", with: "since=\(ours)") }
            lines = lines.map { line in
                let lower = line.lowercased()
                if lower.hasPrefix("authorization:") { return expectedStatus == 401 ? line : "Authorization: \(basic)" }
                if lower.hasPrefix("cookie:"), let cookie { return "Cookie: \(cookie)" }
                return line
            }
            raw = Array((lines.joined(separator: "\r\n") + "\r\n\r\n").utf8) + body
            if ProcessInfo.processInfo.environment["SOFA_REPLAY_TRACE"] != nil { print("replay \(name)") }
            if exchange["response_complete"]?.boolValue == false {
                // The recorder hung up on a feed that never ends (a heartbeat feed): do the same.
                let feed = try server.connect()
                try feed.send(raw)
                Thread.sleep(forTimeInterval: 1.5)
                feed.close()
                compared += 1
                return
            }
            try connection.send(raw)
            let response = try connection.readResponse(isHead: exchange["method"]?.stringValue == "HEAD")
            if let setCookie = response.header("Set-Cookie"), setCookie.hasPrefix("AuthSession=") {
                cookie = String(setCookie.split(separator: ";")[0])
            }
            compared += 1
            if let reason = FixtureReplayTests.knownDifferences[name] {
                _ = reason
                return
            }
            let recorded = try recordedResponse(folder, exchange)
            if let couch = (try? JSONParser.parse(recorded))?["last_seq"]?.stringValue, let ours = response.json?["last_seq"]?.stringValue {
                sequences[couch] = ours
            }
            var problems: [String] = []
            if response.status != expectedStatus { problems.append("status \(response.status), CouchDB \(expectedStatus)") }
            let expectedType = exchange["response_headers"]?.arrayValue?.first { $0[0]?.stringValue == "Content-Type" }?[1]?.stringValue
            let mediaType = { (value: String?) in value?.split(separator: ";").first.map(String.init) }
            if mediaType(expectedType) != mediaType(response.header("Content-Type")) {
                problems.append("Content-Type \(response.header("Content-Type") ?? "none"), CouchDB \(expectedType ?? "none")")
            } else if let expectedType, expectedType.hasPrefix("multipart/") {
                problems += Shape.compareMultipart(recorded, expectedType, response.body, response.header("Content-Type")!)
            } else if expectedType == "application/json" {
                problems += Shape.compareJSONBodies(recorded, response.body)
            } else if !recorded.isEmpty && recorded != response.body {
                problems.append("body differs (\(response.body.count) bytes, CouchDB \(recorded.count))")
            }
            if !problems.isEmpty { mismatches.append("\(name): " + problems.joined(separator: "; ")) }
        }

        func recordedResponse(_ folder: String, _ exchange: JSONValue) throws -> [UInt8] {
            let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(root)/\(folder)/\(exchange["response_file"]!.stringValue!)")))
            let split = data.firstRange(of: Array("\r\n\r\n".utf8))!
            return Array(data[split.upperBound...])
        }

        /// Stores the documents of recorded `_bulk_get` answers with their histories, as a
        /// replicator would: new revisions on the source for a later folder to pull.
        func storeRecordedDocuments(_ folder: String, _ files: [String], database: String) throws {
            var docs: [JSONValue] = []
            for file in files {
                let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(root)/\(folder)/\(file)")))
                let body = try JSONParser.parse(Array(data[data.firstRange(of: Array("\r\n\r\n".utf8))!.upperBound...]))
                for result in body["results"]?.arrayValue ?? [] {
                    docs += (result["docs"]?.arrayValue ?? []).compactMap { $0["ok"] }
                }
            }
            let stored = try connection.json("POST", "/\(database)/_bulk_docs", ["new_edits": false, "docs": .array(docs)],
                                             headers: [("Authorization", basic)])
            if stored.status != 201 { mismatches.append("storing \(folder)'s documents: \(stored.status) \(stored.text)") }
        }

        func replayFolder(_ folder: String, renaming: [String: String] = [:], only: ((JSONValue) -> Bool)? = nil) throws {
            let index = try JSONParser.parse([UInt8](try Data(contentsOf: URL(fileURLWithPath: "\(root)/\(folder)/index.json"))))
            for exchange in index["exchanges"]?.arrayValue ?? [] where only?(exchange) ?? true {
                try replay(folder, exchange, renaming: renaming)
            }
        }
    }

    @Test func couchDBsReplicatorAndClientsGetCouchDBsAnswers() throws {
        try #require(FileManager.default.fileExists(atPath: Self.root + "/README.md"), "fixtures not found at \(Self.root)")
        let directory = TemporaryDirectory()
        let replay = try Replay(directory: directory)
        let create = try replay.connection.request("PUT", "/fixture-src", headers: [("Authorization", replay.basic)])
        #expect(create.status == 201)

        // CouchDB's replicator pushes the scenario into Sofa (the target it pushed to is renamed fixture-src).
        try replay.replayFolder("replicator-push", renaming: ["/fixture-pushed": "/fixture-src"])
        // The _local document of the scenario, as the recorder created it.
        try replay.replayFolder("scenario-setup", only: { $0["target"]?.stringValue?.contains("/_local/") == true })
        // CouchDB's replicator pulls it back out.
        try replay.replayFolder("replicator-pull")
        // What a replicator client receives from a source, and from a target.
        try replay.replayFolder("client-source")
        try replay.replayFolder("client-target")
        // Then the source changes (a new document, a new revision of att-two changing a.txt only)
        // and the replicator pulls again from its checkpoint, with atts_since.
        try replay.storeRecordedDocuments("replicator-pull-incremental", ["007-post-bulk-get.response", "008-post-bulk-get.response"],
                                          database: "fixture-src")
        try replay.replayFolder("replicator-pull-incremental")

        #expect(replay.compared == 24 + 1 + 19 + 11 + 68 + 21, "every exchange of those folders was replayed")
        let report = replay.mismatches.joined(separator: "\n")
        #expect(replay.mismatches.isEmpty, "\(replay.mismatches.count) answers differ from CouchDB's:\n\(report)")
        #expect(replay.server.stop().succeeded)
    }
}

/// Compares responses by shape: object keys, ids and revisions, array lengths,
/// value kinds, multipart structure and attachment bytes. Values that differ by
/// nature between servers (sequences, times, uuids, digests) are compared by kind.
enum Shape {
    /// Keys whose values must be equal, not just of the same kind.
    static let exact: Set<String> = ["id", "_id", "rev", "_rev", "ok", "error", "missing", "deleted", "_deleted", "start",
                                     "ids", "revpos", "length", "content_type", "stub", "follows", "status", "doc_count",
                                     "doc_del_count", "_conflicts", "_deleted_conflicts", "possible_ancestors", "data"]
    /// CouchDB keys that describe its gzip storage, which Sofa does not have (it stores decoded bytes).
    static let couchOnly: Set<String> = ["encoding", "encoded_length"]
    /// Lists whose length is each server's own business.
    static let anyLength: Set<String> = ["features"]

    static func compareJSONBodies(_ expected: [UInt8], _ actual: [UInt8]) -> [String] {
        // Continuous feeds and other line-oriented bodies: compare line by line, ignoring heartbeats.
        let expectedLines = expected.split(separator: 0x0A).filter { !$0.isEmpty }
        if expectedLines.count > 1, (try? JSONParser.parse(expected)) == nil {
            let actualLines = actual.split(separator: 0x0A).filter { !$0.isEmpty }
            guard expectedLines.count == actualLines.count else {
                return ["\(actualLines.count) lines, CouchDB \(expectedLines.count)"]
            }
            // Rows are matched by id: each server lists changes in its own write order.
            let parse = { (lines: [ArraySlice<UInt8>], rows: Bool) in
                JSONValue.array(lines.compactMap { try? JSONParser.parse(Array($0)) }.filter { ($0["id"] != nil) == rows })
            }
            return compare(parse(expectedLines, true), parse(actualLines, true), path: "$rows")
                + compare(parse(expectedLines, false), parse(actualLines, false), path: "$lines")
        }
        guard let want = try? JSONParser.parse(expected) else { return expected.isEmpty ? [] : ["CouchDB's body is not JSON"] }
        guard let got = try? JSONParser.parse(actual) else { return ["body is not JSON: \(String(decoding: actual.prefix(200), as: UTF8.self))"] }
        if actual.last != 0x0A { return ["JSON body does not end with a newline"] }
        return compare(want, got, path: "$")
    }

    static func compare(_ want: JSONValue, _ got: JSONValue, path: String) -> [String] {
        switch (want, got) {
        case (.object(let a), .object(let b)):
            var problems: [String] = []
            for (key, value) in a where !couchOnly.contains(key) {
                guard let other = b[key] else {
                    problems.append("\(path).\(key) missing")
                    continue
                }
                if exact.contains(key) && value.objectValue == nil && !sameValue(value, other, key: key) {
                    problems.append("\(path).\(key) is \(other.jsonString().prefix(120)), CouchDB \(value.jsonString().prefix(120))")
                } else {
                    problems += compare(value, other, path: "\(path).\(key)")
                }
            }
            return problems
        case (.array, .array) where anyLength.contains(String(path.split(separator: ".").last ?? "")):
            return []
        case (.array(let a), .array(let b)):
            guard a.count == b.count else { return ["\(path) has \(b.count) elements, CouchDB \(a.count)"] }
            // Rows keyed by id may come in another order (sequences differ between servers).
            let key = { (value: JSONValue) -> String? in value["id"]?.stringValue ?? value["ok"]?["_id"]?.stringValue }
            if a.allSatisfy({ key($0) != nil }), b.allSatisfy({ key($0) != nil }), Set(a.compactMap(key)).count == a.count {
                let byID = Dictionary(b.map { (key($0)!, $0) }, uniquingKeysWith: { first, _ in first })
                return a.flatMap { item in
                    byID[key(item)!].map { compare(item, $0, path: "\(path)[\(key(item)!)]") } ?? ["\(path) lacks \(key(item)!)"]
                }
            }
            return zip(a, b).enumerated().flatMap { compare($1.0, $1.1, path: "\(path)[\($0)]") }
        case (.integer, .integer), (.integer, .bigInteger), (.bigInteger, .integer), (.bigInteger, .bigInteger),
             (.double, .double), (.string, .string), (.bool, .bool), (.null, .null):
            return []
        case (.double, .integer), (.integer, .double):
            return []
        default:
            return ["\(path) is \(got.kindName), CouchDB \(want.kindName)"]
        }
    }

    private static func sameValue(_ a: JSONValue, _ b: JSONValue, key: String) -> Bool {
        if a == b { return true }
        // Sofa keeps exact integers and re-serialises doubles its own way; compare numbers by value.
        if case .double(let x) = a, case .double(let y) = b { return x == y }
        // possible_ancestors and _conflicts may list the same revisions in another order.
        if let x = a.arrayValue, let y = b.arrayValue { return Set(x.map { $0.jsonString() }) == Set(y.map { $0.jsonString() }) }
        return false
    }

    // MARK: - Multipart

    struct Part {
        var headers: [String: String]
        var body: [UInt8]
    }

    static func parts(_ body: [UInt8], contentType: String) -> [Part]? {
        guard var boundary = contentType.components(separatedBy: "boundary=").last else { return nil }
        boundary = boundary.trimmingCharacters(in: CharacterSet(charactersIn: "\" "))
        let delimiter = Array("--\(boundary)".utf8)
        var pieces: [[UInt8]] = []
        var rest = ArraySlice(body)
        guard let first = rest.firstRange(of: delimiter) else { return nil }
        rest = rest[first.upperBound...]
        while let next = rest.firstRange(of: Array("\r\n".utf8) + delimiter) {
            pieces.append(Array(rest[..<next.lowerBound]))
            rest = rest[next.upperBound...]
        }
        return pieces.compactMap { piece in
            // Each piece starts with "\r\n" (after the delimiter line) then headers, blank line, body.
            guard piece.starts(with: Array("\r\n".utf8)) else { return nil }
            let content = piece.dropFirst(2)
            guard let end = content.firstRange(of: Array("\r\n\r\n".utf8)) ?? (content.starts(with: Array("\r\n".utf8)) ? content.startIndex..<(content.startIndex + 2) : nil) else { return nil }
            var headers: [String: String] = [:]
            for line in String(decoding: content[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n") where line.contains(":") {
                let colon = line.firstIndex(of: ":")!
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            return Part(headers: headers, body: Array(content[end.upperBound...]))
        }
    }

    static func compareMultipart(_ expected: [UInt8], _ expectedType: String, _ actual: [UInt8], _ actualType: String) -> [String] {
        guard let want = parts(expected, contentType: expectedType) else { return ["CouchDB's multipart body does not parse"] }
        guard let got = parts(actual, contentType: actualType) else { return ["multipart body does not parse"] }
        guard want.count == got.count else { return ["\(got.count) parts, CouchDB \(want.count)"] }
        // Attachment parts follow each server's `_attachments` order: pair them by file name.
        let disposition = { (part: Part) in part.headers["content-disposition"] ?? "" }
        let attachments = Dictionary(got.filter { !disposition($0).isEmpty }.map { (disposition($0), $0) }, uniquingKeysWith: { a, _ in a })
        let paired = want.enumerated().map { index, part in disposition(part).isEmpty ? got[index] : attachments[disposition(part)] ?? got[index] }
        var problems: [String] = []
        for (index, (a, b)) in zip(want, paired).enumerated() {
            let typeA = a.headers["content-type"] ?? "", typeB = b.headers["content-type"] ?? ""
            if typeA.hasPrefix("multipart/") {
                guard typeB.hasPrefix("multipart/") else { problems.append("part \(index) is \(typeB), CouchDB \(typeA)"); continue }
                problems += compareMultipart(a.body, typeA, b.body, typeB).map { "part \(index): \($0)" }
            } else if typeA.hasPrefix("application/json") {
                guard typeB == typeA else { problems.append("part \(index) is \(typeB), CouchDB \(typeA)"); continue }
                problems += compareJSONBodies(a.body + [0x0A], b.body + [0x0A]).map { "part \(index): \($0)" }
            } else {
                // An attachment part: same name and type; the same bytes unless CouchDB sent its gzip form.
                if a.headers["content-disposition"] != b.headers["content-disposition"] || typeA != typeB {
                    problems.append("part \(index) is \(b.headers), CouchDB \(a.headers)")
                }
                if a.headers["content-encoding"] == nil && a.body != b.body {
                    problems.append("part \(index) has \(b.body.count) bytes, CouchDB \(a.body.count)")
                }
            }
        }
        return problems
    }
}
