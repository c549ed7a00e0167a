/* Clocks, deadlines and the kernel's random source. */
#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <time.h>

#include "core.h"

int64_t tide__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t tide__deadline_after_ms(int64_t ms) {
  if (ms < 0) return INT64_MAX;
  return tide__now_ns() + ms * 1000000;
}

int64_t tide_now_ns(void) { return tide__now_ns(); }

int64_t tide_deadline_after_ms(int64_t ms) { return tide__deadline_after_ms(ms); }

int tide__ms_left(int64_t deadline_ns) {
  if (deadline_ns == INT64_MAX) return INT32_MAX;
  int64_t left = (deadline_ns - tide__now_ns() + 999999) / 1000000;
  if (left < 0) return 0;
  if (left > INT32_MAX) return INT32_MAX;
  return (int)left;
}

int tide__random_bytes(void *buf, size_t n) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return TIDE_EIO;
    }
    p += got;
    n -= (size_t)got;
  }
  return 0;
}
