/* Internal core of libtide: error propagation, logging, parameters,
 * allocation, clocks, randomness, HMAC and socket helpers. Every other
 * module includes this header and nothing below it. */
#ifndef TIDE_CORE_H
#define TIDE_CORE_H

#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tide.h"

/* Error propagation (TIDE_CHECK, TIDE_CHECK_GOTO): include/tide/errors.h. */

/* ---- logging ---------------------------------------------------------------- */

enum { TIDE__LOG_ERROR = 0, TIDE__LOG_WARN, TIDE__LOG_INFO, TIDE__LOG_DEBUG, TIDE__LOG_TRACE };

extern int tide__log_level;
void tide__log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The rank shown in every log line ("-" until set). */
void tide__log_set_rank(int rank);
/* 1: this thread logs nothing until tide__log_mute(0) (probing ports whose
 * failures are expected); other threads are not affected. */
void tide__log_mute(int mute);

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

/* Rate limit for a warning a stranger can trigger at will (a refused
 * connection): at most TIDE__RATELIMIT_BURST lines per second per call site;
 * the next line printed after a quiet spell says how many were left out.
 * One static tide__ratelimit_t per call site; any thread may use it. */
#define TIDE__RATELIMIT_BURST 10
typedef struct {
  int64_t window_ns;           /* start of the current one-second window */
  unsigned printed;            /* lines printed in it */
  unsigned long long suppressed; /* lines left out since the last printed one */
} tide__ratelimit_t;
/* 1 when a line may be printed now; then *suppressed is the number left out
 * before it (and is reset). */
int tide__ratelimit_pass(tide__ratelimit_t *rl, unsigned long long *suppressed);
/* Writes the line with " (N similar messages suppressed)" when N > 0. */
void tide__log_write_suppressed(int level, unsigned long long suppressed, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define TIDE_WARN_RATELIMITED(rl, ...)                                                   \
  do {                                                                                   \
    unsigned long long tide__suppressed_;                                                \
    if (TIDE__LOG_WARN <= tide__log_level && tide__ratelimit_pass((rl), &tide__suppressed_)) \
      tide__log_write_suppressed(TIDE__LOG_WARN, tide__suppressed_, __VA_ARGS__);        \
  } while (0)

/* ---- argument checks ---------------------------------------------------------- */

/* Logs "fn: arg must not be NULL" and returns TIDE_EINVAL. */
int tide__null_arg(const char *fn, const char *arg);
/* *bytes = count * size when that is at most PTRDIFF_MAX (the largest
 * object C can index); otherwise logs "fn: arg = count elements of size
 * bytes overflow ..." and returns TIDE_EINVAL. */
int tide__array_bytes(const char *fn, const char *arg, size_t count, size_t size, size_t *bytes);

/* ---- parameters ------------------------------------------------------------- */

/* XX(id, type, default, min, max, help); type INT values are int64 within
 * [min, max]; STR values are free text (checked where used); ENUM values
 * are one of the names TIDE__PARAM_ENUMS gives the parameter (checked at
 * load; tide__param_enum gives the index). */
#define TIDE__PARAMS(XX)                                                                 \
  XX(LOG_LEVEL, ENUM, "warn", 0, 0, "log level: error, warn, info, debug or trace")      \
  XX(LOG_FILE, STR, "", 0, 0, "append log lines to this file instead of stderr")         \
  XX(TIMEOUT_MS, INT, "300000", 1, 2147483647,                                           \
     "deadline in ms of every blocking wait on a peer or the store")                     \
  XX(RDZV, STR, "", 0, 0, "host:port of the rendezvous store (set by tiderun)")          \
  XX(JOB_TOKEN, STR, "", 0, 0, "job secret every store and peer connection proves")      \
  XX(RANK, INT, "-1", -1, 1048575, "rank of this process (set by tiderun)")              \
  XX(NODE_RANK, INT, "-1", -1, 1048575,                                                 \
     "index of this process's host in the job (set by tiderun and tide sched's agents); "  \
     "an elastic joiner publishes it as elastic/node/ID so a scheduler knows its host")   \
  XX(SIZE, INT, "-1", -1, 1048576, "number of ranks in the job (set by tiderun)")        \
  XX(LOCAL_RANK, INT, "-1", -1, 1048575, "rank among the ranks of this host (tiderun)")  \
  XX(SOCKET_IFNAME, STR, "",  0, 0,                                                      \
     "network interface for peer connections (default: the address the store sees)")     \
  XX(HOST_ID, STR, "", 0, 0,                                                             \
     "overrides host grouping: ranks with equal ids share memory (default: detected)")   \
  XX(SHM, INT, "1", 0, 1, "1 uses shared memory between ranks on one host, 0 TCP only")  \
  XX(SHM_RING_BYTES, INT, "2097152", 65536, 1073741824,                                  \
     "bytes of each shared-memory ring from one rank to another")                        \
  XX(SHM_STORES, ENUM, "plain", 0, 0,                                                    \
     "how a shared-memory send writes into the ring: plain (memcpy), stream (non-temporal " \
     "stores) or auto (each process times both; for VMs whose cores at times pass cache "  \
     "lines slowly: docs/performance.md, \"Shared-memory stores\")")                     \
  XX(SPIN_US, INT, "200", 0, 1000000,                                                    \
     "microseconds a wait polls (yielding the core) before it sleeps")                   \
  XX(ALGO, ENUM, "auto", 0, 0,                                                           \
     "allreduce algorithm: auto, ring, rd (recursive doubling), hier (hierarchical) or "  \
     "mpi (on an MPI communicator: MPI's own for every dense collective; docs/mpi.md)")   \
  XX(BACKEND, ENUM, "auto", 0, 0,                                                        \
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
     "threads of one top-k selection or compression, and the default of the trainer's "  \
     "(0: the rank's share of the CPUs, tide_compute_threads); each gets at least "      \
     "512Ki elements")                                                                    \
  XX(BIND, ENUM, "auto", 0, 0,                                                           \
     "CPU binding of each local rank: core (a contiguous share of the host's cores, "    \
     "within one NUMA node when it fits), numa (the NUMA nodes of that share), none, or " \
     "auto: core under tiderun (tiderun --bind overrides), none under mpirun or srun "    \
     "(which bind by their own rules; set core or numa to have tide_comm_init bind)")  \
  XX(DATA_CACHE, STR, "", 0, 0,                                                          \
     "directory of the data loader's disk cache (default: $XDG_CACHE_HOME/tide/data, "   \
     "else ~/.cache/tide/data; none: no disk cache); tide_loader_config_t.cache_dir and " \
     "tide-train --cache-dir override it")                                               \
  XX(DATA_CACHE_BYTES, INT, "10737418240", 0, 4611686018427387904LL,                     \
     "size bound of the data disk cache; least recently used entries go past it (0: none)") \
  XX(DATA_RETRIES, INT, "5", 0, 100,                                                     \
     "attempts after the first at reading a data object over HTTP, with doubling back-off") \
  XX(DATA_TIMEOUT_MS, INT, "30000", 100, 2147483647,                                     \
     "deadline in ms of one read of the data loader: an HTTP request (connect and "        \
     "transfer) or a local file")                                                          \
  XX(DATA_INDEX_MAX_BYTES, INT, "268435456", 1024, 4611686018427387904LL,               \
     "most bytes read of a data source's index.txt (and of an object the index gives no "  \
     "size); a server that sends more is refused (an object is read up to its indexed size)") \
  XX(DATA_MAX_IMAGE_PIXELS, INT, "16777216", 1, 4611686018427387904LL,                   \
     "most pixels (height x width) an image's header may claim; a larger one is refused " \
     "before decoding (a decompression bomb)")                                            \
  XX(DATA_THREADS, INT, "0", 0, 64,                                                      \
     "read and decode threads of each rank's data loader (0: 2)")                        \
  XX(ELASTIC, INT, "0", 0, 1,                                                            \
     "1: the job is elastic (set by tiderun --elastic): membership epochs in the store, " \
     "tide_comm_resize and the trainer's recovery (docs/elastic.md)")                    \
  XX(ELASTIC_JOIN, INT, "0", 0, 1,                                                       \
     "1: tide_comm_init joins a running elastic job as a new worker instead of taking "  \
     "TIDE_RANK (set by tiderun for replacements and added workers)")                    \
  XX(ELASTIC_MIN, INT, "1", 1, 1048576,                                                  \
     "an elastic job fails when fewer workers than this remain")                         \
  XX(ELASTIC_MAX, INT, "1048576", 1, 1048576,                                            \
     "most workers of an elastic job: waiting workers beyond it are not admitted")       \
  XX(ELASTIC_TIMEOUT_MS, INT, "10000", 1, 2147483647,                                    \
     "how long a membership change waits for a member that neither arrives nor is seen " \
     "to die, and for new members to connect, before it goes on without them")           \
  XX(SCHED_HINTS_INTERVAL, INT, "30", 1, 86400,                                          \
     "seconds of training between a Pollux agent's reports of its scheduling hints to "  \
     "the job's store (sched/hints; also sooner when its model changes by a quarter)")   \
  XX(GPU_CACHE, STR, "", 0, 0,                                                           \
     "directory of the GPU kernels compiled for each device (default: $XDG_CACHE_HOME/"   \
     "tide/gpu, else ~/.cache/tide/gpu; none: compile in every process)")               \
  XX(NVRTC_LIBRARY, STR, "", 0, 0,                                                       \
     "path of libnvrtc.so, tried before libnvrtc.so, .so.13 and .so.12 (GPU top-k)")     \
  XX(GPU_GRAPHS, INT, "1", 0, 1,                                                         \
     "1: a GPU selection repeated with the same tensors and k replays its kernels as one " \
     "CUDA graph from its second call on (docs/algorithms.md); 0: one launch per kernel") \
  XX(STRAGGLER, ENUM, "report", 0, 0,                                                    \
     "an elastic trainer's answer to a rank whose compute is persistently slow: off, "   \
     "report (log it, tide_trainer_straggler) or remove (also take it out of the job)")    \
  XX(BACKGROUND, INT, "0", 0, 1,                                                         \
     "1: a background job (tiderun --background; docs/elastic.md, \"Multiplexing\"): its " \
     "threads run at the lowest CPU priority (SCHED_IDLE, else nice 19) and its waits "   \
     "block instead of spinning")                                                        \
  XX(FOREGROUND, STR, "", 0, 0,                                                          \
     "a background job's foreground: HOST:PORT of the foreground job's store; the "       \
     "trainer then pauses at step boundaries while the foreground is slowed (tiderun "    \
     "--foreground)")                                                                     \
  XX(FOREGROUND_TOKEN, STR, "", 0, 0,                                                    \
     "the foreground job's TIDE_JOB_TOKEN, which the background's rank 0 proves to the "   \
     "foreground's store (required with TIDE_FOREGROUND)")                               \
  XX(FOREGROUND_LIST, INT, "0", 0, 1,                                                    \
     "1: a background job under tide sched (tide submit --background): its guard "       \
     "watches the foreground jobs tide sched lists in this job's own store "             \
     "(multiplex/foregrounds), following the list as foregrounds start and end")         \
  XX(HOSTS_BACKGROUND, INT, "0", 0, 1,                                                   \
     "1: this job hosts background jobs (tiderun --hosts-background): its trainer's "     \
     "rank 0 publishes its solo and recent step times in its store, and its waits block " \
     "instead of spinning (unless TIDE_SPIN_US is set)")                                 \
  XX(GUARD_PERCENT, INT, "110", 1, 100000,                                               \
     "a background job pauses while the foreground's recent step time exceeds this "     \
     "percentage of its solo step time, and resumes when it is back under it")

/* XE(id, name...): the names an ENUM parameter allows, in the order of
 * tide__param_enum's index (at most 8). One row per ENUM row above. */
#define TIDE__PARAM_ENUMS(XE)                                                            \
  XE(LOG_LEVEL, "error", "warn", "info", "debug", "trace") /* = TIDE__LOG_* */           \
  XE(ALGO, "auto", "ring", "rd", "hier", "mpi")                                          \
  XE(BACKEND, "auto", "mpi")                                                             \
  XE(BIND, "auto", "core", "numa", "none")                                               \
  XE(STRAGGLER, "off", "report", "remove")                                               \
  XE(SHM_STORES, "auto", "plain", "stream")

enum {
#define XX(id, type, def, min, max, help) TIDE__PARAM_##id,
  TIDE__PARAMS(XX)
#undef XX
      TIDE__PARAM_COUNT
};

/* Values of the table; loads it on first use (tide_params_load). */
int64_t tide__param_int(int id);
/* An ENUM parameter's value as its index in its TIDE__PARAM_ENUMS names
 * (a bad value, refused by tide_params_load, reads as the default). */
int tide__param_enum(int id);
const char *tide__param_str(int id);
/* 1 when the variable was set (non-empty) in the environment. */
int tide__param_is_set(int id);

/* ---- multiplexing (src/core/priority.c) ---------------------------------------- */

/* How long a wait polls before it sleeps: TIDE_SPIN_US when set, else 0 in
 * a background job or a job that hosts one (their waits give the core
 * away), else TIDE_SPIN_US's default. */
int64_t tide__wait_spin_us(void);

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

/* ---- plots (src/core/plot.c) ------------------------------------------------------ */

/* Runs gnuplot on script (a file name in dir, whose relative paths resolve
 * there). 1: drawn; 0: no gnuplot on PATH; TIDE_EIO: it failed (logged). */
int tide__gnuplot(const char *dir, const char *script);

/* ---- HMAC-SHA256 --------------------------------------------------------------- */

void tide__sha256(const void *data, size_t len, uint8_t out[32]);
void tide__hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                       uint8_t out[32]);

/* ---- names (src/core/names.c) ---------------------------------------------------- */

/* The index k of name among names[0..count) (case-insensitive), or
 * TIDE_EINVAL with a message: "unknown <what> '<name>': use a, b or c", or
 * "<fn>: name and out must not be NULL" (out: the caller's out-parameter,
 * only checked). For the tide_*_parse functions. */
int tide__parse_name(const char *fn, const char *what, const char *const *names, int count, const char *name,
                     const void *out);

/* Defines the public pair tide_<obj>_name (names[kind], "?" out of range)
 * and tide_<obj>_parse (tide__parse_name) of an enum with count names. */
#define TIDE__NAMED_ENUM(obj, type, what, names, count)                                  \
  const char *tide_##obj##_name(type kind) {                                             \
    return (unsigned)kind < (unsigned)(count) ? (names)[kind] : "?";                     \
  }                                                                                      \
  int tide_##obj##_parse(const char *name, type *out) {                                  \
    int k = tide__parse_name("tide_" #obj "_parse", what, names, count, name, out);      \
    if (k < 0) return k;                                                                 \
    *out = (type)k;                                                                      \
    return 0;                                                                            \
  }

/* ---- tensor layouts (src/core/tensor.c) ------------------------------------------ */

/* Checks tensors[0..n) as the tensors of one flat buffer of nparams
 * elements: each by tide_tensor_t's rules (ndim 0 to 4, a shape that
 * multiplies to count > 0, inside the buffer), and together: sorted by
 * offset they tile [0, nparams) without gap or overlap. Writes the indices
 * in offset order to order[0..n) (when not NULL). fn names the caller in
 * the message; TIDE_EINVAL names the tensor. n == 0 passes. */
int tide__tensors_check(const char *fn, const tide_tensor_t *tensors, size_t n, size_t nparams, size_t *order);

/* ---- FNV-1a (src/core/hash.c) -------------------------------------------------- */

#define TIDE__FNV1A_BASIS 1469598103934665603ull
#define TIDE__FNV1A_PRIME 1099511628211ull
/* 64-bit FNV-1a of len bytes at data. Not keyed: keep it to tables and
 * checks whose inputs come from the job itself. */
uint64_t tide__fnv1a(const void *data, size_t len);
/* 64-bit FNV-1a of the bytes of s before its NUL. */
uint64_t tide__fnv1a_str(const char *s);

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

/* ---- placement (src/core/place.c) ------------------------------------------ */

enum { TIDE__BIND_NONE = 0, TIDE__BIND_CORE, TIDE__BIND_NUMA };
/* "none", "core", "numa", or "auto" (which means auto_mode). */
int tide__bind_parse(const char *text, int auto_mode, int *mode_out);
const char *tide__bind_name(int mode);
/* The CPUs of each of nranks local ranks under mode, into shares[0..nranks):
 * core gives each a contiguous share of the allowed cores (cores / nranks,
 * shares differing by one core at most; one core each, wrapping, when ranks
 * outnumber cores), never straddling NUMA nodes unless it holds them whole;
 * numa widens each share to its NUMA nodes; none gives every rank all the
 * allowed CPUs. allowed NULL: the calling thread's affinity. synthetic: an
 * hwloc synthetic topology ("package:2 core:4 pu:2") instead of this
 * machine's, for tests (allowed NULL then means all of it). */
int tide__bind_shares(int mode, int nranks, const char *synthetic, const cpu_set_t *allowed,
                      cpu_set_t *shares);
/* "0-3,8" (or "none" when empty), truncated to cap. */
void tide__cpuset_format(const cpu_set_t *set, char *buf, size_t cap);
/* Called by tide_comm_init once the local rank is known: records the local
 * size and, outside tiderun (no TIDE_CPUS), binds the process when TIDE_BIND
 * is core or numa. Failure to bind is a warning. */
void tide__place_self(int local_rank, int local_size);
/* 1 when this rank runs on a share of its own (tiderun bound it, or
 * tide__place_self did). */
int tide__placement_bound(void);
/* This process's CPUs as a key: 0 when it may run on every online CPU,
 * else a hash of its affinity mask (processes of one host with equal keys
 * share their CPUs, as tiderun binds more ranks than cores). */
uint64_t tide__placement_key(void);
/* TIDE_NUM_THREADS when set, else the CPUs this process may run on, divided
 * among the local ranks (local_size; < 1: the recorded or TIDE_LOCAL_SIZE)
 * when it is not bound to a share of its own. At least 1. */
int tide__default_threads(int local_size);

/* The accepting side of the same handshake as steps, for poll loops that
 * must not block on one connection (the store server, a rank accepting
 * its peers): send `hello` at accept, feed what the client sends to
 * tide__auth_server_check, send `answer` when it proves the token. */
#define TIDE__AUTH_HELLO_BYTES 41  /* magic + nonce, each side sends one */
#define TIDE__AUTH_PROOF_BYTES 32
#define TIDE__AUTH_CLIENT_BYTES (TIDE__AUTH_HELLO_BYTES + TIDE__AUTH_PROOF_BYTES)
/* Fills hello with the magic and a fresh nonce. */
int tide__auth_server_hello(uint8_t hello[TIDE__AUTH_HELLO_BYTES]);
/* Checks in[0..len), what the client has sent so far: 0 when more is
 * needed; 1 when its first TIDE__AUTH_CLIENT_BYTES prove the token (answer
 * then holds our proof, to send); as soon as the bytes cannot be right,
 * with *why set (static text), TIDE_EPROTO when they are not a tide
 * handshake, TIDE_EAUTH when they prove another job token. Reads at most
 * TIDE__AUTH_CLIENT_BYTES of in. A client refused with TIDE_EAUTH should
 * be sent TIDE__AUTH_PROOF_BYTES zero bytes before the close, so that it
 * reports a refusal (TIDE_EAUTH) and not a lost peer (TIDE_EPEER). */
int tide__auth_server_check(const uint8_t hello[TIDE__AUTH_HELLO_BYTES], const char *token, const uint8_t *in,
                            size_t len, uint8_t answer[TIDE__AUTH_PROOF_BYTES], const char **why);

#endif
