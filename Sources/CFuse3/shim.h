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

/* FUSE passthrough (Linux 6.9, protocol 7.40), which libfuse 3.14 predates: the ioctls of
   include/uapi/linux/fuse.h. FUSE_DEV_IOC_BACKING_OPEN = _IOW(229, 1, struct fuse_backing_map)
   registers a file the kernel may read directly and returns its backing id;
   FUSE_DEV_IOC_BACKING_CLOSE = _IOW(229, 2, uint32_t) releases it. */
#include <stdint.h>
#include <sys/ioctl.h>
struct cfuse_backing_map { int32_t fd; uint32_t flags; uint64_t padding; };
static inline int cfuse_backing_open(int device, int fd) {
    struct cfuse_backing_map map = { fd, 0, 0 };
    return ioctl(device, _IOW(229, 1, struct cfuse_backing_map), &map);
}
static inline int cfuse_backing_close(int device, int32_t id) {
    uint32_t backing = (uint32_t)id;
    return ioctl(device, _IOW(229, 2, uint32_t), &backing);
}
#endif
