import DocumentModel
import FuseKit
import Foundation

/// The one place where Sofa's domain errors become errno values.
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
        case .forbidden, .unauthorized: EACCES
        case .designFunctionFailed: EIO
        }
    }
}
