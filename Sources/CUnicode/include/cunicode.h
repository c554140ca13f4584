#ifndef SOFA_CUNICODE_H
#define SOFA_CUNICODE_H
/* ICU behind plain C functions: Foundation brings its own copy of ICU's headers, and the
   two cannot both be visible to one Swift module. Strings are UTF-8 with their length. */
#include <stdint.h>

/* The Unicode Collation Algorithm with ICU's root collator, as CouchDB orders strings:
   -1, 0 or 1. */
int cunicode_collate(const char *a, int32_t a_length, const char *b, int32_t b_length);

/* The collator's sort key of a string (memcmp order is collate's order), ending with one
   zero byte and holding no other. Returns the length it needs: when that is more than
   capacity, nothing useful was written. Returns -1 for text that is not UTF-8. */
int32_t cunicode_sort_key(const char *text, int32_t length, uint8_t *key, int32_t capacity);

/* The root collator's version as ICU writes it ("153.120"), which CouchDB reports as a view
   index's collator_versions. */
void cunicode_collator_version(char *out, int32_t capacity);

/* A regular expression (ICU syntax), matched with a time limit in ICU's steps of a few
   milliseconds. NULL when the pattern is invalid. One thread at a time per expression. */
void *cunicode_regex_open(const char *pattern, int32_t length, int32_t time_limit);
/* 1: a match somewhere in text; 0: none; -1: the time limit ran out; -2: another error. */
int cunicode_regex_find(void *regex, const char *text, int32_t length);
void cunicode_regex_close(void *regex);

#endif
