/* Optimizers and learning-rate schedules: hand-computed steps of every kind,
 * torch.optim as the reference for the kinds torch has (skipped without
 * torch), a double-precision reference written from the LARS and LAMB
 * formulas, exclusion of biases and 1-D tensors, zero norms, state round
 * trips, invalid arguments, out-of-memory paths and the schedules. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* got within rel * max(|want|, floor) of want; the floor keeps values that
 * cancel to near 0 from demanding more than float precision. */
#define CHECK_NEAR(got, want, rel, floor)                                                   \
  do {                                                                                      \
    double near_got_ = (got), near_want_ = (want);                                          \
    double near_scale_ = fabs(near_want_) > (floor) ? fabs(near_want_) : (floor);           \
    if (!(fabs(near_got_ - near_want_) <= (rel) * near_scale_)) {                           \
      fprintf(stderr, "%s:%d: %s = %.9g, wanted %.9g (%s)\n", __FILE__, __LINE__, #got,      \
              near_got_, near_want_, #want);                                                \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static void check_vec(const char *what, int step, const float *got, const double *want,
                      size_t n, double rel) {
  for (size_t i = 0; i < n; i++) {
    double scale = fabs(want[i]) > 1e-3 ? fabs(want[i]) : 1e-3;
    if (!(fabs(got[i] - want[i]) <= rel * scale)) {
      fprintf(stderr, "%s step %d: element %zu = %.9g, wanted %.9g\n", what, step, i,
              (double)got[i], want[i]);
      exit(1);
    }
  }
}

static tide_optim_t *make(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                          size_t ntensors, size_t nparams) {
  tide_optim_t *opt = NULL;
  CHECK_OK(tide_optim_create(config, tensors, ntensors, nparams, &opt));
  CHECK(opt != NULL);
  return opt;
}

/* ---- 1. hand-computed steps ---------------------------------------------- */

/* A 2x2 weight and a bias of 2, in one flat buffer. */
static const tide_tensor_t small_layout[2] = {{"fc.weight", 0, 4, 2, {2, 2, 0, 0}},
                                              {"fc.bias", 4, 2, 1, {2, 0, 0, 0}}};
static const float p0[6] = {1, 2, -1, 0.5f, 0.5f, -0.5f};
static const float g1[6] = {0.5f, -1, 0.25f, 2, 1, 0};
static const float g2[6] = {1, 1, -1, 0, -0.5f, 2};

/* Two steps of `config` from p0 with g1 then g2 at lr, checked after each. */
static void hand_two_steps(const char *what, const tide_optim_config_t *config, float lr,
                           const double want1[6], const double want2[6], double rel) {
  tide_optim_t *opt = make(config, small_layout, 2, 6);
  float p[6];
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, g1, lr));
  check_vec(what, 1, p, want1, 6, rel);
  CHECK_OK(tide_optim_step(opt, p, g2, lr));
  check_vec(what, 2, p, want2, 6, rel);
  CHECK(tide_optim_step_count(opt) == 2);
  tide_optim_destroy(opt);
}

static void hand_sgd_family(void) {
  tide_optim_config_t c;
  /* SGD, lr 0.1, weight decay 0.1 with the bias excluded (exclude_1d):
   * step 1, weight: d = g1 + 0.1 w = (0.6, -0.8, 0.15, 2.05), w -= 0.1 d
   *   -> (0.94, 2.08, -1.015, 0.295); bias: b -= 0.1 g1 -> (0.4, -0.5).
   * step 2, weight: d = g2 + 0.1 w = (1.094, 1.208, -1.1015, 0.0295)
   *   -> (0.8306, 1.9592, -0.90485, 0.29205); bias -> (0.45, -0.7). */
  tide_optim_config_default(TIDE_OPTIM_SGD, &c);
  c.weight_decay = 0.1f;
  c.exclude_1d = 1;
  const double sgd1[6] = {0.94, 2.08, -1.015, 0.295, 0.4, -0.5};
  const double sgd2[6] = {0.8306, 1.9592, -0.90485, 0.29205, 0.45, -0.7};
  hand_two_steps("sgd", &c, 0.1f, sgd1, sgd2, 1e-6);

  /* Momentum 0.9 (dampening 0), lr 0.1: buf1 = g1, p1 = p0 - 0.1 g1
   *   = (0.95, 2.1, -1.025, 0.3, 0.4, -0.5);
   * buf2 = 0.9 g1 + g2 = (1.45, 0.1, -0.775, 1.8, 0.4, 2), p2 = p1 - 0.1 buf2
   *   = (0.805, 2.09, -0.9475, 0.12, 0.36, -0.7). */
  tide_optim_config_default(TIDE_OPTIM_MOMENTUM, &c);
  const double mom1[6] = {0.95, 2.1, -1.025, 0.3, 0.4, -0.5};
  const double mom2[6] = {0.805, 2.09, -0.9475, 0.12, 0.36, -0.7};
  hand_two_steps("momentum", &c, 0.1f, mom1, mom2, 1e-6);

  /* Nesterov 0.9, lr 0.1: step 1 d = g1 + 0.9 buf1 = 1.9 g1, p1 = p0 - 0.19 g1
   *   = (0.905, 2.19, -1.0475, 0.12, 0.31, -0.5);
   * step 2 d = g2 + 0.9 buf2 = (2.305, 1.09, -1.6975, 1.62, -0.14, 3.8)
   *   -> p2 = (0.6745, 2.081, -0.87775, -0.042, 0.324, -0.88). */
  tide_optim_config_default(TIDE_OPTIM_NESTEROV, &c);
  const double nes1[6] = {0.905, 2.19, -1.0475, 0.12, 0.31, -0.5};
  const double nes2[6] = {0.6745, 2.081, -0.87775, -0.042, 0.324, -0.88};
  hand_two_steps("nesterov", &c, 0.1f, nes1, nes2, 1e-6);
}

static void hand_adam_family(void) {
  tide_optim_config_t c;
  /* Adam (0.9, 0.999, 1e-8), lr 0.1. Step 1: m_hat = g, v_hat = g^2, so
   * w -= 0.1 g/(|g| + 1e-8) = 0.1 sign(g) (0 where g = 0):
   *   p1 = (0.9, 2.1, -1.1, 0.4, 0.4, -0.5).
   * Step 2, element 0: m = 0.09*0.5 + 0.1*1 = 0.145, m_hat = 0.145/0.19 =
   * 0.763158; v = 0.000999*0.25 + 0.001*1 = 0.00124975, v_hat = v/0.001999 =
   * 0.625188, sqrt 0.790688; w = 0.9 - 0.1*0.763158/0.790688 = 0.803482.
   * The other elements the same way. */
  tide_optim_config_default(TIDE_OPTIM_ADAM, &c);
  const double adam1[6] = {0.9, 2.1, -1.1, 0.4, 0.4, -0.5};
  const double adam2[6] = {0.8034818, 2.0947368, -1.0440496, 0.3329942, 0.3733663, -0.5744137};
  hand_two_steps("adam", &c, 0.1f, adam1, adam2, 1e-5);

  /* AdamW, lr 0.1, weight decay 0.1 (decoupled, the bias included): every
   * step first scales w by 1 - 0.01, then takes the Adam step above:
   * p1 = 0.99 p0 - 0.1 sign(g1) = (0.89, 2.08, -1.09, 0.395, 0.395, -0.495);
   * element 0 at step 2: 0.99*0.89 - 0.096518 = 0.784582. */
  tide_optim_config_default(TIDE_OPTIM_ADAMW, &c);
  c.weight_decay = 0.1f;
  const double adamw1[6] = {0.89, 2.08, -1.09, 0.395, 0.395, -0.495};
  const double adamw2[6] = {0.7845818, 2.0539368, -1.0231496, 0.3240442, 0.3644163, -0.5644637};
  hand_two_steps("adamw", &c, 0.1f, adamw1, adamw2, 1e-5);
}

static void hand_lars_lamb(void) {
  tide_optim_config_t c;
  const float w0[6] = {3, 0, 0, 4, 1, -1}; /* |W| = 5 */
  /* LARS, lr 1, eta 0.01, eps 0, weight decay 0.1, momentum 0.9, bias excluded.
   * Step 1: gW = (0.6, 0, 0, 0.8), |g| = 1: local = 0.01*5/(1 + 0.1*5) = 1/30;
   *   vW = 1/30 * (gW + 0.1 W) = 1/30 * (0.9, 0, 0, 1.2) = (0.03, 0, 0, 0.04),
   *   W1 = (2.97, 0, 0, 3.96) = 0.99 W; bias: v = gb = (0.5, 0.5), b1 = (0.5, -1.5).
   * Step 2: gW = (0, 0.3, 0.4, 0), |g| = 0.5, |W1| = 4.95:
   *   local = 0.0495/(0.5 + 0.495) = 0.0497487;
   *   vW = 0.9*(0.03, 0, 0, 0.04) + local*(0.297, 0.3, 0.4, 0.396)
   *      = (0.0417754, 0.0149246, 0.0198995, 0.0557005), W2 = W1 - vW;
   *   bias: v = 0.9*(0.5, 0.5) + (-1, 0) = (-0.55, 0.45), b2 = (1.05, -1.95). */
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.trust_coef = 0.01f;
  c.eps = 0;
  c.weight_decay = 0.1f;
  const float lars_g1[6] = {0.6f, 0, 0, 0.8f, 0.5f, 0.5f};
  const float lars_g2[6] = {0, 0.3f, 0.4f, 0, -1, 0};
  const double lars1[6] = {2.97, 0, 0, 3.96, 0.5, -1.5};
  const double lars2[6] = {2.97 - 0.0417754, -0.0149246, -0.0198995, 3.96 - 0.0557005, 1.05, -1.95};
  tide_optim_t *opt = make(&c, small_layout, 2, 6);
  float p[6];
  memcpy(p, w0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, lars_g1, 1.0f));
  check_vec("lars", 1, p, lars1, 6, 1e-5);
  CHECK_OK(tide_optim_step(opt, p, lars_g2, 1.0f));
  check_vec("lars", 2, p, lars2, 6, 1e-5);
  tide_optim_destroy(opt);

  /* LAMB (0.9, 0.999, eps 1e-6, weight decay 0.01), lr 0.1, bias excluded.
   * Step 1: r = g/(|g| + 1e-6) = sign(g) to 2e-6; gW = (0.6, 0, 0, -0.8):
   *   u = r + 0.01 W = (1.03, 0, 0, -0.96), |u| = sqrt(1.9825) = 1.408013,
   *   trust = 5/1.408013 = 3.551104, W1 = W - 0.1*3.551104*u
   *   = (2.634236, 0, 0, 4.340906); bias: b1 = b - 0.1 sign(gb) = (0.9, -0.9).
   * Step 2, element 0: m = 0.09*0.6 + 0.1*0.3 = 0.084, m_hat = 0.442105;
   *   v = 0.000999*0.36 + 0.001*0.09 = 4.4964e-4, v_hat = 0.224932, sqrt 0.474270,
   *   r = 0.932178, u = r + 0.01*2.634236 = 0.958520; likewise
   *   u = (0.958520, 0.744134, 0, -0.626648), |u| = 1.365717, |W1| = 5.077590,
   *   trust = 3.717946, W2 = W1 - 0.1*trust*u. */
  tide_optim_config_default(TIDE_OPTIM_LAMB, &c);
  const float lamb_g1[6] = {0.6f, 0, 0, -0.8f, 0.5f, -2};
  const float lamb_g2[6] = {0.3f, 0.4f, 0, 0, 0, 1};
  const double lamb1[6] = {2.634236, 0, 0, 4.340906, 0.9, -0.9};
  const double lamb2[6] = {2.6342363 - 0.1 * 3.7179459 * 0.9585200,
                           -0.1 * 3.7179459 * 0.7441342,
                           0,
                           4.3409061 + 0.1 * 3.7179459 * 0.6266480,
                           0.9 - 0.1 * 0.6700564,
                           -0.9 + 0.1 * 0.2663369};
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, w0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, lamb_g1, 0.1f));
  check_vec("lamb", 1, p, lamb1, 6, 1e-5);
  CHECK_OK(tide_optim_step(opt, p, lamb_g2, 0.1f));
  check_vec("lamb", 2, p, lamb2, 6, 1e-5);
  tide_optim_destroy(opt);
}

/* ---- 2. against torch.optim ---------------------------------------------- */

/* Two linear layers, 179 parameters: long enough for the vector loops and
 * their remainders. */
static const tide_tensor_t mlp_layout[4] = {{"l1.weight", 0, 112, 2, {16, 7, 0, 0}},
                                            {"l1.bias", 112, 16, 1, {16, 0, 0, 0}},
                                            {"l2.weight", 128, 48, 2, {3, 16, 0, 0}},
                                            {"l2.bias", 176, 3, 1, {3, 0, 0, 0}}};
#define MLP_N 179
#define TORCH_STEPS 6

typedef struct {
  tide_optim_kind_t kind;
  float weight_decay;
  int exclude_1d;
  int whole; /* 1: no tensor list (one tensor) */
  float lr;
} torch_case_t;

static const torch_case_t torch_cases[] = {
    {TIDE_OPTIM_SGD, 0, 0, 0, 0.1f},       {TIDE_OPTIM_SGD, 0.05f, 0, 0, 0.1f},
    {TIDE_OPTIM_MOMENTUM, 0, 0, 0, 0.05f}, {TIDE_OPTIM_MOMENTUM, 0.05f, 0, 0, 0.05f},
    {TIDE_OPTIM_MOMENTUM, 0.05f, 1, 0, 0.05f}, {TIDE_OPTIM_NESTEROV, 0, 0, 0, 0.05f},
    {TIDE_OPTIM_NESTEROV, 0.05f, 0, 0, 0.05f}, {TIDE_OPTIM_NESTEROV, 0.05f, 1, 0, 0.05f},
    {TIDE_OPTIM_ADAM, 0, 0, 0, 0.01f},     {TIDE_OPTIM_ADAM, 0.05f, 0, 0, 0.01f},
    {TIDE_OPTIM_ADAM, 0.05f, 1, 0, 0.01f}, {TIDE_OPTIM_ADAM, 0.05f, 0, 1, 0.01f},
    {TIDE_OPTIM_ADAMW, 0, 0, 0, 0.01f},    {TIDE_OPTIM_ADAMW, 0.05f, 0, 0, 0.01f},
    {TIDE_OPTIM_ADAMW, 0.05f, 1, 0, 0.01f},
};
#define TORCH_NCASES (sizeof torch_cases / sizeof torch_cases[0])

static float uniform(unsigned *state) { return (float)(harness_rand(state) % 20001) / 10000.0f - 1.0f; }

static const char *source_dir(char *buf, size_t cap) {
  const char *env = getenv("TIDE_SOURCE_DIR");
  if (env != NULL && env[0] != '\0') {
    snprintf(buf, cap, "%s", env);
    return buf;
  }
  /* __FILE__ is .../test/test_optim.c: strip two components. */
  snprintf(buf, cap, "%s", __FILE__);
  for (int k = 0; k < 2; k++) {
    char *slash = strrchr(buf, '/');
    if (slash == NULL) {
      snprintf(buf, cap, "..");
      return buf;
    }
    *slash = '\0';
  }
  return buf;
}

/* Returns 1 when compared, 0 when torch is unavailable. */
static int against_torch(void) {
  char src[1024], script[1200], in_path[] = "/tmp/tide_optim_in_XXXXXX",
                                out_path[] = "/tmp/tide_optim_out_XXXXXX";
  snprintf(script, sizeof script, "%s/test/optim_torch_ref.py", source_dir(src, sizeof src));
  if (access("/usr/bin/python3", X_OK) != 0 || access(script, R_OK) != 0) {
    printf("skipped: torch not available (no /usr/bin/python3 or %s)\n", script);
    return 0;
  }
  int in_fd = mkstemp(in_path), out_fd = mkstemp(out_path);
  CHECK(in_fd >= 0 && out_fd >= 0);
  close(out_fd);
  FILE *in = fdopen(in_fd, "w");
  CHECK(in != NULL);
  static float results[TORCH_NCASES][TORCH_STEPS][MLP_N];
  fprintf(in, "%zu\n", TORCH_NCASES);
  for (size_t k = 0; k < TORCH_NCASES; k++) {
    const torch_case_t *tc = &torch_cases[k];
    tide_optim_config_t c;
    tide_optim_config_default(tc->kind, &c);
    c.weight_decay = tc->weight_decay;
    c.exclude_1d = tc->exclude_1d;
    tide_optim_t *opt = make(&c, tc->whole ? NULL : mlp_layout, tc->whole ? 0 : 4, MLP_N);
    unsigned rng = 1234u + (unsigned)k;
    float params[MLP_N], grads[MLP_N];
    for (int i = 0; i < MLP_N; i++) params[i] = uniform(&rng);
    const char *kind = tide_optim_name(tc->kind);
    fprintf(in, "%s %.9g %.9g %.9g %.9g %.9g %d %d %d\n", kind, (double)c.momentum,
            (double)c.beta1, (double)c.beta2, (double)c.eps, (double)c.weight_decay, MLP_N,
            tc->whole ? 1 : 4, TORCH_STEPS);
    if (tc->whole) {
      fprintf(in, "0 %d 1\n", MLP_N);
    } else {
      for (int t = 0; t < 4; t++)
        fprintf(in, "%zu %zu %d\n", mlp_layout[t].offset, mlp_layout[t].count,
                !(tc->exclude_1d && mlp_layout[t].ndim == 1));
    }
    for (int i = 0; i < MLP_N; i++) fprintf(in, "%.9g ", (double)params[i]);
    fprintf(in, "\n");
    for (int s = 0; s < TORCH_STEPS; s++) {
      /* A decaying rate, as a schedule would give: torch reads it per step. */
      float lr = tc->lr * (1.0f - 0.1f * (float)s);
      for (int i = 0; i < MLP_N; i++) grads[i] = uniform(&rng);
      if (s == 2) grads[5] = 0; /* a zero gradient through Adam's eps */
      fprintf(in, "%.9g ", (double)lr);
      for (int i = 0; i < MLP_N; i++) fprintf(in, "%.9g ", (double)grads[i]);
      fprintf(in, "\n");
      CHECK_OK(tide_optim_step(opt, params, grads, lr));
      memcpy(results[k][s], params, sizeof params);
    }
    tide_optim_destroy(opt);
  }
  CHECK(fclose(in) == 0);
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s' '%s'", script, in_path, out_path);
  int status = system(cmd);
  int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 3 || code == 127) {
    printf("skipped: torch not available\n");
    unlink(in_path);
    unlink(out_path);
    return 0;
  }
  if (code != 0) {
    fprintf(stderr, "%s failed (status %d); input kept in %s\n", cmd, status, in_path);
    exit(1);
  }
  FILE *out = fopen(out_path, "r");
  CHECK(out != NULL);
  double worst = 0;
  for (size_t k = 0; k < TORCH_NCASES; k++) {
    for (int s = 0; s < TORCH_STEPS; s++) {
      for (int i = 0; i < MLP_N; i++) {
        double want;
        CHECK(fscanf(out, "%lf", &want) == 1);
        double got = results[k][s][i];
        /* rel 1e-5, floor 0.1: values that cancel to ~0 are held to 1e-6 absolute. */
        double scale = fabs(want) > 0.1 ? fabs(want) : 0.1;
        double err = fabs(got - want) / scale;
        if (err > worst) worst = err;
        if (!(err <= 1e-5)) {
          fprintf(stderr, "torch case %zu (%s wd=%g exclude_1d=%d) step %d element %d: tide %.9g, "
                  "torch %.9g\n", k, tide_optim_name(torch_cases[k].kind),
                  (double)torch_cases[k].weight_decay, torch_cases[k].exclude_1d, s + 1, i, got,
                  want);
          exit(1);
        }
      }
    }
  }
  fclose(out);
  unlink(in_path);
  unlink(out_path);
  printf("torch.optim: %zu cases x %d steps match (worst relative error %.2g)\n", TORCH_NCASES,
         TORCH_STEPS, worst);
  return 1;
}

/* ---- 3. LARS and LAMB against a double-precision reference ---------------- */

/* Out of offset order on purpose (create sorts); conv weight 4-D; a norm
 * scale (1-D) and a bias stored 1x5 that only its name marks as a bias. */
static const tide_tensor_t net_layout[5] = {
    {"conv.weight", 16, 108, 4, {4, 3, 3, 3}},
    {"conv.bias", 0, 16, 1, {16, 0, 0, 0}},
    {"norm.weight", 124, 4, 1, {4, 0, 0, 0}},
    {"fc.weight", 128, 112, 2, {16, 7, 0, 0}},
    {"head.bias", 240, 5, 2, {1, 5, 0, 0}},
};
#define NET_N 245
#define REF_STEPS 5

/* Whether the formulas skip decay and trust ratio for tensor t: written
 * here from the rule (ndim <= 1 or a name ending in "bias"). */
static int ref_plain(const tide_tensor_t *t, int exclude_1d) {
  if (!exclude_1d) return 0;
  size_t len = strlen(t->name);
  return t->ndim <= 1 || (len >= 4 && strcmp(t->name + len - 4, "bias") == 0);
}

static double ref_norm(const double *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += x[i] * x[i];
  return sqrt(s);
}

/* LARS, per layer l (You et al. 2017):
 *   local_l = eta |w_l| / (|g_l| + beta |w_l| + eps), 1 if |w_l| = 0 or |g_l| + beta |w_l| = 0
 *   v_l = m v_l + lr local_l (g_l + beta w_l);  w_l -= v_l
 * excluded tensors: beta = 0, local = 1. */
static void ref_lars_step(const tide_optim_config_t *c, double *w, double *vel, const double *g,
                          double lr) {
  for (int t = 0; t < 5; t++) {
    const tide_tensor_t *x = &net_layout[t];
    double *wl = w + x->offset, *vl = vel + x->offset;
    const double *gl = g + x->offset;
    int plain = ref_plain(x, c->exclude_1d);
    double beta = plain ? 0 : c->weight_decay, local = 1;
    double wn = ref_norm(wl, x->count), gn = ref_norm(gl, x->count);
    if (!plain && wn > 0 && gn + beta * wn > 0) local = c->trust_coef * wn / (gn + beta * wn + c->eps);
    for (size_t i = 0; i < x->count; i++) {
      vl[i] = c->momentum * vl[i] + lr * local * (gl[i] + beta * wl[i]);
      wl[i] -= vl[i];
    }
  }
}

/* LAMB (You et al. 2020, Algorithm 2):
 *   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; m_hat = m/(1-b1^t); v_hat = v/(1-b2^t)
 *   u_l = m_hat/(sqrt(v_hat)+eps) + lambda w_l;  w_l -= lr |w_l|/|u_l| u_l
 * ratio 1 if |w_l| = 0 or |u_l| = 0; excluded tensors: lambda = 0, ratio 1. */
static void ref_lamb_step(const tide_optim_config_t *c, double *w, double *m, double *v,
                          const double *g, double lr, int t) {
  double bc1 = 1 - pow(c->beta1, t), bc2 = 1 - pow(c->beta2, t);
  static double u[NET_N];
  for (int k = 0; k < 5; k++) {
    const tide_tensor_t *x = &net_layout[k];
    int plain = ref_plain(x, c->exclude_1d);
    double lambda = plain ? 0 : c->weight_decay;
    for (size_t i = x->offset; i < x->offset + x->count; i++) {
      m[i] = c->beta1 * m[i] + (1 - c->beta1) * g[i];
      v[i] = c->beta2 * v[i] + (1 - c->beta2) * g[i] * g[i];
      u[i] = (m[i] / bc1) / (sqrt(v[i] / bc2) + c->eps) + lambda * w[i];
    }
    double wn = ref_norm(w + x->offset, x->count), un = ref_norm(u + x->offset, x->count);
    double ratio = (!plain && wn > 0 && un > 0) ? wn / un : 1;
    for (size_t i = x->offset; i < x->offset + x->count; i++) w[i] -= lr * ratio * u[i];
  }
}

/* REF_STEPS steps of the optimizer and the reference from the same data;
 * returns the largest relative difference and leaves the final params. */
static double run_vs_ref(const tide_optim_config_t *c, unsigned seed, float lr0, float *params_out) {
  unsigned rng = seed;
  float params[NET_N], grads[NET_N];
  static double w[NET_N], s1[NET_N], s2[NET_N], g[NET_N];
  for (int i = 0; i < NET_N; i++) {
    params[i] = uniform(&rng);
    w[i] = params[i];
    s1[i] = s2[i] = 0;
  }
  tide_optim_t *opt = make(c, net_layout, 5, NET_N);
  double worst = 0;
  for (int s = 1; s <= REF_STEPS; s++) {
    float lr = lr0 * (1.0f - 0.15f * (float)(s - 1));
    for (int i = 0; i < NET_N; i++) {
      grads[i] = uniform(&rng) * (i < 16 ? 0.1f : 1.0f); /* conv.bias: smaller gradients */
      g[i] = grads[i];
    }
    CHECK_OK(tide_optim_step(opt, params, grads, lr));
    if (c->kind == TIDE_OPTIM_LARS) ref_lars_step(c, w, s1, g, lr);
    else ref_lamb_step(c, w, s1, s2, g, lr, s);
    for (int i = 0; i < NET_N; i++) {
      double scale = fabs(w[i]) > 0.01 ? fabs(w[i]) : 0.01;
      double err = fabs(params[i] - w[i]) / scale;
      if (err > worst) worst = err;
      if (!(err <= 1e-5)) {
        fprintf(stderr, "%s (wd=%g exclude_1d=%d) step %d element %d: %.9g, reference %.9g\n",
                tide_optim_name(c->kind), (double)c->weight_decay, c->exclude_1d, s, i,
                (double)params[i], w[i]);
        exit(1);
      }
    }
  }
  if (params_out != NULL) memcpy(params_out, params, sizeof params);
  tide_optim_destroy(opt);
  return worst;
}

static void lars_lamb_reference(void) {
  tide_optim_config_t c;
  double worst = 0, e;
  for (int exclude = 0; exclude <= 1; exclude++) {
    tide_optim_config_default(TIDE_OPTIM_LARS, &c); /* eta 0.001, eps 1e-5 */
    c.exclude_1d = exclude;
    c.weight_decay = 5e-4f;
    e = run_vs_ref(&c, 77, 2.0f, NULL);
    worst = e > worst ? e : worst;
    c.trust_coef = 0.05f; /* large enough to move the weights visibly */
    c.weight_decay = 0.1f;
    c.momentum = 0.8f;
    e = run_vs_ref(&c, 78, 0.5f, NULL);
    worst = e > worst ? e : worst;

    tide_optim_config_default(TIDE_OPTIM_LAMB, &c);
    c.exclude_1d = exclude;
    e = run_vs_ref(&c, 79, 0.01f, NULL);
    worst = e > worst ? e : worst;
    c.weight_decay = 0.3f;
    c.beta1 = 0.8f;
    c.beta2 = 0.99f;
    e = run_vs_ref(&c, 80, 0.05f, NULL);
    worst = e > worst ? e : worst;
  }
  printf("lars/lamb: %d steps match the double reference (worst relative error %.2g)\n",
         REF_STEPS, worst);
}

/* exclude_1d: the excluded tensors' results do not depend on weight decay
 * or trust coefficient; without exclusion, and for the others, they do. */
static void exclusion(void) {
  static const int plain_tensor[5] = {0, 1, 1, 0, 1}; /* conv.bias, norm.weight, head.bias */
  float a[NET_N], b[NET_N];
  tide_optim_config_t c;
  for (int kind = 0; kind < 2; kind++) {
    for (int exclude = 0; exclude <= 1; exclude++) {
      tide_optim_config_default(kind == 0 ? TIDE_OPTIM_LARS : TIDE_OPTIM_LAMB, &c);
      c.exclude_1d = exclude;
      c.weight_decay = 0.01f;
      run_vs_ref(&c, 5, 0.1f, a);
      c.weight_decay = 0.2f;
      c.trust_coef = kind == 0 ? 0.01f : c.trust_coef;
      run_vs_ref(&c, 5, 0.1f, b);
      for (int t = 0; t < 5; t++) {
        const tide_tensor_t *x = &net_layout[t];
        int same = memcmp(a + x->offset, b + x->offset, x->count * sizeof(float)) == 0;
        if (same != (exclude && plain_tensor[t])) {
          fprintf(stderr, "%s exclude_1d=%d: tensor %s %s with the decay\n",
                  kind == 0 ? "lars" : "lamb", exclude, x->name, same ? "did not change" : "changed");
          exit(1);
        }
      }
    }
  }
  /* An excluded tensor under LARS is plain momentum SGD with the rate
   * inside the velocity: v = 0.9 v + lr g; w -= v. */
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.weight_decay = 0.5f;
  tide_optim_t *opt = make(&c, small_layout, 2, 6);
  float p[6];
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, g1, 0.1f));
  CHECK_OK(tide_optim_step(opt, p, g2, 0.1f));
  CHECK_NEAR(p[4], 0.5 - 0.1 * 1 - (0.9 * 0.1 * 1 + 0.1 * -0.5), 1e-6, 1e-3);
  CHECK_NEAR(p[5], -0.5 - 0.1 * 0 - (0.9 * 0.1 * 0 + 0.1 * 2), 1e-6, 1e-3);
  tide_optim_destroy(opt);
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

/* Trust ratio 1 when a norm is 0: zero weights still move, zero updates do
 * not divide by zero, and nothing turns into NaN. */
static void zero_norms(void) {
  tide_optim_config_t c;
  const float zero6[6] = {0};
  const float w_zero_bias[6] = {0, 0, 0, 0, 1, -1};
  float p[6];
  tide_optim_t *opt;

  /* LARS, weights 0, gradient g1, eta 0.001, wd 0.1: |w| = 0 -> ratio 1,
   * v = lr (g + 0.1*0) and w = -0.5 g1 (lr 0.5), where eta would give ~0. */
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.weight_decay = 0.1f;
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, w_zero_bias, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, g1, 0.5f));
  for (int i = 0; i < 4; i++) CHECK_NEAR(p[i], -0.5 * g1[i], 1e-6, 1e-3);
  tide_optim_destroy(opt);

  /* LARS, gradient 0 and no weight decay: |g| + beta|w| = 0 -> ratio 1,
   * the update is 0; the weights stay exactly as they were. */
  c.weight_decay = 0;
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, zero6, 0.5f));
  CHECK(memcmp(p, p0, sizeof p) == 0);
  tide_optim_destroy(opt);

  /* LARS, gradient 0, weight decay 0.1, eps 0: local = eta |w| / (0.1 |w|)
   * = 10 eta, so w -= lr * 10 eta * 0.1 w = w * (1 - lr * eta). */
  c.weight_decay = 0.1f;
  c.eps = 0;
  c.trust_coef = 0.01f;
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, zero6, 0.5f));
  for (int i = 0; i < 4; i++) CHECK_NEAR(p[i], p0[i] * (1 - 0.5 * 0.01), 1e-6, 1e-3);
  tide_optim_destroy(opt);

  /* LAMB, weights 0: ratio 1, w = -lr r = -0.1 sign(g1) (wd*0 = 0). */
  tide_optim_config_default(TIDE_OPTIM_LAMB, &c);
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, w_zero_bias, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, g1, 0.1f));
  for (int i = 0; i < 4; i++) CHECK_NEAR(p[i], -0.1 * (g1[i] > 0 ? 1 : g1[i] < 0 ? -1 : 0), 1e-5, 1e-3);
  tide_optim_destroy(opt);

  /* LAMB, gradient 0 and weight decay 0: u = 0 -> ratio 1, no change. */
  c.weight_decay = 0;
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, zero6, 0.1f));
  CHECK(memcmp(p, p0, sizeof p) == 0);
  tide_optim_destroy(opt);

  /* LAMB, gradient 0, weight decay 0.01: u = 0.01 w, ratio |w|/|0.01 w| = 100,
   * so w -= lr * 100 * 0.01 w: w = w (1 - lr) on the weight. */
  c.weight_decay = 0.01f;
  opt = make(&c, small_layout, 2, 6);
  memcpy(p, p0, sizeof p);
  CHECK_OK(tide_optim_step(opt, p, zero6, 0.1f));
  for (int i = 0; i < 4; i++) CHECK_NEAR(p[i], p0[i] * 0.9, 1e-6, 1e-3);
  CHECK(p[4] == p0[4] && p[5] == p0[5]);
  tide_optim_destroy(opt);

  /* Everything 0, every kind, exclusion on and off: stays 0, no NaN. */
  for (int kind = 0; kind < TIDE_OPTIM_KIND_COUNT; kind++) {
    for (int exclude = 0; exclude <= 1; exclude++) {
      tide_optim_config_default((tide_optim_kind_t)kind, &c);
      c.exclude_1d = exclude;
      opt = make(&c, small_layout, 2, 6);
      memset(p, 0, sizeof p);
      for (int s = 0; s < 3; s++) CHECK_OK(tide_optim_step(opt, p, zero6, 0.1f));
      CHECK(all_finite(p, 6));
      for (int i = 0; i < 6; i++) CHECK(p[i] == 0.0f);
      tide_optim_destroy(opt);
    }
  }
}

/* ---- state round trip -------------------------------------------------- */

static void state_round_trip(void) {
  for (int kind = 0; kind < TIDE_OPTIM_KIND_COUNT; kind++) {
    tide_optim_config_t c;
    tide_optim_config_default((tide_optim_kind_t)kind, &c);
    tide_optim_t *a = make(&c, net_layout, 5, NET_N), *b = make(&c, net_layout, 5, NET_N);
    unsigned rng = 99u + (unsigned)kind;
    float pa[NET_N], pb[NET_N], g[NET_N];
    for (int i = 0; i < NET_N; i++) pa[i] = uniform(&rng);
    for (int s = 0; s < 3; s++) {
      for (int i = 0; i < NET_N; i++) g[i] = uniform(&rng);
      CHECK_OK(tide_optim_step(a, pa, g, 0.01f));
    }
    size_t size = tide_optim_state_size(a);
    CHECK(size == tide_optim_state_size(b) && size % 4 == 0);
    unsigned char *blob = malloc(size + 8);
    CHECK(blob != NULL);
    CHECK_RC(tide_optim_state_get(a, blob, size - 1), TIDE_EINVAL);
    CHECK_OK(tide_optim_state_get(a, blob, size + 8));
    /* Wrong length, corrupted header: refused, b keeps its state. */
    CHECK_RC(tide_optim_state_set(b, blob, size + 4), TIDE_EINVAL);
    CHECK_RC(tide_optim_state_set(b, blob, 10), TIDE_EINVAL);
    blob[0] ^= 0xff;
    CHECK_RC(tide_optim_state_set(b, blob, size), TIDE_EINVAL);
    blob[0] ^= 0xff;
    CHECK(tide_optim_step_count(b) == 0);
    CHECK_OK(tide_optim_state_set(b, blob, size));
    CHECK(tide_optim_step_count(b) == 3);
    memcpy(pb, pa, sizeof pa);
    for (int s = 0; s < 2; s++) {
      for (int i = 0; i < NET_N; i++) g[i] = uniform(&rng);
      CHECK_OK(tide_optim_step(a, pa, g, 0.02f));
      CHECK_OK(tide_optim_step(b, pb, g, 0.02f));
      CHECK(memcmp(pa, pb, sizeof pa) == 0);
    }
    /* Another kind or size refuses the blob. */
    tide_optim_config_t other;
    tide_optim_config_default((tide_optim_kind_t)((kind + 1) % TIDE_OPTIM_KIND_COUNT), &other);
    tide_optim_t *c2 = make(&other, net_layout, 5, NET_N);
    CHECK_RC(tide_optim_state_set(c2, blob, size), TIDE_EINVAL);
    tide_optim_t *d = make(&c, NULL, 0, NET_N - 1);
    CHECK_RC(tide_optim_state_set(d, blob, size), TIDE_EINVAL);
    tide_optim_destroy(c2);
    tide_optim_destroy(d);
    free(blob);
    tide_optim_destroy(a);
    tide_optim_destroy(b);
  }
}

/* ---- invalid arguments --------------------------------------------------- */

static void expect_bad_config(const tide_optim_config_t *c) {
  tide_optim_t *opt = (tide_optim_t *)&opt; /* out must stay untouched */
  tide_optim_t *const sentinel = opt;
  CHECK_RC(tide_optim_config_check(c), TIDE_EINVAL);
  CHECK_RC(tide_optim_create(c, small_layout, 2, 6, &opt), TIDE_EINVAL);
  CHECK(opt == sentinel);
}

static void invalid_configs(void) {
  tide_optim_config_t c;
  for (int kind = 0; kind < TIDE_OPTIM_KIND_COUNT; kind++) {
    tide_optim_config_default((tide_optim_kind_t)kind, &c);
    CHECK_OK(tide_optim_config_check(&c));
    c.weight_decay = -0.1f;
    expect_bad_config(&c);
    c.weight_decay = NAN;
    expect_bad_config(&c);
    tide_optim_config_default((tide_optim_kind_t)kind, &c);
    c.exclude_1d = 2;
    expect_bad_config(&c);
  }
  const tide_optim_kind_t adams[3] = {TIDE_OPTIM_ADAM, TIDE_OPTIM_ADAMW, TIDE_OPTIM_LAMB};
  for (int k = 0; k < 3; k++) {
    const float bad_beta[4] = {-0.1f, 1.0f, 1.5f, NAN};
    for (int j = 0; j < 4; j++) {
      tide_optim_config_default(adams[k], &c);
      c.beta1 = bad_beta[j];
      expect_bad_config(&c);
      tide_optim_config_default(adams[k], &c);
      c.beta2 = bad_beta[j];
      expect_bad_config(&c);
    }
    tide_optim_config_default(adams[k], &c);
    c.eps = 0;
    expect_bad_config(&c);
    c.eps = -1e-8f;
    expect_bad_config(&c);
    c.eps = INFINITY;
    expect_bad_config(&c);
  }
  tide_optim_config_default(TIDE_OPTIM_SGD, &c);
  c.momentum = 0.9f; /* would be silently ignored */
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_MOMENTUM, &c);
  c.momentum = 1.0f;
  expect_bad_config(&c);
  c.momentum = -0.5f;
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_NESTEROV, &c);
  c.momentum = 0; /* torch refuses Nesterov without momentum too */
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.trust_coef = 0;
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.eps = -1;
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.momentum = 1.2f;
  expect_bad_config(&c);
  tide_optim_config_default(TIDE_OPTIM_LARS, &c);
  c.eps = 0; /* the paper's form: allowed */
  CHECK_OK(tide_optim_config_check(&c));
  c.kind = (tide_optim_kind_t)42;
  expect_bad_config(&c);
  CHECK_RC(tide_optim_config_check(NULL), TIDE_EINVAL);

  /* An irrelevant field out of range does not matter. */
  tide_optim_config_default(TIDE_OPTIM_MOMENTUM, &c);
  c.beta1 = 7;
  CHECK_OK(tide_optim_config_check(&c));

  /* Tensors. */
  tide_optim_config_default(TIDE_OPTIM_LAMB, &c);
  tide_optim_t *opt = NULL;
  tide_tensor_t t[2];
  memcpy(t, small_layout, sizeof t);
  t[1].offset = 3; /* overlaps fc.weight */
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  memcpy(t, small_layout, sizeof t);
  CHECK_RC(tide_optim_create(&c, t, 2, 7, &opt), TIDE_EINVAL); /* element 6 uncovered */
  CHECK_RC(tide_optim_create(&c, t, 2, 5, &opt), TIDE_EINVAL); /* bias runs past the end */
  CHECK_RC(tide_optim_create(&c, t, 1, 6, &opt), TIDE_EINVAL); /* [4, 6) uncovered */
  t[1].offset = 5;
  t[1].count = 1;
  t[1].shape[0] = 1;
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL); /* gap at 4 */
  memcpy(t, small_layout, sizeof t);
  t[0].shape[1] = 3; /* 2x3 != 4 */
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  memcpy(t, small_layout, sizeof t);
  t[0].ndim = 5;
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  memcpy(t, small_layout, sizeof t);
  t[0].shape[0] = -2;
  t[0].shape[1] = -2;
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  memcpy(t, small_layout, sizeof t);
  t[1].count = 0;
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  memcpy(t, small_layout, sizeof t);
  t[0].name = NULL; /* unnamed tensors are fine */
  t[1].offset = SIZE_MAX - 1; /* offset + count overflows */
  CHECK_RC(tide_optim_create(&c, t, 2, 6, &opt), TIDE_EINVAL);
  CHECK_RC(tide_optim_create(&c, NULL, 2, 6, &opt), TIDE_EINVAL);
  CHECK_RC(tide_optim_create(&c, NULL, 0, 0, &opt), TIDE_EINVAL);
  CHECK_RC(tide_optim_create(&c, NULL, 0, 6, NULL), TIDE_EINVAL);
  CHECK(opt == NULL);
  /* A scalar (ndim 0, count 1) and tensors given in any order are fine. */
  tide_tensor_t scalar[2] = {{"scale", 6, 1, 0, {0}}, small_layout[0]};
  tide_tensor_t all3[3] = {small_layout[1], scalar[0], small_layout[0]};
  opt = make(&c, all3, 3, 7);
  tide_optim_destroy(opt);

  /* Steps. */
  opt = make(&c, small_layout, 2, 6);
  float p[6];
  memcpy(p, p0, sizeof p);
  CHECK_RC(tide_optim_step(opt, p, g1, -0.1f), TIDE_EINVAL);
  CHECK_RC(tide_optim_step(opt, p, g1, NAN), TIDE_EINVAL);
  CHECK_RC(tide_optim_step(opt, p, g1, INFINITY), TIDE_EINVAL);
  CHECK_RC(tide_optim_step(opt, NULL, g1, 0.1f), TIDE_EINVAL);
  CHECK_RC(tide_optim_step(opt, p, NULL, 0.1f), TIDE_EINVAL);
  CHECK_RC(tide_optim_step(NULL, p, g1, 0.1f), TIDE_EINVAL);
  CHECK(memcmp(p, p0, sizeof p) == 0 && tide_optim_step_count(opt) == 0);
  CHECK_OK(tide_optim_step(opt, p, g1, 0.0f)); /* lr 0 is valid: moments move, w does not */
  CHECK(memcmp(p, p0, sizeof p) == 0 && tide_optim_step_count(opt) == 1);
  tide_optim_destroy(opt);
  tide_optim_destroy(NULL);
  CHECK(tide_optim_state_size(NULL) == 0);

  /* Names. */
  for (int kind = 0; kind < TIDE_OPTIM_KIND_COUNT; kind++) {
    tide_optim_kind_t parsed = TIDE_OPTIM_KIND_COUNT;
    CHECK_OK(tide_optim_parse(tide_optim_name((tide_optim_kind_t)kind), &parsed));
    CHECK((int)parsed == kind);
  }
  tide_optim_kind_t parsed = TIDE_OPTIM_SGD;
  CHECK_OK(tide_optim_parse("AdamW", &parsed));
  CHECK(parsed == TIDE_OPTIM_ADAMW);
  CHECK_RC(tide_optim_parse("adagrad", &parsed), TIDE_EINVAL);
  CHECK_RC(tide_optim_parse("", &parsed), TIDE_EINVAL);
  CHECK_RC(tide_optim_parse(NULL, &parsed), TIDE_EINVAL);
  CHECK(parsed == TIDE_OPTIM_ADAMW);
  CHECK(strcmp(tide_optim_name((tide_optim_kind_t)-1), "?") == 0);
}

/* ---- out of memory ---------------------------------------------------------- */

static long live_allocations;
static long allocations_left = -1; /* -1: never fail */

static int may_allocate(void) {
  if (allocations_left == 0) return 0;
  if (allocations_left > 0) allocations_left--;
  return 1;
}
static void *t_malloc(size_t n) {
  void *p = may_allocate() ? malloc(n) : NULL;
  if (p != NULL) live_allocations++;
  return p;
}
static void *t_calloc(size_t count, size_t size) {
  void *p = may_allocate() ? calloc(count, size) : NULL;
  if (p != NULL) live_allocations++;
  return p;
}
static void *t_realloc(void *ptr, size_t n) {
  void *p = may_allocate() ? realloc(ptr, n) : NULL;
  if (p != NULL && ptr == NULL) live_allocations++;
  return p;
}
static void t_free(void *ptr) {
  if (ptr != NULL) live_allocations--;
  free(ptr);
}

/* Every allocation of create failing in turn: TIDE_ENOMEM, nothing leaked,
 * *out untouched; then it succeeds and destroy frees everything. */
static void out_of_memory(void) {
  tide_optim_config_t c;
  tide_optim_config_default(TIDE_OPTIM_LAMB, &c);
  long baseline = live_allocations;
  int failures = 0;
  for (long budget = 0;; budget++) {
    allocations_left = budget;
    tide_optim_t *opt = NULL;
    int rc = tide_optim_create(&c, net_layout, 5, NET_N, &opt);
    allocations_left = -1;
    if (rc == 0) {
      tide_optim_destroy(opt);
      CHECK(live_allocations == baseline);
      break;
    }
    CHECK_RC(rc, TIDE_ENOMEM);
    CHECK(opt == NULL);
    CHECK(live_allocations == baseline);
    failures++;
    CHECK(budget < 100);
  }
  CHECK(failures >= 3); /* object, tensors, names, state */
  /* Steps allocate nothing. */
  tide_optim_t *opt = make(&c, net_layout, 5, NET_N);
  float p[NET_N] = {0}, g[NET_N];
  for (int i = 0; i < NET_N; i++) g[i] = (float)(i % 7) - 3;
  allocations_left = 0;
  for (int s = 0; s < 3; s++) CHECK_OK(tide_optim_step(opt, p, g, 0.01f));
  allocations_left = -1;
  tide_optim_destroy(opt);
  CHECK(live_allocations == baseline);
}

/* ---- 4. schedules ----------------------------------------------------------- */

static void schedules(void) {
  tide_lr_schedule_t s;
  /* Constant with warm-up from 0.25 * 0.4 over 10 steps: linear
   * 0.1 -> 0.4; step 5: 0.4 * (0.25 + 0.75 * 5/10) = 0.25. */
  memset(&s, 0, sizeof s);
  s.kind = TIDE_LR_CONSTANT;
  s.base_lr = 0.4f;
  s.warmup_steps = 10;
  s.warmup_start_factor = 0.25f;
  CHECK_OK(tide_lr_check(&s));
  CHECK_NEAR(tide_lr_at(&s, 0), 0.1, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 5), 0.25, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 9), 0.4 * (0.25 + 0.75 * 0.9), 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 10), 0.4, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 1000000), 0.4, 1e-6, 1e-6);

  /* Step: 1.0, x0.1 every 30 steps, warm-up from 0 over 5 steps (0, 0.2, ...). */
  memset(&s, 0, sizeof s);
  s.kind = TIDE_LR_STEP;
  s.base_lr = 1.0f;
  s.step_size = 30;
  s.gamma = 0.1f;
  s.warmup_steps = 5;
  CHECK_OK(tide_lr_check(&s));
  CHECK(tide_lr_at(&s, 0) == 0.0f);
  CHECK_NEAR(tide_lr_at(&s, 1), 0.2, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 5), 1.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 29), 1.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 30), 0.1, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 61), 0.01, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 90), 0.001, 1e-6, 1e-6);

  /* Cosine 1 -> 0 over 100 steps: 25 -> (1 + cos(pi/4))/2 = 0.8535534,
   * 50 -> 0.5, 75 -> 0.1464466, 100 and after -> 0. */
  memset(&s, 0, sizeof s);
  s.kind = TIDE_LR_COSINE;
  s.base_lr = 1.0f;
  s.total_steps = 100;
  CHECK_OK(tide_lr_check(&s));
  CHECK_NEAR(tide_lr_at(&s, 0), 1.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 25), 0.8535534, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 50), 0.5, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 75), 0.1464466, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 100), 0.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 150), 0.0, 1e-6, 1e-6);
  /* With 10 warm-up steps from 0 and a floor of 0.1 over 110 steps: the
   * decay starts at step 10; step 60 is halfway: 0.1 + 0.9 * 0.5 = 0.55. */
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.final_lr = 0.1f;
  CHECK_OK(tide_lr_check(&s));
  CHECK_NEAR(tide_lr_at(&s, 4), 0.4, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 10), 1.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 60), 0.55, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 110), 0.1, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 500), 0.1, 1e-6, 1e-6);

  /* Poly, the LARS paper's power 2: 2 (1 - t/100)^2: 50 -> 0.5, 90 -> 0.02. */
  memset(&s, 0, sizeof s);
  s.kind = TIDE_LR_POLY;
  s.base_lr = 2.0f;
  s.total_steps = 100;
  s.power = 2.0f;
  CHECK_OK(tide_lr_check(&s));
  CHECK_NEAR(tide_lr_at(&s, 0), 2.0, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 50), 0.5, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 90), 0.02, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 100), 0.0, 1e-6, 1e-6);
  /* Power 1 down to 0.5: step 25 -> 0.5 + 1.5 * 0.75 = 1.625. */
  s.power = 1.0f;
  s.final_lr = 0.5f;
  CHECK_NEAR(tide_lr_at(&s, 25), 1.625, 1e-6, 1e-6);
  CHECK_NEAR(tide_lr_at(&s, 200), 0.5, 1e-6, 1e-6);
  CHECK(isnan(tide_lr_at(&s, -1)));

  /* Invalid schedules: tide_lr_check refuses, tide_lr_at gives NaN. */
  tide_lr_schedule_t good[4];
  memset(good, 0, sizeof good);
  for (int k = 0; k < 4; k++) {
    good[k].kind = (tide_lr_kind_t)k;
    good[k].base_lr = 0.1f;
    good[k].total_steps = 100;
    good[k].step_size = 10;
    good[k].gamma = 0.5f;
    good[k].power = 2;
    CHECK_OK(tide_lr_check(&good[k]));
  }
  tide_lr_schedule_t bad[16];
  int nbad = 0;
#define BAD(base, field, value) \
  do {                          \
    bad[nbad] = (base);         \
    bad[nbad].field = (value);  \
    nbad++;                     \
  } while (0)
  for (int k = 0; k < 4; k++) {
    BAD(good[k], base_lr, -0.1f);
    BAD(good[k], warmup_steps, -1);
    BAD(good[k], warmup_start_factor, 1.5f);
  }
  BAD(good[TIDE_LR_STEP], step_size, 0);
  BAD(good[TIDE_LR_STEP], gamma, 0.0f);
  BAD(good[TIDE_LR_STEP], gamma, 1.5f);
  BAD(good[TIDE_LR_COSINE], warmup_steps, 100);
#undef BAD
  CHECK(nbad <= 16);
  for (int i = 0; i < nbad; i++) {
    CHECK_RC(tide_lr_check(&bad[i]), TIDE_EINVAL);
    CHECK(isnan(tide_lr_at(&bad[i], 5)));
  }
  tide_lr_schedule_t more[4] = {good[TIDE_LR_COSINE], good[TIDE_LR_POLY], good[TIDE_LR_POLY],
                                good[TIDE_LR_CONSTANT]};
  more[0].final_lr = 0.2f; /* above base_lr */
  more[1].power = 0;
  more[2].total_steps = 0;
  more[3].kind = (tide_lr_kind_t)9;
  for (int i = 0; i < 4; i++) {
    CHECK_RC(tide_lr_check(&more[i]), TIDE_EINVAL);
    CHECK(isnan(tide_lr_at(&more[i], 5)));
  }
  CHECK_RC(tide_lr_check(NULL), TIDE_EINVAL);
  CHECK(isnan(tide_lr_at(NULL, 0)));

  for (int k = 0; k < TIDE_LR_KIND_COUNT; k++) {
    tide_lr_kind_t parsed = TIDE_LR_KIND_COUNT;
    CHECK_OK(tide_lr_parse(tide_lr_name((tide_lr_kind_t)k), &parsed));
    CHECK((int)parsed == k);
  }
  tide_lr_kind_t parsed = TIDE_LR_STEP;
  CHECK_OK(tide_lr_parse("Cosine", &parsed));
  CHECK(parsed == TIDE_LR_COSINE);
  CHECK_RC(tide_lr_parse("exponential", &parsed), TIDE_EINVAL);
  CHECK(parsed == TIDE_LR_COSINE);
  CHECK(strcmp(tide_lr_name((tide_lr_kind_t)7), "?") == 0);
}

int main(void) {
  CHECK_OK(tide_replace_allocator(t_malloc, t_realloc, t_calloc, t_free));
  hand_sgd_family();
  hand_adam_family();
  hand_lars_lamb();
  printf("hand-computed steps: ok\n");
  int torch_ran = against_torch();
  lars_lamb_reference();
  exclusion();
  zero_norms();
  printf("exclusion and zero norms: ok\n");
  state_round_trip();
  printf("state round trip: ok\n");
  invalid_configs();
  out_of_memory();
  printf("invalid arguments and out of memory: ok\n");
  schedules();
  printf("schedules: ok\n");
  printf("test_optim: passed%s\n", torch_ran ? "" : " (torch comparison skipped)");
  return 0;
}
