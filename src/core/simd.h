/* Float kernels over flat buffers that carry the squared norm along (the
 * trainer's accumulation and averaging passes), and a copy by
 * non-temporal stores (the shm transport's). Pure computation; any
 * thread. */
#ifndef TIDE_CORE_SIMD_H
#define TIDE_CORE_SIMD_H

#include <stddef.h>

/* x[i] = c*g[i] (x[i] += c*g[i] when add) over [0, n); returns sum g[i]^2.
 * x and g do not overlap. */
double tide__scale_into(float *restrict x, const float *restrict g, size_t n, float c, int add);
/* x[i] *= c over [0, n); returns sum x[i]^2 after scaling. */
double tide__scale_in_place(float *x, size_t n, float c);
/* memcpy by non-temporal stores (x86; elsewhere memcpy): the bytes go to
 * memory without first owning dst's lines, and leave them out of this
 * core's cache. The buffers do not overlap. */
void tide__copy_stream(void *restrict dst, const void *restrict src, size_t n);

#endif
