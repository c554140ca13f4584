import DocumentModel
import DocumentStore
import MountTables
import Foundation
import FuseKit

/// Saving what was written as a revision: merge with what changed meanwhile, or a
/// conflicting branch; refused properties.json kept aside with the reason.
extension DocumentFileSystem {
    /// Saves a dirty write handle as a revision. Caller holds the handle's lock.
    /// A failed save is reported again by every later flush until the file is written again.
    func save(_ handle: WriteHandle) throws {
        if !handle.dirty, handle.failed, let error = handle.lastError { throw error }
        guard handle.dirty else { return }
        defer { dropPendingSave(of: handle) }  // saved, or refused (its text kept apart): not pending either way
        do {
            let revision: Revision
            switch handle {
            case let properties as PropertiesWriteHandle:
                FuseMount.mayBlock()  // a commit and its fsync: others are answered meanwhile
                let object: JSONObject
                do {
                    object = try parseProperties(properties.buffer)
                } catch {
                    keepRejected(properties.buffer, of: handle.docID, because: error)
                    throw error
                }
                do {
                    revision = try commit(handle.docID, base: handle.base, change: handle.change,
                                          seen: properties.seenProperties.map(Seen.properties) ?? .unknown) { $0.properties = object }
                } catch let error as SofaError where error.isRefusedByDesign {
                    // A validator's refusal keeps the text and its reason, as invalid JSON does.
                    keepRejected(properties.buffer, of: handle.docID, because: error)
                    throw error
                }
                clearRejected(of: handle.docID)
                properties.seenProperties = object
            case let attachment as AttachmentWriteHandle:
                // A file closed in a busy document is staged: its body is synced with the fold that saves it.
                let durable = !mayStage(handle.docID)
                // A revision's commit and its fsyncs: others are answered meanwhile. A staged file's
                // row is a commit without fsync, quicker than handing the reading to another thread
                // (two wake-ups a file); one held up longer (the database locked) is seen by the
                // mount's watchdog after `stallCheck`.
                if durable { FuseMount.mayBlock() }
                let blob = try attachment.commitBody(durable: durable)
                let base = try saveAttachment(handle.docID, attachment.name, blob: blob, contentType: attachment.contentType,
                                              base: handle.base, seen: attachment.seenDigest, given: handle.given, synced: durable)
                attachment.seenDigest = blob.key.digestString
                pending.forgetOpened(handle.path)
                handle.given = LocalAttributes()
                handle.base = base
                handle.dirty = false
                handle.emptiedAtOpen = false
                return
            default:
                return
            }
            handle.base = revision.revID
            handle.dirty = false
            handle.emptiedAtOpen = false
        } catch {
            handle.failed = true
            handle.lastError = error
            handle.dirty = false
            handle.emptiedAtOpen = false
            throw error
        }
    }

    static let rejectedName = "properties.rejected.json"
    static let rejectedReasonName = "properties.rejected.txt"

    /// A properties.json that could not be saved: its bytes are kept beside it in the document's
    /// folder (a scratch file, never replicated) and the reason in a text file next to them, so
    /// that nothing typed is lost and a file-manager user can read why.
    func keepRejected(_ bytes: [UInt8], of id: String, because error: Error) {
        let reason = """
            properties.json was not saved (\(ISO8601DateFormatter().string(from: Date()))): \(error)
            The document is unchanged. What was written is in \(DocumentFileSystem.rejectedName): fix it and save it as properties.json.

            """
        log.error("docs/\(FileNames.escape(id))/properties.json: not saved, the document is unchanged: \(error); the text is kept in \(DocumentFileSystem.rejectedName)")
        do {
            try writeScratch(scratchPath(id, DocumentFileSystem.rejectedName), bytes: bytes)
            try writeScratch(scratchPath(id, DocumentFileSystem.rejectedReasonName), bytes: Array(reason.utf8))
        } catch {
            log.error("docs/\(FileNames.escape(id))/properties.json: the refused text could not be kept in \(DocumentFileSystem.rejectedName) either: \(error)")
        }
    }

    /// After a good save: the rejected text and its reason go.
    func clearRejected(of id: String) {
        Glibc.unlink(scratchPath(id, DocumentFileSystem.rejectedName))
        Glibc.unlink(scratchPath(id, DocumentFileSystem.rejectedReasonName))
    }

    func parseProperties(_ bytes: [UInt8]) throws -> JSONObject {
        let value: JSONValue
        do { value = try JSONValue(parsing: bytes) } catch { throw SofaError.invalidJSON(error) }
        guard case .object(let object) = value else {
            throw SofaError.invalidDocument(reason: "properties.json must hold a JSON object, not \(value.kindName)")
        }
        return object
    }

    /// What a writer saw when it began: the attachment's digest (nil: absent) or the
    /// properties, so that a change made meanwhile is told without reloading the revision it
    /// began from (a document of many files keeps no bodies of its history).
    enum Seen {
        case unknown
        case attachment(String?)
        case properties(JSONObject)
    }

    /// Saves a change made from `base`: on top of the current revision when the
    /// change does not collide with what happened since, else as a conflicting
    /// branch from `base`. Removals under way (`rm -r`) and the document's staged files
    /// (`Bursts.swift`) are saved with it.
    func commit(_ id: String, base: RevisionID?, change: Change, seen: Seen = .unknown,
                _ apply: (inout RevisionDraft) throws -> Void) throws -> Revision {
        guard let revision = try commitChanges(id, base: base, change: change, seen: seen, apply) else {
            throw SofaError.documentNotFound(id)
        }
        return revision
    }

    /// `commit`, or with no `change`, a fold of the staged files alone. Returns the revision
    /// the change is in (the current one when it changed nothing).
    func commitChanges(_ id: String, base: RevisionID?, change: Change?, seen: Seen,
                       _ apply: (inout RevisionDraft) throws -> Void) throws -> Revision? {
        // One of this mount's saves of a document at a time: beside each other, each read the
        // document, the other saved first, and it looked again; a file closed over and over
        // beside a setxattr (git's index.lock, a writer's burst on a busy machine) made the
        // setxattr lose eight times in a row and answer EBUSY. The retries below are for
        // other writers (a sync, the CLI, another mount).
        try saveTurns.withTurn(of: id) { try commitChangesInTurn(id, base: base, change: change, seen: seen, apply) }
    }

    private func commitChangesInTurn(_ id: String, base: RevisionID?, change: Change?, seen: Seen,
                                     _ apply: (inout RevisionDraft) throws -> Void) throws -> Revision? {
        for _ in 0..<8 {
            let burst = ledger.burst(id)
            let staged = (burst?.staged.values).map(Array.init) ?? []
            let current = try store.currentRevision(of: id)
            let live = current.flatMap { $0.deleted ? nil : $0 }
            let liveByName = Dictionary((live?.attachments ?? []).map { ($0.name, $0) }, uniquingKeysWith: { $1 })
            // Staged files whose names nobody else changed since go on top of the current revision.
            // (One the current revision already holds, folded by a commit running beside this one, is neither.)
            let (fits, clashes) = staged.reduce(into: ([StagedAttachment](), [StagedAttachment]())) { parts, file in
                let current = liveByName[file.name]
                if live != nil && current?.digest == file.attachment.digest && current?.contentType == file.attachment.contentType { return }
                if live != nil && current?.digest == file.expectedDigest { parts.0.append(file) } else { parts.1.append(file) }
            }
            let onLive = change == nil || live?.revID == base || (base == nil && live == nil)
                || !collides(change!, base: base, seen: seen, live: live, liveByName: liveByName, burst: burst, id: id)
            var drafts: [(draft: RevisionDraft, allowConflict: Bool)] = []
            var liveDraft: RevisionDraft?
            if onLive && change != nil || !fits.isEmpty {
                // On the revision just read (a document of 10,000 files: reading it again was a
                // tenth of a fold); a deleted one is continued from its tombstone.
                var draft = try store.newRevision(of: id, from: current?.revID, like: live)
                for file in fits { try draft.setAttachment(file.attachment) }
                liveDraft = draft
            }
            var changeDraft: RevisionDraft? = nil
            if change != nil, !onLive { changeDraft = try conflictDraft(id, from: base, live: live) }
            let removal = removal(id)
            let aside = overlay.setAside(in: id)
            if var draft = changeDraft ?? liveDraft {
                if let removal {
                    for name in removal.attachments where draft.attachments[name] != nil { try draft.removeAttachment(name) }
                }
                for (name, set) in aside where draft.attachments[name]?.digest == set.digest { try draft.removeAttachment(name) }
                if change != nil { try apply(&draft) }
                if changeDraft != nil { changeDraft = draft } else { liveDraft = draft }
            }
            if let draft = liveDraft {
                if let live, live.revID == draft.parent, draft.repeats(live) {
                    // Nothing changed (rsync rewriting a file with the same bytes, a backup put back): no new revision.
                } else {
                    drafts.append((draft, false))
                }
            }
            if let draft = changeDraft { drafts.append((draft, true)) }
            if !clashes.isEmpty, let burst {
                // Changed elsewhere while staged (or the document went): kept as a branch of what the mount showed.
                var branch = try store.newRevision(of: id, from: burst.base.revID, like: burst.base)
                for file in clashes { try branch.setAttachment(file.attachment) }
                drafts.append((branch, true))
            }
            do {
                defer { if !drafts.isEmpty || !staged.isEmpty { documentChanged(id) } }
                try syncBodies(staged.compactMap(\.attachment.blobKey))
                let known = ledger.bodyMD5s(of: staged.compactMap(\.attachment.blobKey))
                for index in drafts.indices {
                    for (key, md5, compressed) in known {
                        drafts[index].draft.useBodyMD5(md5, of: key, compressed: compressed)
                    }
                    store.workOutCouchMD5s(of: &drafts[index].draft)
                }
                // What the mount showed is what the revision holds: nothing for the watcher to undo.
                let isOwn = clashes.isEmpty && drafts.count == 1 && !drafts[0].allowConflict
                let saved = try store.save(drafts.map { ($0.draft, $0.allowConflict) }, unstaging: staged, log: stagingLog) { saved in
                    if isOwn { ledger.noteOwnSave(saved[0].revID, of: id) }
                }
                // The cached revision goes before the staged files it now holds: in between, a
                // lookup would find neither (an unlink of a file just folded answered ENOENT).
                if !drafts.isEmpty || !staged.isEmpty { documentChanged(id) }
                for (index, draft) in drafts.enumerated() where draft.allowConflict {
                    log.warning("docs/\(FileNames.escape(id)): changed since it was written; saved as conflicting revision \(saved[index].revID)")
                }
                endSetAside(aside.keys, of: id)
                ledger.saved(staged, in: id)
                if !drafts.isEmpty { overlay.endRemoval(id) }
                if changeDraft != nil { return saved[drafts.firstIndex { $0.allowConflict }!] }
                if liveDraft != nil, let first = drafts.firstIndex(where: { !$0.allowConflict }) { return saved[first] }
                return live
            } catch SofaError.conflict {
                continue  // another writer saved in between: look again
            }
        }
        throw SofaError.conflict(docID: id, revID: base?.description, current: try store.currentRevision(of: id)?.revID.description ?? "(none)")
    }

    /// A draft for a change that collides: a branch from `base` with what `base` held, or,
    /// when the database no longer keeps `base`'s body (history of a large document), with
    /// what the current revision holds; a new document's branch without a base.
    func conflictDraft(_ id: String, from base: RevisionID?, live: Revision?) throws -> RevisionDraft {
        guard let base else { return try store.newDocument(id) }
        do {
            return try store.newRevision(of: id, from: base)
        } catch SofaError.revisionNotFound {
            return try store.newRevision(of: id, from: base, like: live)
        }
    }

    /// Whether a change made from `base` touches what changed between `base` and `live` (staged
    /// files count as changed, as the mount shows them).
    func collides(_ change: Change, base: RevisionID?, seen: Seen, live: Revision?, liveByName: [String: Attachment],
                          burst: Burst?, id: String) -> Bool {
        guard let live else { return base != nil }  // deleted since: keep the edit as a branch
        switch (change, seen) {
        case (.attachment(let name), .attachment(let digest)):
            return digest != (burst?.staged[name]?.attachment.digest ?? liveByName[name]?.digest)
        case (.properties, .properties(let properties)):
            return properties != live.properties
        default:
            break
        }
        guard let base else {
            switch change {
            case .properties: return !live.properties.isEmpty
            case .attachment(let name): return burst?.staged[name] != nil || liveByName[name] != nil
            }
        }
        let original: Revision
        do { original = try store.revision(base, of: id) } catch {
            // Its body is gone (pruned history) or unreadable: keep the edit as a branch, lose nothing.
            log.notice("docs/\(FileNames.escape(id)): cannot compare with revision \(base) (\(error)); the change is kept as a branch if it is not the current one")
            return true
        }
        switch change {
        case .properties: return original.properties != live.properties
        case .attachment(let name):
            return original.attachment(named: name)?.digest != (burst?.staged[name]?.attachment.digest ?? liveByName[name]?.digest)
        }
    }
}

/// One save at a time per document in a mount (`commitChanges`). A turn is taken after the
/// saving handle's lock and before the staging log's and the database's (docs/internals.md,
/// Locks); nothing waits for a turn while holding one.
final class DocumentSaveTurns: @unchecked Sendable {
    private let lock = NSLock()
    /// A lock per document being saved, with how many threads hold or wait for it.
    private var turns: [String: (turn: NSLock, users: Int)] = [:]

    func withTurn<T>(of id: String, _ body: () throws -> T) rethrows -> T {
        let turn = lock.withLock {
            let turn = turns[id]?.turn ?? NSLock()
            turns[id] = (turn, (turns[id]?.users ?? 0) + 1)
            return turn
        }
        turn.lock()
        defer {
            turn.unlock()
            lock.withLock {
                turns[id]!.users -= 1
                if turns[id]!.users == 0 { turns[id] = nil }
            }
        }
        return try body()
    }
}
