import DocumentModel
import DocumentStore
import Foundation
import NIOCore
import NIOHTTP1

extension CouchServer {
    func documentOrAttachment(_ request: Request, _ db: Database, id: String, attachment: [String]) async throws {
        if !attachment.isEmpty {
            return try await self.attachment(request, db, id: id, name: attachment.joined(separator: "/"))
        }
        switch request.method {
        case .GET, .HEAD: try await getDocument(request, db, id: id)
        case .PUT: try await putDocument(request, db, id: id)
        case .DELETE: try await deleteDocument(request, db, id: id)
        case .COPY: try await copyDocument(request, db, id: id)
        default: throw HTTPError.methodNotAllowed
        }
    }

    /// `COPY /db/doc` with `Destination: other` (or `other?rev=R` to overwrite other's R):
    /// the current revision (or `?rev=`) with its attachments, as a new revision of other.
    /// No bytes are copied: the new revision refers to the same bodies.
    private func copyDocument(_ request: Request, _ db: Database, id: String) async throws {
        try requireWritable(request)
        guard let destination = request.headers["Destination"].first, !destination.isEmpty else {
            throw HTTPError.badRequest("Destination header is mandatory for COPY.")
        }
        let parts = destination.split(separator: "?", maxSplits: 1).map(String.init)
        guard let target = parts[0].removingPercentEncoding, !target.isEmpty else { throw HTTPError.badRequest("Invalid Destination header") }
        try requireAdmin(ifDesign: target, db)
        if isUsersDatabase(db) { throw HTTPError(.forbidden, "forbidden", "COPY is not allowed in the users database") }
        var targetRev: RevisionID?
        if parts.count == 2 {
            for pair in parts[1].split(separator: "&") where pair.hasPrefix("rev=") {
                guard let rev = RevisionID(String(pair.dropFirst(4))) else { throw HTTPError.badRequest("Invalid rev format") }
                targetRev = rev
            }
        }
        let sourceRev = try request.query("rev").map { try RevisionID.parse($0) }
        let saved = try await blocking { [targetRev] () -> RevisionID in
            try DocumentID.validate(target)
            let source = try sourceRev.map { try db.revision($0, of: id) } ?? db.document(withID: id)
            guard let source, !source.deleted else { throw HTTPError.notFound }
            // As CouchDB: an existing destination is overwritten only when its revision is given.
            if targetRev == nil, try db.document(withID: target) != nil { throw HTTPError.conflict }
            var draft = try targetRev.map { try db.newRevision(of: target, from: $0) } ?? db.newRevision(of: target)
            draft.properties = source.properties
            for name in draft.attachments.keys { try draft.removeAttachment(name) }
            for attachment in source.attachments { try draft.setAttachment(attachment.with(revpos: 0)) }
            draft.orderAttachments(source.attachments.map(\.name))
            return try db.save(draft).revID
        }
        try await request.response.sendJSON(.created, ["ok": true, "id": .string(target), "rev": .string(saved.description)],
                                             headers: ["ETag": "\"\(saved)\"", "Location": location(request, [request.segments[0], target])])
    }

    // MARK: - Reading

    func renderOptions(_ request: Request) throws -> CouchFormat.Options {
        var options = CouchFormat.Options()
        options.revisions = request.flag("revs")
        options.conflicts = request.flag("conflicts") || request.flag("meta")
        options.deletedConflicts = request.flag("deleted_conflicts") || request.flag("meta")
        options.revsInfo = request.flag("revs_info") || request.flag("meta")
        options.encodingInfo = request.flag("att_encoding_info")
        options.bodies = request.flag("attachments") ? .inline : .stubs
        options.attsSince = try request.jsonQuery("atts_since")?.arrayValue?.compactMap { $0.stringValue.flatMap(RevisionID.init) } ?? []
        return options
    }

    private func getDocument(_ request: Request, _ db: Database, id: String) async throws {
        var options = try renderOptions(request)
        if let raw = request.query("open_revs") {
            let openRevs: JSONValue = raw == "all" ? "all" : try request.jsonQuery("open_revs") ?? .null
            return try await self.openRevs(request, db, id: id, selector: openRevs, options: options)
        }
        let requested = try request.query("rev").map { try RevisionID.parse($0) }
        let multipart = options.bodies == .inline && request.acceptsContentType("multipart/related")
        if multipart { options.bodies = .follows }
        let rendered = try await blocking { [options] () -> CouchFormat.Rendered in
            let tree = try db.revisionTree(of: id)
            let revision: Revision
            if let requested {
                revision = try db.revision(requested, of: id)
            } else {
                guard let current = try db.currentRevision(of: id) else { throw HTTPError.notFound }
                guard !current.deleted else { throw HTTPError(.notFound, "not_found", "deleted") }
                revision = current
            }
            return try CouchFormat.render(revision, tree: tree, options: options,
                                        hasBody: { try db.revisionIfPresent($0, of: id) != nil },
                                        readBody: { try self.readWholeBody($0, db, id: id) })
        }
        let etag = "\"\(rendered.json["_rev"]?.stringValue ?? "")\""
        if request.headers["If-None-Match"].contains(etag) {
            return try await request.response.send(.notModified, headers: ["ETag": etag])
        }
        guard multipart, !rendered.following.isEmpty else {
            return try await request.response.sendJSON(.ok, .object(rendered.json), headers: ["ETag": etag])
        }
        let boundary = makeBoundary()
        try await request.response.start(.ok, headers: ["Content-Type": "multipart/related; boundary=\"\(boundary)\"", "ETag": etag])
        try await writeRelatedParts(rendered, db: db, id: id, boundary: boundary, response: request.response)
        try await request.response.write("--\(boundary)--")
        try await request.response.finish()
    }

    /// A body for inline base64 (JSON with `attachments=true`); bounded, as JSON bodies are.
    func readWholeBody(_ attachment: Attachment, _ db: Database, id: String) throws -> [UInt8] {
        guard attachment.length <= Int64(ServerTuning.jsonBody) else {
            throw HTTPError(.payloadTooLarge, "too_large", "attachment \(attachment.name) is too large to inline; use multipart")
        }
        let reader = try db.openContent(of: attachment, docID: id)
        var bytes = [UInt8](repeating: 0, count: Int(attachment.length))
        var filled = 0
        try bytes.withUnsafeMutableBytes { buffer in
            while filled < buffer.count {
                let count = try reader.read(into: UnsafeMutableRawBufferPointer(rebasing: buffer[filled...]))
                guard count > 0 else { throw SofaError.blobCorrupted(key: reader.key.hex, path: reader.path) }
                filled += count
            }
        }
        var probe: UInt8 = 0
        guard try withUnsafeMutableBytes(of: &probe, { try reader.read(into: $0) }) == 0 else {
            throw SofaError.blobCorrupted(key: reader.key.hex, path: reader.path)
        }
        return bytes
    }

    /// The JSON part and the attachment parts of one revision, each opened by `--boundary`;
    /// the caller writes the close delimiter.
    func writeRelatedParts(_ rendered: CouchFormat.Rendered, db: Database, id: String, boundary: String,
                           response: ResponseWriter) async throws {
        var json = JSONValue.object(rendered.json).serialized()
        json.insert(contentsOf: Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8), at: 0)
        json.append(contentsOf: Array("\r\n".utf8))
        try await response.write(json)
        for attachment in rendered.following {
            let name = attachment.name.replacingOccurrences(of: "\"", with: "\\\"")
            try await response.write("--\(boundary)\r\nContent-Disposition: attachment; filename=\"\(name)\"\r\n"
                + "Content-Type: \(attachment.contentType)\r\nContent-Length: \(attachment.length)\r\n\r\n")
            let reader = try await blocking { ReaderBox(try db.openContent(of: attachment, docID: id)) }
            try await response.streamBody(reader, server: self, length: attachment.length)
            try await response.write("\r\n")
        }
    }

    /// `GET /db/doc?open_revs=all|[…]`: the leaves or the given revisions, as
    /// `multipart/mixed` (bodies included, as CouchDB does for that type) or a JSON array.
    private func openRevs(_ request: Request, _ db: Database, id: String, selector: JSONValue, options: CouchFormat.Options) async throws {
        var options = options
        let multipart = request.acceptsContentType("multipart/mixed")
        if multipart { options.bodies = .follows }
        let latest = request.flag("latest")
        let wanted: [RevisionID]?
        if selector.stringValue == "all" {
            wanted = nil
        } else if let list = selector.arrayValue {
            wanted = try list.map { value in
                guard let text = value.stringValue, let rev = RevisionID(text) else { throw HTTPError.badRequest("Invalid rev format") }
                return rev
            }
        } else {
            throw HTTPError.badRequest("open_revs must be \"all\" or a JSON array of revisions")
        }
        let results = try await blocking { [options] () -> [Result<CouchFormat.Rendered, OpenRevMissing>] in
            let tree: RevisionTree
            do { tree = try db.revisionTree(of: id) } catch SofaError.documentNotFound {
                guard let wanted else { throw HTTPError.notFound }
                return wanted.map { .failure(OpenRevMissing(rev: $0)) }
            }
            // All leaves come in revision order, as CouchDB lists them.
            let revs = wanted.map { list in list.flatMap { latest ? tree.latestLeaves(from: $0) : [$0] } } ?? tree.leaves.map(\.id).sorted()
            return try revs.map { rev in
                guard let revision = try db.revisionIfPresent(rev, of: id) else { return .failure(OpenRevMissing(rev: rev)) }
                return .success(try CouchFormat.render(revision, tree: tree, options: options) { try self.readWholeBody($0, db, id: id) })
            }
        }
        let response = request.response
        if !multipart {
            try await response.start(.ok, headers: ["Content-Type": "application/json", "Cache-Control": "must-revalidate"])
            let rows: [JSONValue] = results.map { result in
                switch result {
                case .success(let rendered): ["ok": .object(rendered.json)]
                case .failure(let missing): ["missing": .string(missing.rev.description)]
                }
            }
            try await response.write(JSONValue.array(rows).serialized() + [0x0A])
            return try await response.finish()
        }
        let boundary = makeBoundary()
        try await response.start(.ok, headers: ["Content-Type": "multipart/mixed; boundary=\"\(boundary)\""])
        for result in results {
            switch result {
            case .success(let rendered):
                try await writeMixedPart(rendered, db: db, id: id, boundary: boundary, response: response)
            case .failure(let missing):
                let json = JSONValue.object(["missing": .string(missing.rev.description)]).jsonString()
                try await response.write("--\(boundary)\r\nContent-Type: application/json; error=\"true\"\r\n\r\n\(json)\r\n")
            }
        }
        try await response.write("--\(boundary)--")
        try await response.finish()
    }

    /// One revision as a part of a `multipart/mixed` response: JSON alone, or a nested
    /// `multipart/related` with its attachment bodies.
    func writeMixedPart(_ rendered: CouchFormat.Rendered, db: Database, id: String, boundary: String,
                        response: ResponseWriter) async throws {
        if rendered.following.isEmpty {
            let json = JSONValue.object(rendered.json).serialized()
            try await response.write(Array("--\(boundary)\r\nContent-Type: application/json\r\n\r\n".utf8) + json + [0x0D, 0x0A])
        } else {
            let inner = makeBoundary()
            try await response.write("--\(boundary)\r\nContent-Type: multipart/related; boundary=\"\(inner)\"\r\n\r\n")
            try await writeRelatedParts(rendered, db: db, id: id, boundary: inner, response: response)
            try await response.write("--\(inner)--\r\n")
        }
    }

    // MARK: - Writing

    /// The revision a write applies to: `?rev=`, `If-Match`, or the body's `_rev`.
    func requestedRev(_ request: Request) throws -> RevisionID? {
        if let text = request.query("rev") ?? request.headers["If-Match"].first.map({ $0.trimmingCharacters(in: CharacterSet(charactersIn: "\"")) }) {
            guard let rev = RevisionID(text) else { throw HTTPError.badRequest("Invalid rev format") }
            return rev
        }
        return nil
    }

    private func putDocument(_ request: Request, _ db: Database, id: String) async throws {
        try requireWritable(request)
        let newEdits = request.flag("new_edits", default: true)
        var document: IncomingDocument
        var received: [String: ReceivedBody] = [:]
        if request.headers.mediaType == "multipart/related" {
            guard let boundary = request.headers.contentTypeParameter("boundary"), !boundary.isEmpty else {
                throw HTTPError.badRequest("multipart/related needs a boundary")
            }
            (document, received) = try await readMultipartDocument(request, db: db, boundary: boundary)
        } else {
            document = try IncomingDocument(try await request.body.json(limit: ServerTuning.jsonBody))
        }
        if let id = document.id, id != id { throw HTTPError.badRequest("Document id must match the URL") }
        if document.rev == nil { document.rev = try requestedRev(request) }
        let stored = try await storeDocuments([(id, document)], received: [id: received], db: db, newEdits: newEdits)
        let rev = try stored[0].get()
        try await sendSaved(request, id: id, rev: rev, deleted: document.deleted)
    }

    func postDocument(_ request: Request, database db: Database) async throws {
        try requireWritable(request)
        var document = try IncomingDocument(try await request.body.json(limit: ServerTuning.jsonBody))
        let id = document.id ?? UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        document.id = id
        let rev = try await storeDocuments([(id, document)], received: [:], db: db, newEdits: true)[0].get()
        try await sendSaved(request, id: id, rev: rev, deleted: document.deleted)
    }

    /// 201 with the new revision (200 for a deletion, as CouchDB); with `batch=ok`, CouchDB's
    /// 202 without one. (Sofa has already saved it: the answer only keeps the protocol clients expect.)
    private func sendSaved(_ request: Request, id: String, rev: RevisionID, deleted: Bool) async throws {
        if request.query("batch") == "ok" {
            return try await request.response.sendJSON(.accepted, ["ok": true, "id": .string(id)],
                                                        headers: ["Location": location(request, [request.segments[0], id])])
        }
        try await request.response.sendJSON(deleted ? .ok : .created, ["ok": true, "id": .string(id), "rev": .string(rev.description)],
                                             headers: ["ETag": "\"\(rev)\"", "Location": location(request, [request.segments[0], id])])
    }

    /// Reads a `multipart/related` document: the JSON part, then each `follows` body
    /// streamed into the blob store.
    private func readMultipartDocument(_ request: Request, db: Database, boundary: String) async throws
        -> (IncomingDocument, [String: ReceivedBody]) {
        let body = request.body
        let reader = MultipartReader(boundary: boundary, source: { try await body.next() })
        guard try await reader.nextPart() != nil else { throw MultipartReader.malformed("no document part") }
        let document: IncomingDocument
        do {
            document = try IncomingDocument(try JSONParser.parse(try await reader.readPart(limit: ServerTuning.jsonBody)))
        } catch let error as JSONParseError {
            _ = error
            throw HTTPError.invalidJSON
        }
        var pending = IncomingAttachment.following(in: document)
        var received: [String: ReceivedBody] = [:]
        while let headers = try await reader.nextPart() {
            guard let (attachment, gzip) = IncomingAttachment.take(partWith: headers, from: &pending) else {
                throw MultipartReader.malformed("a part matches no attachment marked follows")
            }
            let sink = try await blocking { try IncomingBody(blobs: db.blobs, gzip: gzip) }
            do {
                while let chunk = try await reader.readChunk() {
                    try await blocking { try sink.write(chunk) }
                }
                let claimed = attachment.digest
                let result = try await blocking { () -> (blob: StoredBlob, digest: String) in
                    let result = try sink.finish(claimedDigest: claimed)
                    // The sender's digest of the encoded form still names this body.
                    if let claimed, claimed != result.digest, claimed.hasPrefix("md5-") { try db.recordAlias(claimed, of: result.blob.key) }
                    return result
                }
                received[attachment.name] = ReceivedBody(blob: result.blob, digest: result.digest)
            } catch {
                sink.cancel()
                throw error
            }
        }
        guard pending.isEmpty else {
            throw HTTPError.badRequest("no body part for attachment \(pending[0].name) marked follows")
        }
        return (document, received)
    }

    /// Saves documents: with `newEdits`, each as a new revision (conflicts reported per
    /// document); without, each inserted with its history, all or none (a missing stub
    /// fails the whole request, as in CouchDB).
    func storeDocuments(_ documents: [(id: String, document: IncomingDocument)], received: [String: [String: ReceivedBody]],
                        db: Database, newEdits: Bool) async throws -> [Result<RevisionID, HTTPError>] {
        // Design documents are the database admins'; `_users` documents are checked and their passwords hashed.
        var documents = documents
        var refused: [String: HTTPError] = [:]
        let user = CouchServer.user
        let isAdmin = try user.isServerAdmin || SecurityObject(db.securityObject).isAdmin(user)
        let users = isUsersDatabase(db)
        for index in documents.indices {
            let (id, document) = documents[index]
            if DocumentID.isDesign(id) && !isAdmin {
                refused[id] = HTTPError(user.name == nil ? .unauthorized : .forbidden, user.name == nil ? "unauthorized" : "forbidden",
                                        "You are not a db or server admin.")
            } else if users {
                do {
                    documents[index].document.properties = try checkedUserDocument(document.properties, id: id, deleted: document.deleted)
                } catch {
                    refused[id] = HTTPError.from(error)
                }
            }
        }
        if !newEdits || documents.count == 1, let error = documents.lazy.compactMap({ refused[$0.id] }).first { throw error }
        let accepted = documents
        // Inline bodies go to the blob store first, outside the write transaction.
        var received = received
        for (id, document) in documents where document.attachments?.contains(where: \.isInline) == true {
            let inline = try await blocking { try db.storeInlineBodies(of: document) }
            received[id, default: [:]].merge(inline) { _, new in new }
        }
        let bodies = received
        return try await blocking { [refused] in
            if newEdits {
                func answer(_ error: SofaError, _ document: IncomingDocument) -> any Error {
                    switch error {
                    case .conflict, .revisionNotFound: HTTPError.conflict
                    case .documentNotFound where document.rev != nil: HTTPError.conflict
                    case .sqlite, .io, .diskFull, .readOnlyFileSystem, .blobCorrupted: error
                    default: HTTPError(error)
                    }
                }
                // Drafts made and validated before the write lock: a slow validate_doc_update
                // holds up no other save, and the saves of one database validate at once, as
                // CouchDB's do. The save validates again only if what they saw changed.
                let validating = try db.hasValidators()
                let drafts = accepted.map { id, document in
                    Result { () -> (RevisionDraft, Database.Validated?) in
                        if let error = refused[id] { throw error }
                        do {
                            let draft = try self.draft(for: document, id: id, db: db, received: bodies[id] ?? [:])
                            return (draft, validating ? try db.prevalidate(draft) : nil)
                        } catch let error as SofaError {
                            throw answer(error, document)
                        }
                    }
                }
                return try db.inBatch { batch in
                    zip(accepted, drafts).map { accepted, prepared in
                        Result {
                            let (draft, validated) = try prepared.get()
                            do {
                                return try batch.save(draft, validated: validated).revID
                            } catch let error as SofaError {
                                throw answer(error, accepted.document)
                            }
                        }.mapError(HTTPError.from)
                    }
                }
            }
            // Replicated revisions: resolve everything first, then insert in one transaction.
            let revisions = try accepted.map { id, document in
                try self.replicatedRevision(document, id: id, db: db, received: bodies[id] ?? [:])
            }
            // A revision a validator refuses is reported and the others are stored, as CouchDB does.
            return try db.inBatch { batch in
                try revisions.map { revision in
                    do {
                        _ = try batch.insert(revision)
                        return .success(revision.revID)
                    } catch let error as SofaError where error.isRefusedByDesign {
                        return .failure(HTTPError(error))
                    }
                }
            }
        }
    }

    /// A draft for a normal save (`new_edits=true`).
    private func draft(for document: IncomingDocument, id: String, db: Database, received: [String: ReceivedBody]) throws -> RevisionDraft {
        var draft = try document.rev.map { try db.newRevision(of: id, editing: $0) } ?? db.newDocument(id)
        try draft.take(document, received: received)
        return draft
    }

    /// A revision with its history for `new_edits=false`. Stubs refer to bodies this
    /// database has under the same name in an ancestor (or another leaf).
    private func replicatedRevision(_ document: IncomingDocument, id: String, db: Database,
                                    received: [String: ReceivedBody]) throws -> ReplicatedRevision {
        guard let rev = document.rev else { throw HTTPError.badRequest("new_edits=false needs _rev") }
        var attachments: [Attachment] = []
        var known: [String: Attachment]?
        for attachment in document.attachments ?? [] {
            let type = attachment.contentType ?? MIMEType.forFileName(attachment.name)
            switch attachment.body {
            case .stub:
                if known == nil { known = try db.attachmentsForStubs(of: id, ancestors: document.ancestors) }
                guard let existing = known?[attachment.name] else { throw MissingStub(id, attachment.name) }
                attachments.append(existing.with(contentType: type, revpos: attachment.revpos ?? existing.revpos))
            case .data, .follows:
                guard let body = received[attachment.name] else { throw MissingStub(id, attachment.name) }
                attachments.append(Attachment(name: attachment.name, contentType: type, length: body.blob.length,
                                              digest: body.digest, blobKey: body.blob.key,
                                              revpos: attachment.revpos ?? rev.generation, contentAvailable: true))
            }
        }
        return ReplicatedRevision(docID: id, revID: rev, ancestors: document.ancestors, deleted: document.deleted,
                                  properties: document.properties, attachments: attachments)
    }

    private func deleteDocument(_ request: Request, _ db: Database, id: String) async throws {
        try requireWritable(request)
        guard let rev = try requestedRev(request) else { throw HTTPError.conflict }
        // As CouchDB: a stale revision is a conflict before it is a question of rights.
        if DocumentID.isDesign(id), try await blocking({ try db.currentRevision(of: id)?.revID }) != rev { throw HTTPError.conflict }
        try requireAdmin(ifDesign: id, db)
        let deleted = try await blocking { () -> Revision in
            do {
                return try db.deleteDocument(id, revID: rev)
            } catch SofaError.conflict {
                throw HTTPError.conflict
            } catch SofaError.documentNotFound {
                // As CouchDB: a deleted document says so, whatever revision was named.
                throw try db.currentRevision(of: id)?.deleted == true ? HTTPError(.notFound, "not_found", "deleted") : HTTPError.notFound
            }
        }
        try await request.response.sendJSON(.ok, ["ok": true, "id": .string(id), "rev": .string(deleted.revID.description)],
                                             headers: ["ETag": "\"\(deleted.revID)\""])
    }

    // MARK: - _local documents

    func localDocument(_ request: Request, _ db: Database, id: String) async throws {
        switch request.method {
        case .GET, .HEAD:
            guard let local = try await blocking({ try db.localDocument(withID: id) }) else { throw HTTPError.notFound }
            var json: JSONObject = ["_id": .string(id), "_rev": .string(local.rev)]
            for (key, value) in local.body { json[key] = value }
            try await request.response.sendJSON(.ok, .object(json))
        case .PUT:
            try requireWritable(request)
            let body = try await request.body.json(limit: ServerTuning.jsonBody)
            guard case .object(let object) = body else { throw HTTPError.badRequest("Document must be a JSON object") }
            let rev = object["_rev"]?.stringValue ?? request.query("rev")
            let stored = object.filter { $0 != "_id" && $0 != "_rev" }
            let newRev = try await blocking { try db.replaceLocalDocument(id, body: stored, after: rev) }
            try await request.response.sendJSON(.created, ["ok": true, "id": .string(id), "rev": .string(newRev)],
                                                 headers: ["Location": location(request, [request.segments[0], id])])
        case .DELETE:
            try requireWritable(request)
            try await blocking { try db.deleteLocalDocument(id) }
            try await request.response.sendJSON(.ok, ["ok": true, "id": .string(id), "rev": "0-0"])
        default:
            throw HTTPError.methodNotAllowed
        }
    }
}

struct OpenRevMissing: Error {
    let rev: RevisionID
}

extension RevisionTree {
    /// The leaves descending from `rev` (itself if it is a leaf); `[rev]` if unknown.
    func latestLeaves(from rev: RevisionID) -> [RevisionID] {
        guard contains(rev) else { return [rev] }
        let leaves = self.leaves.filter { history(of: $0.id).contains(rev) }.map(\.id)
        return leaves.isEmpty ? [rev] : leaves
    }
}
