/* The table of TIDE_* environment parameters: read once, validated, logged
 * at INFO when set. A bad value is an error naming the variable. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

typedef enum { P_INT, P_STR, P_ENUM } ptype_t;

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

/* The allowed names of each ENUM row, NULL-terminated. */
#define ENUM_NAMES_MAX 8
static const char *const enum_names[TIDE__PARAM_COUNT][ENUM_NAMES_MAX + 1] = {
#define XE(id, ...) [TIDE__PARAM_##id] = {__VA_ARGS__, NULL},
    TIDE__PARAM_ENUMS(XE)
#undef XE
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const char *str_value[TIDE__PARAM_COUNT];
static int64_t int_value[TIDE__PARAM_COUNT]; /* INT: the value; ENUM: the name's index */
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

/* The index of text among param id's names, or -1. */
static int enum_index(int id, const char *text) {
  for (int k = 0; enum_names[id][k] != NULL; k++)
    if (strcmp(text, enum_names[id][k]) == 0) return k;
  return -1;
}

/* "a, b or c": param id's names, for messages and docs. */
static void enum_list(int id, const char *quote, char *out, size_t cap) {
  size_t at = 0;
  out[0] = '\0';
  for (int k = 0; enum_names[id][k] != NULL && at < cap; k++) {
    const char *sep = k == 0 ? "" : enum_names[id][k + 1] == NULL ? " or " : ", ";
    at += (size_t)snprintf(out + at, cap - at, "%s%s%s%s", sep, quote, enum_names[id][k], quote);
  }
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
    } else if (row->type == P_ENUM) {
      int k = enum_index(i, text);
      if (k < 0) {
        if (load_error[0] == '\0') {
          char names[200];
          enum_list(i, "", names, sizeof names);
          snprintf(load_error, sizeof load_error, "%s=\"%s\" is not one of %s; unset it or pick one of those",
                   row->name, text, names);
        }
        str_value[i] = row->def;
        k = enum_index(i, row->def);
      }
      assert(k >= 0); /* every ENUM row has names (TIDE__PARAM_ENUMS), its default among them */
      int_value[i] = k;
    }
  }
  tide__log_level = (int)int_value[TIDE__PARAM_LOG_LEVEL];
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

int tide__param_enum(int id) {
  pthread_once(&once, load);
  assert(rows[id].type == P_ENUM);
  return (int)int_value[id];
}

const char *tide__param_str(int id) {
  pthread_once(&once, load);
  return str_value[id];
}

int tide__param_is_set(int id) {
  pthread_once(&once, load);
  return is_set[id];
}

int tide_param_get(const char *name, const char **text, int64_t *value) {
  if (name == NULL || (text == NULL && value == NULL)) {
    TIDE_ERROR("tide_param_get: name and one of text or value must not be NULL");
    return TIDE_EINVAL;
  }
  for (int i = 0; i < TIDE__PARAM_COUNT; i++) {
    if (strcmp(rows[i].name, name) != 0) continue;
    pthread_once(&once, load);
    if (value == NULL && text != NULL) {
      *text = str_value[i];
      return 0;
    }
    if (rows[i].type == P_STR) {
      TIDE_ERROR("tide_param_get: %s is a string: pass value NULL and read text", name);
      return TIDE_EINVAL;
    }
    if (text != NULL) *text = str_value[i];
    *value = int_value[i];
    return 0;
  }
  TIDE_ERROR("tide_param_get: no parameter named \"%s\" (`tide params` lists them)", name);
  return TIDE_EINVAL;
}

void tide_params_print(FILE *out, int markdown) {
  if (out == NULL) {
    tide__null_arg("tide_params_print", "out");
    return;
  }
  pthread_once(&once, load);
  if (markdown) {
    fprintf(out, "| variable | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < TIDE__PARAM_COUNT; i++) {
      char type[240] = "int";
      if (rows[i].type == P_STR) snprintf(type, sizeof type, "string");
      if (rows[i].type == P_ENUM) {
        char names[200];
        enum_list(i, "`", names, sizeof names);
        snprintf(type, sizeof type, "one of %s", names);
      }
      fprintf(out, "| `%s` | %s | %s%s%s | %s |\n", rows[i].name, type, rows[i].def[0] ? "`" : "",
              rows[i].def[0] ? rows[i].def : "(unset)", rows[i].def[0] ? "`" : "", rows[i].help);
    }
    return;
  }
  for (int i = 0; i < TIDE__PARAM_COUNT; i++) {
    const char *value = i == TIDE__PARAM_JOB_TOKEN && is_set[i] ? "(set, hidden)" : str_value[i];
    static const char *const types[] = {"int", "string", "enum"};
    fprintf(out, "%-22s %-6s default=%-10s %s%s\n    %s\n", rows[i].name, types[rows[i].type],
            rows[i].def[0] ? rows[i].def : "\"\"", is_set[i] ? "value=" : "", is_set[i] ? value : "",
            rows[i].help);
    if (rows[i].type == P_ENUM) {
      char names[200];
      enum_list(i, "", names, sizeof names);
      fprintf(out, "    one of %s\n", names);
    }
  }
}
