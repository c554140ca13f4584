import DocumentModel
import DocumentStore
import MountTables
import Foundation

/// Bursts: many files written into one document make few revisions.
///
/// The rule (its numbers are `Tuning.burstQuietWindow` and `Tuning.burstLongestDelay`):
/// - A file closed in a document that has been quiet for the window is saved as a revision at
///   once, as before: an editor's save is one revision, there when `close` returns.
/// - A file closed within the window of the document's previous save is *staged*: its body is
///   already in the blob store, and one record of the mount's staging log records it
///   (`StagingLog.stage`; a row in SQLite for an encrypted database, `Database.stage`), so it
///   is safe against a killed mount when `close` returns and costs the same whatever the
///   document holds. The mount shows it at once.
/// - The staged files of a document are folded into one revision when it has been quiet for the
///   window, or when the oldest has waited `burstLongestDelay` (in a long burst, ten times what
///   the last fold took if that is longer, up to `burstLongestSpacedDelay`: a fold saves the
///   whole attachment list); any other save of the document
///   (properties.json, an unlink, a rename) takes them in first, and so does the unmount.
/// - A mount that was killed leaves its staged files (its log) to the next mount of the
///   database, which folds them when it starts. Other processes (`sofa cat`, a replicator in another process)
///   see staged files once they are folded, `burstLongestDelay` later at most in a document of
///   ordinary size (see `Tuning.burstFoldSpacing`).
extension DocumentFileSystem {
    /// The staged files of one document and when they came.
    struct Burst {
        /// The document as shown when the burst began: a staged file that collides with a change
        /// made elsewhere meanwhile is kept as a conflicting branch of it.
        var base: Revision
        var staged: [String: StagedAttachment] = [:]
        /// The folders their names make.
        var folders = FolderIndex()
        var first: Double
        var last: Double
        /// Identifies the one timer that checks this burst.
        var timer = 0
        /// How long its last fold took (0: none yet). A fold saves the whole attachment list,
        /// so in a long burst into a large document the next waits `Tuning.burstFoldSpacing`
        /// times that, not only `burstLongestDelay`: the folds' work grows with the files, not
        /// with their square.
        var lastFold = 0.0

        /// When it is due: once quiet for the window, or once its oldest file has waited long enough.
        var due: Double {
            min(last + Tuning.burstQuietWindow, first + min(max(Tuning.burstLongestDelay, Tuning.burstFoldSpacing * lastFold), Tuning.burstLongestSpacedDelay))
        }
    }

    /// Saves an attachment written or moved into a document: staged when the document is busy
    /// (see above), else a revision at once. `seen` is the digest the name had when the
    /// writer began (nil: absent), to tell a change made meanwhile. Returns the revision the
    /// document is now shown from.
    /// `synced` is false for a body stored without its fsync (`mayStage`): synced now if it is
    /// saved now, else by the fold.
    func saveAttachment(_ id: String, _ name: String, blob: StoredBlob, contentType: String, base: RevisionID?,
                        seen: String?, given: LocalAttributes, synced: Bool = true) throws -> RevisionID? {
        if !synced { ledger.noteUnsynced(blob.key) }
        if let staged = try stageIfBusy(id, name, blob: blob, contentType: contentType, seen: seen, given: given) {
            return staged
        }
        try syncBodies([blob.key])
        let revision = try commit(id, base: base, change: .attachment(name), seen: .attachment(seen)) { draft in
            try draft.setAttachment(name, blob: blob, contentType: contentType)
        }
        if let saved = revision.attachment(named: name) {
            try recordGiven(given, of: name, in: id, digest: saved.digest)
        }
        return revision.revID
    }

    /// Whether a file closed in document `id` now would likely be staged (it saved something
    /// less than the quiet window ago).
    func mayStage(_ id: String) -> Bool {
        Tuning.burstQuietWindow > 0 && ledger.isBusy(id, now: Date().timeIntervalSince1970)
    }

    /// Syncs those of `keys` stored without their fsync, before a revision refers to them.
    func syncBodies(_ keys: some Collection<BlobKey>) throws {
        let unsynced = ledger.unsynced(among: keys)
        guard !unsynced.isEmpty else { return }
        try store.blobs.sync(Set(unsynced))
        ledger.noteSynced(unsynced)
    }

    /// Stages the attachment when its document saved something less than the quiet window ago;
    /// nil when it must be saved now (a quiet document, a blob property's file, a change that
    /// collides with what the document shows, a document that is not live).
    private func stageIfBusy(_ id: String, _ name: String, blob: StoredBlob, contentType: String, seen: String?,
                             given: LocalAttributes) throws -> RevisionID? {
        let now = Date().timeIntervalSince1970
        guard Tuning.burstQuietWindow > 0, !Blobs.isStandInName(name) else { return nil }
        guard ledger.noteSave(id, at: now) else { return nil }
        let entry = try cached(id)
        guard let live = entry.revision, removal(id) == nil else { return nil }
        // Written from something other than what is shown now: the commit decides (merge or conflict).
        guard try visibleAttachment(name, in: id)?.digest == seen else { return nil }
        let attachment = Attachment(name: name, contentType: contentType, blob: blob, revpos: 0)
        // Its time is when it was closed, until its revision is saved: a time that moved at the fold would make
        // make and rsync think it changed.
        var local = given
        local.modified = given.modified ?? LocalAttributes.nanoseconds(now)
        // What the row or record now holds, as the stage wrote it (no read back: this is every file's close).
        var shown = entry.local[name] ?? LocalAttributes()
        shown.take(local, forBody: attachment.digest)
        let draft = StagedAttachment.Draft(docID: id, attachment: attachment, expectedDigest: entry.byName[name]?.digest,
                                           base: live.revID, given: local)
        let staged: StagedAttachment
        do {
            staged = try stagingLog.map { try $0.stage(draft, shown: shown) } ?? store.stage(draft)
        } catch SofaError.conflict {
            return nil  // the file of that name was folded meanwhile: saved now, on top of that revision
        }
        cache.setLocal(id, name, shown)
        let awaits = CouchMD5sInBackground.isWorthIt(contentType: contentType, length: blob.length)
        track(staged, in: id, base: live, bodyMD5: blob.md5, awaitsCompressedMD5: awaits)
        if awaits { md5sAhead.add(blob.key) }
        return live.revID
    }

    /// Adds a staged file to its document's burst (begun now if there is none: the first file,
    /// or one staged while the burst before it was folded), in place of `replacing`.
    private func track(_ staged: StagedAttachment, in id: String, base live: Revision, replacing: StagedAttachment? = nil,
                       bodyMD5: [UInt8]? = nil, awaitsCompressedMD5: Bool = false) {
        let timer = ledger.track(staged, in: id, base: live, replacing: replacing, bodyMD5: bodyMD5,
                                 awaitsCompressedMD5: awaitsCompressedMD5, at: Date().timeIntervalSince1970)
        if let timer { scheduleBurstCheck(id, timer: timer, after: Tuning.burstQuietWindow) }
    }

    /// A staged file renamed in its document (rsync's temporary file taking its name, an
    /// editor's backup dance) is staged under its new name: no revision for the rename. False
    /// when the file is not only staged (it is in the revision too), or was folded meanwhile.
    func restageIfStaged(_ id: String, _ fromName: String, as toName: String) throws -> Bool {
        guard let staged = ledger.staged(fromName, in: id), removal(id) == nil else { return false }
        let entry = try cached(id)
        guard let live = entry.revision, entry.byName[fromName] == nil, !Blobs.isStandInName(toName) else { return false }
        let moved: StagedAttachment
        do {
            if staged.log != nil, let stagingLog {
                moved = try stagingLog.restage(staged, as: toName, expectedDigest: entry.byName[toName]?.digest)
            } else {
                moved = try store.restage(staged, as: toName, expectedDigest: entry.byName[toName]?.digest)
            }
        } catch SofaError.conflict {
            return false  // folded meanwhile: renamed in a revision
        }
        // As the restage moved them; the values, not a move of whatever the entry holds, so that
        // a load under way that read the log after the restage takes in the same.
        cache.setLocal(id, [(toName, entry.local[fromName]), (fromName, nil)])
        track(moved, in: id, base: live, replacing: staged)
        return true
    }

    private func scheduleBurstCheck(_ id: String, timer: Int, after delay: Double) {
        burstQueue.asyncAfter(deadline: .now() + max(delay, 0.001)) { [weak self] in
            self?.checkBurst(id, timer: timer)
        }
    }

    /// Folds the burst when it is due; otherwise waits until it is.
    private func checkBurst(_ id: String, timer: Int) {
        let now = Date().timeIntervalSince1970
        guard let due = ledger.due(id, timer: timer) else { return }  // folded meanwhile, or another timer's
        if now < due {
            scheduleBurstCheck(id, timer: timer, after: due - now)
            return
        }
        var retry = 0.0
        let started = Date().timeIntervalSince1970
        do {
            try foldBurst(id)
        } catch {
            log.error("docs/\(FileNames.escape(id)): files written in a burst were not saved as a revision yet: \(error); they stay staged and are tried again")
            retry = Tuning.burstRetryDelay
        }
        // Files staged while it folded start a burst of their own.
        let ended = Date().timeIntervalSince1970
        let next = ledger.restart(id, timer: timer, at: ended, lastFold: ended - started)
        if let next { scheduleBurstCheck(id, timer: next, after: max(retry, Tuning.burstQuietWindow)) }
    }

    /// Saves the staged files of a document as one revision (with every other change waiting
    /// for it: removals under way, set-aside files).
    func foldBurst(_ id: String) throws {
        guard ledger.hasBurst(id) else { return }
        _ = try commitChanges(id, base: nil, change: nil, seen: .unknown) { _ in }
    }

    /// Folds every burst (the mount is ending); the staging log goes if nothing is left in it.
    /// On the bursts' own queue, after a fold under way: beside it, this fold did the same work
    /// again (the MD5s of the same files, 10,000 text files at the end of a `cp -r`) and was then
    /// refused, as the other had saved them, and looked again.
    public func foldAllBursts() {
        dispatchPrecondition(condition: .notOnQueue(burstQueue))
        burstQueue.sync {
            for id in ledger.documentsWithBursts {
                do { try foldBurst(id) } catch {
                    log.error("docs/\(FileNames.escape(id)): files written in a burst were not saved as a revision: \(error); they stay staged and are saved at the next mount")
                }
            }
        }
        stagingLog?.finish()
    }

    /// Takes in the files that mounts which stopped (killed, crashed) had staged, in rows and
    /// in their staging logs (made rows first): each document's become one revision, as their
    /// fold would have made.
    func recoverStagedAttachments() throws {
        guard !readOnly else { return }
        let imported = try store.importStoppedStagingLogs(except: stagingLog?.name)
        let orphans = try store.stagedAttachments(includingLogs: false).filter { staged in
            imported.contains(staged.seq) || staged.pid != getpid() && kill(staged.pid, 0) != 0 && errno == ESRCH
        }
        // A power loss can leave a row whose body never reached the disk (it was synced by the
        // fold): that file is lost, as the last window may be, and said so.
        var lost: [StagedAttachment] = []
        let intact = try orphans.filter { staged in
            guard let key = staged.attachment.blobKey, store.blobs.contains(key) else {
                lost.append(staged)
                return false
            }
            do {
                try store.blobs.verify(key)
                return true
            } catch SofaError.blobCorrupted {
                lost.append(staged)
                return false
            }  // another error (a disk that cannot be read now) is passed up: the rows wait for the next mount
        }
        if !lost.isEmpty {
            for file in lost {
                log.error("docs/\(FileNames.escape(file.docID))/attachments/\(file.name): written before the mount stopped, but its bytes did not reach the disk (a power loss?); it is not saved")
            }
            try store.save(nil, unstaging: lost)
        }
        for (id, files) in Dictionary(grouping: intact, by: \.docID) {
            guard let live = try store.document(withID: id) else {
                // Deleted since: the files become a branch of their own rather than disappear.
                var branch = try store.newDocument(id)
                for file in files { try branch.setAttachment(file.attachment) }
                try store.save(branch, allowConflict: true, unstaging: files)
                continue
            }
            ledger.adopt(files, in: id, base: live, at: Date().timeIntervalSince1970)
            try foldBurst(id)
            // Older stagings of the same names (replaced by later ones, which the fold took) go too.
            let latest = Dictionary(files.map { ($0.name, $0.seq) }, uniquingKeysWith: max)
            let replaced = files.filter { latest[$0.name] != $0.seq }
            if !replaced.isEmpty { try store.save(nil, unstaging: replaced) }
            log.notice("docs/\(FileNames.escape(id)): saved \(files.count) file(s) a mount that stopped had written")
        }
    }

    // MARK: - What the mount shows

    /// An attachment as the mount shows it: staged, or in the current revision, unless it is
    /// being removed or was set aside.
    func visibleAttachment(_ name: String, in id: String) throws -> Attachment? {
        let hidden = overlay.hides(name, in: id)
        let staged = ledger.staged(name, in: id)
        if hidden.removing { return nil }
        if let staged { return staged.attachment }
        guard let attachment = try cached(id).byName[name], !hidden.setAside else { return nil }
        return attachment
    }

    /// Whether staged files of document `id` lie in `folder`.
    func hasStagedFolder(_ folder: String, in id: String) -> Bool {
        ledger.holdsFolder(folder, in: id)
    }
}
