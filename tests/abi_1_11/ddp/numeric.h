/* ddp/numeric.h — header-only C99 helpers for the ABI's dtypes: their names,
 * and conversions between float32 and the two 16-bit floats (DDP_BFLOAT16,
 * DDP_FLOAT16), bit for bit as
 * PyTorch's CPU .to() does them for every number: round to nearest, ties to
 * even; a float too large for float16 becomes infinity. A NaN stays a NaN
 * (bfloat16 0x7fc0; PyTorch's bits for a NaN vary with its code path).
 * For plugins and the engine alike; no ABI (nothing here crosses it).
 *
 * The float16 pair is the branch-free method of Maratyszcza's FP16 library,
 * which c10::Half also uses: it relies on float arithmetic rounding to
 * nearest (the default), so do not build it with flush-to-zero or
 * -ffast-math. */
#ifndef DDP_NUMERIC_H
#define DDP_NUMERIC_H

#include <stdint.h>
#include <string.h>

#include <ddp/plugin.h>

/* "float32", "bfloat16", ...; "unknown" for a value plugin.h does not name. */
static inline const char* ddp_dtype_name(ddp_dtype dtype) {
  switch (dtype) {
    case DDP_FLOAT32: return "float32";
    case DDP_FLOAT64: return "float64";
    case DDP_INT32: return "int32";
    case DDP_INT64: return "int64";
    case DDP_BFLOAT16: return "bfloat16";
    case DDP_FLOAT16: return "float16";
  }
  return "unknown";
}

static inline uint32_t ddp_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float ddp_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline float ddp_bf16_to_float(uint16_t h) { return ddp_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t ddp_float_to_bf16(float f) {
  const uint32_t u = ddp_f32_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;       /* nearest, ties to even */
  const uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u); /* all ones for a NaN */
  return (uint16_t)((0x7fc0u & nan) | (rounded & ~nan));                 /* branch-free: loops vectorise */
}

static inline float ddp_fp16_to_float(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  /* normal: shift the exponent and mantissa into place and rebias by 2^-112 */
  const float normalized = ddp_f32_from_bits((two_w >> 4) + (0xe0u << 23)) * 0x1.0p-112f;
  /* subnormal: the mantissa as the low bits of 0.5's, minus 0.5 */
  const float denormalized = ddp_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t small = 0u - (uint32_t)(two_w < (1u << 27)); /* all ones for a subnormal */
  return ddp_f32_from_bits(sign | (ddp_f32_bits(denormalized) & small) | (ddp_f32_bits(normalized) & ~small));
}

static inline uint16_t ddp_float_to_fp16(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  const float abs_f = ddp_f32_from_bits(ddp_f32_bits(f) & 0x7fffffffu);
  float base = (abs_f * scale_to_inf) * scale_to_zero; /* overflow to infinity, keep small */
  const uint32_t w = ddp_f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  bias += (0x71000000u - bias) & (0u - (uint32_t)(bias < 0x71000000u)); /* at least 0x71000000 */
  base = ddp_f32_from_bits((bias >> 1) + 0x07800000u) + base;           /* the add rounds to 10 bits */
  const uint32_t bits = ddp_f32_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007c00u) + (bits & 0x00000fffu);
  const uint32_t nan = 0u - (uint32_t)(shl1_w > 0xff000000u);
  return (uint16_t)((sign >> 16) | (0x7e00u & nan) | (nonsign & ~nan));
}

#endif /* DDP_NUMERIC_H */
