/* The float kernels of simd.h. Float sums would not be reordered into
 * vector lanes by the compiler, so the lanes are explicit (GCC/clang vector
 * types, unaligned loads through memcpy); each run of 4096 elements is
 * added up in double. One loop serves every kernel: the flags are
 * constants at each call, so the compiler emits one specialised copy per
 * kernel. */
#include "core/simd.h"

#include <string.h>

typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p) {
  v4f v;
  memcpy(&v, p, sizeof v);
  return v;
}

static inline void store4(float *p, v4f v) { memcpy(p, &v, sizeof v); }

static inline double lanes(v4f a, v4f b) {
  v4f s = a + b;
  return (double)s[0] + (double)s[1] + (double)s[2] + (double)s[3];
}

/* x[i] = c*g[i] (+ x[i] when add); returns the sum of squares of g (or of
 * the new x when square_out). g may be x. */
static inline double scale(float *x, const float *g, size_t n, float c, int add, int square_out) {
  const v4f cv = {c, c, c, c};
  double total = 0;
  for (size_t i = 0; i < n;) {
    size_t stop = n - i > 4096 ? i + 4096 : n;
    v4f s0 = {0, 0, 0, 0}, s1 = s0;
    for (; i + 8 <= stop; i += 8) {
      v4f a = load4(g + i), b = load4(g + i + 4);
      v4f xa = a * cv, xb = b * cv;
      if (add) xa += load4(x + i), xb += load4(x + i + 4);
      store4(x + i, xa);
      store4(x + i + 4, xb);
      if (square_out) a = xa, b = xb;
      s0 += a * a;
      s1 += b * b;
    }
    double tail = 0;
    for (; i < stop; i++) {
      float v = g[i];
      x[i] = add ? x[i] + v * c : v * c;
      if (square_out) v = x[i];
      tail += (double)v * v;
    }
    total += lanes(s0, s1) + tail;
  }
  return total;
}

double tide__scale_into(float *restrict x, const float *restrict g, size_t n, float c, int add) {
  return add ? scale(x, g, n, c, 1, 0) : scale(x, g, n, c, 0, 0);
}

double tide__scale_in_place(float *x, size_t n, float c) { return scale(x, x, n, c, 0, 1); }
