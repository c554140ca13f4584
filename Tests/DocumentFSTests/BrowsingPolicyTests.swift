import DocumentFS
import Foundation
import Testing

/// Who counts as a thumbnailer (the real gdk-pixbuf-thumbnailer through a mount is in
/// DeferredReadTests): the names file managers' thumbnailers run under, and readers that are not.
@Suite struct BrowsingPolicyTests {
    func caller(_ program: String, thread: String? = nil, arguments: [String]? = nil) -> Caller {
        Caller(tid: 1, threadName: thread ?? String(program.prefix(15)), program: program, arguments: arguments ?? ["/usr/bin/\(program)"])
    }

    @Test func thumbnailersAreKnownByTheirNames() {
        let thumbnailers = [
            caller("gdk-pixbuf-thumbnailer"), caller("ffmpegthumbnailer"), caller("totem-video-thumbnailer"),
            caller("evince-thumbnailer"), caller("gnome-thumbnail-font"), caller("tumblerd", thread: "pool-tumblerd"),
            caller("kioworker", arguments: ["/usr/lib/x86_64-linux-gnu/libexec/kf6/kioworker", "/usr/lib/x86_64-linux-gnu/qt6/plugins/kf6/kio/thumbnail.so", "thumbnail", "", ""]),
            caller("pcmanfm", thread: "thumbnail_load"),  // a thread a program names for the job
        ]
        for thumbnailer in thumbnailers { #expect(thumbnailer.isThumbnailer, "\(thumbnailer)") }
        let readers = [
            caller("display-im6.q16", thread: "display"), caller("eog"), caller("cat"), caller("cp"), caller("pcmanfm"),
            caller("thunar"), caller("kioworker", arguments: ["/usr/lib/kf6/kioworker", "/usr/lib/kf6/kio/file.so", "file"]),
            Caller(tid: 1, threadName: "", program: "", arguments: []),  // gone before it was asked
        ]
        for reader in readers { #expect(!reader.isThumbnailer, "\(reader)") }
    }

    @Test func thumbnailersFetchOnlyUpToTheLimitOthersAlways() {
        let policy = BrowsingPolicy()
        let thumbnailer = caller("gdk-pixbuf-thumbnailer"), viewer = caller("eog")
        #expect(policy.mayFetch(BrowsingPolicy.defaultThumbnailFetchMax, for: thumbnailer))
        #expect(!policy.mayFetch(BrowsingPolicy.defaultThumbnailFetchMax + 1, for: thumbnailer))
        #expect(policy.mayFetch(1 << 40, for: viewer))
        #expect(!BrowsingPolicy(thumbnailFetchMax: 0).mayFetch(1, for: thumbnailer))
        #expect(BrowsingPolicy(thumbnailFetchMax: nil).mayFetch(1 << 40, for: thumbnailer))
    }

    /// /proc names this very process: not a thumbnailer, with its executable's name.
    @Test func aCallerIsReadFromProc() {
        let me = Caller(tid: getpid())
        #expect(!me.program.isEmpty && !me.arguments.isEmpty)
        #expect(!me.isThumbnailer)
    }
}
