// dtypes.h — the element types of the `gloo` transport: what each ddp_dtype
// is to Gloo's templated algorithms (with_type), and the 16-bit floats Gloo
// cannot add. Header-only, included by gloo_transport.cpp alone.
#pragma once

#include <ddp/numeric.h>
#include <ddp/plugin.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

namespace ddp_gloo {

// The 16-bit floats, which Gloo cannot add: each sum is taken in float32
// and rounded back (ddp/numeric.h), as PyTorch's ProcessGroupGloo does for
// float16. Gloo's algorithms see them as elements of 2 bytes with a `+`.
template <uint16_t (*FromFloat)(float), float (*ToFloat)(uint16_t)>
struct Float16Bits {
  uint16_t bits;
  friend Float16Bits operator+(Float16Bits a, Float16Bits b) { return {FromFloat(ToFloat(a.bits) + ToFloat(b.bits))}; }
  Float16Bits divided_by(int n) const { return {FromFloat(ToFloat(bits) / static_cast<float>(n))}; }
};
using Bf16 = Float16Bits<ddp_float_to_bf16, ddp_bf16_to_float>;
using Fp16 = Float16Bits<ddp_float_to_fp16, ddp_fp16_to_float>;

// Calls f(T*) with the buffer typed by its dtype.
template <typename F>
inline void with_type(ddp_dtype dtype, F&& f) {
  switch (dtype) {
    case DDP_FLOAT32: f(static_cast<float*>(nullptr)); return;
    case DDP_FLOAT64: f(static_cast<double*>(nullptr)); return;
    case DDP_INT32: f(static_cast<int32_t*>(nullptr)); return;
    case DDP_INT64: f(static_cast<int64_t*>(nullptr)); return;
    case DDP_BFLOAT16: f(static_cast<Bf16*>(nullptr)); return;
    case DDP_FLOAT16: f(static_cast<Fp16*>(nullptr)); return;
    default: throw std::runtime_error("unsupported dtype");
  }
}

constexpr uint64_t kDtypes = DDP_DTYPE_BIT(DDP_FLOAT32) | DDP_DTYPE_BIT(DDP_FLOAT64) | DDP_DTYPE_BIT(DDP_INT32) |
                             DDP_DTYPE_BIT(DDP_INT64) | DDP_DTYPE_BIT(DDP_BFLOAT16) | DDP_DTYPE_BIT(DDP_FLOAT16);
// (Through int: a value from a plugin may be outside the enum's range.)
inline bool gloo_supports(ddp_dtype dtype) {
  const int d = static_cast<int>(dtype);
  return d >= 0 && d < 64 && (kDtypes & DDP_DTYPE_BIT(dtype));
}

// AVG after the sum: each element divided by the world size.
template <typename T>
void divide(T* ptr, size_t count, int world) {
  if constexpr (std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>)
    for (size_t i = 0; i < count; ++i) ptr[i] = ptr[i].divided_by(world);
  else
    for (size_t i = 0; i < count; ++i) ptr[i] = static_cast<T>(ptr[i] / static_cast<T>(world));
}

}  // namespace ddp_gloo
