import DocumentModel
import FuseKit
import Foundation

// The one place where the mount's errors become errno values: the store's (`SofaError`) and
// the mount's own (`MountError`). FuseKit answers the kernel with `errno` and logs the error
// once, at error level when `isFailure`, else as a refusal.

extension SofaError: ErrnoConvertible {
    public var errno: Int32 {
        switch self {
        case .invalidJSON, .invalidDocument, .invalidRevisionID, .invalidArgument, .invalidQuery: EINVAL
        case .invalidDocumentID, .invalidAttachmentName, .invalidBlob: EINVAL
        case .documentNotFound, .revisionNotFound, .attachmentNotFound: ENOENT
        case .conflict: EBUSY
        case .notADatabase: EIO
        case .databaseExists: EEXIST
        case .sqlite: EIO
        case .io(_, _, let code): code
        case .diskFull: ENOSPC
        case .readOnlyFileSystem: EROFS
        case .blobCorrupted: EIO
        case .bodyNotAvailable: ENODATA
        case .forbidden, .unauthorized, .keyRejected: EACCES
        case .designFunctionFailed: EIO
        }
    }

    /// The storage failed (the disk, SQLite, a corrupt body), as opposed to refusing the change.
    public var isFailure: Bool {
        switch self {
        case .io(_, _, let code): ![ENOENT, ENOTDIR, EEXIST, ENOTEMPTY, EISDIR, EACCES, EPERM, ENAMETOOLONG].contains(code)
        case .notADatabase, .sqlite, .diskFull, .blobCorrupted, .designFunctionFailed: true
        case .invalidJSON, .invalidDocument, .invalidRevisionID, .invalidArgument, .invalidQuery, .invalidDocumentID,
             .invalidAttachmentName, .invalidBlob, .documentNotFound, .revisionNotFound, .attachmentNotFound, .conflict,
             .databaseExists, .readOnlyFileSystem, .bodyNotAvailable, .forbidden, .unauthorized, .keyRejected: false
        }
    }
}

extension MountError: ErrnoConvertible {
    public var errno: Int32 {
        switch self {
        case .notFound: ENOENT
        case .exists: EEXIST
        case .notEmpty: ENOTEMPTY
        case .isFolder: EISDIR
        case .notFolder: ENOTDIR
        case .readOnly: EROFS
        case .notWritableHere: EACCES
        case .cannotMakeFolder: EPERM
        case .tooLarge: EFBIG
        case .notOpenFor: EBADF
        case .invalidArgument: EINVAL
        case .notUserAttribute: EOPNOTSUPP
        case .notSupported: ENOTSUP
        case .noAttribute: ENODATA
        case .crossDevice: EXDEV
        case .busy: EBUSY
        case .rejected: EBADMSG
        case .leftForThumbnailer: ENODATA
        case .bodyUnreadable, .inconsistent: EIO
        }
    }

    /// Only a body that could not be read and a broken invariant are failures; the rest are the
    /// tree's rules answering a request.
    public var isFailure: Bool {
        switch self {
        case .bodyUnreadable, .inconsistent: true
        default: false
        }
    }
}
