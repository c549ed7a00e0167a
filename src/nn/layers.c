/* Layer kernels (see layers.h for layouts). The matrix products go to BLAS;
 * the loops here are written so that the innermost one walks memory
 * contiguously and has no calls, so the compiler vectorises it. */
#include "nn/layers.h"

#include <math.h>
#include <string.h>

#include <cblas.h>

/* The memory-bound loops get an AVX2 clone picked at load time, so a portable
 * build still runs them 8 floats wide where the CPU can. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define NN_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define NN_HOT
#endif
/* Helpers of NN_HOT functions must be inlined into each clone: called out of
 * line they would be compiled for the baseline only. */
#define NN_INLINE static inline __attribute__((always_inline))

#if defined(__GNUC__) && !defined(__clang__)
/* GCC's vector extensions: plain C that compiles to SSE in the baseline
 * clone and to AVX2 in the x86-64-v3 one. */
#define NN_VECTOR 1
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v8b __attribute__((vector_size(8)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef uint8_t v4b __attribute__((vector_size(4)));
#endif

/* Sum with 16 independent partial sums: the compiler may not reorder a float
 * sum itself, and one running total would serialise on the add latency. */
NN_HOT static float sum_floats(const float *x, size_t n) {
  float part[16] = {0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) part[l] += x[i + l];
  float total = 0.0f;
  for (; i < n; i++) total += x[i];
  for (int l = 0; l < 16; l++) total += part[l];
  return total;
}

/* C[m][n] (+)= A[m][k] B[n][k]^T for a small C and a long k (the weight
 * gradient of a conv with few channels: 32 x 9 over thousands of pixels).
 * OpenBLAS splits such shapes badly across threads; here a k-block of B stays
 * in L1 while the rows of A stream past it, four at a time so each load of B
 * feeds four products. */
NN_HOT static void gemm_nt_small(int m, int n, size_t k, const float *a, size_t lda, const float *b,
                                 size_t ldb, int accumulate, float *c) {
  enum { BLOCK = 256, LANES = 8 };
  if (!accumulate) memset(c, 0, (size_t)m * n * sizeof *c);
  for (size_t k0 = 0; k0 < k; k0 += BLOCK) {
    size_t len = k - k0 < BLOCK ? k - k0 : BLOCK, vec = 0; /* the part done 8 wide */
#ifdef NN_VECTOR
    vec = len / LANES * LANES;
#endif
    for (int i = 0; i < m; i += 4) {
      int rows = m - i < 4 ? m - i : 4;
      const float *a0 = a + (size_t)i * lda + k0;
      const float *a1 = rows > 1 ? a0 + lda : a0, *a2 = rows > 2 ? a0 + 2 * lda : a0;
      const float *a3 = rows > 3 ? a0 + 3 * lda : a0;
      for (int j = 0; j < n; j++) {
        const float *bj = b + (size_t)j * ldb + k0;
        float s[4] = {0, 0, 0, 0};
#ifdef NN_VECTOR
        v8f p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0}, av, bv;
        for (size_t p = 0; p < vec; p += LANES) {
          memcpy(&bv, bj + p, sizeof bv);
          memcpy(&av, a0 + p, sizeof av), p0 += av * bv;
          memcpy(&av, a1 + p, sizeof av), p1 += av * bv;
          memcpy(&av, a2 + p, sizeof av), p2 += av * bv;
          memcpy(&av, a3 + p, sizeof av), p3 += av * bv;
        }
        for (int l = 0; l < LANES; l++) s[0] += p0[l], s[1] += p1[l], s[2] += p2[l], s[3] += p3[l];
#endif
        for (size_t p = vec; p < len; p++) {
          s[0] += a0[p] * bj[p];
          s[1] += a1[p] * bj[p];
          s[2] += a2[p] * bj[p];
          s[3] += a3[p] * bj[p];
        }
        for (int r = 0; r < rows; r++) c[(size_t)(i + r) * n + j] += s[r];
      }
    }
  }
}

void nn__sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
               const float *b, int ldb, float beta, float *c, int ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* ---- dense ------------------------------------------------------------------ */

void nn__dense_forward(const float *x, const float *w, const float *b, int batch, int in, int out,
                       int relu, float *y) {
  nn__sgemm(0, 1, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  for (int i = 0; i < batch; i++) {
    float *yi = y + (size_t)i * out;
    if (relu) {
      for (int o = 0; o < out; o++) {
        float v = yi[o] + b[o];
        yi[o] = v > 0.0f ? v : 0.0f;
      }
    } else {
      for (int o = 0; o < out; o++) yi[o] += b[o];
    }
  }
}

void nn__dense_backward(const float *x, const float *w, const float *dy, int batch, int in, int out,
                        float *dw, float *db, float *dx) {
  /* dW[out][in] = dY^T X: the transpose is the gemm's, no copy. */
  nn__sgemm(1, 0, out, in, batch, 1.0f, dy, out, x, in, 0.0f, dw, in);
  memset(db, 0, (size_t)out * sizeof *db);
  for (int i = 0; i < batch; i++) {
    const float *dyi = dy + (size_t)i * out;
    for (int o = 0; o < out; o++) db[o] += dyi[o];
  }
  if (dx != NULL) nn__sgemm(0, 0, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

/* ---- ReLU -------------------------------------------------------------------- */

void nn__relu_forward(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void nn__relu_backward(const float *y, float *dy, size_t n) {
  for (size_t i = 0; i < n; i++) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

/* ---- conv2d -------------------------------------------------------------------- */

/* The batch goes through in chunks whose im2col matrix fits in L2 (1 MiB on
 * the machines this was tuned on; a little more costs little). The matrix is
 * then written, multiplied and (in backward) rebuilt while it is still in
 * cache, instead of streaming a matrix k*k times the size of the input
 * through memory three times; the products stay large enough for OpenBLAS's
 * threads (a chunk is at least ~2000 columns). */
enum { CHUNK_BYTES = 1 << 20, CHUNK_MIN_COLUMNS = 2048 };

static int chunk_samples(const nn__conv_t *c, int batch) {
  size_t per_sample = (size_t)c->cin * c->k * c->k * c->oh * c->ow * sizeof(float);
  size_t samples = CHUNK_BYTES / per_sample;
  size_t min = (CHUNK_MIN_COLUMNS + (size_t)c->oh * c->ow - 1) / ((size_t)c->oh * c->ow);
  if (samples < min) samples = min;
  if (samples < 1) samples = 1;
  return samples > (size_t)batch ? batch : (int)samples;
}

size_t nn__conv_scratch_size(const nn__conv_t *c, int batch) {
  return (size_t)c->cin * c->k * c->k * (size_t)chunk_samples(c, batch) * c->oh * c->ow;
}

/* A "same" convolution (output plane = input plane): each im2col row is the
 * input plane shifted by (kh - pad, kw - pad), which is one contiguous copy
 * plus zeroing the rows and columns that fell off the edge. */
static int same_size(const nn__conv_t *c) { return c->oh == c->h && c->ow == c->w; }

/* dst (h x w) = src shifted by (dh, dw), zero outside. */
NN_INLINE void shift_plane(const float *src, int h, int w, int dh, int dw, float *dst) {
  int r0 = dh < 0 ? -dh : 0, r1 = dh > 0 ? h - dh : h; /* rows of dst with a source row */
  if (r1 < r0) r1 = r0;
  if (r0 > 0) memset(dst, 0, (size_t)r0 * w * sizeof *dst);
  if (r1 < h) memset(dst + (size_t)r1 * w, 0, (size_t)(h - r1) * w * sizeof *dst);
  if (r1 == r0) return;
  /* dst[q] = src[q + shift] for q in [r0*w, r1*w), clamped to src's bounds;
   * the wrapped columns are zeroed below. */
  ptrdiff_t shift = (ptrdiff_t)dh * w + dw, q0 = (ptrdiff_t)r0 * w, q1 = (ptrdiff_t)r1 * w;
  ptrdiff_t lo = q0 + shift < 0 ? -shift : q0, hi = q1 + shift > (ptrdiff_t)h * w ? (ptrdiff_t)h * w - shift : q1;
  for (ptrdiff_t q = q0; q < lo; q++) dst[q] = 0.0f;
  memcpy(dst + lo, src + lo + shift, (size_t)(hi - lo) * sizeof *dst);
  for (ptrdiff_t q = hi; q < q1; q++) dst[q] = 0.0f;
  if (dw > 0)
    for (int r = r0; r < r1; r++)
      for (int j = w - dw; j < w; j++) dst[(size_t)r * w + j] = 0.0f;
  else if (dw < 0)
    for (int r = r0; r < r1; r++)
      for (int j = 0; j < -dw; j++) dst[(size_t)r * w + j] = 0.0f;
}

/* The adjoint of shift_plane: dst += src shifted back, dropping what came
 * from padding. src is clobbered (its padding entries are zeroed). */
NN_INLINE void unshift_plane_add(float *src, int h, int w, int dh, int dw, float *dst) {
  int r0 = dh < 0 ? -dh : 0, r1 = dh > 0 ? h - dh : h;
  if (r1 <= r0) return;
  if (dw > 0)
    for (int r = r0; r < r1; r++)
      for (int j = w - dw; j < w; j++) src[(size_t)r * w + j] = 0.0f;
  else if (dw < 0)
    for (int r = r0; r < r1; r++)
      for (int j = 0; j < -dw; j++) src[(size_t)r * w + j] = 0.0f;
  ptrdiff_t shift = (ptrdiff_t)dh * w + dw, q0 = (ptrdiff_t)r0 * w, q1 = (ptrdiff_t)r1 * w;
  ptrdiff_t lo = q0 + shift < 0 ? -shift : q0, hi = q1 + shift > (ptrdiff_t)h * w ? (ptrdiff_t)h * w - shift : q1;
  for (ptrdiff_t q = lo; q < hi; q++) dst[q + shift] += src[q];
}

/* Output columns ow whose input column ow + kw - pad lies inside [0, w). */
NN_INLINE void valid_cols(const nn__conv_t *c, int kw, int *lo, int *hi) {
  int a = c->pad - kw, b = c->w + c->pad - kw;
  *lo = a > 0 ? a : 0;
  *hi = b < c->ow ? b : c->ow;
  if (*hi < *lo) *hi = *lo;
}

/* col[(ci,kh,kw)][s][oh][ow] = x[ci][b0+s][oh+kh-pad][ow+kw-pad] (0 outside)
 * for the nb samples from b0 of a batch of `batch`. One input plane at a
 * time, so it stays in L1 while its k*k rows are written. */
NN_HOT static void im2col(const nn__conv_t *c, int batch, int b0, int nb, const float *x, float *col) {
  const int k = c->k, oh = c->oh, ow = c->ow, same = same_size(c);
  const size_t plane = (size_t)c->h * c->w, oplane = (size_t)oh * ow, n = (size_t)nb * oplane;
  for (int ci = 0; ci < c->cin; ci++) {
    for (int s = 0; s < nb; s++) {
      const float *src = x + ((size_t)ci * batch + b0 + s) * plane;
      for (int kh = 0; kh < k; kh++) {
        for (int kw = 0; kw < k; kw++) {
          float *dst = col + ((size_t)(ci * k + kh) * k + kw) * n + (size_t)s * oplane;
          if (same) {
            shift_plane(src, c->h, c->w, kh - c->pad, kw - c->pad, dst);
            continue;
          }
          int lo, hi;
          valid_cols(c, kw, &lo, &hi);
          for (int r = 0; r < oh; r++) {
            float *d = dst + (size_t)r * ow;
            int ih = r + kh - c->pad;
            if (ih < 0 || ih >= c->h) {
              memset(d, 0, (size_t)ow * sizeof *d);
              continue;
            }
            const float *sr = src + (size_t)ih * c->w + kw - c->pad;
            for (int j = 0; j < lo; j++) d[j] = 0.0f;
            memcpy(d + lo, sr + lo, (size_t)(hi - lo) * sizeof *d);
            for (int j = hi; j < ow; j++) d[j] = 0.0f;
          }
        }
      }
    }
  }
}

/* The adjoint of im2col: dx[ci][b0+s][ih][iw] = the sum of col[...] over every
 * (kh, kw) that read it. col is clobbered. */
NN_HOT static void col2im(const nn__conv_t *c, int batch, int b0, int nb, float *col, float *dx) {
  const int k = c->k, oh = c->oh, ow = c->ow, same = same_size(c);
  const size_t plane = (size_t)c->h * c->w, oplane = (size_t)oh * ow, n = (size_t)nb * oplane;
  for (int ci = 0; ci < c->cin; ci++) {
    for (int s = 0; s < nb; s++) {
      float *dst = dx + ((size_t)ci * batch + b0 + s) * plane;
      memset(dst, 0, plane * sizeof *dst);
      for (int kh = 0; kh < k; kh++) {
        for (int kw = 0; kw < k; kw++) {
          float *src = col + ((size_t)(ci * k + kh) * k + kw) * n + (size_t)s * oplane;
          if (same) {
            unshift_plane_add(src, c->h, c->w, kh - c->pad, kw - c->pad, dst);
            continue;
          }
          int lo, hi;
          valid_cols(c, kw, &lo, &hi);
          for (int r = 0; r < oh; r++) {
            int ih = r + kh - c->pad;
            if (ih < 0 || ih >= c->h) continue;
            const float *sr = src + (size_t)r * ow;
            float *d = dst + (size_t)ih * c->w + kw - c->pad;
            for (int j = lo; j < hi; j++) d[j] += sr[j];
          }
        }
      }
    }
  }
}

void nn__conv_patches(const nn__conv_t *c, int batch, int b0, int nb, const float *x, float *col) {
  im2col(c, batch, b0, nb, x, col);
}

/* Rows of y (stride ld) get their bias over columns [0, n). */
NN_HOT static void fill_rows(float *y, int rows, size_t ld, size_t n, const float *value) {
  for (int r = 0; r < rows; r++) {
    float *yr = y + (size_t)r * ld, v = value[r];
    for (size_t i = 0; i < n; i++) yr[i] = v;
  }
}

NN_HOT static void relu_inplace(float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

void nn__conv_forward(const nn__conv_t *c, int batch, const float *x, const float *w,
                      const float *b, int relu, float *scratch, float *y) {
  const int kk = c->cin * c->k * c->k, chunk = chunk_samples(c, batch);
  const size_t oplane = (size_t)c->oh * c->ow, n = (size_t)batch * oplane;
  for (int b0 = 0; b0 < batch; b0 += chunk) {
    int nb = batch - b0 < chunk ? batch - b0 : chunk;
    size_t cols = (size_t)nb * oplane;
    float *yc = y + (size_t)b0 * oplane;
    im2col(c, batch, b0, nb, x, scratch);
    /* The bias goes in first and the product adds to it (beta = 1): OpenBLAS
     * would otherwise spend a pass zeroing y for beta = 0, and we another
     * adding the bias. */
    fill_rows(yc, c->cout, n, cols, b);
    nn__sgemm(0, 0, c->cout, (int)cols, kk, 1.0f, w, kk, scratch, (int)cols, 1.0f, yc, (int)n);
  }
  if (relu) relu_inplace(y, (size_t)c->cout * n);
}

int nn__conv_backward(const nn__conv_t *c, int batch, const float *x, float *scratch, const float *w,
                      const float *dy, float *dw, float *db, float *dx, nn__patches_cb patches, void *ctx) {
  const int kk = c->cin * c->k * c->k, chunk = chunk_samples(c, batch);
  const size_t oplane = (size_t)c->oh * c->ow, n = (size_t)batch * oplane;
  const int small = (size_t)c->cout * kk <= 1024;
  for (int co = 0; co < c->cout; co++) db[co] = sum_floats(dy + (size_t)co * n, n);
  for (int b0 = 0; b0 < batch; b0 += chunk) {
    int nb = batch - b0 < chunk ? batch - b0 : chunk;
    size_t cols = (size_t)nb * oplane;
    const float *dyc = dy + (size_t)b0 * oplane;
    /* The forward pass's im2col again, cheaper than keeping it. */
    im2col(c, batch, b0, nb, x, scratch);
    int rc = patches != NULL ? patches(ctx, scratch, cols) : 0;
    if (rc != 0) return rc;
    if (small)
      gemm_nt_small(c->cout, kk, cols, dyc, n, scratch, cols, b0 > 0, dw);
    else
      nn__sgemm(0, 1, c->cout, kk, (int)cols, 1.0f, dyc, (int)n, scratch, (int)cols, b0 > 0 ? 1.0f : 0.0f, dw,
                kk);
    if (dx == NULL) continue;
    /* The columns are used up: the scratch takes dcol = W^T dY. */
    nn__sgemm(1, 0, kk, (int)cols, c->cout, 1.0f, w, kk, dyc, (int)n, 0.0f, scratch, (int)cols);
    col2im(c, batch, b0, nb, scratch, dx);
  }
  return 0;
}

/* ---- max-pool 2x2 ---------------------------------------------------------------- */

/* The winner of a window is the first maximum in row-major order, as in
 * PyTorch: compare within each row first, then the rows (the top row wins
 * ties). Everything is branch-free: on real data the comparisons are coin
 * flips, and mispredicted branches cost more than the arithmetic. */
NN_INLINE void pool_window(const float *r0, const float *r1, int relu, float *y, uint8_t *arg) {
  float a = r0[0], b = r0[1], c = r1[0], d = r1[1];
  int right0 = b > a, right1 = d > c;
  float top = right0 ? b : a, bottom = right1 ? d : c;
  int down = bottom > top;
  float m = down ? bottom : top;
  *y = relu && !(m > 0.0f) ? 0.0f : m;
  *arg = (uint8_t)(down ? 2 + right1 : right0);
}

NN_INLINE void unpool_window(float g, float y, uint8_t arg, int relu_mask, float *d0, float *d1) {
  float v = relu_mask && !(y > 0.0f) ? 0.0f : g;
  d0[0] = arg == 0 ? v : 0.0f;
  d0[1] = arg == 1 ? v : 0.0f;
  d1[0] = arg == 2 ? v : 0.0f;
  d1[1] = arg == 3 ? v : 0.0f;
}

#ifdef NN_VECTOR
/* A block of 8 (or 4) windows at a time, the even
 * and odd columns split by shuffles. A row whose width is not a multiple of
 * the block ends with one block that overlaps the previous one: it computes
 * the same values again, so the overlap is harmless, and there is no scalar
 * tail. */
#define POOL_VECTOR 1

/* mask ? x : y, lane by lane (mask lanes are 0 or -1). */
#define BLEND(VI, VF, mask, x, y) ((VF)(((VI)(x) & (mask)) | ((VI)(y) & ~(mask))))

#define POOL_BLOCK(N, VF, VI, VB, EVEN, ODD, LO, HI)                                          \
  NN_INLINE void pool_block##N(const float *r0, const float *r1, int relu, float *y,       \
                                   uint8_t *arg) {                                             \
    VF t0, t1, b0, b1;                                                                          \
    memcpy(&t0, r0, sizeof t0);                                                                 \
    memcpy(&t1, r0 + N, sizeof t1);                                                             \
    memcpy(&b0, r1, sizeof b0);                                                                 \
    memcpy(&b1, r1 + N, sizeof b1);                                                             \
    const VI even = EVEN, odd = ODD, zero = {0};                                                \
    VF a = __builtin_shuffle(t0, t1, even), b = __builtin_shuffle(t0, t1, odd);                \
    VF c = __builtin_shuffle(b0, b1, even), d = __builtin_shuffle(b0, b1, odd);                \
    VI right0 = b > a, right1 = d > c;                                                          \
    VF top = BLEND(VI, VF, right0, b, a), bottom = BLEND(VI, VF, right1, d, c);                 \
    VI down = bottom > top;                                                                     \
    VF m = BLEND(VI, VF, down, bottom, top);                                                    \
    if (relu) m = (VF)((VI)m & (m > (VF)zero));                                                 \
    /* right masks are 0 or -1: 2 - right1 is 2 or 3, -right0 is 0 or 1 */                    \
    VI which = (down & (2 - right1)) | (~down & -right0);                                       \
    VB bytes = __builtin_convertvector(which, VB);                                              \
    memcpy(y, &m, sizeof m);                                                                    \
    memcpy(arg, &bytes, sizeof bytes);                                                          \
  }                                                                                             \
  NN_INLINE void unpool_block##N(const float *g, const float *y, const uint8_t *arg,       \
                                     int relu_mask, float *d0, float *d1) {                    \
    VF gv, yv;                                                                                  \
    VB bytes;                                                                                   \
    memcpy(&gv, g, sizeof gv);                                                                  \
    memcpy(&yv, y, sizeof yv);                                                                  \
    memcpy(&bytes, arg, sizeof bytes);                                                          \
    const VI zero = {0}, lo = LO, hi = HI;                                                      \
    VI which = __builtin_convertvector(bytes, VI);                                              \
    if (relu_mask) gv = (VF)((VI)gv & (yv > (VF)zero));                                         \
    VF tl = (VF)((VI)gv & (which == 0)), tr = (VF)((VI)gv & (which == 1));                      \
    VF bl = (VF)((VI)gv & (which == 2)), br = (VF)((VI)gv & (which == 3));                      \
    VF out[4] = {__builtin_shuffle(tl, tr, lo), __builtin_shuffle(tl, tr, hi),                  \
                 __builtin_shuffle(bl, br, lo), __builtin_shuffle(bl, br, hi)};                 \
    memcpy(d0, &out[0], 2 * sizeof out[0]);                                                     \
    memcpy(d1, &out[2], 2 * sizeof out[0]);                                                     \
  }

POOL_BLOCK(8, v8f, v8i, v8b, ((v8i){0, 2, 4, 6, 8, 10, 12, 14}), ((v8i){1, 3, 5, 7, 9, 11, 13, 15}),
           ((v8i){0, 8, 1, 9, 2, 10, 3, 11}), ((v8i){4, 12, 5, 13, 6, 14, 7, 15}))
POOL_BLOCK(4, v4f, v4i, v4b, ((v4i){0, 2, 4, 6}), ((v4i){1, 3, 5, 7}), ((v4i){0, 4, 1, 5}),
           ((v4i){2, 6, 3, 7}))
#endif

/* One row of windows: r0, r1 are the two input rows, ow windows wide. */
NN_INLINE void pool_row(const float *r0, const float *r1, int ow, int relu, float *y, uint8_t *arg) {
#ifdef POOL_VECTOR
  if (ow >= 8) {
    for (int j = 0; j + 8 <= ow; j += 8) pool_block8(r0 + 2 * j, r1 + 2 * j, relu, y + j, arg + j);
    if (ow % 8) pool_block8(r0 + 2 * (ow - 8), r1 + 2 * (ow - 8), relu, y + ow - 8, arg + ow - 8);
    return;
  }
  if (ow >= 4) {
    pool_block4(r0, r1, relu, y, arg);
    if (ow > 4) pool_block4(r0 + 2 * (ow - 4), r1 + 2 * (ow - 4), relu, y + ow - 4, arg + ow - 4);
    return;
  }
#endif
  for (int j = 0; j < ow; j++) pool_window(r0 + 2 * j, r1 + 2 * j, relu, y + j, arg + j);
}

NN_INLINE void unpool_row(const float *g, const float *y, const uint8_t *arg, int ow, int relu_mask,
                              float *d0, float *d1) {
#ifdef POOL_VECTOR
  if (ow >= 8) {
    for (int j = 0; j + 8 <= ow; j += 8) unpool_block8(g + j, y + j, arg + j, relu_mask, d0 + 2 * j, d1 + 2 * j);
    if (ow % 8)
      unpool_block8(g + ow - 8, y + ow - 8, arg + ow - 8, relu_mask, d0 + 2 * (ow - 8), d1 + 2 * (ow - 8));
    return;
  }
  if (ow >= 4) {
    unpool_block4(g, y, arg, relu_mask, d0, d1);
    if (ow > 4)
      unpool_block4(g + ow - 4, y + ow - 4, arg + ow - 4, relu_mask, d0 + 2 * (ow - 4), d1 + 2 * (ow - 4));
    return;
  }
#endif
  for (int j = 0; j < ow; j++) unpool_window(g[j], y[j], arg[j], relu_mask, d0 + 2 * j, d1 + 2 * j);
}

NN_HOT void nn__maxpool_forward(const float *x, size_t planes, int h, int w, int relu, float *y,
                                uint8_t *arg) {
  const int oh = h / 2, ow = w / 2;
  for (size_t p = 0; p < planes; p++)
    for (int i = 0; i < oh; i++) {
      const float *r0 = x + (p * h + 2 * i) * w;
      size_t at = (p * oh + i) * ow;
      pool_row(r0, r0 + w, ow, relu, y + at, arg + at);
    }
}

NN_HOT void nn__maxpool_backward(const float *dy, const float *y, const uint8_t *arg, size_t planes,
                                 int h, int w, int relu_mask, float *dx) {
  const int oh = h / 2, ow = w / 2;
  for (size_t p = 0; p < planes; p++) {
    float *dxp = dx + p * h * w;
    for (int i = 0; i < oh; i++) {
      float *d0 = dxp + (size_t)(2 * i) * w, *d1 = d0 + w;
      size_t at = (p * oh + i) * ow;
      unpool_row(dy + at, y + at, arg + at, ow, relu_mask, d0, d1);
      if (w & 1) d0[w - 1] = d1[w - 1] = 0.0f;
    }
    if (h & 1) memset(dxp + (size_t)(h - 1) * w, 0, (size_t)w * sizeof *dxp);
  }
}

/* ---- flatten ---------------------------------------------------------------------- */

void nn__flatten_forward(const float *x, int c, int batch, int hw, float *y) {
  for (int ci = 0; ci < c; ci++)
    for (int b = 0; b < batch; b++)
      memcpy(y + ((size_t)b * c + ci) * hw, x + ((size_t)ci * batch + b) * hw, (size_t)hw * sizeof *y);
}

void nn__flatten_backward(const float *dy, int c, int batch, int hw, float *dx) {
  for (int ci = 0; ci < c; ci++)
    for (int b = 0; b < batch; b++)
      memcpy(dx + ((size_t)ci * batch + b) * hw, dy + ((size_t)b * c + ci) * hw, (size_t)hw * sizeof *dx);
}

/* ---- softmax cross-entropy -------------------------------------------------------- */

double nn__softmax_xent(const float *logits, const int32_t *labels, int batch, int classes,
                        float *dlogits, int *correct) {
  double total = 0.0;
  int right = 0;
  const float inv = 1.0f / (float)batch;
  for (int b = 0; b < batch; b++) {
    const float *z = logits + (size_t)b * classes;
    int best = 0;
    for (int j = 1; j < classes; j++)
      if (z[j] > z[best]) best = j;
    float max = z[best];
    double sum = 0.0;
    for (int j = 0; j < classes; j++) sum += exp((double)(z[j] - max));
    double lse = (double)max + log(sum);
    total += lse - (double)z[labels[b]];
    right += best == labels[b];
    if (dlogits != NULL) {
      float *d = dlogits + (size_t)b * classes;
      for (int j = 0; j < classes; j++) d[j] = (float)(exp((double)z[j] - lse)) * inv;
      d[labels[b]] -= inv;
    }
  }
  if (correct != NULL) *correct = right;
  return total / batch;
}
