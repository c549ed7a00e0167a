/* The float kernels of simd.h. Float sums would not be reordered into
 * vector lanes by the compiler, so the lanes are explicit (GCC/clang vector
 * types, unaligned loads through memcpy); each run of 4096 elements is
 * added up in double. One loop serves every kernel: the flags are
 * constants at each call, so the compiler emits one specialised copy per
 * kernel. */
#include "core/simd.h"

#include <stdint.h>
#include <string.h>

typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));

/* The passes get an AVX2 clone picked at load time, 8 floats wide where the
 * CPU can (the baseline splits each v8f into two v4f: the same operations in
 * the same order, so the same bits either way; ISO C, no FMA contraction).
 * Not under the sanitizers: the clones' ifunc resolvers run while the
 * dynamic loader relocates, before their runtimes are up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define SIMD_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* Unaligned loads and stores (no v8f passes through a call: the baseline
 * clone has no AVX registers to pass it in). */
#define LOAD8(v, p) memcpy(&(v), (p), sizeof(v8f))
#define STORE8(p, v) memcpy((p), &(v), sizeof(v8f))

/* Lanes 0-3 plus lanes 4-7, then those four in order, in double. */
static inline __attribute__((always_inline)) double lanes(const v8f *s8) {
  v4f s = __builtin_shufflevector(*s8, *s8, 0, 1, 2, 3) + __builtin_shufflevector(*s8, *s8, 4, 5, 6, 7);
  return (double)s[0] + (double)s[1] + (double)s[2] + (double)s[3];
}

/* x[i] = c*g[i] (+ x[i] when add); returns the sum of squares of g (or of
 * the new x when square_out). g may be x. Always inlined, so that each
 * clone of its callers has its own copy. */
static inline __attribute__((always_inline)) double scale(float *x, const float *g, size_t n, float c, int add,
                                                          int square_out) {
  const v8f cv = {c, c, c, c, c, c, c, c};
  double total = 0;
  for (size_t i = 0; i < n;) {
    size_t stop = n - i > 4096 ? i + 4096 : n;
    v8f s = {0, 0, 0, 0, 0, 0, 0, 0};
    for (; i + 8 <= stop; i += 8) {
      v8f a, xa, xo;
      LOAD8(a, g + i);
      xa = a * cv;
      if (add) {
        LOAD8(xo, x + i);
        xa += xo;
      }
      STORE8(x + i, xa);
      if (square_out) a = xa;
      s += a * a;
    }
    double tail = 0;
    for (; i < stop; i++) {
      float v = g[i];
      x[i] = add ? x[i] + v * c : v * c;
      if (square_out) v = x[i];
      tail += (double)v * v;
    }
    total += lanes(&s) + tail;
  }
  return total;
}

SIMD_CLONES double tide__scale_into(float *restrict x, const float *restrict g, size_t n, float c, int add) {
  return add ? scale(x, g, n, c, 1, 0) : scale(x, g, n, c, 0, 0);
}

SIMD_CLONES double tide__scale_in_place(float *x, size_t n, float c) { return scale(x, x, n, c, 0, 1); }

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
void tide__copy_stream(void *restrict dst, const void *restrict src, size_t n) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64)
    for (int k = 0; k < 4; k++)
      _mm_stream_si128((__m128i *)(d + i) + k, _mm_loadu_si128((const __m128i *)(s + i) + k));
  memcpy(d + i, s + i, n - i);
  _mm_sfence();
}
#else
void tide__copy_stream(void *restrict dst, const void *restrict src, size_t n) { memcpy(dst, src, n); }
#endif
