/* The GPU layer: CUDA's driver API and NVRTC, both loaded with dlopen when
 * a process first asks for a GPU (driver.c), and the top-k kernels queued
 * on the caller's stream (select.c). Nothing here needs CUDA at build
 * time: a machine without a GPU builds and runs tide the same, and every
 * entry point then answers TIDE_ENOSYS with the reason. Above core, below
 * compress (whose compressor keeps its residual on a GPU through
 * tide__gpu_ef_*). */
#ifndef TIDE_GPU_H
#define TIDE_GPU_H

#include "core/core.h"
#include "gpu/state.h"

/* The driver API's handles, declared here so that no CUDA header is needed. */
typedef unsigned long long tide__cu_ptr_t; /* CUdeviceptr */
typedef struct tide__gpu tide__gpu_t;     /* one CUDA context: its module, scratch and lock */

/* The kernels, by input type (0 f32, 1 f16, 2 bf16). */
typedef enum {
  TIDE__K_HIST,
  TIDE__K_COLLECT,
  TIDE__K_SAMPLE,
  TIDE__K_CHECK,
  TIDE__K_MEAN,
  TIDE__K_PROBE,
  TIDE__K_BAND,
  TIDE__K_EMIT,
  TIDE__K_TYPED_COUNT
} tide__gpu_kernel_t;

/* 1 when a GPU is usable; else 0 with the reason in why. Loads the driver
 * once per process (later calls return what the first found). */
int tide__gpu_probe(char *why, size_t why_len);

/* The context of device pointer p (made current on the calling thread),
 * its kernels compiled and loaded, or TIDE_EINVAL when p is not device
 * memory / TIDE_ENOSYS without a GPU, logged with `fn`. */
int tide__gpu_for_pointer(const char *fn, const void *p, tide__gpu_t **out);
/* 1 when p is device (or managed) memory of a loaded driver, else 0. */
int tide__gpu_is_device_pointer(const void *p);

/* Under the context's lock (select.c takes it around a selection). */
void tide__gpu_lock(tide__gpu_t *g);
void tide__gpu_unlock(tide__gpu_t *g);
int tide__gpu_blocks(const tide__gpu_t *g); /* the most blocks a pass over x launches: SMs x 8 */
/* Scratch of the context, grown to at least the sizes asked; under the lock.
 * *hist_dirty: set when the histogram bins must be zeroed before use. */
int tide__gpu_scratch(tide__gpu_t *g, size_t list_entries, tide__cu_ptr_t *state, tide__cu_ptr_t *hist,
                      tide__cu_ptr_t *partials, tide__cu_ptr_t *list, tide__gpu_state_t **host_state,
                      int **hist_dirty);

/* Queues select.cu's kernel of that kind for input type (0 f32, 1 f16, 2 bf16)
 * with `blocks` blocks, or 0: a pass over x's grid (as many blocks of the
 * kernel as the device runs at once, at most tide__gpu_blocks). */
int tide__gpu_launch_typed(tide__gpu_t *g, tide__gpu_kernel_t kernel, int type, unsigned blocks, void *stream,
                           void **args);
/* Queues kernel `fn` (a name of select.cu's) with `blocks` blocks (0 as
 * above) of TIDE__GPU_THREADS threads on stream; args as cuLaunchKernel
 * takes them. */
int tide__gpu_launch(tide__gpu_t *g, const char *fn, unsigned blocks, void *stream, void **args);
/* CUDA graphs of repeated selections (TIDE_GPU_GRAPHS). A key names a
 * selection's first round of queued work exactly (its tensors, k, the
 * scratch): tide__gpu_graph_find answers 0 the first time (launch one by
 * one), 1 the second with the key's *slot (capture it:
 * tide__gpu_capture_begin gives the stream to queue on,
 * tide__gpu_capture_end the graph, *exec NULL when it could not be made),
 * 2 with *exec after that. Under the context's lock. */
#define TIDE__GPU_GRAPH_KEY 128
int tide__gpu_graph_find(tide__gpu_t *g, const void *key, size_t len, void **exec, int *slot);
int tide__gpu_capture_begin(tide__gpu_t *g, void **stream);
/* queued: the first failed queuing's code while capturing, else 0. */
void tide__gpu_capture_end(tide__gpu_t *g, int slot, int queued, void **exec);
int tide__gpu_graph_launch(tide__gpu_t *g, void *exec, void *stream);
int tide__gpu_memset32(tide__gpu_t *g, tide__cu_ptr_t p, unsigned value, size_t words, void *stream);
int tide__gpu_copy(tide__gpu_t *g, void *dst, const void *src, size_t bytes, void *stream); /* any direction */
int tide__gpu_sync(tide__gpu_t *g, void *stream);
int tide__gpu_alloc(tide__gpu_t *g, size_t bytes, tide__cu_ptr_t *out);
void tide__gpu_free(tide__gpu_t *g, tide__cu_ptr_t p);
/* The driver's text for the last failed call (for messages). */
const char *tide__gpu_last_error(void);

/* ---- error feedback on a GPU (the compressor's backend) ---- */

typedef struct tide__gpu_ef tide__gpu_ef_t;
/* A residual of d floats on the current context's device (or device 0),
 * zeroed; selections queue on stream (NULL: the legacy default stream). */
int tide__gpu_ef_create(size_t d, void *stream, tide__gpu_ef_t **out);
void tide__gpu_ef_destroy(tide__gpu_ef_t *ef);
/* acc = grad + residual (grad on the host or the device); k pairs of acc
 * selected on the device into values, indices (host memory); the residual
 * becomes acc with those zeroed. A NaN/Inf in acc: TIDE__NONFINITE with
 * *bad_index, the residual unchanged. */
int tide__gpu_ef_compress(tide__gpu_ef_t *ef, tide_topk_kind_t kind, const tide_topk_opts_t *opts,
                          const float *grad, size_t k, const char *name, float *values, uint32_t *indices,
                          size_t *bad_index);
const float *tide__gpu_ef_residual(const tide__gpu_ef_t *ef); /* a device pointer */
int tide__gpu_ef_set_residual(tide__gpu_ef_t *ef, const float *residual); /* host or device source */
int tide__gpu_ef_reset(tide__gpu_ef_t *ef);

/* tide_gpu_topk_select without the message for a NaN/Inf: TIDE__NONFINITE
 * and *bad_index. */
#define TIDE__GPU_NONFINITE 1
int tide__gpu_select(tide_topk_kind_t kind, const tide_topk_opts_t *opts, const void *x, tide_dtype_t dtype,
                     size_t d, size_t k, void *values, void *indices, tide_dtype_t index_dtype, void *stream,
                     tide_topk_stats_t *stats, size_t *bad_index);

#endif
