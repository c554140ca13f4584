import CCrypto
import DocumentModel
import Foundation
import NIOHTTP1

/// Signs and checks `AuthSession` cookies: `base64url(user:expiry-hex:hmac)`,
/// HMAC-SHA256 under a secret made when the server starts.
final class SessionKeys: Sendable {
    static let lifetime = ServerTuning.sessionLifetime
    private let secret: [UInt8]

    init() {
        var bytes = [UInt8](repeating: 0, count: 32)
        precondition(RAND_bytes(&bytes, Int32(bytes.count)) == 1, "no randomness")
        secret = bytes
    }

    func cookie(for user: String, now: Date = Date()) -> String {
        let expiry = String(Int(now.timeIntervalSince1970 + SessionKeys.lifetime), radix: 16)
        let payload = "\(user):\(expiry)"
        let token = Array(payload.utf8) + [UInt8(ascii: ":")] + mac(payload)
        return Data(token).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// The user a cookie value was issued to, if it is genuine and not expired.
    func user(fromCookie value: String, now: Date = Date()) -> String? {
        var base64 = value.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        guard let data = Data(base64Encoded: base64), data.count > 32 else { return nil }
        let bytes = [UInt8](data)
        let payload = Array(bytes[..<(bytes.count - 33)])
        guard bytes[bytes.count - 33] == UInt8(ascii: ":"),
              constantTimeEqual(Array(bytes[(bytes.count - 32)...]), mac(String(decoding: payload, as: UTF8.self))) else { return nil }
        let text = String(decoding: payload, as: UTF8.self)
        guard let colon = text.lastIndex(of: ":"), let expiry = Int(text[text.index(after: colon)...], radix: 16),
              TimeInterval(expiry) > now.timeIntervalSince1970 else { return nil }
        return String(text[..<colon])
    }

    private func mac(_ payload: String) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let message = Array(payload.utf8)
        _ = secret.withUnsafeBufferPointer { key in
            HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), message, message.count, &out, &length)
        }
        return out
    }
}

/// Compares without leaking, through timing, how long the common prefix is.
func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
    guard a.count == b.count else { return false }
    return a.withUnsafeBytes { x in b.withUnsafeBytes { y in CRYPTO_memcmp(x.baseAddress, y.baseAddress, a.count) == 0 } }
}

extension CouchServer {
    var requiresAuthentication: Bool { configuration.user != nil }

    func sessionCookie(_ headers: HTTPHeaders) -> String? {
        for header in headers["Cookie"] {
            for pair in header.split(separator: ";") {
                let kv = pair.split(separator: "=", maxSplits: 1)
                // Sync Gateway's name for the same token: Couchbase Lite sends a session it was
                // given (`SessionAuthenticator`) as `SyncGatewaySession`.
                if kv.count == 2, ["AuthSession", "SyncGatewaySession"].contains(kv[0].trimmingCharacters(in: .whitespaces)) {
                    return String(kv[1]).trimmingCharacters(in: .whitespaces)
                }
            }
        }
        return nil
    }

    /// `POST|GET|DELETE /_session`.
    func session(_ request: Request) async throws {
        switch request.method {
        case .POST:
            let bytes = try await request.body.collect(limit: 64 * 1024)
            var name = "", password = ""
            if request.headers.mediaType == "application/json" {
                let body = try? JSONParser.parse(bytes)  // not JSON: no name, and the login fails as CouchDB's does
                name = body?["name"]?.stringValue ?? ""
                password = body?["password"]?.stringValue ?? ""
            } else {
                for pair in String(decoding: bytes, as: UTF8.self).split(separator: "&") {
                    let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                    let value = kv.count > 1 ? String(kv[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "" : ""
                    if kv[0] == "name" { name = value }
                    if kv[0] == "password" { password = value }
                }
            }
            guard requiresAuthentication else {
                // Without --user everyone is the admin: a login (a client library's, with whatever
                // name it has or an empty one) succeeds, as it would in CouchDB's admin party.
                return try await request.response.sendJSON(.ok, ["ok": true, "name": name.isEmpty ? .null : .string(name), "roles": ["_admin"]])
            }
            guard let user = try await authenticate(name: name, password: password) else {
                throw HTTPError(.unauthorized, "unauthorized", "Name or password is incorrect.")
            }
            let cookie = "AuthSession=\(sessions.cookie(for: name)); Version=1; Path=/; HttpOnly"
            try await request.response.sendJSON(.ok, ["ok": true, "name": .string(name), "roles": user.json["roles"] ?? []],
                                                 headers: ["Set-Cookie": cookie])
        case .GET, .HEAD:
            // Wrong credentials were answered 401 before: a client can tell its login failed.
            let user = CouchServer.user
            let how: JSONValue = request.headers["Authorization"].isEmpty ? (user.name == nil ? .null : "cookie") : "default"
            try await request.response.sendJSON(.ok, [
                "ok": true,
                "userCtx": user.json,
                "info": ["authentication_handlers": ["cookie", "default"], "authenticated": how],
            ])
        case .DELETE:
            try await request.response.sendJSON(.ok, ["ok": true],
                                                 headers: ["Set-Cookie": "AuthSession=; Version=1; Path=/; HttpOnly; Max-Age=0"])
        default:
            throw HTTPError.methodNotAllowed
        }
    }
}
