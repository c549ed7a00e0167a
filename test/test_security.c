/* Hardening (docs/security.md): counts whose byte sizes overflow, helpers
 * given bad arguments, start-up with strangers' silent connections open
 * against a rank's port, a handshake the peer closes, the store's cap on
 * handshakes in progress, and rate-limited warnings. Each case runs in its
 * own process (a crash fails that case by name) with its own log file. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "harness.h"

#define TOKEN "security-test-token"
#define HUGE_COUNT (((size_t)1 << 62) + 16)

static char log_path[128];

/* 1 when the log file holds `text`. */
static int logged(const char *text) {
  FILE *f = fopen(log_path, "r");
  if (f == NULL) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f) != NULL) found = strstr(line, text) != NULL;
  fclose(f);
  return found;
}

static size_t log_lines(const char *text) {
  FILE *f = fopen(log_path, "r");
  if (f == NULL) return 0;
  char line[4096];
  size_t n = 0;
  while (fgets(line, sizeof line, f) != NULL) n += strstr(line, text) != NULL;
  fclose(f);
  return n;
}

static tide_comm_t *solo(void) {
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  CHECK(tide_comm_size(comm) == 1);
  return comm;
}

/* ---- 1. counts whose bytes overflow ---- */

static void overflow_sampler(void) {
  tide_sampler_t *s = NULL;
  CHECK_RC(tide_sampler_create((uint64_t)1 << 61, 1, 0, 1, &s), TIDE_EINVAL);
  CHECK_RC(tide_sampler_create(UINT64_MAX, 1, 0, 4, &s), TIDE_EINVAL);
  CHECK(s == NULL);
  CHECK(logged("tide_sampler_create: n = "));
}

/* Every dense and sparse collective at np 1, on small buffers: each must
 * refuse the count before touching memory. */
static void overflow_solo(void) {
  float small[64] = {0};
  uint32_t index[1] = {0};
  size_t counts[1] = {HUGE_COUNT};
  tide_op_t ops[] = {TIDE_SUM, TIDE_AVG, TIDE_MAX};
  for (size_t i = 0; i < 3; i++) {
    tide_comm_t *comm = solo();
    CHECK_RC(tide_allreduce(comm, small, small + 32, HUGE_COUNT, TIDE_F32, ops[i]), TIDE_EINVAL);
    tide_comm_destroy(comm);
  }
  tide_comm_t *comm = solo();
  CHECK_RC(tide_allreduce(comm, small, small, HUGE_COUNT, TIDE_F16, TIDE_SUM), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_reduce_scatter(comm, small, small + 32, HUGE_COUNT, TIDE_F64, TIDE_SUM), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_broadcast(comm, small, HUGE_COUNT, TIDE_I64, 0), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_allgather(comm, small, small + 32, HUGE_COUNT, TIDE_I32), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_allgatherv(comm, small, HUGE_COUNT, small + 32, counts, TIDE_F32), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_sparse_allgather(comm, small, index, 1, small + 32, HUGE_COUNT, TIDE_SUM), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  CHECK_RC(tide_sparse_allgather(comm, small, index, HUGE_COUNT, small + 32, 16, TIDE_SUM), TIDE_EINVAL);
  tide_comm_destroy(comm);
  comm = solo();
  tide_compressor_t *c;
  CHECK_OK(tide_compressor_create(TIDE_TOPK_EXACT, 0.5, TIDE_TOPK_GLOBAL, NULL, 0, 16, NULL, &c));
  CHECK_RC(tide_hitopk_allreduce(comm, small, small, HUGE_COUNT, c, TIDE_SUM), TIDE_EINVAL);
  tide_compressor_destroy(c);
  tide_comm_destroy(comm);
  /* The same through the nonblocking path. */
  comm = solo();
  tide_request_t *req = NULL;
  CHECK_RC(tide_iallreduce(comm, small, small, HUGE_COUNT, TIDE_F32, TIDE_SUM, &req), TIDE_EINVAL);
  CHECK(req == NULL);
  tide_comm_destroy(comm);
  CHECK(logged("more than PTRDIFF_MAX bytes"));
}

static int overflow_ranks(int rank, int size, void *arg) {
  (void)arg;
  float small[64] = {0};
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  /* count * size overflows while count * 4 does not. */
  size_t gather_count = ((size_t)1 << 61) / (size_t)size + 1;
  CHECK_RC(tide_allgather(comm, small, small + 32, gather_count, TIDE_F32), TIDE_EINVAL);
  tide_comm_destroy(comm);
  CHECK_OK(tide_comm_init(&comm));
  CHECK_RC(tide_allreduce(comm, small, small + 32, HUGE_COUNT, TIDE_F32, TIDE_SUM), TIDE_EINVAL);
  tide_comm_destroy(comm);
  CHECK_OK(tide_comm_init(&comm));
  size_t counts[2] = {SIZE_MAX / 2, SIZE_MAX / 2};
  CHECK_RC(tide_allgatherv(comm, small, counts[rank], small + 32, counts, TIDE_I32), TIDE_EINVAL);
  tide_comm_destroy(comm);
  return 0;
}

static void overflow_np2(void) {
  harness_opts_t opts = {.np = 2, .token = TOKEN, .timeout_s = 60};
  CHECK(harness_run(&opts, overflow_ranks, NULL) == 0);
  opts.tcp_only = 1;
  CHECK(harness_run(&opts, overflow_ranks, NULL) == 0);
}

static void overflow_optim(void) {
  /* A shape whose product wraps to the count. */
  tide_tensor_t t = {"w", 0, (size_t)1 << 48, 4, {65536, 65536, 65536, 65537}};
  tide_optim_config_t config;
  tide_optim_config_default(TIDE_OPTIM_SGD, &config);
  tide_optim_t *opt = NULL;
  CHECK_RC(tide_optim_create(&config, &t, 1, (size_t)1 << 48, &opt), TIDE_EINVAL);
  CHECK(opt == NULL);
  CHECK(logged("its shape holds more than SIZE_MAX elements"));
}

static void *naive_calloc(size_t count, size_t size) { return malloc(count * size); } /* checks nothing */

static void overflow_calloc(void) {
  CHECK_OK(tide_replace_allocator(malloc, realloc, naive_calloc, free));
  void *p = tide__calloc(((size_t)1 << 62) + 1, 4); /* 4 bytes once wrapped */
  CHECK(p == NULL);
}

/* ---- 2. helpers given bad arguments ---- */

static void helpers(void) {
  size_t offset = 7, len = 7;
  tide_block(10, 0, 0, &offset, &len); /* divided by zero */
  CHECK(offset == 0 && len == 0);
  tide_block(10, 2, 5, &offset, &len);
  CHECK(len == 0);
  tide_block(10, 2, 0, NULL, NULL);
  tide_block(10, 2, 1, &offset, &len);
  CHECK(offset == 5 && len == 5);
  CHECK(logged("tide_block: size = 0 and rank = 0"));
  tide_params_print(NULL, 0);
  tide_params_print(NULL, 1);
  CHECK(logged("tide_params_print: out must not be NULL"));
  CHECK_RC(tide_compressor_set_density(NULL, 0.5), TIDE_EINVAL);
  CHECK(logged("tide_compressor_set_density: c must not be NULL"));
  float x[4] = {0};
  CHECK_RC(tide_allreduce(NULL, x, x, 4, TIDE_F32, TIDE_SUM), TIDE_EINVAL);
  CHECK(logged("tide_allreduce: comm must not be NULL"));
  CHECK_RC(tide_wait(NULL), TIDE_EINVAL);
  CHECK(logged("tide_wait: req must not be NULL"));
  int done;
  CHECK_RC(tide_test(NULL, &done), TIDE_EINVAL);
  CHECK(tide_comm_rank(NULL) == TIDE_EINVAL);
  CHECK(logged("tide_comm_rank: comm must not be NULL"));
  /* NULL arguments are reported one way everywhere: TIDE_EINVAL and "fn: arg must not be NULL" logged. */
  tide_request_t *req = NULL;
  CHECK_RC(tide_iadasum_allreduce(NULL, x, x, 4, TIDE_F32, NULL, 0, &req), TIDE_EINVAL);
  CHECK(logged("tide_iadasum_allreduce: comm must not be NULL"));
  tide_speedup_t *speedup = NULL;
  CHECK_RC(tide_speedup_create(NULL, &speedup), TIDE_EINVAL);
  CHECK(logged("tide_speedup_create: hints or out must not be NULL"));
  tide_sched_t *sched = NULL;
  CHECK_RC(tide_sched_create(NULL, 1, NULL, &sched), TIDE_EINVAL);
  CHECK(logged("tide_sched_create: opts, slots or out must not be NULL"));
  CHECK_RC(tide_pollux_fit(NULL, 1, 0, NULL), TIDE_EINVAL);
  CHECK(logged("tide_pollux_fit: profiles or model must not be NULL"));
  tide_pollux_choice_t choice;
  CHECK_RC(tide_pollux_goodput(NULL, NULL, 1, 1, 0, 1, &choice), TIDE_EINVAL);
  CHECK(logged("tide_pollux_goodput: model, limits or out must not be NULL"));
  tide_sim_result_t *sim = NULL;
  CHECK_RC(tide_sim_run(NULL, "x", "y", &sim), TIDE_EINVAL);
  CHECK(logged("tide_sim_run: opts, traces_dir, workload_csv or out must not be NULL"));
  CHECK_RC(tide_sim_plot(NULL, 1, "x", NULL), TIDE_EINVAL);
  CHECK(logged("tide_sim_plot: runs or dir must not be NULL"));
  tide_comm_t *comm = solo();
  CHECK_RC(tide_iallreduce(comm, x, x, 4, TIDE_F32, TIDE_SUM, NULL), TIDE_EINVAL);
  CHECK(logged("tide_iallreduce: req must not be NULL"));
  CHECK_OK(tide_allreduce(comm, x, x, 4, TIDE_F32, TIDE_SUM)); /* not a failure of the communicator */
  /* Our own index out of range is our mistake, named, not a peer's. */
  uint32_t index[2] = {1, 9};
  float values[2] = {1, 2}, out[8];
  CHECK_RC(tide_sparse_allgather(comm, values, index, 2, out, 8, TIDE_SUM), TIDE_EINVAL);
  CHECK(logged("indices[1] = 9 outside [0, d = 8)"));
  tide_comm_destroy(comm);
}

/* ---- 3. start-up with strangers' connections open ---- */

static int peer_port(tide_store_t *store, int rank, char *addr, size_t cap) {
  char key[64], text[400];
  snprintf(key, sizeof key, "w0/peer/%d", rank);
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, key, 10000, &value, &len));
  size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
  memcpy(text, value, n);
  text[n] = '\0';
  tide_free(value);
  int port = 0;
  char fmt[32];
  snprintf(fmt, sizeof fmt, "%%%zus %%d", cap - 1);
  CHECK(sscanf(text, fmt, addr, &port) == 2);
  return port;
}

static int dial_raw(const char *addr, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, addr, &sa.sin_addr);
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  return fd;
}

#define SILENT_PER_PEER 5

/* Ranks 1 and 2 open silent (and garbage) connections to every lower rank's
 * port before they join, so that those sit in the accept queue ahead of
 * the real ones. */
static int startup_ranks(int rank, int size, void *arg) {
  int silent_per_peer = *(const int *)arg;
  int strangers[256], nstrangers = 0;
  if (rank > 0) {
    char rdzv_host[64];
    int rdzv_port;
    CHECK_OK(tide__parse_host_port(getenv("TIDE_RDZV"), rdzv_host, sizeof rdzv_host, &rdzv_port));
    tide_store_t *store;
    CHECK_OK(tide_store_connect(rdzv_host, rdzv_port, TOKEN, 10000, &store));
    for (int lower = 0; lower < rank; lower++) {
      char addr[64];
      int port = peer_port(store, lower, addr, sizeof addr);
      for (int i = 0; i < silent_per_peer; i++) strangers[nstrangers++] = dial_raw(addr, port);
      int garbage = dial_raw(addr, port);
      CHECK(write(garbage, "GET / HTTP/1.0\r\n\r\n", 18) == 18);
      strangers[nstrangers++] = garbage;
    }
    tide_store_close(store);
  }
  tide_comm_t *comm;
  CHECK_OK(tide_comm_init(&comm));
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = (float)(rank + i);
  CHECK_OK(tide_allreduce(comm, x, x, 16, TIDE_F32, TIDE_SUM));
  for (int i = 0; i < 16; i++) CHECK(x[i] == (float)(size * i + size * (size - 1) / 2));
  tide_comm_destroy(comm);
  for (int i = 0; i < nstrangers; i++) close(strangers[i]);
  return 0;
}

static void startup_strangers(void) {
  /* Before: each silent connection cost 5 s, one after the other, and ten
   * ahead of rank 1 passed this deadline. */
  setenv("TIDE_TIMEOUT_MS", "12000", 1);
  harness_opts_t opts = {.np = 3, .tcp_only = 1, .token = TOKEN, .timeout_s = 60};
  int silent = SILENT_PER_PEER;
  int64_t start = tide__now_ns();
  CHECK(harness_run(&opts, startup_ranks, &silent) == 0);
  printf("startup_strangers: 3 ranks joined and all-reduced with %d silent connections open in %.0f ms\n",
         3 * silent, (tide__now_ns() - start) / 1e6);
}

/* More silent connections than a rank keeps handshakes in progress: the
 * oldest silent ones close, the real peer gets in. */
static void startup_flood(void) {
  harness_opts_t opts = {.np = 2, .tcp_only = 1, .token = TOKEN, .timeout_s = 60};
  int silent = 200;
  CHECK(harness_run(&opts, startup_ranks, &silent) == 0);
  CHECK(logged("too many connections are proving the job token at once"));
}

/* A server that takes the client's proof and closes without answering: the
 * client has lost its peer (TIDE_EPEER), nobody refused its token. */
static void handshake_closed(void) {
  for (int answer_zeros = 0; answer_zeros < 2; answer_zeros++) {
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t pid = fork();
    if (pid == 0) {
      close(sv[0]);
      uint8_t hello[41] = "TIDEAUTH1", in[41 + 32]; /* magic and any nonce */
      if (write(sv[1], hello, sizeof hello) != sizeof hello) _exit(1);
      if (tide__recv_all(sv[1], in, sizeof in, tide__deadline_after_ms(5000)) != 0) _exit(1);
      if (answer_zeros) { /* a refusal: a proof that cannot verify */
        uint8_t zeros[32] = {0};
        if (write(sv[1], zeros, sizeof zeros) != sizeof zeros) _exit(1);
      }
      _exit(0);
    }
    close(sv[1]);
    int rc = tide__auth_handshake(sv[0], TOKEN, 0, tide__deadline_after_ms(5000));
    CHECK_RC(rc, answer_zeros ? TIDE_EAUTH : TIDE_EPEER);
    close(sv[0]);
    waitpid(pid, NULL, 0);
  }
  /* The real server half refuses a wrong token with such an answer. */
  uint8_t hello[TIDE__AUTH_HELLO_BYTES], answer[32], in[TIDE__AUTH_CLIENT_BYTES] = "TIDEAUTH1";
  const char *why = NULL;
  CHECK_OK(tide__auth_server_hello(hello));
  CHECK(tide__auth_server_check(hello, TOKEN, in, 9, answer, &why) == 0);
  CHECK_RC(tide__auth_server_check(hello, TOKEN, in, sizeof in, answer, &why), TIDE_EAUTH);
  CHECK(strcmp(why, "wrong job token") == 0);
  in[0] = 'X'; /* not a handshake at all: no refusal answer owed */
  CHECK_RC(tide__auth_server_check(hello, TOKEN, in, 1, answer, &why), TIDE_EPROTO);
}

/* ---- 4. the store under a flood of silent connections ---- */

static void store_flood(void) {
  struct rlimit lim;
  CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0);
  int silent = 600;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < 700) {
    printf("skip store_flood: RLIMIT_NOFILE hard limit %llu\n", (unsigned long long)lim.rlim_max);
    return;
  }
  lim.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > 4096 ? 4096 : lim.rlim_max;
  CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
  /* The server runs with 128 descriptors: fewer than the strangers. */
  struct rlimit small = {128, lim.rlim_max};
  CHECK(setrlimit(RLIMIT_NOFILE, &small) == 0);
  int pid;
  int port = harness_store_start(TOKEN, &pid);
  CHECK(setrlimit(RLIMIT_NOFILE, &lim) == 0);
  CHECK(port > 0);
  int *fds = malloc((size_t)silent * sizeof *fds);
  for (int i = 0; i < silent; i++) fds[i] = dial_raw("127.0.0.1", port);
  /* Before: the server had run out of descriptors and served nobody until
   * the strangers' 5 s ran out. */
  tide_store_t *store;
  int64_t start = tide__now_ns();
  CHECK_OK(tide_store_connect("127.0.0.1", port, TOKEN, 3000, &store));
  printf("store_flood: a client connected in %.1f ms behind %d silent connections\n",
         (tide__now_ns() - start) / 1e6, silent);
  CHECK_OK(tide_store_set(store, "k", "v", 1));
  void *value;
  size_t len;
  CHECK_OK(tide_store_get(store, "k", 1000, &value, &len));
  CHECK(len == 1 && memcmp(value, "v", 1) == 0);
  tide_free(value);
  tide_store_close(store);
  for (int i = 0; i < silent; i++) close(fds[i]);
  free(fds);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* ---- 5. a client that makes the store warn as fast as it can ---- */

static void log_flood(void) {
  tide_store_server_t *server;
  CHECK_OK(tide_store_server_start("127.0.0.1", 0, TOKEN, &server));
  int port = tide_store_server_port(server);
  int attempts = 1000;
  for (int i = 0; i < attempts; i++) {
    int fd = dial_raw("127.0.0.1", port);
    CHECK(write(fd, "garbage!!", 9) == 9);
    close(fd);
  }
  usleep(1100 * 1000); /* the server has read them all; a new second starts */
  int fd = dial_raw("127.0.0.1", port);
  CHECK(write(fd, "garbage!!", 9) == 9);
  char byte;
  while (read(fd, &byte, 1) > 0) { /* the server closes when it has refused us */
  }
  close(fd);
  tide_store_server_stop(server);
  size_t lines = log_lines("refused connection from");
  printf("log_flood: %zu warning lines for %d refused connections\n", lines, attempts + 1);
  CHECK(lines < (size_t)attempts / 4);
  CHECK(logged("similar messages suppressed"));
}

int main(int argc, char **argv) {
  struct {
    const char *name;
    void (*fn)(void);
  } tests[] = {
      {"overflow_sampler", overflow_sampler}, {"overflow_solo", overflow_solo},
      {"overflow_np2", overflow_np2},         {"overflow_optim", overflow_optim},
      {"overflow_calloc", overflow_calloc},   {"helpers", helpers},
      {"handshake_closed", handshake_closed}, {"startup_strangers", startup_strangers},
      {"startup_flood", startup_flood},       {"store_flood", store_flood},
      {"log_flood", log_flood},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (argc > 1 && strcmp(argv[1], tests[i].name) != 0) continue;
    snprintf(log_path, sizeof log_path, "/tmp/tide-test-security-%d-%zu.log", (int)getpid(), i);
    unlink(log_path);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(120); /* a hang fails the case instead of stalling ctest */
      setenv("TIDE_LOG_FILE", log_path, 1);
      unsetenv("TIDE_RANK");
      unsetenv("TIDE_SIZE");
      unsetenv("TIDE_RDZV");
      tests[i].fn();
      fflush(stdout);
      _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%s %s", ok ? "ok" : "FAILED", tests[i].name);
    if (!ok && WIFSIGNALED(status)) printf(" (signal %d)", WTERMSIG(status));
    printf("\n");
    if (!ok) {
      failed = 1;
      printf("--- log of %s ---\n", tests[i].name);
      fflush(stdout);
      FILE *f = fopen(log_path, "r");
      char line[4096];
      for (int n = 0; f != NULL && n < 60 && fgets(line, sizeof line, f) != NULL; n++) fputs(line, stdout);
      if (f != NULL) fclose(f);
    }
    unlink(log_path);
  }
  return failed;
}
