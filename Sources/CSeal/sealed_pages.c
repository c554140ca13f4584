/* A VFS shim that seals SQLite pages with AES-256-GCM on their way to the disk and opens them
 * on the way back (docs/encryption.md, "SQLite pages").
 *
 * - The main file: every page is sealed whole. Its first 4,064 bytes are the ciphertext; the
 *   32 bytes SQLite reserves at the end of each page hold the 12-byte nonce and the 16-byte
 *   tag. The associated data is the file's role and the page number, so a page moved to
 *   another place fails its tag.
 * - The WAL: the page of each frame is sealed the same way (its associated data: the role
 *   and the frame's offset); the 32-byte log header and the 24-byte frame headers hold only
 *   page numbers, sizes, salts and checksums and are written as they are. SQLite computes a
 *   frame's checksum over the page as it has it; on the way back the reserved bytes read as
 *   zeros, as they are in SQLite's own page buffers (the b-tree never writes them).
 * - A rollback journal is only ever opened to switch a new database to WAL, before it has
 *   pages: a page record written to one is refused, so no page goes to the disk unsealed.
 *   Other files (temporary databases and journals) are refused: the connection keeps them in
 *   memory (PRAGMA temp_store = MEMORY).
 * - A page whose tag fails is SQLITE_IOERR_DATA, never other bytes. The one exception is a
 *   WAL frame read whole (header and page) while SQLite recovers the log: its page then reads
 *   as zeros, which fails the frame's checksum, and SQLite takes the log to end there, as it
 *   does with a frame torn by a crash.
 * - Memory-mapped reads would bypass all this: the file methods are version 2 (no xFetch).
 */
#include "seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#define PAGE SOFA_SEALED_PAGE_SIZE
#define RESERVE SOFA_SEALED_RESERVE
#define SEALED (PAGE - RESERVE)
#define NONCE 12
#define TAG 16
#define WAL_HEADER 32
#define FRAME_HEADER 24
#define FRAME (FRAME_HEADER + PAGE)

typedef struct SealedVfs {
    sqlite3_vfs base;
    sqlite3_vfs *real;
    unsigned char key[32];
    char name[128];
} SealedVfs;

enum { MAIN_FILE = 'D', WAL_FILE = 'W', JOURNAL_FILE = 'J' };

typedef struct SealedFile {
    sqlite3_file base;
    SealedVfs *vfs;
    sofa_gcm *gcm; /* the key set up once for this file's pages (one connection uses a file at a time) */
    int role;
    unsigned char page[PAGE];
    sqlite3_file *real; /* allocated right after this struct */
} SealedFile;

/* The associated data of a page: its file's role and where it is (page number or offset). */
static void associated(unsigned char out[9], int role, sqlite3_int64 where) {
    out[0] = (unsigned char)role;
    for (int i = 0; i < 8; i++) out[1 + i] = (unsigned char)((sqlite3_uint64)where >> (56 - 8 * i));
}

/* Seals `plain` (PAGE bytes) into `out`: ciphertext, nonce, tag, zeros. */
static int seal(SealedFile *f, int role, sqlite3_int64 where, const unsigned char *plain, unsigned char *out) {
    unsigned char aad[9];
    associated(aad, role, where);
    unsigned char *nonce = out + SEALED, *tag = out + SEALED + NONCE;
    memset(out + SEALED + NONCE + TAG, 0, RESERVE - NONCE - TAG);
    return RAND_bytes(nonce, NONCE) == 1 && sofa_gcm_seal(f->gcm, nonce, aad, plain, SEALED, out, tag);
}

/* Opens a sealed page in place; its reserved bytes become zeros. 0 if the tag fails. */
static int unseal(SealedFile *f, int role, sqlite3_int64 where, unsigned char *page) {
    unsigned char aad[9], nonce[NONCE], tag[TAG];
    associated(aad, role, where);
    memcpy(nonce, page + SEALED, NONCE);
    memcpy(tag, page + SEALED + NONCE, TAG);
    int ok = sofa_gcm_open(f->gcm, nonce, aad, page, SEALED, page, tag);
    memset(page + SEALED, 0, RESERVE);
    return ok;
}

#define REAL(file) (((SealedFile *)(file))->real)

/* ---- The main file: whole pages. */

static int readMain(SealedFile *f, unsigned char *out, int amount, sqlite3_int64 offset) {
    sqlite3_int64 size = 0;
    int rc = REAL(f)->pMethods->xFileSize(REAL(f), &size);
    if (rc != SQLITE_OK) return rc;
    int result = SQLITE_OK;
    for (sqlite3_int64 number = offset / PAGE; number * PAGE < offset + amount; number++) {
        sqlite3_int64 start = number * PAGE, from = start > offset ? start : offset;
        sqlite3_int64 end = start + PAGE < offset + amount ? start + PAGE : offset + amount;
        if (start >= size) {
            /* Past the end of the file: zeros, as the unix VFS gives. */
            memset(out + (from - offset), 0, (size_t)(end - from));
            result = SQLITE_IOERR_SHORT_READ;
            continue;
        }
        rc = REAL(f)->pMethods->xRead(REAL(f), f->page, PAGE, start);
        if (rc != SQLITE_OK) return rc == SQLITE_IOERR_SHORT_READ ? SQLITE_IOERR_DATA : rc; /* a torn page */
        if (!unseal(f, MAIN_FILE, number, f->page)) {
            sqlite3_log(SQLITE_IOERR_DATA, "sealed page %lld of a database fails its tag: wrong key or damaged", number + 1);
            return SQLITE_IOERR_DATA;
        }
        memcpy(out + (from - offset), f->page + (from - start), (size_t)(end - from));
    }
    return result;
}

static int writeMain(SealedFile *f, const unsigned char *in, int amount, sqlite3_int64 offset) {
    if (offset % PAGE != 0 || amount % PAGE != 0) {
        sqlite3_log(SQLITE_IOERR_WRITE, "a write of %d bytes at %lld is not whole sealed pages", amount, offset);
        return SQLITE_IOERR_WRITE;
    }
    for (int done = 0; done < amount; done += PAGE) {
        if (!seal(f, MAIN_FILE, (offset + done) / PAGE, in + done, f->page)) return SQLITE_IOERR_WRITE;
        int rc = REAL(f)->pMethods->xWrite(REAL(f), f->page, PAGE, offset + done);
        if (rc != SQLITE_OK) return rc;
    }
    return SQLITE_OK;
}

/* ---- The WAL: a 32-byte header, then frames of a 24-byte header and a page. */

/* The frame holding `offset` (which must be past the log header). */
static sqlite3_int64 frameOf(sqlite3_int64 offset) { return (offset - WAL_HEADER) / FRAME; }
static sqlite3_int64 pageStartOf(sqlite3_int64 frame) { return WAL_HEADER + frame * FRAME + FRAME_HEADER; }

static int readWal(SealedFile *f, unsigned char *out, int amount, sqlite3_int64 offset) {
    int rc = REAL(f)->pMethods->xRead(REAL(f), out, amount, offset);
    if (rc != SQLITE_OK && rc != SQLITE_IOERR_SHORT_READ) return rc;
    int result = rc;
    sqlite3_int64 end = offset + amount, size = 0;
    if (end <= WAL_HEADER) return result;
    rc = REAL(f)->pMethods->xFileSize(REAL(f), &size);
    if (rc != SQLITE_OK) return rc;
    for (sqlite3_int64 frame = frameOf(offset > WAL_HEADER ? offset : WAL_HEADER); pageStartOf(frame) - FRAME_HEADER < end; frame++) {
        sqlite3_int64 start = pageStartOf(frame), from = start > offset ? start : offset;
        sqlite3_int64 to = start + PAGE < end ? start + PAGE : end;
        /* Nothing of this page asked for, or the page runs past the end of the log (torn by a
         * crash: what was read of it fails the frame's checksum, as SQLite expects). */
        if (from >= to || start + PAGE > size) continue;
        if (start >= offset && start + PAGE <= end) {
            memcpy(f->page, out + (start - offset), PAGE);
        } else {
            rc = REAL(f)->pMethods->xRead(REAL(f), f->page, PAGE, start);
            if (rc != SQLITE_OK) return rc == SQLITE_IOERR_SHORT_READ ? SQLITE_IOERR_DATA : rc;
        }
        if (!unseal(f, WAL_FILE, start, f->page)) {
            int recovering = offset <= start - FRAME_HEADER; /* the frame's header read with it */
            if (!recovering) {
                sqlite3_log(SQLITE_IOERR_DATA, "sealed page of the WAL at %lld fails its tag: wrong key or damaged", start);
                return SQLITE_IOERR_DATA;
            }
            sqlite3_log(SQLITE_NOTICE, "sealed page of the WAL at %lld fails its tag: the log ends before it", start);
        }
        memcpy(out + (from - offset), f->page + (from - start), (size_t)(to - from));
    }
    return result;
}

static int writeWal(SealedFile *f, const unsigned char *in, int amount, sqlite3_int64 offset) {
    sqlite3_int64 end = offset + amount;
    if (end <= WAL_HEADER) return REAL(f)->pMethods->xWrite(REAL(f), in, amount, offset);
    /* Pieces in order: headers as they are, pages sealed; a piece of a page is refused. */
    sqlite3_int64 at = offset;
    while (at < end) {
        if (at < WAL_HEADER) {
            int rc = REAL(f)->pMethods->xWrite(REAL(f), in + (at - offset), (int)(WAL_HEADER - at), at);
            if (rc != SQLITE_OK) return rc;
            at = WAL_HEADER;
            continue;
        }
        sqlite3_int64 start = pageStartOf(frameOf(at));
        if (at < start) {
            sqlite3_int64 to = start < end ? start : end;
            int rc = REAL(f)->pMethods->xWrite(REAL(f), in + (at - offset), (int)(to - at), at);
            if (rc != SQLITE_OK) return rc;
            at = to;
            continue;
        }
        if (at != start || start + PAGE > end) {
            sqlite3_log(SQLITE_IOERR_WRITE, "a write of %d bytes at %lld holds part of a WAL page", amount, offset);
            return SQLITE_IOERR_WRITE;
        }
        const unsigned char *plain = in + (at - offset);
        for (int i = SEALED; i < PAGE; i++) {
            if (plain[i] != 0) {
                /* Its checksum would cover bytes the seal replaces: refused rather than lost. */
                sqlite3_log(SQLITE_IOERR_WRITE, "a WAL page at %lld has data in its reserved bytes", at);
                return SQLITE_IOERR_WRITE;
            }
        }
        if (!seal(f, WAL_FILE, at, plain, f->page)) return SQLITE_IOERR_WRITE;
        int rc = REAL(f)->pMethods->xWrite(REAL(f), f->page, PAGE, at);
        if (rc != SQLITE_OK) return rc;
        at += PAGE;
    }
    return SQLITE_OK;
}

/* ---- The file methods. */

static int sealedClose(sqlite3_file *file) {
    SealedFile *f = (SealedFile *)file;
    OPENSSL_cleanse(f->page, PAGE);
    sofa_gcm_free(f->gcm);
    f->gcm = NULL;
    return REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
}

static int sealedRead(sqlite3_file *file, void *out, int amount, sqlite3_int64 offset) {
    SealedFile *f = (SealedFile *)file;
    switch (f->role) {
    case MAIN_FILE: return readMain(f, out, amount, offset);
    case WAL_FILE: return readWal(f, out, amount, offset);
    default: return REAL(f)->pMethods->xRead(REAL(f), out, amount, offset);
    }
}

static int sealedWrite(sqlite3_file *file, const void *in, int amount, sqlite3_int64 offset) {
    SealedFile *f = (SealedFile *)file;
    switch (f->role) {
    case MAIN_FILE: return writeMain(f, in, amount, offset);
    case WAL_FILE: return writeWal(f, in, amount, offset);
    default:
        if (amount >= PAGE && offset > 0) {
            sqlite3_log(SQLITE_IOERR_WRITE, "a page record for a rollback journal is refused: sealed databases use WAL");
            return SQLITE_IOERR_WRITE;
        }
        return REAL(f)->pMethods->xWrite(REAL(f), in, amount, offset);
    }
}

static int sealedTruncate(sqlite3_file *f, sqlite3_int64 size) { return REAL(f)->pMethods->xTruncate(REAL(f), size); }
static int sealedSync(sqlite3_file *f, int flags) { return REAL(f)->pMethods->xSync(REAL(f), flags); }
static int sealedFileSize(sqlite3_file *f, sqlite3_int64 *size) { return REAL(f)->pMethods->xFileSize(REAL(f), size); }
static int sealedLock(sqlite3_file *f, int level) { return REAL(f)->pMethods->xLock(REAL(f), level); }
static int sealedUnlock(sqlite3_file *f, int level) { return REAL(f)->pMethods->xUnlock(REAL(f), level); }
static int sealedCheckReservedLock(sqlite3_file *f, int *out) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out); }
static int sealedSectorSize(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int sealedDeviceCharacteristics(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int sealedShmMap(sqlite3_file *f, int region, int size, int extend, void volatile **out) {
    return REAL(f)->pMethods->xShmMap(REAL(f), region, size, extend, out);
}
static int sealedShmLock(sqlite3_file *f, int offset, int n, int flags) { return REAL(f)->pMethods->xShmLock(REAL(f), offset, n, flags); }
static void sealedShmBarrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int sealedShmUnmap(sqlite3_file *f, int delete) { return REAL(f)->pMethods->xShmUnmap(REAL(f), delete); }

static int sealedFileControl(sqlite3_file *f, int op, void *argument) {
    if (op == SQLITE_FCNTL_MMAP_SIZE) {
        /* Mapped pages would be read unopened: no mapping. */
        *(sqlite3_int64 *)argument = 0;
        return SQLITE_OK;
    }
    return REAL(f)->pMethods->xFileControl(REAL(f), op, argument);
}

static const sqlite3_io_methods sealedMethods = {
    2, sealedClose, sealedRead, sealedWrite, sealedTruncate, sealedSync, sealedFileSize, sealedLock, sealedUnlock,
    sealedCheckReservedLock, sealedFileControl, sealedSectorSize, sealedDeviceCharacteristics,
    sealedShmMap, sealedShmLock, sealedShmBarrier, sealedShmUnmap, NULL, NULL,
};

/* ---- The VFS. */

static int sealedOpen(sqlite3_vfs *base, sqlite3_filename name, sqlite3_file *file, int flags, int *outFlags) {
    SealedVfs *vfs = (SealedVfs *)base;
    SealedFile *f = (SealedFile *)file;
    memset(f, 0, sizeof *f);
    f->real = (sqlite3_file *)&f[1];
    if (flags & SQLITE_OPEN_MAIN_DB) f->role = MAIN_FILE;
    else if (flags & SQLITE_OPEN_WAL) f->role = WAL_FILE;
    else if (flags & SQLITE_OPEN_MAIN_JOURNAL) f->role = JOURNAL_FILE;
    else {
        sqlite3_log(SQLITE_CANTOPEN, "a sealed database opens no temporary file (flags %x): PRAGMA temp_store = MEMORY", flags);
        return SQLITE_CANTOPEN;
    }
    f->vfs = vfs;
    int rc = vfs->real->xOpen(vfs->real, name, f->real, flags, outFlags);
    if (rc != SQLITE_OK) {
        f->real->pMethods = NULL;
        return rc;
    }
    f->gcm = sofa_gcm_new(vfs->key);
    if (f->gcm == NULL) {
        f->real->pMethods->xClose(f->real);
        f->real->pMethods = NULL;
        return SQLITE_NOMEM;
    }
    f->base.pMethods = &sealedMethods;
    return SQLITE_OK;
}

static int sealedDelete(sqlite3_vfs *v, const char *name, int sync) { SealedVfs *s = (SealedVfs *)v; return s->real->xDelete(s->real, name, sync); }
static int sealedAccess(sqlite3_vfs *v, const char *name, int flags, int *out) { SealedVfs *s = (SealedVfs *)v; return s->real->xAccess(s->real, name, flags, out); }
static int sealedFullPathname(sqlite3_vfs *v, const char *name, int size, char *out) {
    SealedVfs *s = (SealedVfs *)v;
    return s->real->xFullPathname(s->real, name, size, out);
}
static void *sealedDlOpen(sqlite3_vfs *v, const char *name) { SealedVfs *s = (SealedVfs *)v; return s->real->xDlOpen(s->real, name); }
static void sealedDlError(sqlite3_vfs *v, int size, char *out) { SealedVfs *s = (SealedVfs *)v; s->real->xDlError(s->real, size, out); }
static void (*sealedDlSym(sqlite3_vfs *v, void *handle, const char *symbol))(void) {
    SealedVfs *s = (SealedVfs *)v;
    return s->real->xDlSym(s->real, handle, symbol);
}
static void sealedDlClose(sqlite3_vfs *v, void *handle) { SealedVfs *s = (SealedVfs *)v; s->real->xDlClose(s->real, handle); }
static int sealedRandomness(sqlite3_vfs *v, int size, char *out) { SealedVfs *s = (SealedVfs *)v; return s->real->xRandomness(s->real, size, out); }
static int sealedSleep(sqlite3_vfs *v, int micro) { SealedVfs *s = (SealedVfs *)v; return s->real->xSleep(s->real, micro); }
static int sealedCurrentTime(sqlite3_vfs *v, double *out) { SealedVfs *s = (SealedVfs *)v; return s->real->xCurrentTime(s->real, out); }
static int sealedGetLastError(sqlite3_vfs *v, int size, char *out) { SealedVfs *s = (SealedVfs *)v; return s->real->xGetLastError(s->real, size, out); }
static int sealedCurrentTimeInt64(sqlite3_vfs *v, sqlite3_int64 *out) {
    SealedVfs *s = (SealedVfs *)v;
    return s->real->xCurrentTimeInt64(s->real, out);
}

int sofa_sealed_vfs_register(const char *name, const unsigned char *key) {
    int rc = sqlite3_initialize();
    if (rc != SQLITE_OK) return rc;
    sqlite3_vfs *real = sqlite3_vfs_find(NULL);
    if (real == NULL || strlen(name) >= sizeof ((SealedVfs *)0)->name) return SQLITE_MISUSE;
    SealedVfs *vfs = calloc(1, sizeof *vfs);
    if (vfs == NULL) return SQLITE_NOMEM;
    strcpy(vfs->name, name);
    memcpy(vfs->key, key, 32);
    vfs->real = real;
    static const sqlite3_vfs methods = {
        .iVersion = 2, .xOpen = sealedOpen, .xDelete = sealedDelete, .xAccess = sealedAccess,
        .xFullPathname = sealedFullPathname, .xDlOpen = sealedDlOpen, .xDlError = sealedDlError, .xDlSym = sealedDlSym,
        .xDlClose = sealedDlClose, .xRandomness = sealedRandomness, .xSleep = sealedSleep, .xCurrentTime = sealedCurrentTime,
        .xGetLastError = sealedGetLastError, .xCurrentTimeInt64 = sealedCurrentTimeInt64,
    };
    vfs->base = methods;
    vfs->base.szOsFile = (int)sizeof(SealedFile) + real->szOsFile;
    vfs->base.mxPathname = real->mxPathname;
    vfs->base.zName = vfs->name;
    rc = sqlite3_vfs_register(&vfs->base, 0);
    if (rc != SQLITE_OK) {
        OPENSSL_cleanse(vfs->key, sizeof vfs->key);
        free(vfs);
    }
    return rc;
}

int sofa_sealed_vfs_unregister(const char *name) {
    sqlite3_vfs *found = sqlite3_vfs_find(name);
    if (found == NULL || found->xOpen != sealedOpen) return SQLITE_NOTFOUND;
    int rc = sqlite3_vfs_unregister(found);
    if (rc != SQLITE_OK) return rc;
    SealedVfs *vfs = (SealedVfs *)found;
    OPENSSL_cleanse(vfs->key, sizeof vfs->key);
    free(vfs);
    return SQLITE_OK;
}
