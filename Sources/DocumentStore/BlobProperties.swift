import DocumentModel
import Foundation

/// How a saved revision's blob properties and its `blob_/…` attachment rows are kept in step.
///
/// The properties decide: each valid blob gets the stand-in row of its pointer, whose body is
/// the one the blob's digest names. The row is found, in order, as the draft's row of that
/// name (set by `RevisionDraft.setAttachment` or carried from the parent), as any stand-in row
/// of the draft or the parent standing for the same body (the blob moved, or a second
/// property names it), or as the body in the blob store. A blob whose body is none of these is
/// refused; so is one whose `length` is not its body's. A stand-in row whose blob went (the
/// property was removed or is no longer a blob) goes with it; a `blob_/…` row that never stood
/// for a blob here (an attachment of that name from another replica) stays.
struct StandInRows {
    let docID: String
    let parentProperties: JSONObject?
    let parentAttachments: [String: Attachment]
    let blobs: BlobStore

    func rows(for properties: JSONObject, draftRows: [String: Attachment]) throws -> [String: Attachment] {
        let found = try Blobs.find(in: properties, docID: docID)
        if found.isEmpty && !draftRows.keys.contains(where: Blobs.isStandInName) { return draftRows }

        var byBody: [BlobKey: Attachment] = [:]
        for row in parentAttachments.values where Blobs.isStandInName(row.name) {
            if let key = body(of: row) { byBody[key] = byBody[key] ?? row }
        }
        for row in draftRows.values where Blobs.isStandInName(row.name) {
            if let key = body(of: row) { byBody[key] = row }
        }
        let current = Set(found.map(\.standInName))
        var result = draftRows.filter { name, _ in
            guard Blobs.isStandInName(name), !current.contains(name) else { return true }
            return !wasBlob(name)
        }
        for blob in found {
            let name = blob.standInName
            var row: Attachment
            if let own = draftRows[name], body(of: own) == blob.key {
                row = own
            } else if let other = byBody[blob.key] {
                row = other.with(name: name)
            } else if let length = blobs.size(of: blob.key) {
                row = Attachment(name: name, contentType: blob.contentType ?? MIMEType.fallback, length: length,
                                 digest: blob.key.digestString, blobKey: blob.key, revpos: 0, contentAvailable: true)
            } else {
                throw SofaError.invalidBlob(docID: docID, pointer: blob.pointer, reason:
                    "no body with digest \(blob.key.digestString) is here or known from a remote; " +
                    "add the bytes with `sofa blob set` or write the file in the mount's blobs/ folder")
            }
            if let length = blob.length, length != row.length {
                throw SofaError.invalidBlob(docID: docID, pointer: blob.pointer,
                                            reason: "its length is \(length) but its body has \(row.length) bytes")
            }
            if let type = blob.contentType, type != row.contentType { row = row.with(contentType: type) }
            result[name] = row
        }
        return result
    }

    /// The body a stand-in row holds: its blob's key when here, else (a body not fetched yet,
    /// known by the remote's digest) the key the parent's blob at its pointer names.
    private func body(of row: Attachment) -> BlobKey? {
        if let key = row.blobKey { return key }
        guard let parentRow = parentAttachments[row.name], parentRow.digest == row.digest,
              let pointer = Blobs.pointer(ofStandIn: row.name), let parentProperties else { return nil }
        return Blobs.blob(at: pointer, in: parentProperties, docID: docID)?.key
    }

    private func wasBlob(_ name: String) -> Bool {
        guard parentAttachments[name] != nil, let pointer = Blobs.pointer(ofStandIn: name), let parentProperties else { return false }
        return Blobs.blob(at: pointer, in: parentProperties, docID: docID) != nil
    }
}

extension Revision {
    /// The revision's valid blob properties, in document order.
    public var blobProperties: [BlobProperty] {
        // Lenient: a stored revision's malformed blob is not a blob (what a replica sent is kept as it came).
        (try? Blobs.find(in: properties, docID: docID, lenient: true)) ?? []
    }

    /// The attachment rows that are not stand-ins of its blobs: its attachments as Couchbase
    /// Lite 1.x and CouchDB users know them.
    public var legacyAttachments: [Attachment] {
        attachments.filter { !isStandIn($0.name) }
    }

    /// The stand-in rows of its blobs, each with the blob it stands for.
    public var blobAttachments: [(blob: BlobProperty, attachment: Attachment)] {
        blobProperties.compactMap { blob in attachment(named: blob.standInName).map { (blob, $0) } }
    }

    /// Whether the attachment `name` stands in for one of its blobs.
    public func isStandIn(_ name: String) -> Bool {
        guard let pointer = Blobs.pointer(ofStandIn: name) else { return false }
        return Blobs.blob(at: pointer, in: properties, docID: docID) != nil
    }
}
