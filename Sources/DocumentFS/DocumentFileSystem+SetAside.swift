import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Attachments set aside: renamed to a scratch name in their own document (an editor's
/// backup), their removal waits for the file that takes their name.
extension DocumentFileSystem {
    /// Sets an attachment aside: renamed to a scratch name in its own document (an editor's
    /// backup, `gio copy -b`, emacs' first save), it leaves the view at once, but its removal
    /// waits for the document's next save (the new file at its name, usually within
    /// milliseconds) or `Tuning.setAsideGrace`, so that the rename and the new file make one
    /// revision, and no revision without the attachment reaches a replica in between.
    func setAside(_ attachment: Attachment, of id: String) {
        let since = Date()
        overlay.setAside(attachment.name, digest: attachment.digest, since: since, in: id)
        DispatchQueue.global().asyncAfter(deadline: .now() + Tuning.setAsideGrace) { [weak self] in
            self?.removeSetAside(of: id, setAsideBy: since)
        }
    }

    /// Saves the removal of what was set aside in document `id` by `date` (everything: nil).
    func removeSetAside(of id: String, setAsideBy date: Date? = nil) {
        let due = overlay.setAside(in: id, by: date)
        guard let name = due.first else { return }
        do {
            guard let live = try liveRevision(id) else {
                endSetAside(due, of: id)  // deleted meanwhile: nothing to remove
                return
            }
            // The save applies every set-aside removal of the document (see `commit`).
            _ = try commit(id, base: live.revID, change: .attachment(name)) { _ in }
        } catch {
            log.error("\(String.attachmentPath(id, name).dropFirst()): its removal (renamed to a scratch name) was not saved: \(error)")
        }
    }

    /// Saves every removal still waiting (the mount is ending).
    public func saveSetAsideRemovals() {
        for id in overlay.documentsWithSetAside { removeSetAside(of: id) }
    }

    func endSetAside(_ names: some Collection<String>, of id: String) {
        guard !names.isEmpty else { return }
        overlay.endSetAside(names, in: id)
    }
}
