/* A job's scheduling hints (tide_sched_hints_t) as one line of text, the
 * form the job's Pollux agent publishes in its store under
 * TIDE_SCHED_HINTS_KEY and the scheduler reads back: "tide-hints 1" and
 * then name=value pairs, each double printed with 17 significant digits so
 * that decode(encode(h)) == h bit for bit. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

enum { F_DOUBLE, F_INT };

struct field {
  const char *name;
  int type;
  size_t offset;
};

#define D(member, name) {name, F_DOUBLE, offsetof(tide_sched_hints_t, member)}
#define I(member, name) {name, F_INT, offsetof(tide_sched_hints_t, member)}
static const struct field fields[] = {
    I(fitted, "fitted"),
    D(model.alpha_c, "alpha_c"),
    D(model.beta_c, "beta_c"),
    D(model.alpha_n, "alpha_n"),
    D(model.beta_n, "beta_n"),
    D(model.alpha_r, "alpha_r"),
    D(model.beta_r, "beta_r"),
    D(model.gamma, "gamma"),
    D(grad_sqr, "grad_sqr"),
    D(grad_var, "grad_var"),
    D(limits.base_batch, "base_batch"),
    D(limits.max_batch, "max_batch"),
    D(limits.min_atomic, "min_atomic"),
    D(limits.max_atomic, "max_atomic"),
    I(limits.max_passes, "max_passes"),
    I(max_replicas_seen, "max_replicas_seen"),
};
#undef D
#undef I
enum { NFIELDS = sizeof fields / sizeof fields[0] };

static const char magic[] = "tide-hints 1";

int tide_sched_hints_encode(const tide_sched_hints_t *hints, char *buf, size_t len) {
  if (hints == NULL || buf == NULL) {
    TIDE_ERROR("sched hints: %s is NULL", hints == NULL ? "hints" : "buf");
    return TIDE_EINVAL;
  }
  size_t used = (size_t)snprintf(buf, len, "%s", magic);
  for (int i = 0; i < NFIELDS && used < len; i++) {
    const char *p = (const char *)hints + fields[i].offset;
    if (fields[i].type == F_DOUBLE)
      used += (size_t)snprintf(buf + used, len - used, " %s=%.17g", fields[i].name, *(const double *)p);
    else
      used += (size_t)snprintf(buf + used, len - used, " %s=%d", fields[i].name, *(const int *)p);
  }
  if (used >= len) {
    TIDE_ERROR("sched hints: buffer of %zu bytes is too small (need TIDE_SCHED_HINTS_MAX)", len);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide_sched_hints_decode(const char *text, tide_sched_hints_t *hints) {
  if (text == NULL || hints == NULL) {
    TIDE_ERROR("sched hints: %s is NULL", text == NULL ? "text" : "hints");
    return TIDE_EINVAL;
  }
  size_t m = strlen(magic);
  if (strncmp(text, magic, m) != 0 || (text[m] != ' ' && text[m] != '\0')) {
    TIDE_ERROR("sched hints: text does not start with \"%s\" (written by another tide version?)", magic);
    return TIDE_EINVAL;
  }
  tide_sched_hints_t h;
  memset(&h, 0, sizeof h);
  int seen[NFIELDS] = {0};
  const char *s = text + m;
  while (*s == ' ') s++;
  while (*s != '\0') {
    const char *eq = strchr(s, '=');
    size_t n = eq == NULL ? strcspn(s, " ") : (size_t)(eq - s);
    int k = -1;
    for (int i = 0; i < NFIELDS && eq != NULL; i++)
      if (strlen(fields[i].name) == n && strncmp(fields[i].name, s, n) == 0) k = i;
    if (k < 0) {
      TIDE_ERROR("sched hints: unknown field \"%.*s\"", (int)n, s);
      return TIDE_EINVAL;
    }
    char *end;
    char *p = (char *)&h + fields[k].offset;
    errno = 0;
    if (fields[k].type == F_DOUBLE) {
      *(double *)p = strtod(eq + 1, &end);
    } else {
      long v = strtol(eq + 1, &end, 10);
      if (v < -2147483647L || v > 2147483647L) errno = ERANGE;
      *(int *)p = (int)v;
    }
    if (end == eq + 1 || (*end != ' ' && *end != '\0') || errno == ERANGE) {
      TIDE_ERROR("sched hints: field %s has a bad value \"%.*s\"", fields[k].name, (int)strcspn(eq + 1, " "),
                 eq + 1);
      return TIDE_EINVAL;
    }
    seen[k] = 1;
    s = end;
    while (*s == ' ') s++;
  }
  for (int i = 0; i < NFIELDS; i++)
    if (!seen[i]) {
      TIDE_ERROR("sched hints: field %s is missing", fields[i].name);
      return TIDE_EINVAL;
    }
  *hints = h;
  return 0;
}
