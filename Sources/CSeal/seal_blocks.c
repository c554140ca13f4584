/* AES-256-GCM over one block, HKDF-SHA256, HMAC-SHA256 and scrypt, all OpenSSL's (docs/encryption.md). */
#include "seal.h"

#include <pthread.h>
#include <stdint.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>

#define NONCE 12
#define TAG 16

struct sofa_gcm {
    EVP_CIPHER_CTX *seal;
    EVP_CIPHER_CTX *open;
};

static EVP_CIPHER_CTX *keyed(const unsigned char *key, int encrypt) {
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx != NULL
        && EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, encrypt) == 1
        && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, NONCE, NULL) == 1
        && EVP_CipherInit_ex(ctx, NULL, NULL, key, NULL, encrypt) == 1) return ctx;
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
}

sofa_gcm *sofa_gcm_new(const unsigned char *key) {
    sofa_gcm *gcm = OPENSSL_zalloc(sizeof *gcm);
    if (gcm == NULL) return NULL;
    gcm->seal = keyed(key, 1);
    gcm->open = keyed(key, 0);
    if (gcm->seal == NULL || gcm->open == NULL) {
        sofa_gcm_free(gcm);
        return NULL;
    }
    return gcm;
}

void sofa_gcm_free(sofa_gcm *gcm) {
    if (gcm == NULL) return;
    EVP_CIPHER_CTX_free(gcm->seal);  /* frees (and cleanses) the key schedule */
    EVP_CIPHER_CTX_free(gcm->open);
    OPENSSL_free(gcm);
}

/* A new message under the context's key: only the nonce is set again. */
static int run(EVP_CIPHER_CTX *ctx, int encrypt, const unsigned char *nonce, const unsigned char *aad,
               const unsigned char *in, int length, unsigned char *out, unsigned char *tag) {
    int written = 0;
    int ok = EVP_CipherInit_ex(ctx, NULL, NULL, NULL, nonce, encrypt) == 1
        && EVP_CipherUpdate(ctx, NULL, &written, aad, 9) == 1
        && (length == 0 || (EVP_CipherUpdate(ctx, out, &written, in, length) == 1 && written == length))
        && (encrypt || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, TAG, tag) == 1)
        && EVP_CipherFinal_ex(ctx, out + (length == 0 ? 0 : written), &written) == 1
        && (!encrypt || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, TAG, tag) == 1);
    if (!ok && !encrypt && length > 0) OPENSSL_cleanse(out, (size_t)length);
    return ok;
}

int sofa_gcm_seal(sofa_gcm *gcm, const unsigned char *nonce, const unsigned char *aad,
                  const unsigned char *in, int length, unsigned char *out, unsigned char *tag) {
    return run(gcm->seal, 1, nonce, aad, in, length, out, tag);
}

int sofa_gcm_open(sofa_gcm *gcm, const unsigned char *nonce, const unsigned char *aad,
                  const unsigned char *in, int length, unsigned char *out, const unsigned char *tag) {
    unsigned char expected[TAG];
    for (int i = 0; i < TAG; i++) expected[i] = tag[i];
    return run(gcm->open, 0, nonce, aad, in, length, out, expected);
}

int sofa_seal(const unsigned char *key, const unsigned char *nonce, const unsigned char *aad,
              const unsigned char *in, int length, unsigned char *out, unsigned char *tag) {
    EVP_CIPHER_CTX *ctx = keyed(key, 1);
    int ok = ctx != NULL && run(ctx, 1, nonce, aad, in, length, out, tag);
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

int sofa_unseal(const unsigned char *key, const unsigned char *nonce, const unsigned char *aad,
                const unsigned char *in, int length, unsigned char *out, const unsigned char *tag) {
    unsigned char expected[TAG];
    for (int i = 0; i < TAG; i++) expected[i] = tag[i];
    EVP_CIPHER_CTX *ctx = keyed(key, 0);
    int ok = ctx != NULL && run(ctx, 0, nonce, aad, in, length, out, expected);
    if (ctx == NULL && length > 0) OPENSSL_cleanse(out, (size_t)length);
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

int sofa_derive_key(const unsigned char *key, const unsigned char *salt, int saltLength,
                    const unsigned char *info, int infoLength, unsigned char *out) {
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t length = 32;
    int ok = ctx != NULL
        && EVP_PKEY_derive_init(ctx) > 0
        && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0
        && EVP_PKEY_CTX_set1_hkdf_salt(ctx, salt, saltLength) > 0
        && EVP_PKEY_CTX_set1_hkdf_key(ctx, key, 32) > 0
        && EVP_PKEY_CTX_add1_hkdf_info(ctx, info, infoLength) > 0
        && EVP_PKEY_derive(ctx, out, &length) > 0
        && length == 32;
    EVP_PKEY_CTX_free(ctx);
    return ok;
}

int sofa_scrypt(const unsigned char *passphrase, int passphraseLength, const unsigned char *salt, int saltLength,
                unsigned long long n, unsigned int r, unsigned int p, unsigned char *out) {
    /* The memory scrypt needs is 128 * n * r bytes; OpenSSL refuses more than 32 MiB unless told. */
    uint64_t memory = 128ULL * n * r * (p + 1) + (1ULL << 20);
    return EVP_PBE_scrypt((const char *)passphrase, (size_t)passphraseLength, salt, (size_t)saltLength,
                          n, r, p, memory, out, 32) == 1;
}

int sofa_hmac_sha256(const unsigned char *key, const unsigned char *message, int length, unsigned char *out) {
    unsigned int written = 0;
    return HMAC(EVP_sha256(), key, 32, message, (size_t)length, out, &written) != NULL && written == 32;
}

/* AES-256-SIV (RFC 5297, OpenSSL 3's): deterministic authenticated encryption, for names.
 * A context is made per call: SIV takes one message per initialisation, and names are short. */
static EVP_CIPHER *siv_cipher;
static pthread_once_t siv_once = PTHREAD_ONCE_INIT;
static void siv_fetch(void) { siv_cipher = EVP_CIPHER_fetch(NULL, "AES-256-SIV", NULL); }

static EVP_CIPHER_CTX *siv(const unsigned char *key, int encrypt) {
    pthread_once(&siv_once, siv_fetch);
    if (siv_cipher == NULL) return NULL;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    if (ctx != NULL && EVP_CipherInit_ex2(ctx, siv_cipher, key, NULL, encrypt, NULL) == 1) return ctx;
    EVP_CIPHER_CTX_free(ctx);
    return NULL;
}

int sofa_siv_seal(const unsigned char *key, const unsigned char *in, int length, unsigned char *out) {
    EVP_CIPHER_CTX *ctx = siv(key, 1);
    if (ctx == NULL) return 0;
    int written = 0, final = 0;
    int ok = EVP_EncryptUpdate(ctx, out + TAG, &written, in, length) == 1 && written == length
        && EVP_EncryptFinal_ex(ctx, out + TAG + written, &final) == 1
        && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_GET_TAG, TAG, out) == 1;
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

int sofa_siv_open(const unsigned char *key, const unsigned char *in, int length, unsigned char *out) {
    if (length < TAG) return 0;
    EVP_CIPHER_CTX *ctx = siv(key, 0);
    if (ctx == NULL) return 0;
    int written = 0, final = 0;
    int ok = EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)in) == 1
        && EVP_DecryptUpdate(ctx, out, &written, in + TAG, length - TAG) == 1
        && EVP_DecryptFinal_ex(ctx, out + written, &final) == 1;
    EVP_CIPHER_CTX_free(ctx);
    if (!ok) OPENSSL_cleanse(out, (size_t)(length - TAG));
    return ok;
}
