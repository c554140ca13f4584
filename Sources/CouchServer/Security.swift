import CCrypto
import DocumentModel
import DocumentStore
import Foundation
import NIOHTTP1

/// Who is asking: CouchDB's `userCtx`.
struct UserContext: Sendable, Equatable {
    var name: String?
    var roles: [String]

    static let anonymous = UserContext(name: nil, roles: [])
    var isServerAdmin: Bool { roles.contains("_admin") }
    var json: JSONValue { ["name": name.map(JSONValue.string) ?? .null, "roles": .array(roles.map(JSONValue.string))] }
}

/// A database's `_security`: its admins and members, by name and by role. No members at
/// all means a public database, as in CouchDB.
struct SecurityObject {
    var adminNames: Set<String> = [], adminRoles: Set<String> = []
    var memberNames: Set<String> = [], memberRoles: Set<String> = []

    init(_ object: JSONObject) {
        func strings(_ section: String, _ list: String) -> Set<String> {
            Set(object[section]?[list]?.arrayValue?.compactMap(\.stringValue) ?? [])
        }
        adminNames = strings("admins", "names")
        adminRoles = strings("admins", "roles")
        memberNames = strings("members", "names")
        memberRoles = strings("members", "roles")
    }

    func isAdmin(_ user: UserContext) -> Bool {
        user.isServerAdmin || user.name.map(adminNames.contains) == true || !adminRoles.isDisjoint(with: user.roles)
    }

    func isMember(_ user: UserContext) -> Bool {
        (memberNames.isEmpty && memberRoles.isEmpty) || isAdmin(user)
            || user.name.map(memberNames.contains) == true || !memberRoles.isDisjoint(with: user.roles)
    }
}

extension CouchServer {
    /// The user of the request being handled (set by `route`).
    @TaskLocal static var user = UserContext.anonymous

    /// The `_users` database, where users other than the server's admin live.
    static let usersDatabase = "_users"
    static let userPrefix = "org.couchdb.user:"

    /// The user a request comes from: the server's admin or a `_users` user, by basic auth or
    /// session cookie; anonymous without either. Without `--user` everyone is an admin (Sofa's
    /// single-user mode). Wrong credentials are 401 wherever they are sent.
    func userContext(_ request: Request) async throws -> UserContext {
        try await userContext(headers: request.headers)
    }

    func userContext(headers: HTTPHeaders) async throws -> UserContext {
        guard requiresAuthentication else { return UserContext(name: nil, roles: ["_admin"]) }
        if let authorization = headers["Authorization"].first {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "basic", let data = Data(base64Encoded: String(parts[1])),
                  let text = String(data: data, encoding: .utf8), let colon = text.firstIndex(of: ":") else {
                throw HTTPError(.unauthorized, "unauthorized", "Name or password is incorrect.")
            }
            guard let user = try await authenticate(name: String(text[..<colon]), password: String(text[text.index(after: colon)...])) else {
                throw HTTPError(.unauthorized, "unauthorized", "Name or password is incorrect.")
            }
            return user
        }
        if let value = sessionCookie(headers), let name = sessions.user(fromCookie: value) {
            if name == configuration.user { return UserContext(name: name, roles: ["_admin"]) }
            // A user's roles are read at every request: removing a user or a role takes effect at once.
            if let roles = try await blocking({ try self.userDocument(name).map(UserContext.roles(of:)) }) {
                return UserContext(name: name, roles: roles)
            }
        }
        return .anonymous
    }

    /// Checks a name and password against the server's admin, then `_users`; nil when wrong.
    func authenticate(name: String, password: String) async throws -> UserContext? {
        if let admin = configuration.user {
            // Evaluate both so a wrong user name costs as much as a wrong password.
            let userMatches = constantTimeEqual(Array(name.utf8), Array(admin.utf8))
            let passwordMatches = constantTimeEqual(Array(password.utf8), Array((configuration.password ?? "").utf8))
            if userMatches { return passwordMatches ? UserContext(name: name, roles: ["_admin"]) : nil }
        }
        let document = try await blocking { try self.userDocument(name) }
        guard try await passwords.verify(password, of: name, against: document) else { return nil }
        return UserContext(name: name, roles: document.map(UserContext.roles(of:)) ?? [])
    }

    /// `org.couchdb.user:NAME` of `_users`, when there is one and it is a user.
    func userDocument(_ name: String) throws -> JSONObject? {
        guard registry.path(of: CouchServer.usersDatabase) != nil else { return nil }
        let db = try registry.database(CouchServer.usersDatabase)
        guard let revision = try db.document(withID: CouchServer.userPrefix + name), !revision.deleted,
              revision.properties["type"]?.stringValue == "user" else { return nil }
        return revision.properties
    }

    // MARK: - Permissions

    /// 401 unless the request comes from the server's admin.
    func requireServerAdmin() throws {
        guard CouchServer.user.isServerAdmin else { throw HTTPError(.unauthorized, "unauthorized", "You are not a server admin.") }
    }

    /// 401 (anonymous) or 403 unless the user may read and write `db`'s documents.
    func requireMember(_ db: Database) throws {
        let user = CouchServer.user
        guard !user.isServerAdmin else { return }
        guard !SecurityObject(try db.securityObject).isMember(user) else { return }
        throw user.name == nil ? HTTPError(.unauthorized, "unauthorized", "You are not authorized to access this db.")
                               : HTTPError(.forbidden, "forbidden", "You are not allowed to access this db.")
    }

    /// 401 (anonymous) or 403 unless the user administers `db` (design documents, `_security`,
    /// indexes, compaction, purges, limits).
    func requireDatabaseAdmin(_ db: Database) throws {
        let user = CouchServer.user
        guard !user.isServerAdmin, !SecurityObject(try db.securityObject).isAdmin(user) else { return }
        throw HTTPError(user.name == nil ? .unauthorized : .forbidden, user.name == nil ? "unauthorized" : "forbidden",
                        "You are not a db or server admin.")
    }

    /// Design documents are the admins'.
    func requireAdmin(ifDesign id: String, _ db: Database) throws {
        if DocumentID.isDesign(id) { try requireDatabaseAdmin(db) }
    }

    func isUsersDatabase(_ db: Database) -> Bool {
        registry.path(of: CouchServer.usersDatabase) == db.path
    }

    /// A `_users` document as CouchDB's validation has it (403 with its reasons), its plain
    /// `password` replaced by a PBKDF2 key.
    func checkedUserDocument(_ properties: JSONObject, id: String, deleted: Bool) throws -> JSONObject {
        if DocumentID.isDesign(id) || deleted { return properties }
        func refuse(_ reason: String) -> HTTPError { HTTPError(.forbidden, "forbidden", reason) }
        guard id.hasPrefix(CouchServer.userPrefix), properties["name"]?.stringValue == String(id.dropFirst(CouchServer.userPrefix.count)) else {
            throw refuse("Doc ID must be of the form org.couchdb.user:name")
        }
        guard properties["type"]?.stringValue == "user" else { throw refuse("doc.type must be user") }
        guard let roles = properties["roles"]?.arrayValue else { throw refuse("doc.roles must exist") }
        guard roles.allSatisfy({ $0.stringValue != nil }) else { throw refuse("doc.roles can only contain strings") }
        guard !roles.contains(where: { $0.stringValue?.hasPrefix("_") == true }) else {
            throw refuse("No system roles (starting with underscore) in users db.")
        }
        guard let password = properties["password"] else { return properties }
        guard let text = password.stringValue else { throw refuse("doc.password must be a string") }
        var hashed = properties
        hashed["password"] = nil
        for (key, value) in Passwords.hash(text) { hashed[key] = value }
        return hashed
    }
}

extension UserContext {
    static func roles(of userDocument: JSONObject) -> [String] {
        userDocument["roles"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }
}

/// Password keys as CouchDB 3.4 makes and checks them: PBKDF2 (HMAC-SHA-256, 600,000
/// iterations, a 32-hex-digit salt used as text) and the older PBKDF2-SHA-1 and `simple`
/// (SHA-1) schemes of user documents replicated from older servers. A key is worked out on one
/// thread of its own, one at a time, so that a flood of logins slows logins only; a name and
/// password that were right are remembered for ten minutes (by an HMAC under a secret of this
/// process, never in clear), as clients that send basic auth with every request need.
final class Passwords: @unchecked Sendable {
    static let iterations = 600_000
    private let queue = DispatchQueue(label: "sofa.passwords")
    private let lock = NSLock()
    private var verified: [[UInt8]: Date] = [:]
    private let secret: [UInt8] = {
        var bytes = [UInt8](repeating: 0, count: 32)
        precondition(RAND_bytes(&bytes, Int32(bytes.count)) == 1, "no randomness")
        return bytes
    }()
    /// What a name without a user document is checked against, so that it takes as long.
    private static let decoy: JSONObject = ["password_scheme": "pbkdf2", "pbkdf2_prf": "sha256", "iterations": .integer(Int64(iterations)),
                                            "salt": "00000000000000000000000000000000", "derived_key": ""]

    /// The fields CouchDB stores for a password.
    static func hash(_ password: String) -> JSONObject {
        var salt = [UInt8](repeating: 0, count: 16)
        precondition(RAND_bytes(&salt, Int32(salt.count)) == 1, "no randomness")
        let saltText = BlobKey.hexString(salt)
        let key = pbkdf2(password, salt: saltText, iterations: iterations, digest: EVP_sha256(), length: 32)
        return ["password_scheme": "pbkdf2", "pbkdf2_prf": "sha256", "salt": .string(saltText),
                "iterations": .integer(Int64(iterations)), "derived_key": .string(BlobKey.hexString(key))]
    }

    /// Whether `password` is the one `document` (a user document, or nil) stores a key of.
    func verify(_ password: String, of name: String, against document: JSONObject?) async throws -> Bool {
        let stored = document ?? Passwords.decoy
        let memo = mac(name, password, stored)
        let known = lock.withLock { verified[memo].map { $0 > Date() } ?? false }
        if known { return true }
        let matches = await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: Passwords.matches(password, stored)) }
        }
        guard matches, document != nil else { return false }
        lock.withLock {
            if verified.count > ServerTuning.verifiedPasswords { verified.removeAll() }
            verified[memo] = Date().addingTimeInterval(ServerTuning.verifiedPasswordLifetime)
        }
        return true
    }

    private static func matches(_ password: String, _ stored: JSONObject) -> Bool {
        guard let salt = stored["salt"]?.stringValue else { return false }
        switch stored["password_scheme"]?.stringValue ?? "simple" {
        case "pbkdf2":
            guard let expected = stored["derived_key"]?.stringValue, let iterations = stored["iterations"]?.int64Value,
                  iterations > 0, iterations <= 10_000_000 else { return false }
            let sha256 = stored["pbkdf2_prf"]?.stringValue == "sha256"
            let key = pbkdf2(password, salt: salt, iterations: Int(iterations), digest: sha256 ? EVP_sha256() : EVP_sha1(),
                             length: sha256 ? 32 : 20)
            return constantTimeEqual(Array(BlobKey.hexString(key).utf8), Array(expected.lowercased().utf8))
        case "simple":
            guard let expected = stored["password_sha"]?.stringValue else { return false }
            let digest = MessageDigest.hash(.sha1, Array((password + salt).utf8))
            return constantTimeEqual(Array(BlobKey.hexString(digest).utf8), Array(expected.lowercased().utf8))
        default:
            return false
        }
    }

    private static func pbkdf2(_ password: String, salt: String, iterations: Int, digest: OpaquePointer?, length: Int) -> [UInt8] {
        var key = [UInt8](repeating: 0, count: length)
        let (secret, saltBytes) = (Array(password.utf8), Array(salt.utf8))
        _ = PKCS5_PBKDF2_HMAC(secret.map { CChar(bitPattern: $0) }, Int32(secret.count), saltBytes, Int32(saltBytes.count),
                              Int32(iterations), digest, Int32(length), &key)
        return key
    }

    private func mac(_ name: String, _ password: String, _ stored: JSONObject) -> [UInt8] {
        let message = Array((name + "\u{0}" + password + "\u{0}" + JSONValue.object(stored).jsonString()).utf8)
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        _ = secret.withUnsafeBufferPointer { key in
            HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), message, message.count, &out, &length)
        }
        return out
    }
}
