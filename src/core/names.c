/* Parsing a name into an enum value, for every tide_*_parse. */
#include <stdio.h>
#include <strings.h>

#include "core.h"

int tide__parse_name(const char *fn, const char *what, const char *const *names, int count, const char *name,
                     const void *out) {
  if (name == NULL || out == NULL) {
    TIDE_ERROR("%s: name and out must not be NULL", fn);
    return TIDE_EINVAL;
  }
  for (int k = 0; k < count; k++)
    if (strcasecmp(name, names[k]) == 0) return k;
  char list[512];
  size_t at = 0;
  list[0] = '\0';
  for (int k = 0; k < count && at < sizeof list; k++)
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k == 0 ? "" : k == count - 1 ? " or " : ", ",
                           names[k]);
  TIDE_ERROR("unknown %s '%s': use %s", what, name, list);
  return TIDE_EINVAL;
}
