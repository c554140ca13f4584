#ifndef SOFA_SEAL_H
#define SOFA_SEAL_H

/* Sealing with AES-256-GCM (OpenSSL) at rest; see docs/encryption.md.
 * - sealed_pages.c: an SQLite VFS over the default one that keeps a database's pages sealed:
 *   the main file and its WAL.
 * - seal_blocks.c: blocks of a blob's body, and the keys derived for them. */

/* Every page is this size, with this many bytes of each kept for the seal (a database sealed
 * by this VFS is made with PRAGMA page_size and SQLITE_FCNTL_RESERVE_BYTES set to these). */
#define SOFA_SEALED_PAGE_SIZE 4096
#define SOFA_SEALED_RESERVE 32

/* Registers a VFS called `name` (not the default) whose files are sealed with `key`, 32 bytes,
 * which it copies. Returns an SQLite result code. */
int sofa_sealed_vfs_register(const char *name, const unsigned char *key);

/* Unregisters the VFS called `name` and wipes its key; no connection may still use it. */
int sofa_sealed_vfs_unregister(const char *name);

/* Seals `length` bytes of `in` into `out` (the same length; they may be the same buffer)
 * under `key` (32 bytes) with a 12-byte `nonce` and 9 bytes of associated data, writing the
 * 16-byte `tag`. Returns 1, or 0 if OpenSSL failed. */
int sofa_seal(const unsigned char *key, const unsigned char *nonce, const unsigned char *aad,
              const unsigned char *in, int length, unsigned char *out, unsigned char *tag);

/* Opens what `sofa_seal` sealed; returns 1, or 0 if the tag fails (then `out` holds zeros). */
int sofa_unseal(const unsigned char *key, const unsigned char *nonce, const unsigned char *aad,
                const unsigned char *in, int length, unsigned char *out, const unsigned char *tag);

/* One key's AES-256-GCM, set up once for many blocks (the key schedule is the costly part):
 * `sofa_gcm_new` copies `key` (32 bytes) and returns NULL if OpenSSL failed; one thread at a
 * time. `sofa_gcm_seal` and `sofa_gcm_open` are `sofa_seal` and `sofa_unseal` with it. */
typedef struct sofa_gcm sofa_gcm;
sofa_gcm *sofa_gcm_new(const unsigned char *key);
void sofa_gcm_free(sofa_gcm *gcm);
int sofa_gcm_seal(sofa_gcm *gcm, const unsigned char *nonce, const unsigned char *aad,
                  const unsigned char *in, int length, unsigned char *out, unsigned char *tag);
int sofa_gcm_open(sofa_gcm *gcm, const unsigned char *nonce, const unsigned char *aad,
                  const unsigned char *in, int length, unsigned char *out, const unsigned char *tag);

/* HKDF-SHA256 (RFC 5869, OpenSSL's): 32 bytes into `out` from `key` (32 bytes), `salt` and
 * `info`. Returns 1, or 0 if OpenSSL failed. */
int sofa_derive_key(const unsigned char *key, const unsigned char *salt, int saltLength,
                    const unsigned char *info, int infoLength, unsigned char *out);

/* scrypt (RFC 7914, OpenSSL's): 32 bytes into `out` from `passphrase` and `salt` with cost `n`
 * (a power of two), block size `r` and parallelism `p`. Returns 1, or 0 if OpenSSL failed (out of
 * memory, or parameters it refuses). */
int sofa_scrypt(const unsigned char *passphrase, int passphraseLength, const unsigned char *salt, int saltLength,
                unsigned long long n, unsigned int r, unsigned int p, unsigned char *out);

/* HMAC-SHA256 of `message` under `key` (32 bytes) into `out` (32 bytes). Returns 1 or 0. */
int sofa_hmac_sha256(const unsigned char *key, const unsigned char *message, int length, unsigned char *out);

/* AES-256-SIV under `key` (64 bytes): `sofa_siv_seal` writes the 16-byte tag then `length`
 * bytes of ciphertext to `out`; `sofa_siv_open` takes that (`length` counts the tag) and writes
 * `length - 16` bytes. Equal inputs seal equally (names are looked up by their sealed form).
 * Return 1, or 0 if OpenSSL failed or the tag does not match (then `out` holds zeros). */
int sofa_siv_seal(const unsigned char *key, const unsigned char *in, int length, unsigned char *out);
int sofa_siv_open(const unsigned char *key, const unsigned char *in, int length, unsigned char *out);

#endif
