#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

int harness_status[64];

int harness_cases_main(const char *test, const harness_case_t *cases, size_t ncases, int argc, char **argv) {
  if (argc > 2) {
    fprintf(stderr, "usage: %s [CASE]\n", test);
    return 2;
  }
  if (argc == 2) {
    for (size_t i = 0; i < ncases; i++)
      if (strcmp(argv[1], cases[i].name) == 0) return cases[i].fn();
    fprintf(stderr, "%s: no case named '%s'; the cases:", test, argv[1]);
    for (size_t i = 0; i < ncases; i++) fprintf(stderr, " %s", cases[i].name);
    fprintf(stderr, "\n");
    return 2;
  }
  int failed = 0;
  for (size_t i = 0; i < ncases; i++) {
    int rc = cases[i].fn();
    if (rc != 0 && rc != 77) {
      fprintf(stderr, "FAILED: %s %s\n", test, cases[i].name);
      failed = 1;
    }
  }
  return failed;
}

int harness_store_start(const char *token, int *pid_out) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that fails (exit) leaves no server holding ctest's output */
    tide_store_server_t *server;
    if (tide_store_server_start("127.0.0.1", 0, token, &server) != 0) _exit(3);
    int port = tide_store_server_port(server);
    if (write(fds[1], &port, sizeof port) != sizeof port) _exit(3);
    close(fds[1]);
    for (;;) pause(); /* killed by the parent */
  }
  close(fds[1]);
  int port = -1;
  if (read(fds[0], &port, sizeof port) != sizeof port) port = -1;
  close(fds[0]);
  *pid_out = pid;
  return port;
}

int harness_run(const harness_opts_t *opts, int (*fn)(int, int, void *), void *arg) {
  const char *token = opts->token ? opts->token : "test-token";
  int store_pid;
  int port = harness_store_start(token, &store_pid);
  if (port < 0) {
    fprintf(stderr, "harness: store server did not start\n");
    return 1;
  }
  int np = opts->np;
  pid_t pids[64];
  for (int r = 0; r < np; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      char text[64];
      snprintf(text, sizeof text, "%d", r);
      setenv("TIDE_RANK", text, 1);
      snprintf(text, sizeof text, "%d", np);
      setenv("TIDE_SIZE", text, 1);
      snprintf(text, sizeof text, "127.0.0.1:%d", port);
      setenv("TIDE_RDZV", text, 1);
      setenv("TIDE_JOB_TOKEN", token, 1);
      if (opts->host_ids != NULL) setenv("TIDE_HOST_ID", opts->host_ids[r], 1);
      if (opts->tcp_only) setenv("TIDE_SHM", "0", 1);
      int rc = fn(r, np, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
  }
  int timeout_s = opts->timeout_s > 0 ? opts->timeout_s : 120;
  time_t start = time(NULL);
  int left = np, failed = 0;
  for (int r = 0; r < np; r++) harness_status[r] = -1;
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < np; r++)
        if (pids[r] == pid) {
          harness_status[r] = status;
          left--;
          if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status))
              fprintf(stderr, "harness: rank %d killed by signal %d\n", r, WTERMSIG(status));
            else
              fprintf(stderr, "harness: rank %d exited with %d\n", r, WEXITSTATUS(status));
            failed = 1;
          }
        }
      continue;
    }
    if (time(NULL) - start > timeout_s) {
      fprintf(stderr, "harness: ranks still running after %d s: a hang; killing them\n", timeout_s);
      for (int r = 0; r < np; r++)
        if (harness_status[r] == -1) kill(pids[r], SIGKILL);
      failed = 1;
      while (waitpid(-1, NULL, 0) > 0 && --left > 0) {
      }
      break;
    }
    usleep(2000);
  }
  kill(store_pid, SIGKILL);
  waitpid(store_pid, NULL, 0);
  return failed;
}

typedef struct {
  int listen_fd;
  void *(*conn)(void *);
} http_server_t;

static void *http_accept_loop(void *arg) {
  http_server_t *h = arg;
  for (;;) {
    int fd = accept(h->listen_fd, NULL, NULL);
    if (fd < 0) continue;
    /* a thread per connection: a stalled one must not block the next */
    pthread_t t;
    if (pthread_create(&t, NULL, h->conn, (void *)(intptr_t)fd) != 0) {
      close(fd);
      continue;
    }
    pthread_detach(t);
  }
  return NULL;
}

int harness_http_serve(void *(*conn)(void *fd)) {
  static http_server_t servers[8];
  static int used;
  if (used == 8) abort();
  http_server_t *h = &servers[used++];
  int port;
  if (tide__tcp_listen("127.0.0.1", 0, &h->listen_fd, &port) != 0) abort(); /* its log says why */
  h->conn = conn;
  pthread_t t;
  if (pthread_create(&t, NULL, http_accept_loop, h) != 0) abort();
  pthread_detach(t);
  return port;
}

/* A port below the kernel's ephemeral range (32768 on), which no outgoing
 * connection and no bind to port 0 takes: a port the kernel handed out here
 * could become another test's source port before this test listens on it
 * (ctest runs tests side by side). Random in [20000, 29000), checked free. */
int harness_free_port(void) {
  static unsigned seed;
  if (seed == 0) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
  for (int tries = 0; tries < 1000; tries++) {
    int port = 20000 + (int)(rand_r(&seed) % 9000);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    if (ok) return port;
  }
  fprintf(stderr, "harness_free_port: no free port in [20000, 29000) after 1000 tries\n");
  abort();
}

int harness_shell(const char *cmd, char *out, size_t cap) {
  FILE *p = popen(cmd, "r");
  CHECK(p != NULL);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

void harness_slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "cannot read %s\n", path);
    exit(1);
  }
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = 0;
  fclose(f);
}
