/* Background jobs (docs/elastic.md, "Multiplexing"): the lowest CPU
 * priority for every thread of the process, and the waits' spin budget of
 * a job that shares its cores with another. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int enter_rc;
static const char *entered = "";

/* SCHED_IDLE for thread tid (0: the caller), else nice 19. Returns 1 for
 * idle, 0 for nice, -1 when neither took. */
static int lower(pid_t tid) {
  struct sched_param p = {.sched_priority = 0};
  if (sched_setscheduler(tid, SCHED_IDLE, &p) == 0) return 1;
  return setpriority(PRIO_PROCESS, (id_t)tid, 19) == 0 ? 0 : -1;
}

/* Every thread the process has now (/proc/self/task); threads started
 * later inherit the caller's policy. */
static void enter(void) {
  int idle = lower(0), err = errno;
  if (idle < 0) {
    TIDE_ERROR("tide_background_enter: neither SCHED_IDLE nor nice 19 could be set: %s", strerror(err));
    enter_rc = TIDE_ENOSYS;
    return;
  }
  if (idle == 0)
    TIDE_WARN("background job: the kernel refused SCHED_IDLE (%s); running at nice 19 instead, which still "
              "takes a share of a busy core from the foreground", strerror(err));
  entered = idle ? "idle" : "nice19";
  pid_t self = (pid_t)syscall(SYS_gettid);
  DIR *dir = opendir("/proc/self/task");
  if (dir == NULL) return;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    pid_t tid = (pid_t)atoi(e->d_name);
    if (tid > 0 && tid != self) lower(tid);
  }
  closedir(dir);
  TIDE_INFO("background job: every thread runs at %s", idle ? "SCHED_IDLE" : "nice 19");
}

int tide_background_enter(const char **policy) {
  pthread_once(&once, enter);
  if (policy != NULL && enter_rc == 0) *policy = entered;
  return enter_rc;
}

int64_t tide__wait_spin_us(void) {
  if (!tide__param_is_set(TIDE__PARAM_SPIN_US) &&
      (tide__param_int(TIDE__PARAM_BACKGROUND) || tide__param_int(TIDE__PARAM_HOSTS_BACKGROUND)))
    return 0;
  return tide__param_int(TIDE__PARAM_SPIN_US);
}
