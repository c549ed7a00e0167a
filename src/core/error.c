/* Error table: messages and names for every TIDE_E* code. */
#include <stdio.h>
#include <string.h>

#include "core.h"

const char *tide_strerror(int rc) {
  if (rc == 0) return "success";
  switch (rc) {
#define XX(name, value, msg) \
  case TIDE_##name:          \
    return msg;
    TIDE_ERRNO_MAP(XX)
#undef XX
    default:
      return "unknown error";
  }
}

const char *tide_err_name(int rc) {
  if (rc == 0) return "0";
  switch (rc) {
#define XX(name, value, msg) \
  case TIDE_##name:          \
    return "TIDE_" #name;
    TIDE_ERRNO_MAP(XX)
#undef XX
    default:
      return "TIDE_EUNKNOWN";
  }
}
