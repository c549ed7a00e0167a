/* Logging: one line per call, prefixed "host:pid rank" so interleaved
 * output from many ranks can be read. Level from TIDE_LOG_LEVEL. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core.h"

int tide__log_level = TIDE__LOG_WARN;
static int log_rank = -1;
static const char *level_names[] = {"error", "warn", "info", "debug", "trace"};

static _Thread_local int log_muted;

void tide__log_set_rank(int rank) { log_rank = rank; }
void tide__log_mute(int mute) { log_muted = mute; }

static void log_vwrite(int level, unsigned long long suppressed, const char *fmt, va_list ap) {
  if (log_muted) return;
  char host[64] = "?";
  gethostname(host, sizeof host - 1);
  char *dot = strchr(host, '.');
  if (dot != NULL) *dot = '\0';
  char rank[16] = "-";
  if (log_rank >= 0) snprintf(rank, sizeof rank, "%d", log_rank);
  char msg[2048];
  int len = vsnprintf(msg, sizeof msg, fmt, ap);
  if (suppressed > 0 && len >= 0 && (size_t)len < sizeof msg)
    snprintf(msg + len, sizeof msg - (size_t)len, " (%llu similar messages suppressed)", suppressed);
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  localtime_r(&tv.tv_sec, &tm);
  char line[2300];
  int n = snprintf(line, sizeof line, "%s:%d %s %02d:%02d:%02d.%03d tide %s: %s\n", host,
                   (int)getpid(), rank, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                   level_names[level], msg);
  if (n < 0) return;
  if (n >= (int)sizeof line) n = sizeof line - 1;
  const char *path = tide__param_str(TIDE__PARAM_LOG_FILE);
  FILE *out = stderr;
  FILE *file = NULL;
  if (path[0] != '\0') {
    file = fopen(path, "a");
    if (file != NULL) out = file;
  }
  fwrite(line, 1, (size_t)n, out); /* one write per line keeps lines whole */
  fflush(out);
  if (file != NULL) fclose(file);
}

void tide__log_write(int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(level, 0, fmt, ap);
  va_end(ap);
}

void tide__log_write_suppressed(int level, unsigned long long suppressed, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(level, suppressed, fmt, ap);
  va_end(ap);
}

void tide_log_info(const char *fmt, ...) {
  if (TIDE__LOG_INFO > tide__log_level) return;
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(TIDE__LOG_INFO, 0, fmt, ap);
  va_end(ap);
}

void tide_log_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(TIDE__LOG_ERROR, 0, fmt, ap);
  va_end(ap);
}

static pthread_mutex_t ratelimit_lock = PTHREAD_MUTEX_INITIALIZER;

int tide__ratelimit_pass(tide__ratelimit_t *rl, unsigned long long *suppressed) {
  int64_t now = tide__now_ns();
  pthread_mutex_lock(&ratelimit_lock);
  if (rl->window_ns == 0 || now - rl->window_ns >= 1000000000) {
    rl->window_ns = now;
    rl->printed = 0;
  }
  int pass = rl->printed < TIDE__RATELIMIT_BURST;
  if (pass) {
    rl->printed++;
    *suppressed = rl->suppressed;
    rl->suppressed = 0;
  } else {
    rl->suppressed++;
  }
  pthread_mutex_unlock(&ratelimit_lock);
  return pass;
}
