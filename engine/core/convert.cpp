// convert.cpp — see convert.h.
#include "convert.h"

#include <cstdint>

#include <ddp/numeric.h>

#include "error.h"

namespace ddp {

std::string convert_refusal(ddp_dtype dst_type, ddp_dtype src_type) {
  const auto half = [](ddp_dtype t) { return t == DDP_BFLOAT16 || t == DDP_FLOAT16; };
  if ((dst_type == DDP_FLOAT32 && half(src_type)) || (half(dst_type) && src_type == DDP_FLOAT32)) return "";
  return std::string("no conversion from ") + ddp_dtype_name(src_type) + " to " + ddp_dtype_name(dst_type) +
         " (the host converts float32 to bfloat16 or float16, and back)";
}

void convert_cpu(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count) {
  if (std::string why = convert_refusal(dst_type, src_type); !why.empty()) throw Error(why, DDP_ERR_UNSUPPORTED);
  if (src_type == DDP_FLOAT32) {
    const float* in = static_cast<const float*>(src);
    uint16_t* out = static_cast<uint16_t*>(dst);
    if (dst_type == DDP_BFLOAT16)
      for (size_t i = 0; i < count; ++i) out[i] = ddp_float_to_bf16(in[i]);
    else
      for (size_t i = 0; i < count; ++i) out[i] = ddp_float_to_fp16(in[i]);
    return;
  }
  const uint16_t* in = static_cast<const uint16_t*>(src);
  float* out = static_cast<float*>(dst);
  if (src_type == DDP_BFLOAT16)
    for (size_t i = 0; i < count; ++i) out[i] = ddp_bf16_to_float(in[i]);
  else
    for (size_t i = 0; i < count; ++i) out[i] = ddp_fp16_to_float(in[i]);
}

}  // namespace ddp
