#ifndef SOFA_CGZIP_SHIM_H
#define SOFA_CGZIP_SHIM_H
#include <zlib.h>

// inflateInit2 and deflateInit2 are macros; Swift cannot call them directly.
static inline int cz_inflate_init_gzip(z_stream *stream) {
    return inflateInit2(stream, 15 + 32);  // gzip or zlib, detected from the header
}

// Raw inflate (no header), as BLIP's compressed frames hold it.
static inline int cz_inflate_init_raw(z_stream *stream) {
    return inflateInit2(stream, -15);
}

// Raw deflate (no zlib or gzip header), as zip entries hold it.
static inline int cz_deflate_init_raw(z_stream *stream, int level) {
    return deflateInit2(stream, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
}

// gzip-wrapped deflate with zlib's default window and memory, as CouchDB's couch_stream
// compresses attachment bodies (zlib:deflateInit(Z, Level, deflated, 31, 8, default)).
static inline int cz_deflate_init_gzip(z_stream *stream, int level) {
    return deflateInit2(stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
}
#endif
