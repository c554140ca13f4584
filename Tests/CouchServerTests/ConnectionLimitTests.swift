import DocumentModel
import DocumentStore
import Foundation
import Testing
import TestSupport

/// A real `sofa serve` at the edge of its connections: idle clients at the descriptor limit
/// leave room for new ones, and SIGTERM right after a burst of connections ends it cleanly.
@Suite struct ConnectionLimitTests {
    let directory = TemporaryDirectory()

    func serve(_ name: String = "db") throws -> ServedDatabases {
        let db = try directory.makeDatabase("\(name).sofa")
        return try ServedDatabases([db.path], logLevel: "info")
    }

    /// With 256 descriptors and 400 idle connections, accepting used to stop at the limit (every
    /// descriptor an idle socket), and new clients waited for the 60 s header timeout: 5 of 8
    /// timed out at 10 s. Now the longest idle connection makes room for each new one.
    @Test func idleClientsAtTheDescriptorLimitLeaveRoomForNewOnes() throws {
        let server = try serve()
        let limit = try shell("prlimit --pid \(server.process.pid) --nofile=256:256")
        #expect(limit.succeeded, "\(limit.stderr)")
        var idle: [HTTPConnection] = []
        for _ in 0..<400 { idle.append(try server.connect()) }
        usleep(700_000)  // idle: they may be closed for room (ServerTuning.idleBeforeClosing)
        // Each is answered, where it used to wait for an idle one's 60 s timeout (the client gives up after 30).
        for index in 0..<8 {
            let client = try HTTPConnection(port: server.port, timeout: 30)
            let answer = try client.request("GET", "/")
            #expect(answer.status == 200, "request \(index)")
        }
        idle.removeAll()
        let result = server.stop()
        #expect(result.succeeded, "\(result.stderr)")
        #expect(result.stderr.contains("closed an idle connection to make room: 128 are open"), "the cap follows the real limit")
    }

    /// `sofa serve` died with SIGILL (an NIOAsyncChannel dropped unserved traps in its writer's
    /// deinit) when SIGTERM came right after a few thousand connections closed.
    @Test func sigtermRightAfterABurstOfConnectionsEndsCleanly() throws {
        for round in 0..<3 {
            let server = try serve("round\(round)")
            for wave in 0..<6 {
                var open: [HTTPConnection] = []
                for index in 0..<500 {
                    let connection = try server.connect()
                    if (wave + index) % 2 == 0 { try connection.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n") }
                    open.append(connection)
                }
                for connection in open { connection.close() }
            }
            let result = server.stop()  // SIGTERM at once
            #expect(result.succeeded, "round \(round): \(result.status) \(result.stderr.suffix(2_000))")
            #expect(!result.stderr.contains("crashed"), "round \(round)")
        }
    }
}
