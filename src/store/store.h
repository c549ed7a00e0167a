/* Internal store API beyond tide.h: the event stream the communicator uses
 * to learn, within milliseconds, that a peer died or a collective failed.
 *
 * Events: a SET of any key that starts with "event/" is also pushed to every
 * open watch connection (including the setter's own). When a watch
 * connection that registered a name closes without saying goodbye (the
 * process died), the server sets "event/lost/<name>" (value: the name) and
 * pushes that to the remaining watchers. */
#ifndef TIDE_STORE_H
#define TIDE_STORE_H

#include "core/core.h"

typedef struct tide__store_watch tide__store_watch_t;

/* Opens a watch connection registered as `name` (e.g. "job:rank"). */
int tide__store_watch_open(const char *host, int port, const char *token, const char *name,
                           int timeout_ms, tide__store_watch_t **out);
/* An fd that becomes readable when an event (or the server's close) is
 * pending; for poll(). */
int tide__store_watch_fd(const tide__store_watch_t *watch);
/* Reads one pending event without blocking: returns 1 and a key/value the
 * caller frees with tide__free, 0 when none is pending, TIDE_EPEER when the
 * server closed the connection. */
int tide__store_watch_next(tide__store_watch_t *watch, char **key, void **value, size_t *len);
/* Says goodbye (so no lost event is published) and closes. NULL is fine. */
void tide__store_watch_close(tide__store_watch_t *watch);

/* tide_store_get of a text value into out, NUL-terminated and cut to cap
 * (> 0) bytes. */
int tide__store_get_string(tide_store_t *store, const char *key, int timeout_ms, char *out, size_t cap);

/* Waits until the server has at most max_clients connections (0 when they
 * are fewer, TIDE_ETIMEDOUT after timeout_ms). The process that hosts the
 * store under mpirun waits so that it outlives the other ranks' use. */
int tide__store_server_wait_clients(tide_store_server_t *server, size_t max_clients, int timeout_ms);

#endif
