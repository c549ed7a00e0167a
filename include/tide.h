/* tide: adaptive, communication-efficient distributed training.
 *
 * The whole public API. Every function returns 0 on success or a negative
 * TIDE_E* code (see tide_strerror) unless its comment says otherwise.
 * Out-parameters are written only on success. Objects are opaque handles;
 * destroy/free functions accept NULL.
 */
#ifndef TIDE_H
#define TIDE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "tide/errors.h"
#include "tide/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */

/* Message for a TIDE_E* code; never NULL, static storage. */
const char *tide_strerror(int rc);
/* Name of a TIDE_E* code ("TIDE_EPEER"); never NULL, static storage. */
const char *tide_err_name(int rc);

/* ---- data types and reduction ops --------------------------------------- */

typedef enum {
  TIDE_F32 = 0,
  TIDE_F64,
  TIDE_I32,
  TIDE_I64,
  TIDE_F16, /* IEEE half; reductions go through f32, rounded to nearest even */
  TIDE_BF16,
  TIDE_DTYPE_COUNT
} tide_dtype_t;

typedef enum { TIDE_SUM = 0, TIDE_AVG, TIDE_MIN, TIDE_MAX, TIDE_OP_COUNT } tide_op_t;

/* Bytes per element, or 0 for an unknown dtype. */
size_t tide_dtype_size(tide_dtype_t dtype);
/* "f32", "f64", ...; "?" for an unknown value. */
const char *tide_dtype_name(tide_dtype_t dtype);
/* "sum", "avg", ...; "?" for an unknown value. */
const char *tide_op_name(tide_op_t op);
/* Element i of buf, of type dtype, as a double (the 16-bit floats
 * converted); NaN for a NULL buf or an unknown dtype. */
double tide_element_get(const void *buf, tide_dtype_t dtype, size_t i);
/* Sets element i of buf to value, converted to dtype (rounded to nearest
 * even for f16 and bf16, truncated for the integers). TIDE_EINVAL for a
 * NULL buf or an unknown dtype. */
int tide_element_set(void *buf, tide_dtype_t dtype, size_t i, double value);
/* A fresh job token (TIDE_JOB_TOKEN): 64 hex digits from the system's
 * random source, into token (at least 65 bytes). TIDE_EIO when no random
 * bytes can be read. */
int tide_job_token_create(char *token, size_t cap);
/* A job's id, 16 hex digits into id (at least 17 bytes): derived from
 * token when it is not NULL (every node of a multi-node job computes the
 * same one), else random. */
int tide_job_id(const char *token, char *id, size_t cap);
/* This process's CPUs as a list ("0-3,8"; "?" when unknown, truncated to
 * cap) and *bound: 1 when it runs on a share of its own (tiderun --bind,
 * or TIDE_BIND in tide_comm_init), else 0. TIDE_EINVAL for NULL arguments
 * or cap < 2. */
int tide_process_cpus(char *cpus, size_t cap, int *bound);
/* How a launcher binds its local ranks to CPUs (tiderun --bind, TIDE_BIND). */
typedef enum { TIDE_BIND_NONE = 0, TIDE_BIND_CORE, TIDE_BIND_NUMA } tide_bind_t;
/* "none", "core", "numa", or "auto" (which means auto_mode) into *out;
 * TIDE_EINVAL (nothing logged, nothing written) for another text or NULL. */
int tide_bind_parse(const char *text, tide_bind_t auto_mode, tide_bind_t *out);
/* "none", "core", "numa"; "?" for an unknown value. */
const char *tide_bind_name(tide_bind_t mode);
/* The CPUs of each of nranks local ranks under mode, from this process's
 * affinity and the machine's topology (hwloc): rank r's CPUs are
 * cpus[first[r] .. first[r+1]), ascending; first has nranks + 1 entries.
 * core gives each rank a contiguous share of the cores, never straddling
 * NUMA nodes unless it holds them whole (one core each, wrapping, when ranks
 * outnumber cores); numa widens each share to its NUMA nodes; none gives
 * every rank all the CPUs. TIDE_EINVAL (logged, nothing written) for
 * nranks < 1, NULL arguments or cap too small (nranks * 1024 always
 * suffices); TIDE_EIO when the topology cannot be read. */
int tide_bind_plan(tide_bind_t mode, int nranks, int *cpus, size_t cap, size_t *first);
/* cpus[0..n) (ascending) as "0-3,8", "none" when n is 0, truncated to cap
 * (cap >= 5). */
void tide_cpus_format(const int *cpus, size_t n, char *buf, size_t cap);
/* Splits "HOST:PORT" at its last colon into host (at most host_cap bytes
 * with its NUL) and port (1..65535). TIDE_EINVAL, and nothing written, for
 * another form. */
int tide_host_port_parse(const char *text, char *host, size_t host_cap, int *port);

/* ---- allocator ----------------------------------------------------------- */

/* Replaces the allocator every tide allocation goes through. Call before any
 * other tide function; all four must be given. Not thread-safe. */
int tide_replace_allocator(void *(*malloc_fn)(size_t), void *(*realloc_fn)(void *, size_t),
                           void *(*calloc_fn)(size_t, size_t), void (*free_fn)(void *));
/* Allocate through that allocator (the nn engine, include/tide_nn.h, and
 * any code that hands memory to tide or takes it back). Never NULL for a
 * zero size; tide_calloc returns NULL when count x size overflows. Free
 * with tide_free. Any thread. */
void *tide_malloc(size_t bytes);
void *tide_calloc(size_t count, size_t size);

/* ---- parameters ---------------------------------------------------------- */

/* Prints the table of TIDE_* environment parameters (name, type, default,
 * current value, help) to `out`; markdown when `markdown` is non-zero. */
void tide_params_print(FILE *out, int markdown);
/* Reads and validates every TIDE_* variable once. A bad value returns
 * TIDE_EINVAL and logs which variable and why. Called by tide_comm_init. */
int tide_params_load(void);
/* The value of the parameter `name` ("TIDE_TIMEOUT_MS"), as the table holds
 * it: the environment's when set and valid, else the default. *text (may be
 * NULL) gets its text, which lives as long as the process; *value (may be
 * NULL, not both) gets an INT parameter's value or an ENUM parameter's index
 * among its allowed names (TIDE_BIND: 0 auto, 1 core, 2 numa, 3 none).
 * TIDE_EINVAL (logged) for an unknown name, or a value asked of a string
 * parameter. Loads the table on first use (tide_params_load). Any thread. */
int tide_param_get(const char *name, const char **text, int64_t *value);

/* ---- clock, logging ------------------------------------------------------ */

/* Monotonic nanoseconds (CLOCK_MONOTONIC). */
int64_t tide_now_ns(void);
/* The tide_now_ns instant ms milliseconds from now; INT64_MAX when ms < 0. */
int64_t tide_deadline_after_ms(int64_t ms);
/* One line in tide's log format ("host:pid rank time tide info: ...") to
 * stderr or TIDE_LOG_FILE, when TIDE_LOG_LEVEL is info or more. */
void tide_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same at level error (always printed unless the thread is muted):
 * where a failure starts, once, naming the argument and what to do. */
void tide_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- background jobs (docs/elastic.md, "Multiplexing") ------------------- */

/* Makes this process a background job's: every thread it has now, and
 * those it starts later, run at the lowest CPU priority the kernel allows
 * (SCHED_IDLE: they run only on a core nothing else wants; where SCHED_IDLE
 * is refused, nice 19, with one warning). tide_comm_init calls it when
 * TIDE_BACKGROUND=1 (tiderun --background). *policy (may be NULL) gets
 * "idle" or "nice19". Returns 0, or TIDE_ENOSYS when neither could be set.
 * Any thread; the first call does the work, later ones return its result. */
int tide_background_enter(const char **policy);

/* ---- rendezvous store ---------------------------------------------------- */

/* A key-value server for rendezvous and membership. Every connection must
 * prove the job token (HMAC-SHA256 challenge-response) before any request is
 * served; a connection that fails is closed and logged. It runs its own
 * thread; start/stop from one thread. */
typedef struct tide_store_server tide_store_server_t;

/* Listens on bind_host:port (port 0 picks a free port; bind_host NULL means
 * all interfaces). token is the job secret (non-empty). */
int tide_store_server_start(const char *bind_host, int port, const char *token,
                            tide_store_server_t **out);
/* The port it listens on. */
int tide_store_server_port(const tide_store_server_t *server);
/* Stops the thread, closes every connection and frees the server. */
void tide_store_server_stop(tide_store_server_t *server);

/* A client connection. Calls on one store handle are serialised internally,
 * so any thread may call; blocking calls honour their deadline. */
typedef struct tide_store tide_store_t;

/* Connects to host:port, retrying until timeout_ms passes (the server may
 * not be up yet), and authenticates with token. */
int tide_store_connect(const char *host, int port, const char *token, int timeout_ms,
                       tide_store_t **out);
void tide_store_close(tide_store_t *store);
int tide_store_set(tide_store_t *store, const char *key, const void *value, size_t len);
/* Waits until key exists (up to timeout_ms) and returns a copy of its value
 * in *value (free with tide_free) and its length in *len. TIDE_ETIMEDOUT when
 * the key does not appear in time. */
int tide_store_get(tide_store_t *store, const char *key, int timeout_ms, void **value,
                   size_t *len);
/* Waits until every key of keys[0..n) exists, up to timeout_ms. */
int tide_store_wait(tide_store_t *store, const char *const *keys, size_t n, int timeout_ms);
/* Atomically adds delta to the 64-bit integer at key (missing = 0) and
 * writes the new value to *result. */
int tide_store_add(tide_store_t *store, const char *key, int64_t delta, int64_t *result);
/* Deletes key; TIDE_ENOENT if it did not exist. */
int tide_store_delete(tide_store_t *store, const char *key);

/* Frees memory tide handed to the caller (tide_store_get values). */
void tide_free(void *ptr);

/* ---- communicator -------------------------------------------------------- */

/* The ranks of one job and the connections between them. A communicator's
 * calls are made from one thread at a time (any thread); nonblocking calls
 * run on the communicator's own progress thread. Errors, per code:
 *   TIDE_EINVAL     a bad argument, found on this rank before anything is
 *                   sent: only this call fails, on this rank only; the
 *                   communicator stays usable. If the other ranks made the
 *                   call, this rank's next collective meets theirs as a
 *                   TIDE_EMISMATCH (collective #n+1 against #n) on every
 *                   rank, and the ranks agree again after it.
 *   TIDE_EMISMATCH  the ranks' calls differ (kind, count, dtype, op, root,
 *                   tensor boundaries, collective number, algorithm
 *                   settings): found on every rank before any payload
 *                   moves, returned on every rank with the same message
 *                   naming rank 0's call and the first call that differs;
 *                   the communicator stays usable and the next collective
 *                   works.
 *   TIDE_EPEER, TIDE_ETIMEDOUT, TIDE_EABORTED, TIDE_EPROTO (a dead or
 *                   departed peer, a deadline passed, an abort, a corrupt
 *                   frame) are fatal: every later call returns that same
 *                   code, and the only thing left to do is
 *                   tide_comm_destroy (elastic jobs rebuild membership). */
typedef struct tide_comm tide_comm_t;

/* Joins the job the environment describes: TIDE_RANK/TIDE_SIZE (set by
 * tiderun), or OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS
 * plus TIDE_RDZV=host:port; TIDE_SIZE=1 or no launcher at all makes a
 * one-rank job. Connects to every peer (shared memory on the same host, TCP
 * across hosts). Collective over the whole job. */
int tide_comm_init(tide_comm_t **out);
/* Joins through MPI instead of the store: mpi_comm points to an MPI_Comm
 * (so this header needs no mpi.h), e.g. `MPI_Comm c = MPI_COMM_WORLD;
 * tide_comm_init_from_mpi(&c, &comm)`. Collective over that communicator;
 * tide duplicates it (MPI_Comm_dup), so its traffic never matches the
 * caller's, and the caller may free its own at once. MPI must be initialised,
 * with MPI_THREAD_MULTIPLE (with less, tide serialises its own MPI calls and
 * the application must not call MPI while a tide call runs). Ranks, hosts
 * (MPI_COMM_TYPE_SHARED, or TIDE_HOST_ID), errors and mismatch detection are
 * those of tide_comm_init; a dead process is left to MPI (mpirun aborts the
 * job). TIDE_ESTATE when MPI is not initialised, TIDE_ENOSYS when tide was
 * built without MPI. tide_comm_init does the same on MPI_COMM_WORLD under
 * TIDE_BACKEND=mpi, calling MPI_Init_thread first if nobody has (and then
 * MPI_Finalize when its last communicator is destroyed). */
int tide_comm_init_from_mpi(const void *mpi_comm, tide_comm_t **out);
/* 1 when this tide was built with MPI (tide_comm_init_from_mpi and
 * TIDE_BACKEND=mpi work), else 0. Any thread. */
int tide_mpi_built(void);
/* Closes connections and frees the communicator (and its local/cross
 * sub-communicators). Not collective: never blocks on peers. */
void tide_comm_destroy(tide_comm_t *comm);

int tide_comm_rank(const tide_comm_t *comm);
int tide_comm_size(const tide_comm_t *comm);
/* Rank among the ranks on this host, and how many share this host. */
int tide_comm_local_rank(const tide_comm_t *comm);
int tide_comm_local_size(const tide_comm_t *comm);
/* The default number of compute threads (BLAS, top-k selectors) for this
 * rank, into *threads_out: TIDE_NUM_THREADS when set; otherwise the CPUs
 * this process may run on (sched_getaffinity) when it runs on a share of its
 * own (tiderun --bind core|numa, or TIDE_BIND under mpirun/srun), or those
 * CPUs divided among the local ranks (comm's local size; comm NULL: the size
 * tide_comm_init recorded, else TIDE_LOCAL_SIZE) when unbound. At least 1.
 * TIDE_EINVAL for a NULL threads_out or a bad TIDE_* variable (logged). Any
 * thread. */
int tide_compute_threads(const tide_comm_t *comm, int *threads_out);
/* Index of this host among the job's hosts (in order of lowest rank), and
 * how many hosts there are. */
int tide_comm_node(const tide_comm_t *comm);
int tide_comm_node_count(const tide_comm_t *comm);
/* The message of the fatal failure of this communicator or, while it has
 * not failed, of its last recoverable error (TIDE_EINVAL, TIDE_EMISMATCH);
 * "" if none. It names the ranks involved, e.g. both calls of a mismatch. */
const char *tide_comm_last_error(const tide_comm_t *comm);

/* Collective. Ranks with the same color form a new communicator, ordered by
 * (key, rank). color < 0 takes no part: *out is set to NULL. */
int tide_comm_split(tide_comm_t *comm, int color, int key, tide_comm_t **out);
/* The ranks on this host (intra-host), and the ranks with this local rank on
 * every host (inter-host). Owned by comm; created on first call, which is
 * collective over comm. */
int tide_comm_local(tide_comm_t *comm, tide_comm_t **out);
int tide_comm_cross(tide_comm_t *comm, tide_comm_t **out);

/* ---- elastic membership (docs/elastic.md) ---------------------------------- */

/* In an elastic job (TIDE_ELASTIC=1, set by tiderun --elastic) the members
 * are a numbered epoch in the job's store: tide_comm_init's communicator is
 * epoch 0, and each change starts the next epoch with a new communicator.
 * Under mpirun or srun (TIDE_BACKEND=mpi) a job is not elastic. */

/* comm's membership epoch; -1 (not an error) when the job is not elastic. */
long tide_comm_epoch(const tide_comm_t *comm);
/* 1 when this process joined a running job (TIDE_ELASTIC_JOIN=1) into
 * comm's epoch and must receive the training state from the others
 * (tide_trainer_elastic does), else 0. */
int tide_comm_joined(const tide_comm_t *comm);
/* Starts the next membership epoch. Collective over the members of comm's
 * epoch that are still alive; comm may have failed (TIDE_EPEER). The first
 * to arrive waits until every member has arrived or is known dead (its
 * store connection dropped; one that does neither within
 * TIDE_ELASTIC_TIMEOUT_MS is left out) and writes the new members: those
 * that arrived, in rank order, without rank `exclude` (-1: none), at most
 * `size` of them (0: no limit), then workers waiting to join up to `size`
 * (0: up to TIDE_ELASTIC_MAX). *out is the new communicator (ranks
 * renumbered), or NULL when this rank is not a member (it should leave the
 * job). comm is not destroyed. TIDE_EPEER when fewer than TIDE_ELASTIC_MIN
 * remain; TIDE_ESTATE when comm is not elastic or is stale (the job went on
 * to a newer epoch without this rank); TIDE_EINVAL for a bad size or
 * exclude. */
int tide_comm_resize(tide_comm_t *comm, int size, int exclude, tide_comm_t **out);
/* The job's pending requests: *target, the number of workers asked for
 * (tide_elastic_request; 0: none), and *waiting, workers waiting to join.
 * Both 0 outside elastic jobs. Reads the store: any member, any time. */
int tide_comm_elastic_status(tide_comm_t *comm, int *target, int *waiting);
/* A member's tide_elastic_request: asks the job for `size` workers (0
 * withdraws the request); the members act at their next step boundary and
 * tiderun --elastic starts or stops workers. A policy's world_size reaches
 * the job this way (rank 0 of the trainer calls it). TIDE_ESTATE outside
 * elastic jobs; TIDE_EINVAL for a negative size. */
int tide_comm_elastic_request(tide_comm_t *comm, int size);
/* Marks the job finished, so that workers still waiting to join give up
 * (tide_comm_init returns TIDE_ESTATE for them). No-op outside elastic jobs. */
int tide_comm_elastic_finish(tide_comm_t *comm);
/* Writes value (a string) under key in the job's store, the one tiderun or
 * the scheduler started, for programs outside the job to read (a Pollux
 * agent's TIDE_SCHED_HINTS_KEY). TIDE_ESTATE when comm has no store (MPI,
 * one process started without tiderun); TIDE_EINVAL for an empty key or a
 * NULL value. Any member; one thread at a time per comm. */
int tide_comm_publish(tide_comm_t *comm, const char *key, const char *value);
/* Asks a running elastic job for `size` workers (0 withdraws the request)
 * through a connection to its store (tide ctl does this). The members act
 * at their next step boundary; the launcher starts or stops workers. */
int tide_elastic_request(tide_store_t *store, int size);
/* An elastic job's state as its store holds it, decoded once (the store's
 * key schema is comm's business: tide ctl status, tiderun and the members
 * all read it through this). */
typedef struct {
  long epoch;     /* the newest sealed membership epoch; -1 before any (no elastic job yet) */
  int members;    /* members of that epoch; -1 for epoch 0 or none (the first members are not
                     listed: the launcher knows how many it started) */
  int failed;     /* 1 when that epoch cannot start (too few workers remain; the job ends) */
  int target;     /* workers asked for (tide_elastic_request); -1 when never asked, 0 withdrawn */
  long joiners;   /* workers that ever asked to join */
  long admitted;  /* of those, the ones a change has admitted or skipped */
  int waiting;    /* joiners - admitted: workers waiting to join now */
  int done;       /* 1 when the workers said training is over (waiting joiners give up) */
} tide_elastic_status_t;
/* Reads an elastic job's state from a connection to its store (any client,
 * any time; it only reads: an absent counter reads as 0). *out is written
 * only on success; an unreachable store's error is returned. */
int tide_elastic_status(tide_store_t *store, tide_elastic_status_t *out);

/* ---- collectives (blocking) --------------------------------------------- */

/* Every rank must make the same sequence of collective calls with the same
 * op, dtype, count and root. A call that differs from its peers' fails with
 * TIDE_EMISMATCH on every participant, before any data moves, and leaves
 * the communicator usable; tide_comm_last_error names the ranks and both
 * calls. A bad argument fails with TIDE_EINVAL on its rank alone (see the
 * communicator's error codes above). sendbuf == recvbuf means in place.
 * count 0 is valid; a count whose bytes (allgather: count * size,
 * allgatherv: the sum of counts) pass PTRDIFF_MAX is TIDE_EINVAL. A NULL
 * comm is TIDE_EINVAL (and logged). */
int tide_barrier(tide_comm_t *comm);
int tide_broadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root);
int tide_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                   tide_dtype_t dtype, tide_op_t op);
/* Reduces count elements over all ranks; rank r receives block r of the
 * result, as tide_block() splits count (recvbuf holds that many elements).
 * In place when sendbuf == recvbuf: the block is written at recvbuf's
 * start. */
int tide_reduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                        tide_dtype_t dtype, tide_op_t op);
/* recvbuf holds size * count elements, rank r's at r * count. In place when
 * sendbuf == recvbuf + rank * count elements. */
int tide_allgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                   tide_dtype_t dtype);
/* Rank r contributes counts[r] elements; recvbuf receives them back to back
 * (rank r's at the sum of counts[0..r)). sendcount must equal counts[rank]. */
int tide_allgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                    const size_t *counts, tide_dtype_t dtype);

/* The block of `count` elements that `rank` of `size` owns in a
 * reduce-scatter: the first count % size ranks get one element more. With
 * size < 1, rank outside [0, size) or a NULL output it logs an error and
 * writes an empty block (offset 0, len 0) to the outputs given. */
void tide_block(size_t count, int size, int rank, size_t *offset, size_t *len);

/* ---- collectives (nonblocking) ------------------------------------------ */

/* A nonblocking call borrows its buffers until its request completes and
 * runs on the communicator's progress thread in call order (or, when
 * tide_wait comes first, in the waiting thread). Blocking calls
 * made afterwards wait for earlier nonblocking ones. req must not be NULL
 * (TIDE_EINVAL; the communicator stays usable). */
typedef struct tide_request tide_request_t;

int tide_ibarrier(tide_comm_t *comm, tide_request_t **req);
int tide_ibroadcast(tide_comm_t *comm, void *buf, size_t count, tide_dtype_t dtype, int root,
                    tide_request_t **req);
int tide_iallreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tide_dtype_t dtype, tide_op_t op, tide_request_t **req);
int tide_ireduce_scatter(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                         tide_dtype_t dtype, tide_op_t op, tide_request_t **req);
int tide_iallgather(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                    tide_dtype_t dtype, tide_request_t **req);
/* counts is copied: the caller may reuse it at once. */
int tide_iallgatherv(tide_comm_t *comm, const void *sendbuf, size_t sendcount, void *recvbuf,
                     const size_t *counts, tide_dtype_t dtype, tide_request_t **req);
/* Waits for the request, frees it and returns its result. */
int tide_wait(tide_request_t *req);
/* *done = 1 when the request has completed (then tide_wait returns at
 * once); never frees the request. */
int tide_test(tide_request_t *req, int *done);

/* ---- distributed sampler -------------------------------------------------- */

/* Splits the indices [0, n) of a data set between the ranks, anew each
 * epoch: a permutation drawn from (seed, epoch), identical on every rank,
 * dealt round-robin, so the shards are disjoint, cover every sample exactly
 * once per epoch and differ in size by at most one. Pure computation; one
 * thread at a time per sampler. */
typedef struct tide_sampler tide_sampler_t;

/* Holds n indices (8 bytes each): an n whose bytes pass PTRDIFF_MAX is
 * TIDE_EINVAL. */
int tide_sampler_create(uint64_t n, uint64_t seed, int rank, int size, tide_sampler_t **out);
/* Draws the shard of `epoch`; then tide_sampler_indices gives it. */
int tide_sampler_set_epoch(tide_sampler_t *sampler, uint64_t epoch);
/* This rank's indices for the current epoch (owned by the sampler, valid
 * until the next set_epoch) and their number in *count. */
const uint64_t *tide_sampler_indices(const tide_sampler_t *sampler, size_t *count);
/* The whole epoch's order: a permutation of [0, n), identical on every rank
 * (owned by the sampler, valid until the next set_epoch). Consumers that
 * deal it themselves (the trainer: each step takes the next global batch of
 * positions and splits it between the ranks) survive changes of batch size
 * and membership mid-epoch: positions are global, so every sample is used
 * once per epoch whatever happens between steps. n in *count. */
const uint64_t *tide_sampler_order(const tide_sampler_t *sampler, uint64_t *count);
/* The largest shard of any rank: ranks that run the same number of steps
 * per epoch use it (the smaller shards end one sample early). */
size_t tide_sampler_max_count(const tide_sampler_t *sampler);
void tide_sampler_destroy(tide_sampler_t *sampler);

/* ---- optimizers and learning-rate schedules ---- */

/* Optimizers update a flat float32 parameter buffer in place from a gradient
 * buffer of the same length; they do no communication (all-reduce the
 * gradients first) and no I/O. One tide_optim_t is called from one thread at
 * a time; distinct optimizers share nothing. Semantics follow torch.optim
 * where torch has the optimizer; LARS and LAMB follow their papers (You et al.
 * 2017, 2020) with the usual exclusions and zero-norm guards. */

/* One tensor of a flat parameter buffer: elements [offset, offset + count).
 * LARS and LAMB compute their trust ratio per tensor; exclude_1d uses ndim
 * and name to find biases and norm scales. shape[0..ndim) must multiply to
 * count; ndim 0 is a scalar. name may be NULL. */
typedef struct {
  const char *name;
  size_t offset;
  size_t count;
  int ndim;
  int shape[4];
} tide_tensor_t;

typedef enum {
  TIDE_OPTIM_SGD = 0, /* w -= lr * (g + wd*w) */
  TIDE_OPTIM_MOMENTUM, /* torch SGD(momentum, dampening=0) */
  TIDE_OPTIM_NESTEROV, /* torch SGD(momentum, dampening=0, nesterov=True) */
  TIDE_OPTIM_ADAM,     /* torch Adam: weight decay is L2 added to the gradient */
  TIDE_OPTIM_ADAMW,    /* torch AdamW: decoupled decay w -= lr*wd*w */
  TIDE_OPTIM_LARS,     /* You et al. 2017: per-tensor local LR, LR inside the momentum */
  TIDE_OPTIM_LAMB,     /* You et al. 2020: Adam direction scaled by a per-tensor trust ratio */
  TIDE_OPTIM_KIND_COUNT
} tide_optim_kind_t;
/* Per tensor, with wd = weight_decay, both without exclusion:
 * LARS: local = trust_coef*|w| / (|g| + wd*|w| + eps), 1 when |w| = 0 or
 *       |g| + wd*|w| = 0; v = momentum*v + lr*local*(g + wd*w); w -= v.
 * LAMB: u = m_hat/(sqrt(v_hat) + eps) + wd*w with Adam's bias-corrected
 *       moments; w -= lr * |w|/|u| * u, ratio 1 when |w| = 0 or |u| = 0.
 * Norms are accumulated in double. */

/* Hyperparameters; start from tide_optim_config_default. Each kind reads
 * only the fields listed for it and ignores the rest. */
typedef struct {
  tide_optim_kind_t kind;
  float momentum;     /* momentum, nesterov: [0,1), default 0.9 (>0 for nesterov);
                         lars: [0,1), 0.9; sgd: must be 0 */
  float beta1, beta2; /* adam, adamw, lamb: [0,1), 0.9 and 0.999 */
  float eps;          /* adam, adamw: > 0, 1e-8; lamb: > 0, 1e-6;
                         lars: >= 0, added to the trust-ratio denominator, 1e-5 */
  float weight_decay; /* >= 0. sgd, momentum, nesterov, adam: L2 added to the gradient (0);
                         adamw: decoupled (0.01); lamb: decoupled, inside the trust ratio (0.01);
                         lars: beta, in the local LR and in the update (0) */
  float trust_coef;   /* lars: eta, > 0, default 0.001 */
  int exclude_1d;     /* 0 or 1. 1: tensors with ndim <= 1 or a name ending in "bias" get
                         no weight decay and no trust ratio (1 for lars and lamb, else 0) */
} tide_optim_config_t;

/* An optimizer and its state (momentum or moments, step count). */
typedef struct tide_optim tide_optim_t;

/* Writes the defaults of `kind` (the papers', torch's where they are
 * silent) to *out. An unknown kind gives a config that tide_optim_create rejects. */
void tide_optim_config_default(tide_optim_kind_t kind, tide_optim_config_t *out);
/* Checks every field `config->kind` reads; TIDE_EINVAL and a log line
 * naming the field and its allowed range otherwise. */
int tide_optim_config_check(const tide_optim_config_t *config);

/* Creates an optimizer for a buffer of nparams floats. tensors[0..ntensors)
 * are copied (names too): they must tile [0, nparams) without gap or overlap,
 * in any order; TIDE_EINVAL names the offending tensor. ntensors 0 (tensors
 * may be NULL) treats the buffer as one multi-dimensional tensor. All state
 * is allocated here (zeroed, step count 0); free with tide_optim_destroy. */
int tide_optim_create(const tide_optim_config_t *config, const tide_tensor_t *tensors,
                      size_t ntensors, size_t nparams, tide_optim_t **out);
/* Applies one step with learning rate lr (>= 0, finite) to params[0..nparams)
 * in place, reading grads[0..nparams); the two must not overlap. Allocates
 * nothing. Non-finite gradients propagate into params, as in torch. */
int tide_optim_step(tide_optim_t *opt, float *params, const float *grads, float lr);
/* A shard of an optimizer, for data-parallel ranks that each update a part
 * of the model and all-gather the parameters (the parallel tensor
 * operation, ZeRO stage 1): it keeps state for its elements alone. */
typedef struct {
  size_t offset, count; /* this shard's elements [offset, offset + count) of the model */
  /* LARS, LAMB: sums values[0..count) in place over every shard of the
   * model (an allreduce of doubles over the ranks), giving each tensor's
   * norms whichever shards hold it. Every shard calls it once per step with
   * the same count (2 per tensor), so it may be collective. May be NULL
   * for the other kinds, or when the shard is the whole model. Returns 0 or
   * a TIDE_E* code, which the step returns. */
  int (*sum)(double *values, size_t count, void *arg);
  void *arg;
} tide_optim_shard_t;
/* As tide_optim_create, for the shard's elements only: tensors still tile
 * the whole model's [0, nparams) (a tensor may be cut by the shard's
 * ends), and the state is allocated for shard->count elements. Its
 * tide_optim_step reads and writes params[0..count) and grads[0..count):
 * pass pointers to the shard's slice. The element-wise kinds give the bits
 * the whole model's optimizer gives on that slice; LARS and LAMB sum their
 * per-tensor norms in another order (partial sums over the pieces), so
 * their trust ratios may differ in the last bits of a double. TIDE_EINVAL
 * for a shard outside [0, nparams) or LARS/LAMB without sum on a part. */
int tide_optim_create_shard(const tide_optim_config_t *config, const tide_tensor_t *tensors, size_t ntensors,
                            size_t nparams, const tide_optim_shard_t *shard, tide_optim_t **out);
/* Number of steps applied so far (restored by tide_optim_state_set). */
int64_t tide_optim_step_count(const tide_optim_t *opt);

/* The state as bytes, for checkpoints and for broadcasting to ranks that
 * join an elastic job: a header (kind, nparams, step count) then the float
 * buffers, in host byte order. The size is a multiple of 4 bytes. */
size_t tide_optim_state_size(const tide_optim_t *opt);
/* Copies the state into buf (len >= tide_optim_state_size). */
int tide_optim_state_get(const tide_optim_t *opt, void *buf, size_t len);
/* Replaces the state with one from tide_optim_state_get of an optimizer of
 * the same kind and nparams; TIDE_EINVAL (state unchanged) otherwise. */
int tide_optim_state_set(tide_optim_t *opt, const void *buf, size_t len);
/* The state blob is the whole model's for a shard too: the header, then
 * *nbuffers buffers of nparams floats from byte *first. A shard writes its
 * slice [*offset, *offset + *count) of each buffer and zeroes the rest;
 * gathering every shard's slices (tide_allgatherv in place, once per
 * buffer) gives the blob the whole model's optimizer writes, and a shard
 * restores its slice from such a blob, so a saved state re-shards on
 * restore (any number of shards, or none). The state a shard keeps is
 * *nbuffers x *count floats. Outputs may be NULL. */
int tide_optim_state_layout(const tide_optim_t *opt, size_t *first, int *nbuffers, size_t *offset, size_t *count);
void tide_optim_destroy(tide_optim_t *opt);

/* "sgd", "momentum", "nesterov", "adam", "adamw", "lars", "lamb"; "?" for
 * an unknown value. Static storage. */
const char *tide_optim_name(tide_optim_kind_t kind);
/* The kind named `name` (case-insensitive); TIDE_EINVAL for another name. */
int tide_optim_parse(const char *name, tide_optim_kind_t *out);

typedef enum {
  TIDE_LR_CONSTANT = 0, /* base_lr */
  TIDE_LR_STEP,         /* base_lr * gamma^floor(step / step_size) (torch StepLR) */
  TIDE_LR_COSINE,       /* final_lr + (base_lr - final_lr) * (1 + cos(pi * p)) / 2 */
  TIDE_LR_POLY,         /* final_lr + (base_lr - final_lr) * (1 - p)^power (LARS paper: 2) */
  TIDE_LR_KIND_COUNT
} tide_lr_kind_t;

/* A learning rate as a function of the step (or of progress counted in
 * base-batch steps). Zero-initialise, then set what the kind uses. During
 * warm-up (step < warmup_steps) the rate rises linearly from
 * base_lr * warmup_start_factor at step 0 to base_lr at warmup_steps, as
 * torch LinearLR. Cosine and poly decay over p = (step - warmup_steps) /
 * (total_steps - warmup_steps), clamped to [0, 1]; step counts from step 0. */
typedef struct {
  tide_lr_kind_t kind;
  float base_lr;             /* >= 0 */
  long warmup_steps;         /* >= 0 */
  float warmup_start_factor; /* [0, 1] */
  long total_steps;          /* cosine, poly: > warmup_steps */
  long step_size;            /* step: > 0 */
  float gamma;               /* step: (0, 1] */
  float power;               /* poly: > 0 */
  float final_lr;            /* cosine, poly: [0, base_lr] */
} tide_lr_schedule_t;

/* Checks the fields `s->kind` uses; TIDE_EINVAL and a log line naming the
 * field otherwise. */
int tide_lr_check(const tide_lr_schedule_t *s);
/* The schedule of a training `epochs` epochs long (of progress, counted in
 * base-batch steps) over dataset_size samples at global batch base_batch, as
 * tide-train and the Python Trainer use it: per_epoch = ceil(dataset_size /
 * base_batch) steps; warm-up over floor(warmup_epochs * per_epoch) steps
 * from 0; total_steps = ceil(epochs * per_epoch); step: x0.1 every
 * max(1, floor(epochs / 3)) epochs; poly: power 1; cosine and poly decay to
 * final_lr. *out is written only on success; TIDE_EINVAL names the argument
 * (a warm-up not shorter than the training for cosine and poly, a
 * non-positive size or batch, a rate tide_lr_check refuses). */
int tide_lr_schedule_from_epochs(tide_lr_kind_t kind, float base_lr, float final_lr, double epochs,
                                 double warmup_epochs, size_t dataset_size, long base_batch,
                                 tide_lr_schedule_t *out);
/* The rate at `step` (>= 0); NaN when the schedule fails tide_lr_check or
 * step < 0 (logs nothing: call tide_lr_check once up front). Pure. */
float tide_lr_at(const tide_lr_schedule_t *s, long step);
/* "constant", "step", "cosine", "poly"; "?" for an unknown value. */
const char *tide_lr_name(tide_lr_kind_t kind);
/* The kind named `name` (case-insensitive); TIDE_EINVAL for another name. */
int tide_lr_parse(const char *name, tide_lr_kind_t *out);

/* ---- gradient compression: top-k selection and error feedback ---- */

/* Selectors of k (value, index) pairs out of x[0..d) by magnitude |x|. Every
 * selector returns exactly k pairs, indices strictly ascending, values equal
 * to x at those indices. Ties in |x| go to the lower index; -0 and +0 are
 * equal. Indices are uint32_t, so d must be below 2^32 (TIDE_EINVAL
 * otherwise: select over shards). A NaN or Inf anywhere in x is TIDE_EINVAL,
 * logged with the tensor's name and the first bad index; nothing is written.
 * Pure computation: the selectors use up to TIDE_NUM_THREADS threads of their
 * own per call (only for large d), allocate scratch through tide's
 * allocator, and may be called from any number of threads at once. Each
 * calling thread keeps its scratch (about 10 bytes per element above the
 * final threshold, freed at once beyond 256 MB) for its next call, so that
 * repeated selections do not fault in fresh pages; it is freed when the
 * thread exits. */
typedef enum {
  /* Exact top k: radix selection on the magnitude bits (a histogram pass, a
   * collection pass, then the few candidates). */
  TIDE_TOPK_EXACT = 0,
  /* MSTopK (Shi et al., MLSys 2021): `rounds` bisection probes of a
   * threshold between mean|x| and max|x|; then every |x| >= t1 (the lowest
   * probe counting <= k) plus one contiguous run, in index order at a
   * seeded random offset, of the band t2 <= |x| < t1 (t2: the highest probe
   * counting > k). When no probe counts <= k the band is |x| >= t2; when
   * none counts > k it is |x| < t1. Approximate only inside the band, whose
   * width is (max - mean) / 2^rounds. Same result for any thread count. */
  TIDE_TOPK_MSTOPK,
  /* k distinct indices drawn uniformly from the seed (no scaling). */
  TIDE_TOPK_RANDOMK,
  /* The fast one, and exact: a threshold from a stratified sample of <= 2^14
   * elements, one pass collecting every |x| above it (its count corrects the
   * sample), then exact selection among those few. Falls back to
   * TIDE_TOPK_EXACT when the sample's cut leaves fewer than k (the result is
   * the same; it only costs passes). The selector to train with. */
  TIDE_TOPK_SAMPLED,
  TIDE_TOPK_KIND_COUNT
} tide_topk_kind_t;

/* Options; zero-initialise for the defaults. */
typedef struct {
  uint64_t seed;     /* random-k's draw, MSTopK's padding offset (default 0) */
  int mstopk_rounds; /* MSTopK's N, 1..64; 0 = 20 */
  int num_threads;   /* > 0 overrides TIDE_NUM_THREADS (default: the rank's CPUs,
                        as tide_compute_threads(NULL, ...)) */
} tide_topk_opts_t;

/* What one selection did; written only on success. */
typedef struct {
  float threshold;      /* smallest |value| selected (0 when k = 0) */
  float t1, t2;         /* MSTopK's final bracket, t1 = +Inf when no probe counted
                           <= k (0 for the other kinds) */
  uint32_t full_passes; /* times all of x was read */
  uint64_t candidates;  /* elements kept for the final selection after those passes */
  int fallback;         /* sampled: 1 when its cut missed and exact selection ran */
  int threads;          /* threads used */
} tide_topk_stats_t;

/* Selects k of x[0..d) into values[0..k) and indices[0..k) (caller-owned; x
 * is only read). name names the tensor in error messages (NULL: "tensor").
 * k <= d < 2^32; k = 0 writes nothing but still checks x. stats may be NULL.
 * Default options: seed 0, 20 MSTopK rounds, TIDE_NUM_THREADS threads. */
int tide_topk_select(tide_topk_kind_t kind, const float *x, size_t d, size_t k, const char *name,
                     float *values, uint32_t *indices, tide_topk_stats_t *stats_or_null);
/* The same with explicit options (opts NULL = defaults). */
int tide_topk_select_opts(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const float *x,
                          size_t d, size_t k, const char *name, float *values,
                          uint32_t *indices, tide_topk_stats_t *stats_or_null);
/* k for a density: ceil(density * count), within [0, count]; a product within
 * 1e-9 relative of an integer counts as that integer (0.07 of 100 is 7).
 * density outside [0, 1] or not finite gives 0. */
size_t tide_topk_count(double density, size_t count);
/* "exact", "mstopk", "randomk", "sampled"; "?" for an unknown value. */
const char *tide_topk_name(tide_topk_kind_t kind);
/* The kind named `name` (case-insensitive); TIDE_EINVAL for another name. */
int tide_topk_parse(const char *name, tide_topk_kind_t *out);

/* Error feedback (Seide et al. 2014, Stich et al. 2018, as in DGC): a
 * compressor owns a residual per element of a flat float buffer, zeroed at
 * creation. Each compress computes acc = grad + residual (one float add per
 * element), selects k pairs of acc and keeps the rest: residual = acc with
 * the selected entries zeroed. So for every element,
 * selected + residual_after == grad + residual_before exactly, in float.
 * One thread at a time per compressor; compressors share nothing. */
typedef struct tide_compressor tide_compressor_t;

typedef enum {
  /* One selection per tensor, k_i = tide_topk_count(density, count_i): every
   * tensor sends its share (DGC's per-layer selection). */
  TIDE_TOPK_PER_TENSOR = 0,
  /* One selection over the whole flat buffer, k = tide_topk_count(density, d):
   * the most |grad| mass per pair sent, one call (fastest), and what
   * HiTopKComm does on its shard. The trainer's default. */
  TIDE_TOPK_GLOBAL
} tide_topk_scope_t;

/* Creates a compressor for a flat buffer of d floats (0 < d < 2^32) with
 * 0 < density <= 1. tensors[0..ntensors) are copied (names too) and must
 * tile [0, d) without gap or overlap, in any order; ntensors 0 (tensors may
 * be NULL) makes the buffer one tensor. Under TIDE_TOPK_GLOBAL the tensors
 * only name the element of a NaN/Inf in messages. opts may be NULL; the
 * seed advances with every compress, so random-k and MSTopK draw anew each
 * step (and repeat after tide_compressor_reset). Holds 2*d floats. */
int tide_compressor_create(tide_topk_kind_t kind, double density, tide_topk_scope_t scope,
                           const tide_tensor_t *tensors, size_t ntensors, size_t d,
                           const tide_topk_opts_t *opts, tide_compressor_t **out);
/* Elements of the buffer the compressor was created for (d). */
size_t tide_compressor_size(const tide_compressor_t *c);
/* Pairs every compress writes: the sum of the tensors' k (or the global k). */
size_t tide_compressor_k(const tide_compressor_t *c);
/* Changes the density from the next compress on (density warm-up); the
 * residual is kept. */
int tide_compressor_set_density(tide_compressor_t *c, double density);
/* One step: grad[0..d) (d as created) is read; values and indices must hold
 * tide_compressor_k(c) entries and receive the selected pairs of
 * grad + residual, indices into the flat buffer, ascending; *k_out = their
 * number (always tide_compressor_k(c)). A NaN or Inf in grad + residual is
 * TIDE_EINVAL naming the tensor and the element; the residual is then left
 * as it was, so the caller may skip the step (as loss scaling does). */
int tide_compressor_compress(tide_compressor_t *c, const float *grad, size_t d, float *values,
                             uint32_t *indices, size_t *k_out);
/* The residual, d floats, owned by the compressor; valid until the next
 * compress, reset or destroy. */
const float *tide_compressor_residual(const tide_compressor_t *c);
/* Replaces the residual with residual[0..d) (d as created), e.g. one saved
 * from tide_compressor_residual before a restart. */
int tide_compressor_set_residual(tide_compressor_t *c, const float *residual, size_t d);
/* Zeroes the residual and rewinds the seed to the one given at creation. */
int tide_compressor_reset(tide_compressor_t *c);
/* The message of the last failed compress ("" if none). */
const char *tide_compressor_last_error(const tide_compressor_t *c);
void tide_compressor_destroy(tide_compressor_t *c);

/* ---- top-k on a GPU (CUDA) ------------------------------------------------- */

/* tide finds CUDA at run time: the driver (libcuda.so.1) and NVRTC
 * (libnvrtc.so, or TIDE_NVRTC_LIBRARY) are loaded with dlopen on first use
 * and the kernels compiled for the device found (about a second, once;
 * kept in TIDE_GPU_CACHE for later processes). Building tide needs no CUDA;
 * without a GPU every call below returns TIDE_ENOSYS (logged with the
 * reason) and tide_gpu_available says why. docs/algorithms.md gives each
 * selector's passes and cost. */

/* 1 when a CUDA GPU, its driver and NVRTC are usable in this process; else
 * 0 and, when why is not NULL, the reason in why[0..why_len). */
int tide_gpu_available(char *why, size_t why_len);
/* The name of the current context's device (device 0 when none is current). */
int tide_gpu_device_name(char *name, size_t len);

/* Selects k of x[0..d) (device memory, dtype TIDE_F32, TIDE_F16 or
 * TIDE_BF16) by magnitude into values[0..k) (device memory, x's dtype) and
 * indices[0..k) (device memory, TIDE_I32 or TIDE_I64), the same selection
 * as the CPU selector of that kind: TIDE_TOPK_EXACT and TIDE_TOPK_SAMPLED
 * the exact top k (ties to the lower index), TIDE_TOPK_MSTOPK MSTopK with
 * the bisection kept on the device; TIDE_TOPK_RANDOMK has no GPU kernels
 * (TIDE_EINVAL). Unlike the CPU's, the pairs come in no particular order.
 * Stream-ordered: the passes queue on `stream` (a CUstream / cudaStream_t;
 * NULL: the legacy default stream) after the work already there, and the
 * call returns when they are done (it synchronises the stream once, at
 * the end, to read the counts). A NaN or Inf in x is TIDE_EINVAL naming
 * `name` and the element; nothing is written then. k <= d < 2^32 (i32
 * indices: d < 2^31). Calls on one GPU context run one at a time. */
int tide_gpu_topk_select(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const void *x, tide_dtype_t dtype,
                         size_t d, size_t k, const char *name, void *values, void *indices,
                         tide_dtype_t index_dtype, void *stream, tide_topk_stats_t *stats_or_null);

/* A compressor (scope TIDE_TOPK_GLOBAL, d floats) whose residual lives on
 * the GPU of the current context and whose selection runs there (kind as
 * for tide_gpu_topk_select), queued on stream. tide_compressor_compress
 * then takes grad in device memory (or host memory, copied over first: what
 * tide_hitopk_allreduce passes) and writes the k pairs to host memory
 * values and indices, in no particular order: only the pairs leave the
 * device. tide_compressor_residual returns a device pointer;
 * tide_compressor_set_residual copies from host or device memory. The other
 * calls are the same. TIDE_ENOSYS without a GPU. */
int tide_compressor_create_gpu(tide_topk_kind_t kind, double density, size_t d, const tide_topk_opts_t *opts,
                               void *stream, tide_compressor_t **out);

/* ---- sparse collectives ---------------------------------------------------- */

/* TopK-AllGather: rank r contributes k_r (value, index) pairs of a dense
 * tensor of d floats (k may differ between ranks; indices < d); every rank
 * receives in out[0..d) the sum (TIDE_SUM) or mean (TIDE_AVG) over ranks of
 * everyone's pairs, duplicate indices summed, bitwise identical on every
 * rank. Collective and checked like the dense calls (d and op must match);
 * an index of this rank's >= d is TIDE_EINVAL naming it.
 * Bytes on the wire: docs/algorithms.md. */
int tide_sparse_allgather(tide_comm_t *comm, const float *values, const uint32_t *indices, size_t k, float *out,
                          size_t d, tide_op_t op);

/* HiTopKComm needs the same number of ranks on every host. This rank's shard
 * of a d-float gradient (the block of its local rank): create the
 * compressor passed to tide_hitopk_allreduce with d = *len. */
int tide_hitopk_shard(tide_comm_t *comm, size_t d, size_t *offset, size_t *len);
/* Hierarchical top-k allreduce (Shi et al., MLSys 2021): intra-host dense
 * reduce-scatter of grad; top-k of this rank's shard through `compressor`
 * (error feedback kept in it); all-gather of the pairs among the ranks with
 * this local rank on every host; intra-host all-gather of those pairs; out
 * (d floats, may equal grad) receives the sum or mean of every host's
 * selections, duplicate indices summed, identical on every rank. */
int tide_hitopk_allreduce(tide_comm_t *comm, const float *grad, float *out, size_t d, tide_compressor_t *compressor,
                          tide_op_t op);

/* ---- Adasum ----------------------------------------------------------------- */

/* Adasum allreduce (Maleki et al., MLSys 2021): combines the ranks' vectors
 * pairwise, tensor by tensor, as
 *   Adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
 * (a vector with |x|^2 < sqrt(DBL_MIN) keeps coefficient 1), so orthogonal
 * vectors add and identical ones give themselves: the result keeps the
 * scale of one rank's vector as the rank count grows. Dot products and
 * norms accumulate in double. The ranks are combined as a binary tree (for
 * a rank count n that is not a power of two, ranks 2i and 2i+1, i < n - p
 * with p the largest power of two <= n, are combined first; see
 * docs/algorithms.md); on ranks spanning hosts with as many on each, each
 * host's vectors are averaged first and Adasum runs across hosts
 * (TIDE_ADASUM_HIER=0 runs it over every rank instead).
 *
 * count elements of dtype TIDE_F32 or TIDE_F64. tensors[0..ntensors) (only
 * offset and count are read) must tile [0, count) without gap or overlap,
 * in any order; each tensor is combined on its own, so its result depends
 * on that tensor's elements only. ntensors 0 (tensors may be NULL) makes the
 * buffer one tensor. The result is bitwise identical on every rank.
 * Collective, checked like tide_allreduce (count, dtype and the tensors'
 * boundaries must match); sendbuf == recvbuf means in place. Bytes on the
 * wire: docs/algorithms.md. */
int tide_adasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                          const tide_tensor_t *tensors, size_t ntensors);
/* The nonblocking form; tensors are copied, the buffers borrowed until the
 * request completes. */
int tide_iadasum_allreduce(tide_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count, tide_dtype_t dtype,
                           const tide_tensor_t *tensors, size_t ntensors, tide_request_t **req);

/* ---- monitoring: noise scale, gain ratio, goodput ------------------------ */

/* The formulas the monitor and the policies are built from, public so that
 * a framework binding can check its own figures. Pure; any thread. The
 * references are ../shared/spec/adaptation.md §1, §2 and §6 in tide's
 * repository and docs/adaptation.md. */

/* McCandlish et al.'s two-batch estimators: from |G_small|^2 of a gradient
 * over b_small samples and |G_big|^2 over b_big > b_small samples (b_small
 * >= 1), unbiased estimates of |G|^2 (*grad_sq) and tr(Sigma) (*trace_sigma)
 * (either may be negative on a noisy step). TIDE_EINVAL unless
 * 1 <= b_small < b_big and both squares are finite and >= 0. */
int tide_gns_estimate(double b_small, double b_big, double sq_small, double sq_big, double *grad_sq,
                      double *trace_sigma);
/* AdaScale's gain ratio r = (var + sqr) / (var / scale + sqr) for the
 * gradient variance var at scale 1 (tr(Sigma) / base batch), sqr = |G|^2 and
 * scale = batch / base batch: in [1, scale]. var is clamped to >= 1e-6 and
 * sqr to >= 0 first; scale < 1 or a NaN gives NaN. */
double tide_adascale_gain(double var, double sqr, double scale);
/* Pollux's statistical efficiency of batch M against base batch M0 at noise
 * scale phi = tr(Sigma)/|G|^2: E = (phi + M0) / (phi + M), 1 at M = M0. NaN
 * for M0 or M <= 0 or phi < 0. */
double tide_pollux_efficiency(double phi, double base_batch, double batch);

/* Pollux's throughput model (Qiao et al., OSDI 2021): seconds of one
 * forward/backward pass of m samples T_acc = alpha_c + beta_c*m; of the
 * gradient exchange T_net = alpha_n + beta_n*max(K-2, 0) across hosts
 * (nodes > 1), alpha_r + beta_r*max(K-2, 0) within one (K > 1), 0 for one
 * replica; T_opt = (T_acc^gamma + T_net^gamma)^(1/gamma), gamma in [1, 10]
 * (1: no overlap). */
typedef struct {
  double alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma;
} tide_pollux_model_t;
/* Samples per second of a step of `replicas` ranks on `nodes` hosts, each
 * with micro-batches of `atomic` samples and `accum` extra accumulation
 * passes (the spec's s: a step is accum + 1 passes, global batch
 * replicas * atomic * (accum + 1)): M / (accum*T_acc + T_opt). NaN for a
 * model or arguments out of range. */
double tide_pollux_throughput(const tide_pollux_model_t *model, int nodes, int replicas, double atomic,
                              int accum);

/* A job's batch limits for Pollux's optimiser: the base batch M0 the
 * efficiency is relative to, the largest global batch, the micro-batch
 * bounds per worker, and the most passes per step (1: no accumulation). */
typedef struct {
  double base_batch, max_batch, min_atomic, max_atomic;
  int max_passes;
} tide_pollux_limits_t;

/* A batch shape and its modelled goodput (samples/s x efficiency). */
typedef struct {
  double goodput, batch, atomic;
  int accum; /* extra passes: the step is accum + 1 passes */
} tide_pollux_choice_t;

/* The shape of global batch `batch` on `replicas` workers (local =
 * ceil(batch / replicas) split into the fewest passes of at most
 * max_atomic, no more than max_passes) and its goodput at noise scale phi,
 * in *out. TIDE_EINVAL for a NULL pointer, a model or limits out of range.
 * Pure; any thread. */
int tide_pollux_goodput(const tide_pollux_model_t *model, const tide_pollux_limits_t *limits, int nodes,
                        int replicas, double phi, double batch, tide_pollux_choice_t *out);
/* The best of 50 global batches spaced geometrically over
 * [max(base_batch, min_atomic * replicas), max_batch] (the first best on a
 * tie), as the Pollux agent and the cluster scheduler's speedup function
 * choose it. Errors as tide_pollux_goodput. Pure; any thread. */
int tide_pollux_optimize(const tide_pollux_model_t *model, const tide_pollux_limits_t *limits, int nodes,
                         int replicas, double phi, tide_pollux_choice_t *out);

/* One profile the throughput model is fitted to: mean seconds of one
 * forward/backward pass (t_acc) and of the last pass with the exchange
 * (t_opt) seen at `atomic` samples per worker on `replicas` workers over
 * `nodes` hosts. */
typedef struct {
  int nodes, replicas;
  double atomic, t_acc, t_opt;
} tide_pollux_profile_t;
/* Fit flags: gamma free in [1, 10] (the exchange overlaps the backward
 * pass) instead of 1; after the fit, a network never measured is made no
 * faster than the one that was (alpha_n >= 1.1 alpha_r, beta_n >= 1.1
 * beta_r without multi-host profiles), so a scheduler explores it
 * optimistically but not for free; restart the local search from several
 * starting points and keep the best. */
enum { TIDE_POLLUX_FIT_OVERLAP = 1, TIDE_POLLUX_FIT_EXPLORE = 2, TIDE_POLLUX_FIT_RESTARTS = 4 };
/* Fits the model to n >= 1 profiles (RMSLE of t_acc and t_opt plus the
 * spec's regularisers, NLopt BOBYQA); terms the profiles cannot identify
 * are pinned as AdaptDL does (one micro-batch size: alpha_c at half the
 * mean t_acc; no multi-host profile: alpha_n, beta_n; no single-host
 * multi-worker profile: alpha_r, beta_r; one worker count: the slopes).
 * *model is written only on success. TIDE_EINVAL for bad profiles,
 * TIDE_ENOMEM, or TIDE_ESTATE when the solver fails. Pure; any thread. */
int tide_pollux_fit(const tide_pollux_profile_t *profiles, int n, unsigned flags, tide_pollux_model_t *model);

/* ---- the training step ---------------------------------------------------- */

/* A trainer owns one data-parallel training step over a caller-owned flat
 * parameter buffer and its gradient buffer (float32, same layout, split
 * into tensors by tide_tensor_t views): it deals the data (which samples
 * each rank takes next), accumulates the caller's micro-batch gradients,
 * exchanges them (dense allreduce, TopK-AllGather or HiTopKComm, from one
 * table), measures (noise scale, gain ratio, step times, communication
 * share), asks its policies (batch size, learning-rate factor, exchange,
 * membership) and applies the optimizer. Every rank applies the same
 * decisions at the same step, so replicas stay identical.
 *
 * The caller's loop:
 *   while (tide_trainer_next(tr, &batch) == 0 && !batch.done) {
 *     forward/backward over batch.indices[0..batch.count) -> grads (mean)
 *     tide_trainer_step(tr, loss, &stats);   // stats.stepped: an update ran
 *   }
 * A trainer is used by one thread at a time; its calls that communicate are
 * collective over its communicator (every rank calls them in the same
 * order). */
typedef struct tide_trainer tide_trainer_t;

typedef enum {
  TIDE_EXCHANGE_DENSE = 0, /* one allreduce of the gradient sum and the statistics */
  TIDE_EXCHANGE_TOPK,      /* TopK-AllGather of each rank's top-k, error feedback */
  TIDE_EXCHANGE_HITOPK,    /* HiTopKComm: intra-host reduce-scatter, top-k across hosts */
  TIDE_EXCHANGE_ADASUM,    /* each rank steps its own optimizer; the parameter changes are
                              combined by tide_adasum_allreduce (docs/adaptation.md) */
  TIDE_EXCHANGE_COUNT
} tide_exchange_t;
/* "dense", "topk", "hitopk", "adasum"; "?" for an unknown value. */
const char *tide_exchange_name(tide_exchange_t exchange);
/* The exchange named `name` (case-insensitive); TIDE_EINVAL otherwise. */
int tide_exchange_parse(const char *name, tide_exchange_t *out);

/* Start from tide_trainer_config_default and set the data set's size. */
typedef struct {
  uint64_t dataset_size; /* samples to deal each epoch (> 0) */
  uint64_t seed;         /* the data order (tide_sampler) and the compressor's draws */
  int batch;             /* per-rank samples per step at the start (> 0, default 64) */
  int max_batch;         /* most samples in one of the caller's forward/backward passes
                            (>= batch; 0 = batch): a larger per-rank share of a step is
                            split into micro-batches whose gradients are accumulated */
  int max_accum;         /* most micro-batches per step (>= 1, default 16) */
  long base_batch;       /* M0, the global batch the learning rate and schedule were tuned
                            for (0 = batch * ranks at creation) */
  double epochs;         /* training length in epochs of progress: the run is done when
                            progress reaches epochs * dataset_size / base_batch (> 0) */
  tide_optim_config_t optim;
  /* Indexed by progress in base-batch steps (AdaScale's scale-invariant
   * iterations), not by step: give its step counts at base_batch. */
  tide_lr_schedule_t schedule;
  tide_exchange_t exchange;     /* at the start (default dense) */
  double density;               /* topk, hitopk: in (0, 1] (default 0.01) */
  tide_topk_kind_t selector;    /* topk, hitopk (default TIDE_TOPK_SAMPLED) */
  double sparse_warmup_epochs;  /* DGC's density warm-up: in data epoch e < this, density
                                   density^((e+1)/(N+1)) (default 0) */
  double gns_decay;             /* the monitor's moving averages keep decay^(M/M0) of their
                                   value per step of global batch M (in (0, 1), default 0.95,
                                   chosen by measurement: docs/adaptation.md) */
  int tensor_stats;             /* 1: noise scale per tensor too (tide_trainer_tensor_stats) */
  int pto;                      /* 1: the parallel tensor operation (docs/algorithms.md, "PTO"):
                                   each rank updates 1/ranks of the parameters, keeps optimizer
                                   state for that shard alone, and the parameters are
                                   all-gathered; under dense the gradient is reduce-scattered
                                   instead of all-reduced. Dense, topk and hitopk only (default 0) */
} tide_trainer_config_t;

void tide_trainer_config_default(tide_trainer_config_t *out);

/* Creates a trainer over comm for params[0..nparams) and grads[0..nparams)
 * (caller-owned, borrowed until destroy; every rank must start from the same
 * params, e.g. broadcast from rank 0). tensors[0..ntensors) tile the buffer
 * as for tide_optim_create (copied; ntensors 0: one tensor). config is
 * copied and checked: TIDE_EINVAL names the field. Collective over comm. */
int tide_trainer_create(tide_comm_t *comm, const tide_trainer_config_t *config, float *params,
                        float *grads, size_t nparams, const tide_tensor_t *tensors, size_t ntensors,
                        tide_trainer_t **out);
/* Frees the trainer and its policies; not collective. NULL is fine. */
void tide_trainer_destroy(tide_trainer_t *tr);

/* The next micro-batch this rank computes. */
typedef struct {
  const uint64_t *indices; /* sample indices, owned by the trainer, valid until the next call */
  size_t count;            /* may be 0 (the epoch's last step can leave a rank nothing):
                              then skip the forward/backward, still call tide_trainer_step */
  int micro, micro_count;  /* this is micro-batch `micro` of the step's micro_count */
  uint64_t epoch;          /* data epoch the samples belong to */
  long step;               /* optimizer steps done before this one */
  int done;                /* 1: training is over (progress reached epochs); nothing else set */
} tide_batch_t;

/* Writes the next micro-batch to *batch. The first micro-batch of a step
 * runs the policies' before_step hooks, which may change the batch size or
 * the exchange from this step on. Collective (a policy may broadcast). */
int tide_trainer_next(tide_trainer_t *tr, tide_batch_t *batch);

/* What the monitor measured; written by tide_trainer_step and read by
 * policies. Times are seconds; NaN where not known yet (the noise scale
 * before the first step with at least two micro-batches of full size). */
typedef struct {
  int stepped;           /* tide_trainer_step: 1 when this call ran the exchange and update */
  long step;             /* optimizer steps done (including this one) */
  double progress;       /* base-batch steps of progress (AdaScale's tau) */
  double epochs_done;    /* progress in epochs: progress * base_batch / dataset_size */
  uint64_t epoch;        /* data epoch of this step's samples */
  int epoch_end;         /* 1: this step took the data epoch's last samples */
  int done;              /* 1: progress has reached the configured epochs */
  long global_batch;     /* samples in this step over all ranks */
  long planned_batch;    /* global batch planned for full steps: ranks * batch * accum */
  int batch, accum;      /* per-rank micro-batch and micro-batches per step */
  int ranks, nodes;      /* workers and hosts */
  tide_exchange_t exchange;
  double loss;           /* mean over the step's samples */
  double lr;             /* learning rate applied: schedule(progress) * lr_factor */
  double lr_factor;      /* set by a policy (AdaScale's gain), else 1 */
  double gain;           /* progress this step added */
  double scale;          /* global_batch / base_batch */
  double grad_sq;        /* smoothed |G|^2, plus its variance over itself (so that
                           trace_sigma / grad_sq is not biased up by a noisy average) */
  double trace_sigma;    /* smoothed tr(Sigma), per-sample gradient variance */
  double noise_scale;    /* B_simple = trace_sigma / grad_sq (smoothed separately) */
  double gain_ratio;     /* AdaScale's r at this step's scale (1 until known) */
  double compute_s;      /* this rank: data and forward/backward of the step's micro-batches */
  double exchange_s;     /* this rank: the exchange, waiting for peers included (PTO: and
                            the parameter all-gather) */
  double optim_s;        /* this rank: averaging, statistics, policies and optimizer (PTO:
                            on this rank's shard) */
  double step_s;         /* this rank: wall time since the previous step ended */
  double compute_min_s, compute_median_s, compute_max_s; /* this step's compute_s over ranks */
  int slowest_rank;      /* rank with compute_max_s */
  double comm_share;     /* previous step's exchange_s / step_s over all ranks (sums) */
  double mean_step_s;    /* previous step's step_s averaged over ranks */
  double throughput;     /* samples per second: global_batch / step_s */
  double kfac_s;         /* this rank: K-FAC's part of the step (tide_trainer_kfac_add calls,
                            factor allreduce, eigendecompositions, preconditioning, sharing; all but
                            the add calls are inside optim_s); 0 without */
  double data_s;         /* this rank: time the step waited for its data (tide_trainer_data_wait) */
  /* Multiplexing (docs/elastic.md, "Multiplexing"): a background job
   * (TIDE_FOREGROUND) counts the time its guard held this step back at the
   * step boundary and the pauses so far; a foreground (TIDE_HOSTS_BACKGROUND)
   * its solo step time as it publishes it (NaN until measured, and on ranks
   * other than 0). */
  double paused_s;       /* background: this step's wait at the boundary (0: none) */
  long pauses;           /* background: pauses so far (rank 0; 0 on the others) */
  double solo_step_s;    /* foreground: median step time while no background ran */
  int background_jobs;   /* foreground: background jobs running at this step's end (rank 0) */
} tide_step_stats_t;

/* After the caller's forward/backward of the micro-batch tide_trainer_next
 * gave (grads holds the mean gradient over its count samples; loss the mean
 * loss; both ignored when count was 0): accumulates it, and after the
 * step's last micro-batch exchanges, measures, runs the policies and applies
 * the optimizer to params. *stats (may be NULL) is written on every call;
 * stats->stepped says whether an update ran. Collective on the last
 * micro-batch of a step. */
int tide_trainer_step(tide_trainer_t *tr, double loss, tide_step_stats_t *stats);

/* Adds seconds (>= 0) to the time the current step waited for its data,
 * reported as stats.data_s when the step ends (tide_loader_get's wait_s).
 * Not collective. TIDE_EINVAL for a NULL trainer or a negative or NaN
 * value. */
int tide_trainer_data_wait(tide_trainer_t *tr, double seconds);

/* The last stats written (also readable between steps). */
const tide_step_stats_t *tide_trainer_stats(const tide_trainer_t *tr);
/* Smoothed per-tensor figures (config.tensor_stats = 1; TIDE_ESTATE
 * otherwise); tensor in [0, ntensors). */
int tide_trainer_tensor_stats(const tide_trainer_t *tr, size_t tensor, double *grad_sq, double *trace_sigma);
/* The message of the last failure ("" if none). */
const char *tide_trainer_last_error(const tide_trainer_t *tr);
/* Bytes of optimizer state (momentum, moments) this rank keeps: the whole
 * model's, or under config.pto its shard's; 0 for a NULL trainer. */
size_t tide_trainer_optim_bytes(const tide_trainer_t *tr);

/* State an elastic resize or a checkpoint moves: step, progress, data epoch
 * and position, batch plan, exchange, the monitor's averages, the policies'
 * state, the optimizer's state, this rank's compressor residual (rank
 * specific: error feedback not yet sent) and, with K-FAC, its factors and
 * eigendecompositions. Parameters are the caller's and not included. Host
 * byte order. Under config.pto the optimizer state is still the whole
 * model's: tide_trainer_state_get gathers every rank's shard (so it is
 * collective then), and tide_trainer_state_set keeps this rank's shard of
 * it, so a state restores on any number of ranks, with PTO or without.
 * K-FAC's decompositions are gathered from the ranks that own them in the
 * same way (collective when config.distribute spreads them over ranks); a
 * state without K-FAC restores into a K-FAC trainer (its factors start
 * from I), one with K-FAC only into a trainer with the same K-FAC layers. */
size_t tide_trainer_state_size(const tide_trainer_t *tr);
int tide_trainer_state_get(const tide_trainer_t *tr, void *buf, size_t len);
/* Restores a state from a trainer with the same config, nparams and
 * policies; TIDE_EINVAL (nothing changed) otherwise. Not collective: every
 * rank restores its own (the same one, but for the residual). */
int tide_trainer_state_set(tide_trainer_t *tr, const void *buf, size_t len);

/* ---- datasets on disk (tide data; docs/data.md) --------------------------- */

/* What a dataset call wrote. */
typedef struct {
  size_t images;  /* samples written or indexed */
  size_t classes; /* class folders */
  size_t shards;  /* shard files (0: one file per sample) */
  uint64_t bytes; /* bytes of sample data written (export: PNG; packing: shards) */
} tide_data_summary_t;
/* Exports a dataset tide can read natively as an ImageFolder directory dir
 * (created when absent): one PNG per image under K_CLASS/NNNNN.png and
 * dir/index.txt; with shard_bytes > 0 packed into dir/shards/ of about that
 * many bytes each instead. name: "fashion-mnist" (the one so far), read
 * from `from` (an idx directory; NULL: /usr/share/datasets/fashion-mnist);
 * split "train" or "test" (NULL: train); limit > 0 exports the first limit
 * images only (0: all). *out (may be NULL) says what was written.
 * TIDE_EINVAL naming a bad argument; the I/O error naming the path. */
int tide_data_export(const char *name, const char *dir, const char *split, const char *from, long limit,
                     uint64_t shard_bytes, tide_data_summary_t *out);
/* Indexes an ImageFolder directory (dir/index.txt, which the loader and an
 * HTTP server of the directory read); with shard_bytes > 0 packs its samples
 * into out_dir/shards/ (NULL: dir) of about that many bytes each, with
 * out_dir/index.txt. *out (may be NULL) says what was written. */
int tide_data_index(const char *dir, uint64_t shard_bytes, const char *out_dir, tide_data_summary_t *out);
/* A data cache's contents and the counters every run has added to it. */
typedef struct {
  size_t entries;        /* cached objects */
  uint64_t bytes;        /* their size */
  uint64_t bound_bytes;  /* TIDE_DATA_CACHE_BYTES */
  uint64_t hits, misses; /* lookups */
  uint64_t refetched;    /* bad entries fetched again */
  uint64_t evicted;
  uint64_t bytes_served;  /* from the cache */
  uint64_t bytes_fetched; /* from sources, and stored */
} tide_data_cache_stats_t;
/* The data cache directory: TIDE_DATA_CACHE when set (and not "none"),
 * else the default ($XDG_CACHE_HOME/tide/data or ~/.cache/tide/data).
 * TIDE_EINVAL for a NULL or too small out. */
int tide_data_cache_dir(char *out, size_t cap);
/* Reads the cache at dir. TIDE_ENOENT when dir does not exist. */
int tide_data_cache_stats(const char *dir, tide_data_cache_stats_t *out);

/* ---- what a training program needs around the trainer -------------------- */

/* The metrics line schema: one flat JSON object per line (metrics.jsonl),
 * written by tide-train and read by tide report. The keys are defined once
 * (src/train/metrics.c); a program writes and reads them through these
 * calls, never by spelling a key. */
typedef enum {
  TIDE_METRICS_NONE = 0, /* not a metrics line (or an unknown type) */
  TIDE_METRICS_STEP,     /* "step": one per step */
  TIDE_METRICS_EPOCH,    /* "epoch": a test evaluation at a data-epoch end */
  TIDE_METRICS_EVAL,     /* "eval": a test evaluation every --eval-every steps */
  TIDE_METRICS_FINAL     /* "final": the evaluation at the end */
} tide_metrics_line_t;
typedef enum {
  /* step lines */
  TIDE_METRIC_STEP = 0, /* step number from 0 (in evaluation lines: steps done) */
  TIDE_METRIC_EPOCH,    /* step lines: the data epoch; evaluation lines: progress in epochs */
  TIDE_METRIC_PROGRESS,
  TIDE_METRIC_EPOCHS_DONE,
  TIDE_METRIC_LOSS,
  TIDE_METRIC_LR,
  TIDE_METRIC_GLOBAL_BATCH,
  TIDE_METRIC_BATCH,
  TIDE_METRIC_ACCUM,
  TIDE_METRIC_EXCHANGE, /* a name (tide_exchange_name), not a number */
  TIDE_METRIC_IMAGES_PER_S,
  TIDE_METRIC_COMPUTE_S,
  TIDE_METRIC_COMM_S,
  TIDE_METRIC_OPTIM_S,
  TIDE_METRIC_STEP_S,
  TIDE_METRIC_TIME_S, /* seconds since training started (both kinds of line) */
  TIDE_METRIC_NOISE_SCALE,
  TIDE_METRIC_GRAD_SQ,
  TIDE_METRIC_TRACE_SIGMA,
  TIDE_METRIC_GAIN_RATIO,
  TIDE_METRIC_LR_FACTOR,
  TIDE_METRIC_GAIN,
  TIDE_METRIC_KFAC_S,
  TIDE_METRIC_COMM_SHARE,
  TIDE_METRIC_RANK_COMPUTE_MIN_S,
  TIDE_METRIC_RANK_COMPUTE_MEDIAN_S,
  TIDE_METRIC_RANK_COMPUTE_MAX_S,
  TIDE_METRIC_DATA_S,
  TIDE_METRIC_PAUSED_S,
  TIDE_METRIC_SOLO_STEP_S,
  TIDE_METRIC_PAUSES,
  TIDE_METRIC_BACKGROUND_JOBS,
  TIDE_METRIC_UNIX_S,
  TIDE_METRIC_SLOWEST_RANK,
  /* evaluation lines (and TIDE_METRIC_STEP, _EPOCH, _TIME_S) */
  TIDE_METRIC_DATA_EPOCH,
  TIDE_METRIC_TEST_LOSS,
  TIDE_METRIC_TEST_ACCURACY,
  TIDE_METRIC_EVAL_S,
  TIDE_METRIC_COUNT
} tide_metric_t;
/* The key of a metric ("lr"); "?" for another value. Static storage. */
const char *tide_metric_key(tide_metric_t metric);
/* The kind of a metrics line (its "type"); TIDE_METRICS_NONE for NULL or
 * another line. */
tide_metrics_line_t tide_metrics_line_kind(const char *line);
/* The number of `metric` in a metrics line; NaN when the line has none (the
 * key absent, null, or not a number). */
double tide_metric_read(const char *line, tide_metric_t metric);
/* Writes the step line of stats s (as tide_trainer_stats gives it after a
 * step) into buf, newline-terminated: time_s is the time since training
 * started, unix_s the wall clock. Statistics not measured are null. The
 * line's length, or TIDE_EINVAL for a NULL argument or a buf too small
 * (1024 bytes always suffice). */
int tide_metrics_step_line(const tide_step_stats_t *s, double time_s, double unix_s, char *buf, size_t cap);
/* Writes an evaluation line (kind TIDE_METRICS_EPOCH, _EVAL or _FINAL) after
 * the step stats s: the test set's loss and accuracy (a fraction), time_s
 * since training started and eval_s, the time spent evaluating so far.
 * The line's length, or TIDE_EINVAL as tide_metrics_step_line. */
int tide_metrics_eval_line(tide_metrics_line_t kind, const tide_step_stats_t *s, double test_loss,
                           double test_accuracy, double time_s, double eval_s, char *buf, size_t cap);

/* The default base batch (config.base_batch, the global batch the learning
 * rate and schedule were tuned for) of workers that each take `batch`:
 * batch x the job's size. In an elastic job batch x the launcher's first
 * worker count (TIDE_SIZE, which tiderun --elastic gives a worker that joins
 * later too): a joiner's own default (batch x its new communicator's size)
 * would differ from the members' and tide_trainer_create's agreement check
 * would refuse it (docs/elastic.md). TIDE_EINVAL for batch <= 0 or a
 * malformed TIDE_SIZE. Any thread; reads comm only. */
int tide_trainer_base_batch(const tide_comm_t *comm, int batch, long *out);
/* Collective: FNV-1a of the `bytes` bytes at data (a replica's parameters)
 * on every rank, all-gathered. *checksum is rank 0's; *differing the lowest
 * rank whose checksum differs from rank 0's, -1 when every replica is
 * identical. Outputs written only on success. */
int tide_replica_checksum(tide_comm_t *comm, const void *data, size_t bytes, uint64_t *checksum, int *differing);
/* This rank's own FNV-1a of the `bytes` bytes at data: the value
 * tide_replica_checksum compares (NULL data only with bytes 0). Any thread. */
uint64_t tide_checksum(const void *data, size_t bytes);

/* ---- elastic training (docs/elastic.md) ----------------------------------- */

/* Makes the trainer elastic; call after tide_trainer_create and the
 * policies, before the first step. The trainer then owns its communicator
 * (it replaces it at every membership change and destroys it with the
 * trainer): the caller must not destroy it and reads the current one with
 * tide_trainer_comm. In a worker that joined a running job
 * (tide_comm_joined) it receives the state and parameters from the others,
 * who are in their own membership change (collective with them); when a
 * member dies during that hand-over it recovers with the survivors
 * (tide_trainer_recover), and the trainer owns the communicator even if
 * that fails (TIDE_ESTATE: no survivor had a state to hand over).
 * At every step boundary tide_trainer_next then reads the job's requests
 * (tide_elastic_request, workers waiting to join, a policy's world_size),
 * watches for stragglers (TIDE_STRAGGLER) and changes the membership when
 * asked, handing over the state of the member with the most completed steps;
 * a worker left out gets batch.done = 1 and tide_trainer_detached = 1.
 * With config.pto the members gather the optimizer's shards before a
 * planned change and re-cut them after it; a failed worker's shard is lost
 * with it, so tide_trainer_recover then fails (TIDE_EPEER) instead of going
 * on. TIDE_ESTATE when the communicator is not elastic; TIDE_EINVAL with
 * K-FAC. */
int tide_trainer_elastic(tide_trainer_t *tr);
/* After tide_trainer_next or tide_trainer_step returned rc: when the
 * trainer is elastic and rc is a peer failure (TIDE_EPEER, TIDE_ETIMEDOUT,
 * TIDE_EABORTED), the survivors agree on who is left, build a new
 * communicator, take the state of the one with the most completed steps
 * (a half-done step is abandoned and dealt again over the survivors) and
 * return 0: go on with tide_trainer_next. Otherwise returns rc. Collective
 * over the survivors. */
int tide_trainer_recover(tide_trainer_t *tr, int rc);
/* Changes the membership now, at a step boundary (size and exclude as
 * tide_comm_resize). Collective. */
int tide_trainer_resize(tide_trainer_t *tr, int size, int exclude);
/* The trainer's current communicator (NULL once this rank left the job). */
tide_comm_t *tide_trainer_comm(const tide_trainer_t *tr);
/* 1 when this rank was left out of the job's membership (released by a
 * request or as a straggler): its training is over, exit normally. */
int tide_trainer_detached(const tide_trainer_t *tr);
/* The rank of the current membership flagged as a straggler (its compute
 * time's moving average of median/own below 0.8, Resource Elasticity's rule),
 * or -1. */
int tide_trainer_straggler(const tide_trainer_t *tr);
/* Seconds the last membership change took on this rank, from the decision
 * (or the failure) to the state in place; NaN before the first change. */
double tide_trainer_last_change_s(const tide_trainer_t *tr);

/* ---- policies (KungFu-style adaptation hooks) ----------------------------- */

/* What a policy decides. Hooks write only the fields they decide; the
 * trainer fills the rest with "unchanged" before each hook. */
typedef struct {
  long global_batch;    /* > 0: global batch from this step on (before_step) or the next
                           (later hooks), rounded to ranks x micro-batch x accumulation */
  double lr_factor;     /* > 0: multiplies the schedule's rate for this step (before_update) */
  double gain;          /* > 0: progress this step counts for (before_update; default
                           global_batch / base_batch) */
  int exchange;         /* >= 0: a tide_exchange_t from the next step on; -1 unchanged */
  int world_size;       /* > 0: requested number of workers (elastic jobs); 0 none */
} tide_decision_t;

/* A policy's hooks; each may be NULL. A hook returns 0 or a negative
 * TIDE_E* (which fails the trainer call). Every rank runs its hooks on the
 * same all-reduced statistics, so decisions agree; a policy that decides
 * from anything local (a model fitted on this rank) sets decide_every > 0:
 * its before_step then runs only every decide_every steps, and rank 0's
 * decision is broadcast. state points to state_size bytes of plain data
 * (no pointers), saved and restored with the trainer's state. */
typedef struct {
  const char *name;
  int (*before_step)(void *state, const tide_step_stats_t *stats, tide_decision_t *decision);
  int (*before_update)(void *state, const tide_step_stats_t *stats, tide_decision_t *decision);
  int (*after_epoch)(void *state, const tide_step_stats_t *stats, tide_decision_t *decision);
  void (*destroy)(void *state);
  size_t state_size;
  int decide_every;
} tide_policy_ops_t;

/* Adds a policy; hooks run in the order policies were added (a later
 * policy's field wins). ops is copied; state is owned by the trainer from
 * now on (ops->destroy frees it at tide_trainer_destroy). Not collective,
 * but every rank must add the same policies in the same order. */
int tide_trainer_add_policy(tide_trainer_t *tr, const tide_policy_ops_t *ops, void *state);
/* Adds built-in policies from a comma-separated list, each NAME or
 * NAME:key=value:key=value (docs/adaptation.md):
 *   adascale   learning-rate gain and progress from the gain ratio (AdaScale)
 *   gns        grow the global batch towards the measured noise scale
 *   pollux     the batch that maximises goodput (fitted throughput x efficiency)
 *   exchange   dense or hitopk from the measured communication share
 *   autoscale  elastic jobs: add workers while each added one raises the
 *              throughput by at least threshold (0.5) of a worker's, give
 *              them back when not (Resource Elasticity; docs/elastic.md)
 * TIDE_EINVAL names an unknown policy or key, or a bad value. */
int tide_trainer_adapt(tide_trainer_t *tr, const char *list);

/* ---- K-FAC gradient preconditioning ------------------------------------- */

/* Distributed K-FAC (Martens & Grosse 2015; Osawa et al. CVPR 2019; KAISA,
 * Pauloski et al. SC20), a stage of the step that runs after the gradient
 * exchange and before the optimizer (docs/algorithms.md, "K-FAC"). Each
 * dense or conv layer's Fisher block is approximated as A (x) G: A the
 * covariance of the layer's inputs (conv: im2col patches, the KFC
 * approximation; a ones column when it has a bias), G that of the
 * gradients at its outputs. Factors are running averages,
 * F = decay*F + (1-decay)*F_step starting from I, averaged over the ranks;
 * every inverse_every steps each factor is eigendecomposed (LAPACK ssyevd;
 * a wide A at low rank, lowrank_dim below),
 * F = Q diag(d) Q^T, d clamped >= 0; every step the layer's gradient M
 * ([out, in (+1 bias column)]) becomes
 *   P = Q_G ((Q_G^T M Q_A) ./ (d_G d_A^T + damping)) Q_A^T
 * and with kl_clip > 0 all of them are scaled by
 *   nu = min(1, sqrt(kl_clip / |sum over layers of sum(P .* M) * lr^2|)).
 * Tensors outside the layers keep their plain gradient. The optimizer
 * (momentum-SGD in tide-train --optim kfac) then applies the result. */
typedef struct {
  int factor_every;   /* steps between factor updates (>= 1, default 10); a step updates its
                         factors when step % factor_every == 0 */
  int inverse_every;  /* steps between eigendecompositions (a multiple of factor_every,
                         default 50) */
  float damping;      /* > 0, added to d_G d_A^T (default 0.001) */
  float factor_decay; /* running-average decay, [0, 1) (default 0.95) */
  float kl_clip;      /* > 0: KL clipping as above; 0: off (default 0.001) */
  int distribute;     /* 1 (default): KAISA's layer-wise distribution: each layer's
                         eigendecompositions and preconditioning run on one rank
                         (greedy by cost: dim_A^3 + dim_G^3 at first, then measured
                         seconds with rebalance) and the preconditioned
                         gradients are all-gathered. 0: every rank does every layer */
  int spread;         /* 1: with distribute and more than one rank, a layer whose
                         preconditioning is over 1/ranks of all layers' has its rows
                         spread over every rank (its owner decomposes and broadcasts
                         the eigenvectors). 0 (default): whole layers only. Same bits
                         either way; it pays where cores outnumber the ranks' work
                         (docs/adaptation.md, "K-FAC's step, stage by stage") */
  float sample;       /* (0, 1]: each factor from this fraction of the rows handed to
                         tide_trainer_kfac_add (a micro-batch's samples, a conv's
                         samples x positions), spread evenly over them and shifted
                         each factor step, weighted so that the factor's scale stays
                         the full one's. Default 0.25 (docs/adaptation.md, "Cheaper
                         factors"); 1: every row, as before it was an option */
  int max_dim;        /* a layer whose A or G is wider than this is not preconditioned:
                         it keeps its plain (averaged) gradient and costs no factor
                         work (its tide_trainer_kfac_add calls return 0 at once).
                         Preconditioning costs 2 dim_G dim_A (dim_G + dim_A)
                         multiply-adds a step and its decomposition dim^3, against
                         the layer's 3 x rows x dim_G dim_A of forward and backward,
                         so the widest factors pay least; but on the CNN leaving out
                         its widest layer (fc1, A 3137) undid K-FAC's gain in epochs
                         (docs/adaptation.md, "Cheaper factors"), so by default no
                         layer is left out. 0 (default): no layer is skipped */
  int diag_dim;       /* a layer whose A is wider than this uses A's diagonal (its
                         inputs' mean squares) instead of the whole A: no d_A^2
                         statistics, allreduce or decomposition, and its
                         preconditioning costs 2 dim_G^2 dim_A instead of
                         2 dim_G dim_A (dim_G + dim_A). 0 (default): every A whole */
  int staleness;      /* S >= 0 steps (above inverse_every: inverse_every). 0 (default):
                         the eigendecompositions run in the step that is due (every
                         inverse_every steps), on the step's critical path; on the
                         CNN, fresher decompositions reached 90% in fewer epochs than
                         hidden ones saved. S > 0: at an inverse step s > 0 each owner
                         copies its layers' just-reduced factors and decomposes them
                         on a background thread while the steps go on with the
                         decompositions in use; every rank swaps the new ones in at
                         step s + S (the spread layers' broadcast then; a job not
                         done by then is waited for). So step t preconditions with
                         the factors of step I floor((t - S) / I) (I = inverse_every),
                         or step 0's (decomposed in step 0) while that is < 0: the
                         same on every rank, and a checkpoint carries the pending
                         decompositions, so a resumed run (same staleness) goes on
                         bit for bit. tide_trainer_state_get and tide_trainer_destroy
                         wait for a running job (docs/adaptation.md, "Decompositions
                         off the critical path") */
  int lowrank;        /* >= 1, default 64: the eigenpairs a low-rank factor keeps (below) */
  int lowrank_dim;    /* a factor (A or G) wider than this (and than lowrank) is
                         decomposed at low rank: its top lowrank eigenpairs by
                         randomized subspace iteration (a fixed seed: same bits on
                         every rank and on resume), its other eigenvalues replaced by
                         their mean, so F ~ U^T diag(d_U) U + c (I - U^T U). The
                         decomposition costs about 4 (lowrank + 32) dim^2
                         multiply-adds instead of ssyevd's ~dim^3, and the
                         preconditioning shrinks with the kept ranks (the CNN's fc1,
                         A 3137 at rank 64 and G 128: 1/17 of the multiply-adds).
                         Such a layer is never spread; a diagonal A's layer keeps G
                         whole. Default 200 (on the CNN: conv2's A 289 and fc1's A
                         3137; on the MLP: fc1's A 785 and G 256, fc2's A 257);
                         0: every factor whole (docs/adaptation.md, "Low-rank factors") */
  int bucket_kb;      /* >= 0, default 0 (off: one factor allreduce in the step). N > 0:
                         the factor allreduce overlaps the backward pass (no wall-time
                         gain measured on a 2-core host: docs/adaptation.md). The
                         layers are cut, last first, into buckets of at least this
                         many KiB of packed factors; on a factor step's last
                         micro-batch, once tide_trainer_kfac_add has moved on from a
                         bucket whose layers all added A and G, its nonblocking
                         allreduce starts (the rest start when the micro-batch ends);
                         the bucket holding layer 0, the counts, and any layer added
                         to again after its bucket left, are all-reduced in the step.
                         Every rank gets the same bits; the sums' rounding differs
                         from one allreduce of everything (the ring's blocks follow
                         the message). Ranks may start a bucket at different points
                         (one that adds nothing starts it at the micro-batch's end), so
                         the caller must not run collectives of its own on the
                         trainer's communicator between a factor step's last
                         micro-batch's first tide_trainer_kfac_add and
                         tide_trainer_step (0 if it must). 0: one allreduce in the
                         step (docs/adaptation.md, "The factor allreduce during the
                         backward pass") */
  int rebalance;      /* 1 (default): with distribute and more than one rank, at each
                         inverse step after the first the owners share what their
                         layers cost them (the decompositions' seconds over
                         inverse_every, plus the mean preconditioning seconds a step),
                         and the layers are reassigned greedily by those measured
                         costs when that takes more than a tenth off the busiest
                         rank's load (rank 0 logs the new owners at INFO). Which rank
                         owns a layer changes no bit of the result. 0: the owners
                         stay those of the cost formula */
} tide_kfac_config_t;

/* One dense or conv layer: its weight tensor [out, in] or [out, c, kh, kw]
 * (in = c*kh*kw) and optionally its bias [out], as indices into the
 * trainer's tensors. in_dim and out_dim are the weight's; A is
 * (in_dim + 1 with a bias) square and G out_dim square. */
typedef struct {
  size_t weight;  /* tensor index of the weight (count = out_dim * in_dim) */
  long bias;      /* tensor index of the bias (count = out_dim), or -1 */
  int in_dim, out_dim;
} tide_kfac_layer_t;

typedef enum { TIDE_KFAC_A = 0, TIDE_KFAC_G = 1 } tide_kfac_factor_t;

/* Writes the defaults above. */
void tide_kfac_config_default(tide_kfac_config_t *out);
/* TIDE_EINVAL and a log line naming the field (e.g. "kfac.damping") for a
 * value out of range. */
int tide_kfac_config_check(const tide_kfac_config_t *config);
/* Sets the fields named in text, "key=value" pairs separated by ',' or ':'
 * with the keys factor_every, inverse_every, damping, factor_decay, kl_clip,
 * distribute, spread, sample, max_dim, diag_dim, staleness, lowrank,
 * lowrank_dim and bucket_kb (e.g.
 * "damping=0.003,inverse_every=50,sample=0.25"); the others keep
 * their value. Then checks the whole config. TIDE_EINVAL names an unknown
 * key or a bad value (*inout unchanged). */
int tide_kfac_config_parse(const char *text, tide_kfac_config_t *inout);

/* Turns K-FAC on for the trainer's layers[0..nlayers) (copied). Checked
 * against the trainer's tensors: TIDE_EINVAL names the bad field or layer
 * (tide_trainer_last_error says why) and nothing changes. Call before the
 * first step, with the same arguments on every rank (collective: the
 * layer-to-rank assignment is checked to agree). */
int tide_trainer_kfac(tide_trainer_t *tr, const tide_kfac_config_t *config, const tide_kfac_layer_t *layers,
                      size_t nlayers);
/* 1 when the step being accumulated updates the factors, so the caller
 * should hand its activations and output gradients to tide_trainer_kfac_add
 * for each micro-batch; 0 otherwise (or without K-FAC). */
int tide_trainer_kfac_wanted(const tide_trainer_t *tr);
/* Adds weight * X^T X to this micro-batch's factor `factor` of `layer`,
 * where X has `rows` rows of the factor's dimension without the bias
 * (in_dim for A, out_dim for G): row r, column j at x[r*ld + j], or at
 * x[j*ld + r] when transposed (feature-major data such as im2col patches).
 * For A of a layer with a bias, X gets a ones column first. Call any number
 * of times per micro-batch (e.g. chunk by chunk), between tide_trainer_next
 * and tide_trainer_step; a step's factor is the mean over its micro-batches
 * that added to it, then over the ranks that did. The weight sets the
 * factors' scale, which the damping is relative to: for the per-sample
 * Fisher of a mean loss over b samples, A takes 1/rows (a conv's b*oh*ow
 * positions are rows) and G, from the gradient of the mean loss, takes b
 * (nn_set_kfac_hook does this). x is read during the call only.
 * TIDE_EINVAL for a bad layer, factor, ld or weight; TIDE_ESTATE outside a
 * factor step's micro-batch. */
int tide_trainer_kfac_add(tide_trainer_t *tr, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows,
                          size_t ld, int transposed, float weight);

/* ---- data loader (docs/data.md) ------------------------------------------- */

/* A loader reads samples from a source (an ImageFolder directory, the same
 * behind an http(s):// URL, or Fashion-MNIST's idx files), keeps what it
 * fetched from a remote source in a per-node disk cache, decodes images
 * (PNG, JPEG) to uint8 pixels (height x width x channels), and keeps the
 * decoded samples in memory split across the job's hosts: each host holds
 * the samples it owns once, in shared memory its ranks map, and a rank gets
 * the others' samples through tide's transport, batched per step. Background
 * threads run the next `prefetch` steps ahead of the caller's. The order is
 * the trainer's (tide_sampler with the same seed, dealt per step as
 * tide_trainer_next deals it), so a fixed per-rank batch per step is
 * required: a policy that changes the batch (gns, pollux) cannot be used
 * with a loader (tide_loader_get returns TIDE_ESTATE).
 *
 * A loader is used by one thread at a time; open and close are collective
 * over comm (every rank opens the same source with the same config). */
typedef struct tide_loader tide_loader_t;

typedef enum {
  TIDE_BAD_SAMPLE_FAIL = 0, /* a corrupt or truncated image fails the call, naming the file */
  TIDE_BAD_SAMPLE_SKIP      /* it is delivered with label -1 and zero pixels, and counted */
} tide_bad_sample_t;

typedef struct {
  const char *source;    /* a directory, an http(s):// URL (serving index.txt) or
                            "fashion-mnist[:DIR]" */
  const char *split;     /* fashion-mnist: "train" (default) or "test" */
  const char *cache_dir; /* the disk cache; NULL: TIDE_DATA_CACHE, whose default caches
                            URLs only; "none": no cache */
  int height, width, channels; /* decoded shape (channels 1 or 3); 0: the first image's */
  int batch;             /* this rank's samples per step: the trainer's batch x accum (> 0) */
  uint64_t seed;         /* the trainer's seed (the same order) */
  uint64_t start_epoch;  /* data epoch of the first step (a resumed run) */
  int prefetch;          /* steps decoded and fetched ahead (>= 1, default 4) */
  int threads;           /* read and decode threads per rank (0: TIDE_DATA_THREADS) */
  tide_bad_sample_t on_bad_sample;
} tide_loader_config_t;

void tide_loader_config_default(tide_loader_config_t *out);

/* Opens the source and starts the prefetch threads; config is copied and
 * checked (TIDE_EINVAL names the field). Collective over comm (the loader
 * makes its own communicator from it: its traffic never meets comm's). A
 * missing source fails with a message naming it (after TIDE_DATA_RETRIES
 * attempts with back-off for a URL). */
int tide_loader_open(tide_comm_t *comm, const tide_loader_config_t *config, tide_loader_t **out);
/* Stops the threads (the ranks agree at the next step), frees everything.
 * Collective; NULL is fine. After tide_loader_get/next failed on this rank
 * (a bad sample, a source that stopped answering), the other ranks may be
 * mid-step and cannot agree: close then waits at most a second and leaves
 * the loader to the process's exit, so end the process after it (its
 * peers then see TIDE_EPEER). */
void tide_loader_close(tide_loader_t *loader);

/* Samples in the source (the trainer's dataset_size), its classes and the
 * decoded shape. */
uint64_t tide_loader_size(const tide_loader_t *loader);
size_t tide_loader_classes(const tide_loader_t *loader);
int tide_loader_shape(const tide_loader_t *loader, int *height, int *width, int *channels);

typedef struct {
  const uint8_t *pixels;  /* count x sample_bytes, owned by the loader, valid until the next call */
  const int32_t *labels;  /* count labels; -1 for a skipped bad sample */
  size_t count;
  size_t sample_bytes;    /* height x width x channels */
  uint64_t epoch;
  double wait_s;          /* how long this call waited for the prefetch threads */
  size_t skipped;         /* bad samples in this batch (TIDE_BAD_SAMPLE_SKIP) */
} tide_loader_batch_t;

/* The samples of the trainer's micro-batch (batch from tide_trainer_next):
 * a micro-batch 0 moves to the next step's prefetched data. TIDE_ESTATE
 * when batch is not the next one in the loader's plan; a bad sample under
 * TIDE_BAD_SAMPLE_FAIL is TIDE_EINVAL naming the file; a source that cannot
 * be read is TIDE_EIO/TIDE_ENOENT/TIDE_ETIMEDOUT naming the object. */
int tide_loader_get(tide_loader_t *loader, const tide_batch_t *batch, tide_loader_batch_t *out);
/* Without a trainer: this rank's share of the next step. */
int tide_loader_next(tide_loader_t *loader, tide_loader_batch_t *out);

typedef struct {
  uint64_t decoded;          /* samples this rank read and decoded into its host's store */
  uint64_t bad;              /* corrupt images met (skipped or failed) */
  uint64_t source_bytes;     /* bytes this rank read from the source */
  uint64_t source_requests;  /* objects it read from the source */
  uint64_t retries;          /* repeated requests to the source */
  uint64_t cache_hits, cache_misses, cache_bad; /* disk cache lookups; bad: failed checksums */
  uint64_t remote_samples;   /* samples received from other hosts */
  uint64_t remote_bytes;
  uint64_t store_bytes;      /* decoded-sample bytes this host's store holds (shared by its ranks) */
  uint64_t window_bytes;     /* this rank's prefetch window: slots x batch x sample bytes */
  double wait_s;             /* total time tide_loader_get/next waited */
} tide_loader_stats_t;

int tide_loader_stats(const tide_loader_t *loader, tide_loader_stats_t *out);

/* ---- cluster scheduling (docs/scheduling.md) ------------------------------ */

/* What a job's Pollux agent reports to the scheduler: its fitted
 * throughput model (fitted 0: none yet), its gradient noise statistics
 * (|G|^2 and the variance at the base batch, so the noise scale is
 * phi = base_batch * grad_var / grad_sqr), its batch limits, and the
 * largest number of workers it has been measured on. */
typedef struct {
  tide_pollux_model_t model;
  int fitted;
  double grad_sqr, grad_var;
  tide_pollux_limits_t limits;
  int max_replicas_seen;
} tide_sched_hints_t;

/* The hints as one line of text (at most TIDE_SCHED_HINTS_MAX bytes with
 * its NUL), as a job's agent publishes them in the job's store under
 * TIDE_SCHED_HINTS_KEY for the scheduler; decode(encode(h)) == h exactly.
 * TIDE_EINVAL for NULL, a buffer too small, or (decode) text that is not
 * all the fields once each, naming the field. *hints is written only on
 * success. Pure; any thread. */
#define TIDE_SCHED_HINTS_KEY "sched/hints"
#define TIDE_SCHED_HINTS_MAX 1024
int tide_sched_hints_encode(const tide_sched_hints_t *hints, char *buf, size_t len);
int tide_sched_hints_decode(const char *text, tide_sched_hints_t *hints);

/* A job's speedup function: speedup(nodes, slots) = the best goodput on
 * that allocation (tide_pollux_optimize) / the best goodput on one slot;
 * `slots` linear (speedup = slots) while the job has no model; never more
 * than at twice the largest allocation measured (slots beyond it count as
 * that many; at least 1). Values are memoised. One thread at a time per
 * object. */
typedef struct tide_speedup tide_speedup_t;
/* Copies *hints. TIDE_EINVAL names a bad field; TIDE_ENOMEM. */
int tide_speedup_create(const tide_sched_hints_t *hints, tide_speedup_t **out);
/* 0 for slots < 1 or nodes out of [1, slots]; otherwise > 0. */
double tide_speedup_eval(tide_speedup_t *sp, int nodes, int slots);
/* The most slots worth giving the job: twice the largest measured (>= 1). */
int tide_speedup_max_slots(const tide_speedup_t *sp);
void tide_speedup_destroy(tide_speedup_t *sp);
/* tide_speedup_eval as a callback for tide_sched_job_t.speedup. */
double tide_speedup_cb(void *sp, int nodes, int slots);

typedef enum {
  TIDE_SCHED_POLLUX,   /* maximise the power mean of speedups: genetic search */
  TIDE_SCHED_GREEDY,   /* the genetic search's greedy seed on its own */
  TIDE_SCHED_FIFO,     /* each job's requested size, in submission order */
  TIDE_SCHED_TIRESIAS, /* requested sizes, 2D least-attained-service queues */
  TIDE_SCHED_OPTIMUS   /* marginal time saved per slot, from each job's speedup */
} tide_sched_policy_t;

/* One job as the allocator sees it; the caller owns it and keeps `id`
 * stable across rounds (the allocator remembers jobs by it). */
typedef struct {
  uint64_t id;
  double submit_time;      /* s, on the caller's clock (now is the same clock) */
  int min_slots, max_slots; /* max_slots 0: no limit but the speedup's */
  int requested;            /* FIFO and Tiresias: the fixed size asked for */
  double attained;          /* slot-seconds run so far (Tiresias, priority) */
  double resize_cost;       /* s a change of its allocation costs it */
  int resizes;              /* changes of its allocation so far */
  double remaining;         /* Optimus: s left to run on one slot */
  /* speedup(arg, nodes, slots) (Pollux, greedy, Optimus); NULL: linear. */
  double (*speedup)(void *arg, int nodes, int slots);
  void *speedup_arg;
} tide_sched_job_t;

typedef struct {
  tide_sched_policy_t policy;
  double p;                 /* power-mean exponent (fairness), default -1 */
  int allow_interference;   /* 0 (default): one multi-node job per node at most */
  uint64_t seed;            /* the search is deterministic for a seed */
  int population, generations; /* 0: 100 and 100, fewer for large inputs */
  double tiresias_threshold;   /* slot-seconds of the first queue, default 16 h x 1 slot */
} tide_sched_options_t;

void tide_sched_options_init(tide_sched_options_t *opts);

/* The allocator over a pool of nodes; keeps state between rounds (the
 * Tiresias queues). One thread at a time. */
typedef struct tide_sched tide_sched_t;
/* nodes >= 1, slots[i] >= 1 per node (copied). TIDE_EINVAL names a bad
 * argument. */
int tide_sched_create(const tide_sched_options_t *opts, int nodes, const int *slots, tide_sched_t **out);
void tide_sched_destroy(tide_sched_t *s);
/* One allocation round at time `now`: jobs[0..njobs) with their current
 * allocation current[j * nodes + n] (slots of job j on node n; NULL: none
 * running) give next[j * nodes + n], which respects node capacity, each
 * job's min/max and (unless allowed) one multi-node job per node. A job may
 * get 0 slots (queued). TIDE_EINVAL names a bad job or current allocation;
 * TIDE_ENOMEM. */
int tide_sched_allocate(tide_sched_t *s, double now, const tide_sched_job_t *jobs, int njobs, const int *current,
                        int *next);
/* The Pollux objective of allocation alloc (as tide_sched_allocate's
 * next): the power mean of the jobs' speedups with the reallocation
 * penalty, higher is better. NAN for bad arguments. */
double tide_sched_fitness(tide_sched_t *s, double now, const tide_sched_job_t *jobs, int njobs, const int *current,
                          const int *alloc);
/* "pollux", "greedy", "fifo", "tiresias", "optimus" and back; parse:
 * TIDE_EINVAL for an unknown name. */
const char *tide_sched_policy_name(tide_sched_policy_t policy);
int tide_sched_policy_parse(const char *name, tide_sched_policy_t *out);

/* The trace-driven cluster simulator (docs/scheduling.md): the jobs of a
 * workload CSV (name,time,application,num_replicas,batch_size) run on
 * `nodes` x `slots` slots; each job's throughput is interpolated from
 * TRACES/APP/placements.csv and scalability.csv and its progress per step
 * from the statistical efficiency of its batch (validation-B.csv); it is
 * complete after the progress of its last epoch. Under Pollux each job's
 * agent fits its model to what it has run on so far and picks its batch. */
typedef struct {
  tide_sched_options_t sched;
  int nodes, slots;         /* default 16 x 4 */
  double interval;          /* s between allocation rounds, default 60 */
  double resize_cost;       /* s each change of a job's allocation costs, default 30 */
  double start_cost;        /* s a job's first allocation costs it (launch, rendezvous); -1
                               (default): resize_cost */
  int start_at_once;        /* 1: a job submitted between rounds starts then on one free slot, as tide
                               sched starts it (not fifo, tiresias); 0 (default): at the next round */
  double interference;      /* slowdown in [0, 1) of a multi-node job sharing a node with another */
  double arrival_scale;     /* submission times multiplied by it, default 1 */
  int copies;               /* each job submitted this many times, default 1 */
  double max_time;          /* give up after this much simulated time, default 30 days */
  /* Called after each round with the fraction of jobs complete; NULL: none. */
  void (*progress)(void *arg, double done, double now);
  void *progress_arg;
} tide_sim_options_t;

void tide_sim_options_init(tide_sim_options_t *opts);

/* One simulated job's outcome (times in s from the workload's start). */
typedef struct {
  char name[64], application[32];
  double submit, start, finish; /* start, finish < 0: never started, not complete */
  int resizes;                  /* allocation changes after its start */
  double batch;                 /* last global batch */
} tide_sim_job_t;

typedef struct tide_sim_result tide_sim_result_t;

/* Runs one workload under opts->sched.policy. TIDE_ENOENT with a message
 * naming a missing file; TIDE_EINVAL naming file:line of a malformed line,
 * an unknown application or a bad option; TIDE_ENOMEM. *out owned by the
 * caller (tide_sim_result_free). Any thread; runs are independent. */
int tide_sim_run(const tide_sim_options_t *opts, const char *traces_dir, const char *workload_csv,
                 tide_sim_result_t **out);
void tide_sim_result_free(tide_sim_result_t *r);
/* The jobs in workload order (borrowed from r); returns their number. */
int tide_sim_result_jobs(const tide_sim_result_t *r, const tide_sim_job_t **jobs);
/* The mean JCT of the complete jobs (NAN if none), and how many are not. */
double tide_sim_result_avg_jct(const tide_sim_result_t *r, int *incomplete);
/* The last completion time. */
double tide_sim_result_makespan(const tide_sim_result_t *r);
/* Mean and longest seconds (wall clock) one allocation round took. */
void tide_sim_result_round_time(const tide_sim_result_t *r, double *mean_s, double *max_s);
/* Writes runs[0..n) to path as JSON: per run its policy, workload, each
 * job's submit, start, finish and JCT, the average JCT, makespan, round
 * times and the allocation timeline ([time, [[job, node, slots]...]] per
 * round); then the mean over runs of the average JCT per policy.
 * TIDE_EIO names a file it cannot write. */
int tide_sim_write_summary(const tide_sim_result_t *const *runs, int n, const char *path);
/* Writes plots of runs[0..n) into dir: data files, a gnuplot script
 * plots.gp and, when gnuplot is on PATH, jct-cdf.png (one curve per
 * policy over all its runs), slots.png (slots in use over time, first run
 * of each policy) and allocation-POLICY.png (each job's slots over time,
 * first run of each policy). *plotted: 1 when gnuplot drew them.
 * TIDE_EIO names a file it cannot write. */
int tide_sim_plot(const tide_sim_result_t *const *runs, int n, const char *dir, int *plotted);

/* One application of the Pollux traces (TRACES/NAME/placements.csv,
 * scalability.csv, validation-B.csv) for a live job that replays it
 * (tools/tide-replay.c): the same step times and progress the simulator
 * uses. One thread at a time per object. */
typedef struct tide_trace_app tide_trace_app_t;
/* TIDE_ENOENT names a missing file, TIDE_EINVAL file:line of a bad one. */
int tide_trace_app_open(const char *traces_dir, const char *name, tide_trace_app_t **out);
void tide_trace_app_close(tide_trace_app_t *app);
/* Its batch limits: base (smallest measured) and largest global batch,
 * micro-batch bounds per worker. */
int tide_trace_app_limits(const tide_trace_app_t *app, tide_pollux_limits_t *out);
/* Seconds of one step (*step_s, the gradient exchange included) and of
 * its exchange (*sync_s) with `local` samples per worker and counts[n]
 * workers on node n of `nodes`. TIDE_EINVAL for a count < 1. */
int tide_trace_app_time(const tide_trace_app_t *app, const int *counts, int nodes, double local, double *step_s,
                        double *sync_s);
/* The progress one step of global batch `batch` makes when the job has
 * made `progress` (AdaScale's gain from the noise statistics of that epoch,
 * at least 1); NaN for bad arguments. */
double tide_trace_app_gain(const tide_trace_app_t *app, double batch, double progress);
/* The gradient noise statistics at global batch `batch` when the job has
 * made `progress` (those of that epoch, interpolated between the measured
 * batches): *grad_sqr = |G|^2 and *grad_var = the gradient's variance at
 * the base batch (so a micro-batch of m samples has variance
 * grad_var * base_batch / m). TIDE_EINVAL for bad arguments. */
int tide_trace_app_noise(const tide_trace_app_t *app, double batch, double progress, double *grad_sqr,
                         double *grad_var);
/* The progress that completes the application (its last epoch's). */
double tide_trace_app_total(const tide_trace_app_t *app);

/* ---- the live cluster scheduler (tide sched; docs/scheduling.md) ---------- */

/* `tide sched`: a daemon that shares a pool of slots among elastic jobs
 * (each run by `tiderun --elastic` under a keeper process that outlives
 * the daemon), reallocating them every interval with tide_sched_allocate
 * and applying each change in place (tide_elastic_request). Its state is
 * in dir (jobs/ID/: the submission, state, log, exit status), so a
 * restarted daemon finds its jobs again; clients talk to it over the Unix
 * socket dir/sock. */
typedef struct {
  const char *dir;        /* state directory (created, mode 0700) */
  int nodes;              /* hosts in the pool; with more than one, each host runs an agent
                             (tide_sched_agent) and the jobs' workers run there */
  const int *slots;       /* slots per host; NULL (the default): the Slurm allocation this
                             runs in (salloc, sbatch: SLURM_JOB_ID and SLURM_JOB_NODELIST set),
                             its nodes in order, slots_per_node slots each, else each node's
                             CPUs (SLURM_JOB_CPUS_PER_NODE, "4(x2),2"); the daemon then starts
                             one agent per node itself (one `srun --ntasks-per-node=1 --overlap
                             TIDE sched --agent --dir DIR` step) and stops that step when it
                             stops. TIDE_EINVAL naming the variable for a malformed one */
  const char *const *hosts; /* host names (NULL: "localhost") */
  double interval;        /* s between allocation rounds (> 0) */
  tide_sched_options_t sched; /* policy, p, seed ... */
  const char *tiderun;    /* the launcher's path */
  double resize_cost;     /* s a change costs a job (the allocator's penalty) until the job's
                             own is measured (decision to membership), default 0.1 */
  int quiet;              /* 1: no line per decision on stderr */
  const char *address;    /* several hosts: this host's address as the agents and workers reach it
                             (NULL: the local address of the route to the first pool host that is
                             not this one, never a loopback one such as Debian's 127.0.1.1 for the
                             host's own name; TIDE_EINVAL saying to give it when that cannot be
                             found); the jobs' stores and the agents' control store listen there */
  int slots_per_node;     /* > 0: with slots NULL, the slots of every node of the Slurm allocation
                             (0: its CPUs) */
  const char *tide;       /* with slots NULL: the tide program the agents run (NULL: "tide"
                             beside tiderun) */
} tide_sched_daemon_options_t;

void tide_sched_daemon_options_init(tide_sched_daemon_options_t *opts);
/* Runs the daemon until SIGINT or SIGTERM (the jobs go on; a new daemon
 * on the same dir takes them over). TIDE_EINVAL names a bad option;
 * TIDE_ESTATE when another daemon serves dir; TIDE_EIO naming a file or
 * socket it cannot use, or when the agents' srun step (a Slurm pool) ends
 * under it. Call from the main thread of a process that has
 * no other threads (it forks the jobs' keepers). */
int tide_sched_serve(const tide_sched_daemon_options_t *opts);
/* The client's side, for any process: a request to the daemon serving
 * dir. submit: argv[0..argc) run in cwd with envp (NULL-terminated) as
 * one elastic job of min_np..max_np workers, np the fixed size it asks
 * for (FIFO and Tiresias run it at that size; 0: max_np); *id gets its id
 * (cap bytes).
 * jobs: *text (free with tide_free) gets a table of the jobs. cancel: ends
 * job `job` (its id or name) and every process of it. TIDE_ENOENT with a
 * message when no daemon serves dir; TIDE_EINVAL with the daemon's message
 * for a request it refuses. */
int tide_sched_submit(const char *dir, const char *name, int min_np, int max_np, int np, const char *cwd, int argc,
                        char *const *argv, char *const *envp, char *id, size_t cap);
/* The options of a submission (tide_sched_submit_job). */
typedef struct {
  const char *name; /* a label (NULL or "": job<ID>), at most 63 characters, no spaces */
  int min_np, max_np; /* an elastic (foreground) job's size range; 0 for a background job */
  int np;           /* the fixed size a foreground asks for (0: max_np); a background job's workers */
  int background;   /* 1: a background job (tide submit --background; docs/scheduling.md,
                       "Background jobs"): it takes no slots from the allocator; np workers run on
                       the local host at the lowest CPU priority (tiderun --background), and its
                       trainer's guard pauses it at step boundaries while any running foreground
                       job of this scheduler is slowed (TIDE_GUARD_PERCENT of its solo step time),
                       following the foreground set as jobs start and end. One-host pools only. */
} tide_sched_submit_options_t;
void tide_sched_submit_options_init(tide_sched_submit_options_t *opts);
/* tide_sched_submit with options: TIDE_EINVAL with the daemon's message
 * for a combination it refuses (a background job with min_np or max_np, or
 * without np >= 1, or more workers than the pool's slots, or on a pool of
 * several hosts). */
int tide_sched_submit_job(const char *dir, const tide_sched_submit_options_t *opts, const char *cwd, int argc,
                          char *const *argv, char *const *envp, char *id, size_t cap);
/* Under tide sched, the keys of a background job's own store: the running
 * foregrounds ("HOST:PORT TOKEN" per line; tide sched writes it, the guard
 * follows it) and the guard's progress ("STEP running|paused PAUSES";
 * tide jobs shows it). */
#define TIDE_MULTIPLEX_FOREGROUNDS_KEY "multiplex/foregrounds"
#define TIDE_MULTIPLEX_PROGRESS_KEY "multiplex/progress"
int tide_sched_jobs(const char *dir, char **text);
int tide_sched_cancel(const char *dir, const char *job);
/* The state of job `job` (id or name) as one word in buf: pending,
 * running, cancelling, done, failed or cancelled. */
int tide_sched_job_state(const char *dir, const char *job, char *buf, size_t cap);
/* The default state directory: $XDG_RUNTIME_DIR/tide-sched, else
 * /tmp/tide-sched-$USER. */
int tide_sched_default_dir(char *buf, size_t cap);
/* The per-host agent of a multi-host tide sched (`tide sched --agent`):
 * connects to the control store the daemon serving dir advertises in
 * dir/control (dir on a file system every host shares), then starts and
 * stops the workers the daemon places on host `node` (its index in the
 * pool), reports their exits, and beats every 0.5 s. Runs until SIGINT or
 * SIGTERM (its workers get SIGTERM). Call from the main thread. */
int tide_sched_agent(const char *dir, int node);

/* ---- burst-parallel planning (DeepPool; docs/burst-parallel.md) ----------- */

/* A per-layer profile: for each layer of a model its inputs (the graph),
 * parameter bytes, activation bytes per sample, and its forward and backward
 * time on one worker at each profiled per-worker batch. Read from tide's
 * profile format or DeepPool's A100 files (tide_profile_read), written by
 * `tide profile` (nn_profile, include/tide_nn.h, measures tide's own models).
 * Threads: one thread builds a profile; once built, any number may read
 * it. */
typedef struct tide_profile tide_profile_t;

enum { TIDE_PROFILE_MAX_INPUTS = 8 };

typedef struct {
  char name[96];        /* e.g. "conv2d{...}[3,224,224]" or "dense:128" */
  int ninputs;          /* 1..TIDE_PROFILE_MAX_INPUTS */
  int inputs[TIDE_PROFILE_MAX_INPUTS]; /* earlier layers' indices; -1: the model's input */
  double param_bytes;   /* bytes of parameters (and so of their gradient) */
  double act_bytes;     /* bytes of this layer's output per sample */
} tide_profile_layer_t;

/* An empty profile for `model` (a name, <= 63 chars). */
int tide_profile_create(const char *model, tide_profile_t **out);
void tide_profile_destroy(tide_profile_t *p);
/* Appends a layer (its inputs must be earlier layers or -1); *index gets
 * its index (may be NULL). TIDE_EINVAL naming the bad field. */
int tide_profile_add_layer(tide_profile_t *p, const tide_profile_layer_t *layer, int *index);
/* Sets layer's forward and backward seconds at per-worker batch (>= 1);
 * a batch seen first here is added to the profile's batches. */
int tide_profile_set_time(tide_profile_t *p, int layer, int batch, double fwd_s, double bwd_s);
const char *tide_profile_model(const tide_profile_t *p);
int tide_profile_layer_count(const tide_profile_t *p);
/* Borrowed from p; NULL outside [0, count). */
const tide_profile_layer_t *tide_profile_layer(const tide_profile_t *p, int layer);
/* The profiled batches, ascending (borrowed); returns their number. */
int tide_profile_batches(const tide_profile_t *p, const int **batches);
/* Forward + backward seconds of layer at per-worker batch b >= 1:
 * profiled value, linear between profiled batches, the smallest batch's
 * time below it, and linear in b (t(bmax) b / bmax) above the largest.
 * NAN when the layer has no time at some profiled batch. */
double tide_profile_time(const tide_profile_t *p, int layer, int batch);
/* Reads a profile: tide's format (first line "tide-profile 1") or a
 * DeepPool profile file (blocks of "#config ..." / "sum:" lines; `section`
 * names a "#NAME" section such as "RESNET152", NULL: the first). TIDE_ENOENT
 * naming a missing file, TIDE_EINVAL naming file:line of a malformed line.
 * *out owned by the caller. */
int tide_profile_read(const char *path, const char *section, tide_profile_t **out);
/* Writes p in tide's format. TIDE_EIO names a file it cannot write. */
int tide_profile_write(const tide_profile_t *p, const char *path);

typedef struct {
  int workers;            /* W, a power of two >= 1 */
  int global_batch;       /* B >= 1 */
  double amplification;   /* limit on every layer, >= 1; default 2.0 */
  double bandwidth;       /* bytes/s per worker link; default 2.66e11 (DeepPool's A100 constant) */
  double latency;         /* s per message; default 40e-6 */
  int data_parallel;      /* 1: every layer at width W (the baseline); default 0 */
  int cores;              /* the W workers share this many cores (CPU ranks on one host): a layer on w > cores
                             workers computes w / cores times slower; 0 (default): a core (accelerator) each */
  double time_slack;      /* >= 1: the plan with the least worker-time among those within time_slack x the
                             fastest plan's iteration time (workers left for a background job); 1 (default):
                             the fastest plan */
} tide_plan_options_t;

void tide_plan_options_init(tide_plan_options_t *opts);

/* One layer of a plan and its predicted costs (s). */
typedef struct {
  int width;            /* workers it runs on, a power of two <= W */
  double compute;       /* forward + backward at per-worker batch ceil(B / width) */
  double sync;          /* all-reduce of its gradient among its width workers */
  double transfer;      /* moving its inputs (forward) and their gradients (backward) */
  double amplification; /* width (compute + sync) / compute at width 1 */
} tide_plan_layer_t;

typedef struct tide_plan tide_plan_t;

/* Chooses each layer's width to minimise the predicted iteration time with
 * every layer's amplification <= opts->amplification (ties: less
 * worker-time), or with opts->time_slack > 1 the worker-time within that
 * slack of the fastest time (the program on time + lambda x worker-time, a
 * few dozen times over, lambda searched; the plans found lie on the convex
 * hull of the time/worker-time trade-off): a dynamic program over layers x
 * widths; a branch block (one
 * layer forking into chains that one layer joins) is planned as the sum of
 * its chains given the fork's and the join's widths. Graphs with nested
 * branches give TIDE_EINVAL naming the layer, as does a bad
 * option (W not a power of two, ...). *out owned by the caller. */
int tide_plan_create(const tide_profile_t *p, const tide_plan_options_t *opts, tide_plan_t **out);
/* The costs of given widths (one per layer) under the same model: for
 * checking a plan file or a search. TIDE_EINVAL names a width that is not a
 * power of two in [1, W]. Ignores the amplification limit (see
 * tide_plan_feasible). */
int tide_plan_evaluate(const tide_profile_t *p, const tide_plan_options_t *opts, const int *widths,
                       tide_plan_t **out);
void tide_plan_destroy(tide_plan_t *plan);
/* Layers (borrowed; count = the profile's layer count). */
int tide_plan_layers(const tide_plan_t *plan, const tide_plan_layer_t **layers);
/* Predicted iteration time and worker-time (s x workers: each layer's
 * width x (compute + sync), each transfer x the larger width). */
double tide_plan_iteration_time(const tide_plan_t *plan);
double tide_plan_worker_time(const tide_plan_t *plan);
/* 1 when every layer's amplification is <= limit (1e-9 relative slack). */
int tide_plan_feasible(const tide_plan_t *plan, double limit);
/* Writes the plan as JSON (model, options, per-layer width and costs,
 * totals). TIDE_EIO names a file it cannot write. */
int tide_plan_write(const tide_plan_t *plan, const tide_profile_t *p, const char *path);
/* Reads the widths of a plan file written by tide_plan_write for profile p
 * into widths[count of p's layers]. TIDE_EINVAL naming file and field: a
 * plan for another model or layer count, a width not a power of two or
 * above workers. */
int tide_plan_read_widths(const char *path, const tide_profile_t *p, int workers, int *widths);
/* Writes PREFIX-widths.dat (per layer: width and costs), PREFIX-sweep.dat
 * (iteration time and worker-time of plans for limits 1 to 64 under
 * opts, and data parallelism's), PREFIX.gp and, when gnuplot is on PATH,
 * PREFIX-widths.png and PREFIX-sweep.png (*plotted = 1). TIDE_EIO names a
 * file it cannot write. */
int tide_plan_plot(const tide_plan_t *plan, const tide_profile_t *p, const tide_plan_options_t *opts,
                   const char *prefix, int *plotted);

/* Cluster simulation (DeepPool's multiplexing; docs/burst-parallel.md): a
 * foreground job runs a plan on opts->workers accelerators and a background
 * job fills, in pieces that never delay the foreground, the spans in which
 * an accelerator has no foreground work (neither a layer's compute and
 * all-reduce nor a transfer it takes part in). */
typedef struct {
  const tide_profile_t *background; /* the background job's profile (borrowed; may be the foreground's); NULL: none */
  int background_batch; /* its batch on one accelerator; 0 (default): its profiled batch with the most samples/s */
  double piece;         /* s: each background piece fits one idle span; default 0.5e-3 (DeepPool's); 0: any length */
  int comm_idle;        /* 1: the background also runs while an accelerator only communicates (transfers,
                           all-reduces), for data parallelism too; default 0: communication keeps it busy */
} tide_cluster_options_t;

void tide_cluster_options_init(tide_cluster_options_t *opts);

typedef struct {
  int workers, background_batch;
  double iteration_time, dp_iteration_time; /* s: the plan's, plain data parallelism's */
  double foreground_rate;  /* samples/s: global batch / iteration time */
  double background_rate;  /* samples/s of the background over the cluster */
  double total_rate;       /* the two together */
  double dp_rate;          /* plain data parallelism with the same foreground, alone (it leaves no idle span) */
  double gain;             /* total_rate / dp_rate */
  double idle_fraction;    /* of the accelerators' time without foreground work: 1 - worker-time / (W T) */
  double usable_fraction;  /* of the accelerators' time the background's pieces fill */
  double background_per_accelerator; /* samples/s of the background alone on one accelerator */
  double dp_background_rate; /* samples/s a background gets beside data parallelism (0 unless comm_idle) */
} tide_cluster_result_t;

/* Simulates the foreground plan (NULL: tide_plan_create's for p and opts)
 * against data parallelism on the same profile and options. TIDE_EINVAL
 * names a bad option or a profile without times. Any thread. */
int tide_cluster_simulate(const tide_profile_t *p, const tide_plan_options_t *opts, const tide_plan_t *plan,
                          const tide_cluster_options_t *copts, tide_cluster_result_t *out);

#ifdef __cplusplus
}
#endif

#endif
