/* The rendezvous store server: one thread, one poll() loop over a wake
 * eventfd, the listening socket and every connection. All socket I/O is
 * nonblocking with per-connection input and output buffers, so a slow or
 * stuck client never holds up the others; even the job-token handshake is a
 * per-connection state, not a blocking call.
 *
 * GET and WAIT requests whose keys are missing are parked on their
 * connection (its later requests wait behind it, so answers stay in order)
 * and answered by the SET/ADD that creates the last key, or by the loop when
 * their deadline passes. Watch connections receive a frame for every SET of
 * an "event/" key; one that closes without BYE publishes
 * "event/lost/<name>". Wire format: protocol.h.
 *
 * Threads: start, port and stop from one thread; everything else runs on the
 * server thread and needs no locks. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/protocol.h"

/* Bytes a connection reads per turn beyond the frame it is in. */
#define READ_CHUNK (64 * 1024)
/* Most an incomplete frame's buffer grows per read, so memory follows what a
 * client actually sent rather than what its header claims. */
#define READ_MAX (4 * 1024 * 1024)
/* A connection with more unsent output than this is not reading (a watcher
 * that stopped polling): close it rather than buffer without end. */
#define OUT_LIMIT ((size_t)64 * 1024 * 1024)
/* Buffers larger than this are freed once empty, so one big value does not
 * pin memory for the life of the connection. */
#define BUF_KEEP (1024 * 1024)
/* Time a new connection has to prove the job token. */
#define AUTH_TIMEOUT_MS 5000
/* Parked requests wait at most this long, which keeps deadline arithmetic
 * far from overflow. */
#define MAX_WAIT_MS INT32_MAX

/* Connections that have not proved the token yet, at most; a new one past
 * this closes the oldest (a silent one first), so strangers can neither use
 * up the descriptors nor keep a real client out for long. Lowered to a
 * quarter of RLIMIT_NOFILE when that is smaller. */
#define MAX_PENDING 256

typedef struct {
  uint8_t *data;
  size_t off, len, cap; /* bytes [off, len) are pending */
} buf_t;

enum { CONN_AUTH, CONN_READY, CONN_WATCH };

typedef struct {
  int fd;
  int state;
  bool dead;     /* closed and freed at the top of the next loop turn */
  bool said_bye; /* a watch that said goodbye: its close publishes nothing */
  char peer[64]; /* "1.2.3.4:5678" for log lines */
  uint8_t hello[TIDE__AUTH_HELLO_BYTES];
  int64_t auth_deadline_ns;
  buf_t in, out;
  /* The parked GET or WAIT (parked_op 0: none). Keys before parked_next
   * have been seen to exist. */
  uint32_t parked_op;
  char *parked_blob; /* the keys, each NUL-terminated */
  char **parked_keys;
  size_t parked_count, parked_next;
  int64_t parked_deadline_ns;
  char *watch_name;
} conn_t;

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  uint8_t *value;
  size_t value_len;
  size_t key_len;
  char key[]; /* NUL-terminated; keys never contain NUL */
} entry_t;

struct tide_store_server {
  int listen_fd, wake_fd, port;
  char *token;
  uint64_t max_value;
  pthread_t thread;
  conn_t **conns;
  size_t conn_count, conn_cap;
  struct pollfd *pfds;
  size_t pfd_cap;
  entry_t **buckets;
  size_t bucket_count, key_count;
  int64_t accept_paused_until_ns;
  size_t max_pending; /* handshakes in progress at most (MAX_PENDING) */
  _Atomic size_t clients; /* conn_count, for other threads */
};

/* ---- buffers ---- */

static size_t buf_pending(const buf_t *b) { return b->len - b->off; }

/* Makes room for `extra` bytes after the pending ones. */
static int buf_reserve(buf_t *b, size_t extra) {
  if (b->cap - b->len >= extra) return 0;
  size_t pending = buf_pending(b);
  if (b->off > 0) {
    memmove(b->data, b->data + b->off, pending);
    b->off = 0;
    b->len = pending;
    if (b->cap - b->len >= extra) return 0;
  }
  size_t cap = b->cap > 0 ? b->cap : 4096;
  while (cap - pending < extra) cap *= 2;
  uint8_t *data = tide__realloc(b->data, cap);
  if (data == NULL) return TIDE_ENOMEM;
  b->data = data;
  b->cap = cap;
  return 0;
}

static void buf_consume(buf_t *b, size_t n) {
  b->off += n;
  if (b->off < b->len) return;
  b->off = b->len = 0;
  if (b->cap > BUF_KEEP) {
    tide__free(b->data);
    b->data = NULL;
    b->cap = 0;
  }
}

/* ---- key table: chained hash, doubled when it averages one key a bucket ---- */

/* The link that points at key's entry, or at the NULL ending its chain. */
static entry_t **table_link(tide_store_server_t *s, const char *key, size_t len, uint64_t h) {
  entry_t **link = &s->buckets[h & (s->bucket_count - 1)];
  while (*link != NULL) {
    entry_t *e = *link;
    if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0) break;
    link = &e->next;
  }
  return link;
}

static entry_t *table_find(tide_store_server_t *s, const char *key, size_t len) {
  return *table_link(s, key, len, tide__fnv1a(key, len));
}

static void table_grow(tide_store_server_t *s) {
  size_t count = s->bucket_count * 2;
  entry_t **buckets = tide__calloc(count, sizeof *buckets);
  if (buckets == NULL) return; /* longer chains, still correct */
  for (size_t i = 0; i < s->bucket_count; i++) {
    entry_t *e = s->buckets[i];
    while (e != NULL) {
      entry_t *next = e->next;
      e->next = buckets[e->hash & (count - 1)];
      buckets[e->hash & (count - 1)] = e;
      e = next;
    }
  }
  tide__free(s->buckets);
  s->buckets = buckets;
  s->bucket_count = count;
}

/* Inserts or replaces key with a copy of value; NULL when out of memory
 * (the old value, if any, is kept). */
static entry_t *table_put(tide_store_server_t *s, const char *key, size_t key_len,
                          const void *value, size_t value_len) {
  uint8_t *copy = tide__malloc(value_len);
  if (copy == NULL) return NULL;
  if (value_len > 0) memcpy(copy, value, value_len);
  uint64_t h = tide__fnv1a(key, key_len);
  entry_t **link = table_link(s, key, key_len, h);
  entry_t *e = *link;
  if (e == NULL) {
    e = tide__malloc(sizeof *e + key_len + 1);
    if (e == NULL) {
      tide__free(copy);
      return NULL;
    }
    e->next = NULL;
    e->hash = h;
    e->value = NULL;
    e->key_len = key_len;
    memcpy(e->key, key, key_len);
    e->key[key_len] = '\0';
    *link = e;
    if (++s->key_count > s->bucket_count) table_grow(s);
  }
  tide__free(e->value);
  e->value = copy;
  e->value_len = value_len;
  return e;
}

static int table_delete(tide_store_server_t *s, const char *key, size_t len) {
  entry_t **link = table_link(s, key, len, tide__fnv1a(key, len));
  entry_t *e = *link;
  if (e == NULL) return TIDE_ENOENT;
  *link = e->next;
  tide__free(e->value);
  tide__free(e);
  s->key_count--;
  return 0;
}

static void table_free(tide_store_server_t *s) {
  for (size_t i = 0; i < s->bucket_count; i++) {
    entry_t *e = s->buckets[i];
    while (e != NULL) {
      entry_t *next = e->next;
      tide__free(e->value);
      tide__free(e);
      e = next;
    }
  }
  tide__free(s->buckets);
}

/* ---- connection output ---- */

static void conn_flush(conn_t *c) {
  while (!c->dead && buf_pending(&c->out) > 0) {
    ssize_t n = send(c->fd, c->out.data + c->out.off, buf_pending(&c->out),
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      buf_consume(&c->out, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    TIDE_DEBUG("store: connection from %s went away while we sent: %s", c->peer,
               n < 0 ? strerror(errno) : "closed");
    c->dead = true;
  }
}

/* Queues a then b (either may be empty) and sends what the socket takes now. */
static void conn_write(conn_t *c, const void *a, size_t a_len, const void *b, size_t b_len) {
  if (c->dead) return;
  if (buf_pending(&c->out) > OUT_LIMIT) {
    TIDE_WARN("store: closing connection from %s: it has left %zu bytes of answers and events "
              "unread", c->peer, buf_pending(&c->out));
    c->dead = true;
    return;
  }
  if (buf_reserve(&c->out, a_len + b_len) != 0) {
    TIDE_WARN("store: closing connection from %s: out of memory for %zu bytes of output",
              c->peer, a_len + b_len);
    c->dead = true;
    return;
  }
  if (a_len > 0) memcpy(c->out.data + c->out.len, a, a_len);
  c->out.len += a_len;
  if (b_len > 0) memcpy(c->out.data + c->out.len, b, b_len);
  c->out.len += b_len;
  conn_flush(c);
}

static void respond(conn_t *c, int32_t status, int64_t result, const void *value, size_t len) {
  tide__store_response_t resp = {status, len, result};
  uint8_t head[TIDE__STORE_RESPONSE_BYTES];
  tide__store_response_encode(head, &resp);
  conn_write(c, head, sizeof head, value, len);
}

/* A server-to-watcher frame: EVENT(key, value) or BYE. */
static void push(conn_t *c, uint32_t op, const char *key, size_t key_len, const void *value,
                 size_t value_len) {
  uint8_t head[TIDE__STORE_REQUEST_BYTES + TIDE__STORE_MAX_KEY];
  tide__store_request_t req = {op, (uint32_t)key_len, value_len, 0};
  tide__store_request_encode(head, &req);
  if (key_len > 0) memcpy(head + TIDE__STORE_REQUEST_BYTES, key, key_len);
  conn_write(c, head, TIDE__STORE_REQUEST_BYTES + key_len, value, value_len);
}

/* Logs why (a stranger can make this happen at will: rate-limited) and
 * marks the connection for closing. */
static void conn_drop(conn_t *c, const char *what, const char *why) {
  static tide__ratelimit_t limit;
  TIDE_WARN_RATELIMITED(&limit, "store: %s %s: %s", what, c->peer, why);
  c->dead = true;
}

/* ---- parked requests ---- */

static void unpark(conn_t *c) {
  tide__free(c->parked_blob);
  tide__free(c->parked_keys);
  c->parked_blob = NULL;
  c->parked_keys = NULL;
  c->parked_op = 0;
  c->parked_count = c->parked_next = 0;
}

/* Moves past keys that exist; true when none is missing. */
static bool park_advance(tide_store_server_t *s, conn_t *c) {
  while (c->parked_next < c->parked_count) {
    const char *key = c->parked_keys[c->parked_next];
    if (table_find(s, key, strlen(key)) == NULL) return false;
    c->parked_next++;
  }
  return true;
}

static void park_finish(tide_store_server_t *s, conn_t *c, int32_t status) {
  if (status == TIDE__STORE_OK && c->parked_op == TIDE__STORE_OP_GET) {
    const char *key = c->parked_keys[0];
    entry_t *e = table_find(s, key, strlen(key));
    respond(c, TIDE__STORE_OK, 0, e->value, e->value_len);
  } else {
    respond(c, status, 0, NULL, 0);
  }
  unpark(c);
}

/* Answers the parked requests whose next missing key is `key`. Their
 * connections' later requests are picked up by drain_input(). */
static void wake_parked(tide_store_server_t *s, const char *key) {
  for (size_t i = 0; i < s->conn_count; i++) {
    conn_t *c = s->conns[i];
    if (c->dead || c->parked_op == 0) continue;
    if (strcmp(c->parked_keys[c->parked_next], key) != 0) continue;
    if (park_advance(s, c)) park_finish(s, c, TIDE__STORE_OK);
  }
}

/* Parks GET or WAIT on keys (`blob`: count NUL-terminated keys, blob_len
 * bytes), or answers at once when they all exist or timeout_ms is 0. */
static void park(tide_store_server_t *s, conn_t *c, uint32_t op, const char *blob,
                 size_t blob_len, size_t count, int64_t timeout_ms) {
  c->parked_op = op;
  c->parked_blob = tide__malloc(blob_len);
  c->parked_keys = tide__calloc(count, sizeof *c->parked_keys);
  if (c->parked_blob == NULL || c->parked_keys == NULL) {
    unpark(c);
    respond(c, TIDE__STORE_ENOMEM, 0, NULL, 0);
    return;
  }
  memcpy(c->parked_blob, blob, blob_len);
  char *key = c->parked_blob;
  for (size_t i = 0; i < count; i++) {
    c->parked_keys[i] = key;
    key += strlen(key) + 1;
  }
  c->parked_count = count;
  if (park_advance(s, c)) {
    park_finish(s, c, TIDE__STORE_OK);
    return;
  }
  if (timeout_ms == 0) {
    park_finish(s, c, TIDE__STORE_ETIMEDOUT);
    return;
  }
  c->parked_deadline_ns =
      tide__deadline_after_ms(timeout_ms < MAX_WAIT_MS ? timeout_ms : MAX_WAIT_MS);
}

/* ---- requests ---- */

/* Sets key and wakes its waiters; `publish` also pushes "event/" keys to
 * every watcher (SET does, ADD does not). */
static int32_t store_set(tide_store_server_t *s, const char *key, size_t key_len,
                         const void *value, size_t value_len, bool publish) {
  entry_t *e = table_put(s, key, key_len, value, value_len);
  if (e == NULL) {
    TIDE_WARN("store: out of memory storing %zu bytes at \"%.*s\"", value_len, (int)key_len,
              key);
    return TIDE__STORE_ENOMEM;
  }
  wake_parked(s, e->key);
  size_t prefix = strlen(TIDE__STORE_EVENT_PREFIX);
  if (!publish || key_len < prefix || memcmp(key, TIDE__STORE_EVENT_PREFIX, prefix) != 0)
    return TIDE__STORE_OK;
  for (size_t i = 0; i < s->conn_count; i++) {
    conn_t *w = s->conns[i];
    if (w->state == CONN_WATCH && !w->dead && !w->said_bye)
      push(w, TIDE__STORE_OP_EVENT, e->key, e->key_len, e->value, e->value_len);
  }
  return TIDE__STORE_OK;
}

/* Checks a request header before its body is read, so an oversized frame
 * is refused without buffering it. Writes the reason on failure. */
static bool header_ok(const tide_store_server_t *s, const conn_t *c,
                      const tide__store_request_t *req, char *why, size_t why_cap) {
  uint32_t op = req->op;
  if (op < TIDE__STORE_OP_SET || op > TIDE__STORE_OP_BYE) {
    snprintf(why, why_cap, "unknown request op %u", op);
    return false;
  }
  if ((c->state == CONN_WATCH) != (op == TIDE__STORE_OP_BYE)) {
    snprintf(why, why_cap, "op %u is not valid on a %s connection", op,
             c->state == CONN_WATCH ? "watch" : "request");
    return false;
  }
  bool keyless = op == TIDE__STORE_OP_WAIT || op == TIDE__STORE_OP_BYE;
  size_t max_key = op == TIDE__STORE_OP_WATCH
                       ? TIDE__STORE_MAX_KEY - strlen(TIDE__STORE_LOST_PREFIX)
                       : TIDE__STORE_MAX_KEY;
  if (keyless ? req->key_len != 0 : req->key_len == 0 || req->key_len > max_key) {
    snprintf(why, why_cap, "op %u with a %u-byte key (limit %zu)", op, req->key_len, max_key);
    return false;
  }
  bool has_value = op == TIDE__STORE_OP_SET || op == TIDE__STORE_OP_WAIT;
  if (!has_value && req->value_len != 0) {
    snprintf(why, why_cap, "op %u carries a %llu-byte value", op,
             (unsigned long long)req->value_len);
    return false;
  }
  if (req->value_len > s->max_value) {
    snprintf(why, why_cap, "%llu-byte value exceeds TIDE_MAX_FRAME_BYTES=%llu",
             (unsigned long long)req->value_len, (unsigned long long)s->max_value);
    return false;
  }
  return true;
}

/* Counts the keys of a WAIT list; -1 if it is not a run of non-empty,
 * NUL-terminated keys of at most TIDE__STORE_MAX_KEY bytes. */
static long count_wait_keys(const char *list, size_t len) {
  long count = 0;
  size_t pos = 0;
  while (pos < len) {
    const char *end = memchr(list + pos, '\0', len - pos);
    if (end == NULL) return -1;
    size_t key_len = (size_t)(end - (list + pos));
    if (key_len == 0 || key_len > TIDE__STORE_MAX_KEY) return -1;
    pos += key_len + 1;
    count++;
  }
  return count;
}

static void handle_request(tide_store_server_t *s, conn_t *c, const tide__store_request_t *req,
                           const char *key, const uint8_t *value) {
  size_t key_len = req->key_len, value_len = (size_t)req->value_len;
  if (memchr(key, '\0', key_len) != NULL) {
    conn_drop(c, "closing connection from", "key contains a NUL byte");
    return;
  }
  switch (req->op) {
    case TIDE__STORE_OP_SET:
      respond(c, store_set(s, key, key_len, value, value_len, true), 0, NULL, 0);
      return;
    case TIDE__STORE_OP_GET: {
      if (req->arg < 0) {
        respond(c, TIDE__STORE_EINVAL, 0, NULL, 0);
        return;
      }
      entry_t *e = table_find(s, key, key_len);
      if (e != NULL) {
        respond(c, TIDE__STORE_OK, 0, e->value, e->value_len);
        return;
      }
      char copy[TIDE__STORE_MAX_KEY + 1];
      memcpy(copy, key, key_len);
      copy[key_len] = '\0';
      park(s, c, TIDE__STORE_OP_GET, copy, key_len + 1, 1, req->arg);
      return;
    }
    case TIDE__STORE_OP_WAIT: {
      long count = count_wait_keys((const char *)value, value_len);
      if (count < 0) {
        conn_drop(c, "closing connection from", "malformed WAIT key list");
        return;
      }
      if (req->arg < 0) {
        respond(c, TIDE__STORE_EINVAL, 0, NULL, 0);
        return;
      }
      park(s, c, TIDE__STORE_OP_WAIT, (const char *)value, value_len, (size_t)count, req->arg);
      return;
    }
    case TIDE__STORE_OP_ADD: {
      entry_t *e = table_find(s, key, key_len);
      if (e != NULL && e->value_len != 8) {
        respond(c, TIDE__STORE_EINVAL, 0, NULL, 0); /* not a counter */
        return;
      }
      /* Unsigned arithmetic: wraps instead of overflowing into UB. */
      uint64_t sum = (e != NULL ? tide__store_get64(e->value) : 0) + (uint64_t)req->arg;
      uint8_t bytes[8];
      tide__store_put64(bytes, sum);
      int32_t status = store_set(s, key, key_len, bytes, sizeof bytes, false);
      respond(c, status, (int64_t)sum, NULL, 0);
      return;
    }
    case TIDE__STORE_OP_DELETE:
      respond(c, table_delete(s, key, key_len) == 0 ? TIDE__STORE_OK : TIDE__STORE_ENOENT, 0,
              NULL, 0);
      return;
    case TIDE__STORE_OP_WATCH:
      c->watch_name = tide__malloc(key_len + 1);
      if (c->watch_name == NULL) {
        respond(c, TIDE__STORE_ENOMEM, 0, NULL, 0);
        return;
      }
      memcpy(c->watch_name, key, key_len);
      c->watch_name[key_len] = '\0';
      c->state = CONN_WATCH;
      respond(c, TIDE__STORE_OK, 0, NULL, 0);
      TIDE_DEBUG("store: %s watches as \"%s\"", c->peer, c->watch_name);
      return;
    case TIDE__STORE_OP_BYE:
      c->said_bye = true;
      push(c, TIDE__STORE_OP_BYE, NULL, 0, NULL, 0);
      return;
  }
}

/* Handles every complete request in c's input until one parks; true when
 * it handled any. */
static bool process_input(tide_store_server_t *s, conn_t *c) {
  bool progress = false;
  while (!c->dead && c->state != CONN_AUTH && c->parked_op == 0 && !c->said_bye) {
    size_t pending = buf_pending(&c->in);
    if (pending < TIDE__STORE_REQUEST_BYTES) break;
    const uint8_t *frame = c->in.data + c->in.off;
    tide__store_request_t req;
    char why[160];
    if (tide__store_request_decode(frame, &req) != 0) {
      conn_drop(c, "closing connection from", "bad magic: not a store request");
      break;
    }
    if (!header_ok(s, c, &req, why, sizeof why)) {
      conn_drop(c, "closing connection from", why);
      break;
    }
    size_t frame_len = TIDE__STORE_REQUEST_BYTES + req.key_len + (size_t)req.value_len;
    if (pending < frame_len) break;
    const char *key = (const char *)frame + TIDE__STORE_REQUEST_BYTES;
    handle_request(s, c, &req, key, (const uint8_t *)key + req.key_len);
    buf_consume(&c->in, frame_len);
    progress = true;
  }
  return progress;
}

/* Answering a parked request can unblock another connection's queued
 * requests, whose answers can unpark more: repeat until nothing moves. */
static void drain_input(tide_store_server_t *s) {
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t i = 0; i < s->conn_count; i++)
      if (process_input(s, s->conns[i])) progress = true;
  }
}

/* Checks the client's hello and proof once they are in; refuses the
 * connection as soon as the bytes it sent cannot be right. */
static void auth_step(tide_store_server_t *s, conn_t *c) {
  uint8_t answer[TIDE__AUTH_PROOF_BYTES];
  const char *why = "";
  int rc = tide__auth_server_check(c->hello, s->token, c->in.data + c->in.off, buf_pending(&c->in), answer, &why);
  if (rc == 0) return;
  if (rc < 0) {
    if (rc == TIDE_EAUTH) { /* tell a client with another token it was refused */
      memset(answer, 0, sizeof answer);
      conn_write(c, answer, sizeof answer, NULL, 0);
    }
    conn_drop(c, "refused connection from", why);
    return;
  }
  buf_consume(&c->in, TIDE__AUTH_CLIENT_BYTES);
  c->state = CONN_READY;
  conn_write(c, answer, sizeof answer, NULL, 0);
  TIDE_DEBUG("store: accepted connection from %s", c->peer);
}

/* How many bytes to read now; 0 stops reading. A parked connection reads a
 * little (to notice its close) but does not buffer a flood behind the
 * parked request. */
static size_t read_want(const tide_store_server_t *s, const conn_t *c) {
  size_t pending = buf_pending(&c->in);
  if (c->state != CONN_READY || c->parked_op != 0)
    return pending < READ_CHUNK ? READ_CHUNK - pending : 0;
  if (pending < TIDE__STORE_REQUEST_BYTES) return READ_CHUNK;
  /* process_input() left an incomplete frame whose header it checked. */
  const uint8_t *frame = c->in.data + c->in.off;
  uint64_t value_len = tide__store_get64(frame + 16);
  if (value_len > s->max_value) return READ_CHUNK; /* cannot happen; stay safe */
  size_t left = TIDE__STORE_REQUEST_BYTES + tide__store_get32(frame + 8) + (size_t)value_len -
                pending;
  return left < READ_CHUNK ? READ_CHUNK : left > READ_MAX ? READ_MAX : left;
}

static void conn_read(tide_store_server_t *s, conn_t *c, short revents) {
  size_t want = read_want(s, c);
  if (want == 0) {
    /* Not reading, but a hang-up or error would otherwise wake poll forever. */
    if (revents & (POLLHUP | POLLERR)) c->dead = true;
    return;
  }
  if (buf_reserve(&c->in, want) != 0) {
    conn_drop(c, "closing connection from", "out of memory for its input");
    return;
  }
  ssize_t n = recv(c->fd, c->in.data + c->in.len, want, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    if (c->state == CONN_AUTH)
      conn_drop(c, "refused connection from", "closed during the handshake");
    else
      TIDE_DEBUG("store: connection from %s closed", c->peer);
    c->dead = true;
    return;
  }
  c->in.len += (size_t)n;
  if (c->state == CONN_AUTH) auth_step(s, c);
  process_input(s, c);
}

/* ---- connections ---- */

/* Keeps the handshakes in progress under s->max_pending by closing the
 * oldest, preferring one that has sent nothing. Closes the descriptor now
 * (the entry goes at the next sweep), so a burst of accepts stays under the
 * cap too. */
static void make_room_for_handshake(tide_store_server_t *s) {
  size_t pending = 0;
  conn_t *oldest = NULL;
  for (size_t i = 0; i < s->conn_count; i++) {
    conn_t *c = s->conns[i];
    if (c->dead || c->state != CONN_AUTH) continue;
    pending++;
    bool silent = buf_pending(&c->in) == 0, oldest_silent = oldest != NULL && buf_pending(&oldest->in) == 0;
    if (oldest == NULL || (silent && !oldest_silent) ||
        (silent == oldest_silent && c->auth_deadline_ns < oldest->auth_deadline_ns))
      oldest = c;
  }
  if (pending < s->max_pending || oldest == NULL) return;
  conn_drop(oldest, "refused connection from",
            "too many connections are proving the job token at once; closing the oldest");
  close(oldest->fd);
  oldest->fd = -1;
}

static void accept_clients(tide_store_server_t *s) {
  for (;;) {
    struct sockaddr_in addr;
    socklen_t addr_len = sizeof addr;
    int fd = accept4(s->listen_fd, (struct sockaddr *)&addr, &addr_len,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        /* The backlog stays readable: pause, or poll would spin. */
        static tide__ratelimit_t limit;
        TIDE_WARN_RATELIMITED(&limit, "store: cannot accept connections: %s; retrying in 100 ms", strerror(errno));
        s->accept_paused_until_ns = tide__deadline_after_ms(100);
      }
      return;
    }
    tide__socket_tune(fd, 1);
    make_room_for_handshake(s);
    conn_t *c = tide__calloc(1, sizeof *c);
    if (c != NULL && s->conn_count == s->conn_cap) {
      size_t cap = s->conn_cap ? s->conn_cap * 2 : 16;
      conn_t **conns = tide__realloc(s->conns, cap * sizeof *conns);
      if (conns == NULL) {
        tide__free(c);
        c = NULL;
      } else {
        s->conns = conns;
        s->conn_cap = cap;
      }
    }
    if (c == NULL) {
      TIDE_WARN("store: out of memory for a new connection; closing it");
      close(fd);
      continue;
    }
    c->fd = fd;
    c->state = CONN_AUTH;
    char ip[INET_ADDRSTRLEN] = "?";
    if (addr.sin_family == AF_INET) inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
    snprintf(c->peer, sizeof c->peer, "%s:%d", ip, ntohs(addr.sin_port));
    s->conns[s->conn_count++] = c;
    if (tide__auth_server_hello(c->hello) != 0) {
      conn_drop(c, "refused connection from", "no random bytes for the handshake nonce");
      continue;
    }
    c->auth_deadline_ns = tide__deadline_after_ms(AUTH_TIMEOUT_MS);
    conn_write(c, c->hello, sizeof c->hello, NULL, 0);
  }
}

static void conn_free(conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  unpark(c);
  tide__free(c->in.data);
  tide__free(c->out.data);
  tide__free(c->watch_name);
  tide__free(c);
}

/* Closes dead connections. A watcher that leaves without BYE publishes
 * event/lost/<name>, which can fail more sends, hence the repeat. */
static void sweep(tide_store_server_t *s) {
  bool again = true;
  while (again) {
    again = false;
    for (size_t i = 0; i < s->conn_count;) {
      conn_t *c = s->conns[i];
      if (!c->dead) {
        i++;
        continue;
      }
      s->conns[i] = s->conns[--s->conn_count];
      if (c->state == CONN_WATCH && !c->said_bye) {
        char key[TIDE__STORE_MAX_KEY + 1];
        int len = snprintf(key, sizeof key, "%s%s", TIDE__STORE_LOST_PREFIX, c->watch_name);
        TIDE_WARN("store: watcher \"%s\" (%s) closed without saying goodbye; publishing %s",
                  c->watch_name, c->peer, key);
        store_set(s, key, (size_t)len, c->watch_name, strlen(c->watch_name), true);
        again = true;
      }
      conn_free(c);
    }
  }
}

/* Refuses handshakes and answers parked requests whose deadline passed. */
static void expire(tide_store_server_t *s) {
  int64_t now = tide__now_ns();
  for (size_t i = 0; i < s->conn_count; i++) {
    conn_t *c = s->conns[i];
    if (c->dead) continue;
    if (c->state == CONN_AUTH && now >= c->auth_deadline_ns)
      conn_drop(c, "refused connection from", "no handshake within 5 s");
    else if (c->parked_op != 0 && now >= c->parked_deadline_ns)
      park_finish(s, c, TIDE__STORE_ETIMEDOUT);
  }
}

/* poll() timeout in ms: until the nearest deadline, -1 when there is none. */
static int poll_timeout(const tide_store_server_t *s) {
  int64_t nearest = INT64_MAX;
  if (s->accept_paused_until_ns != 0) nearest = s->accept_paused_until_ns;
  for (size_t i = 0; i < s->conn_count; i++) {
    const conn_t *c = s->conns[i];
    if (c->state == CONN_AUTH && c->auth_deadline_ns < nearest) nearest = c->auth_deadline_ns;
    if (c->parked_op != 0 && c->parked_deadline_ns < nearest) nearest = c->parked_deadline_ns;
  }
  return nearest == INT64_MAX ? -1 : tide__ms_left(nearest);
}

static void *server_main(void *arg) {
  tide_store_server_t *s = arg;
  for (;;) {
    sweep(s);
    atomic_store(&s->clients, s->conn_count);
    if (s->conn_count + 2 > s->pfd_cap) {
      size_t cap = (s->conn_count + 2) * 2;
      struct pollfd *pfds = tide__realloc(s->pfds, cap * sizeof *pfds);
      if (pfds == NULL) {
        TIDE_ERROR("store: out of memory for %zu poll entries; the server stops serving",
                   cap);
        break;
      }
      s->pfds = pfds;
      s->pfd_cap = cap;
    }
    if (s->accept_paused_until_ns != 0 && tide__now_ns() >= s->accept_paused_until_ns)
      s->accept_paused_until_ns = 0;
    s->pfds[0] = (struct pollfd){s->wake_fd, POLLIN, 0};
    s->pfds[1] = (struct pollfd){s->accept_paused_until_ns ? -1 : s->listen_fd, POLLIN, 0};
    size_t polled = s->conn_count;
    for (size_t i = 0; i < polled; i++) {
      conn_t *c = s->conns[i];
      short events = read_want(s, c) > 0 ? POLLIN : 0;
      if (buf_pending(&c->out) > 0) events |= POLLOUT;
      s->pfds[2 + i] = (struct pollfd){c->fd, events, 0};
    }
    int n = poll(s->pfds, 2 + polled, poll_timeout(s));
    if (n < 0 && errno != EINTR) {
      TIDE_ERROR("store: poll failed: %s; the server stops serving", strerror(errno));
      break;
    }
    if (n > 0 && s->pfds[0].revents != 0) break; /* tide_store_server_stop */
    if (n > 0 && (s->pfds[1].revents & POLLIN)) accept_clients(s);
    /* accept_clients() only appends, so conns[0, polled) still match pfds. */
    for (size_t i = 0; n > 0 && i < polled; i++) {
      conn_t *c = s->conns[i];
      short revents = s->pfds[2 + i].revents;
      if (revents == 0 || c->dead) continue;
      if (revents & POLLOUT) conn_flush(c);
      if (revents & (POLLIN | POLLHUP | POLLERR)) conn_read(s, c, revents);
    }
    expire(s);
    drain_input(s);
  }
  return NULL;
}

/* ---- public API ---- */

static size_t max_pending(void) {
  struct rlimit lim;
  size_t cap = MAX_PENDING;
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur / 4 < cap)
    cap = lim.rlim_cur / 4 > 0 ? (size_t)lim.rlim_cur / 4 : 1;
  return cap;
}

int tide_store_server_start(const char *bind_host, int port, const char *token,
                            tide_store_server_t **out) {
  if (token == NULL || token[0] == '\0') {
    TIDE_ERROR("tide_store_server_start: token must be the non-empty job secret");
    return TIDE_EINVAL;
  }
  if (port < 0 || port > 65535) {
    TIDE_ERROR("tide_store_server_start: port %d is not in [0, 65535] (0 picks a free port)",
               port);
    return TIDE_EINVAL;
  }
  if (out == NULL) {
    TIDE_ERROR("tide_store_server_start: out must not be NULL");
    return TIDE_EINVAL;
  }
  tide_store_server_t *s = tide__calloc(1, sizeof *s);
  if (s == NULL) return TIDE_ENOMEM;
  s->listen_fd = s->wake_fd = -1;
  s->max_value = (uint64_t)tide__param_int(TIDE__PARAM_MAX_FRAME_BYTES);
  s->max_pending = max_pending();
  s->bucket_count = 1024;
  s->buckets = tide__calloc(s->bucket_count, sizeof *s->buckets);
  s->token = tide__strdup(token);
  int rc = TIDE_ENOMEM;
  if (s->buckets == NULL || s->token == NULL) goto fail;
  TIDE_CHECK_GOTO(tide__tcp_listen(bind_host, port, &s->listen_fd, &s->port), rc, fail);
  TIDE_CHECK_GOTO(tide__socket_tune(s->listen_fd, 1), rc, fail);
  s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd < 0) {
    TIDE_ERROR("store: cannot create the server's wake-up eventfd: %s", strerror(errno));
    rc = TIDE_EIO;
    goto fail;
  }
  int err = pthread_create(&s->thread, NULL, server_main, s);
  if (err != 0) {
    TIDE_ERROR("store: cannot start the server thread: %s", strerror(err));
    rc = TIDE_EIO;
    goto fail;
  }
  TIDE_INFO("store server listening on %s:%d", bind_host && bind_host[0] ? bind_host : "*",
            s->port);
  *out = s;
  return 0;
fail:
  if (s->wake_fd >= 0) close(s->wake_fd);
  if (s->listen_fd >= 0) close(s->listen_fd);
  tide__free(s->buckets);
  tide__free(s->token);
  tide__free(s);
  return rc;
}

int tide_store_server_port(const tide_store_server_t *server) {
  if (server == NULL) {
    TIDE_ERROR("tide_store_server_port: server must not be NULL");
    return TIDE_EINVAL;
  }
  return server->port;
}

void tide_store_server_stop(tide_store_server_t *server) {
  if (server == NULL) return;
  uint64_t one = 1;
  /* An eventfd write only fails when the counter would overflow: then it
   * is already readable, which is all the loop needs. */
  ssize_t ignored = write(server->wake_fd, &one, sizeof one);
  (void)ignored;
  pthread_join(server->thread, NULL);
  for (size_t i = 0; i < server->conn_count; i++) conn_free(server->conns[i]);
  tide__free(server->conns);
  tide__free(server->pfds);
  table_free(server);
  close(server->listen_fd);
  close(server->wake_fd);
  explicit_bzero(server->token, strlen(server->token)); /* the job secret */
  tide__free(server->token);
  tide__free(server);
}

int tide__store_server_wait_clients(tide_store_server_t *server, size_t max_clients, int timeout_ms) {
  int64_t deadline = tide__deadline_after_ms(timeout_ms);
  while (atomic_load(&server->clients) > max_clients) {
    if (tide__now_ns() >= deadline) return TIDE_ETIMEDOUT;
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}
