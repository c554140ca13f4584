import DocumentModel
import Foundation

/// `sofa` run as `mount.fuse.sofa` (a link to it in /sbin): what mount(8) runs for
/// `mount -t fuse.sofa DB MOUNTPOINT -o OPTIONS` and for an /etc/fstab line such as
///
///     /srv/notes.sofa  /mnt/notes  fuse.sofa  remote=http://host:5984/notes,sync,continuous,nofail  0 0
///
/// An encrypted database is mounted with `key_file=PATH` (its key file, or a file holding its
/// passphrase).
///
/// mount(8) calls it as `mount.fuse.sofa DB MOUNTPOINT [-sfnv] [-o OPTIONS]`; the options
/// become `sofa mount` arguments: Sofa's own (below) as flags, mount(8)'s bookkeeping ones
/// dropped, the rest passed to FUSE with -o.
enum MountHelper {
    static let names: Set<String> = ["mount.fuse.sofa", "mount.sofa"]

    /// Options that are Sofa's, as `sofa mount` flags (a value after `=`).
    private static let flags: [String: String] = [
        "remote": "--remote", "user": "--user", "password_file": "--password-file", "cacert": "--cacert",
        "fetch_timeout": "--fetch-timeout", "auto_compact": "--auto-compact", "thumbnail_fetch_max": "--thumbnail-fetch-max", "seed": "--seed", "download_attachments_max": "--download-attachments-max",
        "download_attachments_types": "--download-attachments-types",
        "pull": "--pull", "push": "--push", "sync": "--sync", "continuous": "--continuous",
        "no_download_attachments": "--no-download-attachments", "download_attachments": "--download-attachments",
        "ro": "--read-only", "key_file": "--key-file",
    ]

    /// mount(8)'s and systemd's options, which say how or when to mount, not what.
    private static func isBookkeeping(_ option: String) -> Bool {
        ["defaults", "auto", "noauto", "rw", "nouser", "users", "owner", "group", "_netdev", "nofail", "relatime", "noatime",
         "dev", "suid", "exec", "nodev", "nosuid", "noexec", "async"].contains(option)
            || option.hasPrefix("x-") || option.hasPrefix("comment=")
    }

    /// The `sofa mount` arguments for mount(8)'s; nil when mount(8) only asks to pretend (-f).
    static func translate(_ arguments: [String]) throws -> [String]? {
        var positional: [String] = []
        var options: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "-o" {
                guard index + 1 < arguments.count else { throw SofaError.invalidArgument("-o needs options") }
                options += splitOptions(arguments[index + 1])
                index += 2
                continue
            }
            if argument.hasPrefix("-o") {
                options += splitOptions(String(argument.dropFirst(2)))
            } else if argument.hasPrefix("-"), argument.count > 1 {
                // -s (sloppy), -n (no mtab), -v (verbose): nothing to do; -f: pretend.
                if argument.dropFirst().contains("f") { return nil }
            } else {
                positional.append(argument)
            }
            index += 1
        }
        guard positional.count == 2 else {
            throw SofaError.invalidArgument("usage: mount.fuse.sofa DATABASE MOUNTPOINT [-o remote=URL,sync,continuous,…]")
        }
        var result = ["mount", positional[0], positional[1]]
        var passed: [String] = []
        for option in options {
            let parts = option.split(separator: "=", maxSplits: 1).map(String.init)
            if let flag = flags[parts[0]] {
                result.append(flag)
                if parts.count == 2 { result.append(parts[1]) }
            } else if !isBookkeeping(option) {
                passed.append(option)
            }
        }
        if !passed.isEmpty { result += ["-o", passed.joined(separator: ",")] }
        return result
    }

    /// Splits at commas, except inside a value that is a URL with commas escaped as `\,`.
    private static func splitOptions(_ text: String) -> [String] {
        var options: [String] = []
        var current = ""
        var escaped = false
        for character in text {
            if escaped {
                current.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "," {
                if !current.isEmpty { options.append(current) }
                current = ""
            } else {
                current.append(character)
            }
        }
        if !current.isEmpty { options.append(current) }
        return options
    }
}
