#ifndef SOFA_CFUSE3_SHIM_H
#define SOFA_CFUSE3_SHIM_H
#define FUSE_USE_VERSION 35
#include <fuse_lowlevel.h>
#include <sys/mount.h>

/* fuse_file_info's flags are bit-fields. */
static inline void cfuse_set_keep_cache(struct fuse_file_info *fi, int keep) { fi->keep_cache = keep ? 1 : 0; }
static inline void cfuse_set_direct_io(struct fuse_file_info *fi, int direct) { fi->direct_io = direct ? 1 : 0; }
static inline void cfuse_set_cache_readdir(struct fuse_file_info *fi, int value) { fi->cache_readdir = value ? 1 : 0; }
static inline void cfuse_set_noflush(struct fuse_file_info *fi, int value) { fi->noflush = value ? 1 : 0; }
#endif
