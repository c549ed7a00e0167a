/* Internal to src/nn: a model's layers one at a time, for burst-parallel
 * execution (burst.c), where each layer runs on its own batch. A layer's
 * output is [planes][batch][per_plane] floats (CBHW before flatten; one
 * plane of per-sample features after it); the model's input is one plane
 * of NN_IMAGE_SIZE. */
#ifndef TIDE_NN_MODEL_LAYERS_H
#define TIDE_NN_MODEL_LAYERS_H

#include <stddef.h>

#include "nn/nn.h"

int nn__layer_count(const nn_model_t *m);
/* The first layer with parameters: no backward pass runs below it and it
 * computes no input gradient. */
int nn__first_param(const nn_model_t *m);
/* Layer i's output layout per sample. */
void nn__layer_shape(const nn_model_t *m, int i, int *planes, size_t *per_plane);
/* Layer i's parameters (weights then bias) in nn_params/nn_grads:
 * [offset, offset + count); count 0 for a layer without parameters. */
void nn__layer_params(const nn_model_t *m, int i, size_t *offset, size_t *count);
/* Layer i forward on in ([planes of layer i-1][batch][...], borrowed until
 * its backward), batch <= max_batch; returns its output (the model's buffer,
 * valid until layer i runs again). */
const float *nn__layer_forward(nn_model_t *m, int i, const float *in, int batch);
/* Layer i backward after its forward at the same batch: dout (its output's
 * gradient; a fused ReLU's mask is applied in place), its parameter
 * gradients written to nn_grads, the input's gradient into dx (NULL: not
 * wanted). Returns where the input's gradient is: dx, or dout for a flatten
 * that aliases its input. */
float *nn__layer_backward(nn_model_t *m, int i, int batch, float *dout, float *dx);

#endif
