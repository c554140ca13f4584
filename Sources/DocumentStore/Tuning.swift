/// Every tunable of the storage layer, with the reason for its value.
public enum Tuning {
    /// How many generations of history a document keeps behind each leaf.
    /// CouchDB's default `_revs_limit` is 1000; replication needs enough shared
    /// history to find common ancestors after long offline periods.
    public static let defaultRevsLimit = 1000

    /// Unreferenced blobs younger than this survive compaction: another process
    /// may have written one for a save that has not committed yet (a blob is
    /// written, then the revision that refers to it is saved).
    public static let blobGracePeriod: Double = 600

    /// How often `sofa serve` and `sofa mount` look at each open database for automatic
    /// compaction (`AutoCompaction`). A database must also go a whole interval unwritten
    /// before it is compacted: a minute of quiet, as smoosh re-weighs a database at most
    /// every few minutes (its `staleness`, 5).
    public static let autoCompactionInterval: Double = 60

    /// Documents per transaction when importing: large enough to amortise the
    /// commit, small enough that an interrupted import keeps most of its work.
    public static let importBatchSize = 500

    /// How often a database with waiters looks for other processes' commits without being
    /// told (`ChangeStream`): inotify reports them at once on a local disk, so this only
    /// matters where it sends nothing (NFS). One look costs a `PRAGMA data_version`; an idle
    /// mount or server wakes this often, at most.
    public static let foreignChangeSafetyInterval = 5.0

    /// How quiet the write-ahead log must stay after a write before `ChangeStream` asks whether
    /// another process committed: a commit's last frame is written a moment before the commit
    /// is visible. The granularity of `poll`.
    public static let foreignChangeSettle = 0.001

    /// When a look after a write found no commit (this process's own writes, or a commit not
    /// visible yet), when it looks once more.
    public static let foreignChangeRecheck = 0.05

    /// The largest size `truncate` may give a file written through the mount (EFBIG past it).
    /// A body is hashed when it is saved, holes as zeros at about 1 GiB/s on one core: a
    /// truncate to 4 GiB saves in a few seconds; one to 1 TiB would hold its caller for 15 min.
    /// Bodies written byte by byte have no such limit (they are hashed as they arrive).
    public static let maximumTruncatedSize: Int64 = 4 << 30

    /// Failures a mount keeps for `.sofa/status.json` (the newest): enough to find the one a
    /// program just reported, few enough that the file stays a glance.
    public static let recentFailures = 20

    /// How long an attachment renamed to a scratch name in its own document (an editor's
    /// backup, `gio copy -b`) waits for the new file at its name before its removal is saved:
    /// "rename to backup, write the new file" is then one revision, not two.
    public static let setAsideGrace = 1.0

    /// Bodies at least this large are read by the kernel itself in a mount (FUSE passthrough,
    /// when it is in use); smaller ones through the mount, where an open costs less than
    /// registering a backing file and the kernel keeps what was read in its page cache.
    public static let passthroughMinimumSize: Int64 = 256 << 10

    /// The most one `write`/`pwrite` call hands the kernel. Measured on this project's
    /// machines (ext4 on virtio, Linux 6.18): 1 GiB written in 1 MiB calls took 2.1–4.8 s,
    /// in 256 KiB calls 0.32 s, and a 1 MiB buffer written as four 256 KiB calls 0.60 s.
    /// FUSE hands the mount writes of up to 1 MiB (fewer round trips); they reach the disk in
    /// these pieces.
    public static let largestWrite = 256 << 10

    /// Attachment rows a document's non-leaf revisions may hold before their bodies and lists
    /// are dropped at the next save (`Database.pruneHistoryBodies`). Small documents keep the
    /// bodies of their history (a GET of an older revision works until `compact`), as on an
    /// uncompacted CouchDB; a folder of thousands of files keeps one list per leaf, so the
    /// SQLite file grows with the data, not with the data times its revisions.
    public static let historyAttachmentRows = 1_000

    /// A file closed in a mounted document less than this after the document's previous save
    /// is staged, and the staged files are folded into one revision once the document has been
    /// this quiet (see DocumentFS's `Bursts.swift`). An editor's save (one file, then nothing)
    /// is still one revision made at its close; `cp -r`, `tar x` and `rsync` into a document
    /// make one revision per `burstLongestDelay` instead of one per file. 0 turns staging off.
    public static let burstQuietWindow = 0.5

    /// The longest a staged file waits before its document's fold, however busy the document
    /// stays: what another process (`sofa cat`, a continuous push) lags behind the mount, and
    /// how many revisions a long copy makes (one per this many seconds).
    public static let burstLongestDelay = 2.0

    /// In a long burst, the next fold waits at least this many times the last one took: each
    /// fold saves the document's whole attachment list, so at a fixed period a copy of n files
    /// into one document would spend time growing with n² on its folds (and on a loaded machine,
    /// where folds are slower, more so); spaced by their cost they take at most about a tenth
    /// of the time. What another process lags behind the mount grows with it (a fold of 0.4 s:
    /// 4 s), up to `burstLongestSpacedDelay`: a fold's time also grows with the files it takes
    /// (their bodies are synced), so without a bound the spacing could feed on itself.
    public static let burstFoldSpacing = 10.0

    /// The longest a staged file waits for its fold however slow folds are (see `burstFoldSpacing`).
    public static let burstLongestSpacedDelay = 30.0

    /// How long after this mount last saved a document with empty properties its
    /// properties.json stays unshown (`DocumentFileSystem.showsProperties`): longer than the
    /// quiet window, so that a `cp -r` held up a moment on a busy machine between its last
    /// attachment and properties.json still finds no `{}` in its way.
    public static let emptyPropertiesUnshownFor = 2.0

    /// A mount's staging log starts a new segment once its newest holds this many bytes (about
    /// 15,000 staged files' records), and removes older ones once all they hold is folded: a
    /// mount that is never quiet keeps a log the size of what is unfolded, and a compaction,
    /// which reads every log for the bodies it holds, reads at most about this much more.
    public static let stagingLogSegmentBytes: Int64 = 4 << 20

    /// After a fold failed (a full disk, a locked database), when it is tried again.
    public static let burstRetryDelay = 1.0

    /// How long the kernel trusts the attributes of the mount's view folders (seconds): as it
    /// drops a kept listing when a folder's time has moved, a change shows in a view's folders
    /// within this time, at the cost of one GETATTR per folder per interval.
    public static let viewAttributeTimeout = 1.0

    /// Keys or documents read from a view's index at once while listing its folders.
    public static let viewListingPage = 256

    /// View folders whose listing position the mount remembers (a `find` over a view walks
    /// one folder at a time); past it, they are forgotten together and a listing that goes on
    /// reads from its start again.
    public static let viewListingCursors = 256

    /// Documents read from SQLite at once while listing `docs/` (or the design documents for
    /// `views/`): a page answers about one readdir call's worth of entries (the kernel asks for
    /// 4 KiB of names at a time), so a listing stopped early read little more than it showed.
    public static let documentListingPage = 64

    /// A folder listing is kept between the kernel's pages (DocumentFS's `ListingSnapshots`)
    /// when it holds at least this many names; smaller ones are worked out again per page,
    /// which costs less than keeping them.
    public static let listingSnapshotMinimum = 128

    /// Large folder listings kept between pages at once (each some 200 bytes a name: a folder
    /// of 10,000 names about 2 MB).
    public static let listingSnapshots = 8

    /// How long a kept listing answers the pages that resume it (seconds). A listing that
    /// pauses longer is worked out again where it resumes, as it would be without a snapshot.
    public static let listingSnapshotLife = 10.0

    /// How long a document folder made by `cp`'s or `mv`'s mkdir hides its empty attachments/
    /// from that process, so that it makes it as it copies (DocumentFS's
    /// `DocumentFileSystem.lookup`): a copy's whole walk, as long as it takes to reach it.
    public static let recentFolderMakerLife = 600.0

    /// Document folders remembered that way at most before those past their life are dropped.
    public static let recentFolderMakers = 10_000

    /// Documents whose folder the mount keeps in memory (`DocumentCache`); past it the cache is
    /// emptied and filled again. An entry of a small document is about a kilobyte: 20,000 hold
    /// what `ls -lR` of a large database touches without growing the mount by more than ~20 MB.
    public static let mountDocumentCache = 20_000

    /// Documents whose last save time or last own revision the mount remembers (for bursts and
    /// for passing over its own changes); past it, those older than the burst window are
    /// dropped (or all, for own saves: the worst case is one reload of a cached document).
    public static let mountRecentSaves = 10_000

    /// The largest properties.json the mount accepts (bytes): it is held in memory while
    /// written, and CouchDB's own `max_document_size` is 8 MB.
    public static let mountPropertiesSize = 64 << 20

    /// How long a read waits for bytes of a body being downloaded before EIO (seconds), unless
    /// `sofa mount --fetch-timeout` says otherwise: a server that answers nothing for this long
    /// is taken as gone, and the program reading is told rather than hung.
    public static let mountFetchTimeout = 30.0

    /// From how many bodies `BlobStore.sync` syncs the whole file system at once rather than
    /// file by file: below it the fsyncs cost little (256 of bodies of 4 KiB: 9–11 ms here; a
    /// `syncfs` with nothing else to write, 3 ms).
    public static let wholeFileSystemSyncBodies = 256

    /// How many bytes waiting for the disks (the machine's dirty and writeback pages) per body
    /// to sync `BlobStore.sync` accepts before it syncs the whole file system: about what one
    /// fsync of a small body costs here (10,000 in 0.4 s: 40 µs) at the 1 GB/s this disk
    /// writes. So a `syncfs` waits for other programs' bytes no longer than the fsyncs it
    /// replaces would have taken; a fold beside another program writing a lot syncs file by file.
    public static let wholeFileSystemSyncBytesPerBody: Int64 = 40 << 10

    /// How many bodies' MD5s one core works out before a save's work ahead of it is shared with
    /// another (`Database.workOutCouchMD5s`): fewer would gain little (64 small text bodies are
    /// about 13 ms of gzip here), and a save of a few files stays on its own thread.
    public static let couchMD5sPerShare = 64
}
