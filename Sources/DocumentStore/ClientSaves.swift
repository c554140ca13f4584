import DocumentModel
import Foundation

/// An attachment body that has arrived (inline or as a MIME part) and is in the blob store.
public struct ReceivedBody: Sendable {
    public let blob: StoredBlob
    /// Describes the bytes as stored (see `IncomingBody.finish`).
    public let digest: String

    public init(blob: StoredBlob, digest: String) {
        self.blob = blob
        self.digest = digest
    }
}

/// A stub (or a body marked `follows` or inline) that names no body this save has: CouchDB's
/// 412 `missing_stub`.
public struct MissingStub: Error, CustomStringConvertible, Sendable {
    public let docID: String
    public let name: String

    public init(_ docID: String, _ name: String) {
        (self.docID, self.name) = (docID, name)
    }

    public var description: String {
        "invalid document: _attachments has a stub for \"\(name)\", which document \"\(docID)\" does not have"
    }
}

extension Database {
    /// Stores the bodies a document carries inline (`data`, decoded already), checked against
    /// their digests. An `md5-` digest of these bytes, or of CouchDB's gzip of them (what CouchDB
    /// shows for text), is kept as the digest they were given: a copy of a copy of CouchDB's
    /// documents shows CouchDB's digests. Any other `md5-` digest cannot be checked here, so the
    /// received digest is then the stored bytes' own.
    public func storeInlineBodies(of document: IncomingDocument) throws -> [String: ReceivedBody] {
        var received: [String: ReceivedBody] = [:]
        for attachment in document.attachments ?? [] {
            guard case .data(let bytes) = attachment.body else { continue }
            let claimed = attachment.digest
            let sink = try IncomingBody(blobs: blobs, gzip: false)
            try sink.write(bytes)
            let checkable: String?
            if let claimed, claimed.hasPrefix("md5-") {
                let own = "md5-" + Data(MessageDigest.hash(.md5, bytes)).base64EncodedString()
                checkable = claimed == own ? claimed : nil
            } else {
                checkable = claimed
            }
            let result = try sink.finish(claimedDigest: checkable)
            var digest = result.digest
            if let claimed, claimed.hasPrefix("md5-"), checkable == nil,
               let given = CouchAttachmentMD5.md5(ofDigest: claimed),
               try CouchAttachmentMD5.md5(of: result.blob.key, contentType: attachment.contentType ?? MIMEType.forFileName(attachment.name),
                                          in: blobs) == given {
                digest = claimed
            }
            received[attachment.name] = ReceivedBody(blob: result.blob, digest: digest)
        }
        return received
    }

}

extension RevisionDraft {
    /// Makes this draft the revision a client describes (CouchDB's `new_edits=true` save):
    /// its properties and `_deleted`, and its `_attachments` as the whole list — a stub keeps
    /// the body the document has under that name, `data`/`follows` take the body from
    /// `received`, and names left out are removed. A document without `_attachments` has none,
    /// as in CouchDB, unless `keepingAttachmentsIfUnlisted` (what `sofa put` promises).
    public mutating func take(_ document: IncomingDocument, received: [String: ReceivedBody],
                              keepingAttachmentsIfUnlisted: Bool = false) throws {
        properties = document.properties
        deleted = document.deleted
        if document.attachments == nil && keepingAttachmentsIfUnlisted { return }
        let incoming = document.attachments ?? []
        let keep = Set(incoming.map(\.name))
        for name in attachments.keys where !keep.contains(name) { try removeAttachment(name) }
        for attachment in incoming {
            switch attachment.body {
            case .stub:
                guard let current = attachments[attachment.name] else { throw MissingStub(docID, attachment.name) }
                if let type = attachment.contentType, type != current.contentType {
                    try setContentType(type, ofAttachment: attachment.name)
                }
            case .data, .follows:
                guard let body = received[attachment.name] else { throw MissingStub(docID, attachment.name) }
                try setAttachment(attachment.name, blob: body.blob,
                                  contentType: attachment.contentType ?? MIMEType.forFileName(attachment.name))
            }
        }
        orderAttachments(incoming.map(\.name))  // as sent: CouchDB keeps that order and derives the id from it
    }
}
