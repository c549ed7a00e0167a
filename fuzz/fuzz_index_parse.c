/* libFuzzer harness: index.txt as arbitrary bytes (what an HTTP server or a
 * shared directory hands the loader). parse_index must refuse it
 * (TIDE_EINVAL) or return a listing the loader can trust: at least one
 * sample, every label a listed class, and in a sharded index (version 2)
 * every sample inside a listed shard, the shards' samples consecutive.
 *
 * parse_index() is static in source.c, so this file includes it (the fuzz
 * build links every other source of the library). */
#include "../src/data/source.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > (1u << 20)) return 0;
  char *text = malloc(size + 1);
  if (text == NULL) return 0;
  memcpy(text, data, size);
  text[size] = '\0'; /* the loader NUL-terminates what it read */
  tide__source_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) {
    free(text);
    return 0;
  }
  int rc = parse_index(s, text, "fuzz/index.txt");
  if (rc != 0 && rc != TIDE_EINVAL && rc != TIDE_ENOMEM) __builtin_trap();
  if (rc == 0) {
    if (s->count == 0 || s->count > MAX_ITEMS) __builtin_trap();
    for (size_t i = 0; i < s->count; i++) {
      const tide__item_t *it = &s->items[i];
      if (it->label < 0 || (size_t)it->label >= s->nclasses || it->path == NULL || it->path[0] == '\0')
        __builtin_trap();
      if (s->nshards > 0) {
        if (it->shard < 0 || (uint64_t)it->shard >= s->nshards) __builtin_trap();
        const tide__shard_t *sh = &s->shards[it->shard];
        if (it->offset > sh->size || it->size > sh->size - it->offset) __builtin_trap();
        if (i < sh->first || i >= sh->first + sh->count) __builtin_trap();
      }
    }
    for (size_t k = 0; k < s->nclasses; k++)
      if (s->classes[k] == NULL) __builtin_trap();
  }
  tide__source_close(s);
  free(text);
  return 0;
}
