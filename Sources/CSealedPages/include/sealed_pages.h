#ifndef SOFA_SEALED_PAGES_H
#define SOFA_SEALED_PAGES_H

/* An SQLite VFS over the default one that keeps a database's pages sealed with AES-256-GCM
 * (OpenSSL): the main file and its WAL. See docs/encryption.md. */

/* Every page is this size, with this many bytes of each kept for the seal (a database sealed
 * by this VFS is made with PRAGMA page_size and SQLITE_FCNTL_RESERVE_BYTES set to these). */
#define SOFA_SEALED_PAGE_SIZE 4096
#define SOFA_SEALED_RESERVE 32

/* Registers a VFS called `name` (not the default) whose files are sealed with `key`, 32 bytes,
 * which it copies. Returns an SQLite result code. */
int sofa_sealed_vfs_register(const char *name, const unsigned char *key);

/* Unregisters the VFS called `name` and wipes its key; no connection may still use it. */
int sofa_sealed_vfs_unregister(const char *name);

#endif
