/* Placement: which CPUs each local rank runs on, and how many compute
 * threads a rank starts by default.
 *
 * The topology comes from hwloc. Shares are computed over the CPUs the
 * caller may run on (its affinity mask: a taskset or cgroup on tiderun
 * shrinks every share), grouped by NUMA node so that a share never straddles
 * two nodes unless it holds them whole. tiderun binds each rank before exec;
 * under mpirun or srun, tide_comm_init binds the process when TIDE_BIND asks
 * for it (tiderun's ranks find TIDE_CPUS set and are left alone).
 *
 * Threads: tide__bind_shares may be called from any thread. The record of
 * this process's placement is written once by tide_comm_init and read with
 * atomics. */
#include <errno.h>
#include <hwloc.h>
#include <hwloc/glibc-sched.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

static const char *const mode_names[] = {"none", "core", "numa"};

int tide__bind_parse(const char *text, int auto_mode, int *mode_out) {
  if (text != NULL && strcmp(text, "auto") == 0) {
    *mode_out = auto_mode;
    return 0;
  }
  for (int m = 0; text != NULL && m < 3; m++)
    if (strcmp(text, mode_names[m]) == 0) {
      *mode_out = m;
      return 0;
    }
  return TIDE_EINVAL;
}

const char *tide__bind_name(int mode) { return mode >= 0 && mode < 3 ? mode_names[mode] : "?"; }

void tide_cpus_format(const int *cpus, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    size_t j = i;
    while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) j++;
    int k = j == i ? snprintf(buf + len, cap - len, "%s%d", len ? "," : "", cpus[i])
                   : snprintf(buf + len, cap - len, "%s%d-%d", len ? "," : "", cpus[i], cpus[j]);
    if (k < 0 || (size_t)k >= cap - len) return; /* truncated */
    len += (size_t)k;
    i = j;
  }
  if (len == 0) snprintf(buf, cap, "none");
}

/* The CPUs of set, ascending, into list[0..CPU_SETSIZE); returns their number. */
static size_t cpuset_list(const cpu_set_t *set, int *list) {
  size_t n = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, set)) list[n++] = cpu;
  return n;
}

void tide__cpuset_format(const cpu_set_t *set, char *buf, size_t cap) {
  int list[CPU_SETSIZE];
  tide_cpus_format(list, cpuset_list(set, list), buf, cap);
}

int tide_bind_parse(const char *text, tide_bind_t auto_mode, tide_bind_t *out) {
  int mode;
  if (out == NULL || tide__bind_parse(text, (int)auto_mode, &mode) != 0) return TIDE_EINVAL;
  *out = (tide_bind_t)mode;
  return 0;
}

const char *tide_bind_name(tide_bind_t mode) { return tide__bind_name((int)mode); }

int tide_bind_plan(tide_bind_t mode, int nranks, int *cpus, size_t cap, size_t *first) {
  if (nranks < 1 || cpus == NULL || first == NULL) {
    TIDE_ERROR("tide_bind_plan: nranks must be at least 1 (got %d) and cpus and first not NULL", nranks);
    return TIDE_EINVAL;
  }
  cpu_set_t *shares = tide__calloc((size_t)nranks, sizeof *shares);
  if (shares == NULL) return TIDE_ENOMEM;
  int rc = tide__bind_shares((int)mode, nranks, NULL, NULL, shares);
  size_t total = 0;
  for (int r = 0; rc == 0 && r < nranks; r++) total += (size_t)CPU_COUNT(&shares[r]);
  if (rc == 0 && total > cap) { /* nothing written */
    TIDE_ERROR("tide_bind_plan: cpus holds %zu entries, %d ranks' CPUs need %zu: give nranks * 1024", cap, nranks,
               total);
    rc = TIDE_EINVAL;
  }
  int list[CPU_SETSIZE];
  size_t used = 0;
  for (int r = 0; rc == 0 && r < nranks; r++) {
    size_t n = cpuset_list(&shares[r], list);
    first[r] = used;
    memcpy(cpus + used, list, n * sizeof *list);
    used += n;
  }
  if (rc == 0) first[nranks] = used;
  tide__free(shares);
  return rc;
}

/* ---- shares ---------------------------------------------------------------- */

/* The allowed CPUs as units (cores, or PUs where hwloc knows no cores) in
 * topology order, grouped by NUMA node. */
typedef struct {
  hwloc_bitmap_t *unit;   /* a unit's allowed PUs */
  hwloc_bitmap_t *domain; /* a NUMA node's allowed PUs */
  int *first, *count;     /* a domain's units */
  int nunits, ndomains;
} units_t;

static void units_free(units_t *u) {
  for (int i = 0; i < u->nunits; i++) hwloc_bitmap_free(u->unit[i]);
  for (int d = 0; d < u->ndomains; d++) hwloc_bitmap_free(u->domain[d]);
  tide__free(u->unit);
  tide__free(u->domain);
  tide__free(u->first);
  tide__free(u->count);
}

/* Appends the units of `within` not yet taken as one domain (none if empty). */
static int add_domain(hwloc_topology_t topo, hwloc_obj_type_t type, hwloc_const_bitmap_t within,
                      hwloc_const_bitmap_t allowed, hwloc_bitmap_t taken, units_t *u) {
  int d = u->ndomains, first = u->nunits;
  hwloc_obj_t obj = NULL;
  while ((obj = hwloc_get_next_obj_by_type(topo, type, obj)) != NULL) {
    if (obj->cpuset == NULL || !hwloc_bitmap_isincluded(obj->cpuset, within) ||
        hwloc_bitmap_intersects(obj->cpuset, taken) || !hwloc_bitmap_intersects(obj->cpuset, allowed))
      continue;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set == NULL) return TIDE_ENOMEM;
    hwloc_bitmap_and(set, obj->cpuset, allowed);
    hwloc_bitmap_or(taken, taken, obj->cpuset);
    u->unit[u->nunits++] = set;
  }
  if (u->nunits == first) return 0;
  hwloc_bitmap_t dom = hwloc_bitmap_alloc();
  if (dom == NULL) return TIDE_ENOMEM;
  hwloc_bitmap_and(dom, within, allowed);
  u->domain[d] = dom;
  u->first[d] = first;
  u->count[d] = u->nunits - first;
  u->ndomains++;
  return 0;
}

static int units_collect(hwloc_topology_t topo, hwloc_const_bitmap_t allowed, units_t *u) {
  memset(u, 0, sizeof *u);
  hwloc_obj_type_t type = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int nobj = hwloc_get_nbobjs_by_type(topo, type);
  int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  if (nobj < 1) return TIDE_EIO;
  u->unit = tide__calloc((size_t)nobj, sizeof *u->unit);
  u->domain = tide__calloc((size_t)nnuma + 1, sizeof *u->domain);
  u->first = tide__calloc((size_t)nnuma + 1, sizeof *u->first);
  u->count = tide__calloc((size_t)nnuma + 1, sizeof *u->count);
  hwloc_bitmap_t taken = hwloc_bitmap_alloc();
  int rc = u->unit && u->domain && u->first && u->count && taken ? 0 : TIDE_ENOMEM;
  for (int n = 0; rc == 0 && n < nnuma; n++) {
    hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)n);
    if (node->cpuset != NULL) rc = add_domain(topo, type, node->cpuset, allowed, taken, u);
  }
  /* CPUs no NUMA node claims (none are known, say): one more domain. */
  if (rc == 0) rc = add_domain(topo, type, hwloc_topology_get_topology_cpuset(topo), allowed, taken, u);
  hwloc_bitmap_free(taken);
  if (rc == 0 && u->nunits == 0) rc = TIDE_EINVAL;
  if (rc != 0) units_free(u);
  return rc;
}

/* Ranks per domain when there are more ranks than domains: in proportion
 * to the domain's units, at least one each. */
static void ranks_per_domain(const units_t *u, int nranks, int *per) {
  int sum = 0;
  for (int d = 0; d < u->ndomains; d++) {
    per[d] = (int)((int64_t)nranks * u->count[d] / u->nunits);
    if (per[d] < 1) per[d] = 1;
    sum += per[d];
  }
  /* Add where a rank would get the most units; take where it gets the least. */
  while (sum < nranks) {
    int best = 0;
    for (int d = 1; d < u->ndomains; d++)
      if ((int64_t)u->count[d] * per[best] > (int64_t)u->count[best] * per[d]) best = d;
    per[best]++;
    sum++;
  }
  while (sum > nranks) {
    int worst = -1;
    for (int d = 0; d < u->ndomains; d++)
      if (per[d] > 1 && (worst < 0 || (int64_t)u->count[d] * per[worst] < (int64_t)u->count[worst] * per[d]))
        worst = d;
    per[worst]--;
    sum--;
  }
}

/* Writes rank r's share into set: whole domains when ranks <= domains,
 * otherwise a contiguous run of its domain's units (one unit, wrapping, when
 * the domain has more ranks than units). */
static void share_of(const units_t *u, const int *per, int nranks, int mode, int r, hwloc_bitmap_t set) {
  hwloc_bitmap_zero(set);
  if (nranks <= u->ndomains) {
    int d0 = (int)((int64_t)u->ndomains * r / nranks), d1 = (int)((int64_t)u->ndomains * (r + 1) / nranks);
    for (int d = d0; d < d1; d++) hwloc_bitmap_or(set, set, u->domain[d]);
    return;
  }
  int d = 0, j = r;
  while (j >= per[d]) j -= per[d++];
  if (mode == TIDE__BIND_NUMA) {
    hwloc_bitmap_copy(set, u->domain[d]);
    return;
  }
  int c = u->count[d], n = per[d];
  int a = n <= c ? (int)((int64_t)c * j / n) : j % c;
  int b = n <= c ? (int)((int64_t)c * (j + 1) / n) : a + 1;
  for (int k = a; k < b; k++) hwloc_bitmap_or(set, set, u->unit[u->first[d] + k]);
}

int tide__bind_shares(int mode, int nranks, const char *synthetic, const cpu_set_t *allowed_or_null,
                      cpu_set_t *shares) {
  if (nranks < 1 || mode < 0 || mode > TIDE__BIND_NUMA) return TIDE_EINVAL;
  cpu_set_t own;
  if (allowed_or_null == NULL && synthetic == NULL) {
    if (sched_getaffinity(0, sizeof own, &own) != 0) {
      TIDE_ERROR("placement: sched_getaffinity: %s", strerror(errno));
      return TIDE_EIO;
    }
    allowed_or_null = &own;
  }
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return TIDE_ENOMEM;
  int rc = 0;
  if (synthetic != NULL && hwloc_topology_set_synthetic(topo, synthetic) != 0) {
    TIDE_ERROR("placement: hwloc does not accept the synthetic topology \"%s\"", synthetic);
    rc = TIDE_EINVAL;
  } else if (hwloc_topology_load(topo) != 0) {
    TIDE_ERROR("placement: hwloc could not read the topology: %s", strerror(errno));
    rc = TIDE_EIO;
  }
  hwloc_bitmap_t allowed = hwloc_bitmap_alloc(), set = hwloc_bitmap_alloc();
  if (rc == 0 && (allowed == NULL || set == NULL)) rc = TIDE_ENOMEM;
  if (rc == 0) {
    if (allowed_or_null != NULL)
      hwloc_cpuset_from_glibc_sched_affinity(topo, allowed, allowed_or_null, sizeof *allowed_or_null);
    else
      hwloc_bitmap_copy(allowed, hwloc_topology_get_topology_cpuset(topo));
  }
  units_t u;
  if (rc == 0 && (rc = units_collect(topo, allowed, &u)) == TIDE_EINVAL)
    TIDE_ERROR("placement: none of the allowed CPUs is in the topology");
  if (rc == 0) {
    int *per = tide__calloc((size_t)u.ndomains, sizeof *per);
    if (per == NULL) rc = TIDE_ENOMEM;
    if (per != NULL && nranks > u.ndomains) ranks_per_domain(&u, nranks, per);
    for (int r = 0; rc == 0 && r < nranks; r++) {
      if (mode == TIDE__BIND_NONE)
        hwloc_bitmap_copy(set, allowed);
      else
        share_of(&u, per, nranks, mode, r, set);
      hwloc_cpuset_to_glibc_sched_affinity(topo, set, &shares[r], sizeof shares[r]);
    }
    tide__free(per);
    units_free(&u);
  }
  hwloc_bitmap_free(allowed);
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(topo);
  return rc;
}

/* ---- this process ------------------------------------------------------------- */

static atomic_int placed_local_size; /* 0 until tide_comm_init records it */
static atomic_int self_bound;

void tide__place_self(int local_rank, int local_size) {
  atomic_store(&placed_local_size, local_size);
  if (getenv("TIDE_CPUS") != NULL) return; /* tiderun placed this rank */
  int mode;
  if (tide__bind_parse(tide__param_str(TIDE__PARAM_BIND), TIDE__BIND_NONE, &mode) != 0 || mode == TIDE__BIND_NONE)
    return;
  cpu_set_t *shares = tide__calloc((size_t)local_size, sizeof *shares);
  if (shares == NULL) return;
  char text[256];
  if (tide__bind_shares(mode, local_size, NULL, NULL, shares) == 0) {
    tide__cpuset_format(&shares[local_rank], text, sizeof text);
    hwloc_topology_t topo;
    hwloc_bitmap_t set = NULL;
    int ok = hwloc_topology_init(&topo) == 0;
    if (ok && hwloc_topology_load(topo) == 0 && (set = hwloc_bitmap_alloc()) != NULL) {
      hwloc_cpuset_from_glibc_sched_affinity(topo, set, &shares[local_rank], sizeof shares[local_rank]);
      /* Every thread of the process: the communicator's are running already. */
      if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_PROCESS) == 0) {
        atomic_store(&self_bound, 1);
        TIDE_INFO("TIDE_BIND=%s: local rank %d of %d bound to cpus %s", tide__bind_name(mode), local_rank,
                  local_size, text);
      } else {
        TIDE_WARN("TIDE_BIND=%s: cannot bind local rank %d to cpus %s: %s; running unbound",
                  tide__bind_name(mode), local_rank, text, strerror(errno));
      }
    }
    hwloc_bitmap_free(set);
    if (ok) hwloc_topology_destroy(topo);
  }
  tide__free(shares);
}

int tide__placement_bound(void) {
  const char *cpus = getenv("TIDE_CPUS");
  if (cpus != NULL) return strcmp(cpus, "unbound") != 0;
  return atomic_load(&self_bound);
}

int tide__default_threads(int local_size) {
  int n = (int)tide__param_int(TIDE__PARAM_NUM_THREADS);
  if (n > 0) return n;
  cpu_set_t own;
  int cpus = sched_getaffinity(0, sizeof own, &own) == 0 ? CPU_COUNT(&own) : 1;
  if (cpus < 1) cpus = 1;
  if (tide__placement_bound()) return cpus; /* the share is this rank's alone */
  /* Unbound: the ranks of this host share the CPUs. */
  if (local_size < 1) local_size = atomic_load(&placed_local_size);
  if (local_size < 1) {
    const char *env = getenv("TIDE_LOCAL_SIZE");
    local_size = env != NULL ? atoi(env) : 1;
  }
  if (local_size > 1) cpus /= local_size;
  return cpus >= 1 ? cpus : 1;
}

uint64_t tide__placement_key(void) {
  cpu_set_t set;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) >= online) return 0;
  return tide__fnv1a(&set, sizeof set) | 1;
}

int tide_process_cpus(char *cpus, size_t cap, int *bound) {
  if (cpus == NULL || bound == NULL || cap < 2) {
    TIDE_ERROR("tide_process_cpus: cpus (at least 2 bytes; give 512) and bound must not be NULL");
    return TIDE_EINVAL;
  }
  cpu_set_t own;
  if (sched_getaffinity(0, sizeof own, &own) == 0)
    tide__cpuset_format(&own, cpus, cap);
  else
    snprintf(cpus, cap, "?");
  *bound = tide__placement_bound();
  return 0;
}
