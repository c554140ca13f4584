import DocumentModel
import DocumentStore
import Foundation
import FuseKit
import MountTables

/// Everything the file system asks of the database it shows, and nothing else: the mount's
/// code reaches the store only through this (`DocumentFileSystem.store`), as mountpoint-s3's
/// file system reaches S3 only through its `ObjectClient`. `Database` has well over a hundred
/// public members for its five clients (the server, the replicator, the mount, its tables, the
/// command line); the mount needs these, in six concerns. A member added here is a decision, not
/// a convenience: it widens what any store under a mount must do.
///
/// What the mount writes goes through revisions and the mount's own tables (MountTables), so
/// every save still commits in one transaction with the staged files it takes in; nothing here
/// writes outside a transaction of the store's own.
///
/// A Couchbase Lite `.cblite2` file is mounted through this same interface: its mount serves the
/// file's companion `Database`, kept in step with the file by the replicator (`sofa` module,
/// `CouchbaseLiteMount`), because the file has no place for what the rest of this protocol
/// keeps (staged files, times and modes, pending saves).
public protocol MountStore: AnyObject, Sendable {
    // MARK: The database folder

    /// The database file's path (`status.json`, `statvfs`, view files beside it).
    var path: String { get }
    var isReadOnly: Bool { get }
    /// The content-addressed bodies: adopting written files, opening readers, syncing.
    var blobs: BlobStore { get }
    /// When the store last committed, by any process (nil if it cannot say): the time of
    /// folders whose listing moves with every commit (`views/`).
    func lastCommitTime() -> Double?

    // MARK: Documents, read

    func document(withID id: String) throws -> Revision?
    func currentRevision(of id: String) throws -> Revision?
    func revision(_ revID: RevisionID, of id: String) throws -> Revision
    func revisionTree(of id: String) throws -> RevisionTree
    func revisionTimes(of revision: Revision) throws -> [String: Double]
    /// A document's number in the store: inode numbers are made from it.
    func storageKey(of id: String) throws -> Int64?
    func documentID(storageKey key: Int64) throws -> String?
    func storedDocument(live id: String) throws -> StoredDocument?
    func documentsInStorageOrder(afterKey key: Int64, limit: Int) throws -> [StoredDocument]
    func documents(after afterID: String?, including: Bool, offset: Int, limit: Int,
                   includeDeleted: Bool, countingConflicts: Bool) throws -> [DocumentSummary]
    func openContent(of attachment: Attachment, docID: String) throws -> BlobReader

    // MARK: Documents, written

    func newDocument(_ id: String) throws -> RevisionDraft
    func newRevision(of id: String) throws -> RevisionDraft
    func newRevision(of id: String, from revID: RevisionID) throws -> RevisionDraft
    func newRevision(of id: String, from parent: RevisionID?, like content: Revision?) throws -> RevisionDraft
    func save(_ draft: RevisionDraft, allowConflict: Bool) throws -> Revision
    func deleteDocument(_ id: String, revID: RevisionID?) throws -> Revision
    /// Reads ahead, outside any transaction, the new bodies a save of `draft` needs for its
    /// revision id, onto the draft (a fold of thousands of files then holds the staging log
    /// only for its rows).
    func workOutCouchMD5s(of draft: inout RevisionDraft)

    // MARK: What changed (the change watcher)

    var changeStream: ChangeStream { get }
    var lastSequence: Int64 { get throws }
    var purgeSequence: Int64 { get throws }
    func changes(since sequence: Int64, limit: Int) throws -> [DocumentStore.Change]
    func lastBodyEvent() throws -> Int64
    func documentsWithBodyEvents(after seq: Int64) throws -> (docIDs: [String], last: Int64)

    // MARK: Bodies kept here (pins, the cache's reads)

    func noteRead(digest: String)
    func isPinned(digest: String) throws -> Bool
    func setPinned(_ pinned: Bool, digest: String) throws

    // MARK: Views and saved queries (`views/`, `queries/`)

    func matches(_ selector: Selector, documentID id: String) throws -> Bool
    func find(_ query: MangoQuery) throws -> FindResult
    func updateViewIndex(_ definition: ViewDefinition) throws -> (id: Int64, sequence: Int64)
    func viewKey(index indexID: Int64, view: Int, collatingAs key: JSONValue) throws -> JSONValue?
    func viewHasRow(index indexID: Int64, view: Int, key: JSONValue, docID: String?) throws -> Bool
    func viewKeys(index indexID: Int64, view: Int, after: [UInt8]?, limit: Int) throws -> [(collation: [UInt8], key: JSONValue)]
    func viewDocuments(index indexID: Int64, view: Int, key: JSONValue, after: String?, limit: Int) throws -> [String]
    func viewRows(index indexID: Int64, view: Int, range: ViewRange, skip: Int, limit: Int,
                  countingOffset: Bool) throws -> (offset: Int, rows: [ViewRow])

    // MARK: The mount's own tables (MountTables), committed with the revisions they concern

    func localAttributes(ofDocument id: String) throws -> [String: LocalAttributes]
    func updateLocalAttributes(docID: String, name: String, _ change: (inout LocalAttributes) -> Void) throws -> LocalAttributes?
    func moveLocalAttributes(docID: String, moves: [(from: String, to: String)], toDocument target: String?,
                             removing removed: [String]) throws
    func stage(_ draft: StagedAttachment.Draft) throws -> StagedAttachment
    func restage(_ staged: StagedAttachment, as name: String, expectedDigest: String?) throws -> StagedAttachment
    func stagedAttachments(includingLogs: Bool) throws -> [StagedAttachment]
    /// Saves drafts and forgets the staged files they took in (rows, and `log`'s records), in
    /// one transaction; `whileSaving` has the revisions before it commits.
    func save(_ drafts: [(RevisionDraft, allowConflict: Bool)], unstaging unstaged: [StagedAttachment],
              log: StagingLog?, whileSaving: ([Revision]) -> Void) throws -> [Revision]
    /// Takes in the staging logs of stopped mounts (all but `own`); the rows staged from them.
    func importStoppedStagingLogs(except own: String?) throws -> Set<Int64>
    /// A staging log for a mount writing to this store (MountTables' `StagingLog`), or nil when
    /// its staged files stay in rows (an encrypted store).
    func makeStagingLog() -> StagingLog?
    /// Where the mount keeps files that are not attachments (sealed in an encrypted store).
    func makeScratchFolder() -> ScratchFolder
    func recordPendingSave(_ save: PendingSave) throws
    func removePendingSave(_ id: String)
    func pendingSaves() throws -> [PendingSave]
}

extension Database: MountStore {
    public func makeStagingLog() -> StagingLog? { StagingLog.make(for: self) }

    public func makeScratchFolder() -> ScratchFolder { ScratchFolder(database: self) }

    public func importStoppedStagingLogs(except own: String?) throws -> Set<Int64> {
        try StagingLog.importStopped(into: self, except: own)
    }
}

// The common forms of the calls above.
extension MountStore {
    @discardableResult
    func save(_ draft: RevisionDraft) throws -> Revision { try save(draft, allowConflict: false) }

    /// One draft (or none: only the files go) and the staged files it takes in.
    @discardableResult
    func save(_ draft: RevisionDraft?, allowConflict: Bool = false, unstaging unstaged: [StagedAttachment]) throws -> Revision? {
        try save(draft.map { [($0, allowConflict)] } ?? [], unstaging: unstaged, log: nil, whileSaving: { _ in }).first
    }

    @discardableResult
    func deleteDocument(_ id: String) throws -> Revision { try deleteDocument(id, revID: nil) }

    func changes(since sequence: Int64) throws -> [DocumentStore.Change] { try changes(since: sequence, limit: Int.max) }

    func documents(after afterID: String?, limit: Int) throws -> [DocumentSummary] {
        try documents(after: afterID, including: false, offset: 0, limit: limit, includeDeleted: false, countingConflicts: false)
    }
}
