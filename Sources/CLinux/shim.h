// Linux calls that Swift's Glibc module leaves out (they need _GNU_SOURCE).
#pragma once

// Flushes every file of the file system that holds `fd` (one journal commit instead of one
// per file): a staged copy of a database is made durable this way before it is renamed.
extern int syncfs(int fd);

// Starts writing a file's dirty pages in a range to disk without waiting (flags:
// SYNC_FILE_RANGE_WRITE = 2), so that a later fsync finds little left to do.
extern int sync_file_range(int fd, long long offset, long long count, unsigned int flags);

// Makes a pipe whose two ends are closed on exec (flags: O_CLOEXEC), so that a child started
// for one query server does not hold another's pipe open.
extern int pipe2(int fds[2], int flags);

// Renames with flags (RENAME_EXCHANGE = 2 swaps two paths atomically): `sofa encrypt` and
// `sofa decrypt` swap the rewritten database folder with the original in one step.
extern int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);

// Gives the memory glibc's allocator holds free, in every arena, back to the system
// (madvise of free pages): after a view build parsed and wrote rows of megabytes, the
// process kept 140 MB it no longer used.
extern int malloc_trim(unsigned long pad);
