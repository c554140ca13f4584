#include "cunicode.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unicode/ucol.h>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>
#include <unicode/uversion.h>

static UCollator *root_collator;
static pthread_once_t collator_once = PTHREAD_ONCE_INIT;

static void open_collator(void) {
    UErrorCode status = U_ZERO_ERROR;
    root_collator = ucol_open("", &status);
    if (U_FAILURE(status)) abort();
}

static const UCollator *collator(void) {
    pthread_once(&collator_once, open_collator);
    return root_collator;
}

int cunicode_collate(const char *a, int32_t a_length, const char *b, int32_t b_length) {
    UErrorCode status = U_ZERO_ERROR;
    UCollationResult result = ucol_strcollUTF8(collator(), a, a_length, b, b_length, &status);
    return U_FAILURE(status) ? 0 : (int)result;
}

void cunicode_collator_version(char *out, int32_t capacity) {
    UVersionInfo version;
    char text[U_MAX_VERSION_STRING_LENGTH];
    ucol_getVersion(collator(), version);
    u_versionToString(version, text);
    snprintf(out, (size_t)capacity, "%s", text);
}

int32_t cunicode_sort_key(const char *text, int32_t length, uint8_t *key, int32_t capacity) {
    UChar stack[256];
    UChar *utf16 = stack;
    int32_t needed = 0;
    UErrorCode status = U_ZERO_ERROR;
    u_strFromUTF8(utf16, 256, &needed, text, length, &status);
    if (status == U_BUFFER_OVERFLOW_ERROR) {
        utf16 = malloc(sizeof(UChar) * (size_t)needed);
        if (!utf16) return -1;
        status = U_ZERO_ERROR;
        u_strFromUTF8(utf16, needed, NULL, text, length, &status);
    }
    int32_t result = U_FAILURE(status) ? -1 : ucol_getSortKey(collator(), utf16, needed, key, capacity);
    if (utf16 != stack) free(utf16);
    return result;
}

void *cunicode_regex_open(const char *pattern, int32_t length, int32_t time_limit) {
    UErrorCode status = U_ZERO_ERROR;
    UText *text = utext_openUTF8(NULL, pattern, length, &status);
    URegularExpression *regex = uregex_openUText(text, 0, NULL, &status);
    utext_close(text);
    if (U_FAILURE(status)) {
        if (regex) uregex_close(regex);
        return NULL;
    }
    uregex_setTimeLimit(regex, time_limit, &status);
    return regex;
}

int cunicode_regex_find(void *regex, const char *text, int32_t length) {
    UErrorCode status = U_ZERO_ERROR;
    UText utext = UTEXT_INITIALIZER;
    utext_openUTF8(&utext, text, length, &status);
    uregex_setUText(regex, &utext, &status);
    if (U_FAILURE(status)) {
        utext_close(&utext);
        return -2;
    }
    /* The expression keeps a shallow copy of the text until the next call sets another. */
    UBool found = uregex_find(regex, 0, &status);
    utext_close(&utext);
    if (status == U_REGEX_TIME_OUT) return -1;
    return U_FAILURE(status) ? -2 : (found ? 1 : 0);
}

void cunicode_regex_close(void *regex) {
    uregex_close(regex);
}
