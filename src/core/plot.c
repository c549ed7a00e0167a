/* Drawing with gnuplot, when it is there: the simulator's and the
 * planner's plots (tide sim, tide plan). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"

static int on_path(const char *prog) {
  const char *path = getenv("PATH");
  char buf[4096];
  while (path != NULL && *path) {
    const char *colon = strchr(path, ':');
    size_t len = colon ? (size_t)(colon - path) : strlen(path);
    snprintf(buf, sizeof buf, "%.*s/%s", (int)len, path, prog);
    if (access(buf, X_OK) == 0) return 1;
    path = colon ? colon + 1 : NULL;
  }
  return 0;
}

int tide__gnuplot(const char *dir, const char *script) {
  if (!on_path("gnuplot")) return 0;
  pid_t pid = fork();
  if (pid < 0) {
    TIDE_WARN("gnuplot: cannot fork to draw %s/%s: %s", dir, script, strerror(errno));
    return TIDE_EIO;
  }
  if (pid == 0) { /* the script's relative paths resolve in dir */
    if (chdir(dir) == 0) execlp("gnuplot", "gnuplot", script, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 1;
  TIDE_WARN("gnuplot failed on %s/%s (exit status %d)", dir, script,
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return TIDE_EIO;
}
