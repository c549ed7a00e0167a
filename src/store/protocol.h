/* Wire format of the rendezvous store, shared by server.c and client.c.
 *
 * Every integer is little endian, encoded byte by byte (never a struct
 * memcpy), so hosts of any byte order and padding agree.
 *
 *   request  (32 bytes) magic u32 | op u32 | key_len u32 | 0 u32 | value_len u64 | arg i64
 *            then key_len bytes of key, then value_len bytes of value
 *   response (24 bytes) magic u32 | status i32 | value_len u64 | result i64
 *            then value_len bytes of value
 *
 * A client sends one request and reads one response. A watch connection
 * sends WATCH(name), reads its response, and from then on reads request-
 * layout frames pushed by the server: EVENT(key, value) for every SET of an
 * "event/" key, and finally BYE, the answer to its own BYE, after which the
 * server sends nothing more (so the client's close is a clean FIN, never a
 * reset that could lose the goodbye). */
#ifndef TIDE_STORE_PROTOCOL_H
#define TIDE_STORE_PROTOCOL_H

#include <stdint.h>

#include "core/core.h"

#define TIDE__STORE_REQUEST_MAGIC 0x31515354u  /* "TSQ1" */
#define TIDE__STORE_RESPONSE_MAGIC 0x31525354u /* "TSR1" */
#define TIDE__STORE_REQUEST_BYTES 32
#define TIDE__STORE_RESPONSE_BYTES 24
#define TIDE__STORE_MAX_KEY 4096
/* Watch names become "event/lost/<name>", which must still be a valid key. */
#define TIDE__STORE_LOST_PREFIX "event/lost/"
#define TIDE__STORE_EVENT_PREFIX "event/"

/* Ops. key/value/arg/result per op:
 *   SET     key, value                          -> -
 *   GET     key, arg = timeout_ms (>= 0)        -> value (parked until the key exists)
 *   WAIT    value = keys, each NUL-terminated, arg = timeout_ms -> - (parked likewise;
 *           done once each key has been seen to exist, even if deleted since)
 *   ADD     key, arg = delta                    -> result = new value (8 bytes LE at key)
 *   DELETE  key                                 -> - (ENOENT if missing)
 *   WATCH   key = name                          -> - ; the connection becomes a watch
 *   BYE     -                                   (watch only) -> BYE frame, then silence
 *   EVENT   key, value                          (server to watcher only) */
enum {
  TIDE__STORE_OP_SET = 1,
  TIDE__STORE_OP_GET,
  TIDE__STORE_OP_WAIT,
  TIDE__STORE_OP_ADD,
  TIDE__STORE_OP_DELETE,
  TIDE__STORE_OP_WATCH,
  TIDE__STORE_OP_BYE,
  TIDE__STORE_OP_EVENT,
};

/* Statuses on the wire are our own small numbers, not errno values, which
 * differ between operating systems. */
enum {
  TIDE__STORE_OK = 0,
  TIDE__STORE_ETIMEDOUT = 1,
  TIDE__STORE_ENOENT = 2,
  TIDE__STORE_EINVAL = 3,
  TIDE__STORE_ENOMEM = 4,
};

typedef struct {
  uint32_t op;
  uint32_t key_len;
  uint64_t value_len;
  int64_t arg;
} tide__store_request_t;

typedef struct {
  int32_t status; /* TIDE__STORE_OK ... */
  uint64_t value_len;
  int64_t result;
} tide__store_response_t;

static inline void tide__store_put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tide__store_put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t tide__store_get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static inline uint64_t tide__store_get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static inline void tide__store_request_encode(uint8_t out[TIDE__STORE_REQUEST_BYTES],
                                              const tide__store_request_t *req) {
  tide__store_put32(out, TIDE__STORE_REQUEST_MAGIC);
  tide__store_put32(out + 4, req->op);
  tide__store_put32(out + 8, req->key_len);
  tide__store_put32(out + 12, 0);
  tide__store_put64(out + 16, req->value_len);
  tide__store_put64(out + 24, (uint64_t)req->arg);
}

/* TIDE_EPROTO when the magic is wrong; lengths are checked by the caller. */
static inline int tide__store_request_decode(const uint8_t in[TIDE__STORE_REQUEST_BYTES],
                                             tide__store_request_t *req) {
  if (tide__store_get32(in) != TIDE__STORE_REQUEST_MAGIC) return TIDE_EPROTO;
  req->op = tide__store_get32(in + 4);
  req->key_len = tide__store_get32(in + 8);
  req->value_len = tide__store_get64(in + 16);
  req->arg = (int64_t)tide__store_get64(in + 24);
  return 0;
}

static inline void tide__store_response_encode(uint8_t out[TIDE__STORE_RESPONSE_BYTES],
                                               const tide__store_response_t *resp) {
  tide__store_put32(out, TIDE__STORE_RESPONSE_MAGIC);
  tide__store_put32(out + 4, (uint32_t)resp->status);
  tide__store_put64(out + 8, resp->value_len);
  tide__store_put64(out + 16, (uint64_t)resp->result);
}

static inline int tide__store_response_decode(const uint8_t in[TIDE__STORE_RESPONSE_BYTES],
                                              tide__store_response_t *resp) {
  if (tide__store_get32(in) != TIDE__STORE_RESPONSE_MAGIC) return TIDE_EPROTO;
  resp->status = (int32_t)tide__store_get32(in + 4);
  resp->value_len = tide__store_get64(in + 8);
  resp->result = (int64_t)tide__store_get64(in + 16);
  return 0;
}

/* TIDE_E* code of a wire status; TIDE_EPROTO for one we do not know. */
static inline int tide__store_status_rc(int32_t status) {
  switch (status) {
    case TIDE__STORE_OK: return 0;
    case TIDE__STORE_ETIMEDOUT: return TIDE_ETIMEDOUT;
    case TIDE__STORE_ENOENT: return TIDE_ENOENT;
    case TIDE__STORE_EINVAL: return TIDE_EINVAL;
    case TIDE__STORE_ENOMEM: return TIDE_ENOMEM;
    default: return TIDE_EPROTO;
  }
}

#endif
