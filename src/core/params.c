/* The table of TIDE_* environment parameters: read once, validated, logged
 * at INFO when set. A bad value is an error naming the variable. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef enum { P_INT, P_STR } ptype_t;

typedef struct {
  const char *name;
  ptype_t type;
  const char *def;
  int64_t min, max;
  const char *help;
} param_row_t;

static const param_row_t rows[TIDE__PARAM_COUNT] = {
#define XX(id, type, def, min, max, help) {"TIDE_" #id, P_##type, def, min, max, help},
    TIDE__PARAMS(XX)
#undef XX
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *str_value[TIDE__PARAM_COUNT];
static int64_t int_value[TIDE__PARAM_COUNT];
static bool is_set[TIDE__PARAM_COUNT];
static char load_error[512];
static atomic_int reported;

static int parse_int(const char *text, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0') return -1;
  *out = v;
  return 0;
}

static void load(void) {
  for (int i = 0; i < TIDE__PARAM_COUNT; i++) {
    const param_row_t *row = &rows[i];
    const char *env = getenv(row->name);
    is_set[i] = env != NULL && env[0] != '\0';
    const char *text = is_set[i] ? env : row->def;
    str_value[i] = text;
    if (row->type == P_INT) {
      int64_t v = 0;
      if (parse_int(text, &v) != 0 || v < row->min || v > row->max) {
        if (load_error[0] == '\0')
          snprintf(load_error, sizeof load_error,
                   "%s=\"%s\" is not an integer in [%lld, %lld]; unset it or fix the value",
                   row->name, text, (long long)row->min, (long long)row->max);
        parse_int(row->def, &v);
        str_value[i] = row->def;
      }
      int_value[i] = v;
    }
  }
  static const char *levels[] = {"error", "warn", "info", "debug", "trace"};
  const char *level = str_value[TIDE__PARAM_LOG_LEVEL];
  int found = -1;
  for (int l = 0; l < 5; l++)
    if (strcmp(level, levels[l]) == 0) found = l;
  if (found < 0 && load_error[0] == '\0')
    snprintf(load_error, sizeof load_error,
             "TIDE_LOG_LEVEL=\"%s\" is not one of error, warn, info, debug, trace", level);
  tide__log_level = found < 0 ? TIDE__LOG_WARN : found;
  const char *algo = str_value[TIDE__PARAM_ALGO];
  if (strcmp(algo, "auto") != 0 && strcmp(algo, "ring") != 0 && strcmp(algo, "rd") != 0 &&
      strcmp(algo, "hier") != 0 && strcmp(algo, "mpi") != 0 && load_error[0] == '\0')
    snprintf(load_error, sizeof load_error,
             "TIDE_ALGO=\"%s\" is not one of auto, ring, rd, hier, mpi", algo);
  const char *backend = str_value[TIDE__PARAM_BACKEND];
  if (strcmp(backend, "auto") != 0 && strcmp(backend, "mpi") != 0 && load_error[0] == '\0')
    snprintf(load_error, sizeof load_error, "TIDE_BACKEND=\"%s\" is not one of auto, mpi", backend);
  const char *bind = str_value[TIDE__PARAM_BIND];
  int mode;
  if (tide__bind_parse(bind, TIDE__BIND_NONE, &mode) != 0 && load_error[0] == '\0')
    snprintf(load_error, sizeof load_error, "TIDE_BIND=\"%s\" is not one of auto, core, numa, none", bind);
}

int tide_params_load(void) {
  pthread_once(&once, load);
  int expected = 0;
  if (atomic_compare_exchange_strong(&reported, &expected, 1)) {
    for (int i = 0; i < TIDE__PARAM_COUNT; i++)
      if (is_set[i] && i != TIDE__PARAM_JOB_TOKEN)
        TIDE_INFO("%s=%s", rows[i].name, str_value[i]);
    if (load_error[0] != '\0') TIDE_ERROR("%s", load_error);
  }
  return load_error[0] != '\0' ? TIDE_EINVAL : 0;
}

int64_t tide__param_int(int id) {
  pthread_once(&once, load);
  return int_value[id];
}

const char *tide__param_str(int id) {
  pthread_once(&once, load);
  return str_value[id];
}

int tide__param_is_set(int id) {
  pthread_once(&once, load);
  return is_set[id];
}

void tide_params_print(FILE *out, int markdown) {
  if (out == NULL) {
    tide__null_arg("tide_params_print", "out");
    return;
  }
  pthread_once(&once, load);
  if (markdown) {
    fprintf(out, "| variable | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < TIDE__PARAM_COUNT; i++)
      fprintf(out, "| `%s` | %s | %s%s%s | %s |\n", rows[i].name, rows[i].type == P_INT ? "int" : "string",
              rows[i].def[0] ? "`" : "", rows[i].def[0] ? rows[i].def : "(unset)", rows[i].def[0] ? "`" : "",
              rows[i].help);
    return;
  }
  for (int i = 0; i < TIDE__PARAM_COUNT; i++) {
    const char *value = i == TIDE__PARAM_JOB_TOKEN && is_set[i] ? "(set, hidden)" : str_value[i];
    fprintf(out, "%-22s %-6s default=%-10s %s%s\n    %s\n", rows[i].name,
            rows[i].type == P_INT ? "int" : "string", rows[i].def[0] ? rows[i].def : "\"\"",
            is_set[i] ? "value=" : "", is_set[i] ? value : "", rows[i].help);
  }
}
