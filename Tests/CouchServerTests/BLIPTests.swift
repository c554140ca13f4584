@testable import BLIP
import CGzip
import DocumentModel
import DocumentStore
import Foundation
import TestSupport
import Testing

/// A message's data as BLIP frames carry it: the properties' length, the properties, the body.
func messageData(_ properties: [(String, String)], _ body: [UInt8] = []) -> [UInt8] {
    let encoded = BLIPProperties.encode(properties)
    return Varint.encode(UInt64(encoded.count)) + encoded + body
}

/// Raw deflate with a sync flush, its `00 00 FF FF` tail taken off, as LiteCore compresses a frame.
func deflatedFrameBody(_ data: [UInt8], _ stream: inout z_stream) -> [UInt8] {
    var input = data
    var output = [UInt8](repeating: 0, count: data.count + 1024)
    let produced = input.withUnsafeMutableBufferPointer { inputPointer in
        output.withUnsafeMutableBufferPointer { outputPointer in
            stream.next_in = inputPointer.baseAddress
            stream.avail_in = uInt(inputPointer.count)
            stream.next_out = outputPointer.baseAddress
            stream.avail_out = uInt(outputPointer.count)
            _ = deflate(&stream, Z_SYNC_FLUSH)
            return outputPointer.count - Int(stream.avail_out)
        }
    }
    #expect(Array(output[(produced - 4)..<produced]) == [0, 0, 0xFF, 0xFF])
    return Array(output[..<(produced - 4)])
}

/// The BLIP layer on its own: frames, compression, checksums, acknowledgements.
struct BLIPFrameTests {
    @Test func compressedFramesSharingOneStreamInflateAndTheirChecksumsAreChecked() throws {
        // Two compressed frames through one deflate stream (the second refers back into the
        // first), each followed by the running CRC-32 of the plain data, as LiteCore sends them.
        var stream = z_stream()
        #expect(cz_deflate_init_raw(&stream, 6) == Z_OK)
        defer { deflateEnd(&stream) }
        let first = messageData([("Profile", "changes")], Array(#"[[1,"doc-1","1-abc"],[2,"doc-2","1-def"]]"#.utf8))
        let second = messageData([("Profile", "changes")], Array(#"[[3,"doc-1","2-abc"],[4,"doc-2","2-def"]]"#.utf8))
        var crc: UInt32 = 0
        func frame(_ number: UInt64, _ data: [UInt8], _ stream: inout z_stream) -> [UInt8] {
            crc = data.withUnsafeBufferPointer { UInt32(crc32(uLong(crc), $0.baseAddress, uInt($0.count))) }
            return Varint.encode(number) + [BLIPFlags.compressed.rawValue] + deflatedFrameBody(data, &stream)
                + [UInt8(crc >> 24), UInt8(crc >> 16 & 0xFF), UInt8(crc >> 8 & 0xFF), UInt8(crc & 0xFF)]
        }
        let reader = FrameReader()
        let one = frame(1, first, &stream)
        let two = frame(2, second, &stream)
        for (bytes, expected) in [(one, first), (two, second)] {
            let events = try reader.read(bytes)
            guard case .message(let message)? = events.last else { Issue.record("no message from \(events)"); continue }
            #expect(message.profile == "changes")
            #expect(messageData(message.properties, message.body) == expected)
        }

        // The same frames to a new reader with one checksum byte changed: the connection's end.
        let damaged = FrameReader()
        _ = try damaged.read(one)
        var bad = two
        bad[bad.count - 1] ^= 0x01
        #expect(throws: BLIPProtocolError.self) { try damaged.read(bad) }
    }

    @Test func malformedFramesAreRefused() throws {
        #expect(throws: BLIPProtocolError.self) { try FrameReader().read([]) }
        #expect(throws: BLIPProtocolError.self) { try FrameReader().read([0x81]) }          // a varint cut short
        #expect(throws: BLIPProtocolError.self) { try FrameReader().read([1, 0, 0]) }       // no room for a checksum
        var writer = FrameWriter()
        // Properties without their final NUL.
        let unterminated = writer.frame(number: 1, type: .request, flags: [], data: [3] + Array("abc".utf8))
        #expect(throws: BLIPProtocolError.self) { try FrameReader().read(unterminated) }
        // A key without a value.
        var writer2 = FrameWriter()
        let odd = writer2.frame(number: 1, type: .request, flags: [], data: [4] + Array("abc".utf8) + [0])
        #expect(throws: BLIPProtocolError.self) { try FrameReader().read(odd) }
    }

    @Test func aLongMessageIsAcknowledgedAsItArrives() throws {
        var writer = FrameWriter()
        let reader = FrameReader()
        let data = messageData([("Profile", "rev")], [UInt8](repeating: 7, count: 200_000))
        var acknowledged: [UInt64] = []
        var offset = 0
        var sent: UInt64 = 0
        while offset < data.count {
            let end = min(offset + 16_384, data.count)
            let flags: BLIPFlags = end < data.count ? .moreComing : []
            let frame = writer.frame(number: 1, type: .request, flags: flags, data: Array(data[offset..<end]))
            sent += UInt64(frame.count - 2)  // what LiteCore counts: the frame less its header
            for event in try reader.read(frame) {
                if case .acknowledge(let ack) = event {
                    var at = 0
                    #expect(Varint.read(ack, at: &at) == 1)
                    #expect(Varint.read(ack, at: &at) == UInt64(BLIPMessageType.ackRequest.rawValue | 0x30))
                    acknowledged.append(try #require(Varint.read(ack, at: &at)))
                    #expect(acknowledged.last == sent)  // never more than was sent, or LiteCore ignores it
                }
            }
            offset = end
        }
        #expect(acknowledged.count == 3)  // after 4, 8 and 12 of the 13 frames: every 50,000 bytes
    }

    /// Two connections back to back: a megabyte each way, the reply streamed from a reader into a
    /// sink; without the acknowledgements the sender would stop at 128,000 unacknowledged bytes.
    @Test func twoConnectionsCarryLongMessagesBothWays() async throws {
        let body = (0..<1_000_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ $0 >> 9) }
        /// Reads a body back a piece at a time, as a blob reader would.
        final class Pieces: @unchecked Sendable {
            var remaining: ArraySlice<UInt8>
            init(_ bytes: [UInt8]) { remaining = bytes[...] }
            func next(_ maximum: Int) -> [UInt8]? {
                guard !remaining.isEmpty else { return nil }
                let chunk = Array(remaining.prefix(maximum))
                remaining = remaining.dropFirst(chunk.count)
                return chunk
            }
        }
        let server = BLIPConnection { connection, request in
            let pieces = Pieces(request.body)
            await connection.reply(to: request, properties: [("length", String(request.body.count))],
                                   source: { maximum in pieces.next(maximum) })
        }
        let client = BLIPConnection { _, _ in }
        let pumps = [Task { while let frame = await client.nextFrame() { try await server.receive(frame) } },
                     Task { while let frame = await server.nextFrame() { try await client.receive(frame) } }]
        final class Collected: BLIPBodySink, @unchecked Sendable {
            var bytes: [UInt8] = []
            func write(_ chunk: [UInt8]) throws { bytes += chunk }
        }
        let sink = Collected()
        let reply = try await client.request("echo", body: body, sink: sink)
        #expect(reply["length"] == "1000000")
        #expect(sink.bytes == body)
        await client.close("done")
        await server.close("done")
        for pump in pumps { _ = await pump.result }
    }
}

/// `sofa serve`'s `_blipsync` given what no Couchbase Lite would send: each gets a clear
/// answer, the server stays up, nothing is half-written.
@Suite(.serialized) struct BLIPServerTests {
    let directory = TemporaryDirectory()

    func served(user: Bool = false) throws -> (ServedDatabases, String) {
        let path = directory.appending("target.sofa")
        if !FileManager.default.fileExists(atPath: path) { #expect(try sofa("create", path).succeeded) }
        var arguments = [path]
        if user {
            try "secret\n".write(toFile: directory.appending("password"), atomically: true, encoding: .utf8)
            arguments += ["--user", "admin", "--password-file", directory.appending("password")]
        }
        return (try ServedDatabases(arguments), path)
    }

    @Test func theUpgradeIsRefusedWithHTTPsReasons() throws {
        let (server, _) = try served(user: true)
        let basic = "Basic " + Data("admin:secret".utf8).base64EncodedString()
        let anonymous = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        #expect(anonymous.status == 401 && anonymous.responseBody.contains("not authorized"), "\(anonymous.responseHead)")
        let wrong = try WebSocketClient(port: server.port, path: "/target/_blipsync",
                                        headers: [("Authorization", "Basic " + Data("admin:nope".utf8).base64EncodedString())])
        #expect(wrong.status == 401 && wrong.responseBody.contains("incorrect"))
        let missing = try WebSocketClient(port: server.port, path: "/nowhere/_blipsync", headers: [("Authorization", basic)])
        #expect(missing.status == 404)
        let noProtocol = try WebSocketClient(port: server.port, path: "/target/_blipsync", protocols: nil, headers: [("Authorization", basic)])
        #expect(noProtocol.status == 400 && noProtocol.responseBody.contains("BLIP_3+CBMobile_3"))
        let otherProtocol = try WebSocketClient(port: server.port, path: "/target/_blipsync", protocols: "chat", headers: [("Authorization", basic)])
        #expect(otherProtocol.status == 400)
        let accepted = try WebSocketClient(port: server.port, path: "/target/_blipsync", protocols: "BLIP_3+CBMobile_2, BLIP_3+CBMobile_3",
                                           headers: [("Authorization", basic)])
        #expect(accepted.status == 101)
        #expect(accepted.responseHead.contains("Sec-WebSocket-Protocol: BLIP_3+CBMobile_3"), "\(accepted.responseHead)")
        // The server answers as before.
        #expect(try server.connect().request("GET", "/").status == 200)
    }

    @Test func framesThatBreakTheProtocolCloseTheConnectionOnly() throws {
        let (server, _) = try served()
        let garbage = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        #expect(garbage.status == 101)
        try garbage.send([0xFF, 0xFF, 0xFF])
        let garbageClose = try #require(try garbage.closeFrame())
        #expect(garbageClose.code == 1002 && garbageClose.reason.contains("malformed"), "\(garbageClose)")

        let checksum = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        var writer = FrameWriter()
        var frame = writer.frame(number: 1, type: .request, flags: [], data: messageData([("Profile", "getCheckpoint"), ("client", "x")]))
        frame[frame.count - 2] ^= 0x40
        try checksum.send(frame)
        let checksumClose = try #require(try checksum.closeFrame())
        #expect(checksumClose.code == 1002 && checksumClose.reason.contains("checksum"), "\(checksumClose)")

        let text = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        try text.send(opcode: 1, Array("hello".utf8))
        #expect(try text.closeFrame()?.code == 1003)

        #expect(try server.connect().request("GET", "/target").status == 200)
    }

    /// A message that cannot be read is answered with its reason and ends the connection (1002,
    /// the reason again), never read as nothing; requests that can be read but not granted get
    /// error replies and the connection goes on; a peer that vanishes in the middle of a
    /// revision, or before sending the body that revision needs, leaves nothing behind.
    @Test func badRequestsAreAnsweredAndAVanishedPeerLeavesNothingHalfWritten() throws {
        let (server, path) = try served()
        for (properties, body, named) in [([("Profile", "rev"), ("id", "a"), ("rev", "1-abc")], "{not json", "not JSON"),
                                          ([("Profile", "rev")], "{}", "no document id"),
                                          ([("Profile", "proposeChanges")], #"{"not":"an array"}"#, "not a JSON array"),
                                          ([("Profile", "changes")], #"[[1,"doc"]]"#, "not [sequence, docID, revID")] {
            let unreadable = try WebSocketClient(port: server.port, path: "/target/_blipsync")
            var frames = FrameWriter()
            try unreadable.send(frames.frame(number: 1, type: .request, flags: [], data: messageData(properties, Array(body.utf8))))
            let answer = try #require(try unreadable.receive())
            let events = try FrameReader().read(answer.payload)
            guard case .message(let error)? = events.last else { Issue.record("no answer to \(body): \(events)"); continue }
            #expect(error.type == .error && error["Error-Code"] == "400" && String(decoding: error.body, as: UTF8.self).contains(named),
                    "\(error.properties) \(String(decoding: error.body, as: UTF8.self))")
            let close = try #require(try unreadable.closeFrame())
            #expect(close.code == 1002 && close.reason.contains(named), "\(close)")
        }
        let client = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        var writer = FrameWriter()
        let reader = FrameReader()
        func ask(_ number: UInt64, _ properties: [(String, String)], _ body: [UInt8] = []) throws -> BLIPMessage {
            try client.send(writer.frame(number: number, type: .request, flags: [], data: messageData(properties, body)))
            while let frame = try client.receive() {
                for event in try reader.read(frame.payload) { if case .message(let message) = event { return message } }
            }
            throw SofaError.invalidArgument("the connection ended")
        }
        let unknown = try ask(3, [("Profile", "frobnicate")])
        #expect(unknown.error?.domain == "BLIP" && unknown.error?.code == 404)
        let missing = try ask(4, [("Profile", "getCheckpoint"), ("client", "nobody")])
        #expect(missing.error?.code == 404)
        let saved = try ask(5, [("Profile", "setCheckpoint"), ("client", "me")], Array(#"{"local":7}"#.utf8))
        #expect(saved.type == .response && saved["rev"] != nil)
        let stale = try ask(6, [("Profile", "setCheckpoint"), ("client", "me"), ("rev", "0-99")], Array(#"{"local":8}"#.utf8))
        #expect(stale.error?.code == 409)
        let good = try ask(7, [("Profile", "rev"), ("id", "fine"), ("rev", "1-abc")], Array(#"{"ok":true}"#.utf8))
        #expect(good.type == .response)

        // A revision whose attachment body is asked for, and the peer goes: no document, no blob.
        let digest = BlobKey.of(Array("never sent".utf8)).digestString
        let attachment = #"{"_attachments":{"a.txt":{"digest":"\#(digest)","length":10,"stub":true,"revpos":1}}}"#
        try client.send(writer.frame(number: 8, type: .request, flags: [],
                                     data: messageData([("Profile", "rev"), ("id", "half"), ("rev", "1-def")], Array(attachment.utf8))))
        var askedFor: String?
        while askedFor == nil, let frame = try client.receive() {
            for event in try reader.read(frame.payload) {
                if case .message(let message) = event, message.profile == "getAttachment" { askedFor = message["digest"] }
            }
        }
        #expect(askedFor == digest)
        // Half of another revision, then gone.
        let long = messageData([("Profile", "rev"), ("id", "cut"), ("rev", "1-fed")], Array(#"{"padding":""#.utf8) + [UInt8](repeating: 0x61, count: 40_000))
        try client.send(writer.frame(number: 9, type: .request, flags: .moreComing, data: Array(long.prefix(20_000))))
        client.vanish()

        #expect(try waitUntil(10) { try server.connect().request("GET", "/target/fine").status == 200 })
        #expect(try server.connect().request("GET", "/target/half").status == 404)
        #expect(try server.connect().request("GET", "/target/cut").status == 404)
        let db = try Database.open(at: path)
        #expect(try db.currentRevision(of: "half") == nil && db.currentRevision(of: "cut") == nil)
        #expect(try waitUntil(10) { try FileManager.default.contentsOfDirectory(atPath: path + "/attachments/tmp").isEmpty })
    }

    /// 200 Couchbase Lite replicators connected at once are each answered (the test process's
    /// own descriptors allowing).
    @Test func twoHundredConnectionsAtOnceAreEachAnswered() throws {
        let (server, _) = try served()
        var clients: [WebSocketClient] = []
        for _ in 0..<200 { clients.append(try WebSocketClient(port: server.port, path: "/target/_blipsync")) }
        for (index, client) in clients.enumerated() {
            var writer = FrameWriter()
            try client.send(writer.frame(number: 1, type: .request, flags: [],
                                         data: messageData([("Profile", "getCheckpoint"), ("client", "phone-\(index)")])))
        }
        var answered = 0
        for client in clients {
            let reader = FrameReader()
            while let frame = try client.receive() {
                let events = try reader.read(frame.payload)
                if case .message(let message)? = events.last {
                    if message.error?.code == 404 { answered += 1 }
                    break
                }
            }
        }
        #expect(answered == 200)
    }

    /// A server that stops tells its sync clients so (1001), instead of holding them for its
    /// grace period and then cutting them off.
    @Test func aStoppingServerClosesItsSyncConnectionsWithAReason() throws {
        let (server, _) = try served()
        let client = try WebSocketClient(port: server.port, path: "/target/_blipsync")
        #expect(client.status == 101)
        let stopped = server.stop()
        #expect(stopped.status == 0, "\(stopped.stderr)")
        let close = try #require(try client.closeFrame())
        #expect(close.code == 1001 && close.reason.contains("stopping"), "\(close)")
    }
}

