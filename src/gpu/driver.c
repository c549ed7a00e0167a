/* CUDA found, not configured: the driver API (libcuda.so.1) and NVRTC
 * (libnvrtc) are loaded with dlopen the first time a process asks for a
 * GPU, and select.cu is compiled by NVRTC for the device's architecture
 * (a CUBIN, kept in TIDE_GPU_CACHE so that later processes load it in
 * milliseconds). One tide__gpu_t per CUDA context holds the module, the
 * function handles and the selection scratch, behind a lock: selections on
 * one context run one at a time (each ends with a stream synchronisation
 * anyway); contexts do not share anything. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "gpu/sources.h" /* generated: tide__gpu_select_cu, tide__gpu_state_h */

/* ---- the driver API, as much of it as tide calls ---------------------------------------- */

typedef int cu_result_t; /* CUresult: 0 is CUDA_SUCCESS */
typedef void *cu_context_t, *cu_module_t, *cu_function_t, *cu_stream_t, *cu_graph_t, *cu_graph_exec_t;

#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_UNIFIED 4
#define CU_STREAM_NON_BLOCKING 1
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1

#define CU_FUNCTIONS(X)                                                                                       \
  X(cuInit, "cuInit", (unsigned flags))                                                                       \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                                       \
  X(cuDeviceGet, "cuDeviceGet", (int *dev, int ordinal))                                                      \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *value, int attr, int dev))                            \
  X(cuDeviceGetName, "cuDeviceGetName", (char *name, int len, int dev))                                       \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (cu_context_t * ctx, int dev))                      \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", (cu_context_t * ctx))                                                 \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (cu_context_t ctx))                                                   \
  X(cuCtxGetDevice, "cuCtxGetDevice", (int *dev))                                                             \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", (void *data, int attr, tide__cu_ptr_t p))                 \
  X(cuModuleLoadData, "cuModuleLoadData", (cu_module_t * mod, const void *image))                             \
  X(cuModuleGetFunction, "cuModuleGetFunction", (cu_function_t * fn, cu_module_t mod, const char *name))      \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor",                 \
    (int *blocks, cu_function_t f, int threads, size_t shared))                                               \
  X(cuLaunchKernel, "cuLaunchKernel",                                                                         \
    (cu_function_t f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,           \
     unsigned shared, cu_stream_t stream, void **params, void **extra))                                       \
  X(cuMemAlloc, "cuMemAlloc_v2", (tide__cu_ptr_t * p, size_t bytes))                                          \
  X(cuMemFree, "cuMemFree_v2", (tide__cu_ptr_t p))                                                            \
  X(cuMemAllocHost, "cuMemAllocHost_v2", (void **p, size_t bytes))                                            \
  X(cuMemFreeHost, "cuMemFreeHost", (void *p))                                                                \
  X(cuMemsetD32Async, "cuMemsetD32Async", (tide__cu_ptr_t p, unsigned value, size_t n, cu_stream_t s))        \
  X(cuMemcpyAsync, "cuMemcpyAsync", (tide__cu_ptr_t dst, tide__cu_ptr_t src, size_t bytes, cu_stream_t s))    \
  X(cuStreamSynchronize, "cuStreamSynchronize", (cu_stream_t s))                                              \
  X(cuStreamCreate, "cuStreamCreate", (cu_stream_t * s, unsigned flags))                                      \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", (cu_stream_t s, int mode))                               \
  X(cuStreamEndCapture, "cuStreamEndCapture", (cu_stream_t s, cu_graph_t * graph))                            \
  X(cuGraphInstantiate, "cuGraphInstantiateWithFlags", (cu_graph_exec_t * exec, cu_graph_t graph,             \
                                                        unsigned long long flags))                            \
  X(cuGraphLaunch, "cuGraphLaunch", (cu_graph_exec_t exec, cu_stream_t s))                                    \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", (cu_graph_exec_t exec))                                         \
  X(cuGraphDestroy, "cuGraphDestroy", (cu_graph_t graph))                                                     \
  X(cuGetErrorString, "cuGetErrorString", (cu_result_t r, const char **str))

static struct {
#define X(field, sym, args) cu_result_t (*field) args;
  CU_FUNCTIONS(X)
#undef X
} cu;

/* ---- NVRTC ------------------------------------------------------------------------------ */

typedef void *nvrtc_program_t;
static struct {
  int (*create)(nvrtc_program_t *prog, const char *src, const char *name, int nheaders, const char *const *headers,
                const char *const *include_names);
  int (*compile)(nvrtc_program_t prog, int nopts, const char *const *opts);
  int (*log_size)(nvrtc_program_t prog, size_t *size);
  int (*log)(nvrtc_program_t prog, char *log);
  int (*cubin_size)(nvrtc_program_t prog, size_t *size);
  int (*cubin)(nvrtc_program_t prog, char *cubin);
  int (*destroy)(nvrtc_program_t *prog);
  int (*version)(int *major, int *minor);
  const char *(*error_string)(int result);
} nvrtc;

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;        /* the driver and a device are there */
static int nvrtc_ok;        /* NVRTC loaded */
static char probe_why[256]; /* why not */
static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char last_error[512];

const char *tide__gpu_last_error(void) { return last_error; }

/* A failed driver call: its text into last_error; returns TIDE_EIO. */
static int cu_fail(const char *what, cu_result_t r) {
  const char *s = NULL;
  if (cu.cuGetErrorString == NULL || cu.cuGetErrorString(r, &s) != 0 || s == NULL) s = "unknown CUDA error";
  snprintf(last_error, sizeof last_error, "%s: CUDA error %d (%s)", what, r, s);
  TIDE_ERROR("%s", last_error);
  return TIDE_EIO;
}

static void *open_first(const char *const *names, size_t n, char *tried, size_t tried_len) {
  for (size_t i = 0; i < n; i++) {
    if (names[i] == NULL || names[i][0] == '\0') continue;
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) return h;
    size_t used = strlen(tried);
    snprintf(tried + used, tried_len - used, "%s%s", used ? ", " : "", names[i]);
  }
  return NULL;
}

static int load_nvrtc(void) {
  const char *names[] = {tide__param_str(TIDE__PARAM_NVRTC_LIBRARY), "libnvrtc.so", "libnvrtc.so.13",
                         "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so"};
  char tried[256] = "";
  void *h = open_first(names, sizeof names / sizeof *names, tried, sizeof tried);
  if (h == NULL) {
    snprintf(probe_why, sizeof probe_why, "NVRTC not found (tried %.180s; set TIDE_NVRTC_LIBRARY)", tried);
    return 0;
  }
  struct {
    void **slot;
    const char *sym;
  } syms[] = {{(void **)&nvrtc.create, "nvrtcCreateProgram"},   {(void **)&nvrtc.compile, "nvrtcCompileProgram"},
              {(void **)&nvrtc.log_size, "nvrtcGetProgramLogSize"}, {(void **)&nvrtc.log, "nvrtcGetProgramLog"},
              {(void **)&nvrtc.cubin_size, "nvrtcGetCUBINSize"}, {(void **)&nvrtc.cubin, "nvrtcGetCUBIN"},
              {(void **)&nvrtc.destroy, "nvrtcDestroyProgram"},  {(void **)&nvrtc.version, "nvrtcVersion"},
              {(void **)&nvrtc.error_string, "nvrtcGetErrorString"}};
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    if ((*syms[i].slot = dlsym(h, syms[i].sym)) == NULL) {
      snprintf(probe_why, sizeof probe_why, "NVRTC lacks %s", syms[i].sym);
      return 0;
    }
  }
  return 1;
}

static void probe(void) {
  void *h = open_first((const char *const[]){"libcuda.so.1", "libcuda.so"}, 2, probe_why, sizeof probe_why);
  if (h == NULL) {
    char tried[sizeof probe_why];
    snprintf(tried, sizeof tried, "%s", probe_why);
    snprintf(probe_why, sizeof probe_why, "no CUDA driver (tried %.200s)", tried);
    nvrtc_ok = load_nvrtc();
    return;
  }
#define X(field, sym, args)                                                       \
  if ((*(void **)&cu.field = dlsym(h, sym)) == NULL) {                            \
    snprintf(probe_why, sizeof probe_why, "the CUDA driver lacks %s (too old?)", sym); \
    return;                                                                       \
  }
  CU_FUNCTIONS(X)
#undef X
  cu_result_t r = cu.cuInit(0);
  int count = 0;
  if (r == 0) r = cu.cuDeviceGetCount(&count);
  if (r != 0 || count == 0) {
    const char *s = NULL;
    cu.cuGetErrorString(r, &s);
    snprintf(probe_why, sizeof probe_why, "no CUDA device (%s)", r != 0 && s ? s : "none found");
    nvrtc_ok = load_nvrtc();
    return;
  }
  if (!(nvrtc_ok = load_nvrtc())) return;
  probe_ok = 1;
  probe_why[0] = '\0';
}

int tide__gpu_probe(char *why, size_t why_len) {
  pthread_once(&probe_once, probe);
  if (why != NULL && why_len > 0) snprintf(why, why_len, "%s", probe_ok ? "" : probe_why);
  return probe_ok;
}

/* ---- compilation ------------------------------------------------------------------------ */

/* select.cu for arch (e.g. "sm_90") as a CUBIN into *image (tide__free);
 * the compiler's log in last_error on failure. */
int tide__gpu_compile(const char *arch, char **image, size_t *size) {
  pthread_once(&probe_once, probe);
  if (!nvrtc_ok) {
    snprintf(last_error, sizeof last_error, "%s", probe_why);
    return TIDE_ENOSYS;
  }
  nvrtc_program_t prog = NULL;
  const char *headers[] = {tide__gpu_state_h}, *names[] = {"state.h"};
  int r = nvrtc.create(&prog, tide__gpu_select_cu, "select.cu", 1, headers, names);
  if (r != 0) {
    snprintf(last_error, sizeof last_error, "nvrtcCreateProgram: %s", nvrtc.error_string(r));
    return TIDE_EIO;
  }
  char arch_opt[64];
  snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {arch_opt, "-std=c++17"};
  r = nvrtc.compile(prog, 2, opts);
  int rc = 0;
  if (r != 0) {
    size_t n = 0;
    nvrtc.log_size(prog, &n);
    char *log = tide__malloc(n + 1);
    if (log != NULL) {
      log[0] = '\0';
      nvrtc.log(prog, log);
      log[n] = '\0';
    }
    snprintf(last_error, sizeof last_error, "NVRTC could not compile select.cu for %s: %s: %s", arch,
             nvrtc.error_string(r), log != NULL ? log : "");
    tide__free(log);
    rc = TIDE_EIO;
  } else {
    size_t n = 0;
    char *out = NULL;
    if ((r = nvrtc.cubin_size(prog, &n)) != 0 || (out = tide__malloc(n)) == NULL || (r = nvrtc.cubin(prog, out)) != 0) {
      snprintf(last_error, sizeof last_error, "NVRTC gave no CUBIN for %s", arch);
      tide__free(out);
      rc = out == NULL && r == 0 ? TIDE_ENOMEM : TIDE_EIO;
    } else {
      *image = out;
      *size = n;
    }
  }
  nvrtc.destroy(&prog);
  return rc;
}

/* The cache file of arch's CUBIN: a digest of the sources, the arch and
 * NVRTC's version names it. 0 when there is no cache (TIDE_GPU_CACHE=none). */
static int cache_path(const char *arch, char *path, size_t len, char *dir, size_t dir_len) {
  const char *set = tide__param_str(TIDE__PARAM_GPU_CACHE);
  if (strcmp(set, "none") == 0) return 0;
  if (set[0] != '\0') {
    snprintf(dir, dir_len, "%s", set);
  } else {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg != NULL && xdg[0] != '\0')
      snprintf(dir, dir_len, "%s/tide/gpu", xdg);
    else if (home != NULL && home[0] != '\0')
      snprintf(dir, dir_len, "%s/.cache/tide/gpu", home);
    else
      return 0;
  }
  int major = 0, minor = 0;
  nvrtc.version(&major, &minor);
  size_t a = strlen(tide__gpu_select_cu), b = strlen(tide__gpu_state_h);
  char *text = tide__malloc(a + b + 64);
  if (text == NULL) return 0;
  int n = snprintf(text, 64, "%s nvrtc %d.%d\n", arch, major, minor);
  memcpy(text + n, tide__gpu_select_cu, a);
  memcpy(text + n + a, tide__gpu_state_h, b);
  uint8_t digest[32];
  tide__sha256(text, (size_t)n + a + b, digest);
  tide__free(text);
  char hex[17];
  for (int i = 0; i < 8; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
  snprintf(path, len, "%s/select-%s-%s.cubin", dir, arch, hex);
  return 1;
}

static char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = tide__malloc((size_t)n)) != NULL) {
      if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        tide__free(buf);
        buf = NULL;
      } else {
        *size = (size_t)n;
      }
    }
  }
  fclose(f);
  return buf;
}

static void mkdirs(const char *dir) {
  char p[512];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++) {
    if (*s == '/') {
      *s = '\0';
      mkdir(p, 0755);
      *s = '/';
    }
  }
  mkdir(p, 0755);
}

/* Writes through a temporary name and a rename, so that a concurrent
 * reader sees the whole file or none. A cache that cannot be written is
 * only slower: logged at INFO. */
static void write_cache(const char *dir, const char *path, const char *image, size_t size) {
  mkdirs(dir);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%.560s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  int ok = f != NULL && fwrite(image, 1, size, f) == size;
  if (f != NULL && fclose(f) != 0) ok = 0;
  if (ok && rename(tmp, path) == 0) return;
  unlink(tmp);
  TIDE_INFO("gpu: could not write the kernel cache %s: %s", path, strerror(errno));
}

/* ---- contexts ---------------------------------------------------------------------------- */

static const char *const kernel_names[TIDE__K_TYPED_COUNT] = {"hist", "collect", "sample", "check",
                                                             "mean", "probe",   "band",   "emit"};
static const char *const type_suffix[3] = {"f32", "f16", "bf16"};
#define NFUNCS (TIDE__K_TYPED_COUNT * 3 + 2)

#define GRAPHS 8 /* graphs kept per context */

struct tide__gpu {
  cu_context_t ctx;
  cu_module_t module;
  char names[NFUNCS][32];
  cu_function_t funcs[NFUNCS];
  unsigned grid[NFUNCS]; /* blocks of a pass over x: as many as run at once, at most 8 per SM */
  int sms;
  pthread_mutex_t lock;
  /* scratch */
  tide__cu_ptr_t state, hist, partials, list;
  size_t list_entries;
  tide__gpu_state_t *host_state; /* pinned */
  int hist_dirty;                /* the bins need zeroing before the next selection */
  /* graphs of repeated selections (TIDE_GPU_GRAPHS), least recently used replaced */
  struct {
    unsigned char key[TIDE__GPU_GRAPH_KEY];
    size_t len; /* 0: a free slot */
    cu_graph_t graph;
    cu_graph_exec_t exec; /* NULL: the key was seen once, not captured yet */
    uint64_t used;
  } graphs[GRAPHS];
  uint64_t clock;
  cu_stream_t capture; /* the stream captures are made on */
  int graphs_off;      /* the driver refused a capture: one launch per kernel from then on */
};

#define MAX_CONTEXTS 16
static tide__gpu_t *contexts[MAX_CONTEXTS];

static int load_module(tide__gpu_t *g, int dev) {
  int major = 0, minor = 0;
  cu_result_t r = cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  if (r == 0) r = cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (r == 0) r = cu.cuDeviceGetAttribute(&g->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  if (r != 0) return cu_fail("cuDeviceGetAttribute", r);
  char arch[16], path[600], dir[512];
  snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
  int cached = cache_path(arch, path, sizeof path, dir, sizeof dir);
  size_t size = 0;
  char *image = cached ? read_file(path, &size) : NULL;
  if (image != NULL && cu.cuModuleLoadData(&g->module, image) == 0) {
    tide__free(image);
  } else {
    tide__free(image);
    int64_t t0 = tide__now_ns();
    int rc = tide__gpu_compile(arch, &image, &size);
    if (rc < 0) {
      TIDE_ERROR("gpu: %s", last_error);
      return rc;
    }
    TIDE_INFO("gpu: compiled the top-k kernels for %s in %.2f s", arch, (double)(tide__now_ns() - t0) * 1e-9);
    r = cu.cuModuleLoadData(&g->module, image);
    if (r == 0 && cached) write_cache(dir, path, image, size);
    tide__free(image);
    if (r != 0) return cu_fail("cuModuleLoadData", r);
  }
  int f = 0;
  for (int k = 0; k < TIDE__K_TYPED_COUNT; k++)
    for (int t = 0; t < 3; t++) snprintf(g->names[f++], sizeof g->names[0], "tide_gpu_%s_%s", kernel_names[k], type_suffix[t]);
  snprintf(g->names[f++], sizeof g->names[0], "tide_gpu_ef_add");
  snprintf(g->names[f++], sizeof g->names[0], "tide_gpu_ef_zero");
  for (int i = 0; i < NFUNCS; i++) {
    if ((r = cu.cuModuleGetFunction(&g->funcs[i], g->module, g->names[i])) != 0) return cu_fail(g->names[i], r);
    /* A grid that all fits on the device at once: a second, partial wave
     * of blocks would leave most SMs idle at the end of a pass. */
    int per_sm = 0;
    if ((r = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, g->funcs[i], TIDE__GPU_THREADS, 0)) != 0)
      return cu_fail("cuOccupancyMaxActiveBlocksPerMultiprocessor", r);
    if (per_sm < 1) per_sm = 1;
    if (per_sm > 2048 / TIDE__GPU_THREADS) per_sm = 2048 / TIDE__GPU_THREADS;
    g->grid[i] = (unsigned)(g->sms * per_sm);
  }
  return 0;
}

/* The tide__gpu_t of context ctx (current on this thread), created once. */
static int context_of(cu_context_t ctx, tide__gpu_t **out) {
  pthread_mutex_lock(&contexts_lock);
  int rc = 0, slot = -1;
  for (int i = 0; i < MAX_CONTEXTS; i++) {
    if (contexts[i] != NULL && contexts[i]->ctx == ctx) {
      *out = contexts[i];
      pthread_mutex_unlock(&contexts_lock);
      return 0;
    }
    if (contexts[i] == NULL && slot < 0) slot = i;
  }
  tide__gpu_t *g = NULL;
  int dev = 0;
  cu_result_t r = cu.cuCtxGetDevice(&dev);
  if (slot < 0) {
    snprintf(last_error, sizeof last_error, "more than %d CUDA contexts in one process", MAX_CONTEXTS);
    TIDE_ERROR("gpu: %s", last_error);
    rc = TIDE_ENOMEM;
  } else if (r != 0) {
    rc = cu_fail("cuCtxGetDevice", r);
  } else if ((g = tide__calloc(1, sizeof *g)) == NULL) {
    rc = TIDE_ENOMEM;
  } else {
    g->ctx = ctx;
    pthread_mutex_init(&g->lock, NULL);
    if ((rc = load_module(g, dev)) == 0) {
      contexts[slot] = g;
      *out = g;
    } else {
      pthread_mutex_destroy(&g->lock);
      tide__free(g);
    }
  }
  pthread_mutex_unlock(&contexts_lock);
  return rc;
}

int tide__gpu_is_device_pointer(const void *p) {
  if (!tide__gpu_probe(NULL, 0) || p == NULL) return 0;
  unsigned type = 0;
  if (cu.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (tide__cu_ptr_t)(uintptr_t)p) != 0) return 0;
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED;
}

int tide__gpu_for_pointer(const char *fn, const void *p, tide__gpu_t **out) {
  char why[256];
  if (!tide__gpu_probe(why, sizeof why)) {
    snprintf(last_error, sizeof last_error, "%s: no GPU: %s", fn, why);
    TIDE_ERROR("%s", last_error);
    return TIDE_ENOSYS;
  }
  cu_context_t ctx = NULL, cur = NULL;
  if (p != NULL) {
    if (!tide__gpu_is_device_pointer(p) ||
        cu.cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, (tide__cu_ptr_t)(uintptr_t)p) != 0) {
      snprintf(last_error, sizeof last_error,
               "%s: %p is not GPU memory (pass a pointer from cudaMalloc / a CUDA tensor's data_ptr())", fn, p);
      TIDE_ERROR("%s", last_error);
      return TIDE_EINVAL;
    }
  }
  cu_result_t r = cu.cuCtxGetCurrent(&cur);
  if (r != 0) return cu_fail("cuCtxGetCurrent", r);
  if (ctx == NULL) ctx = cur;
  if (ctx == NULL) { /* nothing current: device 0's primary context */
    int dev = 0;
    if ((r = cu.cuDeviceGet(&dev, 0)) != 0 || (r = cu.cuDevicePrimaryCtxRetain(&ctx, dev)) != 0)
      return cu_fail("cuDevicePrimaryCtxRetain", r);
  }
  if (ctx != cur && (r = cu.cuCtxSetCurrent(ctx)) != 0) return cu_fail("cuCtxSetCurrent", r);
  return context_of(ctx, out);
}

void tide__gpu_lock(tide__gpu_t *g) { pthread_mutex_lock(&g->lock); }
void tide__gpu_unlock(tide__gpu_t *g) { pthread_mutex_unlock(&g->lock); }
int tide__gpu_blocks(const tide__gpu_t *g) { return g->sms * (2048 / TIDE__GPU_THREADS); }

int tide__gpu_alloc(tide__gpu_t *g, size_t bytes, tide__cu_ptr_t *out) {
  (void)g;
  cu_result_t r = cu.cuMemAlloc(out, bytes > 0 ? bytes : 4);
  return r == 0 ? 0 : cu_fail("cuMemAlloc", r);
}

void tide__gpu_free(tide__gpu_t *g, tide__cu_ptr_t p) {
  (void)g;
  if (p != 0) cu.cuMemFree(p);
}

/* ---- graphs -------------------------------------------------------------------------------- */

static void graph_slot_clear(tide__gpu_t *g, int i) {
  if (g->graphs[i].exec != NULL) cu.cuGraphExecDestroy(g->graphs[i].exec);
  if (g->graphs[i].graph != NULL) cu.cuGraphDestroy(g->graphs[i].graph);
  memset(&g->graphs[i], 0, sizeof g->graphs[i]);
}

static void graphs_clear(tide__gpu_t *g) {
  for (int i = 0; i < GRAPHS; i++) graph_slot_clear(g, i);
}

/* Refuses graphs for the rest of the process's use of g (a driver that
 * cannot capture is only slower). */
static void graphs_off(tide__gpu_t *g, const char *what, cu_result_t r) {
  const char *s = NULL;
  if (cu.cuGetErrorString(r, &s) != 0 || s == NULL) s = "unknown CUDA error";
  TIDE_INFO("gpu: %s: CUDA error %d (%s); selections launch their kernels one by one", what, r, s);
  g->graphs_off = 1;
  graphs_clear(g);
}

int tide__gpu_graph_find(tide__gpu_t *g, const void *key, size_t len, void **exec, int *slot) {
  *exec = NULL;
  if (g->graphs_off || len > TIDE__GPU_GRAPH_KEY || tide__param_int(TIDE__PARAM_GPU_GRAPHS) == 0) return 0;
  int victim = 0;
  for (int i = 0; i < GRAPHS; i++) {
    if (g->graphs[i].len == len && memcmp(g->graphs[i].key, key, len) == 0) {
      g->graphs[i].used = ++g->clock;
      *exec = g->graphs[i].exec;
      *slot = i;
      return *exec != NULL ? 2 : 1;
    }
    if (g->graphs[i].used < g->graphs[victim].used) victim = i;
  }
  graph_slot_clear(g, victim);
  memcpy(g->graphs[victim].key, key, len);
  g->graphs[victim].len = len;
  g->graphs[victim].used = ++g->clock;
  return 0;
}

int tide__gpu_capture_begin(tide__gpu_t *g, void **stream) {
  cu_result_t r = 0;
  if (g->capture == NULL) r = cu.cuStreamCreate(&g->capture, CU_STREAM_NON_BLOCKING);
  if (r == 0) r = cu.cuStreamBeginCapture(g->capture, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != 0) {
    graphs_off(g, "cuStreamBeginCapture", r);
    return TIDE_EIO;
  }
  *stream = g->capture;
  return 0;
}

void tide__gpu_capture_end(tide__gpu_t *g, int slot, int queued, void **exec) {
  *exec = NULL;
  cu_graph_t graph = NULL;
  cu_graph_exec_t e = NULL;
  cu_result_t r = cu.cuStreamEndCapture(g->capture, &graph);
  if (r == 0 && queued == 0) r = cu.cuGraphInstantiate(&e, graph, 0);
  if (r != 0 || queued != 0) {
    if (graph != NULL) cu.cuGraphDestroy(graph);
    if (r != 0) graphs_off(g, "capturing a selection as a graph", r);
    return; /* a launch refused while capturing: the eager launch will say why */
  }
  g->graphs[slot].graph = graph;
  g->graphs[slot].exec = *exec = e;
  TIDE_DEBUG("gpu: a repeated selection captured as a graph (slot %d)", slot);
}

int tide__gpu_graph_launch(tide__gpu_t *g, void *exec, void *stream) {
  (void)g;
  cu_result_t r = cu.cuGraphLaunch(exec, stream);
  return r == 0 ? 0 : cu_fail("cuGraphLaunch", r);
}

int tide__gpu_scratch(tide__gpu_t *g, size_t list_entries, tide__cu_ptr_t *state, tide__cu_ptr_t *hist,
                      tide__cu_ptr_t *partials, tide__cu_ptr_t *list, tide__gpu_state_t **host_state,
                      int **hist_dirty) {
  if (g->state == 0) {
    g->hist_dirty = 1;
    cu_result_t r;
    TIDE_CHECK(tide__gpu_alloc(g, sizeof(tide__gpu_state_t), &g->state));
    TIDE_CHECK(tide__gpu_alloc(g, (size_t)TIDE__GPU_HISTS * TIDE__GPU_BINS * 4, &g->hist));
    size_t partials = (size_t)tide__gpu_blocks(g) * sizeof(double); /* the mean's block sums, or */
    if (partials < TIDE__GPU_BUCKET * sizeof(uint64_t)) partials = TIDE__GPU_BUCKET * sizeof(uint64_t); /* a bucket */
    TIDE_CHECK(tide__gpu_alloc(g, partials, &g->partials));
    if ((r = cu.cuMemAllocHost((void **)&g->host_state, sizeof(tide__gpu_state_t))) != 0)
      return cu_fail("cuMemAllocHost", r);
  }
  if (list_entries > g->list_entries) {
    graphs_clear(g); /* they name the list */
    size_t want = list_entries + list_entries / 4; /* room to grow before the next reallocation */
    tide__gpu_free(g, g->list);
    g->list = 0;
    g->list_entries = 0;
    TIDE_CHECK(tide__gpu_alloc(g, want * 8, &g->list));
    g->list_entries = want;
  }
  *state = g->state;
  *hist = g->hist;
  *partials = g->partials;
  *list = g->list;
  *host_state = g->host_state;
  *hist_dirty = &g->hist_dirty;
  return 0;
}

int tide__gpu_launch_typed(tide__gpu_t *g, tide__gpu_kernel_t kernel, int type, unsigned blocks, void *stream,
                           void **args) {
  int i = (int)kernel * 3 + type;
  if (blocks == 0) blocks = g->grid[i];
  cu_result_t r = cu.cuLaunchKernel(g->funcs[i], blocks, 1, 1, TIDE__GPU_THREADS, 1, 1, 0, stream, args, NULL);
  return r == 0 ? 0 : cu_fail(g->names[i], r);
}

int tide__gpu_launch(tide__gpu_t *g, const char *fn, unsigned blocks, void *stream, void **args) {
  for (int i = 0; i < NFUNCS; i++) {
    if (strcmp(g->names[i], fn) == 0) {
      if (blocks == 0) blocks = g->grid[i];
      cu_result_t r = cu.cuLaunchKernel(g->funcs[i], blocks, 1, 1, TIDE__GPU_THREADS, 1, 1, 0, stream, args, NULL);
      return r == 0 ? 0 : cu_fail(fn, r);
    }
  }
  snprintf(last_error, sizeof last_error, "no kernel %s", fn);
  return TIDE_EINVAL;
}

int tide__gpu_memset32(tide__gpu_t *g, tide__cu_ptr_t p, unsigned value, size_t words, void *stream) {
  (void)g;
  cu_result_t r = cu.cuMemsetD32Async(p, value, words, stream);
  return r == 0 ? 0 : cu_fail("cuMemsetD32Async", r);
}

int tide__gpu_copy(tide__gpu_t *g, void *dst, const void *src, size_t bytes, void *stream) {
  (void)g;
  if (bytes == 0) return 0;
  cu_result_t r = cu.cuMemcpyAsync((tide__cu_ptr_t)(uintptr_t)dst, (tide__cu_ptr_t)(uintptr_t)src, bytes, stream);
  return r == 0 ? 0 : cu_fail("cuMemcpyAsync", r);
}

int tide__gpu_sync(tide__gpu_t *g, void *stream) {
  (void)g;
  cu_result_t r = cu.cuStreamSynchronize(stream);
  return r == 0 ? 0 : cu_fail("cuStreamSynchronize", r);
}

/* ---- public ------------------------------------------------------------------------------- */

int tide_gpu_available(char *why, size_t why_len) { return tide__gpu_probe(why, why_len); }

int tide_gpu_device_name(char *name, size_t len) {
  if (name == NULL || len == 0) return tide__null_arg("tide_gpu_device_name", "name");
  tide__gpu_t *g;
  TIDE_CHECK(tide__gpu_for_pointer("tide_gpu_device_name", NULL, &g));
  int dev = 0;
  char buf[256];
  cu_result_t r = cu.cuCtxGetDevice(&dev);
  if (r == 0) r = cu.cuDeviceGetName(buf, sizeof buf, dev);
  if (r != 0) return cu_fail("cuDeviceGetName", r);
  snprintf(name, len, "%s", buf);
  return 0;
}
