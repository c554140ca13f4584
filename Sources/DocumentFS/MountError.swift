import DocumentModel
import Foundation

/// Why the mount refuses or fails an operation when the reason is the mount's own (what the
/// tree allows) rather than the store's (`SofaError`). Each case carries the mount path it was
/// asked about and, where the errno alone would not say, why; `Errno.swift` turns it into an
/// errno, in one switch beside SofaError's. FuseKit logs it once, where it answers the kernel,
/// with this description: expected answers (ENOENT, EEXIST…) at debug level, other refusals at
/// notice, failures (`isFailure`) at error.
///
/// A failed system call on a file the mount keeps (scratch files, the fsync journal) is a
/// `SofaError.system(_:path:errno:)`, which carries the call and passes its errno on.
public enum MountError: Error, CustomStringConvertible {
    /// Nothing is shown at this path (ENOENT).
    case notFound(String)
    /// Something is at this path already (EEXIST).
    case exists(String)
    /// A folder that still holds entries (ENOTEMPTY).
    case notEmpty(String)
    /// A folder where a file was expected (EISDIR).
    case isFolder(String)
    /// A file where a folder was expected (ENOTDIR).
    case notFolder(String)
    /// Shown but not writable (EROFS): a read-only mount, a conflicting revision, a status file.
    case readOnly(String, why: ReadOnlyReason)
    /// Not a place where a file or folder can be made (EACCES): the mount's own folders.
    case notWritableHere(String)
    /// Not a name `mkdir` can make here (EPERM): only documents and folders of attachments.
    case cannotMakeFolder(String)
    /// Larger than the mount takes for this file (EFBIG).
    case tooLarge(String, limit: Int64)
    /// The open file cannot do this (EBADF): a write on a read-only open, a handle not open.
    case notOpenFor(String, operation: String)
    /// An argument the mount does not take (EINVAL): a rename flag, an xattr value.
    case invalidArgument(String, why: String)
    /// An extended attribute outside `user.` (EOPNOTSUPP).
    case notUserAttribute(String, name: String)
    /// An operation the mount does not offer on this node (ENOTSUP).
    case notSupported(String, why: String)
    /// No such extended attribute (ENODATA).
    case noAttribute(String, name: String)
    /// A move the mount cannot make without copying bytes or losing them (EXDEV): `mv` then
    /// copies and removes, as across file systems.
    case crossDevice(String, why: String)
    /// The node is in use in a way that forbids this (EBUSY): a document folder with conflicts.
    case busy(String, why: String)
    /// Bytes renamed onto a file that cannot hold them (EBADMSG): invalid properties.json.
    case rejected(String, why: String)
    /// A body that is not here, not fetched for a thumbnailer (ENODATA): `BrowsingPolicy`.
    case leftForThumbnailer(String, reader: String, length: Int64, limit: Int64)
    /// A body could not be read (EIO); `cause` says why (a remote that failed, a timeout).
    case bodyUnreadable(String, cause: any Error)
    /// A state the mount should never be in (EIO), named so a report can say where.
    case inconsistent(String, why: String)

    /// Why a node is read-only.
    public enum ReadOnlyReason: String, Sendable {
        case mount = "the database is mounted read-only"
        case conflict = "conflicting revisions are read-only (rm -r resolves one)"
        case status = "status files are read-only"
        case view = "views are read-only: they follow the documents"
        case queryResults = "a saved query's results are read-only: they follow the documents (edit or remove queries/NAME.json)"
    }

    /// The mount path the error is about.
    public var path: String {
        switch self {
        case .notFound(let path), .exists(let path), .notEmpty(let path), .isFolder(let path), .notFolder(let path),
             .readOnly(let path, _), .notWritableHere(let path), .cannotMakeFolder(let path), .tooLarge(let path, _),
             .notOpenFor(let path, _), .invalidArgument(let path, _), .notUserAttribute(let path, _),
             .notSupported(let path, _), .noAttribute(let path, _), .crossDevice(let path, _), .busy(let path, _),
             .rejected(let path, _), .bodyUnreadable(let path, _), .inconsistent(let path, _),
             .leftForThumbnailer(let path, _, _, _):
            path
        }
    }

    public var description: String {
        switch self {
        case .notFound(let path): "\(path): not found"
        case .exists(let path): "\(path): exists already"
        case .notEmpty(let path): "\(path): the folder is not empty"
        case .isFolder(let path): "\(path): is a folder"
        case .notFolder(let path): "\(path): is not a folder"
        case .readOnly(let path, let why): "\(path): read-only: \(why.rawValue)"
        case .notWritableHere(let path): "\(path): files cannot be made here"
        case .cannotMakeFolder(let path): "\(path): folders can be made as documents in docs/ and within attachments/ only"
        case .tooLarge(let path, let limit): "\(path): larger than the \(limit) bytes this file may hold"
        case .notOpenFor(let path, let operation): "\(path): not open for \(operation)"
        case .invalidArgument(let path, let why): "\(path): \(why)"
        case .notUserAttribute(let path, let name): "\(path): \(name): only user.* attributes are kept"
        case .notSupported(let path, let why): "\(path): \(why)"
        case .noAttribute(let path, let name): "\(path): no attribute \(name)"
        case .crossDevice(let path, let why): "\(path): \(why) (copy it instead)"
        case .busy(let path, let why): "\(path): \(why)"
        case .rejected(let path, let why): "\(path): \(why)"
        case .leftForThumbnailer(let path, let reader, let length, let limit):
            "\(path): not fetched for \(reader), a thumbnailer: the body (\(length) bytes) is not on this machine, and "
                + "thumbnailers fetch bodies of up to \(limit) bytes (mount option thumbnail_fetch_max=SIZE|all)"
        case .bodyUnreadable(let path, let cause): "\(path): the body could not be read: \(cause)"
        case .inconsistent(let path, let why): "\(path): internal error: \(why)"
        }
    }
}
