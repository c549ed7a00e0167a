/* IEEE half (f16) and bfloat16 <-> float conversions, round to nearest
 * even, NaN kept a (quiet) NaN: the one implementation the reduction kernels
 * and the tools share. */
#ifndef TIDE_HALF_H
#define TIDE_HALF_H

#include <stdint.h>
#include <string.h>

static inline float tide__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else { /* subnormal: normalise */
    int e = -1;
    do {
      e++;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t tide__f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));
  if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds to inf */
  if (absx < 0x38800000) { /* subnormal or zero in f16 */
    if (absx < 0x33000000) return (uint16_t)sign;
    uint32_t mant = (absx & 0x7fffff) | 0x800000;
    int shift = 126 - (int)(absx >> 23); /* value = q * 2^-24 */
    uint32_t q = mant >> shift, r = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (r > mid || (r == mid && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t bits = absx - 0x38000000; /* rebias exponent 127 -> 15 */
  uint32_t q = bits >> 13, r = bits & 0x1fff;
  if (r > 0x1000 || (r == 0x1000 && (q & 1))) q++;
  return (uint16_t)(sign | q);
}

static inline float tide__bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t tide__f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

#endif
