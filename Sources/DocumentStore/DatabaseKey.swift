import CCrypto
import CSeal
import DocumentModel
import Foundation

/// What a person gives to open an encrypted database: the bytes of a key file (32 bytes, or 64
/// hex digits), or a passphrase. Read from a file, a descriptor or a terminal, never from an
/// argument or the environment (the CLI's `KeyOptions`); wiped when it goes.
public final class DatabaseSecret: @unchecked Sendable {
    // Sendable invariant: `bytes` is written only by init and deinit.
    private(set) var bytes: [UInt8]

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    deinit { bytes.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }

    /// Zeroes `bytes` in a way the compiler keeps (OpenSSL's cleanse).
    public static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) }
    }

    /// Lends the bytes (to write a new key file).
    public func withBytes<T>(_ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try bytes.withUnsafeBytes(body)
    }

    /// 32 random bytes as 64 hex digits and a newline: what `sofa create --encrypt` writes to a
    /// new key file.
    public static func newKeyFile() throws -> DatabaseSecret {
        var key = try DatabaseKey.random(32)
        defer { key.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        let hex = Array("0123456789abcdef".utf8)
        return DatabaseSecret(key.flatMap { [hex[Int($0 >> 4)], hex[Int($0 & 15)]] } + [10])
    }

    /// The key a key file holds: 32 raw bytes, or 64 hex digits with white space around them.
    public func keyFileBytes(path: String) throws -> [UInt8] {
        if bytes.count == 32 { return bytes }
        let digits = bytes.filter { ![9, 10, 13, 32].contains($0) }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case 48...57: c - 48
            case 97...102: c - 87
            case 65...70: c - 55
            default: nil
            }
        }
        guard digits.count == 64 else {
            throw SofaError.keyRejected(path: path, reason: "a key file holds 32 bytes or 64 hex digits, this one \(bytes.count) bytes")
        }
        var key = [UInt8](repeating: 0, count: 32)
        for i in 0..<32 {
            guard let high = value(digits[2 * i]), let low = value(digits[2 * i + 1]) else {
                throw SofaError.keyRejected(path: path, reason: "a key file of 64 characters must be hex digits")
            }
            key[i] = high << 4 | low
        }
        return key
    }
}

/// How an encrypted database's key is unlocked: with a key file, or with a passphrase through
/// scrypt.
public enum KeyUnlock: String, Codable, Sendable {
    case keyFile = "key-file"
    case passphrase
}

/// `NAME.sofa/key.json`: the database's data key, wrapped (AES-256-GCM) under the key the
/// secret unlocks. Everything else is sealed under keys derived from the data key, so re-keying
/// writes only this file (docs/encryption.md).
struct KeyFile: Codable {
    var format = "sofa-database-key"
    var version = 1
    var unlock: KeyUnlock
    /// scrypt's parameters (passphrase only).
    var scrypt: ScryptCost?
    var salt: String
    var nonce: String
    var wrappedKey: String
    var tag: String

    enum CodingKeys: String, CodingKey {
        case format, version, unlock, scrypt, salt, nonce, tag
        case wrappedKey = "wrapped_key"
    }

    struct ScryptCost: Codable {
        var n: UInt64
        var r: UInt32
        var p: UInt32
    }

    static let fileName = "key.json"
    /// The associated data of the wrapped key: what it is and the file's version.
    static let associatedData = Array("sofa-key1".utf8)
    /// N = 2^17, r = 8, p = 1: 128 MiB and ~0.6 s here (docs/encryption.md).
    static let defaultCost = ScryptCost(n: 1 << 17, r: 8, p: 1)

    static func path(in database: String) -> String { "\(database)/\(fileName)" }

    static func read(database: String) throws -> KeyFile? {
        guard let data = FileManager.default.contents(atPath: path(in: database)) else {
            if access(path(in: database), F_OK) == 0 { throw SofaError.system("read", path: path(in: database), errno: EACCES) }
            return nil
        }
        do {
            let file = try JSONDecoder().decode(KeyFile.self, from: data)
            guard file.format == "sofa-database-key", file.version == 1 else {
                throw SofaError.keyRejected(path: database, reason: "\(fileName) is of a format this Sofa does not know")
            }
            return file
        } catch let error as SofaError {
            throw error
        } catch {
            throw SofaError.keyRejected(path: database, reason: "\(fileName) cannot be read: \(error)")
        }
    }

    /// Wraps `dataKey` under what `secret` unlocks, with a new salt and nonce.
    static func wrapping(_ dataKey: [UInt8], with secret: DatabaseSecret, unlock: KeyUnlock, cost: ScryptCost? = nil,
                         database: String) throws -> KeyFile {
        let salt = try DatabaseKey.random(16), nonce = try DatabaseKey.random(12)
        let cost = unlock == .passphrase ? (cost ?? defaultCost) : nil
        var file = KeyFile(unlock: unlock, scrypt: cost, salt: Data(salt).base64EncodedString(),
                           nonce: Data(nonce).base64EncodedString(), wrappedKey: "", tag: "")
        var kek = try file.keyEncryptionKey(secret, database: database)
        defer { kek.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        var wrapped = [UInt8](repeating: 0, count: 32), tag = [UInt8](repeating: 0, count: 16)
        guard sofa_seal(kek, nonce, associatedData, dataKey, 32, &wrapped, &tag) == 1 else {
            throw SofaError.keyRejected(path: database, reason: "the key could not be wrapped (OpenSSL)")
        }
        file.wrappedKey = Data(wrapped).base64EncodedString()
        file.tag = Data(tag).base64EncodedString()
        return file
    }

    /// The data key, or `keyRejected` when `secret` is not the one it was wrapped with.
    func unwrap(with secret: DatabaseSecret, database: String) throws -> [UInt8] {
        guard let nonce = Data(base64Encoded: nonce), nonce.count == 12, let wrapped = Data(base64Encoded: wrappedKey),
              wrapped.count == 32, let tag = Data(base64Encoded: tag), tag.count == 16 else {
            throw SofaError.keyRejected(path: database, reason: "\(KeyFile.fileName) is damaged")
        }
        var kek = try keyEncryptionKey(secret, database: database)
        defer { kek.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        var key = [UInt8](repeating: 0, count: 32)
        guard sofa_unseal(kek, [UInt8](nonce), KeyFile.associatedData, [UInt8](wrapped), 32, &key, [UInt8](tag)) == 1 else {
            throw SofaError.keyRejected(path: database, reason: unlock == .passphrase ? "wrong passphrase" : "wrong key")
        }
        return key
    }

    /// The key-encryption key: the key file's 32 bytes through HKDF, or the passphrase through scrypt.
    private func keyEncryptionKey(_ secret: DatabaseSecret, database: String) throws -> [UInt8] {
        guard let salt = Data(base64Encoded: salt).map({ [UInt8]($0) }), salt.count == 16 else {
            throw SofaError.keyRejected(path: database, reason: "\(KeyFile.fileName) is damaged")
        }
        var out = [UInt8](repeating: 0, count: 32)
        switch unlock {
        case .keyFile:
            var bytes = try secret.keyFileBytes(path: database)
            defer { bytes.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
            let info = Array("sofa key-encryption key".utf8)
            guard sofa_derive_key(bytes, salt, 16, info, Int32(info.count), &out) == 1 else {
                throw SofaError.keyRejected(path: database, reason: "the key could not be derived (OpenSSL)")
            }
        case .passphrase:
            guard let cost = scrypt, cost.n >= 2, cost.n & (cost.n - 1) == 0, cost.n <= 1 << 22, cost.r >= 1, cost.r <= 64,
                  cost.p >= 1, cost.p <= 16 else {
                throw SofaError.keyRejected(path: database, reason: "\(KeyFile.fileName) has scrypt parameters out of range")
            }
            guard !secret.bytes.isEmpty else { throw SofaError.keyRejected(path: database, reason: "the passphrase is empty") }
            guard sofa_scrypt(secret.bytes, Int32(secret.bytes.count), salt, 16, cost.n, cost.r, cost.p, &out) == 1 else {
                throw SofaError.keyRejected(path: database, reason: "scrypt failed (out of memory?)")
            }
        }
        return out
    }

    /// Writes the file in place atomically: a temporary file, fsynced, renamed over the old one,
    /// the folder fsynced. A kill at any moment leaves the old file or the new one.
    func write(database: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        let data = try encoder.encode(self) + [10]
        let final = KeyFile.path(in: database), temporary = final + ".new"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SofaError.system("create", path: temporary, errno: errno) }
        do {
            defer { close(fd) }
            try data.withUnsafeBytes { try writeFully(fd, $0, path: temporary) }
            guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: temporary, errno: errno) }
        }
        guard rename(temporary, final) == 0 else { throw SofaError.system("rename", path: final, errno: errno) }
        let folder = open(database, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if folder >= 0 { fsync(folder); close(folder) }
    }
}

/// An encrypted database's keys while it is open: each derived from the data key for one
/// purpose (HKDF-SHA256), so no key seals two kinds of thing. The data key itself is not kept.
final class DatabaseKey: @unchecked Sendable {
    // Sendable invariant: immutable after init; the keys wipe themselves.
    /// Seals SQLite's pages (the VFS of `SealedPages`).
    let pages: SealingKey
    /// Seals blobs' bodies, partial and cached bodies (`SealedBlob`).
    let blobs: SealingKey
    /// Names blob files: HMAC-SHA256 of a body's SHA-1.
    let names: SealingKey
    /// Seals the names in the mount's scratch folder (AES-256-SIV, 64 bytes: `ScratchFolder`).
    let scratchNames: SealingKey

    init(dataKey: [UInt8]) throws {
        func derive(_ purposes: String...) throws -> SealingKey {
            var out = [UInt8](repeating: 0, count: 32 * purposes.count)
            defer { out.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
            for (index, purpose) in purposes.enumerated() {
                let info = Array("sofa \(purpose) v1".utf8)
                // No salt: RFC 5869's default, a hash length of zeros (the data key is random already).
                let salt = [UInt8](repeating: 0, count: 32)
                guard out.withUnsafeMutableBufferPointer({ sofa_derive_key(dataKey, salt, 32, info, Int32(info.count), $0.baseAddress! + 32 * index) }) == 1 else {
                    throw SofaError.invalidArgument("a key could not be derived (OpenSSL)")
                }
            }
            return try SealingKey(out)
        }
        pages = try derive("pages")
        blobs = try derive("blobs")
        names = try derive("blob names")
        scratchNames = try derive("scratch names 1", "scratch names 2")
    }

    /// The file name of the blob whose body has SHA-1 `key`: 40 hex digits of an HMAC, so the
    /// name says nothing of the body.
    func fileName(of key: BlobKey) -> String { name(of: key.digestBytes) }

    /// The file name of a scratch folder whose sealed name is too long for the file system (a
    /// document id of more than 175 bytes), keyed the same way.
    func fileName(ofScratchFolder folder: String) -> String { name(of: Array("scratch \(folder)".utf8)) }

    /// The file name of the partial body of `digest` (`sha1-…` or `md5-…`), keyed the same way.
    func fileName(ofDigest digest: String) -> String { name(of: Array("partial \(digest)".utf8)) }

    private func name(of message: [UInt8]) -> String {
        var out = [UInt8](repeating: 0, count: 32)
        _ = sofa_hmac_sha256(names.bytes, message, Int32(message.count), &out)
        return BlobKey.hexString(Array(out.prefix(20)))
    }

    /// The keys of a new encrypted database in `folder`: a random data key, written wrapped
    /// under what `secret` unlocks to the folder's key.json.
    static func makeNew(in folder: String, wrappedWith secret: DatabaseSecret, unlock: KeyUnlock) throws -> DatabaseKey {
        var dataKey = try random(32)
        defer { dataKey.withUnsafeMutableBytes { OPENSSL_cleanse($0.baseAddress, $0.count) } }
        try KeyFile.wrapping(dataKey, with: secret, unlock: unlock, database: folder).write(database: folder)
        return try DatabaseKey(dataKey: dataKey)
    }

    static func random(_ count: Int) throws -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&bytes, Int32(count)) == 1 else { throw SofaError.invalidArgument("no random bytes (OpenSSL)") }
        return bytes
    }
}

/// Where `Database.open` finds the secret of an encrypted database it was not given one for:
/// the CLI sets this once (from `--key-file`, `--key-fd` or a prompt), and every database the
/// process opens (a server's, a replicator's, a copy's) asks it.
public enum DatabaseSecrets {
    private static let provider = Locked<(@Sendable (_ database: String, _ unlock: KeyUnlock) throws -> DatabaseSecret?)?>(nil)

    /// Sets how secrets are found (nil: none are, and an encrypted database fails to open).
    public static func provide(_ body: (@Sendable (_ database: String, _ unlock: KeyUnlock) throws -> DatabaseSecret?)?) {
        provider.withLock { $0 = body }
    }

    static func secret(for database: String, unlock: KeyUnlock) throws -> DatabaseSecret? {
        try provider.withLock { $0 }?(database, unlock)
    }
}
