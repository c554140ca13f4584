import BLIP
import DocumentModel
import DocumentStore

/// A client's checkpoints, kept by the passive side (`_local/checkpoint/CLIENT`, as Sync
/// Gateway names them), and the active side's calls for them.
extension BLIPReplicator {
    func getCheckpoint(_ request: BLIPMessage) async throws {
        let client = try Self.required(request, "client")
        let db = database
        let found = try await pool.run { () -> (String, JSONObject)? in
            // A checkpoint an HTTP replication with the same id left (`_local/ID`): a database
            // that replicated over http:// goes on from there over ws://, not from the start.
            try db.localDocument(withID: BLIPTuning.checkpointID(client)) ?? db.localDocument(withID: "_local/\(client)")
        }
        guard let (rev, body) = found else { throw BLIPError.notFound("missing") }
        await connection.reply(to: request, properties: [("rev", rev)], body: JSONValue.object(body).serialized())
    }

    func setCheckpoint(_ request: BLIPMessage, readOnly: Bool) async throws {
        if readOnly { throw BLIPError(code: 403, message: "this server is read-only") }
        let id = BLIPTuning.checkpointID(try Self.required(request, "client"))
        guard let body = try Self.json(request, "setCheckpoint").objectValue else {
            throw BLIPSyncError.protocolViolation("setCheckpoint: the body is not a JSON object")
        }
        let rev = request["rev"].flatMap { $0.isEmpty ? nil : $0 }
        let db = database
        let saved = try await pool.run { () -> String in
            // A first save over a checkpoint an HTTP replication left has no `rev` for this name.
            let current = try db.localDocument(withID: id)?.0
            do { return try db.replaceLocalDocument(id, body: body, ifRevisionIs: current == nil ? nil : rev) } catch SofaError.conflict {
                throw BLIPError(code: 409, message: "the checkpoint has changed since revision \(rev ?? "(none)")")
            }
        }
        await connection.reply(to: request, properties: [("rev", saved)])
    }

    /// The server's checkpoint for `client` and its revision, or nil when it has none.
    public func remoteCheckpoint(_ client: String) async throws -> (body: JSONObject, rev: String?)? {
        do {
            let reply = try await request("getCheckpoint", [("client", client)])
            guard let body = try Self.json(reply, "getCheckpoint's answer").objectValue else {
                throw BLIPSyncError.protocolViolation("getCheckpoint's answer is not a JSON object")
            }
            return (body, reply["rev"])
        } catch BLIPSyncError.refused(let error) where error.code == 404 {
            return nil
        }
    }

    /// Saves the server's checkpoint for `client` over revision `rev`; returns the new revision.
    public func saveRemoteCheckpoint(_ client: String, _ body: JSONObject, rev: String?) async throws -> String? {
        var properties = [("client", client)]
        if let rev { properties.append(("rev", rev)) }
        return try await request("setCheckpoint", properties, body: JSONValue.object(body).serialized())["rev"]
    }

    /// A request whose error reply or lost connection throws `BLIPSyncError`.
    func request(_ profile: String, _ properties: [(String, String)] = [], body: [UInt8] = [],
                 sink: (any BLIPBodySink)? = nil) async throws -> BLIPMessage {
        do {
            return try await connection.request(profile, properties: properties, body: body, sink: sink)
        } catch let error as BLIPError {
            throw BLIPSyncError.refused(error)
        } catch let error as BLIPProtocolError {
            throw BLIPSyncError.closed("\(error)")
        }
    }
}
