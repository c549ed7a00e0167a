/* The model engine (src/nn):
 *  1. every layer kernel's forward against a direct double-precision
 *     reference, and its backward against central finite differences; the
 *     whole models' gradients against finite differences;
 *  2. loss, logits and every gradient against PyTorch in float64
 *     (test/nn_torch_ref.py; skipped when /usr/bin/python3 has no torch);
 *  3. the Fashion-MNIST loader on the installed files (skipped when absent)
 *     and on broken ones made here (always);
 *  4. argument errors, seeding, and a short SGD run that must lower the loss.
 * Tolerances are stated where they are used. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "nn/layers.h"
#include "nn/nn.h"

#if defined(__has_include)
#if __has_include(<zlib.h>)
#include <zlib.h>
#define TEST_HAVE_ZLIB 1
#endif
#endif

/* params[0] of "mlp" with seed 42 (fc1.weight[0][0]). */
#define PINNED_FIRST_WEIGHT -0.0297240764f

static int failures;

static uint64_t rng_state = 0x1234567890abcdefull;
/* Uniform in [lo, hi). */
static float urand(float lo, float hi) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return lo + (hi - lo) * (float)((double)(rng_state >> 11) / 9007199254740992.0);
}
static void fill(float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = urand(lo, hi);
}
static float *alloc_floats(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  CHECK(p != NULL);
  return p;
}

/* The scalar every layer test differentiates: L = sum_i r_i y_i, in double. */
static double project(const float *y, const float *r, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)r[i] * y[i];
  return s;
}

static void expect_close(const char *what, size_t index, double got, double want, double atol, double rtol) {
  if (!(fabs(got - want) <= atol + rtol * fabs(want))) {
    fprintf(stderr, "  %s[%zu]: got %.8g, want %.8g (tolerance %.2g + %.2g * |want|)\n", what, index, got, want,
            atol, rtol);
    failures++;
  }
}

/* ---- 1a. dense -------------------------------------------------------------------- */

/* Dense and conv are linear in each of x, W and b, so a central difference
 * with a large step is exact up to float rounding of the outputs (~1e-7
 * relative): step 0.05, tolerance 1e-4 absolute + 1e-4 relative. */
#define LIN_EPS 0.05f

static void test_dense(void) {
  const int batch = 3, in = 7, out = 5;
  float *x = alloc_floats(batch * in), *w = alloc_floats(out * in), *b = alloc_floats(out);
  float *y = alloc_floats(batch * out), *r = alloc_floats(batch * out), *y2 = alloc_floats(batch * out);
  float *dw = alloc_floats(out * in), *db = alloc_floats(out), *dx = alloc_floats(batch * in);
  fill(x, batch * in, -1, 1), fill(w, out * in, -1, 1), fill(b, out, -1, 1), fill(r, batch * out, -1, 1);

  nn__dense_forward(x, w, b, batch, in, out, 0, y);
  for (int i = 0; i < batch; i++)
    for (int o = 0; o < out; o++) {
      double want = b[o];
      for (int k = 0; k < in; k++) want += (double)x[i * in + k] * w[o * in + k];
      expect_close("dense forward", (size_t)(i * out + o), y[i * out + o], want, 1e-5, 1e-5);
    }
  /* The fused ReLU is exactly ReLU of the linear output. */
  nn__dense_forward(x, w, b, batch, in, out, 1, y2);
  for (int i = 0; i < batch * out; i++) CHECK(y2[i] == (y[i] > 0 ? y[i] : 0.0f));

  nn__dense_backward(x, w, r, batch, in, out, dw, db, dx);
  struct {
    const char *name;
    float *v, *g;
    int n;
  } vars[] = {{"dense dW", w, dw, out * in}, {"dense db", b, db, out}, {"dense dx", x, dx, batch * in}};
  for (int v = 0; v < 3; v++)
    for (int i = 0; i < vars[v].n; i++) {
      float keep = vars[v].v[i];
      vars[v].v[i] = keep + LIN_EPS;
      nn__dense_forward(x, w, b, batch, in, out, 0, y2);
      double plus = project(y2, r, batch * out);
      vars[v].v[i] = keep - LIN_EPS;
      nn__dense_forward(x, w, b, batch, in, out, 0, y2);
      double minus = project(y2, r, batch * out);
      vars[v].v[i] = keep;
      expect_close(vars[v].name, (size_t)i, vars[v].g[i], (plus - minus) / (2 * LIN_EPS), 1e-4, 1e-4);
    }
  /* dx = NULL (first layer) leaves the parameter gradients the same. */
  float *dw2 = alloc_floats(out * in);
  nn__dense_backward(x, w, r, batch, in, out, dw2, db, NULL);
  CHECK(memcmp(dw, dw2, sizeof(float) * out * in) == 0);
  free(x), free(w), free(b), free(y), free(r), free(y2), free(dw), free(db), free(dx), free(dw2);
}

/* ---- 1b. ReLU -------------------------------------------------------------------- */

static void test_relu(void) {
  enum { N = 64 };
  float x[N], y[N], y2[N], r[N], dy[N];
  /* Kept away from 0 by more than the step, so no difference straddles the kink. */
  for (int i = 0; i < N; i++) x[i] = (i % 2 ? 1.0f : -1.0f) * urand(0.1f, 1.0f);
  fill(r, N, -1, 1);
  nn__relu_forward(x, y, N);
  for (int i = 0; i < N; i++) CHECK(y[i] == (x[i] > 0 ? x[i] : 0.0f));
  memcpy(dy, r, sizeof dy);
  nn__relu_backward(y, dy, N);
  const float eps = 0.01f;
  for (int i = 0; i < N; i++) {
    float keep = x[i];
    x[i] = keep + eps;
    nn__relu_forward(x, y2, N);
    double plus = project(y2, r, N);
    x[i] = keep - eps;
    nn__relu_forward(x, y2, N);
    double minus = project(y2, r, N);
    x[i] = keep;
    expect_close("relu dx", (size_t)i, dy[i], (plus - minus) / (2 * eps), 1e-5, 1e-4);
  }
}

/* ---- 1c. conv2d ----------------------------------------------------------------- */

static void conv_reference(const nn__conv_t *c, int batch, const float *x, const float *w, const float *b,
                           double *y) {
  for (int co = 0; co < c->cout; co++)
    for (int n = 0; n < batch; n++)
      for (int i = 0; i < c->oh; i++)
        for (int j = 0; j < c->ow; j++) {
          double s = b[co];
          for (int ci = 0; ci < c->cin; ci++)
            for (int kh = 0; kh < c->k; kh++)
              for (int kw = 0; kw < c->k; kw++) {
                int ih = i + kh - c->pad, iw = j + kw - c->pad;
                if (ih < 0 || ih >= c->h || iw < 0 || iw >= c->w) continue;
                s += (double)w[((co * c->cin + ci) * c->k + kh) * c->k + kw] *
                     x[(((size_t)ci * batch + n) * c->h + ih) * c->w + iw];
              }
          y[(((size_t)co * batch + n) * c->oh + i) * c->ow + j] = s;
        }
}

/* probes: how many entries of each gradient to check (0 = all). */
static void test_conv_shape(int cin, int cout, int k, int pad, int h, int w, int batch, int probes) {
  nn__conv_t c = {.cin = cin, .cout = cout, .k = k, .pad = pad, .h = h, .w = w,
                  .oh = h + 2 * pad - k + 1, .ow = w + 2 * pad - k + 1};
  size_t nx = (size_t)cin * batch * h * w, nw = (size_t)cout * cin * k * k;
  size_t ny = (size_t)cout * batch * c.oh * c.ow, ncol = nn__conv_scratch_size(&c, batch);
  float *x = alloc_floats(nx), *wt = alloc_floats(nw), *b = alloc_floats(cout), *y = alloc_floats(ny);
  float *y2 = alloc_floats(ny), *r = alloc_floats(ny), *col = alloc_floats(ncol), *dw = alloc_floats(nw);
  float *db = alloc_floats(cout), *dx = alloc_floats(nx), *dw2 = alloc_floats(nw);
  double *ref = malloc(ny * sizeof *ref);
  fill(x, nx, -1, 1), fill(wt, nw, -1, 1), fill(b, cout, -1, 1), fill(r, ny, -1, 1);
  char what[96];
  snprintf(what, sizeof what, "conv %d->%d k%d pad%d %dx%d", cin, cout, k, pad, h, w);

  nn__conv_forward(&c, batch, x, wt, b, 0, col, y);
  conv_reference(&c, batch, x, wt, b, ref);
  for (size_t i = 0; i < ny; i++) expect_close(what, i, y[i], ref[i], 1e-5 * cin * k * k, 1e-5);
  nn__conv_forward(&c, batch, x, wt, b, 1, col, y2);
  for (size_t i = 0; i < ny; i++) CHECK(y2[i] == (y[i] > 0 ? y[i] : 0.0f));

  nn__conv_forward(&c, batch, x, wt, b, 0, col, y);
  CHECK(nn__conv_backward(&c, batch, x, col, wt, r, dw, db, dx, NULL, NULL) == 0);
  struct {
    const char *name;
    float *v, *g;
    size_t n;
  } vars[] = {{"dW", wt, dw, nw}, {"db", b, db, (size_t)cout}, {"dx", x, dx, nx}};
  char name[128];
  for (int v = 0; v < 3; v++) {
    snprintf(name, sizeof name, "%s %s", what, vars[v].name);
    size_t count = probes == 0 || (size_t)probes > vars[v].n ? vars[v].n : (size_t)probes;
    for (size_t p = 0; p < count; p++) {
      size_t i = count == vars[v].n ? p : (size_t)urand(0, (float)vars[v].n) % vars[v].n;
      float keep = vars[v].v[i];
      vars[v].v[i] = keep + LIN_EPS;
      nn__conv_forward(&c, batch, x, wt, b, 0, col, y2);
      double plus = project(y2, r, ny);
      vars[v].v[i] = keep - LIN_EPS;
      nn__conv_forward(&c, batch, x, wt, b, 0, col, y2);
      double minus = project(y2, r, ny);
      vars[v].v[i] = keep;
      expect_close(name, i, vars[v].g[i], (plus - minus) / (2 * LIN_EPS), 1e-4 * sqrt((double)ny), 1e-4);
    }
  }
  /* Without dx (first layer) the parameter gradients are the same. */
  CHECK(nn__conv_backward(&c, batch, x, col, wt, r, dw2, db, NULL, NULL, NULL) == 0);
  for (size_t i = 0; i < nw; i++) expect_close("conv dW without dx", i, dw2[i], dw[i], 1e-6, 1e-6);
  free(x), free(wt), free(b), free(y), free(y2), free(r), free(col), free(dw), free(db), free(dx), free(dw2);
  free(ref);
}

static void test_conv(void) {
  test_conv_shape(2, 3, 3, 1, 6, 5, 2, 0);  /* "same": the shifted-plane im2col */
  test_conv_shape(3, 2, 3, 0, 7, 7, 2, 0);  /* valid: the row-by-row im2col */
  test_conv_shape(2, 2, 2, 1, 5, 6, 2, 0);  /* even kernel: output larger than input */
  test_conv_shape(1, 4, 5, 2, 8, 8, 3, 0);  /* one input channel, as the first layer */
  test_conv_shape(2, 3, 1, 0, 4, 4, 2, 0);  /* 1x1 */
  test_conv_shape(1, 2, 3, 2, 3, 4, 1, 0);  /* padding wider than a third of the plane */
  test_conv_shape(16, 8, 3, 1, 6, 6, 2, 40); /* cout*cin*k*k > 1024: OpenBLAS's dW */
  test_conv_shape(16, 8, 3, 1, 14, 14, 24, 30); /* the batch in three chunks (11, 11, 2) */
  test_conv_shape(1, 5, 3, 1, 28, 28, 40, 30);  /* cnn's first layer: chunks of 37 and 3 */
}

/* ---- 1d. max-pool --------------------------------------------------------------- */

static void test_pool_shape(int planes, int h, int w) {
  int oh = h / 2, ow = w / 2;
  size_t nx = (size_t)planes * h * w, ny = (size_t)planes * oh * ow;
  float *x = alloc_floats(nx), *y = alloc_floats(ny), *y2 = alloc_floats(ny), *r = alloc_floats(ny);
  float *dx = alloc_floats(nx);
  uint8_t *arg = malloc(ny), *arg2 = malloc(ny);
  /* Distinct values 0.01 apart (a shuffled grid, half of them negative), so
   * a step of 1e-3 never changes a window's winner or crosses ReLU's kink. */
  for (size_t i = 0; i < nx; i++) x[i] = 0.01f * (float)i - 0.005f * (float)nx + 0.0025f;
  for (size_t i = nx - 1; i > 0; i--) {
    size_t j = (size_t)urand(0, (float)(i + 1)) % (i + 1);
    float t = x[i];
    x[i] = x[j], x[j] = t;
  }
  fill(r, ny, -1, 1);
  char what[64];
  for (int relu = 0; relu <= 1; relu++) {
    snprintf(what, sizeof what, "pool %dx%d relu %d", h, w, relu);
    nn__maxpool_forward(x, (size_t)planes, h, w, relu, y, arg);
    for (int p = 0; p < planes; p++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++) {
          const float *win = x + ((size_t)p * h + 2 * i) * w + 2 * j;
          float v[4] = {win[0], win[1], win[w], win[w + 1]};
          int best = 0;
          for (int q = 1; q < 4; q++)
            if (v[q] > v[best]) best = q;
          size_t at = ((size_t)p * oh + i) * ow + j;
          float want = relu && v[best] < 0 ? 0.0f : v[best];
          if (y[at] != want || arg[at] != best) {
            fprintf(stderr, "  %s forward [%zu]: got %g (arg %d), want %g (arg %d)\n", what, at, y[at], arg[at],
                    want, best);
            failures++;
          }
        }
    nn__maxpool_backward(r, y, arg, (size_t)planes, h, w, relu, dx);
    const float eps = 1e-3f;
    for (size_t i = 0; i < nx; i++) {
      float keep = x[i];
      x[i] = keep + eps;
      nn__maxpool_forward(x, (size_t)planes, h, w, relu, y2, arg2);
      double plus = project(y2, r, ny);
      x[i] = keep - eps;
      nn__maxpool_forward(x, (size_t)planes, h, w, relu, y2, arg2);
      double minus = project(y2, r, ny);
      x[i] = keep;
      expect_close(what, i, dx[i], (plus - minus) / (2 * eps), 1e-3, 1e-3);
    }
  }
  /* Ties go to the first of the window in row-major order, as in PyTorch. */
  if (h >= 2 && w >= 2) {
    for (size_t i = 0; i < nx; i++) x[i] = 1.0f;
    x[1] = 0.0f; /* window 0: 1 0 / 1 1 -> the bottom-left wins over the bottom-right */
    x[0] = 0.0f;
    nn__maxpool_forward(x, (size_t)planes, h, w, 0, y, arg);
    CHECK(arg[0] == 2);
    if (ow > 1) CHECK(arg[1] == 0);
  }
  free(x), free(y), free(y2), free(r), free(dx), free(arg), free(arg2);
}

static void test_pool(void) {
  test_pool_shape(3, 6, 8);   /* ow 4: one block of 4 */
  test_pool_shape(2, 5, 7);   /* odd: last row and column dropped */
  test_pool_shape(2, 14, 14); /* ow 7: overlapping blocks of 4 */
  test_pool_shape(2, 4, 22);  /* ow 11: a block of 8 and an overlapping one */
  test_pool_shape(2, 4, 32);  /* ow 16: two blocks of 8 */
  test_pool_shape(2, 6, 6);   /* ow 3: scalar */
  test_pool_shape(1, 3, 19);  /* ow 9, odd width and height */
}

/* ---- 1e. flatten, softmax cross-entropy ------------------------------------------ */

static void test_flatten(void) {
  const int c = 3, batch = 4, hw = 5;
  float x[60], y[60], back[60];
  fill(x, 60, -1, 1);
  nn__flatten_forward(x, c, batch, hw, y);
  for (int ci = 0; ci < c; ci++)
    for (int b = 0; b < batch; b++)
      for (int p = 0; p < hw; p++) CHECK(y[(b * c + ci) * hw + p] == x[(ci * batch + b) * hw + p]);
  nn__flatten_backward(y, c, batch, hw, back);
  CHECK(memcmp(x, back, sizeof x) == 0);
}

static void test_softmax_xent(void) {
  enum { B = 4, C = 10 };
  float z[B * C], d[B * C];
  int32_t labels[B] = {3, 0, 9, 3};
  fill(z, B * C, -3, 3);
  int correct;
  double loss = nn__softmax_xent(z, labels, B, C, d, &correct);
  double want = 0;
  int right = 0;
  for (int b = 0; b < B; b++) {
    double s = 0;
    int best = 0;
    for (int j = 0; j < C; j++) s += exp((double)z[b * C + j]), best = z[b * C + j] > z[b * C + best] ? j : best;
    want += log(s) - z[b * C + labels[b]];
    right += best == labels[b];
  }
  expect_close("xent loss", 0, loss, want / B, 1e-6, 1e-6);
  CHECK(correct == right);
  /* Smooth: step 1e-3 on the logits, tolerance 1e-4 + 1e-3 relative. */
  const float eps = 1e-3f;
  for (int i = 0; i < B * C; i++) {
    float keep = z[i];
    z[i] = keep + eps;
    double plus = nn__softmax_xent(z, labels, B, C, NULL, NULL);
    z[i] = keep - eps;
    double minus = nn__softmax_xent(z, labels, B, C, NULL, NULL);
    z[i] = keep;
    expect_close("xent dlogits", (size_t)i, d[i], (plus - minus) / (2 * eps), 1e-4, 1e-3);
  }
  /* Stable: a shift of every logit changes nothing; huge logits stay finite. */
  float shifted[B * C];
  for (int i = 0; i < B * C; i++) shifted[i] = z[i] + 1000.0f;
  expect_close("xent shifted", 0, nn__softmax_xent(shifted, labels, B, C, NULL, NULL), loss, 1e-3, 1e-3);
  for (int i = 0; i < B * C; i++) shifted[i] = z[i] * 1e4f;
  double big = nn__softmax_xent(shifted, labels, B, C, d, NULL);
  CHECK(isfinite(big) && big >= 0);
  for (int i = 0; i < B * C; i++) CHECK(isfinite(d[i]));
}

/* ---- 1f. whole models against finite differences --------------------------------- */

static const char *const model_archs[] = {
    "mlp",
    "cnn",
    /* valid conv, conv without ReLU into a pool, conv output larger than input */
    "conv:4:3:0,relu,pool,conv:3:3:2,pool,flatten,dense:12,relu,dense:10",
    /* odd plane into the pool (27 -> 13) */
    "conv:3:4:1,relu,pool,flatten,dense:10",
};

static void random_images(float *x, int32_t *labels, int n) {
  /* The range of normalised Fashion-MNIST pixels. */
  fill(x, (size_t)n * NN_IMAGE_SIZE, -0.81f, 2.02f);
  for (int i = 0; i < n; i++) labels[i] = (int32_t)(urand(0, 10)) % 10;
}

static const tide_tensor_t *find_tensor(const tide_tensor_t *t, size_t count, const char *name) {
  for (size_t i = 0; i < count; i++)
    if (strcmp(t[i].name, name) == 0) return &t[i];
  fprintf(stderr, "no tensor %s\n", name);
  exit(1);
}

/* The model's mean loss computed independently: in double, one image at a
 * time in PyTorch's [C][H][W] layout, straight from the layer list and the
 * tensor views. */
static double reference_loss(const nn_model_t *m, const double *params, const float *x, const int32_t *labels,
                             int batch) {
  enum { CAP = 1 << 17 };
  static double buf[2][CAP];
  size_t count;
  const tide_tensor_t *t = nn_tensors(m, &count);
  double total = 0;
  for (int n = 0; n < batch; n++) {
    double *a = buf[0], *b = buf[1];
    int c = 1, h = 28, w = 28, convs = 0, denses = 0;
    for (int i = 0; i < NN_IMAGE_SIZE; i++) a[i] = x[(size_t)n * NN_IMAGE_SIZE + i];
    char layers[256], name[32], *save = NULL;
    snprintf(layers, sizeof layers, "%s", nn_model_arch(m));
    for (char *layer = strtok_r(layers, ",", &save); layer != NULL; layer = strtok_r(NULL, ",", &save)) {
      if (strncmp(layer, "conv:", 5) == 0) {
        int co, k, pad;
        CHECK(sscanf(layer, "conv:%d:%d:%d", &co, &k, &pad) == 3);
        snprintf(name, sizeof name, "conv%d.weight", ++convs);
        const double *wt = params + find_tensor(t, count, name)->offset;
        snprintf(name, sizeof name, "conv%d.bias", convs);
        const double *bias = params + find_tensor(t, count, name)->offset;
        int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
        CHECK((size_t)co * oh * ow <= CAP);
        for (int o = 0; o < co; o++)
          for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++) {
              double s = bias[o];
              for (int ci = 0; ci < c; ci++)
                for (int kh = 0; kh < k; kh++)
                  for (int kw = 0; kw < k; kw++) {
                    int ih = i + kh - pad, iw = j + kw - pad;
                    if (ih >= 0 && ih < h && iw >= 0 && iw < w)
                      s += wt[((o * c + ci) * k + kh) * k + kw] * a[(ci * h + ih) * w + iw];
                  }
              b[(o * oh + i) * ow + j] = s;
            }
        c = co, h = oh, w = ow;
      } else if (strcmp(layer, "relu") == 0) {
        for (int i = 0; i < c * h * w; i++) b[i] = a[i] > 0 ? a[i] : 0;
      } else if (strcmp(layer, "pool") == 0) {
        for (int ci = 0; ci < c; ci++)
          for (int i = 0; i < h / 2; i++)
            for (int j = 0; j < w / 2; j++) {
              const double *win = a + (ci * h + 2 * i) * w + 2 * j;
              b[(ci * (h / 2) + i) * (w / 2) + j] = fmax(fmax(win[0], win[1]), fmax(win[w], win[w + 1]));
            }
        h /= 2, w /= 2;
      } else if (strcmp(layer, "flatten") == 0) {
        c = c * h * w, h = w = 1;
        continue; /* [C][H][W] already is the flat order */
      } else {
        int out;
        CHECK(sscanf(layer, "dense:%d", &out) == 1);
        snprintf(name, sizeof name, "fc%d.weight", ++denses);
        const double *wt = params + find_tensor(t, count, name)->offset;
        snprintf(name, sizeof name, "fc%d.bias", denses);
        const double *bias = params + find_tensor(t, count, name)->offset;
        for (int o = 0; o < out; o++) {
          double s = bias[o];
          for (int i = 0; i < c; i++) s += wt[(size_t)o * c + i] * a[i];
          b[o] = s;
        }
        c = out;
      }
      double *swap = a;
      a = b, b = swap;
    }
    double max = a[0], sum = 0;
    for (int j = 1; j < NN_CLASSES; j++) max = fmax(max, a[j]);
    for (int j = 0; j < NN_CLASSES; j++) sum += exp(a[j] - max);
    total += max + log(sum) - a[labels[n]];
  }
  return total / batch;
}

/* The engine's float gradients against central differences of the double
 * reference above, step 1e-6: no float noise, and a step that small almost
 * never crosses a ReLU or pool kink. Tolerance: 1e-3 of the tensor's largest
 * gradient + 1e-3 relative (the engine's float rounding). 8 random entries
 * of every tensor. The reference loss must also match the engine's. */
static void test_model_fd(const char *arch) {
  const int batch = 2;
  nn_model_t *m;
  CHECK_OK(nn_model_create(arch, batch, 7, &m));
  float *x = alloc_floats((size_t)batch * NN_IMAGE_SIZE);
  int32_t labels[2];
  random_images(x, labels, batch);
  float loss;
  CHECK_OK(nn_forward_backward(m, x, labels, batch, &loss));
  size_t n = nn_param_count(m), count;
  const float *grads = nn_grads(m);
  double *params = malloc(n * sizeof *params);
  for (size_t i = 0; i < n; i++) params[i] = nn_params(m)[i];
  expect_close("reference loss", 0, loss, reference_loss(m, params, x, labels, batch), 1e-5, 1e-5);
  const tide_tensor_t *t = nn_tensors(m, &count);
  int probes = 0, before = failures;
  for (size_t ti = 0; ti < count; ti++) {
    double gmax = 0;
    for (size_t i = 0; i < t[ti].count; i++) gmax = fmax(gmax, fabs(grads[t[ti].offset + i]));
    for (int p = 0; p < 8; p++, probes++) {
      size_t i = t[ti].offset + (size_t)urand(0, (float)t[ti].count) % t[ti].count;
      const double eps = 1e-6;
      double keep = params[i];
      params[i] = keep + eps;
      double plus = reference_loss(m, params, x, labels, batch);
      params[i] = keep - eps;
      double minus = reference_loss(m, params, x, labels, batch);
      params[i] = keep;
      char what[128];
      snprintf(what, sizeof what, "%s %s", arch, t[ti].name);
      expect_close(what, i - t[ti].offset, grads[i], (plus - minus) / (2 * eps), 1e-3 * gmax + 1e-9, 1e-3);
    }
  }
  printf("  %s: %d probes, %d failed\n", arch, probes, failures - before);
  free(x), free(params);
  nn_model_destroy(m);
}

/* ---- 2. against PyTorch ------------------------------------------------------------ */

static int torch_available(void) {
  return system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") == 0;
}

static void write_file(const char *dir, const char *name, const void *data, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(data, 1, bytes, f) == bytes);
  CHECK(fclose(f) == 0);
}

static const char *source_dir(void) {
  const char *env = getenv("TIDE_SOURCE_DIR");
  if (env != NULL && *env != '\0') return env;
  /* __FILE__ is .../test/test_nn.c when CMake compiles it. */
  static char dir[1024];
  snprintf(dir, sizeof dir, "%s", __FILE__);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) return ".";
  *slash = '\0';
  slash = strrchr(dir, '/');
  if (slash == NULL) return "..";
  *slash = '\0';
  return dir;
}

typedef struct {
  const char *arch;
  int batch;
  char dir[64];
  nn_model_t *m;
  float *logits, loss;
} torch_case_t;

/* Runs the model on random images and writes what nn_torch_ref.py reads. */
static void torch_prepare(torch_case_t *tc) {
  CHECK(mkdtemp(tc->dir) != NULL);
  CHECK_OK(nn_model_create(tc->arch, tc->batch, 11, &tc->m));
  nn_model_t *m = tc->m;
  int batch = tc->batch;
  size_t n = nn_param_count(m), count;
  const tide_tensor_t *t = nn_tensors(m, &count);
  float *x = alloc_floats((size_t)batch * NN_IMAGE_SIZE);
  tc->logits = alloc_floats((size_t)batch * NN_CLASSES);
  int32_t *labels = malloc((size_t)batch * sizeof *labels);
  random_images(x, labels, batch);
  CHECK_OK(nn_forward(m, x, batch, tc->logits));
  CHECK_OK(nn_forward_backward(m, x, labels, batch, &tc->loss));

  char meta[8192];
  int len = snprintf(meta, sizeof meta, "{\"layers\": \"%s\", \"batch\": %d, \"tensors\": [", nn_model_arch(m), batch);
  for (size_t i = 0; i < count; i++) {
    len += snprintf(meta + len, sizeof meta - (size_t)len, "%s{\"name\": \"%s\", \"offset\": %zu, \"count\": %zu, \"shape\": [",
                    i ? ", " : "", t[i].name, t[i].offset, t[i].count);
    for (int d = 0; d < t[i].ndim; d++) len += snprintf(meta + len, sizeof meta - (size_t)len, "%s%d", d ? ", " : "", t[i].shape[d]);
    len += snprintf(meta + len, sizeof meta - (size_t)len, "]}");
  }
  len += snprintf(meta + len, sizeof meta - (size_t)len, "]}\n");
  CHECK(len < (int)sizeof meta);
  write_file(tc->dir, "meta.json", meta, (size_t)len);
  write_file(tc->dir, "params.bin", nn_params(m), n * sizeof(float));
  write_file(tc->dir, "x.bin", x, (size_t)batch * NN_IMAGE_SIZE * sizeof(float));
  write_file(tc->dir, "labels.bin", labels, (size_t)batch * sizeof(int32_t));
  free(x), free(labels);
}

/* Loss 1e-5 relative; logits 1e-5 of the largest; gradients, per tensor,
 * 1e-4 of the tensor's largest reference gradient (float32 here against
 * float64 there). */
static void torch_compare(torch_case_t *tc) {
  nn_model_t *m = tc->m;
  int batch = tc->batch;
  size_t n = nn_param_count(m), count;
  const tide_tensor_t *t = nn_tensors(m, &count);
  char path[600];
  snprintf(path, sizeof path, "%s/ref.bin", tc->dir);
  size_t want_values = 1 + (size_t)batch * NN_CLASSES + n;
  double *ref = malloc(want_values * sizeof *ref);
  FILE *f = fopen(path, "rb");
  CHECK(f != NULL);
  CHECK(fread(ref, sizeof *ref, want_values, f) == want_values);
  fclose(f);
  int before = failures;
  expect_close("torch loss", 0, tc->loss, ref[0], 0, 1e-5);
  double zmax = 0, worst = 0;
  for (int i = 0; i < batch * NN_CLASSES; i++) zmax = fmax(zmax, fabs(ref[1 + i]));
  for (int i = 0; i < batch * NN_CLASSES; i++)
    expect_close("torch logits", (size_t)i, tc->logits[i], ref[1 + i], 1e-5 * zmax, 0);
  const double *gref = ref + 1 + (size_t)batch * NN_CLASSES;
  const float *g = nn_grads(m);
  for (size_t ti = 0; ti < count; ti++) {
    double gmax = 0, err = 0;
    for (size_t i = t[ti].offset; i < t[ti].offset + t[ti].count; i++) gmax = fmax(gmax, fabs(gref[i]));
    for (size_t i = t[ti].offset; i < t[ti].offset + t[ti].count; i++) err = fmax(err, fabs(g[i] - gref[i]));
    char what[96];
    snprintf(what, sizeof what, "torch %s %s (max error %.3g of max %.3g)", tc->arch, t[ti].name, err, gmax);
    expect_close(what, 0, err, 0, 1e-4 * gmax + 1e-9, 0);
    worst = fmax(worst, gmax > 0 ? err / gmax : err);
  }
  printf("  %s batch %d: loss %.6f vs torch %.6f, worst gradient error %.2g of the tensor's largest%s\n", tc->arch,
         batch, tc->loss, ref[0], worst, failures > before ? " FAILED" : "");
  free(ref);
}

static void torch_cleanup(torch_case_t *tc) {
  const char *files[] = {"meta.json", "params.bin", "x.bin", "labels.bin", "ref.bin"};
  char path[600];
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", tc->dir, files[i]);
    unlink(path);
  }
  rmdir(tc->dir);
  free(tc->logits);
  nn_model_destroy(tc->m);
}

/* 0 when skipped (no torch), 1 when run. */
static int test_torch(void) {
  if (!torch_available()) {
    printf("skipped: torch not available (/usr/bin/python3 cannot import torch and numpy)\n");
    return 0;
  }
  torch_case_t cases[] = {
      {.arch = "mlp", .batch = 8},
      {.arch = "cnn", .batch = 16}, /* conv2 runs in chunks of 11 images */
      {.arch = model_archs[2], .batch = 3},
      {.arch = model_archs[3], .batch = 3},
  };
  enum { CASES = sizeof cases / sizeof cases[0] };
  char cmd[4096];
  int len = snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/test/nn_torch_ref.py'", source_dir());
  for (int i = 0; i < CASES; i++) {
    snprintf(cases[i].dir, sizeof cases[i].dir, "/tmp/tide-nn-torch-XXXXXX");
    torch_prepare(&cases[i]);
    len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %s", cases[i].dir);
  }
  CHECK(len < (int)sizeof cmd);
  int rc = system(cmd);
  if (rc != 0) {
    fprintf(stderr, "  `%s` failed (status %d)\n", cmd, rc);
    failures++;
  }
  for (int i = 0; i < CASES; i++) {
    if (rc == 0) torch_compare(&cases[i]);
    torch_cleanup(&cases[i]);
  }
  return 1;
}

/* ---- 3. Fashion-MNIST ---------------------------------------------------------------- */

/* Overridable (-DFASHION_DIR='"/nowhere"') to exercise the paths without the dataset. */
#ifndef FASHION_DIR
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"
#endif

static int fashion_installed(void) {
  struct stat st;
  return stat(FASHION_DIR "/train-images-idx3-ubyte.gz", &st) == 0 &&
         stat(FASHION_DIR "/t10k-labels-idx1-ubyte.gz", &st) == 0;
}

/* Known values, read once with Python's gzip module. */
static void check_split(const nn_dataset_t *ds, size_t count, const int32_t *first_labels, double first_pixel_sum) {
  CHECK(nn_dataset_count(ds) == count);
  const int32_t *labels = nn_dataset_labels(ds);
  for (int i = 0; i < 10; i++) CHECK(labels[i] == first_labels[i]);
  const float *x = nn_dataset_images(ds);
  float lo = (0.0f - 0.2860f) / 0.3530f, hi = (1.0f - 0.2860f) / 0.3530f, min = x[0], max = x[0];
  for (size_t i = 0; i < count * NN_IMAGE_SIZE; i++) min = fminf(min, x[i]), max = fmaxf(max, x[i]);
  expect_close("pixel min", 0, min, lo, 1e-6, 0);
  expect_close("pixel max", 0, max, hi, 1e-6, 0);
  double sum = 0; /* raw bytes of the first image */
  for (int i = 0; i < NN_IMAGE_SIZE; i++) sum += ((double)x[i] * 0.3530 + 0.2860) * 255.0;
  expect_close("first image pixel sum", 0, sum, first_pixel_sum, 0.5, 0);
  int counts[NN_CLASSES] = {0};
  for (size_t i = 0; i < count; i++) counts[labels[i]]++;
  for (int c = 0; c < NN_CLASSES; c++) CHECK(counts[c] == (int)count / NN_CLASSES); /* balanced */
}

/* 0 when skipped (no dataset), 1 when run. */
static int test_fashion_real(void) {
  if (!fashion_installed()) {
    printf("skipped: Fashion-MNIST not installed at " FASHION_DIR " (apt-get install dataset-fashion-mnist)\n");
    return 0;
  }
  nn_dataset_t *train, *test;
  CHECK_OK(nn_fashion_load(NULL, "train", &train)); /* NULL: the default dir */
  CHECK_OK(nn_fashion_load(FASHION_DIR, "test", &test));
  const int32_t train_first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, test_first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  check_split(train, 60000, train_first, 76247);
  check_split(test, 10000, test_first, 33456);
  nn_dataset_free(train);
  nn_dataset_free(test);
  printf("  loaded 60000 + 10000 images\n");
  return 1;
}

/* idx files are written uncompressed (gzread reads those as they are) or,
 * with zlib, compressed; both go through the same checks. */
static void write_idx(const char *dir, const char *name, uint32_t magic, const uint32_t *dims, int ndim,
                      const unsigned char *body, size_t body_len, size_t cut) {
  unsigned char *buf = malloc(4 + 4 * (size_t)ndim + body_len);
  size_t len = 0;
  uint32_t fields[4] = {magic, 0, 0, 0};
  for (int i = 0; i < ndim; i++) fields[1 + i] = dims[i];
  for (int i = 0; i <= ndim; i++)
    for (int b = 3; b >= 0; b--) buf[len++] = (unsigned char)(fields[i] >> (8 * b));
  memcpy(buf + len, body, body_len);
  len += body_len;
  if (cut > 0 && cut < len) len = cut;
  write_file(dir, name, buf, len);
  free(buf);
}

static void remove_split(const char *dir, const char *stem) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, stem);
  unlink(path);
  snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, stem);
  unlink(path);
}

static void test_fashion_broken(void) {
  char tmp[] = "/tmp/tide-nn-idx-XXXXXX";
  CHECK(mkdtemp(tmp) != NULL);
  nn_dataset_t *ds = NULL;
  enum { N = 20 };
  unsigned char labels[N], images[N * NN_IMAGE_SIZE];
  for (int i = 0; i < N; i++) labels[i] = (unsigned char)(i % 10);
  for (int i = 0; i < N * NN_IMAGE_SIZE; i++) images[i] = (unsigned char)(i * 7);
  uint32_t ldims[1] = {N}, idims[3] = {N, 28, 28};

  /* Missing directory and missing files: TIDE_ENOENT. */
  CHECK_RC(nn_fashion_load("/nonexistent/tide-nn", "train", &ds), TIDE_ENOENT);
  CHECK_RC(nn_fashion_load(tmp, "test", &ds), TIDE_ENOENT);
  CHECK_RC(nn_fashion_load(tmp, "validation", &ds), TIDE_EINVAL);
  CHECK_RC(nn_fashion_load(tmp, NULL, &ds), TIDE_EINVAL);
  CHECK(ds == NULL);

  /* A good small pair loads. */
  write_idx(tmp, "t10k-labels-idx1-ubyte.gz", 0x801, ldims, 1, labels, N, 0);
  write_idx(tmp, "t10k-images-idx3-ubyte.gz", 0x803, idims, 3, images, sizeof images, 0);
  CHECK_OK(nn_fashion_load(tmp, "test", &ds));
  CHECK(nn_dataset_count(ds) == N);
  CHECK(nn_dataset_labels(ds)[13] == 3);
  expect_close("pixel", 5, nn_dataset_images(ds)[5], ((35.0f / 255.0f) - 0.2860f) / 0.3530f, 1e-6, 0);
  nn_dataset_free(ds);
  ds = NULL;

  /* Each of these is TIDE_EINVAL, never a crash or a huge allocation. */
  struct {
    const char *why;
    uint32_t lmagic, imagic, ln, in, side;
    size_t lcut, icut;
    int bad_label;
  } cases[] = {
      {"images truncated", 0x801, 0x803, N, N, 28, 0, 16 + 5 * NN_IMAGE_SIZE, 0},
      {"labels truncated", 0x801, 0x803, N, N, 28, 8 + N / 2, 0, 0},
      {"header truncated", 0x801, 0x803, N, N, 28, 6, 0, 0},
      {"bad labels magic", 0x803, 0x803, N, N, 28, 0, 0, 0},
      {"bad images magic", 0x801, 0x801, N, N, 28, 0, 0, 0},
      {"count mismatch", 0x801, 0x803, N, N - 1, 28, 0, 0, 0},
      {"wrong image size", 0x801, 0x803, N, N, 27, 0, 0, 0},
      {"absurd count", 0x801, 0x803, 0xffffffffu, N, 28, 0, 0, 0},
      {"zero count", 0x801, 0x803, 0, 0, 28, 0, 0, 0},
      {"label out of range", 0x801, 0x803, N, N, 28, 0, 0, 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    uint32_t ld[1] = {cases[c].ln}, id[3] = {cases[c].in, cases[c].side, cases[c].side};
    unsigned char bad[N];
    memcpy(bad, labels, N);
    if (cases[c].bad_label) bad[7] = 10;
    write_idx(tmp, "t10k-labels-idx1-ubyte.gz", cases[c].lmagic, ld, 1, bad, N, cases[c].lcut);
    write_idx(tmp, "t10k-images-idx3-ubyte.gz", cases[c].imagic, id, 3, images, sizeof images, cases[c].icut);
    int rc = nn_fashion_load(tmp, "test", &ds);
    if (rc != TIDE_EINVAL) {
      fprintf(stderr, "  broken idx (%s): got %d (%s), want TIDE_EINVAL\n", cases[c].why, rc, tide_err_name(rc));
      failures++;
    }
    CHECK(ds == NULL);
  }
#ifdef TEST_HAVE_ZLIB
  /* A real gzip stream cut in the middle. */
  char path[600];
  snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", tmp);
  write_idx(tmp, "t10k-labels-idx1-ubyte.gz", 0x801, ldims, 1, labels, N, 0);
  gzFile gz = gzopen(path, "wb");
  CHECK(gz != NULL);
  unsigned char head[16] = {0, 0, 8, 3, 0, 0, 0, N, 0, 0, 0, 28, 0, 0, 0, 28};
  CHECK(gzwrite(gz, head, sizeof head) == (int)sizeof head);
  CHECK(gzwrite(gz, images, sizeof images) == (int)sizeof images);
  CHECK(gzclose(gz) == Z_OK);
  CHECK_OK(nn_fashion_load(tmp, "test", &ds));
  nn_dataset_free(ds);
  ds = NULL;
  struct stat st;
  CHECK(stat(path, &st) == 0);
  CHECK(truncate(path, st.st_size / 2) == 0);
  CHECK_RC(nn_fashion_load(tmp, "test", &ds), TIDE_EINVAL);
  CHECK(ds == NULL);
#endif
  remove_split(tmp, "t10k");
  rmdir(tmp);
}

/* ---- 4. API, seeding, training ------------------------------------------------------- */

static void test_api(void) {
  nn_model_t *m = NULL;
  CHECK_RC(nn_model_create("resnet50", 8, 1, &m), TIDE_EINVAL);
  CHECK_RC(nn_model_create(NULL, 8, 1, &m), TIDE_EINVAL);
  CHECK_RC(nn_model_create("mlp", 0, 1, &m), TIDE_EINVAL);
  const char *bad[] = {"dense:10",          /* no flatten */
                       "flatten,dense:9",   /* 9 logits */
                       "relu,flatten,dense:10",
                       "flatten,conv:4:3:1,dense:10",
                       "conv:4:3:1,relu,relu,flatten,dense:10",
                       "conv:4:31:0,flatten,dense:10",
                       "conv:0:3:1,flatten,dense:10",
                       "flatten,dense:10,",
                       "flatten,,dense:10",
                       "flatten,dense:10,relu",
                       "flatten;dense:10",
                       "pool,pool,pool,pool,pool,flatten,dense:10"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = nn_model_create(bad[i], 4, 1, &m);
    if (rc != TIDE_EINVAL) {
      fprintf(stderr, "  nn_model_create(\"%s\") returned %d, want TIDE_EINVAL\n", bad[i], rc);
      failures++;
    }
  }
  CHECK(m == NULL);
  nn_model_destroy(NULL);
  nn_dataset_free(NULL);

  /* Layouts: the tensors tile the buffer in order, PyTorch shapes and names. */
  struct {
    const char *arch;
    size_t params;
    const char *names[8];
    int shape0[8], shape1[8];
  } known[] = {
      {"mlp", NN_IMAGE_SIZE * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10,
       {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"},
       {256, 256, 128, 128, 10, 10},
       {NN_IMAGE_SIZE, 0, 256, 0, 128, 0}},
      {"cnn", 32 * 9 + 32 + 64 * 32 * 9 + 64 + 3136 * 128 + 128 + 128 * 10 + 10,
       {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight",
        "fc2.bias"},
       {32, 32, 64, 64, 128, 128, 10, 10},
       {1, 0, 32, 0, 3136, 0, 128, 0}},
  };
  for (int k = 0; k < 2; k++) {
    CHECK_OK(nn_model_create(known[k].arch, 16, 5, &m));
    CHECK(nn_param_count(m) == known[k].params);
    CHECK(nn_model_max_batch(m) == 16);
    size_t count, at = 0;
    const tide_tensor_t *t = nn_tensors(m, &count);
    CHECK(count == (k == 0 ? 6u : 8u));
    for (size_t i = 0; i < count; i++) {
      CHECK(strcmp(t[i].name, known[k].names[i]) == 0);
      CHECK(t[i].offset == at);
      CHECK(t[i].shape[0] == known[k].shape0[i]);
      CHECK((t[i].ndim == 1) == (int)(i % 2)); /* weight, bias, weight, ... */
      size_t prod = 1;
      for (int d = 0; d < t[i].ndim; d++) prod *= (size_t)t[i].shape[d];
      CHECK(prod == t[i].count);
      if (t[i].ndim != 1) CHECK(t[i].shape[1] == known[k].shape1[i]);
      if (t[i].ndim != 1) CHECK(t[i].ndim == (strncmp(t[i].name, "conv", 4) == 0 ? 4 : 2));
      /* PyTorch's default bound, 1/sqrt(fan_in), for weights and biases. */
      size_t fan_in = t[i - (t[i].ndim == 1)].count / (size_t)t[i].shape[0];
      float bound = 1.0f / sqrtf((float)fan_in), big = 0;
      for (size_t j = 0; j < t[i].count; j++) {
        CHECK(fabsf(nn_params(m)[t[i].offset + j]) <= bound);
        big = fmaxf(big, fabsf(nn_params(m)[t[i].offset + j]));
      }
      if (t[i].count >= 64) CHECK(big > 0.9f * bound);
      at += t[i].count;
    }
    CHECK(at == nn_param_count(m));

    /* Argument errors leave everything alone. */
    float x[2 * NN_IMAGE_SIZE] = {0}, loss = -1, logits[2 * NN_CLASSES];
    int32_t labels[2] = {1, 10};
    CHECK_RC(nn_forward_backward(m, x, labels, 2, &loss), TIDE_EINVAL);
    labels[1] = -1;
    CHECK_RC(nn_forward_backward(m, x, labels, 2, &loss), TIDE_EINVAL);
    labels[1] = 2;
    CHECK_RC(nn_forward_backward(m, x, labels, 0, &loss), TIDE_EINVAL);
    CHECK_RC(nn_forward_backward(m, x, labels, 17, &loss), TIDE_EINVAL);
    CHECK_RC(nn_forward_backward(m, NULL, labels, 2, &loss), TIDE_EINVAL);
    CHECK_RC(nn_forward_backward(NULL, x, labels, 2, &loss), TIDE_EINVAL);
    CHECK_RC(nn_forward_backward(m, x, NULL, 2, &loss), TIDE_EINVAL);
    CHECK_RC(nn_evaluate(m, x, labels, 0, &loss, NULL), TIDE_EINVAL);
    CHECK_RC(nn_forward(m, x, 2, NULL), TIDE_EINVAL);
    CHECK(loss == -1);
    CHECK_OK(nn_forward_backward(m, x, labels, 2, NULL));
    CHECK_OK(nn_forward(m, x, 2, logits));
    nn_model_destroy(m);
  }

  /* The same seed gives the same weights (the value is pinned, so a change
   * to the initialisation shows); another seed different ones. */
  nn_model_t *a, *b, *c;
  CHECK_OK(nn_model_create("mlp", 4, 42, &a));
  CHECK_OK(nn_model_create("mlp", 64, 42, &b));
  CHECK_OK(nn_model_create("mlp", 4, 43, &c));
  CHECK(memcmp(nn_params(a), nn_params(b), nn_param_count(a) * sizeof(float)) == 0);
  CHECK(memcmp(nn_params(a), nn_params(c), nn_param_count(a) * sizeof(float)) != 0);
  printf("  mlp seed 42: params[0] = %.9g, params[last] = %.9g\n", nn_params(a)[0],
         nn_params(a)[nn_param_count(a) - 1]);
  CHECK(nn_params(a)[0] == PINNED_FIRST_WEIGHT);
  nn_model_destroy(a);
  nn_model_destroy(b);
  nn_model_destroy(c);
}

/* Batches: results do not depend on max_batch, on where a batch sits, or on
 * calling twice (gradients are overwritten, not accumulated); nn_evaluate's
 * chunks add up to the whole. */
static void test_batching(const char *arch) {
  enum { N = 24 };
  nn_model_t *small, *big;
  CHECK_OK(nn_model_create(arch, 4, 3, &small));
  CHECK_OK(nn_model_create(arch, 32, 3, &big));
  float *x = alloc_floats(N * NN_IMAGE_SIZE), loss1, loss2, loss3;
  int32_t labels[N];
  random_images(x, labels, N);
  size_t n = nn_param_count(small);
  float *g = alloc_floats(n);
  CHECK_OK(nn_forward_backward(small, x, labels, 4, &loss1));
  memcpy(g, nn_grads(small), n * sizeof *g);
  CHECK_OK(nn_forward_backward(small, x, labels, 4, &loss2));
  CHECK(loss1 == loss2 && memcmp(g, nn_grads(small), n * sizeof *g) == 0);
  CHECK_OK(nn_forward_backward(big, x, labels, 4, &loss3));
  expect_close("loss at another max_batch", 0, loss3, loss1, 1e-6, 1e-6);
  for (size_t i = 0; i < n; i++) expect_close("grad at another max_batch", i, nn_grads(big)[i], g[i], 1e-7, 1e-5);
  /* Evaluate all N in chunks of 4 against one batch of N. */
  float eval_loss, logits[N * NN_CLASSES];
  int correct;
  CHECK_OK(nn_evaluate(small, x, labels, N, &eval_loss, &correct));
  CHECK_OK(nn_forward(big, x, N, logits));
  int right;
  double want = nn__softmax_xent(logits, labels, N, NN_CLASSES, NULL, &right);
  expect_close("chunked evaluate", 0, eval_loss, want, 1e-6, 1e-5);
  CHECK(correct == right);
  free(x), free(g);
  nn_model_destroy(small);
  nn_model_destroy(big);
}

/* 200 plain SGD steps (batch 32, lr 0.1) over 2000 training images (or, if
 * the dataset is missing, 2000 synthetic ones whose class is a bright
 * stripe) must cut the mean loss over those images to below half. */
static void test_training(void) {
  enum { N = 2000, BATCH = 32, STEPS = 200 };
  nn_dataset_t *ds = NULL;
  const float *images;
  const int32_t *labels;
  float *synthetic = NULL;
  int32_t *synthetic_labels = NULL;
  if (fashion_installed() && nn_fashion_load(FASHION_DIR, "train", &ds) == 0) {
    images = nn_dataset_images(ds);
    labels = nn_dataset_labels(ds);
  } else {
    printf("  (no dataset: training on synthetic images)\n");
    synthetic = alloc_floats((size_t)N * NN_IMAGE_SIZE);
    synthetic_labels = malloc(N * sizeof *synthetic_labels);
    for (int i = 0; i < N; i++) {
      int cls = (int)urand(0, 10) % 10;
      synthetic_labels[i] = cls;
      for (int p = 0; p < NN_IMAGE_SIZE; p++)
        synthetic[(size_t)i * NN_IMAGE_SIZE + p] = urand(-0.8f, 0.2f) + ((p / 28) / 3 == cls ? 1.5f : 0.0f);
    }
    images = synthetic;
    labels = synthetic_labels;
  }
  nn_model_t *m;
  CHECK_OK(nn_model_create("mlp", BATCH, 1, &m));
  float before, after, loss;
  int correct;
  CHECK_OK(nn_evaluate(m, images, labels, N, &before, &correct));
  size_t n = nn_param_count(m);
  float *p = nn_params(m), *g = nn_grads(m);
  for (int s = 0; s < STEPS; s++) {
    int at = (s * BATCH) % (N - BATCH);
    CHECK_OK(nn_forward_backward(m, images + (size_t)at * NN_IMAGE_SIZE, labels + at, BATCH, &loss));
    CHECK(isfinite(loss));
    for (size_t i = 0; i < n; i++) p[i] -= 0.1f * g[i];
  }
  CHECK_OK(nn_evaluate(m, images, labels, N, &after, &correct));
  printf("  mlp, %d SGD steps: loss %.3f -> %.3f, accuracy %.1f%% on the %d images\n", STEPS, before, after,
         100.0 * correct / N, N);
  CHECK(after < 0.5f * before);
  nn_model_destroy(m);
  nn_dataset_free(ds);
  free(synthetic);
  free(synthetic_labels);
}

static double start_s;
static double elapsed_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - start_s;
}
/* skipped: what of the section did not run (NULL: all of it ran). */
static void section(const char *name, const char *skipped) {
  if (skipped != NULL && failures == 0)
    printf("%s: SKIPPED %s (%.1f s)\n", name, skipped, elapsed_s());
  else
    printf("%s: %s (%.1f s)\n", name, failures ? "FAILED" : "ok", elapsed_s());
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  start_s = elapsed_s();
  printf("nn engine, BLAS: %s\n", nn_blas_info());
  nn_set_threads(2);
  test_dense();
  test_relu();
  test_conv();
  test_pool();
  test_flatten();
  test_softmax_xent();
  section("layers against references and finite differences", NULL);
  for (size_t i = 0; i < sizeof model_archs / sizeof model_archs[0]; i++) test_model_fd(model_archs[i]);
  section("models against finite differences", NULL);
  section("models against PyTorch", test_torch() ? NULL : "(no torch)");
  test_api();
  test_batching("mlp");
  test_batching("cnn");
  section("api, seeding and batching", NULL);
  test_fashion_broken();
  section("fashion-mnist loader", test_fashion_real() ? NULL : "on the real files (not installed; broken files ok)");
  test_training();
  section("training", NULL);
  if (failures) {
    fprintf(stderr, "test_nn: %d checks failed\n", failures);
    return 1;
  }
  printf("test_nn: all checks passed\n");
  return 0;
}
