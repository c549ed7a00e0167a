/* Elementwise reduction kernels used while receiving (RECV_REDUCE) and by
 * the algorithms. Plain loops the compiler vectorises; f16 and bf16 go
 * through f32 with round-to-nearest-even. */
#include <math.h>
#include <string.h>

#include "core/half.h"
#include "transport/transport.h"

#define LOOP(T, EXPR)                          \
  do {                                         \
    T *d = dst;                                \
    const T *x = a, *y = b;                    \
    for (size_t i = 0; i < n; i++) d[i] = EXPR; \
  } while (0)

#define TYPED(T)                                              \
  switch (op) {                                               \
    case TIDE_SUM:                                            \
    case TIDE_AVG:                                            \
      LOOP(T, x[i] + y[i]);                                   \
      break;                                                  \
    case TIDE_MIN:                                            \
      LOOP(T, x[i] < y[i] ? x[i] : y[i]);                     \
      break;                                                  \
    case TIDE_MAX:                                            \
      LOOP(T, x[i] > y[i] ? x[i] : y[i]);                     \
      break;                                                  \
    default:                                                  \
      break;                                                  \
  }

static void reduce_half(uint16_t *d, const uint16_t *x, const uint16_t *y, size_t n, int bf,
                        tide_op_t op) {
  for (size_t i = 0; i < n; i++) {
    float u = bf ? tide__bf16_to_f32(x[i]) : tide__f16_to_f32(x[i]);
    float v = bf ? tide__bf16_to_f32(y[i]) : tide__f16_to_f32(y[i]);
    float r = op == TIDE_MIN ? (u < v ? u : v) : op == TIDE_MAX ? (u > v ? u : v) : u + v;
    d[i] = bf ? tide__f32_to_bf16(r) : tide__f32_to_f16(r);
  }
}

void tide__reduce(void *dst, const void *a, const void *b, size_t n, tide_dtype_t dtype,
                  tide_op_t op) {
  switch (dtype) {
    case TIDE_F32:
      TYPED(float);
      break;
    case TIDE_F64:
      TYPED(double);
      break;
    case TIDE_I32:
      TYPED(int32_t);
      break;
    case TIDE_I64:
      TYPED(int64_t);
      break;
    case TIDE_F16:
      reduce_half(dst, a, b, n, 0, op);
      break;
    case TIDE_BF16:
      reduce_half(dst, a, b, n, 1, op);
      break;
    default:
      break;
  }
}

void tide__scale(void *buf, size_t n, tide_dtype_t dtype, int divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case TIDE_F32: {
      float *p = buf, s = 1.0f / (float)divisor;
      for (size_t i = 0; i < n; i++) p[i] *= s;
      break;
    }
    case TIDE_F64: {
      double *p = buf, s = 1.0 / divisor;
      for (size_t i = 0; i < n; i++) p[i] *= s;
      break;
    }
    case TIDE_I32: {
      int32_t *p = buf;
      for (size_t i = 0; i < n; i++) p[i] /= divisor;
      break;
    }
    case TIDE_I64: {
      int64_t *p = buf;
      for (size_t i = 0; i < n; i++) p[i] /= divisor;
      break;
    }
    case TIDE_F16:
    case TIDE_BF16: {
      uint16_t *p = buf;
      int bf = dtype == TIDE_BF16;
      for (size_t i = 0; i < n; i++) {
        float v = (bf ? tide__bf16_to_f32(p[i]) : tide__f16_to_f32(p[i])) / (float)divisor;
        p[i] = bf ? tide__f32_to_bf16(v) : tide__f32_to_f16(v);
      }
      break;
    }
    default:
      break;
  }
}

size_t tide_dtype_size(tide_dtype_t dtype) {
  static const size_t sizes[] = {4, 8, 4, 8, 2, 2};
  return (unsigned)dtype < TIDE_DTYPE_COUNT ? sizes[dtype] : 0;
}

const char *tide_dtype_name(tide_dtype_t dtype) {
  static const char *names[] = {"f32", "f64", "i32", "i64", "f16", "bf16"};
  return (unsigned)dtype < TIDE_DTYPE_COUNT ? names[dtype] : "?";
}

const char *tide_op_name(tide_op_t op) {
  static const char *names[] = {"sum", "avg", "min", "max"};
  return (unsigned)op < TIDE_OP_COUNT ? names[op] : "?";
}
