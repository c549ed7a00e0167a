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

int tide__null_arg(const char *fn, const char *arg) {
  TIDE_ERROR("%s: %s must not be NULL", fn, arg);
  return TIDE_EINVAL;
}

int tide__array_bytes(const char *fn, const char *arg, size_t count, size_t size, size_t *bytes) {
  size_t product;
  if (__builtin_mul_overflow(count, size, &product) || product > (size_t)PTRDIFF_MAX) {
    TIDE_ERROR("%s: %s = %zu elements of %zu bytes is more than PTRDIFF_MAX bytes (no buffer can "
               "hold that many: the count is wrong)", fn, arg, count, size);
    return TIDE_EINVAL;
  }
  *bytes = product;
  return 0;
}
