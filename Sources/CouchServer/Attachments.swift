import DocumentModel
import DocumentStore
import Foundation
import NIOCore
import NIOHTTP1

extension CouchServer {
    func attachment(_ request: Request, _ db: Database, id: String, name: String) async throws {
        switch request.method {
        case .GET, .HEAD: try await getAttachment(request, db, id: id, name: name)
        case .PUT: try await putAttachment(request, db, id: id, name: name)
        case .DELETE: try await deleteAttachment(request, db, id: id, name: name)
        default: throw HTTPError.methodNotAllowed
        }
    }

    private func getAttachment(_ request: Request, _ db: Database, id: String, name: String) async throws {
        let rev = try request.query("rev").map { try RevisionID.parse($0) }
        let (attachment, reader) = try await blocking { () -> (Attachment, ReaderBox) in
            let revision: Revision
            if let rev {
                revision = try db.revision(rev, of: id)
            } else {
                guard let current = try db.document(withID: id) else { throw HTTPError.notFound }
                revision = current
            }
            guard let attachment = revision.attachment(named: name) else {
                throw HTTPError(.notFound, "not_found", "Document is missing attachment")
            }
            if !attachment.contentAvailable,
               let source = self.registry.bodySource(for: db, make: self.configuration.bodySource) {
                // Deferred here: fetched from the database's remote as the answer streams (ranges too).
                return (attachment, ReaderBox(try source.open(attachment, docID: id, revID: revision.revID)))
            }
            return (attachment, ReaderBox(try db.openContent(of: attachment, docID: id)))
        }
        let digest = attachment.digest.split(separator: "-", maxSplits: 1).last.map(String.init) ?? attachment.digest
        let etag = "\"\(digest)\""
        var headers: HTTPHeaders = [
            "Accept-Ranges": "bytes",
            "Cache-Control": "must-revalidate",
            "Content-Security-Policy": "sandbox",
            "Content-Type": attachment.contentType,
            "ETag": etag,
        ]
        if request.headers["If-None-Match"].contains(etag) {
            return try await request.response.send(.notModified, headers: ["ETag": etag])
        }
        let length = attachment.length
        let range = try request.headers["Range"].first.flatMap { try byteRange($0, length: length) }
        if !request.response.isHead {
            do {
                try await blocking { try reader.awaitFirstByte(at: range?.0 ?? 0) }
            } catch {
                throw HTTPError(.badGateway, "bad_gateway",
                                "the body of \(name) is not on this server, and the remote it was pulled from cannot send it")
            }
        }
        if let (start, end) = range {
            headers.replaceOrAdd(name: "Content-Range", value: "bytes \(start)-\(end)/\(length)")
            try await request.response.start(.partialContent, headers: headers, contentLength: end - start + 1)
            try await request.response.streamBody(reader, server: self, offset: start, length: end - start + 1)
            return try await request.response.finish()
        }
        try await request.response.start(.ok, headers: headers, contentLength: length)
        if !request.response.isHead {
            try await request.response.streamBody(reader, server: self, length: length)
        }
        try await request.response.finish()
    }

    /// One `bytes=` range, inclusive; nil to send the whole body (no range, or several).
    /// Throws 416 for a range that starts past the end.
    private func byteRange(_ header: String, length: Int64) throws -> (Int64, Int64)? {
        guard header.hasPrefix("bytes=") else { return nil }
        let specs = header.dropFirst(6).split(separator: ",")
        guard specs.count == 1 else { return nil }
        let spec = specs[0].trimmingCharacters(in: .whitespaces)
        let parts = spec.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else { return nil }
        let unsatisfiable = HTTPError(.rangeNotSatisfiable, "requested_range_not_satisfiable", "Requested range not satisfiable")
        if parts[0].isEmpty {
            guard let suffix = Int64(parts[1]), suffix > 0 else { return nil }
            guard length > 0 else { throw unsatisfiable }
            return (max(0, length - suffix), length - 1)
        }
        guard let start = Int64(parts[0]) else { return nil }
        guard start < length else { throw unsatisfiable }
        let end = parts[1].isEmpty ? length - 1 : min(Int64(parts[1]) ?? (length - 1), length - 1)
        guard end >= start else { return nil }
        return (start, end)
    }

    /// `PUT /db/doc/att?rev=`: the body streams into the blob store, then one revision.
    private func putAttachment(_ request: Request, _ db: Database, id: String, name: String) async throws {
        try requireWritable(request)
        try requireAdmin(ifDesign: id, db)
        try AttachmentName.validate(name)
        let rev = try requestedRev(request)
        let contentType = request.headers["Content-Type"].first ?? MIMEType.forFileName(name)
        let gzip = request.headers["Content-Encoding"].first?.lowercased() == "gzip"
        let sink = try await blocking { try IncomingBody(blobs: db.blobs, gzip: gzip) }
        let body: ReceivedBody
        do {
            while let chunk = try await request.body.next() {
                let bytes = Array(chunk.readableBytesView)
                try await blocking { try sink.write(bytes) }
            }
            body = try await blocking {
                let result = try sink.finish(claimedDigest: nil)
                return ReceivedBody(blob: result.blob, digest: result.digest)
            }
        } catch {
            sink.cancel()
            throw error
        }
        let saved = try await blocking { () -> Revision in
            do {
                var draft: RevisionDraft
                if let rev {
                    draft = try db.newRevision(of: id, editing: rev)
                } else if try db.document(withID: id) == nil {
                    draft = try db.newRevision(of: id)
                } else {
                    throw HTTPError.conflict
                }
                try draft.setAttachment(name, blob: body.blob, contentType: contentType)
                return try db.save(draft)
            } catch SofaError.conflict {
                throw HTTPError.conflict
            } catch SofaError.revisionNotFound {
                throw HTTPError.conflict
            }
        }
        try await request.response.sendJSON(.created, ["ok": true, "id": .string(id), "rev": .string(saved.revID.description)],
                                             headers: ["ETag": "\"\(saved.revID)\"",
                                                       "Location": location(request, [request.segments[0], id, name])])
    }

    private func deleteAttachment(_ request: Request, _ db: Database, id: String, name: String) async throws {
        try requireWritable(request)
        try requireAdmin(ifDesign: id, db)
        guard let rev = try requestedRev(request) else { throw HTTPError.conflict }
        let saved = try await blocking { () -> Revision in
            do {
                guard let current = try db.document(withID: id) else { throw HTTPError.notFound }
                guard current.revID == rev else { throw HTTPError.conflict }
                var draft = try db.newRevision(of: id, from: rev)
                try draft.removeAttachment(name)
                return try db.save(draft)
            } catch SofaError.conflict {
                throw HTTPError.conflict
            } catch SofaError.attachmentNotFound {
                throw HTTPError(.notFound, "not_found", "Document is missing attachment")
            }
        }
        try await request.response.sendJSON(.ok, ["ok": true, "id": .string(id), "rev": .string(saved.revID.description)])
    }
}
