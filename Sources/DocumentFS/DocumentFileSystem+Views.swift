import DocumentModel
import DocumentStore
import Foundation
import FuseKit

/// Views as folders: `views/<design>/<view>/` lists the view's keys in CouchDB's order, each a
/// folder of links to the documents whose rows have that key; `_reduce.json` beside them holds
/// the reduce. The same index `sofa serve` answers from, brought up to date as a listing starts.
///
/// - **Paged.** A listing reads the index a page at a time from where the previous read of that
///   folder stopped (`viewListings`), so any size lists in constant memory and linear time.
/// - **Fresh.** Folders' times are the database's last commit and the kernel trusts them for
///   `Tuning.viewAttributeTimeout`: it drops a kept listing when it sees the time move, so a new
///   document shows within that time without the change watcher naming every folder.
/// - **Read-only.** Nothing below `views/` can be written (EROFS, with the reason).
extension DocumentFileSystem {
    /// A view found by its folder names, with its index up to date.
    struct OpenView {
        let definition: ViewDefinition
        let view: ViewDefinition.View
        let position: Int
        let indexID: Int64
        let sequence: Int64
    }

    /// Nothing committed since a view was last opened (the common case: every `stat` of a
    /// listing's entries) costs one read; otherwise its design document is read again and its
    /// index brought up to date.
    func openView(_ design: String, _ name: String, path: String) throws -> OpenView {
        let sequence = try store.lastSequence
        let known = ViewKey(design: design, view: name)
        if let open = derived.openViews[known], open.sequence == sequence { return open }
        guard let definition = try viewDefinition(design), let position = definition.position(of: name) else {
            throw MountError.notFound(path)
        }
        let state = try store.updateViewIndex(definition)
        let open = OpenView(definition: definition, view: definition.views[position], position: position,
                            indexID: state.id, sequence: state.sequence)
        derived.openViews[known] = open
        return open
    }

    /// The views of `_design/<design>`, when it has any the query server runs (JavaScript).
    private func viewDefinition(_ design: String) throws -> ViewDefinition? {
        let designID = DocumentID.designPrefix + design
        guard let revision = try store.document(withID: designID),
              (revision.properties["language"]?.stringValue ?? "javascript") == "javascript",
              let definition = ViewDefinition(designID: designID, body: revision.properties), !definition.views.isEmpty
        else { return nil }
        return definition
    }

    /// The key of a key folder's name in `view`, if the view has rows of it and its listing
    /// shows it by that name (`1.0` is no other name of the key `1`).
    private func key(_ name: String, in view: OpenView, path: String) throws -> JSONValue {
        guard let named = ViewKeyNames.key(named: name),
              let key = try store.viewKey(index: view.indexID, view: view.position, collatingAs: named),
              ViewKeyNames.name(of: key) == name else { throw MountError.notFound(path) }
        return key
    }

    // MARK: - Attributes

    /// When the database last committed: a view folder's time, which moves whenever its listing may.
    func databaseChangedAt() -> Double { max(mountTime, store.lastCommitTime() ?? 0) }

    func viewFolder(_ modified: Double) -> FileAttributes {
        var attributes = directory(modified, writable: false)
        attributes.timeout = Tuning.viewAttributeTimeout
        return attributes
    }

    static func linkTarget(_ docID: String) -> String { "../../../../docs/" + FileNames.escape(docID) }

    /// A row's symbolic link (a view's, a saved query's), trusted by the kernel as its folder is.
    func link(to target: String, _ modified: Double) -> FileAttributes {
        var attributes = FileAttributes(kind: .symbolicLink, size: Int64(target.utf8.count), modified: FileTime(seconds: modified))
        attributes.timeout = Tuning.viewAttributeTimeout
        return attributes
    }

    func viewAttributes(_ node: ViewNode, path: String) throws -> FileAttributes {
        switch node {
        case .root:
            return viewFolder(databaseChangedAt())
        case .design(let design):
            guard try viewDefinition(design) != nil else { throw MountError.notFound(path) }
            return viewFolder(databaseChangedAt())
        case .view(let design, let name):
            _ = try openView(design, name, path: path)
            return viewFolder(databaseChangedAt())
        case .key(let design, let name, let keyName):
            _ = try key(keyName, in: openView(design, name, path: path), path: path)
            return viewFolder(databaseChangedAt())
        case .row(let design, let name, let keyName, let docID):
            let view = try openView(design, name, path: path)
            guard try store.viewHasRow(index: view.indexID, view: view.position, key: key(keyName, in: view, path: path), docID: docID)
            else { throw MountError.notFound(path) }
            return link(to: Self.linkTarget(docID), databaseChangedAt())
        case .reduce:
            var attributes = file(Int64(try reduced(node, path: path).count), databaseChangedAt(), writable: false)
            attributes.volatile = true
            return attributes
        }
    }

    /// A row's target follows from its name: the kernel asks only after a lookup found the row,
    /// so it is not looked for again.
    func viewLinkTarget(_ node: ViewNode, path: String) throws -> String {
        guard case .row(_, _, _, let docID) = node else { throw MountError.invalidArgument(path, why: "not a symbolic link") }
        return Self.linkTarget(docID)
    }

    // MARK: - Listings

    /// Lists a folder below `views/` after `position` ("." and ".." are listed already).
    func listView(_ node: ViewNode, path: String, after position: UInt64, add: (DirectoryEntry) -> Bool) throws {
        let modified = databaseChangedAt()
        switch node {
        case .root:
            var designs: [DirectoryEntry] = []
            var after = DocumentID.designPrefix
            while true {
                let page = try store.documents(after: after, limit: Tuning.documentListingPage)
                for summary in page where summary.docID.hasPrefix(DocumentID.designPrefix) {
                    let design = String(summary.docID.dropFirst(DocumentID.designPrefix.count))
                    if try viewDefinition(design) != nil {
                        designs.append(named(FileNames.escape(design), attributes: viewFolder(modified)))
                    }
                }
                guard page.count == Tuning.documentListingPage, let last = page.last, last.docID.hasPrefix(DocumentID.designPrefix) else { break }
                after = last.docID
            }
            try addNamed(designs, after: position, add: add)
        case .design(let design):
            guard let definition = try viewDefinition(design) else { throw MountError.notFound(path) }
            try addNamed(definition.views.map { named(FileNames.escape($0.name), attributes: viewFolder(modified)) },
                         after: position, add: add)
        case .view(let design, let name):
            let view = try openView(design, name, path: path)
            let finished = try listPaged(path, after: position, add: add) { mark, limit in
                try store.viewKeys(index: view.indexID, view: view.position, after: mark, limit: limit).compactMap { row in
                    // A key too long for a file name is left out (the README says so).
                    ViewKeyNames.name(of: row.key).map { (mark: row.collation, entry: ($0, viewFolder(modified))) }
                }
            }
            guard finished, view.view.reduce != nil else { return }
            try addNamed([named(ViewNode.reduceFileName, attributes: reduceFile(modified))], after: position, add: add)
        case .key(let design, let name, let keyName):
            let view = try openView(design, name, path: path)
            let key = try key(keyName, in: view, path: path)
            let finished = try listPaged(path, after: position, add: add) { mark, limit in
                try store.viewDocuments(index: view.indexID, view: view.position, key: key,
                                           after: mark.map { String(decoding: $0, as: UTF8.self) }, limit: limit)
                    .map { (mark: Array($0.utf8), entry: (FileNames.escape($0), link(to: Self.linkTarget($0), modified))) }
            }
            guard finished, view.view.reduce != nil else { return }
            try addNamed([named(ViewNode.reduceFileName, attributes: reduceFile(modified))], after: position, add: add)
        case .row, .reduce:
            throw MountError.notFolder(path)
        }
    }

    private func reduceFile(_ modified: Double) -> FileAttributes {
        // Its size is known once computed, at a stat or an open: listed without one.
        var attributes = file(0, modified, writable: false)
        attributes.volatile = true
        return attributes
    }

    private func addNamed(_ entries: [DirectoryEntry], after position: UInt64, add: (DirectoryEntry) -> Bool) throws {
        for entry in entries.sorted(by: { $0.position < $1.position }) where entry.position > position {
            guard add(entry) else { return }
        }
    }

    /// Lists entries read a page at a time by `page(after, limit)`, each with the mark it is
    /// read after. Entries are at positions 3, 4, … in order; a read that goes on from where the
    /// last read of this folder stopped starts after its mark, any other reads from the start.
    /// Returns whether the listing reached its end (the folder's named files come after).
    func listPaged(_ path: String, after position: UInt64, add: (DirectoryEntry) -> Bool,
                           page: (_ after: [UInt8]?, _ limit: Int) throws -> [(mark: [UInt8], entry: (name: String, attributes: FileAttributes))]) throws -> Bool {
        guard position < ListingPosition.firstName else { return true }
        var mark: [UInt8]?
        var next = ListingPosition.first
        if position >= ListingPosition.first {
            if let cursor = derived.viewListings[path], cursor.position == position {
                (mark, next) = (cursor.mark, position + 1)
            }
        }
        defer { if next > ListingPosition.first { remember(path, ViewListingCursor(position: next - 1, mark: mark)) } }
        while true {
            let rows = try page(mark, Tuning.viewListingPage)
            for row in rows {
                // Read from the start to go on after an unknown position: the entries up to it are passed over.
                if next > position {
                    guard add(DirectoryEntry(name: row.entry.name, attributes: row.entry.attributes, position: next)) else { return false }
                }
                (mark, next) = (row.mark, next + 1)
            }
            if rows.count < Tuning.viewListingPage { return true }
        }
    }

    private func remember(_ path: String, _ cursor: ViewListingCursor) {
        derived.viewListings[path] = cursor
    }

    // MARK: - Reduce files

    /// The bytes of a `_reduce.json`: the view's reduce over all its rows, or over one key's
    /// rows (as `group=true` gives it), as indented JSON.
    func reduced(_ node: ViewNode, path: String) throws -> [UInt8] {
        guard case .reduce(let design, let name, let keyName) = node else { throw MountError.notFound(path) }
        let view = try openView(design, name, path: path)
        guard let source = view.view.reduce else { throw MountError.notFound(path) }
        if let cached = derived.reducedFiles[path], cached.sequence == view.sequence { return cached.bytes }
        var range = ViewRange()
        if let keyName { range = .key(try key(keyName, in: view, path: path), descending: false) }
        let rows = try store.viewRows(index: view.indexID, view: view.position, range: range, skip: 0, limit: Int.max,
                                         countingOffset: false).rows
        let bytes = Array(try ViewReduce.reduce(source, rows).prettyPrinted().utf8)
        derived.reducedFiles[path] = (view.sequence, bytes)
        return bytes
    }
}

/// A view by its folder names.
struct ViewKey: Hashable {
    let design: String
    let view: String
}

/// Where a view folder's listing stopped: the position of the last entry given and the index
/// mark it was read at.
struct ViewListingCursor {
    let position: UInt64
    let mark: [UInt8]?
}
