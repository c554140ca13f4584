import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Documents moved to the trash (`gio trash`, a file manager's Delete) and restored from it.
extension DocumentFileSystem {
    /// A document moved to the trash (`gio trash`, a file manager's Delete): its folder is
    /// written there as files (properties.json, attachments/, its scratch files), then the
    /// document is deleted (one tombstone). Restoring the folder saves it back.
    func trashDocument(_ id: String, to folder: String) throws {
        guard let revision = try liveRevision(id) else { throw MountError.notFound(.documentPath(id)) }
        let attachments = visibleAttachments(revision)
        // A body that is not here cannot go to the trash: it would be lost. EXDEV: "delete permanently?".
        guard attachments.allSatisfy(\.contentAvailable) else {
            throw MountError.crossDevice(.documentPath(id), why: "it has attachments whose bodies are not here")
        }
        guard !FileManager.default.fileExists(atPath: folder) else { throw MountError.exists(folder) }
        do {
            try writeScratch(scratch.path(folder, Node.propertiesFileName), bytes: render(revision.properties))
            for attachment in attachments {
                try copy(try store.openContent(of: attachment, docID: id), toScratch: scratch.path(folder, .relativePath(ofAttachment: attachment.name)))
            }
            try moveScratchFiles(from: scratchDirectory(id), into: folder)
        } catch {
            // Undone as far as it goes: the error thrown is the one that matters.
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
        try deleteDocument(id)
        // Its files were all moved out above: an empty folder left behind shows nothing.
        try? FileManager.default.removeItem(atPath: scratchDirectory(id))
    }

    /// Moves what the scratch folder `from` holds into `into`, folder by folder where both have
    /// one (rsync's temporary files leave a scratch `attachments/` beside the one written above).
    private func moveScratchFiles(from: String, into: String) throws {
        for name in try scratchNames(in: from) {
            let source = scratch.path(from, name), target = scratch.path(into, name)
            if isDirectory(source) && isDirectory(target) {
                try moveScratchFiles(from: source, into: target)
            } else {
                guard LongPath.rename(source, target) == 0 else { throw SofaError.system("rename", path: source, errno: errno) }
            }
        }
    }

    /// A document folder back from the trash: properties.json and attachments/ become a
    /// revision (one), the other files its scratch files.
    func restoreDocument(_ id: String, from folder: String) throws {
        try DocumentID.validate(id)
        guard try liveRevision(id) == nil else { throw MountError.notEmpty(.documentPath(id)) }
        let properties = try parseProperties(try readSmallFile(scratch.path(folder, Node.propertiesFileName)))
        let attachmentsFolder = scratch.path(folder, Node.attachmentsDirectoryName)
        let blobsFolder = scratch.path(folder, Node.blobsDirectoryName)
        var bodies: [(String, StoredBlob)] = []
        for (directory, prefix) in [(attachmentsFolder, ""), (blobsFolder, Blobs.standInPrefix)] {
            for file in try scratch.files(below: directory) {
                let name = prefix + FileNames.attachmentName(file.relative.split(separator: "/").map(String.init))
                bodies.append((name, try store.blobs.adopt(fileAt: file.path, keepingOriginal: true)))
            }
        }
        _ = try commit(id, base: nil, change: .properties) { draft in
            draft.properties = properties
            for (name, blob) in bodies {
                // A blob's type is in its dictionary; an attachment's is guessed from its name.
                try draft.setAttachment(name, blob: blob, contentType: Blobs.isStandInName(name) ? nil : MIMEType.forFileName(name))
            }
        }
        // Saved above: these copies of what the revision now holds may go or stay (absent ones are the usual case).
        try? FileManager.default.removeItem(atPath: scratch.path(folder, Node.propertiesFileName))
        try? FileManager.default.removeItem(atPath: attachmentsFolder)
        try? FileManager.default.removeItem(atPath: blobsFolder)
        let files = scratchDirectory(id)
        try? FileManager.default.removeItem(atPath: files)
        try FileManager.default.moveItem(atPath: folder, toPath: files)
    }
}
