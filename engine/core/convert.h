// convert.h — elementwise conversion between float32 and the 16-bit floats
// (bfloat16, float16), the host's `convert` entry: round to nearest even, as
// PyTorch's .to() (ddp/numeric.h has the scalar conversions). The CPU loop
// here; the CUDA device runs the same rounding as a kernel (cuda_ops.h).
#pragma once

#include <cstddef>
#include <string>

#include <ddp/plugin.h>

namespace ddp {

// Empty if dst_type <- src_type is a conversion the host offers (float32 to
// bfloat16 or float16, and back), else why not, in words.
std::string convert_refusal(ddp_dtype dst_type, ddp_dtype src_type);

// dst[i] = src[i] converted, for i < count; a conversion convert_refusal
// accepts (else throws Error). dst and src do not overlap.
void convert_cpu(void* dst, ddp_dtype dst_type, const void* src, ddp_dtype src_type, size_t count);

}  // namespace ddp
