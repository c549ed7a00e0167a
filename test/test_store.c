/* The rendezvous store: requests, waits and timeouts, atomic add, the job
 * token, malformed frames, watch events and lost watchers, and stopping or
 * freezing the server under connected clients (errors, never hangs). */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "store/protocol.h"
#include "store/store.h"

#define TOKEN "store-test-token"

static tide_store_server_t *server;
static int port;

static tide_store_t *connect_ok(void) {
  tide_store_t *store;
  CHECK_OK(tide_store_connect("127.0.0.1", port, TOKEN, 5000, &store));
  return store;
}

static int64_t ms_since(int64_t start_ns) { return (tide__now_ns() - start_ns) / 1000000; }

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

/* Waits up to timeout_ms for the next event on w; 1 with the event, 0 if
 * none came. Fails the test on an error. */
static int next_event(tide__store_watch_t *w, int timeout_ms, char **key, void **value,
                      size_t *len) {
  int64_t deadline = tide__deadline_after_ms(timeout_ms);
  for (;;) {
    int rc = tide__store_watch_next(w, key, value, len);
    CHECK(rc >= 0);
    if (rc == 1) return 1;
    int left = tide__ms_left(deadline);
    if (left == 0) return 0;
    struct pollfd p = {tide__store_watch_fd(w), POLLIN, 0};
    poll(&p, 1, left);
  }
}

static void expect_event(tide__store_watch_t *w, int timeout_ms, const char *want_key,
                         const char *want_value) {
  char *key;
  void *value;
  size_t len;
  CHECK(next_event(w, timeout_ms, &key, &value, &len) == 1);
  if (strcmp(key, want_key) != 0) {
    fprintf(stderr, "got event \"%s\", wanted \"%s\"\n", key, want_key);
    CHECK(0);
  }
  CHECK(len == strlen(want_value) && memcmp(value, want_value, len) == 0);
  tide__free(key);
  tide__free(value);
}

static void expect_get(tide_store_t *store, const char *key, const void *want, size_t want_len) {
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, key, 1000, &value, &len));
  CHECK(len == want_len);
  CHECK(want_len == 0 || memcmp(value, want, len) == 0);
  tide_free(value);
}

/* ---- requests ---- */

static void test_roundtrip(void) {
  tide_store_t *store = connect_ok();
  uint8_t bytes[256];
  for (int i = 0; i < 256; i++) bytes[i] = (uint8_t)i; /* NULs included */
  CHECK_OK(tide_store_set(store, "bin", bytes, sizeof bytes));
  expect_get(store, "bin", bytes, sizeof bytes);
  CHECK_OK(tide_store_set(store, "bin", "xyz", 3)); /* overwrite, shorter */
  expect_get(store, "bin", "xyz", 3);
  CHECK_OK(tide_store_set(store, "empty", NULL, 0));
  expect_get(store, "empty", NULL, 0);
  CHECK_OK(tide_store_set(store, "empty2", "", 0));
  expect_get(store, "empty2", NULL, 0);

  size_t big_len = 3 << 20; /* several reads and partial sends on both sides */
  uint8_t *big = malloc(big_len);
  unsigned seed = 7;
  for (size_t i = 0; i < big_len; i++) big[i] = (uint8_t)harness_rand(&seed);
  CHECK_OK(tide_store_set(store, "big", big, big_len));
  expect_get(store, "big", big, big_len);
  free(big);

  char longest[TIDE__STORE_MAX_KEY + 1];
  memset(longest, 'k', TIDE__STORE_MAX_KEY);
  longest[TIDE__STORE_MAX_KEY] = '\0';
  CHECK_OK(tide_store_set(store, longest, "L", 1));
  expect_get(store, longest, "L", 1);

  /* Enough keys to grow the table several times. */
  char key[32];
  for (int i = 0; i < 10000; i++) {
    snprintf(key, sizeof key, "many/%d", i);
    CHECK_OK(tide_store_set(store, key, &i, sizeof i));
  }
  for (int i = 0; i < 10000; i += 997) {
    snprintf(key, sizeof key, "many/%d", i);
    expect_get(store, key, &i, sizeof i);
  }
  tide_store_close(store);
}

static void *set_later(void *arg) {
  const char *const *keys = arg;
  tide_store_t *store = connect_ok();
  for (int i = 0; keys[i] != NULL; i++) {
    sleep_ms(50);
    CHECK_OK(tide_store_set(store, keys[i], keys[i], strlen(keys[i])));
  }
  tide_store_close(store);
  return NULL;
}

static void test_get_waits(void) {
  tide_store_t *store = connect_ok();
  pthread_t thread;
  static const char *one[] = {"late/thread", NULL};
  CHECK(pthread_create(&thread, NULL, set_later, (void *)one) == 0);
  expect_get(store, "late/thread", "late/thread", 11);
  pthread_join(thread, NULL);

  pid_t pid = fork();
  if (pid == 0) {
    sleep_ms(100);
    tide_store_t *child;
    if (tide_store_connect("127.0.0.1", port, TOKEN, 5000, &child) != 0) _exit(1);
    _exit(tide_store_set(child, "late/process", "p", 1) == 0 ? 0 : 2);
  }
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, "late/process", 10000, &value, &len));
  CHECK(len == 1 && memcmp(value, "p", 1) == 0);
  tide_free(value);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* WAIT on keys that appear in reverse order, one already there. */
  CHECK_OK(tide_store_set(store, "w/0", "", 0));
  static const char *reverse[] = {"w/3", "w/2", "w/1", NULL};
  CHECK(pthread_create(&thread, NULL, set_later, (void *)reverse) == 0);
  const char *keys[] = {"w/0", "w/1", "w/2", "w/3"};
  CHECK_OK(tide_store_wait(store, keys, 4, 10000));
  pthread_join(thread, NULL);
  CHECK_OK(tide_store_wait(store, keys, 0, 0));
  tide_store_close(store);
}

static void test_timeouts(void) {
  tide_store_t *store = connect_ok();
  void *value;
  size_t len;
  int64_t start = tide__now_ns();
  CHECK_RC(tide_store_get(store, "missing", 200, &value, &len), TIDE_ETIMEDOUT);
  CHECK(ms_since(start) >= 150);
  CHECK_RC(tide_store_get(store, "missing", 0, &value, &len), TIDE_ETIMEDOUT);
  CHECK_OK(tide_store_set(store, "present", "1", 1));
  const char *keys[] = {"present", "missing"};
  start = tide__now_ns();
  CHECK_RC(tide_store_wait(store, keys, 2, 200), TIDE_ETIMEDOUT);
  CHECK(ms_since(start) >= 150);
  /* A timeout is an answer, not a failure: the connection goes on. */
  expect_get(store, "present", "1", 1);
  tide_store_close(store);
}

typedef struct {
  tide_store_t *store;
} adder_t;

static void *add_many(void *arg) {
  adder_t *adder = arg;
  for (int i = 0; i < 1000; i++) CHECK_OK(tide_store_add(adder->store, "counter", 1, NULL));
  return NULL;
}

static void test_add(void) {
  /* Two threads share a handle (its mutex), two have their own. */
  tide_store_t *shared = connect_ok(), *own[2] = {connect_ok(), connect_ok()};
  adder_t adders[4] = {{shared}, {shared}, {own[0]}, {own[1]}};
  pthread_t threads[4];
  for (int i = 0; i < 4; i++) CHECK(pthread_create(&threads[i], NULL, add_many, &adders[i]) == 0);
  for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
  int64_t result = -1;
  CHECK_OK(tide_store_add(shared, "counter", 0, &result));
  CHECK(result == 4000);
  uint8_t le[8] = {4000 & 0xff, 4000 >> 8, 0, 0, 0, 0, 0, 0};
  expect_get(shared, "counter", le, 8);
  CHECK_OK(tide_store_add(shared, "counter", -5000, &result));
  CHECK(result == -1000);
  CHECK_OK(tide_store_add(shared, "fresh", 42, &result)); /* missing counts as 0 */
  CHECK(result == 42);
  CHECK_OK(tide_store_set(shared, "text", "abc", 3));
  CHECK_RC(tide_store_add(shared, "text", 1, &result), TIDE_EINVAL);
  tide_store_close(shared);
  tide_store_close(own[0]);
  tide_store_close(own[1]);
}

static void test_delete(void) {
  tide_store_t *store = connect_ok();
  CHECK_OK(tide_store_set(store, "doomed", "x", 1));
  CHECK_OK(tide_store_delete(store, "doomed"));
  CHECK_RC(tide_store_delete(store, "doomed"), TIDE_ENOENT);
  void *value;
  size_t len;
  CHECK_RC(tide_store_get(store, "doomed", 0, &value, &len), TIDE_ETIMEDOUT);
  CHECK_OK(tide_store_set(store, "doomed", "y", 1)); /* and it can come back */
  expect_get(store, "doomed", "y", 1);
  tide_store_close(store);
}

static void test_bad_arguments(void) {
  tide_store_t *store = connect_ok(), *none;
  char too_long[TIDE__STORE_MAX_KEY + 2];
  memset(too_long, 'k', sizeof too_long - 1);
  too_long[sizeof too_long - 1] = '\0';
  void *value;
  size_t len;
  int64_t result;
  const char *bad_keys[] = {NULL, "", too_long};
  for (int i = 0; i < 3; i++) {
    const char *key = bad_keys[i];
    CHECK_RC(tide_store_set(store, key, "v", 1), TIDE_EINVAL);
    CHECK_RC(tide_store_get(store, key, 0, &value, &len), TIDE_EINVAL);
    CHECK_RC(tide_store_add(store, key, 1, &result), TIDE_EINVAL);
    CHECK_RC(tide_store_delete(store, key), TIDE_EINVAL);
    const char *keys[] = {"fine", key};
    CHECK_RC(tide_store_wait(store, keys, 2, 0), TIDE_EINVAL);
  }
  CHECK_RC(tide_store_set(NULL, "k", "v", 1), TIDE_EINVAL);
  CHECK_RC(tide_store_set(store, "k", NULL, 1), TIDE_EINVAL);
  CHECK_RC(tide_store_get(store, "k", 0, NULL, &len), TIDE_EINVAL);
  CHECK_RC(tide_store_wait(store, NULL, 1, 0), TIDE_EINVAL);
  CHECK_RC(tide_store_connect("127.0.0.1", port, "", 100, &none), TIDE_EINVAL);
  CHECK_RC(tide_store_connect(NULL, port, TOKEN, 100, &none), TIDE_EINVAL);
  CHECK_RC(tide_store_connect("127.0.0.1", 0, TOKEN, 100, &none), TIDE_EINVAL);
  tide__store_watch_t *watch;
  CHECK_RC(tide__store_watch_open("127.0.0.1", port, TOKEN, "", 100, &watch), TIDE_EINVAL);
  tide_store_close(NULL);
  tide__store_watch_close(NULL);
  tide_store_server_stop(NULL);
  /* None of this disturbed the connection. */
  CHECK_OK(tide_store_set(store, "k", "v", 1));
  tide_store_close(store);
}

/* ---- faults ---- */

static void test_wrong_token(void) {
  tide_store_t *before = connect_ok(), *refused = NULL;
  CHECK_RC(tide_store_connect("127.0.0.1", port, "not-the-token", 2000, &refused), TIDE_EAUTH);
  CHECK(refused == NULL);
  tide__store_watch_t *watch = NULL;
  CHECK_RC(tide__store_watch_open("127.0.0.1", port, "nope", "intruder", 2000, &watch),
           TIDE_EAUTH);
  CHECK(watch == NULL);
  CHECK_OK(tide_store_set(before, "after-intruder", "ok", 2));
  tide_store_t *after = connect_ok();
  expect_get(after, "after-intruder", "ok", 2);
  tide_store_close(before);
  tide_store_close(after);
}

static int raw_connect(int authenticate) {
  int fd;
  int64_t deadline = tide__deadline_after_ms(5000);
  CHECK_OK(tide__tcp_connect("127.0.0.1", port, deadline, &fd));
  if (authenticate) CHECK_OK(tide__auth_handshake(fd, TOKEN, 0, deadline));
  return fd;
}

/* The server must close fd soon: reads (and drops) until EOF or reset. */
static void expect_closed(int fd) {
  int64_t deadline = tide__deadline_after_ms(5000);
  char sink[4096];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, tide__ms_left(deadline)) == 1);
    ssize_t n = recv(fd, sink, sizeof sink, 0);
    if (n <= 0) break;
  }
  close(fd);
}

static void send_request(int fd, uint32_t op, uint32_t key_len, uint64_t value_len,
                         const char *key) {
  uint8_t head[TIDE__STORE_REQUEST_BYTES];
  tide__store_request_t req = {op, key_len, value_len, 0};
  tide__store_request_encode(head, &req);
  CHECK(send(fd, head, sizeof head, MSG_NOSIGNAL) == (ssize_t)sizeof head);
  if (key != NULL) CHECK(send(fd, key, strlen(key), MSG_NOSIGNAL) == (ssize_t)strlen(key));
}

static void test_malformed(void) {
  /* Stuck clients the server must not wait for: one that never proves the
   * token, one that sends half a frame and stops. */
  int silent = raw_connect(0);
  int half = raw_connect(1);
  CHECK(send(half, "TSQ1\x01\0\0", 7, MSG_NOSIGNAL) == 7);

  int fd = raw_connect(0);
  const char http[] = "GET / HTTP/1.0\r\n\r\n";
  CHECK(send(fd, http, sizeof http - 1, MSG_NOSIGNAL) == (ssize_t)sizeof http - 1);
  expect_closed(fd);

  fd = raw_connect(1);
  uint64_t max = (uint64_t)tide__param_int(TIDE__PARAM_MAX_FRAME_BYTES);
  send_request(fd, TIDE__STORE_OP_SET, 1, max + 1, "k");
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_SET, 0xffffffffu, 0xffffffffffffffffull, NULL);
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_GET, TIDE__STORE_MAX_KEY + 1, 0, NULL);
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, 99, 1, 0, "k");
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_EVENT, 1, 0, "k"); /* server-to-watcher only */
  expect_closed(fd);

  fd = raw_connect(1);
  CHECK(send(fd, "garbage garbage garbage garbage!", 32, MSG_NOSIGNAL) == 32);
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_WAIT, 0, 3, NULL);
  CHECK(send(fd, "abc", 3, MSG_NOSIGNAL) == 3); /* key list without its NUL */
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_GET, 3, 0, NULL);
  CHECK(send(fd, "a\0b", 3, MSG_NOSIGNAL) == 3); /* NUL inside a key */
  expect_closed(fd);

  fd = raw_connect(1);
  send_request(fd, TIDE__STORE_OP_BYE, 0, 0, NULL); /* BYE outside a watch */
  expect_closed(fd);

  /* A client that sends requests but never reads the answers: the server
   * buffers a bounded amount for it, then closes it. */
  tide_store_t *store = connect_ok();
  size_t big_len = 4 << 20;
  char *big = calloc(1, big_len);
  CHECK_OK(tide_store_set(store, "big4", big, big_len));
  free(big);
  fd = raw_connect(1);
  for (int i = 0; i < 40; i++) send_request(fd, TIDE__STORE_OP_GET, 4, 0, "big4");
  sleep_ms(100);
  CHECK_OK(tide_store_set(store, "during", "d", 1)); /* others are served meanwhile */
  expect_get(store, "during", "d", 1);
  expect_closed(fd);

  CHECK_OK(tide_store_set(store, "survived", "yes", 3));
  expect_get(store, "survived", "yes", 3);
  tide_store_close(store);
  close(silent);
  close(half);
}

/* ---- watch ---- */

static void test_watch_events(void) {
  tide__store_watch_t *w1, *w2;
  CHECK_OK(tide__store_watch_open("127.0.0.1", port, TOKEN, "job:1", 5000, &w1));
  CHECK_OK(tide__store_watch_open("127.0.0.1", port, TOKEN, "job:2", 5000, &w2));
  char *key;
  void *value;
  size_t len;
  CHECK_RC(tide__store_watch_next(w1, &key, &value, &len), 0);
  tide_store_t *store = connect_ok();
  CHECK_OK(tide_store_set(store, "event/x", "hello", 5));
  CHECK_OK(tide_store_set(store, "plain", "no event", 8));
  CHECK_OK(tide_store_add(store, "event/counter", 1, NULL)); /* ADD publishes nothing */
  CHECK_OK(tide_store_set(store, "event/y", "", 0));
  for (int i = 0; i < 2; i++) {
    tide__store_watch_t *w = i == 0 ? w1 : w2;
    expect_event(w, 5000, "event/x", "hello");
    expect_event(w, 5000, "event/y", "");
  }
  tide__store_watch_close(w1);
  tide__store_watch_close(w2);
  tide_store_close(store);
}

static void test_watch_lost(void) {
  tide__store_watch_t *observer;
  CHECK_OK(tide__store_watch_open("127.0.0.1", port, TOKEN, "observer", 5000, &observer));
  int ready[2], go[2];
  CHECK(pipe(ready) == 0 && pipe(go) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    tide__store_watch_t *doomed;
    char c = 1;
    if (tide__store_watch_open("127.0.0.1", port, TOKEN, "job:child", 5000, &doomed) != 0)
      _exit(1);
    if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) _exit(2);
    _exit(0); /* dies with an unread event: its socket is reset, not closed */
  }
  char c;
  CHECK(read(ready[0], &c, 1) == 1);
  tide_store_t *store = connect_ok();
  CHECK_OK(tide_store_set(store, "event/ping", "p", 1));
  expect_event(observer, 5000, "event/ping", "p");
  sleep_ms(50); /* let the ping reach the child before it dies */
  CHECK(write(go[1], &c, 1) == 1);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  expect_event(observer, 1000, "event/lost/job:child", "job:child");
  expect_get(store, "event/lost/job:child", "job:child", 9);
  close(ready[0]);
  close(ready[1]);
  close(go[0]);
  close(go[1]);
  tide__store_watch_close(observer);
  tide_store_close(store);
}

static void test_watch_clean_close(void) {
  tide__store_watch_t *observer, *polite;
  CHECK_OK(tide__store_watch_open("127.0.0.1", port, TOKEN, "observer2", 5000, &observer));
  CHECK_OK(tide__store_watch_open("127.0.0.1", port, TOKEN, "job:polite", 5000, &polite));
  tide_store_t *store = connect_ok();
  /* polite closes with this event unread: close must drain it. */
  CHECK_OK(tide_store_set(store, "event/before", "b", 1));
  expect_event(observer, 5000, "event/before", "b");
  tide__store_watch_close(polite);
  CHECK_OK(tide_store_set(store, "event/after", "a", 1));
  expect_event(observer, 5000, "event/after", "a");
  char *key;
  void *value;
  size_t len;
  if (next_event(observer, 300, &key, &value, &len) == 1) {
    fprintf(stderr, "unexpected event \"%s\" after a clean close\n", key);
    CHECK(0);
  }
  CHECK_RC(tide_store_get(store, "event/lost/job:polite", 0, &value, &len), TIDE_ETIMEDOUT);
  tide__store_watch_close(observer);
  tide_store_close(store);
}

/* ---- the server going away ---- */

typedef struct {
  tide_store_t *store;
  int rc;
  int64_t ms;
} blocked_get_t;

static void *blocked_get(void *arg) {
  blocked_get_t *g = arg;
  int64_t start = tide__now_ns();
  void *value;
  size_t len;
  g->rc = tide_store_get(g->store, "never", 20000, &value, &len);
  g->ms = ms_since(start);
  return NULL;
}

static void test_stop(void) {
  tide_store_server_t *doomed;
  CHECK_OK(tide_store_server_start("127.0.0.1", 0, TOKEN, &doomed));
  int doomed_port = tide_store_server_port(doomed);
  tide_store_t *store, *idle;
  CHECK_OK(tide_store_connect("127.0.0.1", doomed_port, TOKEN, 5000, &store));
  CHECK_OK(tide_store_connect("127.0.0.1", doomed_port, TOKEN, 5000, &idle));
  tide__store_watch_t *watch;
  CHECK_OK(tide__store_watch_open("127.0.0.1", doomed_port, TOKEN, "job:w", 5000, &watch));
  CHECK_OK(tide_store_set(idle, "x", "1", 1));
  blocked_get_t g = {store, 1, 0};
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, blocked_get, &g) == 0);
  sleep_ms(200);
  int64_t start = tide__now_ns();
  tide_store_server_stop(doomed);
  CHECK(ms_since(start) < 5000);
  pthread_join(thread, NULL);
  CHECK(g.rc == TIDE_EPEER);
  CHECK(g.ms < 10000); /* ended by the stop, not by its 20 s timeout */
  CHECK_RC(tide_store_set(idle, "x", "2", 1), TIDE_EPEER);
  CHECK_RC(tide_store_set(idle, "x", "3", 1), TIDE_EPEER); /* and stays failed */
  char *key;
  void *value;
  size_t len;
  struct pollfd p = {tide__store_watch_fd(watch), POLLIN, 0};
  CHECK(poll(&p, 1, 5000) == 1);
  CHECK_RC(tide__store_watch_next(watch, &key, &value, &len), TIDE_EPEER);
  tide__store_watch_close(watch);
  tide_store_close(store);
  tide_store_close(idle);
}

static void test_frozen_server(void) {
  /* A server that is alive but answers nothing (SIGSTOP): calls end with
   * TIDE_ETIMEDOUT at their timeout plus the client's margin. */
  int pid;
  int frozen_port = harness_store_start(TOKEN, &pid);
  CHECK(frozen_port > 0);
  tide_store_t *store;
  CHECK_OK(tide_store_connect("127.0.0.1", frozen_port, TOKEN, 5000, &store));
  CHECK_OK(tide_store_set(store, "k", "v", 1));
  CHECK(kill(pid, SIGSTOP) == 0);
  void *value;
  size_t len;
  int64_t start = tide__now_ns();
  CHECK_RC(tide_store_get(store, "missing", 100, &value, &len), TIDE_ETIMEDOUT);
  CHECK(ms_since(start) < 15000);
  CHECK_RC(tide_store_get(store, "k", 100, &value, &len), TIDE_EPEER);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  tide_store_close(store);
}

int main(void) {
  alarm(120); /* a hang fails the test instead of stalling ctest */
  /* First, while this process has no thread: it forks a server process,
   * and a fork of a threaded process may not start threads (POSIX allows
   * only async-signal-safe calls there; ThreadSanitizer refuses it). */
  int64_t frozen_start = tide__now_ns();
  test_frozen_server();
  printf("ok frozen_server (%lld ms)\n", (long long)ms_since(frozen_start));
  CHECK_OK(tide_store_server_start("127.0.0.1", 0, TOKEN, &server));
  port = tide_store_server_port(server);
  CHECK(port > 0);
  struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
      {"roundtrip", test_roundtrip},         {"get_waits", test_get_waits},
      {"timeouts", test_timeouts},           {"add", test_add},
      {"delete", test_delete},               {"bad_arguments", test_bad_arguments},
      {"wrong_token", test_wrong_token},     {"malformed", test_malformed},
      {"watch_events", test_watch_events},   {"watch_lost", test_watch_lost},
      {"watch_clean_close", test_watch_clean_close},
      {"stop", test_stop},
  };
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    int64_t start = tide__now_ns();
    tests[i].fn();
    printf("ok %s (%lld ms)\n", tests[i].name, (long long)ms_since(start));
    fflush(stdout);
  }
  tide_store_server_stop(server);
  return 0;
}
