import DocumentModel
import DocumentStore
import Foundation

/// `--key-file PATH`, `--key-fd N` and `--passphrase`, accepted anywhere before `--` by every
/// command (as `-v` is): how an encrypted database's key is given. Never the key itself on the
/// command line or in the environment, where other users and logs see it (`ps`, shell history).
/// Without either option, a passphrase is asked for on the terminal.
///
/// What is given is read once, when a database first needs it, and serves every database the
/// command opens (a copy's source and destination, a server's databases).
enum KeyOptions {
    nonisolated(unsafe) private static var keyFile: String?  // set once in main, before any thread
    nonisolated(unsafe) private static var keyDescriptor: Int32?
    /// `--passphrase`: a new database is unlocked by a passphrase rather than a key file.
    nonisolated(unsafe) private(set) static var passphrase = false
    private static let cached = Locked<DatabaseSecret?>(nil)

    /// Removes the options from `arguments`, remembering them, and makes them what
    /// `Database.open` finds for an encrypted database.
    static func take(from arguments: [String]) throws -> [String] {
        var kept: [String] = []
        var passedSeparator = false
        var iterator = arguments.makeIterator()
        while let argument = iterator.next() {
            if argument == "--" { passedSeparator = true }
            let (name, inline) = passedSeparator ? (argument, nil) : split(argument)
            switch passedSeparator ? "" : name {
            case "--key-file":
                guard let value = inline ?? iterator.next() else { throw SofaError.invalidArgument("--key-file needs a path") }
                keyFile = value
            case "--key-fd":
                guard let value = inline ?? iterator.next(), let fd = Int32(value), fd >= 0 else {
                    throw SofaError.invalidArgument("--key-fd needs a file descriptor number")
                }
                keyDescriptor = fd
            case "--passphrase": passphrase = true
            default: kept.append(argument)
            }
        }
        DatabaseSecrets.provide { database, unlock in try secret(for: database, unlock: unlock, confirming: false) }
        return kept
    }

    private static func split(_ argument: String) -> (String, String?) {
        guard argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") else { return (argument, nil) }
        return (String(argument[..<equals]), String(argument[argument.index(after: equals)...]))
    }

    /// The secret for `database`: the key file's or descriptor's bytes, or a passphrase typed on
    /// the terminal (twice when `confirming`, for a new database). Nil when none can be had.
    static func secret(for database: String, unlock: KeyUnlock, confirming: Bool) throws -> DatabaseSecret? {
        if let secret = cached.withLock({ $0 }) { return secret }
        let secret = try readSecret(file: keyFile, descriptor: keyDescriptor, unlock: unlock, question: "Passphrase for \(database): ",
                              confirming: confirming, unreadable: { SofaError.keyRejected(path: database, reason: "cannot read the key file \($0)") })
        cached.withLock { $0 = secret }
        return secret
    }

    /// A new secret (for `sofa rekey`), not the one the command opens databases with: the file
    /// at `path`, or a passphrase asked twice on the terminal. Nil when neither can be had.
    static func newSecret(from path: String?, unlock: KeyUnlock, for database: String) throws -> DatabaseSecret? {
        try readSecret(file: path, descriptor: nil, unlock: unlock, question: "New passphrase for \(database): ", confirming: true,
                 unreadable: { SofaError.invalidArgument("cannot read the new key file \($0)") })
    }

    /// The bytes of `file`, or of `descriptor`, or a passphrase asked on the terminal (twice
    /// when `confirming`); a passphrase ends at its line. Nil when none can be had.
    private static func readSecret(file: String?, descriptor: Int32?, unlock: KeyUnlock, question: String, confirming: Bool,
                             unreadable: (String) -> SofaError) throws -> DatabaseSecret? {
        var bytes: [UInt8]
        if let file {
            guard let data = FileManager.default.contents(atPath: file) else {
                throw unreadable("\(file): \(String(cString: strerror(errno)))")
            }
            bytes = [UInt8](data)
        } else if let descriptor {
            bytes = try readAll(descriptor)
        } else if isatty(STDIN_FILENO) == 1 && unlock == .passphrase {
            bytes = try prompt(question)
            if confirming {
                var again = try prompt("The same passphrase again: ")
                defer { DatabaseSecret.wipe(&again) }
                guard again == bytes else { throw SofaError.invalidArgument("the two passphrases differ") }
            }
        } else {
            return nil
        }
        // A passphrase read from a file or a pipe ends at its line.
        if unlock == .passphrase, bytes.last == 10 { bytes.removeLast() }
        if unlock == .passphrase, bytes.last == 13 { bytes.removeLast() }
        defer { DatabaseSecret.wipe(&bytes) }
        return DatabaseSecret(bytes)
    }

    /// Writes a new key file (a random key) at `path`, readable by its owner only.
    /// The key a database at `path` is newly encrypted with when `encrypt` (`--encrypt`, `sofa
    /// encrypt`): the key file's (made with a new random key, and said so, if it does not
    /// exist), or a passphrase asked twice. Nil without `--encrypt`, which `--passphrase` then needs.
    static func newDatabaseKey(for path: String, encrypt: Bool, passphrase: Bool = false) throws -> (DatabaseSecret, KeyUnlock)? {
        guard encrypt else {
            if self.passphrase { throw SofaError.invalidArgument("--passphrase is for an encrypted database: add --encrypt") }
            return nil
        }
        let unlock: KeyUnlock = passphrase || self.passphrase ? .passphrase : .keyFile
        var madeKeyFile: String?
        if unlock == .keyFile, let keyFile, access(keyFile, F_OK) != 0 {
            try writeNewKeyFile(at: keyFile)
            madeKeyFile = keyFile
        }
        let given: DatabaseSecret?
        do {
            given = try secret(for: path, unlock: unlock, confirming: true)
            if unlock == .keyFile { _ = try given?.keyFileBytes(path: path) }  // a passphrase in a key file is refused here, by name
        } catch SofaError.keyRejected(_, let reason) where unlock == .keyFile {
            // Nothing to open yet: the file given is what is wrong, not a database.
            throw SofaError.invalidArgument("--key-file \(keyFile ?? "") is not a key file (\(reason)): to make a database "
                                            + "unlocked by the passphrase on its first line, add --passphrase")
        }
        guard let secret = given else {
            throw SofaError.invalidArgument(
                "no key to encrypt with: give --key-file PATH (a new key file is made there if none exists), or --passphrase on a terminal (or with --key-fd)")
        }
        if let madeKeyFile {
            Output.error("a new key was written to \(madeKeyFile): keep it safe and apart from the database; without it the database cannot be opened")
        }
        return (secret, unlock)
    }

    static func writeNewKeyFile(at path: String) throws {
        let key = try DatabaseSecret.newKeyFile()
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SofaError.system("create the key file", path: path, errno: errno) }
        defer { close(fd) }
        try key.withBytes { try writeFully(fd, $0, path: path) }
        guard fsync(fd) == 0 else { throw SofaError.system("fsync", path: path, errno: errno) }
    }

    private static func readAll(_ fd: Int32) throws -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(fd, &chunk, chunk.count)
            if count < 0 && errno == EINTR { continue }
            guard count >= 0 else { throw SofaError.system("read the key from descriptor", path: "fd \(fd)", errno: errno) }
            if count == 0 { break }
            bytes += chunk[0..<count]
            guard bytes.count <= 1 << 16 else { throw SofaError.invalidArgument("--key-fd \(fd) gave more than 64 KiB: not a key") }
        }
        DatabaseSecret.wipe(&chunk)
        return bytes
    }

    /// Reads a line from the terminal with echo off.
    private static func prompt(_ text: String) throws -> [UInt8] {
        Output.write(STDERR_FILENO, text)
        var saved = termios()
        let hasTerminal = tcgetattr(STDIN_FILENO, &saved) == 0
        if hasTerminal {
            var quiet = saved
            quiet.c_lflag &= ~tcflag_t(ECHO)
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet)
        }
        defer {
            if hasTerminal { tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved) }
            Output.write(STDERR_FILENO, "\n")
        }
        var line: [UInt8] = []
        var byte: UInt8 = 0
        while read(STDIN_FILENO, &byte, 1) == 1, byte != 10 { line.append(byte) }
        return line
    }
}
