@preconcurrency import CFuse3
import Foundation
import Synchronization

/// How requests are read from `/dev/fuse` and replies written: libfuse's custom I/O hooks
/// (`fuse_session_custom_io`), for two things.
///
/// - **Passthrough** sees every request and reply (`Passthrough.received`, `.sending`).
/// - **Spinning.** On a virtual machine, waking a thread asleep on an idle CPU costs tens of
///   microseconds, and every FUSE request wakes the thread that reads: with `xargs cat` over
///   10,000 small files, a minimal C file system ran at 0.12× of direct access reading the
///   usual way and at 0.30× when the reading thread kept asking for 50 µs before it slept
///   (the next request, the close that follows an open, usually comes within that). So the
///   device is non-blocking, and the reading thread asks again for `Configuration.spin`
///   before it waits in `poll`. Only one thread reads at a time (`Workers`), so only one
///   spins, and only while requests come: an idle mount sleeps.
/// - **Not spinning on a busy machine** (`SpinGate`). A spin takes a CPU that is only free
///   when the machine has one to spare: with both cores loaded by another process, the threads
///   of the mount and of the program writing into it waited for the CPU the reader spun on
///   (the mount's dispatch thread waited 4.7 s of an 8.2 s `cp -r`), and `cp -r`, `tar x` and
///   `rsync -a` of 10,000 files took 1.5–2× as long as without spinning, while quiet, spinning
///   saved 13–37 % (medians of two such A/Bs). So the reader spins only while the CPUs have
///   recently been idle. While it does not, the device stays non-blocking: a request costs one
///   `read` that says EAGAIN, then `poll`, then the `read`. A blocking read would save that
///   first call, but the reader would then never come back to ask the gate when the machine
///   is quiet again, short of a `fcntl` on the shared descriptor each time the gate turns.
enum DeviceIO {
    static func install(on session: OpaquePointer, box: Box) {
        let device = fuse_session_fd(session)
        if box.configuration.spin > 0 {
            let flags = fcntl(device, F_GETFL)
            if flags >= 0 { _ = fcntl(device, F_SETFL, flags | O_NONBLOCK) }
        }
        var io = fuse_custom_io()
        io.read = { fd, buffer, length, userdata in
            let box = Unmanaged<Box>.fromOpaque(userdata!).takeUnretainedValue()
            let count = DeviceIO.receive(fd, buffer, length, spin: box.configuration.spin, gate: box.spinGate)
            if count > 0, let buffer { box.passthrough.received(UnsafeRawPointer(buffer), count: count) }
            return count
        }
        io.writev = { fd, vectors, count, userdata in
            if let vectors, let userdata {
                Unmanaged<Box>.fromOpaque(userdata).takeUnretainedValue().passthrough.sending(vectors, count: Int(count))
            }
            return Glibc.writev(fd, vectors, count)
        }
        let hooked = fuse_session_custom_io(session, &io, device) == 0
        if !hooked, box.configuration.spin > 0 {
            // libfuse reads as it always does: it must block.
            let flags = fcntl(device, F_GETFL)
            if flags >= 0 { _ = fcntl(device, F_SETFL, flags & ~O_NONBLOCK) }
        }
        box.passthrough.attach(device: device, hooked: hooked)
    }

    /// One request: asked for until `spin` seconds pass (while `gate` allows spinning), then
    /// waited for. Returns what `read(2)` returns (-1 with `errno` for ENODEV once unmounted,
    /// and other errors).
    static func receive(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ length: Int, spin: Double, gate: SpinGate) -> Int {
        let spinNanoseconds = UInt64(spin * 1e9)
        var deadline: UInt64 = 0
        while true {
            let count = Glibc.read(fd, buffer, length)
            if count >= 0 { return count }
            let code = errno
            guard code == EAGAIN else {
                errno = code
                return -1
            }
            let now = DispatchTime.now().uptimeNanoseconds
            if deadline == 0 {
                guard gate.mayStart(at: now) else {
                    DeviceIO.wait(for: fd)
                    continue
                }
                deadline = now + spinNanoseconds
            }
            if now < deadline { continue }
            DeviceIO.wait(for: fd)
            deadline = 0
        }
    }

    private static func wait(for fd: Int32) {
        var wanted = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        _ = poll(&wanted, 1, -1)
    }
}

/// Whether the thread reading requests may spin (`DeviceIO`): only while the machine has CPU
/// time to spare. Every `window`, the reader about to spin reads `/proc/stat`: spinning goes on
/// while the CPUs were idle for at least `spareCPUs` of the window (in CPUs: 0.15 is 15 ms of
/// idle time in 100 ms, on any of them). Measured beside `cp -r`, `tar x` and `rsync -a` of
/// 10,000 files into a mount, 100 ms windows: on a quiet machine, with the reader spinning,
/// the two CPUs were idle 0.20–1.1 CPUs of each window (median 0.7–0.8); with both loaded by
/// `stress-ng --cpu 2`, 0 to 0.10. Once it stops, spinning adds nothing to hide idle time, so
/// a quiet machine resumes at the next look and a loaded one stays without. (In a container
/// limited to fewer CPUs than its host, `/proc/stat` counts the host's: the mount then spins
/// whenever the host has time to spare.)
final class SpinGate: Sendable {
    static let window: UInt64 = 100_000_000  // ns
    static let spareCPUs = 0.15

    private struct Look {
        var open = true
        var at: UInt64 = 0
        var idle: Double?  // seconds, all CPUs, since boot
    }
    private let last = Mutex(Look())

    /// Whether a spin may start at `now` (uptime, ns); `idle` reads the CPUs' idle seconds
    /// (`idleSeconds`), at most once a window.
    func mayStart(at now: UInt64, idle readIdle: () -> Double? = SpinGate.idleSeconds) -> Bool {
        last.withLock { look in
            guard now >= look.at + SpinGate.window else { return look.open }
            let idle = readIdle()
            if let idle, let before = look.idle {
                look.open = (idle - before) / (Double(now - look.at) / 1e9) >= SpinGate.spareCPUs
            }
            (look.at, look.idle) = (now, idle)
            return look.open
        }
    }

    /// Idle and I/O-wait time of all CPUs since boot, from `/proc/stat`'s first line; nil if
    /// it cannot be read (spinning then stays as it was).
    static func idleSeconds() -> Double? {
        let fd = open("/proc/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 256)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        // "cpu  user nice system idle iowait irq softirq steal ...", in clock ticks.
        let line = bytes[..<count].prefix { $0 != UInt8(ascii: "\n") }
        let fields = line.split(separator: UInt8(ascii: " ")).dropFirst().compactMap { Double(String(decoding: $0, as: UTF8.self)) }
        guard fields.count >= 5 else { return nil }
        return (fields[3] + fields[4]) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}
