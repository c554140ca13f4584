import Foundation
import Testing
@testable import FuseKit

/// The mount's reading thread spins only while the CPUs have time to spare (DeviceIO.swift).
@Suite struct SpinGateTests {
    @Test func spinningStopsWhileNoCPUIsIdleAndResumesWhenOneIs() {
        let gate = SpinGate()
        let window = SpinGate.window
        #expect(gate.mayStart(at: window, idle: { 100 }))  // the first look has nothing to compare
        #expect(gate.mayStart(at: 2 * window, idle: { 100 }) == false)  // no idle time in a window
        #expect(gate.mayStart(at: 2 * window + 1, idle: { Issue.record("looked again within the window"); return nil }) == false)
        #expect(gate.mayStart(at: 3 * window, idle: { 100.01 }) == false)  // 0.1 CPU idle: below 0.15
        #expect(gate.mayStart(at: 4 * window, idle: { 100.06 }))  // half a CPU idle
        #expect(gate.mayStart(at: 5 * window, idle: { nil }))  // /proc/stat unreadable: as it was
    }

    /// The idle time read from /proc/stat is the kernel's, in seconds: /proc/uptime's second
    /// field counts the same idle time of all CPUs (without I/O wait).
    @Test func idleTimeIsReadInSecondsFromProcStat() throws {
        func uptimeIdle() throws -> Double? {
            Double(try String(contentsOfFile: "/proc/uptime", encoding: .utf8).split(whereSeparator: \.isWhitespace)[1])
        }
        let idleBefore = try #require(try uptimeIdle())
        let idle = try #require(SpinGate.idleSeconds())
        let idleAfter = try #require(try uptimeIdle())
        // I/O wait counts in ours, not in uptime's: at most a few percent of the idle time here.
        #expect(idle >= idleBefore - 1 && idle <= idleAfter * 1.10 + 1, "idle \(idle) s, /proc/uptime \(idleBefore)–\(idleAfter) s")
    }
}
