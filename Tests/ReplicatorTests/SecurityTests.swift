import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// Users, sessions and `_security` of `sofa serve --user`, side by side with the live CouchDB:
/// the same requests from the server's admin, two `_users` users and nobody, the same answers.
extension CouchDBInteropTests {
    enum Credentials { case admin, user(String), wrong(String), anonymous, cookie(String) }

    func securityScenario(_ send: (String, String, JSONValue?, [(String, String)]) throws -> HTTPResponse, db: String, tag: String) throws -> [String] {
        var seen: [String] = []
        let (bob, carol) = ("bob-\(tag)", "carol-\(tag)")
        func request(_ method: String, _ path: String, _ body: JSONValue? = nil, as who: Credentials) throws -> HTTPResponse {
            func basic(_ pair: String) -> (String, String) { ("Authorization", "Basic " + Data(pair.utf8).base64EncodedString()) }
            switch who {
            case .admin: return try send(method, path, body, [basic("admin:secret")])
            case .user(let name): return try send(method, path, body, [basic("\(name):pw-\(name)")])
            case .wrong(let name): return try send(method, path, body, [basic("\(name):nope")])
            case .anonymous: return try send(method, path, body, [])
            case .cookie(let value): return try send(method, path, body, [("Cookie", "AuthSession=\(value)")])
            }
        }
        func record(_ label: String, _ response: HTTPResponse, keys: [String]? = ["ok", "error", "reason", "userCtx", "name", "roles", "_id"]) {
            var body = response.json ?? .null
            if let keys, case .object(let object) = body { body = .object(object.filter { keys.contains($0) }) }
            seen.append("\(label): \(response.status) \(body.jsonString(.canonical))")
        }
        record("create db", try request("PUT", "/\(db)", as: .admin))
        record("doc", try request("PUT", "/\(db)/doc", ["n": 1], as: .admin), keys: ["ok"])
        for (name, roles) in [(bob, ["readers"]), (carol, [])] {
            record("user \(name)", try request("PUT", "/_users/org.couchdb.user:\(name)",
                                               ["name": .string(name), "password": .string("pw-\(name)"), "type": "user",
                                                "roles": .array(roles.map { .string($0) })], as: .admin), keys: ["ok"])
        }
        // The stored password is a PBKDF2 key, never the password.
        let stored = try request("GET", "/_users/org.couchdb.user:\(bob)", as: .admin).json?.objectValue ?? [:]
        seen.append("stored: \(stored.keys.sorted()) \(stored["password_scheme"] ?? .null) \(stored["pbkdf2_prf"] ?? .null) \(stored["iterations"] ?? .null)")
        // _users' rules.
        record("wrong id", try request("PUT", "/_users/org.couchdb.user:x-\(tag)", ["name": "other", "password": "p", "type": "user", "roles": []], as: .admin))
        record("wrong type", try request("PUT", "/_users/org.couchdb.user:x-\(tag)", ["name": .string("x-\(tag)"), "type": "person", "roles": []], as: .admin))
        record("bad roles", try request("PUT", "/_users/org.couchdb.user:x-\(tag)", ["name": .string("x-\(tag)"), "type": "user", "roles": [1]], as: .admin))
        record("system role", try request("PUT", "/_users/org.couchdb.user:x-\(tag)", ["name": .string("x-\(tag)"), "type": "user", "roles": ["_admin"]], as: .admin))
        record("bad id", try request("PUT", "/_users/\(tag)", ["name": .string(tag), "type": "user", "roles": []], as: .admin))
        record("sign-up", try request("PUT", "/_users/org.couchdb.user:y-\(tag)", ["name": .string("y-\(tag)"), "password": "p", "type": "user", "roles": []], as: .anonymous))
        record("own user doc", try request("GET", "/_users/org.couchdb.user:\(bob)", as: .user(bob)))
        // Sessions and wrong credentials.
        record("session", try request("GET", "/_session", as: .user(bob)))
        record("session anonymous", try request("GET", "/_session", as: .anonymous))
        record("wrong password", try request("GET", "/_session", as: .wrong(bob)))
        record("wrong password on /", try request("GET", "/", as: .wrong(bob)))
        record("unknown user", try request("GET", "/\(db)", as: .wrong("nobody-\(tag)")))
        let login = try send("POST", "/_session", ["name": .string(carol), "password": .string("pw-\(carol)")], [])
        record("login", login)
        let cookie = login.header("Set-Cookie").flatMap { $0.split(separator: ";").first?.split(separator: "=", maxSplits: 1).last.map(String.init) } ?? ""
        record("cookie session", try request("GET", "/_session", as: .cookie(cookie)))
        // A new database is its admins' only (CouchDB 3's default security).
        record("anonymous reads", try request("GET", "/\(db)/doc", as: .anonymous))
        record("user reads", try request("GET", "/\(db)/doc", as: .user(bob)))
        record("server admin endpoint", try request("GET", "/_all_dbs", as: .user(bob)))
        record("create db as user", try request("PUT", "/\(db)-2", as: .user(bob)))
        // Members by name and by role.
        record("members", try request("PUT", "/\(db)/_security", ["members": ["names": .array([.string(carol)]), "roles": ["readers"]]], as: .admin))
        record("bob by role", try request("GET", "/\(db)/doc", as: .user(bob)), keys: ["n"])
        record("carol by name", try request("PUT", "/\(db)/doc2", ["n": 2], as: .cookie(cookie)), keys: ["ok", "error"])
        record("member writes a design doc", try request("PUT", "/\(db)/_design/d", ["views": [:]], as: .user(bob)))
        let bulk = try request("POST", "/\(db)/_bulk_docs", ["docs": [["_id": "_design/b"], ["_id": "plain"]]], as: .user(bob))
        seen.append("member bulk design doc: \(bulk.status) " + (bulk.json?.arrayValue ?? []).map { row in
            JSONValue.object(JSONObject((row.objectValue?.entries ?? []).filter { $0.key != "rev" }.map { ($0.key, $0.value) })).jsonString(.canonical)
        }.joined(separator: ","))
        record("anonymous still out", try request("GET", "/\(db)/_all_docs", as: .anonymous))
        record("member reads security", try request("GET", "/\(db)/_security", as: .user(bob)), keys: ["members"])
        // Admins by role.
        record("admins", try request("PUT", "/\(db)/_security", ["admins": ["roles": ["readers"]], "members": ["names": .array([.string(carol)])]],
                                     as: .admin))
        record("db admin writes a design doc", try request("PUT", "/\(db)/_design/d", ["views": [:]], as: .user(bob)), keys: ["ok"])
        record("carol no design doc", try request("DELETE", "/\(db)/_design/d?rev=1-x", as: .user(carol)))
        // A public database: no members.
        record("public", try request("PUT", "/\(db)/_security", [:], as: .admin))
        record("anonymous reads public", try request("GET", "/\(db)/doc", as: .anonymous), keys: ["n"])
        record("anonymous writes public", try request("PUT", "/\(db)/anon", ["n": 3], as: .anonymous), keys: ["ok"])
        record("anonymous design doc", try request("PUT", "/\(db)/_design/anon", ["views": [:]], as: .anonymous))
        record("anonymous users db", try request("GET", "/_users/_all_docs", as: .anonymous))
        return seen
    }

    /// A new CouchDB node installs `_users`' validation a few seconds after it starts.
    func waitForCouchDBUsersValidation() throws {
        #expect(try waitUntil(60) { try couch.request("GET", "/_users/_design/_auth").status == 200 }, "CouchDB's _users has no _design/_auth")
    }

    typealias Send = (String, String, JSONValue?, [(String, String)]) throws -> HTTPResponse

    /// Runs `scenario` against the live CouchDB, then against `sofa serve --user admin` (password
    /// `secret`, as CouchDB's admin) over `directory`, and expects the same lines from both.
    /// Returns CouchDB's lines and the server, for checks of its own.
    @discardableResult
    func sideBySide(_ scenario: (Send) throws -> [String], sourceLocation: SourceLocation = #_sourceLocation) throws
        -> (expected: [String], server: ServedDatabases) {
        let couchPort = couch.port
        let expected = try scenario { method, path, body, headers in
            let connection = try HTTPConnection(port: couchPort)
            defer { connection.close() }
            return try connection.json(method, path, body, headers: headers)
        }
        let passwordFile = directory.appending("password")
        try "secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        let actual = try scenario { method, path, body, headers in
            let connection = try server.connect()
            defer { connection.close() }
            return try connection.json(method, path, body, headers: headers)
        }
        #expect(actual.count == expected.count, sourceLocation: sourceLocation)
        for (mine, theirs) in zip(actual, expected) { #expect(mine == theirs, sourceLocation: sourceLocation) }
        return (expected, server)
    }

    @Test func usersSessionsAndSecurityAnswerAsCouchDBDoes() throws {
        try waitForCouchDBUsersValidation()
        let tag = UUID().uuidString.prefix(8).lowercased()
        try sideBySide { try securityScenario($0, db: "sec-\(tag)", tag: tag) }
    }

    /// A user made in CouchDB (its PBKDF2 key) logs in to Sofa once `_users` is pulled.
    @Test func aUserReplicatedFromCouchDBLogsIn() throws {
        try waitForCouchDBUsersValidation()
        let tag = UUID().uuidString.prefix(8).lowercased()
        let user = "dana-\(tag)"
        #expect(try couch.request("PUT", "/_users/org.couchdb.user:\(user)",
                                  ["name": .string(user), "password": "from-couch", "type": "user", "roles": ["staff"]]).status == 201)
        let passwordFile = directory.appending("password")
        try "secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let served = directory.appending("served")
        try FileManager.default.createDirectory(atPath: served, withIntermediateDirectories: true)
        // The server makes its _users; pull CouchDB's into it.
        var server: ServedDatabases? = try ServedDatabases(["--directory", served, "--user", "admin", "--password-file", passwordFile])
        _ = server?.stop()
        server = nil
        let pulled = try sofa("pull", "\(served)/_users.sofa", couch.url("_users"), "--doc-ids", "org.couchdb.user:\(user)")
        #expect(pulled.succeeded, "\(pulled.stderr)")
        let again = try ServedDatabases(["--directory", served, "--user", "admin", "--password-file", passwordFile])
        let connection = try again.connect()
        let session = try connection.json("GET", "/_session", headers: [("Authorization", "Basic " + Data("\(user):from-couch".utf8).base64EncodedString())])
        #expect(session.status == 200 && session.json?["userCtx"] == ["name": .string(user), "roles": ["staff"]], "\(session.text)")
        let wrong = try connection.json("GET", "/_session", headers: [("Authorization", "Basic " + Data("\(user):nope".utf8).base64EncodedString())])
        #expect(wrong.status == 401)
    }
}

/// Logins under attack, without CouchDB.
@Suite struct LoginFloodTests {
    let directory = TemporaryDirectory()

    /// Many wrong logins at once, for a user that exists and one that does not: each is
    /// refused, the server's admin is still answered meanwhile (no key to work out), and the
    /// right password still works after.
    @Test func aFloodOfWrongLoginsIsRefusedWithoutStarvingOthers() throws {
        let passwordFile = directory.appending("password")
        try "secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        @Sendable func basic(_ pair: String) -> [(String, String)] { [("Authorization", "Basic " + Data(pair.utf8).base64EncodedString())] }
        let admin = try server.connect()
        #expect(try admin.json("PUT", "/_users/org.couchdb.user:vic", ["name": "vic", "password": "right", "type": "user", "roles": []],
                               headers: basic("admin:secret")).status == 201)
        let statuses = Locked<[Int]>([])
        let flood = Thread {
            DispatchQueue.concurrentPerform(iterations: 16) { n in
                guard let connection = try? server.connect(),
                      let answer = try? connection.json("GET", "/_session", headers: basic(n % 2 == 0 ? "vic:wrong-\(n)" : "nobody-\(n):x"))
                else { return statuses.withLock { $0.append(0) } }
                statuses.withLock { $0.append(answer.status) }
            }
        }
        flood.start()
        // The admin is answered while the keys are worked out.
        for _ in 0..<5 { #expect(try admin.json("GET", "/_all_dbs", headers: basic("admin:secret")).status == 200) }
        #expect(waitUntil(120) { statuses.withLock { $0.count } == 16 })
        #expect(statuses.withLock { $0 } == Array(repeating: 401, count: 16))
        let right = try admin.json("GET", "/_session", headers: basic("vic:right"))
        #expect(right.status == 200 && right.json?["userCtx"]?["name"] == "vic", "\(right.text)")
        #expect(server.stop().status == 0)
    }
}

extension LoginFloodTests {
    /// An admin of one database is nobody in another: it can neither read nor change its
    /// `_security` (CouchDB 3.4 answers that PUT with a 500 `no_majority`; Sofa with 403).
    @Test func oneDatabasesAdminCannotTouchAnothersSecurity() throws {
        let passwordFile = directory.appending("password")
        try "secret\n".write(toFile: passwordFile, atomically: true, encoding: .utf8)
        let server = try ServedDatabases(["--directory", directory.path, "--user", "admin", "--password-file", passwordFile])
        func basic(_ pair: String) -> [(String, String)] { [("Authorization", "Basic " + Data(pair.utf8).base64EncodedString())] }
        let http = try server.connect()
        let admin = basic("admin:secret"), ann = basic("ann:pw")
        #expect(try http.json("PUT", "/_users/org.couchdb.user:ann", ["name": "ann", "password": "pw", "type": "user", "roles": []],
                              headers: admin).status == 201)
        for db in ["mine", "theirs"] { #expect(try http.json("PUT", "/\(db)", headers: admin).status == 201) }
        #expect(try http.json("PUT", "/mine/_security", ["admins": ["names": ["ann"]]], headers: admin).status == 200)
        #expect(try http.json("PUT", "/mine/_security", ["admins": ["names": ["ann"]], "members": ["names": ["ann"]]], headers: ann).status == 200,
                "ann administers mine")
        let read = try http.json("GET", "/theirs/_security", headers: ann)
        #expect(read.status == 403 && read.json?["reason"] == "You are not allowed to access this db.", "\(read.text)")
        let write = try http.json("PUT", "/theirs/_security", ["admins": ["names": ["ann"]]], headers: ann)
        #expect(write.status == 403, "\(write.text)")
        #expect(try http.json("GET", "/theirs/_security", headers: admin).json?["admins"] == ["roles": ["_admin"]], "unchanged")
    }
}
