/* libFuzzer harness: a mismatch-check header a collective receives from
 * another rank before any data moves, as arbitrary bytes: it must be
 * refused (TIDE_EPROTO), reported as a mismatch that names both calls
 * (TIDE_EMISMATCH), or accepted only when it equals ours.
 *
 * compare_headers() is static in collectives.c, so this file includes it
 * (the fuzz build links every other source of the library). */
#include "../src/coll/collectives.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  header_t theirs, mine = {HEADER_MAGIC, ALLREDUCE, 7, 1000, 0, TIDE_F32, TIDE_SUM, 0, TIDE__ALGO_RING};
  if (size < sizeof theirs) return 0;
  memcpy(&theirs, data, sizeof theirs);
  if (size > sizeof theirs) { /* more bytes: vary our own call too */
    size_t extra = size - sizeof theirs < sizeof mine ? size - sizeof theirs : sizeof mine;
    memcpy(&mine, data + sizeof theirs, extra);
    mine.magic = HEADER_MAGIC;
    if (mine.kind < BARRIER || mine.kind > HITOPK) mine.kind = ALLGATHERV;
  }
  char msg[700];
  memset(msg, 0, sizeof msg);
  int rc = compare_headers(&mine, 0, &theirs, 1, msg, sizeof msg);
  int same = theirs.magic == mine.magic && theirs.kind == mine.kind && theirs.seq == mine.seq &&
             theirs.count == mine.count && theirs.counts_hash == mine.counts_hash && theirs.dtype == mine.dtype &&
             theirs.op == mine.op && theirs.root == mine.root && theirs.algo == mine.algo;
  if ((rc == 0) != same) __builtin_trap();
  if (rc != 0 && rc != TIDE_EPROTO && rc != TIDE_EMISMATCH) __builtin_trap();
  if (rc != 0 && strlen(msg) == 0) __builtin_trap();
  return 0;
}
