/* tide error codes: one table, negative values, errno-mapped where one fits. */
#ifndef TIDE_ERRORS_H
#define TIDE_ERRORS_H

#include <errno.h>

/* XX(name, value, message) */
#define TIDE_ERRNO_MAP(XX)                                                          \
  XX(EINVAL, -EINVAL, "invalid argument")                                           \
  XX(ENOMEM, -ENOMEM, "out of memory")                                              \
  XX(EIO, -EIO, "i/o error")                                                        \
  XX(ETIMEDOUT, -ETIMEDOUT,                                                         \
     "timed out (TIDE_TIMEOUT_MS bounds waits for peers, TIDE_DATA_TIMEOUT_MS reads from a data source)") \
  XX(ENOENT, -ENOENT, "no such key or file")                                        \
  XX(ECONNREFUSED, -ECONNREFUSED, "connection refused")                             \
  XX(ENOSYS, -ENOSYS, "not supported in this build")                                \
  XX(EADDRINUSE, -EADDRINUSE, "address already in use (another process listens on that port)") \
  XX(EPEER, -3001, "a peer failed or disconnected; this communicator is unusable")  \
  XX(EMISMATCH, -3002, "collective calls do not match across ranks")                \
  XX(EABORTED, -3003, "communicator aborted")                                       \
  XX(EAUTH, -3004, "authentication refused: the job token does not match")          \
  XX(EPROTO, -3005, "malformed or oversized frame on the wire")                     \
  XX(ESTATE, -3006, "call not valid in the object's current state")

enum {
#define XX(name, value, msg) TIDE_##name = (value),
  TIDE_ERRNO_MAP(XX)
#undef XX
};

/* Propagation for functions that return 0 or a negative TIDE_E* code:
 * TIDE_CHECK returns the failing call's code; TIDE_CHECK_GOTO stores it in
 * rc and jumps to the one cleanup label. */
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

#endif
