import DocumentModel
import DocumentStore
import Foundation
import Logging

/// Installing: a body whose every chunk is here is hashed and becomes a blob.
extension DeferredBody {
    /// Once every chunk is here: hash, install as a blob, and tell the database.
    func finishIfComplete() {
        guard let (source, verified) = condition.withLock({ claimFinish() }) else { return }
        install(source, verified: verified)
    }

    /// Whether the body is ready to install, and if so, the claim to do it. Under `condition`.
    func claimFinish() -> (PartialBody, Bool)? {
        guard blob == nil, !finishing, !released, fetches.isEmpty, partial.isComplete else { return nil }
        finishing = true
        return (partial, verifiedWhole)
    }

    func install(_ source: PartialBody, verified: Bool) {
        defer {
            condition.withLock { finishing = false }
            condition.broadcast()
            closeIfIdle()
        }
        do {
            if let stored = try owner.database.storedBody(digest: attachment.digest) {
                // Installed meanwhile by another process reading the same body.
                condition.withLock { blob = stored }
                return
            }
            let (stored, digest) = try source.finish(verified: verified)
            try owner.database.attachBody(digest: attachment.digest, blob: stored, storedDigest: digest)
            condition.withLock { blob = stored }
        } catch {
            owner.log.error("\(docID)/\(attachment.name): \(error); fetching it again as one stream")
            condition.withLock {
                resetPartial()
                wholeOnly = true
                failures += 1
                lastFailure = error
            }
        }
    }
}
