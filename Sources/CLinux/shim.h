// Linux calls that Swift's Glibc module leaves out (they need _GNU_SOURCE).
#pragma once

// Flushes every file of the file system that holds `fd` (one journal commit instead of one
// per file): a staged copy of a database is made durable this way before it is renamed.
extern int syncfs(int fd);
