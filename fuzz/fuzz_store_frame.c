/* libFuzzer harness: the store server's request parser and its handling of
 * every op, fed arbitrary bytes as one or two clients would send them.
 *
 * The server keeps its parser static, so this file includes server.c and
 * drives a connection's input buffer directly, as conn_read() does after a
 * recv: the same code paths, without sockets between the fuzzer and the
 * parser (the answers go to a socketpair nobody reads). The input is split
 * into chunks by its first bytes, so frames arrive whole, torn or
 * interleaved between two connections. */
#include "../src/store/server.c"

#include <sys/socket.h>

static conn_t *fuzz_conn(tide_store_server_t *s, int state, int *peer_fd) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return NULL;
  conn_t *c = tide__calloc(1, sizeof *c);
  c->fd = sv[0];
  *peer_fd = sv[1];
  c->state = state;
  snprintf(c->peer, sizeof c->peer, "fuzz:%zu", s->conn_count);
  tide__auth_server_hello(c->hello);
  c->auth_deadline_ns = tide__deadline_after_ms(AUTH_TIMEOUT_MS);
  s->conns[s->conn_count++] = c;
  return c;
}

/* Reads and drops what the server answered, so its output never fills. */
static void drain(int fd) {
  char sink[65536];
  while (read(fd, sink, sizeof sink) > 0) {
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int once;
  if (!once) {
    once = 1;
    tide__log_level = TIDE__LOG_ERROR; /* refusals are the point: keep the output short */
  }
  if (size < 1) return 0;
  tide_store_server_t s;
  memset(&s, 0, sizeof s);
  s.max_value = 1 << 20;
  s.max_pending = 8;
  s.bucket_count = 16;
  s.buckets = tide__calloc(s.bucket_count, sizeof *s.buckets);
  s.token = "fuzz-token";
  s.conn_cap = 2;
  s.conns = tide__calloc(s.conn_cap, sizeof *s.conns);
  int peers[2];
  /* Bit 0: the first connection is still proving the token; bit 1: a second one. */
  uint8_t flags = data[0];
  data++, size--;
  conn_t *conns[2];
  conns[0] = fuzz_conn(&s, flags & 1 ? CONN_AUTH : CONN_READY, &peers[0]);
  int nconns = 1;
  if (flags & 2) conns[nconns] = fuzz_conn(&s, CONN_READY, &peers[nconns]), nconns++;
  /* Chunks: one length byte (and which connection), then that many bytes. */
  while (size > 0) {
    size_t len = data[0] & 0x7f;
    conn_t *c = conns[(data[0] >> 7) % nconns];
    data++, size--;
    if (len == 0x7f) len = size; /* the rest at once */
    if (len > size) len = size;
    if (!c->dead && len > 0) {
      if (buf_reserve(&c->in, len) == 0) {
        memcpy(c->in.data + c->in.len, data, len);
        c->in.len += len;
        if (c->state == CONN_AUTH) auth_step(&s, c);
        process_input(&s, c);
      }
    }
    data += len, size -= len;
    drain_input(&s);
    for (int i = 0; i < nconns; i++) drain(peers[i]);
  }
  expire(&s);
  /* Closing a watcher that never said goodbye publishes its loss. */
  for (size_t i = 0; i < s.conn_count; i++) s.conns[i]->dead = true;
  sweep(&s);
  for (int i = 0; i < nconns; i++) close(peers[i]);
  tide__free(s.conns);
  table_free(&s);
  return 0;
}
