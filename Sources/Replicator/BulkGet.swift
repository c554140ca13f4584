import DocumentModel
import DocumentStore
import Foundation
import HTTPTransport

/// A `_bulk_get` answer in `multipart/mixed` (asked with `attachments=true`), read as it
/// arrives: each revision's JSON, and the attachment bodies that follow it streamed into the
/// blob store and checked against their digests before they are installed. One request
/// brings a batch of documents with their bodies; memory holds one document's JSON at a time.
///
/// The answer has a part per revision, in the order asked: `application/json` (a revision
/// without bodies to send, or an error, `error="true"`), or `multipart/related` (the JSON,
/// then a part per attachment marked `follows`, gzip-encoded where the server stores it so,
/// as `att_encoding_info=true` asks). A body that does not fit on the disk is left out (the
/// target then asks for it alone, and fails that document as it fails any that does not fit).
final class BulkGetReader {
    private let wanted: [(id: String, rev: RevisionID)]
    private let blobs: BlobStore
    private let since = Date()
    private var outer: MultipartParser?
    private var results: [Result<ReplicatedRevision, DocumentFailure>] = []
    /// The entry of `wanted` the next part answers (to name an error that names no document).
    private var cursor = 0

    private enum Part {
        /// A JSON part (the bytes are in `json`): a revision, or an error.
        case json(error: Bool)
        case related(MultipartParser)
    }
    private var part: Part?
    private var json: [UInt8] = []

    // The revision of the `multipart/related` part being read.
    private var readingDocument = false
    private var revision: ReplicatedRevision?
    private var failure: DocumentFailure?
    private var following: [IncomingAttachment] = []
    /// The attachment whose body is arriving; nil `incoming` when it is being skipped.
    private var body: (attachment: IncomingAttachment, incoming: IncomingBody?)?

    /// Told every half second while a body arrives.
    private let bodyProgress: ((BodyProgress) -> Void)?
    private var lastReport = Date()

    init(wanted: [(id: String, rev: RevisionID)], blobs: BlobStore, bodyProgress: ((BodyProgress) -> Void)?) {
        self.wanted = wanted
        self.blobs = blobs
        self.bodyProgress = bodyProgress
    }

    deinit { body?.incoming?.cancel() }

    var isStarted: Bool { outer != nil }

    /// Sets up for an answer of this Content-Type; false when it is not `multipart/mixed`.
    func start(contentType: String) -> Bool {
        guard MultipartParser.mediaType(contentType) == "multipart/mixed",
              let boundary = MultipartParser.parameter(contentType, "boundary") else { return false }
        outer = MultipartParser(boundary: boundary) { [unowned self] in try outerEvent($0) }
        return true
    }

    func feed(_ bytes: UnsafeRawBufferPointer) throws {
        do {
            try outer?.feed(bytes)
        } catch let error as MultipartError {
            throw ReplicationError.protocolError("_bulk_get: \(error)")
        }
    }

    /// The revisions, once the answer ended.
    func finish() throws -> [Result<ReplicatedRevision, DocumentFailure>] {
        do {
            try outer?.finish()
        } catch let error as MultipartError {
            throw ReplicationError.protocolError("_bulk_get: \(error)")
        }
        return results
    }

    private func outerEvent(_ event: MultipartParser.Event) throws {
        switch event {
        case .part(let headers):
            let type = headers["content-type"] ?? "application/json"
            json = []
            if MultipartParser.mediaType(type) == "multipart/related", let boundary = MultipartParser.parameter(type, "boundary") {
                (readingDocument, revision, failure, following, body) = (false, nil, nil, [], nil)
                part = .related(MultipartParser(boundary: boundary) { [unowned self] in try relatedEvent($0) })
            } else {
                part = .json(error: MultipartParser.parameter(type, "error") == "true")
            }
        case .bytes(let bytes):
            switch part {
            case .json: try append(bytes)
            case .related(let parser): try parser.feed(bytes)
            case nil: break
            }
        case .partEnd:
            switch part {
            case .json(let error): try answer(try JSONParser.parse(json), isError: error)
            case .related(let parser):
                try parser.finish()
                if let failure {
                    record(.failure(failure), id: failure.docID)
                } else if let revision {
                    // A body the server did not send is asked for alone by the target.
                    record(.success(revision), id: revision.docID)
                } else {
                    throw ReplicationError.protocolError("_bulk_get: a multipart/related part without a document")
                }
            case nil: break
            }
            part = nil
        }
    }

    private func relatedEvent(_ event: MultipartParser.Event) throws {
        switch event {
        case .part(let headers):
            guard revision != nil || failure != nil else {
                readingDocument = true
                return
            }
            guard failure == nil else {
                body = nil
                return
            }
            guard let (attachment, gzip) = IncomingAttachment.take(partWith: headers, from: &following) else {
                throw ReplicationError.protocolError("_bulk_get: a part of \(revision!.docID) matches no attachment marked follows")
            }
            do {
                body = (attachment, try IncomingBody(blobs: blobs, gzip: gzip))
            } catch let error as SofaError where error.isDiskFull {
                body = (attachment, nil)
            }
        case .bytes(let bytes):
            if readingDocument {
                try append(bytes)
            } else if let incoming = body?.incoming, let attachment = body?.attachment {
                if let bodyProgress, Date().timeIntervalSince(lastReport) >= 0.5, let docID = revision?.docID {
                    lastReport = Date()
                    bodyProgress(BodyProgress(digest: attachment.digest ?? "", docID: docID, name: attachment.name,
                                              present: incoming.length, length: attachment.length ?? 0, fetching: true))
                }
                do {
                    try incoming.write(bytes)
                } catch let error as SofaError where error.isDiskFull {
                    incoming.cancel()
                    body?.incoming = nil
                }
            }
        case .partEnd:
            if readingDocument {
                readingDocument = false
                readDocument()
            } else if let (attachment, incoming) = body, let incoming, let docID = revision?.docID {
                body = nil
                do {
                    let (blob, digest) = try incoming.finish(claimedDigest: attachment.digest, claimedLength: attachment.length, durable: false)
                    revision?.arrivedBodies[attachment.name] = ArrivedBody(blob: blob, digest: digest, since: since)
                } catch let mismatch as IncomingBodyMismatch {
                    throw ReplicationError.protocolError("attachment \(attachment.name) of \(docID): \(mismatch)")
                } catch let error as SofaError where error.isDiskFull {
                    // Left for the target to ask for alone.
                }
            } else {
                body = nil
            }
        }
    }

    private func append(_ bytes: UnsafeRawBufferPointer) throws {
        json.append(contentsOf: bytes)
        guard json.count <= ReplicatorTuning.largestDocumentJSON else {
            throw ReplicationError.protocolError("_bulk_get: a document's JSON is larger than \(ReplicatorTuning.largestDocumentJSON) bytes")
        }
    }

    /// The JSON part of a `multipart/related` revision: the revision, and the bodies to expect.
    private func readDocument() {
        let fallbackID = cursor < wanted.count ? wanted[cursor].id : "?"
        do {
            let document = try IncomingDocument(try JSONParser.parse(json))
            revision = try RemotePeer.replicatedRevision(document)
            following = IncomingAttachment.following(in: document)
        } catch {
            failure = DocumentFailure(docID: fallbackID, rev: nil, error: "invalid", reason: "\(error)")
        }
    }

    /// A JSON part: a revision without bodies to send, or an error.
    private func answer(_ json: JSONValue, isError: Bool) throws {
        let asked = cursor < wanted.count ? wanted[cursor] : nil
        if isError || (json["error"] != nil && json["_id"] == nil) {
            record(.failure(.notGiven(json, id: asked?.id, rev: asked?.rev.description)), id: nil)
            return
        }
        record(RemotePeer.revisionResult(json), id: json["_id"]?.stringValue)
    }

    /// Keeps a result. A revision of the document asked for next answers that entry; one of
    /// the document before it is another leaf `latest=true` brought for the same entry.
    private func record(_ result: Result<ReplicatedRevision, DocumentFailure>, id: String?) {
        if cursor < wanted.count && (id == nil || wanted[cursor].id == id) { cursor += 1 }
        results.append(result)
    }
}
