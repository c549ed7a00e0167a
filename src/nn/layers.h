/* The layer kernels of src/nn, forward and backward, on raw float buffers.
 * Internal to src/nn (and its test); no allocation, no logging, no argument
 * checks: model.c validates shapes once when it builds a model.
 *
 * Layouts. Before flatten, activations are channel-major [C][B][H][W] ("CBHW")
 * rather than PyTorch's [B][C][H][W]: a convolution over many images is then
 * one matrix product, W[Cout][Cin*K*K] x col[Cin*K*K][B*OH*OW], whose result
 * is already the next layer's CBHW input. A [B][1][H][W] input is the
 * same memory as [1][B][H][W]. flatten turns CBHW into [B][C*H*W] (PyTorch's
 * order of features), which dense layers use.
 *
 * Backward kernels write (never accumulate) parameter gradients. */
#ifndef TIDE_NN_LAYERS_H
#define TIDE_NN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/* Row-major C[m][n] = alpha * op(A) op(B) + beta * C, op = transpose when
 * trans_* != 0 (A is then stored [k][m], B [n][k]). OpenBLAS when the build
 * found it, else a plain loop. */
void nn__sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
               const float *b, int ldb, float beta, float *c, int ldc);

/* ---- dense: y[B][out] = x[B][in] W[out][in]^T + b, then ReLU if relu -------- */
void nn__dense_forward(const float *x, const float *w, const float *b, int batch, int in, int out,
                       int relu, float *y);
/* dy is the gradient at the (post-ReLU, if any) output with the ReLU mask
 * already applied (nn__relu_backward). dx may be NULL (first layer). */
void nn__dense_backward(const float *x, const float *w, const float *dy, int batch, int in, int out,
                        float *dw, float *db, float *dx);

/* ---- ReLU ------------------------------------------------------------------ */
void nn__relu_forward(const float *x, float *y, size_t n);
/* dy[i] = 0 where y[i] <= 0 (y is the ReLU's output), in place. */
void nn__relu_backward(const float *y, float *dy, size_t n);

/* ---- conv2d, stride 1, square kernel, zero padding, CBHW ------------------- */
typedef struct {
  int cin, cout, k, pad;
  int h, w;   /* input plane */
  int oh, ow; /* output plane: h + 2 pad - k + 1 */
} nn__conv_t;

/* Floats of scratch the two calls below need for a batch of `batch`: the
 * im2col matrix of one chunk of the batch. */
size_t nn__conv_scratch_size(const nn__conv_t *c, int batch);
/* x [cin][B][h][w] -> y [cout][B][oh][ow]. */
void nn__conv_forward(const nn__conv_t *c, int batch, const float *x, const float *w,
                      const float *b, int relu, float *scratch, float *y);
/* Receives each chunk's im2col matrix during nn__conv_backward: col
 * [(ci,kh,kw)][cols], cols = nb*oh*ow of the chunk's samples (K-FAC's A
 * rows for a convolution, KFC). col is valid during the call only. A
 * non-zero return stops the backward pass, which returns it. */
typedef int (*nn__patches_cb)(void *ctx, const float *col, size_t cols);
/* dy [cout][B][oh][ow], ReLU mask already applied; x is the forward pass's
 * input. dx [cin][B][h][w] may be NULL (first layer). patches (NULL: none)
 * gets each chunk's im2col matrix, the one the weight gradient is formed
 * from: no second im2col pass for K-FAC. 0, or patches' non-zero return
 * (dw, dx then incomplete). */
int nn__conv_backward(const nn__conv_t *c, int batch, const float *x, float *scratch, const float *w,
                      const float *dy, float *dw, float *db, float *dx, nn__patches_cb patches, void *ctx);

/* The chunk of nb samples from b0 as col[(ci,kh,kw)][nb*oh*ow]
 * (nn__conv_scratch_size floats suffice): what nn__conv_backward hands
 * patches, for tests to compare against. */
void nn__conv_patches(const nn__conv_t *c, int batch, int b0, int nb, const float *x, float *col);

/* ---- max-pool 2x2 stride 2 over planes [P][h][w] -> [P][h/2][w/2] ----------- */
/* A last odd row or column is dropped, as PyTorch does. arg keeps which of
 * the four won (0..3, row-major; the first of equal values). relu != 0 applies
 * a ReLU to the output: max and ReLU commute, and a quarter of the values
 * are left after the pool. */
void nn__maxpool_forward(const float *x, size_t planes, int h, int w, int relu, float *y,
                         uint8_t *arg);
/* dx gets dy at each window's winner and 0 elsewhere. relu_mask != 0 folds in
 * the backward of a ReLU that fed the pool: no gradient where y <= 0. */
void nn__maxpool_backward(const float *dy, const float *y, const uint8_t *arg, size_t planes, int h,
                          int w, int relu_mask, float *dx);

/* ---- flatten: [C][B][hw] <-> [B][C*hw] ------------------------------------- */
void nn__flatten_forward(const float *x, int c, int batch, int hw, float *y);
void nn__flatten_backward(const float *dy, int c, int batch, int hw, float *dx);

/* ---- softmax cross-entropy ------------------------------------------------- */
/* Mean over the batch of -log softmax(logits[b])[labels[b]], computed with the
 * max subtracted (no overflow). When dlogits != NULL it gets the gradient of
 * that mean, (softmax - onehot) / batch. When correct != NULL it gets the
 * number of rows whose first arg-max equals the label. */
double nn__softmax_xent(const float *logits, const int32_t *labels, int batch, int classes,
                        float *dlogits, int *correct);

#endif
