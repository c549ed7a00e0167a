/* One element of a buffer of any dtype as a double: what a tool or a test
 * needs to fill and check collectives' buffers (the 16-bit float formats
 * through core/half.h's conversions).
 *
 * Threads: pure functions; any thread. */
#include <math.h>

#include "core/core.h"
#include "core/half.h"

double tide_element_get(const void *buf, tide_dtype_t dtype, size_t i) {
  if (buf == NULL) return NAN;
  switch (dtype) {
    case TIDE_F32: return ((const float *)buf)[i];
    case TIDE_F64: return ((const double *)buf)[i];
    case TIDE_I32: return ((const int32_t *)buf)[i];
    case TIDE_I64: return (double)((const int64_t *)buf)[i];
    case TIDE_F16: return tide__f16_to_f32(((const uint16_t *)buf)[i]);
    case TIDE_BF16: return tide__bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return NAN;
  }
}

int tide_element_set(void *buf, tide_dtype_t dtype, size_t i, double value) {
  if (buf == NULL) return tide__null_arg("tide_element_set", "buf");
  switch (dtype) {
    case TIDE_F32: ((float *)buf)[i] = (float)value; return 0;
    case TIDE_F64: ((double *)buf)[i] = value; return 0;
    case TIDE_I32: ((int32_t *)buf)[i] = (int32_t)value; return 0;
    case TIDE_I64: ((int64_t *)buf)[i] = (int64_t)value; return 0;
    case TIDE_F16: ((uint16_t *)buf)[i] = tide__f32_to_f16((float)value); return 0;
    case TIDE_BF16: ((uint16_t *)buf)[i] = tide__f32_to_bf16((float)value); return 0;
    default:
      TIDE_ERROR("tide_element_set: dtype %d is not a TIDE_* dtype", (int)dtype);
      return TIDE_EINVAL;
  }
}
