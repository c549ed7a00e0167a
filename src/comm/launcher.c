/* Start-up under launchers other than tiderun: Slurm's hostlist syntax, the
 * rendezvous a Slurm step derives without TIDE_RDZV, how many hosts the
 * launcher says a job spans, and the address to publish when the route to
 * the rendezvous host is loopback (Debian maps a host's own name to
 * 127.0.1.1). Called by comm.c while a communicator starts (one thread). */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm.h"

/* ---- hostlist: "node[01-03,7],gpu-a[1-2]b" -------------------------------- */

typedef struct {
  const char *what; /* the variable named in errors */
  int want;         /* index of the host to copy out */
  int count;        /* hosts seen so far */
  char *out;
  size_t cap;
} hostlist_walk_t;

enum { HOSTLIST_MAX_HOSTS = 1 << 20, HOSTLIST_MAX_NAME = 255 };

static int host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_';
}

static int hostlist_emit(hostlist_walk_t *w, const char *name) {
  if (name[0] == '\0') {
    TIDE_ERROR("%s: an empty host name (two commas in a row, or a trailing comma?)", w->what);
    return TIDE_EINVAL;
  }
  if (w->count == w->want) {
    if (strlen(name) >= w->cap) {
      TIDE_ERROR("%s: host name \"%s\" is longer than %zu characters", w->what, name, w->cap - 1);
      return TIDE_EINVAL;
    }
    strcpy(w->out, name);
  }
  if (++w->count > HOSTLIST_MAX_HOSTS) {
    TIDE_ERROR("%s names more than %d hosts", w->what, HOSTLIST_MAX_HOSTS);
    return TIDE_EINVAL;
  }
  return 0;
}

/* Expands item[0..len) after the already expanded prefix: the first bracket
 * group's values in order, each followed by the expansion of the rest (so
 * "a[1-2]b[3-4]" gives a1b3 a1b4 a2b3 a2b4, as Slurm does). */
static int hostlist_item(hostlist_walk_t *w, const char *prefix, const char *item, size_t len) {
  char name[HOSTLIST_MAX_NAME + 1];
  size_t plen = strlen(prefix), i = 0;
  while (i < len && item[i] != '[') {
    if (!host_char(item[i]) || item[i] == ']') {
      TIDE_ERROR("%s: unexpected '%c' in \"%.*s\" (Slurm hostlist syntax: name[1-4,7],other)", w->what, item[i],
                 (int)len, item);
      return TIDE_EINVAL;
    }
    i++;
  }
  if (plen + i > HOSTLIST_MAX_NAME) {
    TIDE_ERROR("%s: a host name is longer than %d characters", w->what, HOSTLIST_MAX_NAME);
    return TIDE_EINVAL;
  }
  memcpy(name, prefix, plen);
  memcpy(name + plen, item, i);
  name[plen + i] = '\0';
  if (i == len) return hostlist_emit(w, name);
  const char *close = memchr(item + i, ']', len - i);
  if (close == NULL) {
    TIDE_ERROR("%s: '[' without ']' in \"%.*s\"", w->what, (int)len, item);
    return TIDE_EINVAL;
  }
  const char *p = item + i + 1, *rest = close + 1;
  size_t rest_len = len - (size_t)(rest - item);
  while (p < close) {
    const char *lo = p;
    while (p < close && *p >= '0' && *p <= '9') p++;
    size_t width = (size_t)(p - lo);
    const char *hi = p;
    size_t hi_width = 0;
    if (p < close && *p == '-') {
      hi = ++p;
      while (p < close && *p >= '0' && *p <= '9') p++;
      hi_width = (size_t)(p - hi);
    }
    if (width == 0 || width > 9 || (hi != lo + width && (hi_width == 0 || hi_width > 9)) ||
        (p < close && *p != ',')) {
      TIDE_ERROR("%s: bad range in \"[%.*s]\" (give numbers and ranges like [01-04,7])", w->what,
                 (int)(close - item - i - 1), item + i + 1);
      return TIDE_EINVAL;
    }
    long first = strtol(lo, NULL, 10), last = hi != lo + width ? strtol(hi, NULL, 10) : first;
    if (last < first) {
      TIDE_ERROR("%s: range %ld-%ld in \"[%.*s]\" runs backwards", w->what, first, last,
                 (int)(close - item - i - 1), item + i + 1);
      return TIDE_EINVAL;
    }
    for (long v = first; v <= last; v++) {
      char digits[16];
      int n = snprintf(digits, sizeof digits, "%0*ld", (int)width, v);
      if (plen + i + (size_t)n > HOSTLIST_MAX_NAME) {
        TIDE_ERROR("%s: a host name is longer than %d characters", w->what, HOSTLIST_MAX_NAME);
        return TIDE_EINVAL;
      }
      memcpy(name + plen + i, digits, (size_t)n + 1);
      TIDE_CHECK(hostlist_item(w, name, rest, rest_len));
    }
    if (p < close) p++; /* the comma */
    if (p == close && p[-1] == ',') {
      TIDE_ERROR("%s: empty range after ',' in \"[%.*s]\"", w->what, (int)(close - item - i - 1), item + i + 1);
      return TIDE_EINVAL;
    }
  }
  if (close == item + i + 1) {
    TIDE_ERROR("%s: empty brackets \"[]\"", w->what);
    return TIDE_EINVAL;
  }
  return 0;
}

int tide__hostlist_nth(const char *what, const char *list, int n, char *out, size_t cap, int *count_out) {
  hostlist_walk_t w = {what, n, 0, out, cap};
  if (list == NULL || list[0] == '\0') {
    TIDE_ERROR("%s is empty: no hosts", what);
    return TIDE_EINVAL;
  }
  const char *item = list;
  for (;;) {
    /* Items end at a comma outside brackets. */
    const char *end = item;
    int depth = 0;
    while (*end != '\0' && !(*end == ',' && depth == 0)) {
      if (*end == '[' && ++depth > 1) {
        TIDE_ERROR("%s: nested '[' in \"%s\"", what, list);
        return TIDE_EINVAL;
      }
      if (*end == ']' && --depth < 0) {
        TIDE_ERROR("%s: ']' without '[' in \"%s\"", what, list);
        return TIDE_EINVAL;
      }
      end++;
    }
    TIDE_CHECK(hostlist_item(&w, "", item, (size_t)(end - item)));
    if (*end == '\0') break;
    item = end + 1;
  }
  if (n >= w.count) {
    TIDE_ERROR("%s names %d host(s); there is no host %d", what, w.count, n);
    return TIDE_EINVAL;
  }
  if (count_out != NULL) *count_out = w.count;
  return 0;
}

/* ---- the rendezvous of a Slurm step ----------------------------------------- */

static const char *env_first(const char *a, const char *b) {
  const char *v = getenv(a);
  if ((v == NULL || v[0] == '\0') && b != NULL) v = getenv(b);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

int tide__slurm_port(const char *job_step, int attempt) {
  uint64_t h = tide__fnv1a_str(job_step);
  return TIDE__SLURM_PORT_BASE + (int)((h + (uint64_t)attempt) % TIDE__SLURM_PORT_SPAN);
}

int tide__slurm_rdzv(char *host, size_t cap, char *job_out, size_t job_cap) {
  if (getenv("SLURM_PROCID") == NULL) return 0;
  const char *job = env_first("SLURM_JOB_ID", "SLURM_JOBID");
  if (job == NULL) return 0;
  /* The step's nodes: task 0 runs on the first (srun's block distribution);
   * a step may use fewer nodes than the job. */
  const char *what = getenv("SLURM_STEP_NODELIST") != NULL ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  const char *nodes = env_first(what, "SLURM_NODELIST");
  if (nodes == NULL) {
    TIDE_ERROR("SLURM_PROCID is set but SLURM_JOB_NODELIST is not: cannot find rank 0's host; export "
               "TIDE_RDZV=host:port (rank 0's host) for every rank");
    return TIDE_EINVAL;
  }
  TIDE_CHECK(tide__hostlist_nth(what, nodes, 0, host, cap, NULL));
  const char *step = env_first("SLURM_STEP_ID", "SLURM_STEPID");
  if (step == NULL) {
    /* sbatch gives the batch script SLURM_PROCID=0 and the job's
     * SLURM_NTASKS: the other ranks would never come. */
    const char *ntasks = getenv("SLURM_NTASKS");
    TIDE_ERROR("SLURM_PROCID and SLURM_NTASKS=%s are the batch script's, not an srun step's (no SLURM_STEP_ID): "
               "start the program with srun in the script (srun PROGRAM ...), or unset SLURM_NTASKS to run one "
               "process",
               ntasks != NULL ? ntasks : "?");
    return TIDE_EINVAL;
  }
  snprintf(job_out, job_cap, "%s.%s", job, step);
  return 1;
}

/* ---- hosts and addresses ------------------------------------------------------- */

static int env_count(const char *name) {
  const char *v = getenv(name);
  if (v == NULL || v[0] == '\0') return -1;
  char *end;
  long x = strtol(v, &end, 10);
  return *end == '\0' && x >= 0 && x < 1 << 24 ? (int)x : -1;
}

int tide__launcher_hosts(void) {
  static const char *counts[] = {"SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "TIDE_NNODES"};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    int n = env_count(counts[i]);
    if (n > 0) return n;
  }
  int local = env_count("OMPI_COMM_WORLD_LOCAL_SIZE"), size = env_count("OMPI_COMM_WORLD_SIZE");
  if (local > 0 && size > 0) return local < size ? 2 : 1;
  return 0;
}

int tide__addr_is_loopback(const char *addr) { return strncmp(addr, "127.", 4) == 0; }

/* The local address that routes to host (a UDP connect sends nothing). */
static int route_addr(const char *host, int port, char *addr, size_t cap) {
  struct addrinfo hints, *ai;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  char port_text[16];
  snprintf(port_text, sizeof port_text, "%d", port > 0 ? port : 9);
  if (getaddrinfo(host, port_text, &hints, &ai) != 0) return TIDE_EINVAL;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int rc = fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? tide__sock_local_addr(fd, addr, cap) : TIDE_EIO;
  freeaddrinfo(ai);
  if (fd >= 0) close(fd);
  return rc;
}

int tide__route_addr(const char *host, char *addr, size_t cap) { return route_addr(host, 0, addr, cap); }

int tide__publish_addr(const char *store_host, int store_port, char *addr, size_t cap) {
  if (route_addr(store_host, store_port, addr, cap) != 0) {
    TIDE_ERROR("cannot resolve the store host \"%s\" (TIDE_RDZV, or the first host of SLURM_JOB_NODELIST)",
               store_host);
    return TIDE_EINVAL;
  }
  if (!tide__addr_is_loopback(addr) || tide__launcher_hosts() <= 1) return 0;
  /* The rendezvous host is this host, reached through loopback, yet the job
   * spans hosts: publish the address of the interface that reaches the
   * host srun ran on, else this host's only non-loopback address. */
  const char *launch = getenv("SLURM_LAUNCH_NODE_IPADDR");
  char via[64];
  if (launch != NULL && route_addr(launch, 0, via, sizeof via) == 0 && !tide__addr_is_loopback(via)) {
    snprintf(addr, cap, "%s", via);
    TIDE_INFO("%s reaches this host through loopback; publishing %s (the route to SLURM_LAUNCH_NODE_IPADDR=%s)",
              store_host, addr, launch);
    return 0;
  }
  struct ifaddrs *list;
  int found = 0;
  char only[64] = "";
  if (getifaddrs(&list) == 0) {
    for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next) {
      if (it->ifa_addr == NULL || it->ifa_addr->sa_family != AF_INET || !(it->ifa_flags & IFF_UP) ||
          (it->ifa_flags & IFF_LOOPBACK))
        continue;
      if (found++ == 0) inet_ntop(AF_INET, &((struct sockaddr_in *)it->ifa_addr)->sin_addr, only, sizeof only);
    }
    freeifaddrs(list);
  }
  if (found == 1) {
    snprintf(addr, cap, "%s", only);
    TIDE_INFO("%s reaches this host through loopback; publishing %s, this host's only other address", store_host,
              addr);
    return 0;
  }
  /* Several interfaces: the one the default route leaves by (a UDP
   * connect to a TEST-NET address sends nothing). */
  if (found > 1 && route_addr("192.0.2.1", 9, via, sizeof via) == 0 && !tide__addr_is_loopback(via)) {
    snprintf(addr, cap, "%s", via);
    TIDE_INFO("%s reaches this host through loopback; publishing %s, the address of the default route's "
              "interface (set TIDE_SOCKET_IFNAME to choose another)",
              store_host, addr);
    return 0;
  }
  /* No other address (all "hosts" on one machine?): keep loopback. If a
   * rank on another host sees it, every rank fails at start-up naming
   * TIDE_SOCKET_IFNAME (comm.c, check_reachable). */
  TIDE_INFO("%s reaches this host through loopback and no other address fits; publishing %s", store_host, addr);
  return 0;
}
