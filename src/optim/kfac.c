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
  /* The lower triangle from the upper, in square tiles: one column at a
   * time it wrote a line per element (fc1's 3137 x 3137 A: docs/adaptation.md,
   * "K-FAC's step, stage by stage"). The same values either way. */
  enum { TILE = 64 };
  for (int i0 = 0; i0 < dim; i0 += TILE)
    for (int j0 = i0; j0 < dim; j0 += TILE) {
      int i1 = i0 + TILE < dim ? i0 + TILE : dim, j1 = j0 + TILE < dim ? j0 + TILE : dim;
      for (int i = i0; i < i1; i++)
        for (int j = j0 > i + 1 ? j0 : i + 1; j < j1; j++) running[(size_t)j * dim + i] = running[(size_t)i * dim + j];
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
  /* f is symmetric, so its row-major storage is its column-major one; the
   * column-major eigenvectors read row-major are Q^T. */
  lapack_int info = LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, q, n, d, work, lwork, iwork, liwork);
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
