import DocumentModel
import Foundation

/// Which reads may fetch a body that is not on this machine. A file manager drawing a folder
/// of deferred photos starts a thumbnailer on each, and each reads its whole file: browsing
/// would download the library (measured: pcmanfm showing 30 deferred 20 MB PNGs fetched
/// 642 MB of 643; `Scripts/bench thumbnails`). As OneDrive's and Dropbox's on-demand files do not download to draw an
/// icon, thumbnailers get only bodies that are here, or small enough to fetch
/// (`thumbnailFetchMax`); everyone else — a viewer the user opens the file in, `cp`, `cat` — gets
/// every body. A refused thumbnailer sees ENODATA and draws the file type's icon.
public struct BrowsingPolicy: Sendable, Equatable {
    /// Bodies not here up to this many bytes are fetched for thumbnailers too; nil: any size.
    public var thumbnailFetchMax: Int64?

    /// Thumbnails of bodies up to 1 MiB: the icons of small images and documents come at little
    /// cost (a folder of 100 such is at most 100 MiB), camera photos and videos are left alone.
    public static let defaultThumbnailFetchMax: Int64 = 1 << 20

    public init(thumbnailFetchMax: Int64? = BrowsingPolicy.defaultThumbnailFetchMax) {
        self.thumbnailFetchMax = thumbnailFetchMax
    }

    /// Whether `caller` may fetch a body of `length` bytes that is not here. Who the caller is
    /// (three reads of /proc) is asked only of a body over the limit.
    public func mayFetch(_ length: Int64, for caller: @autoclosure () -> Caller) -> Bool {
        guard let limit = thumbnailFetchMax, length > limit else { return true }
        return !caller().isThumbnailer
    }
}

/// The program behind a file-system request, as the kernel names it: the thread (`tid`, what
/// FUSE gives), its name, and its process's executable and arguments.
public struct Caller: Sendable, CustomStringConvertible {
    public let tid: pid_t
    /// The thread's name (`/proc/TID/comm`, at most 15 bytes; a program may set it).
    public let threadName: String
    /// The executable's file name (from `/proc/TID/exe`, else the first argument).
    public let program: String
    /// The process's arguments (`/proc/TID/cmdline`).
    public let arguments: [String]

    public init(tid: pid_t, threadName: String, program: String, arguments: [String]) {
        (self.tid, self.threadName, self.program, self.arguments) = (tid, threadName, program, arguments)
    }

    /// Reads what /proc tells of `tid`; a thread gone already is an unnamed caller.
    public init(tid: pid_t) {
        let proc = "/proc/\(tid)"
        let comm = KernelFile.text("\(proc)/comm") ?? ""  // gone: no name, treated as anyone
        let cmdline = KernelFile.bytes("\(proc)/cmdline") ?? []
        let arguments = cmdline.split(separator: 0, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
        var exe = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("\(proc)/exe", &exe, Int(PATH_MAX))
        let path = length > 0 ? String(decoding: exe[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self) : (arguments.first ?? "")
        self.init(tid: tid, threadName: comm.trimmingCharacters(in: .newlines),
                  program: (path.removingDeletedMark as NSString).lastPathComponent, arguments: arguments)
    }

    /// Thumbnail makers: the freedesktop thumbnailers file managers start (gdk-pixbuf-thumbnailer,
    /// ffmpegthumbnailer, totem-video-thumbnailer, evince-thumbnailer, gnome-thumbnail-font…,
    /// run in a bwrap sandbox by GNOME's), Thunar's tumblerd, KDE's kioworker running
    /// thumbnail.so, and threads whose name says they make thumbnails. (pcmanfm runs
    /// gdk-pixbuf-thumbnailer; Thunar asks tumblerd, whose pool threads do the reading.)
    public var isThumbnailer: Bool {
        let names = [program.lowercased(), threadName.lowercased(), (arguments.first.map { ($0 as NSString).lastPathComponent } ?? "").lowercased()]
        if names.contains(where: { $0.contains("thumbnail") || $0 == "tumblerd" }) { return true }
        return program.hasPrefix("kioworker") || program.hasPrefix("kioslave")
            ? arguments.dropFirst().contains { ($0 as NSString).lastPathComponent.hasPrefix("thumbnail") } : false
    }

    public var description: String {
        threadName.isEmpty || threadName == String(program.prefix(15)) ? "\(program) (\(tid))" : "\(program) (\(tid), thread \(threadName))"
    }
}

private extension String {
    /// `/proc/PID/exe` of a replaced executable ends with " (deleted)".
    var removingDeletedMark: String { hasSuffix(" (deleted)") ? String(dropLast(10)) : self }
}
