import DocumentFS
import DocumentModel
import DocumentStore
import Foundation
import FuseKit
import Testing
import TestSupport

/// The mount's one error path, without FUSE: every refusal is a typed error that names the path
/// and why, its errno is decided in one switch (`Errno.swift`), and failures are told from
/// refusals (FuseKit logs the first at error level). Asked of `DocumentFileSystem` directly, on
/// a real database.
@Suite struct MountErrorTests {
    let directory = TemporaryDirectory()
    let db: Database
    let fs: DocumentFileSystem
    let shell: pid_t = 2_000_000_001

    init() throws {
        db = try directory.makeDatabase()
        try db.put("doc", ["title": "t"], attachments: ["keep.txt": Array("kept".utf8)])
        fs = try DocumentFileSystem(store: db)
    }

    /// The error `body` throws (nil: none).
    func thrown(_ body: () throws -> Void) -> (any Error)? {
        do { try body() } catch { return error }
        return nil
    }

    @Test func everyMountErrorHasOneErrnoAndSaysWhere() {
        let path = "/docs/d/attachments/x"
        let expected: [(MountError, Int32)] = [
            (.notFound(path), ENOENT), (.exists(path), EEXIST), (.notEmpty(path), ENOTEMPTY), (.isFolder(path), EISDIR),
            (.notFolder(path), ENOTDIR), (.readOnly(path, why: .mount), EROFS), (.readOnly(path, why: .conflict), EROFS),
            (.readOnly(path, why: .status), EROFS), (.notWritableHere(path), EACCES), (.cannotMakeFolder(path), EPERM),
            (.tooLarge(path, limit: 1), EFBIG), (.notOpenFor(path, operation: "writing"), EBADF),
            (.invalidArgument(path, why: "w"), EINVAL), (.notUserAttribute(path, name: "trusted.a"), EOPNOTSUPP),
            (.notSupported(path, why: "w"), ENOTSUP), (.noAttribute(path, name: "user.a"), ENODATA),
            (.crossDevice(path, why: "w"), EXDEV), (.busy(path, why: "w"), EBUSY), (.rejected(path, why: "w"), EBADMSG),
            (.bodyUnreadable(path, cause: SofaError.diskFull(path: "/x")), EIO), (.inconsistent(path, why: "w"), EIO),
        ]
        for (error, code) in expected {
            #expect(error.errno == code, "\(error)")
            #expect(error.path == path)
            #expect(error.description.hasPrefix(path + ": "), "the log line names the path: \(error)")
            let failure: Bool = switch error { case .bodyUnreadable, .inconsistent: true; default: false }
            #expect(error.isFailure == failure, "\(error)")
        }
    }

    @Test func storeErrorsKeepTheirErrnoAndFailuresAreToldFromRefusals() {
        #expect(SofaError.system("open", path: "/x", errno: ENOSPC).errno == ENOSPC)
        #expect(SofaError.system("open", path: "/x", errno: EROFS).errno == EROFS)
        #expect(SofaError.system("open", path: "/x", errno: EMFILE).errno == EMFILE)
        #expect(SofaError.system("open", path: "/x", errno: EMFILE).isFailure)
        #expect(!SofaError.system("lstat", path: "/x", errno: ENOENT).isFailure, "a scratch name that is not there is an answer")
        #expect(SofaError.sqlite(code: 10, message: "disk I/O error", sql: nil).isFailure)
        #expect(!SofaError.forbidden(reason: "no").isFailure && SofaError.forbidden(reason: "no").errno == EACCES)
        #expect(FileSystemError(ENAMETOOLONG).isFailure == false && FileSystemError(EIO).isFailure)
    }

    @Test func refusalsNameThePathAndTheReason() throws {
        let missing = "/docs/doc/attachments/missing"
        guard case .notFound(let path)? = thrown({ _ = try fs.attributes(of: missing) }) as? MountError else {
            Issue.record("a missing attachment is MountError.notFound")
            return
        }
        #expect(path == missing)

        let status = thrown { _ = try fs.create("/.sofa/status.json", permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell) }
        #expect((status as? MountError).map { "\($0)" } == "/.sofa/status.json: read-only: status files are read-only")
        #expect((status as? ErrnoConvertible)?.errno == EROFS)

        let document = thrown { _ = try fs.create("/docs/doc", permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell) }
        #expect((document as? ErrnoConvertible)?.errno == EEXIST || (document as? ErrnoConvertible)?.errno == EACCES)

        let exchange = thrown { try fs.rename("/docs/doc/attachments/keep.txt", to: "/docs/doc/attachments/other", flags: 2) }
        guard case .invalidArgument(_, let why)? = exchange as? MountError else {
            Issue.record("RENAME_EXCHANGE is MountError.invalidArgument, got \(String(describing: exchange))")
            return
        }
        #expect(why.contains("RENAME_EXCHANGE"))

        let trusted = thrown { _ = try fs.extendedAttribute("trusted.x", of: "/docs/doc/attachments/keep.txt") }
        #expect((trusted as? ErrnoConvertible)?.errno == EOPNOTSUPP)
        #expect("\(trusted!)".contains("trusted.x"), "the attribute is named")

        let pin = thrown { try fs.setExtendedAttribute("user.sofa.pinned", of: "/docs/doc/attachments/keep.txt", to: Array("maybe".utf8), flags: 0) }
        #expect((pin as? ErrnoConvertible)?.errno == EINVAL || pin == nil, "a pin value that is neither true nor false")
        if let pin { #expect("\(pin)".contains("maybe"), "the value refused is named") }
    }

    @Test func aReadOnlyMountSaysSoForEveryWrite() throws {
        let readOnly = try DocumentFileSystem(store: db, readOnly: true)
        let attempts: [(String, () throws -> Void)] = [
            ("unlink", { try readOnly.unlink("/docs/doc/attachments/keep.txt") }),
            ("mkdir", { try readOnly.makeDirectory("/docs/new") }),
            ("rmdir", { try readOnly.removeDirectory("/docs/doc") }),
            ("rename", { try readOnly.rename("/docs/doc/attachments/keep.txt", to: "/docs/doc/attachments/k", flags: 0) }),
            ("create", { _ = try readOnly.create("/docs/doc/attachments/n", permissions: 0o644, flags: O_WRONLY | O_CREAT, caller: shell) }),
        ]
        for (what, attempt) in attempts {
            let error = thrown(attempt)
            guard case .readOnly(_, why: .mount)? = error as? MountError else {
                Issue.record("\(what) in a read-only mount: \(String(describing: error))")
                continue
            }
        }
        #expect(try db.currentRevision(of: "doc")?.attachmentNames == ["keep.txt"], "nothing changed")
    }

    /// A body that cannot be fetched was answered as a bare EIO, and the log's line had no cause.
    @Test func aDeferredBodyThatCannotBeFetchedFailsWithItsCause() throws {
        let key = try #require(BlobKey(hex: String(repeating: "ab", count: 20)))
        _ = try db.insert(ReplicatedRevision(
            docID: "far", revID: try #require(RevisionID("1-aaaa")), ancestors: [], properties: [:],
            attachments: [DocumentStore.Attachment(name: "big.bin", contentType: "application/octet-stream", length: 10,
                                     digest: key.digestString, blobKey: nil, revpos: 1)]))
        let source = UnreachableRemote()
        let remote = try DocumentFileSystem(store: db, bodySource: source, fetchTimeout: 1)
        let path = "/docs/far/attachments/big.bin"
        #expect(try remote.attributes(of: path).size == 10, "the true length, body or not")
        let file = try remote.open(path, flags: O_RDONLY, caller: shell)
        defer { remote.release(file.handle) }
        var buffer = [UInt8](repeating: 0, count: 10)
        let error = thrown { _ = try buffer.withUnsafeMutableBytes { try remote.read(file.handle, into: $0, at: 0) } }
        guard case .bodyUnreadable(let where_, let cause)? = error as? MountError else {
            Issue.record("a failed fetch is MountError.bodyUnreadable, got \(String(describing: error))")
            return
        }
        #expect(where_ == path)
        #expect((error as? ErrnoConvertible)?.errno == EIO && (error as? ErrnoConvertible)?.isFailure == true)
        #expect("\(cause)".contains("connection refused"), "the cause reaches the log: \(cause)")
    }
}

/// A remote whose every fetch fails as a refused connection does (the replicator's real body
/// source against a vanished server is tried in ReplicatorTests; here only the mount's answer
/// to the failure is under test).
private final class UnreachableRemote: BodySource, BodyReader, @unchecked Sendable {
    let length: Int64 = 10
    func open(_ attachment: DocumentStore.Attachment, docID: String, revID: RevisionID) throws -> any BodyReader { self }
    func fetchInBackground(_ attachment: DocumentStore.Attachment, docID: String, revID: RevisionID) {}
    func fetch(_ attachment: DocumentStore.Attachment, docID: String, revID: RevisionID) throws {
        throw SofaError.invalidArgument("GET http://127.0.0.1:1/db/far/big.bin: connection refused")
    }
    func progress(of attachment: DocumentStore.Attachment) -> BodyProgress? { nil }
    func shutDown(waitingAtMost seconds: Double) {}
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64, timeout: Double, willWait: () -> Void) throws -> Int {
        throw SofaError.invalidArgument("GET http://127.0.0.1:1/db/far/big.bin: connection refused")
    }
    func close() {}
}
