/* The rendezvous store client: blocking request/response over one
 * authenticated connection (tide.h), and the nonblocking watch stream
 * (store.h). Wire format: protocol.h.
 *
 * Threads: calls on one tide_store_t are serialised by its mutex, so any
 * thread may call. A watch handle is used by one thread at a time. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/protocol.h"
#include "store/store.h"

/* Time the server gets to answer beyond a GET/WAIT's own timeout, so a dead
 * or stopped server turns into an error rather than a hang. */
#define ANSWER_MARGIN_MS 5000
/* Time tide__store_watch_close waits for the server to confirm BYE. */
#define BYE_TIMEOUT_MS 2000

struct tide_store {
  pthread_mutex_t lock;
  int fd;
  /* Set when a request failed halfway: the stream is out of step, so every
   * later call fails at once instead of reading someone else's answer. */
  int failed_rc;
  int64_t timeout_ms; /* TIDE_TIMEOUT_MS: deadline of requests that do not wait */
  uint64_t max_value;
  char peer[300]; /* "host:port" for messages */
};

struct tide__store_watch {
  int fd;
  int failed_rc; /* returned by every call once the stream broke */
  uint64_t max_value;
  /* The frame being read: header, then key and value straight into the
   * buffers handed to the caller. */
  uint8_t head[TIDE__STORE_REQUEST_BYTES];
  size_t head_got, body_got;
  tide__store_request_t frame;
  char *key;
  uint8_t *value;
};

/* ---- argument checks ---- */

static int check_key(const char *fn, const char *arg, const char *key) {
  if (key == NULL) {
    TIDE_ERROR("%s: %s must not be NULL", fn, arg);
    return TIDE_EINVAL;
  }
  size_t len = strnlen(key, TIDE__STORE_MAX_KEY + 1);
  if (len == 0) {
    TIDE_ERROR("%s: %s must not be empty", fn, arg);
    return TIDE_EINVAL;
  }
  if (len > TIDE__STORE_MAX_KEY) {
    TIDE_ERROR("%s: %s is longer than %d bytes, the longest key the store takes", fn, arg,
               TIDE__STORE_MAX_KEY);
    return TIDE_EINVAL;
  }
  return 0;
}

static int check_store(const char *fn, const tide_store_t *store) {
  if (store != NULL) return 0;
  TIDE_ERROR("%s: store must not be NULL", fn);
  return TIDE_EINVAL;
}

/* A negative timeout means the job default (TIDE_TIMEOUT_MS): every wait
 * has a deadline. */
static int64_t timeout_or_default(int timeout_ms) {
  return timeout_ms >= 0 ? timeout_ms : tide__param_int(TIDE__PARAM_TIMEOUT_MS);
}

/* Connects and proves the token; *fd_out is a blocking socket. */
static int dial(const char *fn, const char *host, int port, const char *token, int timeout_ms,
                int *fd_out) {
  if (host == NULL || host[0] == '\0') {
    TIDE_ERROR("%s: host must be a host name or address", fn);
    return TIDE_EINVAL;
  }
  if (port <= 0 || port > 65535) {
    TIDE_ERROR("%s: port %d is not in [1, 65535]", fn, port);
    return TIDE_EINVAL;
  }
  if (token == NULL || token[0] == '\0') {
    TIDE_ERROR("%s: token must be the non-empty job secret (TIDE_JOB_TOKEN)", fn);
    return TIDE_EINVAL;
  }
  int64_t deadline = tide__deadline_after_ms(timeout_or_default(timeout_ms));
  int fd, rc;
  for (;;) {
    TIDE_CHECK(tide__tcp_connect(host, port, deadline, &fd));
    /* A connect that used up the whole timeout still gets a moment to prove
     * the token. */
    int64_t soon = tide__deadline_after_ms(1000);
    rc = tide__auth_handshake(fd, token, 0, deadline > soon ? deadline : soon);
    /* Closed during the handshake: a server flooded by strangers closes its
     * oldest handshakes; try again while there is time. */
    if (rc != TIDE_EPEER || tide__now_ns() >= deadline) break;
    close(fd);
    struct timespec pause = {0, 20 * 1000000};
    nanosleep(&pause, NULL);
  }
  if (rc == TIDE_EAUTH) {
    TIDE_ERROR("store %s:%d refused this process's job token: TIDE_JOB_TOKEN must match the "
               "server's",
               host, port);
  } else if (rc < 0) {
    TIDE_ERROR("job-token handshake with store %s:%d failed: %s", host, port, tide_strerror(rc));
  }
  if (rc < 0) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return 0;
}

/* ---- request/response ---- */

/* Sends one request and reads its answer; returns the server's status as a
 * TIDE_E* code. wait_ms >= 0 is how long the server may park the request;
 * -1 for requests answered at once. On success writes *result and *reply
 * (tide__malloc'd, caller frees) when they are not NULL. */
static int request(tide_store_t *st, const char *op_name, uint32_t op, const char *key,
                   const void *value, size_t value_len, int64_t arg, int64_t wait_ms,
                   int64_t *result, void **reply, size_t *reply_len) {
  size_t key_len = key != NULL ? strlen(key) : 0;
  int64_t limit_ms = wait_ms >= 0 ? wait_ms + ANSWER_MARGIN_MS : st->timeout_ms;
  int64_t deadline = tide__deadline_after_ms(limit_ms);
  uint8_t head[TIDE__STORE_REQUEST_BYTES + TIDE__STORE_MAX_KEY];
  tide__store_request_t req = {op, (uint32_t)key_len, value_len, arg};
  tide__store_request_encode(head, &req);
  if (key_len > 0) memcpy(head + TIDE__STORE_REQUEST_BYTES, key, key_len);
  uint8_t resp_head[TIDE__STORE_RESPONSE_BYTES];
  tide__store_response_t resp = {0};
  void *body = NULL;
  int rc;

  pthread_mutex_lock(&st->lock);
  if (st->failed_rc != 0) {
    TIDE_ERROR("store %s: cannot %s \"%s\": this connection failed earlier; connect again",
               st->peer, op_name, key ? key : "");
    rc = TIDE_EPEER;
    goto out;
  }
  TIDE_CHECK_GOTO(tide__send_all(st->fd, head, TIDE__STORE_REQUEST_BYTES + key_len, deadline),
                  rc, broken);
  if (value_len > 0)
    TIDE_CHECK_GOTO(tide__send_all(st->fd, value, value_len, deadline), rc, broken);
  TIDE_CHECK_GOTO(tide__recv_all(st->fd, resp_head, sizeof resp_head, deadline), rc, broken);
  rc = tide__store_response_decode(resp_head, &resp);
  if (rc == 0 && (resp.value_len > st->max_value || (resp.value_len > 0 && reply == NULL)))
    rc = TIDE_EPROTO;
  if (rc < 0) goto broken;
  if (reply != NULL) {
    body = tide__malloc((size_t)resp.value_len);
    if (body == NULL) {
      rc = TIDE_ENOMEM; /* its bytes stay unread: the stream is out of step */
      goto broken;
    }
    TIDE_CHECK_GOTO(tide__recv_all(st->fd, body, (size_t)resp.value_len, deadline), rc, broken);
  }
  rc = tide__store_status_rc(resp.status);
  if (rc == 0) {
    if (result != NULL) *result = resp.result;
    if (reply != NULL) {
      *reply = body;
      *reply_len = (size_t)resp.value_len;
      body = NULL;
    }
  }
  goto out;

broken:
  st->failed_rc = rc;
  if (rc == TIDE_ETIMEDOUT)
    TIDE_ERROR("store %s did not answer %s \"%s\" within %lld ms; the connection is unusable",
               st->peer, op_name, key ? key : "", (long long)limit_ms);
  else if (rc == TIDE_EPROTO)
    TIDE_ERROR("store %s sent a malformed answer to %s \"%s\"", st->peer, op_name,
               key ? key : "");
  else if (rc == TIDE_ENOMEM)
    TIDE_ERROR("store %s: out of memory for the %llu-byte answer to %s \"%s\"", st->peer,
               (unsigned long long)resp.value_len, op_name, key ? key : "");
  else
    TIDE_ERROR("store %s closed the connection during %s \"%s\" (stopped or died?)", st->peer,
               op_name, key ? key : "");
  if (rc != TIDE_ETIMEDOUT && rc != TIDE_EPROTO && rc != TIDE_ENOMEM) rc = TIDE_EPEER;
out:
  pthread_mutex_unlock(&st->lock);
  tide__free(body);
  return rc;
}

int tide_store_connect(const char *host, int port, const char *token, int timeout_ms,
                       tide_store_t **out) {
  if (out == NULL) {
    TIDE_ERROR("tide_store_connect: out must not be NULL");
    return TIDE_EINVAL;
  }
  int fd;
  TIDE_CHECK(dial("tide_store_connect", host, port, token, timeout_ms, &fd));
  tide_store_t *st = tide__calloc(1, sizeof *st);
  if (st == NULL) {
    close(fd);
    return TIDE_ENOMEM;
  }
  pthread_mutex_init(&st->lock, NULL);
  st->fd = fd;
  st->timeout_ms = tide__param_int(TIDE__PARAM_TIMEOUT_MS);
  st->max_value = (uint64_t)tide__param_int(TIDE__PARAM_MAX_FRAME_BYTES);
  snprintf(st->peer, sizeof st->peer, "%s:%d", host, port);
  *out = st;
  return 0;
}

void tide_store_close(tide_store_t *store) {
  if (store == NULL) return;
  close(store->fd);
  pthread_mutex_destroy(&store->lock);
  tide__free(store);
}

int tide_store_set(tide_store_t *store, const char *key, const void *value, size_t len) {
  TIDE_CHECK(check_store("tide_store_set", store));
  TIDE_CHECK(check_key("tide_store_set", "key", key));
  if (value == NULL && len > 0) {
    TIDE_ERROR("tide_store_set: value is NULL but len is %zu", len);
    return TIDE_EINVAL;
  }
  if (len > store->max_value) {
    TIDE_ERROR("tide_store_set: a %zu-byte value exceeds TIDE_MAX_FRAME_BYTES=%llu", len,
               (unsigned long long)store->max_value);
    return TIDE_EINVAL;
  }
  return request(store, "set", TIDE__STORE_OP_SET, key, value, len, 0, -1, NULL, NULL, NULL);
}

int tide_store_get(tide_store_t *store, const char *key, int timeout_ms, void **value,
                   size_t *len) {
  TIDE_CHECK(check_store("tide_store_get", store));
  TIDE_CHECK(check_key("tide_store_get", "key", key));
  if (value == NULL || len == NULL) {
    TIDE_ERROR("tide_store_get: value and len must not be NULL");
    return TIDE_EINVAL;
  }
  int64_t wait_ms = timeout_or_default(timeout_ms);
  int rc = request(store, "get", TIDE__STORE_OP_GET, key, NULL, 0, wait_ms, wait_ms, NULL, value,
                   len);
  if (rc == TIDE_ETIMEDOUT)
    TIDE_INFO("store get \"%s\": the key did not appear within %lld ms", key, (long long)wait_ms);
  return rc;
}

int tide__store_get_string(tide_store_t *store, const char *key, int timeout_ms, char *out, size_t cap) {
  void *value;
  size_t len;
  TIDE_CHECK(tide_store_get(store, key, timeout_ms, &value, &len));
  size_t n = len < cap - 1 ? len : cap - 1;
  memcpy(out, value, n);
  out[n] = '\0';
  tide__free(value);
  return 0;
}

int tide_store_wait(tide_store_t *store, const char *const *keys, size_t n, int timeout_ms) {
  TIDE_CHECK(check_store("tide_store_wait", store));
  if (keys == NULL && n > 0) {
    TIDE_ERROR("tide_store_wait: keys is NULL but n is %zu", n);
    return TIDE_EINVAL;
  }
  size_t list_len = 0;
  for (size_t i = 0; i < n; i++) {
    char arg[32];
    snprintf(arg, sizeof arg, "keys[%zu]", i);
    TIDE_CHECK(check_key("tide_store_wait", arg, keys[i]));
    list_len += strlen(keys[i]) + 1;
  }
  if (n == 0) return 0;
  if (list_len > store->max_value) {
    TIDE_ERROR("tide_store_wait: %zu keys take %zu bytes, more than TIDE_MAX_FRAME_BYTES=%llu", n,
               list_len, (unsigned long long)store->max_value);
    return TIDE_EINVAL;
  }
  /* The keys travel as one value, each NUL-terminated. */
  char *list = tide__malloc(list_len);
  if (list == NULL) return TIDE_ENOMEM;
  char *pos = list;
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(keys[i]) + 1;
    memcpy(pos, keys[i], len);
    pos += len;
  }
  int64_t wait_ms = timeout_or_default(timeout_ms);
  int rc = request(store, "wait for", TIDE__STORE_OP_WAIT, NULL, list, list_len, wait_ms, wait_ms,
                   NULL, NULL, NULL);
  tide__free(list);
  if (rc == TIDE_ETIMEDOUT)
    TIDE_INFO("store wait: %zu keys (first \"%s\") did not all appear within %lld ms", n, keys[0],
              (long long)wait_ms);
  return rc;
}

int tide_store_add(tide_store_t *store, const char *key, int64_t delta, int64_t *result) {
  TIDE_CHECK(check_store("tide_store_add", store));
  TIDE_CHECK(check_key("tide_store_add", "key", key));
  int64_t sum;
  int rc = request(store, "add to", TIDE__STORE_OP_ADD, key, NULL, 0, delta, -1, &sum, NULL,
                   NULL);
  if (rc == TIDE_EINVAL)
    TIDE_ERROR("tide_store_add: key \"%s\" holds a value that is not an 8-byte counter", key);
  if (rc == 0 && result != NULL) *result = sum;
  return rc;
}

int tide_store_delete(tide_store_t *store, const char *key) {
  TIDE_CHECK(check_store("tide_store_delete", store));
  TIDE_CHECK(check_key("tide_store_delete", "key", key));
  return request(store, "delete", TIDE__STORE_OP_DELETE, key, NULL, 0, 0, -1, NULL, NULL, NULL);
}

/* ---- watch ---- */

int tide__store_watch_open(const char *host, int port, const char *token, const char *name,
                           int timeout_ms, tide__store_watch_t **out) {
  const char *fn = "tide__store_watch_open";
  if (out == NULL) {
    TIDE_ERROR("%s: out must not be NULL", fn);
    return TIDE_EINVAL;
  }
  TIDE_CHECK(check_key(fn, "name", name));
  size_t name_len = strlen(name);
  if (name_len > TIDE__STORE_MAX_KEY - strlen(TIDE__STORE_LOST_PREFIX)) {
    TIDE_ERROR("%s: name is %zu bytes; \"" TIDE__STORE_LOST_PREFIX "<name>\" must fit in %d", fn,
               name_len, TIDE__STORE_MAX_KEY);
    return TIDE_EINVAL;
  }
  int64_t deadline = tide__deadline_after_ms(timeout_or_default(timeout_ms));
  int fd;
  TIDE_CHECK(dial(fn, host, port, token, timeout_ms, &fd));
  uint8_t head[TIDE__STORE_REQUEST_BYTES + TIDE__STORE_MAX_KEY];
  tide__store_request_t req = {TIDE__STORE_OP_WATCH, (uint32_t)name_len, 0, 0};
  tide__store_request_encode(head, &req);
  memcpy(head + TIDE__STORE_REQUEST_BYTES, name, name_len);
  /* Waiting for the answer means the server has registered us before we
   * return: every event set afterwards reaches this watch. */
  int64_t soon = tide__deadline_after_ms(1000);
  if (deadline < soon) deadline = soon;
  uint8_t resp_head[TIDE__STORE_RESPONSE_BYTES];
  tide__store_response_t resp = {0};
  int rc = tide__send_all(fd, head, TIDE__STORE_REQUEST_BYTES + name_len, deadline);
  if (rc == 0) rc = tide__recv_all(fd, resp_head, sizeof resp_head, deadline);
  if (rc == 0) rc = tide__store_response_decode(resp_head, &resp);
  if (rc == 0) rc = resp.value_len == 0 ? tide__store_status_rc(resp.status) : TIDE_EPROTO;
  if (rc == 0) rc = tide__socket_tune(fd, 1);
  tide__store_watch_t *w = rc == 0 ? tide__calloc(1, sizeof *w) : NULL;
  if (rc == 0 && w == NULL) rc = TIDE_ENOMEM;
  if (rc < 0) {
    TIDE_ERROR("store %s:%d: cannot register watch \"%s\": %s", host, port, name,
               tide_strerror(rc));
    close(fd);
    return rc;
  }
  w->fd = fd;
  w->max_value = (uint64_t)tide__param_int(TIDE__PARAM_MAX_FRAME_BYTES);
  *out = w;
  return 0;
}

int tide__store_watch_fd(const tide__store_watch_t *watch) {
  return watch != NULL ? watch->fd : TIDE_EINVAL;
}

static int watch_fail(tide__store_watch_t *w, int rc, const char *why) {
  if (rc == TIDE_EPEER) /* the store stopped: normal at the end of a job */
    TIDE_DEBUG("store watch: %s", why);
  else
    TIDE_ERROR("store watch: %s", why);
  w->failed_rc = rc;
  return rc;
}

/* Reads what has arrived of the current frame without blocking. Returns 1
 * with a complete frame (key NUL-terminated; both for the caller to free),
 * 0 when it is not complete yet. Reads no byte beyond the frame, so the fd
 * stays readable while more frames wait in the kernel. */
static int read_frame(tide__store_watch_t *w, uint32_t *op, char **key, void **value,
                      size_t *len) {
  if (w->failed_rc != 0) return w->failed_rc;
  for (;;) {
    uint8_t *dst;
    size_t want;
    size_t key_len = w->frame.key_len, body_len = key_len + (size_t)w->frame.value_len;
    if (w->head_got < TIDE__STORE_REQUEST_BYTES) {
      dst = w->head + w->head_got;
      want = TIDE__STORE_REQUEST_BYTES - w->head_got;
    } else if (w->body_got < key_len) {
      dst = (uint8_t *)w->key + w->body_got;
      want = key_len - w->body_got;
    } else if (w->body_got < body_len) {
      dst = w->value + (w->body_got - key_len);
      want = body_len - w->body_got;
    } else {
      w->key[key_len] = '\0';
      *op = w->frame.op;
      *key = w->key;
      *value = w->value;
      *len = (size_t)w->frame.value_len;
      w->key = NULL;
      w->value = NULL;
      w->head_got = w->body_got = 0;
      return 1;
    }
    ssize_t n = recv(w->fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (n == 0) return watch_fail(w, TIDE_EPEER, "the store server closed the connection");
    if (n < 0) return watch_fail(w, TIDE_EPEER, strerror(errno));
    if (w->head_got >= TIDE__STORE_REQUEST_BYTES) {
      w->body_got += (size_t)n;
      continue;
    }
    w->head_got += (size_t)n;
    if (w->head_got < TIDE__STORE_REQUEST_BYTES) continue;
    tide__store_request_t *f = &w->frame;
    if (tide__store_request_decode(w->head, f) != 0 ||
        (f->op != TIDE__STORE_OP_EVENT && f->op != TIDE__STORE_OP_BYE) ||
        f->key_len > TIDE__STORE_MAX_KEY || f->value_len > w->max_value)
      return watch_fail(w, TIDE_EPROTO, "malformed frame from the store server");
    w->key = tide__malloc(f->key_len + 1);
    w->value = tide__malloc((size_t)f->value_len);
    if (w->key == NULL || w->value == NULL)
      return watch_fail(w, TIDE_ENOMEM, "out of memory for an event");
  }
}

int tide__store_watch_next(tide__store_watch_t *watch, char **key, void **value, size_t *len) {
  if (watch == NULL || key == NULL || value == NULL || len == NULL) {
    TIDE_ERROR("tide__store_watch_next: watch, key, value and len must not be NULL");
    return TIDE_EINVAL;
  }
  for (;;) {
    uint32_t op;
    char *k;
    void *v;
    size_t n;
    int rc = read_frame(watch, &op, &k, &v, &n);
    if (rc <= 0) return rc;
    if (op == TIDE__STORE_OP_EVENT) {
      *key = k;
      *value = v;
      *len = n;
      return 1;
    }
    tide__free(k); /* a BYE we did not ask for: nothing to report */
    tide__free(v);
  }
}

void tide__store_watch_close(tide__store_watch_t *watch) {
  if (watch == NULL) return;
  if (watch->failed_rc == 0) {
    int64_t deadline = tide__deadline_after_ms(BYE_TIMEOUT_MS);
    uint8_t head[TIDE__STORE_REQUEST_BYTES];
    tide__store_request_t req = {TIDE__STORE_OP_BYE, 0, 0, 0};
    tide__store_request_encode(head, &req);
    /* Read (and drop) events until the server confirms BYE: closing with
     * unread bytes would reset the connection instead of ending it. */
    int rc = tide__send_all(watch->fd, head, sizeof head, deadline);
    while (rc == 0) {
      uint32_t op;
      char *key;
      void *value;
      size_t len;
      rc = read_frame(watch, &op, &key, &value, &len);
      if (rc == 1) {
        tide__free(key);
        tide__free(value);
        rc = op == TIDE__STORE_OP_BYE ? 1 : 0;
      } else if (rc == 0) {
        struct pollfd p = {watch->fd, POLLIN, 0};
        int n = poll(&p, 1, tide__ms_left(deadline));
        if (n == 0 || (n < 0 && errno != EINTR)) rc = TIDE_ETIMEDOUT;
      }
    }
  }
  close(watch->fd);
  tide__free(watch->key);
  tide__free(watch->value);
  tide__free(watch);
}
