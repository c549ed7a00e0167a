/* Internal core of libtide: error propagation, logging, parameters,
 * allocation, clocks, randomness, HMAC and socket helpers. Every other
 * module includes this header and nothing below it. */
#ifndef TIDE_CORE_H
#define TIDE_CORE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tide.h"

/* ---- error propagation ---------------------------------------------------- */

#define TIDE_CHECK(call)                                                                 \
  do {                                                                                   \
    int tide__check_rc = (call);                                                         \
    if (tide__check_rc < 0) return tide__check_rc;                                       \
  } while (0)

#define TIDE_CHECK_GOTO(call, rc, label)                                                 \
  do {                                                                                   \
    (rc) = (call);                                                                       \
    if ((rc) < 0) goto label;                                                            \
  } while (0)

/* ---- logging ---------------------------------------------------------------- */

enum { TIDE__LOG_ERROR = 0, TIDE__LOG_WARN, TIDE__LOG_INFO, TIDE__LOG_DEBUG, TIDE__LOG_TRACE };

extern int tide__log_level;
void tide__log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The rank shown in every log line ("-" until set). */
void tide__log_set_rank(int rank);

/* Checks the level before formatting anything. */
#define TIDE_LOG(level, ...)                                                             \
  do {                                                                                   \
    if ((level) <= tide__log_level) tide__log_write((level), __VA_ARGS__);               \
  } while (0)
#define TIDE_ERROR(...) TIDE_LOG(TIDE__LOG_ERROR, __VA_ARGS__)
#define TIDE_WARN(...) TIDE_LOG(TIDE__LOG_WARN, __VA_ARGS__)
#define TIDE_INFO(...) TIDE_LOG(TIDE__LOG_INFO, __VA_ARGS__)
#define TIDE_DEBUG(...) TIDE_LOG(TIDE__LOG_DEBUG, __VA_ARGS__)
#define TIDE_TRACE(...) TIDE_LOG(TIDE__LOG_TRACE, __VA_ARGS__)

/* ---- parameters ------------------------------------------------------------- */

/* XX(id, type, default, min, max, help); type INT values are int64 within
 * [min, max]; STR values are free text (checked where used). */
#define TIDE__PARAMS(XX)                                                                 \
  XX(LOG_LEVEL, STR, "warn", 0, 0, "log level: error, warn, info, debug or trace")       \
  XX(LOG_FILE, STR, "", 0, 0, "append log lines to this file instead of stderr")         \
  XX(TIMEOUT_MS, INT, "300000", 1, 2147483647,                                           \
     "deadline in ms of every blocking wait on a peer or the store")                     \
  XX(RDZV, STR, "", 0, 0, "host:port of the rendezvous store (set by tiderun)")          \
  XX(JOB_TOKEN, STR, "", 0, 0, "job secret every store and peer connection proves")      \
  XX(RANK, INT, "-1", -1, 1048575, "rank of this process (set by tiderun)")              \
  XX(SIZE, INT, "-1", -1, 1048576, "number of ranks in the job (set by tiderun)")        \
  XX(LOCAL_RANK, INT, "-1", -1, 1048575, "rank among the ranks of this host (tiderun)")  \
  XX(SOCKET_IFNAME, STR, "",  0, 0,                                                      \
     "network interface for peer connections (default: the address the store sees)")     \
  XX(HOST_ID, STR, "", 0, 0,                                                             \
     "overrides host grouping: ranks with equal ids share memory (default: detected)")   \
  XX(SHM, INT, "1", 0, 1, "1 uses shared memory between ranks on one host, 0 TCP only")  \
  XX(SHM_RING_BYTES, INT, "2097152", 65536, 1073741824,                                  \
     "bytes of each shared-memory ring from one rank to another")                        \
  XX(SPIN_US, INT, "200", 0, 1000000,                                                    \
     "microseconds a wait polls (yielding the core) before it sleeps")                   \
  XX(ALGO, STR, "auto", 0, 0,                                                            \
     "allreduce algorithm: auto, ring, rd (recursive doubling), hier (hierarchical) or "  \
     "mpi (on an MPI communicator: MPI's own for every dense collective; docs/mpi.md)")   \
  XX(BACKEND, STR, "auto", 0, 0,                                                         \
     "how tide_comm_init joins: auto (tiderun, or TIDE_RDZV under another launcher) or " \
     "mpi (MPI_COMM_WORLD, initialising MPI if needed)")                                 \
  XX(MPI_REDUCE_MAX_BYTES, INT, "65536", 0, 4611686018427387904LL,                       \
     "on an MPI communicator, auto runs allreduce and reduce-scatter as MPI's own up to " \
     "this many bytes and as tide's algorithms over MPI point-to-point above")           \
  XX(SMALL_BYTES, INT, "65536", 0, 1073741824,                                           \
     "allreduce messages up to this size use recursive doubling under auto")             \
  XX(ADASUM_HIER, INT, "1", 0, 1,                                                        \
     "adasum allreduce on ranks spanning hosts (as many on each): 1 averages within the "  \
     "host and runs Adasum across hosts, 0 runs Adasum over every rank")                 \
  XX(SPARSE_MIN, INT, "16384", 0, 1073741824,                                            \
     "hierarchical top-k allreduce of fewer elements than this runs dense instead")     \
  XX(MAX_FRAME_BYTES, INT, "1073741824", 4096, 4294967295LL,                             \
     "largest frame or store value accepted from the wire")                              \
  XX(NUM_THREADS, INT, "0", 0, 256,                                                      \
     "threads of one top-k selection or compression (0: the online CPUs); each gets "     \
     "at least 512Ki elements")

enum {
#define XX(id, type, def, min, max, help) TIDE__PARAM_##id,
  TIDE__PARAMS(XX)
#undef XX
      TIDE__PARAM_COUNT
};

/* Values of the table; loads it on first use (tide_params_load). */
int64_t tide__param_int(int id);
const char *tide__param_str(int id);

/* ---- allocation --------------------------------------------------------------- */

void *tide__malloc(size_t n);
void *tide__calloc(size_t count, size_t size);
void *tide__realloc(void *ptr, size_t n);
void tide__free(void *ptr);
char *tide__strdup(const char *s);

/* ---- clocks, deadlines, randomness -------------------------------------------- */

/* Monotonic nanoseconds. */
int64_t tide__now_ns(void);
/* Absolute deadline ms milliseconds from now (INT64_MAX when ms < 0). */
int64_t tide__deadline_after_ms(int64_t ms);
/* Milliseconds left before deadline, at least 0, capped at INT32_MAX. */
int tide__ms_left(int64_t deadline_ns);
/* Fills buf with n bytes from the kernel's random source. */
int tide__random_bytes(void *buf, size_t n);

/* ---- HMAC-SHA256 --------------------------------------------------------------- */

void tide__sha256(const void *data, size_t len, uint8_t out[32]);
void tide__hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                       uint8_t out[32]);

/* ---- sockets (src/core/net.c) ---------------------------------------------- */

/* Listens on host:port (host NULL or "" = any, port 0 = pick one); writes the
 * fd and the bound port. */
int tide__tcp_listen(const char *host, int port, int *fd_out, int *port_out);
/* Connects to host:port, retrying refused connections until deadline. */
int tide__tcp_connect(const char *host, int port, int64_t deadline_ns, int *fd_out);
/* Accepts one connection before deadline (the listening fd may be blocking). */
int tide__tcp_accept(int listen_fd, int64_t deadline_ns, int *fd_out);
/* Sends / receives exactly len bytes before deadline on a blocking or
 * nonblocking fd. TIDE_EPEER when the peer closed, TIDE_ETIMEDOUT at the
 * deadline. */
int tide__send_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
int tide__recv_all(int fd, void *buf, size_t len, int64_t deadline_ns);
/* Sets TCP_NODELAY, close-on-exec and, when nonblocking != 0, O_NONBLOCK. */
int tide__socket_tune(int fd, int nonblocking);
/* Splits "host:port"; host is copied into host_out (size host_cap). */
int tide__parse_host_port(const char *text, char *host_out, size_t host_cap, int *port_out);
/* The IPv4 address of interface ifname in dotted form. */
int tide__ifname_addr(const char *ifname, char *addr_out, size_t cap);
/* The local address of a connected socket in dotted form. */
int tide__sock_local_addr(int fd, char *addr_out, size_t cap);

/* Mutual challenge-response on a fresh connection: each side sends a random
 * nonce and answers the other's with HMAC-SHA256(token, role || nonce).
 * `server` is 1 on the accepting side. TIDE_EAUTH when the peer does not
 * prove the token (the caller closes the fd). */
int tide__auth_handshake(int fd, const char *token, int server, int64_t deadline_ns);

#endif
