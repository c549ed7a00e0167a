/* The allocator hook: every allocation in libtide goes through these. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

static void *(*malloc_hook)(size_t) = malloc;
static void *(*realloc_hook)(void *, size_t) = realloc;
static void *(*calloc_hook)(size_t, size_t) = calloc;
static void (*free_hook)(void *) = free;

int tide_replace_allocator(void *(*malloc_fn)(size_t), void *(*realloc_fn)(void *, size_t),
                           void *(*calloc_fn)(size_t, size_t), void (*free_fn)(void *)) {
  if (malloc_fn == NULL || realloc_fn == NULL || calloc_fn == NULL || free_fn == NULL)
    return TIDE_EINVAL;
  malloc_hook = malloc_fn;
  realloc_hook = realloc_fn;
  calloc_hook = calloc_fn;
  free_hook = free_fn;
  return 0;
}

void *tide__malloc(size_t n) { return malloc_hook(n ? n : 1); }
void *tide__calloc(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) return NULL; /* a replaced calloc may not check */
  return calloc_hook(count ? count : 1, size ? size : 1);
}
void *tide__realloc(void *ptr, size_t n) { return realloc_hook(ptr, n ? n : 1); }

void tide__free(void *ptr) {
  if (ptr != NULL) free_hook(ptr);
}

void tide_free(void *ptr) { tide__free(ptr); }
void *tide_malloc(size_t bytes) { return tide__malloc(bytes); }
void *tide_calloc(size_t count, size_t size) { return tide__calloc(count, size); }

char *tide__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = tide__malloc(n);
  if (copy != NULL) memcpy(copy, s, n);
  return copy;
}
