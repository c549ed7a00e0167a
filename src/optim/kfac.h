/* K-FAC's arithmetic (src/optim/kfac.c): Kronecker factors, their
 * eigendecompositions and the preconditioned gradient of one layer. Pure
 * computation on caller-owned buffers (CBLAS, LAPACKE); the trainer's K-FAC
 * stage (src/train/kfac.c) owns the buffers and does the communication.
 * This header is optim's declared interface to train. Any thread; calls on
 * distinct buffers may run at once. Matrices are row-major, dim x dim. */
#ifndef TIDE_OPTIM_KFAC_H
#define TIDE_OPTIM_KFAC_H

#include <stddef.h>

/* The largest factor dimension accepted (a 8193^2 float matrix is 256 MiB). */
enum { TIDE__KFAC_MAX_DIM = 8193 };

/* upper (dim x dim, upper triangle used) += weight * Xb^T Xb, Xb = X with
 * a ones column appended when bias (then X has dim - 1 columns). X is
 * rows x cols at x[r*ld + c], or at x[c*ld + r] when transposed. */
void tide__kfac_syrk(float *upper, int dim, int bias, const float *x, size_t rows, size_t ld, int transposed,
                     float weight);

/* The diagonal form of A for a wide layer (tide_kfac_config_t.diag_dim):
 * diag (dim floats) += weight * the column sums of squares of Xb (X with a
 * ones column when bias), laid out as in tide__kfac_syrk. */
void tide__kfac_sumsq(float *diag, int dim, int bias, const float *x, size_t rows, size_t ld, int transposed,
                      float weight);
/* p = Q_G ((Q_G^T m) ./ (d_G da^T + damping)): the preconditioner with A
 * replaced by its diagonal da (dim_a floats, >= 0); qg, dg as
 * tide__kfac_eigen writes them, work holds dim_g * dim_a floats. Equals
 * tide__kfac_precondition with Q_A = I and d_A = da. */
void tide__kfac_precondition_diag(const float *qg, const float *dg, int dim_g, const float *da, int dim_a,
                                  float damping, const float *m, float *p, float *work);

/* Factor statistics from a subsample (tide_kfac_config_t.sample): of
 * `rows` rows, n = ceil(fraction * rows) (at least 1, at most rows), rows
 * floor(j * rows / n) + shift for j in [0, n), spread evenly over the
 * micro-batch (and, where rows are a conv's batch x positions, over its
 * positions). tide__kfac_sample_count gives n and the stride
 * floor(rows / n): shift is taken modulo it, so a caller that moves shift
 * on each factor step takes other rows each time (all of them when n
 * divides rows). tide__kfac_sample copies those
 * rows of X (cols columns, laid out as in tide__kfac_syrk) into out in
 * the same layout with ld = cols (rows) or n (transposed), and returns n;
 * out holds n * cols floats. The subsampled factor is
 * tide__kfac_syrk(out, n rows) with weight * rows / n, so that its
 * expectation is the full factor's. */
size_t tide__kfac_sample_count(size_t rows, float fraction, size_t *stride);
size_t tide__kfac_sample(const float *x, size_t rows, size_t cols, size_t ld, int transposed, float fraction,
                         size_t shift, float *out);

/* The upper triangle of `upper` times scale, row by row, into packed
 * (dim*(dim+1)/2 floats). */
void tide__kfac_pack(const float *upper, int dim, float scale, float *packed);
/* running = decay*running + (1-decay)*S, S the symmetric matrix whose
 * upper triangle is packed * scale: running's upper triangle only (every
 * reader of a factor reads that; the lower one keeps its first values). */
void tide__kfac_blend(float *running, int dim, const float *packed, float scale, float decay);
/* Packed floats of a dim x dim factor. */
static inline size_t tide__kfac_packed(int dim) { return (size_t)dim * ((size_t)dim + 1) / 2; }

/* Eigendecomposition of the symmetric f (dim x dim, its upper triangle read, not changed):
 * q[j*dim .. j*dim+dim) is eigenvector j (q holds Q^T) and d[j] its
 * eigenvalue, clamped to >= 0. Allocates LAPACK's workspace for the call.
 * 0, TIDE_ENOMEM, or TIDE_EINVAL when LAPACK fails (non-finite input). */
int tide__kfac_eigen(const float *f, int dim, float *q, float *d);
/* The same with f in q on entry (overwritten by the eigenvectors): the
 * trainer's background decompositions (tide_kfac_config_t.staleness) copy
 * the factor there themselves. Same bits as tide__kfac_eigen. */
int tide__kfac_eigen_inplace(float *q, int dim, float *d);

/* A low-rank decomposition of a wide factor (tide_kfac_config_t.lowrank):
 * the top `rank` eigenpairs of the symmetric f (dim x dim, its upper triangle read) by randomized
 * subspace iteration (a fixed seed: the same f gives the same bits), the
 * other eigenvalues replaced by their mean (trace - the kept ones) /
 * (dim - rank). q[j*dim ..] for j < rank are the kept eigenvectors
 * (ascending eigenvalues), d[j] their eigenvalues, d[rank .. dim) the mean;
 * all clamped >= 0. About 4 (rank + 32) dim^2 multiply-adds (below) instead of
 * ssyevd's ~dim^3 work. 1 <= rank < dim. q may be f (read before q is
 * written). 0, TIDE_ENOMEM, or TIDE_EINVAL (LAPACK failed). */
int tide__kfac_eigen_top(const float *f, int dim, int rank, float *q, float *d);
/* The vectors tide__kfac_eigen_top carries beyond the kept ones: its cost
 * is about 4 (rank + TIDE__KFAC_TOP_EXTRA) dim^2 multiply-adds. */
enum { TIDE__KFAC_TOP_EXTRA = 32 };

/* p = the preconditioner with G and A each either whole (rank = dim: q
 * and d as tide__kfac_eigen writes them) or low-rank (rank < dim: as
 * tide__kfac_eigen_top writes them, F ~ U^T diag(d_U) U + c (I - U^T U) with
 * U q's first rank rows and c = d[rank]): equal to tide__kfac_precondition
 * with those factors' whole decompositions, at about 2 dim_a rank_g (dim_g +
 * rank_a) + 2 dim_g dim_a rank_a (G low) multiply-adds instead of
 * 2 dim_g dim_a (dim_g + dim_a). At least one factor low-rank. work holds
 * rank_g (dim_a + rank_a) + dim_g rank_a floats. m and p may not alias. */
void tide__kfac_precondition_lowrank(const float *qg, const float *dg, int rank_g, int dim_g, const float *qa,
                                     const float *da, int rank_a, int dim_a, float damping, const float *m, float *p,
                                     float *work);
static inline size_t tide__kfac_lowrank_work(int rank_g, int dim_g, int rank_a, int dim_a) {
  return (size_t)rank_g * ((size_t)dim_a + rank_a) + (size_t)dim_g * rank_a;
}

/* p (dim_g x dim_a) = Q_G ((Q_G^T m Q_A) ./ (d_G d_A^T + damping)) Q_A^T
 * for the layer gradient m (dim_g x dim_a); qg, qa as tide__kfac_eigen
 * writes them. work holds dim_g * dim_a floats. m and p may not alias. */
void tide__kfac_precondition(const float *qg, const float *dg, int dim_g, const float *qa, const float *da,
                             int dim_a, float damping, const float *m, float *p, float *work);

/* The same in two parts, so that a layer's rows can be spread over ranks:
 * rows [r0, r1) of W = ((Q_G^T m Q_A) ./ (d_G d_A^T + damping)) Q_A^T into
 * w ((r1 - r0) x dim_a), work holding as many floats; then p = Q_G W from
 * the whole W (dim_g x dim_a). tide__kfac_precondition is the two over all
 * rows (test_kfac compares the layer spread over ranks with it). */
void tide__kfac_precondition_rows(const float *qg, const float *dg, int dim_g, const float *qa, const float *da,
                                  int dim_a, float damping, const float *m, int r0, int r1, float *w, float *work);
void tide__kfac_precondition_finish(const float *qg, int dim_g, int dim_a, const float *w, float *p);

#endif
