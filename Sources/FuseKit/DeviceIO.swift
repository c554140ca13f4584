@preconcurrency import CFuse3
import Foundation

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
            let count = DeviceIO.receive(fd, buffer, length, spin: box.configuration.spin)
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

    /// One request: asked for until `spin` seconds pass, then waited for. Returns what
    /// `read(2)` returns (-1 with `errno` for ENODEV once unmounted, and other errors).
    static func receive(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ length: Int, spin: Double) -> Int {
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
            if deadline == 0 { deadline = now + spinNanoseconds }
            if now < deadline { continue }
            var wanted = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            _ = poll(&wanted, 1, -1)
            deadline = 0
        }
    }
}
