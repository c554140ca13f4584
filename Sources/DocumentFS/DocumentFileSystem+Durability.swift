import DocumentModel
import DocumentStore
import Foundation
import FuseKit
import MountTables

/// What `fsync` of a file being written makes durable: its bytes synced and recorded as a
/// pending save (`pending_saves`), saved by the next mount if this one stops before the close.
extension DocumentFileSystem {
    /// Syncs a pending file's bytes and records them as a pending save. Caller holds its lock.
    func makeDurable(_ file: WriteHandle) throws {
        let id = file.durableID ?? UUID().uuidString.lowercased()
        let keep = store.blobs.keptFilePath(id)
        let record: PendingSave
        switch file {
        case let properties as PropertiesWriteHandle:
            // Refused now if it would be refused at close (close and fsync report invalid JSON alike).
            do { _ = try parseProperties(properties.buffer) } catch {
                keepRejected(properties.buffer, of: file.docID, because: error)
                throw error
            }
            try store.blobs.writeKeptFile(properties.buffer, to: keep)
            record = PendingSave(id: id, pid: getpid(), docID: file.docID, name: nil, base: file.base, contentType: nil, file: keep)
        case let attachment as AttachmentWriteHandle:
            guard try attachment.makeDurable(at: keep) else { return }
            record = PendingSave(id: id, pid: getpid(), docID: file.docID, name: attachment.name, base: file.base,
                                 contentType: attachment.contentType, file: keep)
        default:
            return
        }
        try store.recordPendingSave(record)
        file.durableID = id
    }

    /// Forgets the pending save of `file`, if it has one. Caller holds its lock.
    func dropPendingSave(of file: WriteHandle) {
        guard let id = file.durableID else { return }
        store.removePendingSave(id)
        file.durableID = nil
    }

    /// Saves what mounts that stopped (killed, crashed, the machine went down) had made durable
    /// with fsync but not saved: each becomes the revision its close would have made.
    func recoverPendingSaves() {
        guard !readOnly else { return }
        let saves: [PendingSave]
        do {
            saves = try store.pendingSaves()
        } catch {
            // They stay in the journal for the next mount; this one says so rather than nothing.
            log.error("cannot read the journal of saves made durable by a mount that stopped, so none is recovered now: \(error)")
            return
        }
        for save in saves where save.pid != getpid() && kill(save.pid, 0) != 0 && errno == ESRCH {
            let place = "docs/\(FileNames.escape(save.docID))/" + (save.name.map { "attachments/\($0)" } ?? Node.propertiesFileName)
            do {
                if access(save.file, F_OK) == 0 {
                    if let name = save.name {
                        let blob = try store.blobs.adopt(fileAt: save.file, keepingOriginal: true)
                        _ = try commit(save.docID, base: save.base, change: .attachment(name)) { draft in
                            try draft.setAttachment(name, blob: blob, contentType: save.contentType ?? MIMEType.forFileName(name))
                        }
                    } else {
                        let properties = try parseProperties(try store.blobs.readKeptFile(save.file, limit: PropertiesWriteHandle.maximumSize))
                        _ = try commit(save.docID, base: save.base, change: .properties) { $0.properties = properties }
                    }
                    log.notice("\(place): saved what was written and fsynced before the mount stopped")
                }
                store.removePendingSave(save.id)
            } catch {
                log.error("\(place): cannot save what was fsynced before the mount stopped: \(error); kept in \(save.file)")
            }
        }
    }
}
