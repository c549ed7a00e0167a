/* The model engine (include/tide_nn.h) on its own: an MLP learns to tell
 * two synthetic patterns apart with plain SGD on its flat parameter buffer.
 * Uses only the public headers and libtide (pkg-config --libs tide); exits
 * 1 unless the loss falls below a tenth of its start and every test image
 * is classified right. */
#include <stdio.h>
#include <stdlib.h>

#include "tide_nn.h"

enum { BATCH = 16, STEPS = 60 };

/* Class c's image: bright top half (c = 0) or bottom half (c = 1), with a
 * little deterministic noise. */
static void make_batch(float *x, int32_t *labels, int n, unsigned *seed) {
  for (int b = 0; b < n; b++) {
    int c = b % 2;
    labels[b] = c;
    for (int p = 0; p < NN_IMAGE_SIZE; p++) {
      int top = p < NN_IMAGE_SIZE / 2;
      *seed = *seed * 1103515245u + 12345u;
      x[(size_t)b * NN_IMAGE_SIZE + p] = (top == (c == 0) ? 1.0f : 0.0f) + 0.1f * (float)(*seed >> 16 & 255) / 255.0f;
    }
  }
}

int main(void) {
  nn_model_t *m = NULL;
  int rc = nn_model_create("mlp", BATCH, 42, &m);
  if (rc != 0) {
    fprintf(stderr, "nn_model_create: %s\n", tide_strerror(rc));
    return 1;
  }
  float *x = malloc((size_t)BATCH * NN_IMAGE_SIZE * sizeof *x);
  int32_t labels[BATCH];
  unsigned seed = 7;
  float first = 0, loss = 0;
  size_t n = nn_param_count(m);
  for (int step = 0; step < STEPS && rc == 0 && x != NULL; step++) {
    make_batch(x, labels, BATCH, &seed);
    rc = nn_forward_backward(m, x, labels, BATCH, &loss);
    float *w = nn_params(m);
    const float *g = nn_grads(m);
    for (size_t i = 0; i < n; i++) w[i] -= 0.05f * g[i];
    if (step == 0) first = loss;
  }
  int correct = 0;
  if (rc == 0 && x != NULL) {
    make_batch(x, labels, BATCH, &seed);
    rc = nn_evaluate(m, x, labels, BATCH, NULL, &correct);
  }
  printf("nn_minimal: %s, %zu parameters, loss %.4f -> %.4f, %d of %d right (%s)\n", nn_model_arch(m), n,
         (double)first, (double)loss, correct, BATCH, nn_blas_info());
  nn_model_destroy(m);
  free(x);
  return rc == 0 && x != NULL && loss < 0.1f * first && correct == BATCH ? 0 : 1;
}
