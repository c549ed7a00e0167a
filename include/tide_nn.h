/* nn: the small model engine tide-train trains with (Fashion-MNIST sized
 * MLPs and CNNs on the CPU), and the Fashion-MNIST loader. Part of libtide
 * (pkg-config --libs tide, CMake tide::tide); it calls only tide.h, so its
 * allocations go through tide_replace_allocator's hook and its errors are
 * logged in tide's format (tide_log_error).
 *
 * Every function returns 0 or a negative TIDE_E* code (include/tide.h) unless
 * its comment says otherwise; bad arguments give TIDE_EINVAL and one log line
 * naming the argument. Out-parameters are written only on success.
 *
 * Threads: a model is used by one thread at a time (any thread). The matrix
 * products run on OpenBLAS's threads (nn_set_threads); the engine's own loops
 * run on the calling thread. Datasets are read-only once loaded, so any
 * number of threads may read one.
 */
#ifndef TIDE_NN_H
#define TIDE_NN_H

#include <stddef.h>
#include <stdint.h>

#include "tide.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Images are 1 x 28 x 28 floats and there are 10 classes. */
enum { NN_IMAGE_SIZE = 784, NN_IMAGE_SIDE = 28, NN_CLASSES = 10 };

/* ---- models ------------------------------------------------------------- */

typedef struct nn_model nn_model_t;


/* Builds a model for inputs of [batch, 1, 28, 28] with batch <= max_batch,
 * its parameters initialised from seed (the same on every machine: see
 * docs/nn.md). arch is a name:
 *   "mlp"  flatten, dense 784->256, relu, dense 256->128, relu, dense 128->10
 *   "cnn"  conv 1->32 3x3 pad 1, relu, maxpool, conv 32->64 3x3 pad 1, relu,
 *          maxpool, flatten, dense 3136->128, relu, dense 128->10
 * or a layer list such as "conv:8:3:1,relu,pool,flatten,dense:10": conv:C:K:P
 * (C output channels, KxK kernel, padding P, stride 1), pool (max 2x2 stride
 * 2), relu (only right after conv or dense), flatten (before the first
 * dense), dense:N. The last layer must be dense with 10 outputs. Unknown
 * names or a malformed list give TIDE_EINVAL with a message listing the valid
 * forms. Free with nn_model_destroy. */
int nn_model_create(const char *arch, int max_batch, uint64_t seed, nn_model_t **out);
/* Frees the model and its buffers; NULL is fine. */
void nn_model_destroy(nn_model_t *m);

/* The layer list the model was built from ("flatten,dense:256,...") and the
 * largest batch it takes. The string lives as long as the model. */
const char *nn_model_arch(const nn_model_t *m);
int nn_model_max_batch(const nn_model_t *m);

/* All parameters in one contiguous buffer and all gradients in another of the
 * same layout and length (nn_param_count floats), so one collective covers the
 * whole model. Owned by the model; the caller may read and write them (an
 * optimizer updates params in place). */
size_t nn_param_count(const nn_model_t *m);
float *nn_params(nn_model_t *m);
float *nn_grads(nn_model_t *m);
/* The parameter tensors inside the flat parameter (and gradient) buffer,
 * params[offset .. offset+count) each, in buffer order (*count gets their
 * number; owned by the model): the views the optimizers and compressors
 * take. Weights are in PyTorch's layout: dense [out, in],
 * conv [out, in, kh, kw]; biases [out] (ndim 1). Names follow PyTorch's
 * ("conv1.weight", "fc2.bias"). */
const tide_tensor_t *nn_tensors(const nn_model_t *m, size_t *count);

/* Forward pass on x ([batch, 1, 28, 28] floats, borrowed for the call),
 * softmax cross-entropy against labels (each in [0, 10)), and backward pass:
 * writes the gradient of the mean loss over the batch into nn_grads
 * (overwriting it) and the mean loss into *loss_out (may be NULL).
 * 1 <= batch <= max_batch. */
int nn_forward_backward(nn_model_t *m, const float *x, const int32_t *labels, int batch,
                        float *loss_out);

/* Forward only over n >= 1 images, max_batch at a time: the mean loss in
 * *loss_out and the number of correct arg-max predictions in *correct_out
 * (either may be NULL). Does not touch nn_grads. */
int nn_evaluate(nn_model_t *m, const float *x, const int32_t *labels, int n, float *loss_out,
                int *correct_out);

/* Forward only: the logits of batch <= max_batch images into
 * logits_out[batch * 10]. */
int nn_forward(nn_model_t *m, const float *x, int batch, float *logits_out);

/* ---- K-FAC: each layer's inputs and output gradients ------------------------ */

/* The dense and conv layers, in order, as K-FAC layers (tide.h): tensor
 * indices into nn_tensors, in_dim = inputs (conv: in_c*k*k), out_dim =
 * outputs, every one with its bias. nn_kfac_layer_count gives how many
 * entries out must hold. */
size_t nn_kfac_layer_count(const nn_model_t *m);
int nn_kfac_layers(const nn_model_t *m, tide_kfac_layer_t *out);

/* Receives one layer's factor data during nn_forward_backward, in the
 * form tide_trainer_kfac_add takes (so a hook may just forward to it): A
 * gets the layer's input, dense [batch][in] rows; conv its im2col patches
 * [in_c*k*k][rows] (transposed), a chunk of the batch at a time (the chunks
 * its backward pass forms the weight gradient from; G comes first). G gets the
 * gradient of the mean loss at the layer's output (behind its ReLU): dense
 * [batch][out], conv [out][batch*oh*ow] (transposed). weight makes the
 * factors the per-sample Fisher's, independent of the batch (kfac-pytorch's
 * batch_averaged convention): A 1/batch (conv: 1/(batch*oh*ow), every
 * position a row), G batch (the gradient of a mean loss is batch times
 * smaller than a sample's). x is valid during the call only. A non-zero return stops
 * the pass and nn_forward_backward returns it. */
typedef int (*nn_kfac_cb)(void *ctx, size_t layer, tide_kfac_factor_t factor, const float *x, size_t rows,
                          size_t ld, int transposed, float weight);
/* Sets the hook the following nn_forward_backward calls run (fn NULL:
 * none, the default). The model borrows ctx. */
void nn_set_kfac_hook(nn_model_t *m, nn_kfac_cb fn, void *ctx);

/* Threads OpenBLAS uses for the matrix products (process-wide; n >= 1;
 * K-FAC's products in libtide share them). */
void nn_set_threads(int n);
/* The BLAS in use: "OpenBLAS <core>"; static storage. */
const char *nn_blas_info(void);

/* ---- per-layer profile (docs/burst-parallel.md) ------------------------------ */

/* Measures each layer of a model of arch (as nn_model_create) on this
 * machine, on the calling thread and OpenBLAS's threads (nn_set_threads): at
 * each per-worker batch of batches[0..nbatches), `warmup` untimed passes,
 * then `reps` forward+backward passes timed layer by layer; each layer's
 * forward and backward time is the median over the reps (a fused ReLU
 * counts with its conv or dense layer, the loss with none). The profile
 * (libtide's, tide.h) gets one layer per conv, pool, flatten and dense
 * layer in a chain, with parameter and activation bytes (floats). *out owned
 * by the caller (tide_profile_destroy). TIDE_EINVAL names a bad argument. */
/* flags: NN_PROFILE_CPU_CLOCK times layers by the process's CPU time
 * (CLOCK_PROCESS_CPUTIME_ID) instead of the wall clock: what a layer costs
 * whatever else runs on the machine (with one BLAS thread, its wall time on
 * an idle core). 0: wall clock. */
enum { NN_PROFILE_CPU_CLOCK = 1u };
int nn_profile(const char *arch, const int *batches, int nbatches, int warmup, int reps, unsigned flags,
               tide_profile_t **out);

/* The layers of arch's model (as nn_profile lists them: graph, parameter
 * and activation bytes) without times: what a plan file is checked against
 * (tide_plan_read_widths). *out owned by the caller. */
int nn_profile_layers(const char *arch, tide_profile_t **out);

/* ---- burst-parallel execution (docs/burst-parallel.md) ------------------------ */

/* Runs a plan on a model: layer i on the first widths[i] ranks of comm (a
 * power of two <= comm's size; one width per layer as nn_profile lists
 * them, e.g. from tide_plan_read_widths), the global batch of global_batch
 * samples split among each layer's ranks, activations and their gradients
 * moved between ranks at each change of width, each layer's gradient
 * summed among its ranks and its optimizer (a shard of `optim`'s kind for
 * that layer's parameters) stepped on them. Ranks that do not run a layer
 * skip its optimizer step: their copy of its parameters goes stale. Rank 0
 * runs every layer and holds the whole, current model. The results are
 * data parallelism's over the same global batch, up to floating-point
 * order. Sub-communicators are split once here.
 *
 * Collective over comm; the model and comm are borrowed (one thread at a
 * time uses the three). Every rank must build its model from the same seed
 * and give the same widths and global_batch (TIDE_EINVAL otherwise, like a
 * width that is not a power of two or exceeds the ranks, a number of widths
 * other than the model's layers, or a model whose max_batch is below the
 * samples a rank's layer gets). The K-FAC hook is not run. */
typedef struct nn_burst nn_burst_t;
int nn_burst_create(nn_model_t *m, tide_comm_t *comm, const int *widths, int nwidths, int global_batch,
                    const tide_optim_config_t *optim, nn_burst_t **out);
/* One training step on the global batch x[global_batch] (images) and its
 * labels, the same on every rank (each takes its share): forward, loss (the
 * mean over the global batch), backward, per-layer gradient sums and
 * optimizer steps with learning rate lr. *loss_out (may be NULL) gets the
 * loss on the ranks that run the last layer, NAN on the others. Collective
 * over the burst's comm. */
int nn_burst_step(nn_burst_t *b, const float *x, const int32_t *labels, float lr, float *loss_out);
/* The max_batch (nn_model_create) a model needs to run these widths on
 * global_batch samples: the largest share any rank's layer gets; 0 for
 * bad arguments (nn_burst_create says which). */
int nn_burst_max_batch(const int *widths, int nwidths, int global_batch);
/* 1 when this rank runs (and keeps current) layer `layer`. */
int nn_burst_runs(const nn_burst_t *b, int layer);
/* Frees the sub-communicators, buffers and optimizers; NULL is fine. Not
 * collective. */
void nn_burst_destroy(nn_burst_t *b);

/* ---- Fashion-MNIST -------------------------------------------------------- */

typedef struct nn_dataset nn_dataset_t;

/* Reads <dir>/train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz
 * (split "train", 60000 images) or t10k-* (split "test", 10000); dir NULL
 * means /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist).
 * Pixels become floats ((p/255 - 0.2860) / 0.3530), labels int32.
 * TIDE_ENOENT when a file is missing, TIDE_EINVAL when one is malformed (bad
 * magic, sizes, truncated), each with a log line naming the file. Free with
 * nn_dataset_free. */
int nn_fashion_load(const char *dir, const char *split, nn_dataset_t **out);
void nn_dataset_free(nn_dataset_t *ds);
/* Number of images; images are [count, 1, 28, 28] floats, labels [count];
 * owned by the dataset. */
size_t nn_dataset_count(const nn_dataset_t *ds);
const float *nn_dataset_images(const nn_dataset_t *ds);
const int32_t *nn_dataset_labels(const nn_dataset_t *ds);

#ifdef __cplusplus
}
#endif

#endif
