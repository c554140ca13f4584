#ifndef SOFA_CZLIB_SHIM_H
#define SOFA_CZLIB_SHIM_H
#include <zlib.h>

// inflateInit2 is a macro; Swift cannot call it directly.
static inline int cz_inflate_init_gzip(z_stream *stream) {
    return inflateInit2(stream, 15 + 32);  // gzip or zlib, detected from the header
}
#endif
