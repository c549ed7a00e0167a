/* Per-layer profiles (docs/burst-parallel.md): the in-memory table, tide's
 * text format, and DeepPool's A100 profile files, whose layer graph is
 * inferred from the layers' input shapes. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

enum { MAX_BATCHES = 32, MAX_LAYERS = 1 << 16 };

typedef struct {
  double fwd[MAX_BATCHES], bwd[MAX_BATCHES]; /* NAN: not profiled */
} layer_row_t;

struct tide_profile {
  char model[64];
  int nlayers, cap;
  layer_row_t *rows;
  tide_profile_layer_t *info; /* contiguous: the planner indexes it */
  int nbatches;
  int batches[MAX_BATCHES]; /* ascending */
};

int tide_profile_create(const char *model, tide_profile_t **out) {
  if (model == NULL || out == NULL || strlen(model) >= 64 || model[0] == '\0') {
    TIDE_ERROR("tide_profile_create: %s", out == NULL ? "out must not be NULL"
                                                      : "model must be a name of 1 to 63 characters");
    return TIDE_EINVAL;
  }
  tide_profile_t *p = tide__calloc(1, sizeof *p);
  if (p == NULL) return TIDE_ENOMEM;
  snprintf(p->model, sizeof p->model, "%s", model);
  *out = p;
  return 0;
}

void tide_profile_destroy(tide_profile_t *p) {
  if (p == NULL) return;
  tide__free(p->rows);
  tide__free(p->info);
  tide__free(p);
}

int tide_profile_add_layer(tide_profile_t *p, const tide_profile_layer_t *l, int *index) {
  if (p == NULL || l == NULL) {
    TIDE_ERROR("tide_profile_add_layer: %s must not be NULL", p == NULL ? "profile" : "layer");
    return TIDE_EINVAL;
  }
  int i = p->nlayers;
  if (i >= MAX_LAYERS) {
    TIDE_ERROR("tide_profile_add_layer: at most %d layers", MAX_LAYERS);
    return TIDE_EINVAL;
  }
  size_t nlen = strnlen(l->name, sizeof l->name);
  if (nlen == 0 || nlen == sizeof l->name) {
    TIDE_ERROR("tide_profile_add_layer: layer %d: name must be 1 to %zu characters", i, sizeof l->name - 1);
    return TIDE_EINVAL;
  }
  for (size_t k = 0; k < nlen; k++)
    if (isspace((unsigned char)l->name[k])) {
      TIDE_ERROR("tide_profile_add_layer: layer %d: name \"%s\" contains white space", i, l->name);
      return TIDE_EINVAL;
    }
  if (l->ninputs < 1 || l->ninputs > TIDE_PROFILE_MAX_INPUTS) {
    TIDE_ERROR("tide_profile_add_layer: layer %d: ninputs = %d must be in [1, %d]", i, l->ninputs,
               TIDE_PROFILE_MAX_INPUTS);
    return TIDE_EINVAL;
  }
  for (int k = 0; k < l->ninputs; k++)
    if (l->inputs[k] < -1 || l->inputs[k] >= i) {
      TIDE_ERROR("tide_profile_add_layer: layer %d: inputs[%d] = %d must be an earlier layer or -1 (the model's "
                 "input)", i, k, l->inputs[k]);
      return TIDE_EINVAL;
    }
  if (!(l->param_bytes >= 0 && l->act_bytes >= 0 && isfinite(l->param_bytes) && isfinite(l->act_bytes))) {
    TIDE_ERROR("tide_profile_add_layer: layer %d: param_bytes and act_bytes must be finite and >= 0", i);
    return TIDE_EINVAL;
  }
  if (i == p->cap) {
    int cap = p->cap ? 2 * p->cap : 16;
    layer_row_t *rows = tide__realloc(p->rows, (size_t)cap * sizeof *rows);
    if (rows == NULL) return TIDE_ENOMEM;
    p->rows = rows;
    tide_profile_layer_t *info = tide__realloc(p->info, (size_t)cap * sizeof *info);
    if (info == NULL) return TIDE_ENOMEM;
    p->info = info, p->cap = cap;
  }
  layer_row_t *r = &p->rows[i];
  p->info[i] = *l;
  for (int b = 0; b < MAX_BATCHES; b++) r->fwd[b] = r->bwd[b] = NAN;
  p->nlayers++;
  if (index != NULL) *index = i;
  return 0;
}

int tide_profile_set_time(tide_profile_t *p, int layer, int batch, double fwd_s, double bwd_s) {
  if (p == NULL || layer < 0 || layer >= p->nlayers || batch < 1 || !(fwd_s >= 0) || !(bwd_s >= 0) ||
      !isfinite(fwd_s) || !isfinite(bwd_s)) {
    TIDE_ERROR("tide_profile_set_time: %s", p == NULL ? "profile must not be NULL"
                                            : layer < 0 || layer >= p->nlayers ? "layer out of range"
                                            : batch < 1                       ? "batch must be >= 1"
                                                                              : "times must be finite and >= 0");
    return TIDE_EINVAL;
  }
  int b = 0;
  while (b < p->nbatches && p->batches[b] < batch) b++;
  if (b == p->nbatches || p->batches[b] != batch) {
    if (p->nbatches == MAX_BATCHES) {
      TIDE_ERROR("tide_profile_set_time: at most %d distinct batches", MAX_BATCHES);
      return TIDE_EINVAL;
    }
    memmove(&p->batches[b + 1], &p->batches[b], (size_t)(p->nbatches - b) * sizeof(int));
    for (int i = 0; i < p->nlayers; i++) {
      layer_row_t *r = &p->rows[i];
      memmove(&r->fwd[b + 1], &r->fwd[b], (size_t)(p->nbatches - b) * sizeof(double));
      memmove(&r->bwd[b + 1], &r->bwd[b], (size_t)(p->nbatches - b) * sizeof(double));
      r->fwd[b] = r->bwd[b] = NAN;
    }
    p->batches[b] = batch;
    p->nbatches++;
  }
  p->rows[layer].fwd[b] = fwd_s;
  p->rows[layer].bwd[b] = bwd_s;
  return 0;
}

const char *tide_profile_model(const tide_profile_t *p) { return p != NULL ? p->model : NULL; }
int tide_profile_layer_count(const tide_profile_t *p) { return p != NULL ? p->nlayers : 0; }

const tide_profile_layer_t *tide_profile_layer(const tide_profile_t *p, int layer) {
  return p != NULL && layer >= 0 && layer < p->nlayers ? &p->info[layer] : NULL;
}

int tide_profile_batches(const tide_profile_t *p, const int **batches) {
  if (batches != NULL) *batches = p != NULL ? p->batches : NULL;
  return p != NULL ? p->nbatches : 0;
}

double tide_profile_time(const tide_profile_t *p, int layer, int batch) {
  if (p == NULL || layer < 0 || layer >= p->nlayers || batch < 1 || p->nbatches == 0) return NAN;
  const layer_row_t *r = &p->rows[layer];
  const int *bs = p->batches;
  int n = p->nbatches;
  if (batch <= bs[0]) return r->fwd[0] + r->bwd[0];
  if (batch >= bs[n - 1]) return (r->fwd[n - 1] + r->bwd[n - 1]) * batch / bs[n - 1];
  int b = 1;
  while (bs[b] < batch) b++;
  double lo = r->fwd[b - 1] + r->bwd[b - 1], hi = r->fwd[b] + r->bwd[b];
  return lo + (hi - lo) * (batch - bs[b - 1]) / (bs[b] - bs[b - 1]);
}

/* A layer without a time at some profiled batch makes the profile unusable. */
int tide__profile_check(const tide_profile_t *p, const char *who) {
  if (p->nlayers == 0 || p->nbatches == 0) {
    TIDE_ERROR("%s: profile of %s has no %s", who, p->model, p->nlayers == 0 ? "layers" : "times");
    return TIDE_EINVAL;
  }
  for (int i = 0; i < p->nlayers; i++)
    for (int b = 0; b < p->nbatches; b++)
      if (isnan(p->rows[i].fwd[b])) {
        TIDE_ERROR("%s: profile of %s: layer %d (%s) has no time at batch %d", who, p->model, i,
                   p->info[i].name, p->batches[b]);
        return TIDE_EINVAL;
      }
  return 0;
}

/* ---- tide's format ----------------------------------------------------------- */

int tide_profile_write(const tide_profile_t *p, const char *path) {
  if (p == NULL || path == NULL) {
    TIDE_ERROR("tide_profile_write: %s must not be NULL", p == NULL ? "profile" : "path");
    return TIDE_EINVAL;
  }
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    TIDE_ERROR("tide_profile_write: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  fprintf(f, "tide-profile 1\nmodel %s\n", p->model);
  fprintf(f, "# layer INDEX NAME inputs=I[,J...] params=BYTES act=BYTES_PER_SAMPLE\n");
  for (int i = 0; i < p->nlayers; i++) {
    const tide_profile_layer_t *l = &p->info[i];
    fprintf(f, "layer %d %s inputs=", i, l->name);
    for (int k = 0; k < l->ninputs; k++) fprintf(f, "%s%d", k ? "," : "", l->inputs[k]);
    fprintf(f, " params=%.17g act=%.17g\n", l->param_bytes, l->act_bytes);
  }
  fprintf(f, "# time LAYER BATCH FORWARD_S BACKWARD_S\n");
  for (int i = 0; i < p->nlayers; i++)
    for (int b = 0; b < p->nbatches; b++)
      if (!isnan(p->rows[i].fwd[b]))
        fprintf(f, "time %d %d %.9g %.9g\n", i, p->batches[b], p->rows[i].fwd[b], p->rows[i].bwd[b]);
  if (fclose(f) != 0) {
    TIDE_ERROR("tide_profile_write: cannot write %s: %s", path, strerror(errno));
    return TIDE_EIO;
  }
  return 0;
}

static int bad_line(const char *path, int line, const char *why) {
  TIDE_ERROR("tide_profile_read: %s:%d: %s", path, line, why);
  return TIDE_EINVAL;
}

static int read_tide(FILE *f, const char *path, tide_profile_t **out) {
  char buf[1024], name[128];
  int line = 1, rc = 0;
  tide_profile_t *p = NULL;
  while (fgets(buf, sizeof buf, f) != NULL) {
    line++;
    char *s = buf;
    while (isspace((unsigned char)*s)) s++;
    if (*s == '\0' || *s == '#') continue;
    int n = 0;
    if (p == NULL) {
      if (sscanf(s, "model %63s %n", name, &n) != 1 || s[n] != '\0') {
        rc = bad_line(path, line, "expected \"model NAME\" after the first line");
        goto out;
      }
      TIDE_CHECK_GOTO(tide_profile_create(name, &p), rc, out);
      continue;
    }
    if (strncmp(s, "layer ", 6) == 0) {
      tide_profile_layer_t l = {0};
      int index;
      char inputs[256];
      if (sscanf(s, "layer %d %95s inputs=%255s params=%lf act=%lf %n", &index, l.name, inputs, &l.param_bytes,
                 &l.act_bytes, &n) != 5 || s[n] != '\0') {
        rc = bad_line(path, line, "expected \"layer INDEX NAME inputs=I[,J...] params=BYTES act=BYTES\"");
        goto out;
      }
      if (index != p->nlayers) {
        rc = bad_line(path, line, "layer indices must count up from 0 without gaps");
        goto out;
      }
      char *q = inputs;
      while (*q != '\0') {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || l.ninputs == TIDE_PROFILE_MAX_INPUTS || (*end != ',' && *end != '\0')) {
          rc = bad_line(path, line, "inputs= takes up to 8 comma-separated layer indices (-1: the model's input)");
          goto out;
        }
        l.inputs[l.ninputs++] = (int)v;
        q = *end == ',' ? end + 1 : end;
      }
      if (tide_profile_add_layer(p, &l, NULL) != 0) {
        rc = bad_line(path, line, "bad layer (inputs must be earlier layers or -1, sizes >= 0)");
        goto out;
      }
    } else if (strncmp(s, "time ", 5) == 0) {
      int layer, batch;
      double fw, bw;
      if (sscanf(s, "time %d %d %lf %lf %n", &layer, &batch, &fw, &bw, &n) != 4 || s[n] != '\0') {
        rc = bad_line(path, line, "expected \"time LAYER BATCH FORWARD_S BACKWARD_S\"");
        goto out;
      }
      if (tide_profile_set_time(p, layer, batch, fw, bw) != 0) {
        rc = bad_line(path, line, "bad time (layer not declared above, batch < 1 or a negative time)");
        goto out;
      }
    } else {
      rc = bad_line(path, line, "expected a \"layer\" or \"time\" line");
      goto out;
    }
  }
  if (p == NULL) {
    rc = bad_line(path, line, "no \"model NAME\" line");
    goto out;
  }
  TIDE_CHECK_GOTO(tide__profile_check(p, "tide_profile_read"), rc, out);
  *out = p;
  return 0;
out:
  tide_profile_destroy(p);
  return rc;
}

/* ---- DeepPool's files ---------------------------------------------------------- */

typedef struct {
  char name[96];
  int shape[4], dims; /* input per sample */
  int oshape[4], odims;
  double params;
} dp_layer_t;

/* The value of "key" in a flat JSON object: a number, true/false, or a pair
 * [a,b] (second gets b; a scalar gives b = a). */
static long json_pair(const char *json, const char *key, long dflt, long *second) {
  char pat[48];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *at = strstr(json, pat);
  long v = dflt, w;
  if (at != NULL) {
    at += strlen(pat);
    if (strncmp(at, "true", 4) == 0) v = 1;
    else if (strncmp(at, "false", 5) == 0) v = 0;
    else if (*at == '[') {
      char *end;
      v = strtol(at + 1, &end, 10);
      w = *end == ',' ? strtol(end + 1, NULL, 10) : v;
      if (second != NULL) *second = w;
      return v;
    } else {
      v = strtol(at, NULL, 10);
    }
  }
  if (second != NULL) *second = v;
  return v;
}

static long json_int(const char *json, const char *key, long dflt) { return json_pair(json, key, dflt, NULL); }

static int same_shape(const int *a, int na, const int *b, int nb) {
  return na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0;
}

static long shape_count(const int *s, int n) {
  long c = 1;
  for (int i = 0; i < n; i++) c *= s[i];
  return c;
}

/* Parses "TYPE{JSON}[BATCH][C,H,W] avg ..." (or "[BATCH]N"). */
static int parse_dp_line(const char *s, dp_layer_t *l, int *batch, double *avg_ms) {
  const char *brace = strchr(s, '{'), *close = brace ? strchr(brace, '}') : NULL;
  if (brace == NULL || close == NULL || brace == s || brace - s > 31 || close[1] != '[') return -1;
  char type[32], json[512];
  snprintf(type, sizeof type, "%.*s", (int)(brace - s), s);
  if ((size_t)(close - brace) >= sizeof json) return -1;
  snprintf(json, sizeof json, "%.*s", (int)(close - brace + 1), brace);
  const char *q = close + 2;
  char *end;
  long b = strtol(q, &end, 10);
  if (end == q || *end != ']' || b < 1 || b > 1 << 20) return -1;
  q = end + 1;
  l->dims = 0;
  int bracket = *q == '[';
  if (bracket) q++;
  for (;;) {
    long v = strtol(q, &end, 10);
    if (end == q || v < 1 || v > 1 << 24 || l->dims == 4) return -1;
    l->shape[l->dims++] = (int)v;
    q = end;
    if (*q != ',') break;
    q++;
  }
  if (bracket && *q++ != ']') return -1;
  if (!isspace((unsigned char)*q)) return -1;
  if (sscanf(q, "%lf", avg_ms) != 1 || !(*avg_ms >= 0) || !isfinite(*avg_ms)) return -1;
  *batch = (int)b;
  /* the output shape and parameters of the layer kinds whose shape changes */
  memcpy(l->oshape, l->shape, sizeof l->shape);
  l->odims = l->dims;
  l->params = 0;
  long kw, sw, pw;
  long k = json_pair(json, "kernel_size", 0, &kw), stride = json_pair(json, "stride", k, &sw);
  long pad = json_pair(json, "padding", 0, &pw);
  if (strstr(json, "\"stride\"") == NULL) sw = kw;
  if (strcmp(type, "conv2d") == 0 || strstr(type, "Pool2d") != NULL) {
    if (l->dims == 3 && k > 0 && kw > 0 && stride > 0 && sw > 0 && strncmp(type, "ad", 2) != 0) {
      l->oshape[1] = (int)((l->shape[1] + 2 * pad - k) / stride + 1);
      l->oshape[2] = (int)((l->shape[2] + 2 * pw - kw) / sw + 1);
    } else if (strncmp(type, "ad", 2) == 0 && l->dims == 3) {
      l->oshape[1] = l->oshape[2] = 1; /* adaptive average pool to 1x1 */
    }
    if (strcmp(type, "conv2d") == 0) {
      long cin = json_int(json, "in_channels", 0), cout = json_int(json, "out_channels", 0);
      if (cout > 0) l->oshape[0] = (int)cout;
      l->params = 4.0 * (double)cin * (double)cout * (double)(k * kw);
    }
  } else if (strcmp(type, "linear") == 0) {
    long in = json_int(json, "in_features", 0), o = json_int(json, "out_features", 0);
    l->oshape[0] = (int)o;
    l->odims = 1;
    l->params = 4.0 * ((double)in * (double)o + (json_int(json, "bias", 1) ? (double)o : 0.0));
  } else if (strcmp(type, "flatten") == 0) {
    l->oshape[0] = (int)shape_count(l->shape, l->dims);
    l->odims = 1;
  }
  /* name: TYPE(values of the JSON in order)[input shape] */
  char vals[64] = "";
  size_t at = 0;
  for (const char *c = strchr(json, ':'); c != NULL && at + 12 < sizeof vals; c = strchr(c + 1, ':')) {
    long v = strtol(c + 1, NULL, 10);
    if (strncmp(c + 1, "true", 4) == 0) v = 1;
    at += (size_t)snprintf(vals + at, sizeof vals - at, "%s%ld", at ? "," : "", v);
  }
  char shape[40] = "";
  at = 0;
  for (int i = 0; i < l->dims; i++)
    at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%d", i ? "," : "", l->shape[i]);
  snprintf(l->name, sizeof l->name, "%.31s(%.40s)[%.20s]", type, vals, shape);
  return 0;
}

/* Inputs from shapes: a layer whose input is not its predecessor's output
 * branches from the nearest earlier layer with that output (a fork); a later
 * layer joins the open branches when they are a chain and a one-layer
 * shortcut with its input's shape (residual add of a downsample), or when
 * its input is their concatenation along channels (Inception). A block
 * that does not close that way (nested branches) and a layer whose input
 * matches nothing are read as a chain; the rest keeps its branches. Returns
 * the number of blocks read as chains. */
static int chain_from(tide_profile_layer_t *out, int from, int to) {
  for (int k = from; k <= to; k++) out[k].ninputs = 1, out[k].inputs[0] = k - 1;
  return 1;
}

static int infer_graph(const dp_layer_t *dl, int n, tide_profile_layer_t *out) {
  int fork = -2, ends[TIDE_PROFILE_MAX_INPUTS], nends = 0, chained = 0, after = 0; /* blocks do not overlap */
  for (int i = 0; i < n; i++) {
    tide_profile_layer_t *l = &out[i];
    l->ninputs = 1;
    l->inputs[0] = i - 1;
    if (i == 0) continue;
    const dp_layer_t *prev = &dl[i - 1], *me = &dl[i];
    int follows = same_shape(me->shape, me->dims, prev->oshape, prev->odims);
    if (fork != -2) {
      const dp_layer_t *f = &dl[fork];
      /* an add only closes a one-layer shortcut (a downsample) beside one
       * chain: with longer branches equal shapes are ambiguous */
      int add = follows && nends == 1 && out[i - 1].inputs[0] == fork &&
                same_shape(dl[ends[0]].oshape, dl[ends[0]].odims, me->shape, me->dims);
      int channels = prev->oshape[0];
      for (int e = 0; e < nends; e++) channels += dl[ends[e]].oshape[0];
      int concat = me->dims == 3 && prev->odims == 3 && me->shape[0] == channels &&
                   me->shape[1] == prev->oshape[1] && me->shape[2] == prev->oshape[2];
      if (add || concat) {
        for (int e = 0; e < nends; e++) l->inputs[e] = ends[e];
        l->inputs[nends] = i - 1;
        l->ninputs = nends + 1;
        fork = -2, nends = 0, after = i;
        continue;
      }
      if (!follows && i - 1 != fork && same_shape(me->shape, me->dims, f->oshape, f->odims) &&
          nends + 1 < TIDE_PROFILE_MAX_INPUTS) {
        ends[nends++] = i - 1;
        l->inputs[0] = fork;
        continue;
      }
      if (follows) continue;
      chained += chain_from(out, fork + 1, i);
      fork = -2, nends = 0, after = i;
      continue;
    }
    if (follows) continue;
    int j = i - 2;
    while (j >= after && !same_shape(me->shape, me->dims, dl[j].oshape, dl[j].odims)) j--;
    if (j < after) continue; /* matches nothing: read as following its predecessor */
    fork = j;
    ends[0] = i - 1;
    nends = 1;
    l->inputs[0] = j;
  }
  if (fork != -2) chained += chain_from(out, fork + 1, n - 1);
  return chained;
}

static int read_deeppool(FILE *f, const char *path, const char *section, const char *model, tide_profile_t **out) {
  char buf[1024];
  int line = 0, rc = 0, in_section = section == NULL, done = 0;
  int nfirst = -1, pos = 0, block_batch = 0, cap = 0, nblocks = 0;
  dp_layer_t *layers = NULL;
  double *times = NULL; /* [block][layer] ms */
  int *block_batches = NULL;
  tide_profile_layer_t *graph = NULL;
  tide_profile_t *p = NULL;
  while (!done && fgets(buf, sizeof buf, f) != NULL) {
    line++;
    char *s = buf;
    while (isspace((unsigned char)*s)) s++;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1])) s[--len] = '\0';
    if (*s == '\0') continue;
    int is_end = strncmp(s, "SUM", 3) == 0 || strncmp(s, "sum", 3) == 0;
    if (*s == '#' && strncmp(s, "#config", 7) != 0) { /* a section marker */
      if (in_section && nblocks > 0) {
        done = 1;
        break;
      }
      in_section = section == NULL || strcmp(s + 1, section) == 0;
      continue;
    }
    if (!in_section) continue;
    if (strncmp(s, "#config", 7) == 0 || is_end) {
      if (pos > 0) { /* a block ends */
        if (nfirst < 0) nfirst = pos;
        else if (pos != nfirst) {
          char why[128];
          snprintf(why, sizeof why, "this block has %d layers, the first had %d", pos, nfirst);
          rc = bad_line(path, line, why);
          goto out;
        }
        block_batches[nblocks++] = block_batch;
      }
      pos = 0;
      continue;
    }
    dp_layer_t l;
    int batch;
    double ms;
    if (parse_dp_line(s, &l, &batch, &ms) != 0) {
      rc = bad_line(path, line, "expected TYPE{JSON}[BATCH][C,H,W] AVG_MS ... (a DeepPool profile line)");
      goto out;
    }
    if (pos > 0 && batch != block_batch) {
      rc = bad_line(path, line, "batch differs from the block's first line");
      goto out;
    }
    block_batch = batch;
    if (nfirst >= 0 && pos >= nfirst) {
      rc = bad_line(path, line, "block longer than the first block");
      goto out;
    }
    size_t slot = (size_t)nblocks * (size_t)(nfirst < 0 ? 0 : nfirst) + (size_t)pos;
    if (nfirst < 0 && pos >= cap) {
      cap = cap ? 2 * cap : 64;
      void *nl = tide__realloc(layers, (size_t)cap * sizeof *layers);
      if (nl == NULL) {
        rc = TIDE_ENOMEM;
        goto out;
      }
      layers = nl;
    }
    if (nfirst < 0) layers[pos] = l;
    else if (strcmp(layers[pos].name, l.name) != 0) {
      char why[300];
      snprintf(why, sizeof why, "layer %d is %s here but %s in the first block", pos, l.name, layers[pos].name);
      rc = bad_line(path, line, why);
      goto out;
    }
    void *nt = tide__realloc(times, (slot + 1 + (size_t)cap) * sizeof *times);
    void *nb = tide__realloc(block_batches, (size_t)(nblocks + 1) * sizeof *block_batches);
    if (nt != NULL) times = nt;
    if (nb != NULL) block_batches = nb;
    if (nt == NULL || nb == NULL) {
      rc = TIDE_ENOMEM;
      goto out;
    }
    times[nfirst < 0 ? (size_t)pos : slot] = ms;
    pos++;
  }
  if (pos > 0) {
    if (nfirst < 0) nfirst = pos;
    else if (pos != nfirst) {
      rc = bad_line(path, line, "the last block has fewer layers than the first");
      goto out;
    }
    block_batches[nblocks++] = block_batch;
  }
  if (nblocks == 0) {
    if (section != NULL)
      TIDE_ERROR("tide_profile_read: %s: no section \"#%s\" with layers", path, section);
    else
      TIDE_ERROR("tide_profile_read: %s: no layers", path);
    rc = TIDE_EINVAL;
    goto out;
  }
  graph = tide__calloc((size_t)nfirst, sizeof *graph);
  if (graph == NULL) {
    rc = TIDE_ENOMEM;
    goto out;
  }
  int chained = infer_graph(layers, nfirst, graph);
  if (tide__plan_graph_check(graph, nfirst, NULL) != 0) {
    TIDE_WARN("tide_profile_read: %s: the layers' shapes do not form branches the planner handles; read as a chain",
              path);
    for (int i = 0; i < nfirst; i++) graph[i].ninputs = 1, graph[i].inputs[0] = i - 1;
  } else if (chained > 0) {
    TIDE_INFO("tide_profile_read: %s: %d branch block(s) (nested or not closing) read as chains", path, chained);
  }
  TIDE_CHECK_GOTO(tide_profile_create(model, &p), rc, out);
  for (int i = 0; i < nfirst; i++) {
    tide_profile_layer_t *g = &graph[i];
    snprintf(g->name, sizeof g->name, "%s", layers[i].name);
    g->param_bytes = layers[i].params;
    g->act_bytes = 4.0 * (double)shape_count(layers[i].oshape, layers[i].odims);
    TIDE_CHECK_GOTO(tide_profile_add_layer(p, g, NULL), rc, out);
  }
  /* the published time is the layer's whole cost: read as forward, backward 0 */
  for (int b = 0; b < nblocks; b++)
    for (int i = 0; i < nfirst; i++)
      TIDE_CHECK_GOTO(tide_profile_set_time(p, i, block_batches[b], times[(size_t)b * nfirst + i] * 1e-3, 0.0), rc,
                      out);
  TIDE_CHECK_GOTO(tide__profile_check(p, "tide_profile_read"), rc, out);
  *out = p;
  p = NULL;
out:
  tide_profile_destroy(p);
  tide__free(graph);
  tide__free(layers);
  tide__free(times);
  tide__free(block_batches);
  return rc;
}

int tide_profile_read(const char *path, const char *section, tide_profile_t **out) {
  if (path == NULL || out == NULL) {
    TIDE_ERROR("tide_profile_read: %s must not be NULL", path == NULL ? "path" : "out");
    return TIDE_EINVAL;
  }
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    int e = errno;
    TIDE_ERROR("tide_profile_read: cannot open %s: %s", path, strerror(e));
    return e == ENOENT ? TIDE_ENOENT : TIDE_EIO;
  }
  char first[1024];
  int rc;
  if (fgets(first, sizeof first, f) == NULL) {
    TIDE_ERROR("tide_profile_read: %s:1: empty file", path);
    rc = TIDE_EINVAL;
  } else if (strncmp(first, "tide-profile ", 13) == 0) {
    if (atoi(first + 13) != 1)
      rc = bad_line(path, 1, "unknown version (this tide reads \"tide-profile 1\")");
    else
      rc = read_tide(f, path, out);
  } else {
    /* a model name from the file's name: vggLayerGpuProfileA100.txt -> vgg */
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char model[64];
    size_t n = strcspn(base, "L.");
    snprintf(model, sizeof model, "%.*s%s%s", (int)(n > 40 ? 40 : n), base, section ? "-" : "",
             section ? section : "");
    if (model[0] == '\0') snprintf(model, sizeof model, "deeppool");
    rewind(f);
    rc = read_deeppool(f, path, section, model, out);
  }
  fclose(f);
  return rc;
}
