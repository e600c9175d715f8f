// gemm.h — the one GEMM the layers run (cblas_sgemm, row-major), with its
// inputs in the model's compute dtype, and the recording of those GEMMs for
// the GEMM-only floor (`ddp gemm-floor`). (What this process's OpenBLAS
// is: blas_info.h.)
//
// Mixed precision on the CPU is emulated here: with inputs of dtype
// bfloat16 or float16, C = alpha A B + beta C runs as
// alpha r(A) r(B) + beta C, where r rounds each element to that dtype (to
// nearest, ties to even, as the hardware and PyTorch's .to() do) and back,
// and the product, its sum and C stay float32 (OpenBLAS's sgemm). That is
// what a GPU's bf16 tensor cores compute with a float32 accumulator, and
// what tools/torch_models.py's rounded matmul does: docs/precision.md.
// The rounded copies live in two buffers of the calling thread's, grown to
// the largest operands a GEMM has had (the lm head's: [N, V] and [V, D]
// floats) and kept: host memory that summary.json's peak_bytes and
// `ddp plan` do not count.
#pragma once

#include <cstdint>
#include <vector>

#include <ddp/plugin.h>

namespace ddp {

// A GEMM's input operand: float32 values, which a GEMM with 16-bit inputs
// rounds to its dtype first, or values already in that dtype (bfloat16 or
// float16: an activation backward keeps, model.h), read as they are. Both
// give the same product, bit for bit (rounding a rounded value changes
// nothing); the second spares the pass that rounds them again, on a GPU a
// read and a write of the operand per GEMM. A float32 pointer is one.
struct GemmInput {
  GemmInput(const float* values) : data(values) {}  // NOLINT(google-explicit-constructor): float32 as it is
  GemmInput(const void* values, ddp_dtype type) : data(values), dtype(type) {}
  const void* data = nullptr;
  ddp_dtype dtype = DDP_FLOAT32;
};

// Throws Error unless `x` is float32 or in `inputs`, the GEMM's 16-bit
// input dtype (a 16-bit operand is never converted to another).
void check_gemm_input(const GemmInput& x, ddp_dtype inputs);

namespace layers {

// x rounded to `dtype` (float32, bfloat16 or float16; the 16-bit ones to
// nearest even, overflowing to infinity, NaN kept) and back to float32.
float round_to(ddp_dtype dtype, float x);

// C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, row-major, A and B
// rounded to `inputs` first (as above; float32: as they are; an operand
// already in `inputs` widened, exactly). op is the transpose where
// trans_* is set; lda, ldb, ldc the row strides as stored. Throws Error
// for an operand check_gemm_input refuses.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, GemmInput a, int64_t lda,
          GemmInput b, int64_t ldb, float beta, float* c, int64_t ldc, ddp_dtype inputs);

// One GEMM the layers ran: enough to run it again, on the same operands
// (float32 ones: a replay multiplies what it was given, unrounded; a
// 16-bit one is null in a or b and its memory in packed_a or packed_b, and
// the replay reads a float32 stand-in of its span instead, one per memory,
// so that the replay meets as many distinct operands as the step did).
struct GemmCall {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  int64_t lda = 0;
  int64_t ldb = 0;
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  const void* packed_a = nullptr;
  const void* packed_b = nullptr;
};
// While `calls` is set (this thread), every GEMM the layers run is also
// appended to it; null stops. For the GEMM-only floor (`ddp gemm-floor`).
void record_gemms(std::vector<GemmCall>* calls);
// Runs the calls again, in order, on the buffers they were recorded with
// (which must still be alive, unmoved: the model's own weights,
// activations and gradients, so the GEMMs meet memory and caches as in the
// step, and the CPU kernels' staging of a 16-bit compute, which a step
// before the recorded one has grown to its size; outputs are overwritten,
// accumulations added to again); returns the seconds.
double replay_gemms(const std::vector<GemmCall>& calls);

}  // namespace layers
}  // namespace ddp
