/* Threads for the selectors: TIDE_NUM_THREADS, a fork-join runner that
 * starts threads per call, and the even split of a range between them.
 *
 * Per-call threads cost ~50 us each to start and join; the selectors use
 * them only when every thread gets TIDE__GRAIN elements or more, where a
 * pass takes milliseconds. A persistent pool would save that start-up but
 * would need a lifetime and a shutdown the pure kernels do not otherwise
 * have. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "compress/compress.h"

#define MAX_THREADS TIDE__MAX_THREADS

int tide__compress_threads(int requested, size_t d, int *out) {
  int n = requested;
  if (n <= 0) {
    TIDE_CHECK(tide_params_load()); /* a bad TIDE_* variable, named in the log */
    n = tide__default_threads(0);  /* TIDE_NUM_THREADS, else this rank's share */
  }
  if (n > MAX_THREADS) n = MAX_THREADS;
  size_t useful = d / TIDE__GRAIN;
  if (useful < 1) useful = 1;
  if ((size_t)n > useful) n = (int)useful;
  *out = n;
  return 0;
}

typedef struct {
  tide__par_cb fn;
  void *arg;
  int tid, nthreads;
} job_t;

static void *job_main(void *p) {
  job_t *job = p;
  job->fn(job->arg, job->tid, job->nthreads);
  return NULL;
}

void tide__parallel_run(int nthreads, tide__par_cb fn, void *arg) {
  if (nthreads <= 1) {
    fn(arg, 0, 1);
    return;
  }
  job_t jobs[MAX_THREADS];
  pthread_t threads[MAX_THREADS];
  int started[MAX_THREADS];
  for (int t = 1; t < nthreads; t++) {
    jobs[t] = (job_t){fn, arg, t, nthreads};
    started[t] = pthread_create(&threads[t], NULL, job_main, &jobs[t]) == 0;
  }
  fn(arg, 0, nthreads);
  for (int t = 1; t < nthreads; t++) {
    if (started[t])
      pthread_join(threads[t], NULL);
    else
      fn(arg, t, nthreads); /* could not start it: do its share here */
  }
}

void tide__chunk(size_t d, int tid, int nthreads, size_t *begin, size_t *end) {
  size_t blocks = (d + 63) / 64;
  size_t b0 = blocks * (size_t)tid / (size_t)nthreads;
  size_t b1 = blocks * (size_t)(tid + 1) / (size_t)nthreads;
  *begin = b0 * 64 < d ? b0 * 64 : d;
  *end = b1 * 64 < d ? b1 * 64 : d;
}

size_t tide__first_nonfinite(const float *x, size_t begin, size_t end) {
  for (size_t i = begin; i < end; i++)
    if (tide__key(x[i]) >= TIDE__KEY_NONFINITE) return i;
  return end;
}

int tide__cand_grow(tide__cand_t *c, size_t need) {
  if (need <= c->cap) return 0;
  size_t cap = c->cap < 1024 ? 1024 : c->cap;
  while (cap < need) cap *= 2;
  uint32_t *bits = tide__realloc(c->bits, cap * sizeof *bits);
  if (bits == NULL) return TIDE_ENOMEM;
  c->bits = bits;
  uint32_t *index = tide__realloc(c->index, cap * sizeof *index);
  if (index == NULL) return TIDE_ENOMEM;
  c->index = index;
  c->cap = cap;
  return 0;
}

void tide__cand_free(tide__cand_t *c) {
  tide__free(c->bits);
  tide__free(c->index);
  c->bits = c->index = NULL;
  c->len = c->cap = 0;
}

static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static pthread_key_t scratch_key;
static _Thread_local tide__scratch_t *scratch_cached;
static _Thread_local int scratch_busy;

static void scratch_free(void *p) {
  tide__scratch_t *s = p;
  for (int t = 0; t < TIDE__MAX_THREADS; t++) tide__cand_free(&s->cands[t]);
  tide__free(s);
}

static void scratch_key_create(void) { pthread_key_create(&scratch_key, scratch_free); }

tide__scratch_t *tide__scratch_acquire(void) {
  if (scratch_cached != NULL && !scratch_busy) {
    scratch_busy = 1;
    for (int t = 0; t < TIDE__MAX_THREADS; t++) scratch_cached->cands[t].len = 0;
    return scratch_cached;
  }
  tide__scratch_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL || scratch_cached != NULL) return s; /* NULL, or a nested call's own */
  pthread_once(&scratch_once, scratch_key_create);
  pthread_setspecific(scratch_key, s); /* frees it when the thread exits */
  scratch_cached = s;
  scratch_busy = 1;
  return s;
}

void tide__scratch_release(tide__scratch_t *s) {
  if (s == NULL) return;
  if (s != scratch_cached) {
    scratch_free(s);
    return;
  }
  size_t bytes = 0;
  for (int t = 0; t < TIDE__MAX_THREADS; t++)
    bytes += s->cands[t].cap * (sizeof *s->cands[t].bits + sizeof *s->cands[t].index);
  if (bytes > TIDE__SCRATCH_KEEP)
    for (int t = 0; t < TIDE__MAX_THREADS; t++) tide__cand_free(&s->cands[t]);
  scratch_busy = 0;
}
