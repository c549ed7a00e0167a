/* K-FAC's arithmetic (see kfac.h): factor sums by SYRK, the running
 * averages, LAPACK's divide-and-conquer eigensolver, and the eigenbasis
 * preconditioner of kfac-pytorch's EIGEN method (damping on the Kronecker
 * product's eigenvalues). */
#include "optim/kfac.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <string.h>

#include "core/core.h"

void tide__kfac_syrk(float *upper, int dim, int bias, const float *x, size_t rows, size_t ld, int transposed,
                     float weight) {
  int cols = bias ? dim - 1 : dim;
  if (rows == 0) return;
  /* Row-major C = alpha A^T A over an A of rows x cols, or A A^T over a
   * feature-major cols x rows. */
  cblas_ssyrk(CblasRowMajor, CblasUpper, transposed ? CblasNoTrans : CblasTrans, cols, (int)rows, weight, x,
              (int)ld, 1.0f, upper, dim);
  if (!bias) return;
  /* The ones column: X^T 1 (column sums) and 1^T 1 = rows. */
  float *last = upper; /* upper[c*dim + cols] */
  for (int c = 0; c < cols; c++) {
    double sum = 0;
    if (transposed) {
      const float *xc = x + (size_t)c * ld;
      for (size_t r = 0; r < rows; r++) sum += xc[r];
    } else {
      for (size_t r = 0; r < rows; r++) sum += x[r * ld + (size_t)c];
    }
    last[(size_t)c * dim + (size_t)cols] += weight * (float)sum;
  }
  upper[(size_t)cols * dim + (size_t)cols] += weight * (float)rows;
}

void tide__kfac_sumsq(float *diag, int dim, int bias, const float *x, size_t rows, size_t ld, int transposed,
                      float weight) {
  int cols = bias ? dim - 1 : dim;
  if (rows == 0) return;
  if (transposed) {
    for (int c = 0; c < cols; c++) {
      const float *xc = x + (size_t)c * ld;
      double sum = 0;
      for (size_t r = 0; r < rows; r++) sum += (double)xc[r] * xc[r];
      diag[c] += weight * (float)sum;
    }
  } else {
    for (size_t r = 0; r < rows; r++) {
      const float *row = x + r * ld;
      for (int c = 0; c < cols; c++) diag[c] += weight * row[c] * row[c];
    }
  }
  if (bias) diag[cols] += weight * (float)rows;
}

void tide__kfac_precondition_diag(const float *qg, const float *dg, int dim_g, const float *da, int dim_a,
                                  float damping, const float *m, float *p, float *work) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dim_g, dim_a, dim_g, 1.0f, qg, dim_g, m, dim_a, 0.0f, work,
              dim_a);
  for (int i = 0; i < dim_g; i++) {
    float *row = work + (size_t)i * dim_a, gi = dg[i];
    for (int j = 0; j < dim_a; j++) row[j] /= gi * da[j] + damping;
  }
  tide__kfac_precondition_finish(qg, dim_g, dim_a, work, p);
}

size_t tide__kfac_sample_count(size_t rows, float fraction, size_t *stride) {
  double want = ceil((double)fraction * (double)rows);
  size_t n = want < 1 ? 1 : want > (double)rows ? rows : (size_t)want;
  if (rows == 0) n = 0;
  if (stride != NULL) *stride = n > 0 ? rows / n : 1;
  return n;
}

size_t tide__kfac_sample(const float *x, size_t rows, size_t cols, size_t ld, int transposed, float fraction,
                         size_t shift, float *out) {
  size_t stride, n = tide__kfac_sample_count(rows, fraction, &stride);
  shift %= stride;
  /* Row j is floor(j * rows / n) + shift: q = rows / n a step, plus one
   * whenever the remainders add up to n (exact, no division per row). */
  size_t q = n ? rows / n : 0, rem = n ? rows % n : 0;
  for (size_t c = 0; c < (transposed ? cols : 1); c++) {
    size_t base = 0, acc = 0;
    for (size_t j = 0; j < n; j++) {
      size_t r = base + shift;
      if (transposed)
        out[c * n + j] = x[c * ld + r];
      else
        memcpy(out + j * cols, x + r * ld, cols * sizeof *out);
      base += q;
      if ((acc += rem) >= n) base++, acc -= n;
    }
  }
  return n;
}

void tide__kfac_pack(const float *upper, int dim, float scale, float *packed) {
  for (int i = 0; i < dim; i++) {
    const float *row = upper + (size_t)i * dim;
    for (int j = i; j < dim; j++) *packed++ = row[j] * scale;
  }
}

void tide__kfac_blend(float *running, int dim, const float *packed, float scale, float decay) {
  float keep = decay, take = (1.0f - decay) * scale;
  for (int i = 0; i < dim; i++)
    for (int j = i; j < dim; j++) {
      float *v = &running[(size_t)i * dim + j];
      *v = keep * *v + take * *packed++;
    }
}

int tide__kfac_eigen(const float *f, int dim, float *q, float *d) {
  memcpy(q, f, (size_t)dim * dim * sizeof *q);
  return tide__kfac_eigen_inplace(q, dim, d);
}

int tide__kfac_eigen_inplace(float *q, int dim, float *d) {
  /* LAPACKE_ssyevd's own workspace query rounds its size through a float,
   * which comes out too small past dim ~ 3000: size it here. */
  lapack_int n = dim, lwork = 1 + 6 * n + 2 * n * n, liwork = 3 + 5 * n;
  float *work = tide__malloc((size_t)lwork * sizeof *work);
  lapack_int *iwork = tide__malloc((size_t)liwork * sizeof *iwork);
  if (work == NULL || iwork == NULL) {
    tide__free(work);
    tide__free(iwork);
    return TIDE_ENOMEM;
  }
  /* Only f's row-major upper triangle is read: column-major, that is the
   * lower one. The column-major eigenvectors read row-major are Q^T. */
  lapack_int info = LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, 'V', 'L', n, q, n, d, work, lwork, iwork, liwork);
  tide__free(work);
  tide__free(iwork);
  if (info != 0) {
    TIDE_ERROR("K-FAC: ssyevd failed (info %d) on a %d x %d factor: non-finite values in the factor?", (int)info,
               dim, dim);
    return TIDE_EINVAL;
  }
  for (int j = 0; j < dim; j++)
    if (!(d[j] > 0.0f)) d[j] = 0.0f;
  return 0;
}

void tide__kfac_precondition_rows(const float *qg, const float *dg, int dim_g, const float *qa, const float *da,
                                  int dim_a, float damping, const float *m, int r0, int r1, float *w, float *work) {
  int rows = r1 - r0;
  if (rows <= 0) return;
  /* qg holds Q_G^T (rows = eigenvectors), so rows r0..r1 of Q_G^T m are
   * qg's rows r0..r1 times m. */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dim_a, dim_g, 1.0f, qg + (size_t)r0 * dim_g, dim_g, m,
              dim_a, 0.0f, work, dim_a);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, dim_a, dim_a, 1.0f, work, dim_a, qa, dim_a, 0.0f, w,
              dim_a);
  for (int i = 0; i < rows; i++) {
    float *row = w + (size_t)i * dim_a, gi = dg[r0 + i];
    for (int j = 0; j < dim_a; j++) row[j] /= gi * da[j] + damping;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, dim_a, dim_a, 1.0f, w, dim_a, qa, dim_a, 0.0f, work,
              dim_a);
  memcpy(w, work, (size_t)rows * dim_a * sizeof *w);
}

void tide__kfac_precondition_finish(const float *qg, int dim_g, int dim_a, const float *w, float *p) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dim_g, dim_a, dim_g, 1.0f, qg, dim_g, w, dim_a, 0.0f, p,
              dim_a);
}

void tide__kfac_precondition(const float *qg, const float *dg, int dim_g, const float *qa, const float *da,
                             int dim_a, float damping, const float *m, float *p, float *work) {
  tide__kfac_precondition_rows(qg, dg, dim_g, qa, da, dim_a, damping, m, 0, dim_g, work, p);
  tide__kfac_precondition_finish(qg, dim_g, dim_a, work, p);
}

/* Subspace iterations of tide__kfac_eigen_top after the first product
 * (Halko, Martinsson & Tropp 2011, algorithm 4.4): on a 300-wide factor with
 * a decaying spectrum the kept eigenvalues come out within 1e-6 of ssyevd's,
 * relative to the largest (test_kfac). */
enum { TOP_ITERATIONS = 2 };

int tide__kfac_eigen_top(const float *f, int dim, int rank, float *q, float *d) {
  int n = dim, k = rank + TIDE__KFAC_TOP_EXTRA < dim ? rank + TIDE__KFAC_TOP_EXTRA : dim;
  if (rank < 1 || rank >= dim) {
    TIDE_ERROR("K-FAC: a top-%d eigendecomposition of a %d x %d factor (needs 1 <= rank < dim)", rank, dim, dim);
    return TIDE_EINVAL;
  }
  float *v = tide__malloc((size_t)k * n * sizeof *v), *z = tide__malloc((size_t)k * n * sizeof *z);
  float *tau = tide__malloc((size_t)k * sizeof *tau), *b = tide__malloc((size_t)k * k * sizeof *b);
  float *e = tide__malloc((size_t)k * sizeof *e);
  int rc = v == NULL || z == NULL || tau == NULL || b == NULL || e == NULL ? TIDE_ENOMEM : 0;
  double trace = 0;
  for (int j = 0; j < n; j++) trace += f[(size_t)j * n + j];
  /* V (k x n, a vector per row): Gaussian from a fixed seed, so every
   * decomposition of the same f gives the same bits. */
  lapack_int seed[4] = {1, 3, 5, 7};
  if (rc == 0 && LAPACKE_slarnv(3, seed, (lapack_int)k * n, v) != 0) rc = TIDE_EINVAL;
  for (int it = 0; rc == 0; it++) {
    /* Z = V F (F's upper triangle); the last one feeds the Rayleigh-Ritz step. */
    cblas_ssymm(CblasRowMajor, CblasRight, CblasUpper, k, n, 1.0f, f, n, v, n, 0.0f, z, n);
    if (it == TOP_ITERATIONS + 1) break;
    /* V = orthonormal rows spanning Z's: Z row-major is Z^T column-major. */
    if (LAPACKE_sgeqrf(LAPACK_COL_MAJOR, n, k, z, n, tau) != 0 || LAPACKE_sorgqr(LAPACK_COL_MAJOR, n, k, k, z, n, tau) != 0)
      rc = TIDE_EINVAL;
    float *t = v;
    v = z, z = t;
  }
  /* B = V F V^T (k x k) and its eigenvectors S (rows); the kept
   * eigenvectors are the largest rows of S V. f is read for the last time
   * above, so q may be f. */
  if (rc == 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, k, k, n, 1.0f, z, n, v, n, 0.0f, b, k);
    rc = tide__kfac_eigen_inplace(b, k, e);
  }
  if (rc == 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rank, n, k, 1.0f, b + (size_t)(k - rank) * k, k, v, n,
                0.0f, q, n);
    double kept = 0;
    for (int j = 0; j < rank; j++) kept += d[j] = e[k - rank + j];
    float tail = (float)((trace - kept) / (double)(n - rank));
    for (int j = rank; j < n; j++) d[j] = tail > 0 ? tail : 0.0f;
  } else if (rc == TIDE_EINVAL) {
    TIDE_ERROR("K-FAC: the top-%d eigendecomposition of a %d x %d factor failed: non-finite values in the factor?",
               rank, dim, dim);
  }
  tide__free(v);
  tide__free(z);
  tide__free(tau);
  tide__free(b);
  tide__free(e);
  return rc;
}

void tide__kfac_precondition_lowrank(const float *qg, const float *dg, int rank_g, int dim_g, const float *qa,
                                     const float *da, int rank_a, int dim_a, float damping, const float *m, float *p,
                                     float *work) {
  /* With U_G, U_A the kept eigenvectors (rows), c_G, c_A the other
   * eigenvalues' mean (a factor kept whole has none: its U is all of Q^T),
   * Y = U_G M, C = Y U_A^T, Z = M U_A^T and
   *   D_G = diag(1 / (d_G c_A + damping)), D_A = diag(1 / (c_G d_A + damping)),
   *   e = 1 / (c_G c_A + damping),
   * P sums the four blocks of M in the two eigenbases:
   *   P = U_G^T T + [G low] (e M [A low] + Z (D_A - e [A low]) U_A),
   *   T = [A low] (D_G - e [G low]) Y + K U_A,
   *   K = C ./ (d_G d_A^T + damping) - [A low] D_G C - [G low] C D_A + [both low] e C. */
  int low_g = rank_g < dim_g, low_a = rank_a < dim_a;
  float cg = low_g ? dg[rank_g] : 0.0f, ca = low_a ? da[rank_a] : 0.0f, e = 1.0f / (cg * ca + damping);
  float *y = work, *c = y + (size_t)rank_g * dim_a, *z = c + (size_t)rank_g * rank_a;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rank_g, dim_a, dim_g, 1.0f, qg, dim_g, m, dim_a, 0.0f, y,
              dim_a);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rank_g, rank_a, dim_a, 1.0f, y, dim_a, qa, dim_a, 0.0f, c,
              rank_a);
  for (int i = 0; i < rank_g; i++) {
    float gi = 1.0f / (dg[i] * ca + damping), *ci = c + (size_t)i * rank_a, *yi = y + (size_t)i * dim_a;
    for (int j = 0; j < rank_a; j++) {
      float aj = 1.0f / (cg * da[j] + damping), v = ci[j];
      ci[j] = v / (dg[i] * da[j] + damping) - (low_a ? gi * v : 0.0f) - (low_g ? v * aj : 0.0f) +
              (low_a && low_g ? e * v : 0.0f);
    }
    float scale = low_a ? gi - (low_g ? e : 0.0f) : 0.0f;
    for (int j = 0; j < dim_a; j++) yi[j] *= scale;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rank_g, dim_a, rank_a, 1.0f, c, rank_a, qa, dim_a, 1.0f, y,
              dim_a);
  if (!low_g) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dim_g, dim_a, rank_g, 1.0f, qg, dim_g, y, dim_a, 0.0f, p,
                dim_a);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, dim_g, rank_a, dim_a, 1.0f, m, dim_a, qa, dim_a, 0.0f, z,
              rank_a);
  for (int i = 0; i < dim_g; i++)
    for (int j = 0; j < rank_a; j++) z[(size_t)i * rank_a + j] *= 1.0f / (cg * da[j] + damping) - (low_a ? e : 0.0f);
  for (size_t i = 0, n = (size_t)dim_g * dim_a; i < n; i++) p[i] = low_a ? e * m[i] : 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, dim_g, dim_a, rank_a, 1.0f, z, rank_a, qa, dim_a, 1.0f, p,
              dim_a);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dim_g, dim_a, rank_g, 1.0f, qg, dim_g, y, dim_a, 1.0f, p,
              dim_a);
}
