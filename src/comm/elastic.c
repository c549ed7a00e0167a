/* Elastic membership (docs/elastic.md): the members of an elastic job are a
 * numbered epoch in the store. A change (a worker died, one is released, new
 * ones wait to join) seals epoch e+1: its members build a new communicator
 * (named "x<e+1>", so that a connection or segment of an older epoch never
 * matches it) and go on; the old communicator is only destroyed.
 *
 * Store keys (all under "elastic/"):
 *   ids                   counter naming joiners "j<n>" (first members are "r<rank>")
 *   joiners               counter: slot k = 1, 2, ... of a worker waiting to join
 *   joiner/<k>            the id in slot k
 *   admitted              joiner slots a change has consumed (admitted or skipped)
 *   admit/<id>            the epoch joiner id was admitted to
 *   epoch                 the newest sealed epoch
 *   e<N>/here/<id>        member id arrived at the change to epoch N
 *   e<N>/proposer         counter: the first member to arrive proposes epoch N
 *   e<N>/by/<g>           the id proposing epoch N, generation g (1: the first to arrive)
 *   e<N>/claim/<g>        counter: the first member to see proposer g dead proposes as g + 1
 *   e<N>/members          "id id ..." in rank order, or "! why" when the job cannot go on
 *   target                the requested number of workers (tide_elastic_request)
 *   done                  training finished: waiting joiners give up
 * A member that died is seen through the store's "event/lost/<ns>:<rank>",
 * set when its communicator's watch connection drops, and every process
 * of the job through "event/lost/elastic-id:<id>": each keeps a watch
 * named after its id (struct tide__membership's alive) from its first
 * membership or its request to join until it exits, handed from epoch to
 * epoch, so its death is seen in every phase: waiting to join, connecting
 * a new epoch, or in one.
 *
 * An epoch whose communicator cannot connect (a member died after it was
 * sealed, before the connections were made) is never entered: the members
 * that are alive mark themselves arrived at the next epoch and its
 * proposer seals it over the failed epoch's list without the dead, so a
 * retry has its own epoch number and names (connections, segments).
 *
 * Threads: like the communicator, one thread at a time per communicator. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"

#define ID_CAP 24
#define POLL_MS 2
/* Epochs that failed to connect, in a row, before a change gives up. */
#define CONNECT_ATTEMPTS 4

struct tide__membership {
  long epoch;
  char id[ID_CAP]; /* this process */
  int count;
  char (*ids)[ID_CAP]; /* by rank */
  int joined; /* this process joined a running job into this epoch */
  tide__store_watch_t *alive; /* "elastic-id:<id>", while this process lives (see the top) */
};

static void nap_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

void tide__membership_free(struct tide__membership *m) {
  if (m == NULL) return;
  tide__store_watch_close(m->alive);
  tide__free(m->ids);
  tide__free(m);
}

static int alive_open(const char *host, int port, const char *token, const char *id, int64_t timeout_ms,
                      tide__store_watch_t **out) {
  char name[64];
  snprintf(name, sizeof name, "elastic-id:%s", id);
  return tide__store_watch_open(host, port, token, name, (int)timeout_ms, out);
}

/* The watch receives every event of the job; nobody reads them: drop what
 * has come, so they never pile up. */
static void alive_drain(tide__store_watch_t *watch) {
  char *key;
  void *value;
  size_t len;
  while (watch != NULL && tide__store_watch_next(watch, &key, &value, &len) > 0) {
    tide__free(key);
    tide__free(value);
  }
}

static struct tide__membership *membership_alloc(long epoch, const char *id, int count) {
  struct tide__membership *m = tide__calloc(1, sizeof *m);
  if (m == NULL) return NULL;
  m->ids = tide__calloc((size_t)count, sizeof *m->ids);
  if (m->ids == NULL) {
    tide__free(m);
    return NULL;
  }
  m->epoch = epoch;
  m->count = count;
  snprintf(m->id, sizeof m->id, "%s", id);
  return m;
}

int tide__membership_start(tide_comm_t *comm) {
  char id[ID_CAP];
  snprintf(id, sizeof id, "r%d", comm->rank);
  struct tide__membership *m = membership_alloc(0, id, comm->size);
  if (m == NULL) return TIDE_ENOMEM;
  for (int r = 0; r < comm->size; r++) snprintf(m->ids[r], ID_CAP, "r%d", r);
  int rc = alive_open(comm->store_host, comm->store_port, comm->token, id, comm->timeout_ms, &m->alive);
  if (rc != 0) {
    TIDE_ERROR("elastic: %s cannot open its watch on the job's store: %s", id, tide_strerror(rc));
    tide__membership_free(m);
    return rc;
  }
  comm->membership = m;
  return 0;
}

/* ---- store helpers -------------------------------------------------------------- */

/* 1 and the value when key exists now, 0 when it does not. */
static int peek(tide_store_t *store, const char *key, char *out, size_t cap) {
  void *value;
  size_t len;
  int rc = tide_store_get(store, key, 0, &value, &len);
  if (rc == TIDE_ETIMEDOUT) return 0;
  if (rc != 0) return rc;
  size_t n = len < cap - 1 ? len : cap - 1;
  memcpy(out, value, n);
  out[n] = '\0';
  tide__free(value);
  return 1;
}

static int put(tide_store_t *store, const char *key, const char *value) {
  return tide_store_set(store, key, value, strlen(value));
}

static int counter(tide_store_t *store, const char *key, int64_t *out) { return tide_store_add(store, key, 0, out); }

/* The number of ids in "id id ...". */
static int count_ids(const char *text) {
  int count = 0;
  for (const char *p = text; *p;) {
    p += strspn(p, " ");
    if (*p == 0) break;
    count++;
    p += strcspn(p, " ");
  }
  return count;
}

/* Splits "id id ..." into m (count and ids). */
static int parse_members(const char *text, long epoch, const char *me, struct tide__membership **out, int *my_rank) {
  int count = count_ids(text);
  if (count == 0) return TIDE_EPROTO;
  struct tide__membership *m = membership_alloc(epoch, me, count);
  if (m == NULL) return TIDE_ENOMEM;
  int r = 0;
  *my_rank = -1;
  for (const char *p = text; *p && r < count;) {
    p += strspn(p, " ");
    size_t n = strcspn(p, " ");
    if (n >= ID_CAP) {
      tide__membership_free(m);
      return TIDE_EPROTO;
    }
    memcpy(m->ids[r], p, n);
    m->ids[r][n] = '\0';
    if (strcmp(m->ids[r], me) == 0) *my_rank = r;
    r++;
    p += n;
  }
  *out = m;
  return 0;
}

/* ---- the change ---------------------------------------------------------------- */

/* 1 when the process of member `id` is known dead (its liveness watch
 * dropped), 0 when not, or an error. */
static int member_lost(tide_store_t *store, const char *id) {
  char key[96], value[64];
  snprintf(key, sizeof key, "event/lost/elastic-id:%s", id);
  return peek(store, key, value, sizeof value);
}

/* The proposer of epoch `next`: waits until every member of epoch m (its
 * communicator named ns; NULL when that epoch never connected) has arrived
 * or is known dead (or the limit passed), then writes the members: the
 * arrived ones in rank order without `exclude`, cut to `size`, then waiting
 * joiners up to `size` (0: up to TIDE_ELASTIC_MAX). */
static int propose(tide_store_t *store, const struct tide__membership *m, const char *ns, long next, int size,
                   int exclude) {
  int64_t deadline = tide__deadline_after_ms(tide__param_int(TIDE__PARAM_ELASTIC_TIMEOUT_MS));
  int n = m->count, rc = 0;
  int *state = tide__calloc((size_t)n, sizeof *state); /* 0 unknown, 1 here, 2 gone */
  if (state == NULL) return TIDE_ENOMEM;
  char key[200], value[64];
  for (int left = n; left > 0;) {
    for (int r = 0; r < n; r++) {
      if (state[r] != 0) continue;
      /* One that arrived and died since (a proposer killed while it
       * proposed, whose place a survivor took: await_members) is gone. */
      snprintf(key, sizeof key, "elastic/e%ld/here/%s", next, m->ids[r]);
      int here = peek(store, key, value, sizeof value);
      snprintf(key, sizeof key, "event/lost/%s:%d", ns != NULL ? ns : "-", r);
      int lost = here >= 0 && ns != NULL ? peek(store, key, value, sizeof value) : 0;
      if (here >= 0 && lost == 0) lost = member_lost(store, m->ids[r]);
      if (here < 0 || lost < 0) {
        rc = here < 0 ? here : lost;
        goto out;
      }
      if (here || lost) {
        state[r] = lost ? 2 : 1;
        left--;
      }
    }
    if (left == 0) break;
    if (tide__now_ns() >= deadline) {
      for (int r = 0; r < n; r++)
        if (state[r] == 0) {
          TIDE_WARN("elastic: member %s (rank %d of epoch %ld) neither arrived nor died within "
                    "TIDE_ELASTIC_TIMEOUT_MS; epoch %ld goes on without it",
                    m->ids[r], r, m->epoch, next);
          state[r] = 2;
        }
      break;
    }
    nap_ms(POLL_MS);
  }
  int max = (int)tide__param_int(TIDE__PARAM_ELASTIC_MAX), min = (int)tide__param_int(TIDE__PARAM_ELASTIC_MIN);
  int want = size > 0 ? size : max;
  if (want > max) want = max;
  char list[4096] = "";
  size_t at = 0;
  int count = 0;
  for (int r = 0; r < n; r++) {
    if (state[r] != 1 || r == exclude || count >= want) continue;
    /* A scheduler marks the members it takes off a host (elastic/leave/ID). */
    snprintf(key, sizeof key, "elastic/leave/%s", m->ids[r]);
    int leave = peek(store, key, value, sizeof value);
    if (leave < 0) {
      rc = leave;
      goto out;
    }
    if (leave) continue;
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", count ? " " : "", m->ids[r]);
    count++;
  }
  int64_t joiners = 0, admitted = 0;
  if ((rc = counter(store, "elastic/joiners", &joiners)) != 0 || (rc = counter(store, "elastic/admitted", &admitted)) != 0)
    goto out;
  char admit_ids[64][ID_CAP];
  int nadmit = 0;
  int64_t slot = admitted;
  while (slot < joiners && count < want && nadmit < 64 && at + ID_CAP + 2 < sizeof list) {
    slot++;
    char id[ID_CAP];
    snprintf(key, sizeof key, "elastic/joiner/%lld", (long long)slot);
    void *v;
    size_t len;
    /* The joiner bumps the counter before it writes its id. */
    if (tide_store_get(store, key, 1000, &v, &len) != 0) continue;
    size_t k = len < ID_CAP - 1 ? len : ID_CAP - 1;
    memcpy(id, v, k);
    id[k] = '\0';
    tide__free(v);
    if (member_lost(store, id) != 0) continue;
    snprintf(admit_ids[nadmit++], ID_CAP, "%s", id);
    at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", count ? " " : "", id);
    count++;
  }
  if ((rc = tide_store_add(store, "elastic/admitted", slot - admitted, &admitted)) != 0) goto out;
  snprintf(key, sizeof key, "elastic/e%ld/members", next);
  if (count < min || count == 0) {
    char why[200];
    snprintf(why, sizeof why, "! %d worker(s) remain, fewer than the minimum of %d (TIDE_ELASTIC_MIN)", count,
             min < 1 ? 1 : min);
    TIDE_ERROR("elastic: epoch %ld cannot start: %s", next, why + 2);
    rc = put(store, key, why);
    goto out;
  }
  if ((rc = put(store, key, list)) != 0) goto out;
  for (int j = 0; j < nadmit; j++) {
    snprintf(key, sizeof key, "elastic/admit/%.23s", admit_ids[j]);
    snprintf(value, sizeof value, "%ld", next);
    if ((rc = put(store, key, value)) != 0) goto out;
  }
  int64_t sealed;
  rc = tide_store_add(store, "elastic/epoch", next - m->epoch, &sealed);
  TIDE_INFO("elastic: epoch %ld: %d member(s): %s", next, count, list);
out:
  tide__free(state);
  return rc;
}

/* What a member that arrived at an epoch needs to propose it: the epoch it
 * comes from (m, its communicator named ns, or NULL) and the change asked
 * (size, exclude: as tide_comm_resize). */
typedef struct {
  const struct tide__membership *m;
  const char *ns;
  int size, exclude;
} proposal_t;

/* Marks `me` arrived at epoch next; the first to arrive proposes it (the
 * proposer of generation 1: e<next>/by/1). */
static int arrive(tide_store_t *store, const proposal_t *p, const char *me, long next) {
  char key[200];
  snprintf(key, sizeof key, "elastic/e%ld/here/%s", next, me);
  TIDE_CHECK(put(store, key, "1"));
  snprintf(key, sizeof key, "elastic/e%ld/proposer", next);
  int64_t order;
  TIDE_CHECK(tide_store_add(store, key, 1, &order));
  if (order != 1) return 0;
  snprintf(key, sizeof key, "elastic/e%ld/by/1", next);
  TIDE_CHECK(put(store, key, me));
  return propose(store, p->m, p->ns, next, p->size, p->exclude);
}

/* Waits for the members of epoch into *value (the timeout: twice
 * TIDE_ELASTIC_TIMEOUT_MS, the proposer's own wait and as much again). A
 * proposer can die before it seals the epoch (a host lost during a change
 * takes the member that failed first, and arrived first, with it): a
 * member that arrived (p; NULL for a joiner) sees it lost, and the first
 * to claim its place (e<epoch>/claim/<g>) proposes as generation g + 1. */
static int await_members(tide_store_t *store, long epoch, const char *me, const proposal_t *p, void **value,
                         size_t *len) {
  int64_t limit = tide__param_int(TIDE__PARAM_ELASTIC_TIMEOUT_MS);
  int64_t deadline = tide__deadline_after_ms(2 * limit);
  char key[96], by[ID_CAP];
  long gen = 1;
  for (;;) {
    int64_t left_ms = (deadline - tide__now_ns()) / 1000000;
    if (left_ms <= 0) return TIDE_ETIMEDOUT;
    snprintf(key, sizeof key, "elastic/e%ld/members", epoch);
    int64_t wait_ms = p != NULL && left_ms > 200 ? 200 : left_ms < 2147483647 ? left_ms : 2147483647;
    int rc = tide_store_get(store, key, (int)wait_ms, value, len);
    if (rc != TIDE_ETIMEDOUT || p == NULL) return rc;
    for (;;) {
      snprintf(key, sizeof key, "elastic/e%ld/by/%ld", epoch, gen);
      int have = peek(store, key, by, sizeof by);
      int lost = have > 0 ? member_lost(store, by) : have;
      if (lost <= 0) {
        if (lost < 0) return lost;
        break; /* no proposer of this generation yet, or it lives */
      }
      snprintf(key, sizeof key, "elastic/e%ld/claim/%ld", epoch, gen);
      int64_t claim;
      TIDE_CHECK(tide_store_add(store, key, 1, &claim));
      gen++;
      if (claim != 1) continue; /* another survivor took the place */
      TIDE_WARN("elastic: %s died while it proposed epoch %ld; %s proposes it instead", by, epoch, me);
      snprintf(key, sizeof key, "elastic/e%ld/by/%ld", epoch, gen);
      TIDE_CHECK(put(store, key, me));
      TIDE_CHECK(propose(store, p->m, p->ns, epoch, p->size, p->exclude));
      deadline = tide__deadline_after_ms(2 * limit);
      break;
    }
  }
}

/* Waits for the members of epoch (written by its proposer) and connects to
 * them: *out is the new communicator, or NULL when this process is not a
 * member. *alive (this process's liveness watch) passes to the new
 * communicator's membership. p: the change this process arrived with (NULL
 * for a joiner). When the members cannot connect (one died after the epoch
 * was sealed), those alive go on to the next epoch over the same list,
 * without the dead. */
static int enter_epoch(tide_store_t *store, const char *host, int port, const char *token, long epoch,
                       const char *me, int joined, const proposal_t *p, tide__store_watch_t **alive,
                       tide_comm_t **out) {
  int64_t limit = tide__param_int(TIDE__PARAM_ELASTIC_TIMEOUT_MS);
  char text[4096];
  struct tide__membership *failed = NULL; /* the epoch that could not connect, which the retry comes from */
  proposal_t retry;
  int rc = 0;
  for (int attempt = 1;; attempt++, epoch++) {
    void *value;
    size_t len;
    rc = await_members(store, epoch, me, p, &value, &len);
    if (rc != 0) {
      TIDE_ERROR("elastic: no membership for epoch %ld appeared (its proposer and every member that could "
                 "take its place died, or the store is gone): %s",
                 epoch, tide_strerror(rc));
      break;
    }
    size_t n = len < sizeof text - 1 ? len : sizeof text - 1;
    memcpy(text, value, n);
    text[n] = '\0';
    tide__free(value);
    if (text[0] == '!') {
      TIDE_ERROR("elastic: epoch %ld cannot start: %s", epoch, text + 1);
      rc = TIDE_EPEER;
      break;
    }
    struct tide__membership *m;
    int my_rank;
    if ((rc = parse_members(text, epoch, me, &m, &my_rank)) != 0) break;
    tide__membership_free(failed);
    failed = NULL;
    if (my_rank < 0) {
      TIDE_INFO("elastic: %s is not a member of epoch %ld (%s): it leaves the job", me, epoch, text);
      tide__membership_free(m);
      *out = NULL;
      break;
    }
    char ns[32];
    snprintf(ns, sizeof ns, "x%ld", epoch);
    tide_comm_t *comm;
    tide__log_set_rank(my_rank);
    rc = tide__comm_create(host, port, token, ns, my_rank, m->count, limit, &comm);
    if (rc == 0) {
      m->joined = joined;
      m->alive = *alive;
      *alive = NULL;
      comm->membership = m;
      *out = comm;
      break;
    }
    if (attempt == CONNECT_ATTEMPTS) {
      TIDE_ERROR("elastic: %s could not connect to the %d members of epoch %ld, the %d%s attempt in a row: %s", me,
                 m->count, epoch, attempt, attempt == 2 ? "nd" : attempt == 3 ? "rd" : "th", tide_strerror(rc));
      tide__membership_free(m);
      break;
    }
    TIDE_WARN("elastic: %s could not connect to the %d members of epoch %ld (%s: a member died or is stuck); the "
              "members that are alive go on to epoch %ld without the others",
              me, m->count, epoch, tide_strerror(rc), epoch + 1);
    alive_drain(*alive);
    failed = m;
    retry = (proposal_t){failed, NULL, failed->count, -1};
    p = &retry;
    if ((rc = arrive(store, p, me, epoch + 1)) != 0) break;
  }
  tide__membership_free(failed);
  return rc;
}

long tide_comm_epoch(const tide_comm_t *comm) {
  return comm != NULL && comm->membership != NULL ? comm->membership->epoch : -1;
}

int tide_comm_joined(const tide_comm_t *comm) { return comm != NULL && comm->membership != NULL && comm->membership->joined; }

int tide_comm_resize(tide_comm_t *comm, int size, int exclude, tide_comm_t **out) {
  if (comm == NULL || out == NULL) return tide__null_arg("tide_comm_resize", comm == NULL ? "comm" : "out");
  if (comm->membership == NULL || comm->store == NULL) {
    TIDE_ERROR("tide_comm_resize: the communicator is not elastic (start the job with tiderun --elastic, or "
               "set TIDE_ELASTIC=1 on every rank)");
    return TIDE_ESTATE;
  }
  if (size < 0 || exclude < -1 || exclude >= comm->size) {
    TIDE_ERROR("tide_comm_resize: size %d must be >= 0 (0: everyone available) and exclude %d a rank of the "
               "communicator or -1",
               size, exclude);
    return TIDE_EINVAL;
  }
  struct tide__membership *m = comm->membership;
  long next = m->epoch + 1;
  char key[200];
  /* A member of an older epoch than the newest sealed one is stale: the job
   * went on without it. */
  int64_t sealed = 0;
  TIDE_CHECK(counter(comm->store, "elastic/epoch", &sealed));
  if (sealed >= next) {
    snprintf(key, sizeof key, "elastic/e%ld/here/%s", next, m->id);
    char v[8];
    if (peek(comm->store, key, v, sizeof v) == 0) {
      TIDE_ERROR("tide_comm_resize: %s (rank %d of epoch %ld) is stale: the job has gone on to epoch %lld "
                 "without it",
                 m->id, comm->rank, m->epoch, (long long)sealed);
      return TIDE_ESTATE;
    }
  }
  alive_drain(m->alive);
  proposal_t p = {m, comm->ns, size, exclude};
  TIDE_CHECK(arrive(comm->store, &p, m->id, next));
  return enter_epoch(comm->store, comm->store_host, comm->store_port, comm->token, next, m->id, 0, &p, &m->alive,
                     out);
}

/* ---- joining a running job --------------------------------------------------------- */

int tide__elastic_join(tide_comm_t **out) {
  const char *rdzv = tide__param_str(TIDE__PARAM_RDZV), *token = tide__param_str(TIDE__PARAM_JOB_TOKEN);
  char host[256];
  int port;
  if (rdzv[0] == '\0' || token[0] == '\0' || tide__parse_host_port(rdzv, host, sizeof host, &port) != 0) {
    TIDE_ERROR("TIDE_ELASTIC_JOIN=1: TIDE_RDZV (host:port of the job's store) and TIDE_JOB_TOKEN must be set "
               "to join a running job");
    return TIDE_EINVAL;
  }
  int64_t timeout = tide__param_int(TIDE__PARAM_TIMEOUT_MS);
  tide_store_t *store = NULL;
  tide__store_watch_t *watch = NULL;
  int rc = tide_store_connect(host, port, token, (int)timeout, &store);
  if (rc != 0) {
    TIDE_ERROR("elastic: cannot join the job at %s: %s", rdzv, tide_strerror(rc));
    return rc;
  }
  int64_t n, slot;
  char id[ID_CAP], key[200], value[64];
  TIDE_CHECK_GOTO(tide_store_add(store, "elastic/ids", 1, &n), rc, out);
  snprintf(id, sizeof id, "j%lld", (long long)n);
  /* Watched from before it asks, so its death while waiting is seen. */
  TIDE_CHECK_GOTO(alive_open(host, port, token, id, timeout, &watch), rc, out);
  int64_t node = tide__param_int(TIDE__PARAM_NODE_RANK);
  if (node >= 0) { /* where it runs, for a scheduler, before it asks */
    snprintf(key, sizeof key, "elastic/node/%s", id);
    snprintf(value, sizeof value, "%lld", (long long)node);
    TIDE_CHECK_GOTO(put(store, key, value), rc, out);
  }
  TIDE_CHECK_GOTO(tide_store_add(store, "elastic/joiners", 1, &slot), rc, out);
  snprintf(key, sizeof key, "elastic/joiner/%lld", (long long)slot);
  TIDE_CHECK_GOTO(put(store, key, id), rc, out);
  TIDE_INFO("elastic: %s waits to be admitted (joiner slot %lld)", id, (long long)slot);
  int64_t deadline = tide__deadline_after_ms(timeout);
  long epoch = -1;
  snprintf(key, sizeof key, "elastic/admit/%s", id);
  while (epoch < 0) {
    void *v;
    size_t len;
    rc = tide_store_get(store, key, 100, &v, &len);
    if (rc == 0) {
      size_t k = len < sizeof value - 1 ? len : sizeof value - 1;
      memcpy(value, v, k);
      value[k] = '\0';
      tide__free(v);
      epoch = atol(value);
      break;
    }
    if (rc != TIDE_ETIMEDOUT) goto out;
    int done = peek(store, "elastic/done", value, sizeof value);
    if (done != 0) {
      rc = done < 0 ? done : TIDE_ESTATE;
      if (done > 0) TIDE_INFO("elastic: the job finished before %s was admitted", id);
      goto out;
    }
    if (tide__now_ns() >= deadline) {
      TIDE_ERROR("elastic: %s waited %lld ms to be admitted to the job (TIDE_TIMEOUT_MS); is it at its "
                 "TIDE_ELASTIC_MAX or asked for fewer workers?",
                 id, (long long)timeout);
      rc = TIDE_ETIMEDOUT;
      goto out;
    }
  }
  tide_comm_t *comm = NULL;
  rc = enter_epoch(store, host, port, token, epoch, id, 1, NULL, &watch, &comm);
  if (rc == 0 && comm == NULL) {
    /* Admitted, but a retry after an epoch that could not connect went on
     * without it (it failed later than the others). */
    TIDE_ERROR("elastic: %s was admitted to epoch %ld, but the job went on without it", id, epoch);
    rc = TIDE_EPEER;
  }
  if (rc == 0) *out = comm;
out:
  tide__store_watch_close(watch);
  tide_store_close(store);
  return rc;
}

/* ---- requests ------------------------------------------------------------------------ */

int tide_elastic_request(tide_store_t *store, int size) {
  if (store == NULL) return tide__null_arg("tide_elastic_request", "store");
  if (size < 0) {
    TIDE_ERROR("tide_elastic_request: size %d must be >= 0 (0 withdraws the request)", size);
    return TIDE_EINVAL;
  }
  char value[32];
  snprintf(value, sizeof value, "%d", size);
  return put(store, "elastic/target", value);
}

/* A counter's value without creating it (tide_store_add would): 1 and *out
 * when the key is set, 0 when absent, or an error. */
static int peek_counter(tide_store_t *store, const char *key, int64_t *out) {
  char value[32];
  int got = peek(store, key, value, sizeof value);
  if (got <= 0) return got;
  TIDE_CHECK(counter(store, key, out));
  return 1;
}

/* The job's requests: *target (-1 when never asked) and the joiner
 * counters; the three store round trips a member pays at each step
 * boundary (tide_comm_elastic_status). */
static int read_requests(tide_store_t *store, int *target, int64_t *joiners, int64_t *admitted) {
  char value[32];
  int got = peek(store, "elastic/target", value, sizeof value);
  if (got < 0) return got;
  *target = got ? atoi(value) : -1;
  TIDE_CHECK(counter(store, "elastic/joiners", joiners));
  TIDE_CHECK(counter(store, "elastic/admitted", admitted));
  return 0;
}

int tide_elastic_status(tide_store_t *store, tide_elastic_status_t *out) {
  if (store == NULL || out == NULL) return tide__null_arg("tide_elastic_status", store == NULL ? "store" : "out");
  tide_elastic_status_t st = {.epoch = -1, .members = -1, .target = -1};
  char key[64], value[4096];
  int64_t n = 0;
  int got = peek_counter(store, "elastic/epoch", &n);
  if (got < 0) return got;
  if (got) st.epoch = (long)n;
  if (st.epoch > 0) {
    snprintf(key, sizeof key, "elastic/e%ld/members", st.epoch);
    got = peek(store, key, value, sizeof value);
    if (got < 0) return got;
    if (got && value[0] == '!') {
      st.failed = 1;
      st.members = 0;
    } else if (got) {
      st.members = count_ids(value);
    }
  }
  int64_t joiners, admitted;
  TIDE_CHECK(read_requests(store, &st.target, &joiners, &admitted));
  st.joiners = (long)joiners;
  st.admitted = (long)admitted;
  st.waiting = (int)(joiners - admitted);
  if ((got = peek(store, "elastic/done", value, sizeof value)) < 0) return got;
  st.done = got;
  *out = st;
  return 0;
}

int tide_comm_elastic_status(tide_comm_t *comm, int *target, int *waiting) {
  if (comm == NULL || target == NULL || waiting == NULL)
    return tide__null_arg("tide_comm_elastic_status", comm == NULL ? "comm" : target == NULL ? "target" : "waiting");
  if (comm->membership == NULL || comm->store == NULL) {
    *target = *waiting = 0;
    return 0;
  }
  int asked;
  int64_t joiners, admitted;
  TIDE_CHECK(read_requests(comm->store, &asked, &joiners, &admitted));
  *target = asked > 0 ? asked : 0;
  *waiting = (int)(joiners - admitted);
  return 0;
}

int tide_comm_elastic_request(tide_comm_t *comm, int size) {
  if (comm == NULL) return tide__null_arg("tide_comm_elastic_request", "comm");
  if (comm->membership == NULL || comm->store == NULL) {
    TIDE_ERROR("tide_comm_elastic_request: the communicator is not elastic (start the job with tiderun --elastic)");
    return TIDE_ESTATE;
  }
  return tide_elastic_request(comm->store, size);
}

int tide_comm_elastic_finish(tide_comm_t *comm) {
  if (comm == NULL || comm->membership == NULL || comm->store == NULL) return 0;
  return put(comm->store, "elastic/done", "1");
}

int tide_comm_publish(tide_comm_t *comm, const char *key, const char *value) {
  if (comm == NULL) return tide__null_arg("tide_comm_publish", "comm");
  if (key == NULL || *key == 0 || value == NULL) {
    TIDE_ERROR("tide_comm_publish: key must be a non-empty string and value not NULL");
    return TIDE_EINVAL;
  }
  if (comm->store == NULL) return TIDE_ESTATE;
  return put(comm->store, key, value);
}
