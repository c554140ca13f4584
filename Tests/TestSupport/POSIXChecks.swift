import Foundation

/// A reusable set of POSIX file-system checks that runs in any folder: a folder of ext4 (where
/// every check must pass, which keeps the checks honest) or a folder of a mount. Each check
/// uses plain system calls, as programs do, and reports what differed from POSIX.
public enum POSIXChecks {
    /// Runs every check in `folder` (which must exist and be empty); returns the failures.
    public static func run(in folder: String) -> [String] {
        var failures: [String] = []
        for (name, check) in checks {
            let scratch = "\(folder)/\(name)"
            guard mkdir(scratch, 0o755) == 0 else {
                failures.append("\(name): mkdir failed: \(String(cString: strerror(errno)))")
                continue
            }
            do { try check(scratch) } catch { failures.append("\(name): \(error)") }
        }
        return failures
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    static func expect(_ condition: Bool, _ message: @autoclosure () -> String) throws {
        if !condition { throw Failure(description: message()) }
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }

    static func write(_ path: String, _ text: String, flags: Int32 = O_WRONLY | O_CREAT | O_TRUNC) throws {
        let fd = open(path, flags, 0o644)
        try expect(fd >= 0, "open \(path): \(errnoText())")
        defer { close(fd) }
        try expect(Glibc.write(fd, text, text.utf8.count) == text.utf8.count, "write \(path): \(errnoText())")
    }

    static func read(_ path: String) throws -> String {
        guard let data = FileManager.default.contents(atPath: path) else { throw Failure(description: "read \(path): \(errnoText())") }
        return String(decoding: data, as: UTF8.self)
    }

    static func size(_ path: String) -> Int64? {
        var info = stat()
        return stat(path, &info) == 0 ? Int64(info.st_size) : nil
    }

    static func listing(_ folder: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).sorted()
    }

    static let checks: [(String, @Sendable (String) throws -> Void)] = [
        ("create-write-read", { dir in
            try write("\(dir)/f", "hello")
            try expect(try read("\(dir)/f") == "hello", "read back differs")
            try expect(size("\(dir)/f") == 5, "size is \(size("\(dir)/f") ?? -1), not 5")
        }),
        ("exclusive-create", { dir in
            try write("\(dir)/f", "x")
            let fd = open("\(dir)/f", O_WRONLY | O_CREAT | O_EXCL, 0o644)
            try expect(fd < 0 && errno == EEXIST, "O_EXCL on an existing file: \(fd >= 0 ? "opened" : errnoText())")
        }),
        ("empty-file-then-unlink", { dir in
            for index in 0..<20 {
                let fd = open("\(dir)/e\(index)", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
                try expect(fd >= 0, "create: \(errnoText())")
                close(fd)
                try expect(unlink("\(dir)/e\(index)") == 0, "unlink of a just-closed empty file: \(errnoText())")
            }
            try expect(listing(dir).isEmpty, "left: \(listing(dir))")
        }),
        ("open-by-path-while-written", { dir in
            let fd = open("\(dir)/w", O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            try expect(fd >= 0, "create: \(errnoText())")
            defer { close(fd) }
            try expect(Glibc.write(fd, "abc", 3) == 3, "write: \(errnoText())")
            try expect(try read("\(dir)/w") == "abc", "a second open does not see the writer's bytes")
        }),
        ("append", { dir in
            try write("\(dir)/a", "one")
            try write("\(dir)/a", "two", flags: O_WRONLY | O_APPEND)
            let text = try read("\(dir)/a")
            try expect(text == "onetwo", "O_APPEND: \(text)")
        }),
        ("hole-reads-zeros", { dir in
            let fd = open("\(dir)/h", O_RDWR | O_CREAT | O_TRUNC, 0o644)
            try expect(fd >= 0, "create: \(errnoText())")
            try expect(pwrite(fd, "z", 1, 9999) == 1, "pwrite past the end: \(errnoText())")
            var buffer = [UInt8](repeating: 1, count: 10)
            try expect(pread(fd, &buffer, 10, 0) == 10 && buffer.allSatisfy { $0 == 0 }, "a hole does not read as zeros")
            close(fd)
            try expect(size("\(dir)/h") == 10_000, "size \(size("\(dir)/h") ?? -1)")
        }),
        ("truncate-by-path-and-descriptor", { dir in
            try write("\(dir)/t", "0123456789")
            try expect(truncate("\(dir)/t", 4) == 0 && (try read("\(dir)/t")) == "0123", "truncate shrink: \(errnoText())")
            let fd = open("\(dir)/t", O_RDWR)
            try expect(fd >= 0 && ftruncate(fd, 6) == 0, "ftruncate grow: \(errnoText())")
            close(fd)
            try expect(try read("\(dir)/t") == "0123\0\0", "grown bytes are not zeros")
        }),
        ("rename-replaces", { dir in
            try write("\(dir)/old", "new content")
            try write("\(dir)/target", "old content")
            try expect(rename("\(dir)/old", "\(dir)/target") == 0, "rename over a file: \(errnoText())")
            try expect(try read("\(dir)/target") == "new content" && listing(dir) == ["target"], "after rename: \(listing(dir))")
        }),
        ("unlinked-open-file-stays-readable", { dir in
            try write("\(dir)/u", "still here")
            let fd = open("\(dir)/u", O_RDONLY)
            try expect(fd >= 0, "open: \(errnoText())")
            defer { close(fd) }
            try expect(unlink("\(dir)/u") == 0, "unlink: \(errnoText())")
            var buffer = [UInt8](repeating: 0, count: 10)
            try expect(Glibc.read(fd, &buffer, 10) == 10 && String(decoding: buffer, as: UTF8.self) == "still here",
                       "an unlinked open file cannot be read")
            try expect(access("\(dir)/u", F_OK) != 0, "the name is still there")
        }),
        ("folders", { dir in
            try expect(mkdir("\(dir)/a", 0o755) == 0 && mkdir("\(dir)/a/b", 0o755) == 0, "mkdir: \(errnoText())")
            try expect(listing(dir) == ["a"] && listing("\(dir)/a") == ["b"], "listing \(listing(dir)) \(listing("\(dir)/a"))")
            try expect(rmdir("\(dir)/a") != 0 && errno == ENOTEMPTY, "rmdir of a folder holding a folder: \(errnoText())")
            try expect(mkdir("\(dir)/a", 0o755) != 0 && errno == EEXIST, "mkdir of an existing folder")
            try write("\(dir)/c", "file")
            try expect(rename("\(dir)/a", "\(dir)/c") != 0 && errno == ENOTDIR, "rename of a folder onto a file: \(errnoText())")
            try expect(mkdir("\(dir)/e", 0o755) == 0 && rename("\(dir)/a", "\(dir)/e") == 0, "rename onto an empty folder: \(errnoText())")
            try expect(listing("\(dir)/e") == ["b"], "the moved folder holds \(listing("\(dir)/e"))")
            try expect(rmdir("\(dir)/e/b") == 0 && rmdir("\(dir)/e") == 0, "rmdir: \(errnoText())")
        }),
        ("name-max", { dir in
            let longest = String(repeating: "n", count: 255), tooLong = String(repeating: "n", count: 256)
            try write("\(dir)/\(longest)", "x")
            try expect(access("\(dir)/\(longest)", F_OK) == 0, "a 255-byte name is not there")
            let fd = open("\(dir)/\(tooLong)", O_WRONLY | O_CREAT, 0o644)
            try expect(fd < 0 && errno == ENAMETOOLONG, "a 256-byte name: \(fd >= 0 ? "created" : errnoText())")
        }),
        ("times", { dir in
            try write("\(dir)/m", "x")
            var times = [timespec(tv_sec: 946_684_799, tv_nsec: 0), timespec(tv_sec: 946_684_799, tv_nsec: 0)]
            try expect(utimensat(AT_FDCWD, "\(dir)/m", &times, 0) == 0, "utimensat: \(errnoText())")
            var info = stat()
            try expect(stat("\(dir)/m", &info) == 0 && info.st_mtim.tv_sec == 946_684_799, "mtime is \(info.st_mtim.tv_sec)")
        }),
        ("mode-bits", { dir in
            try write("\(dir)/x", "x")
            try expect(access("\(dir)/x", X_OK) != 0, "a 0644 file is executable")
        }),
        // pjdfstest utimensat/00, 04, 08, 09: atime and mtime apart, either order, to the nanosecond, past 2038 and 2106,
        // on files and folders.
        ("utimensat", { dir in
            try write("\(dir)/f", "x")
            try expect(mkdir("\(dir)/d", 0o755) == 0, "mkdir: \(errnoText())")
            for name in ["f", "d"] {
                for (accessed, modified) in [(timespec(tv_sec: 100_000_000, tv_nsec: 100_000_000), timespec(tv_sec: 200_000_000, tv_nsec: 200_000_000)),
                                             (timespec(tv_sec: 200_000_000, tv_nsec: 0), timespec(tv_sec: 100_000_000, tv_nsec: 999_999_999)),
                                             (timespec(tv_sec: 2_147_483_648, tv_nsec: 0), timespec(tv_sec: 4_294_967_296, tv_nsec: 1))] {
                    var times = [accessed, modified]
                    try expect(utimensat(AT_FDCWD, "\(dir)/\(name)", &times, 0) == 0, "utimensat \(name): \(errnoText())")
                    var info = stat()
                    try expect(lstat("\(dir)/\(name)", &info) == 0, "lstat: \(errnoText())")
                    try expect(info.st_atim.tv_sec == accessed.tv_sec && info.st_atim.tv_nsec == accessed.tv_nsec,
                               "\(name): atime \(info.st_atim.tv_sec).\(info.st_atim.tv_nsec), not \(accessed.tv_sec).\(accessed.tv_nsec)")
                    try expect(info.st_mtim.tv_sec == modified.tv_sec && info.st_mtim.tv_nsec == modified.tv_nsec,
                               "\(name): mtime \(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec), not \(modified.tv_sec).\(modified.tv_nsec)")
                }
                // UTIME_OMIT keeps one; UTIME_NOW sets the other to now.
                var times = [timespec(tv_sec: 0, tv_nsec: (1 << 30) - 2), timespec(tv_sec: 0, tv_nsec: (1 << 30) - 1)]
                let before = time(nil)
                try expect(utimensat(AT_FDCWD, "\(dir)/\(name)", &times, 0) == 0, "utimensat UTIME_NOW: \(errnoText())")
                var info = stat()
                try expect(lstat("\(dir)/\(name)", &info) == 0 && info.st_atim.tv_sec == 2_147_483_648 && info.st_mtim.tv_sec >= before,
                           "\(name): after UTIME_OMIT/UTIME_NOW atime \(info.st_atim.tv_sec), mtime \(info.st_mtim.tv_sec)")
            }
        }),
        // pjdfstest ftruncate/02 (as truncate by path): right after create.
        ("truncate-after-create", { dir in
            let fd = open("\(dir)/c", O_WRONLY | O_CREAT, 0o644)
            try expect(fd >= 0, "create: \(errnoText())")
            close(fd)
            try expect(truncate("\(dir)/c", 123) == 0, "truncate: \(errnoText())")
            try expect(size("\(dir)/c") == 123, "size \(size("\(dir)/c") ?? -1), not 123")
        }),
        // pjdfstest unlink/14: an open file's link count is 0 after unlink, and it can still be written and read.
        ("unlinked-open-file-fstat-and-io", { dir in
            try write("\(dir)/n", "Hello, World!")
            let fd = open("\(dir)/n", O_RDWR)
            try expect(fd >= 0, "open: \(errnoText())")
            defer { close(fd) }
            try expect(unlink("\(dir)/n") == 0, "unlink: \(errnoText())")
            var info = stat()
            try expect(fstat(fd, &info) == 0, "fstat after unlink: \(errnoText())")
            try expect(info.st_nlink == 0, "nlink after unlink is \(info.st_nlink)")
            try expect(pwrite(fd, "Hello,_World!", 13, 0) == 13, "pwrite after unlink: \(errnoText())")
            var buffer = [UInt8](repeating: 0, count: 13)
            try expect(pread(fd, &buffer, 13, 0) == 13 && String(decoding: buffer, as: UTF8.self) == "Hello,_World!",
                       "pread after unlink: \(String(decoding: buffer, as: UTF8.self))")
        }),
        // pjdfstest rename/24: a folder's link count is 2 plus its subfolders, and follows a rename.
        ("folder-link-counts", { dir in
            func links(_ path: String) -> Int { var info = stat(); return lstat(path, &info) == 0 ? Int(info.st_nlink) : -1 }
            try expect(mkdir("\(dir)/src", 0o755) == 0 && mkdir("\(dir)/dst", 0o755) == 0 && mkdir("\(dir)/src/sub", 0o755) == 0,
                       "mkdir: \(errnoText())")
            try expect(links("\(dir)/src") == 3 && links("\(dir)/dst") == 2, "before: src \(links("\(dir)/src")), dst \(links("\(dir)/dst"))")
            try expect(rename("\(dir)/src/sub", "\(dir)/dst/sub") == 0, "rename: \(errnoText())")
            try expect(links("\(dir)/src") == 2 && links("\(dir)/dst") == 3, "after: src \(links("\(dir)/src")), dst \(links("\(dir)/dst"))")
        }),
        // A folder's mtime changes when an entry is made, renamed or removed in it.
        ("folder-mtime-follows-entries", { dir in
            try expect(mkdir("\(dir)/d", 0o755) == 0, "mkdir: \(errnoText())")
            func mtime() -> Int { var info = stat(); return lstat("\(dir)/d", &info) == 0 ? Int(info.st_mtim.tv_sec) : -1 }
            func setOld() throws {
                var times = [timespec(tv_sec: 1_000_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000_000, tv_nsec: 0)]
                try expect(utimensat(AT_FDCWD, "\(dir)/d", &times, 0) == 0 && mtime() == 1_000_000_000, "utimensat of a folder: \(errnoText())")
            }
            try setOld()
            try write("\(dir)/d/f", "x")
            try expect(mtime() > 1_000_000_000, "a create leaves the folder's mtime at \(mtime())")
            try setOld()
            try expect(rename("\(dir)/d/f", "\(dir)/d/g") == 0 && mtime() > 1_000_000_000, "a rename leaves the folder's mtime at \(mtime())")
            try setOld()
            try expect(unlink("\(dir)/d/g") == 0 && mtime() > 1_000_000_000, "an unlink leaves the folder's mtime at \(mtime())")
        }),
        // chmod is kept: what is built or unpacked can run.
        ("chmod-and-create-modes", { dir in
            try write("\(dir)/s", "#!/bin/sh\nexit 0\n")
            try expect(chmod("\(dir)/s", 0o755) == 0, "chmod: \(errnoText())")
            var info = stat()
            try expect(stat("\(dir)/s", &info) == 0 && info.st_mode & 0o7777 == 0o755, "mode after chmod 755: \(String(info.st_mode & 0o7777, radix: 8))")
            try expect(access("\(dir)/s", X_OK) == 0, "not executable after chmod 755")
            let fd = open("\(dir)/made", O_WRONLY | O_CREAT | O_EXCL, 0o751)
            try expect(fd >= 0, "create 0751: \(errnoText())")
            close(fd)
            try expect(stat("\(dir)/made", &info) == 0 && info.st_mode & 0o7777 == 0o751 & ~currentUmask(),
                       "mode of a file created 0751: \(String(info.st_mode & 0o7777, radix: 8))")
            try expect(chmod("\(dir)/s", 0o644) == 0 && access("\(dir)/s", X_OK) != 0, "still executable after chmod 644")
            try expect(mkdir("\(dir)/m", 0o755) == 0 && chmod("\(dir)/m", 0o700) == 0, "mkdir, chmod: \(errnoText())")
            try expect(stat("\(dir)/m", &info) == 0 && info.st_mode & 0o7777 == 0o700, "folder mode after chmod 700: \(String(info.st_mode & 0o7777, radix: 8))")
        }),
    ]

    static func currentUmask() -> mode_t {
        let mask = umask(0)
        umask(mask)
        return mask
    }
}
