// compute.h — the device work behind ddp_host's compute entries (gemm, dot,
// norm, axpy, normalize; ABI 1.9), which lend a strategy (a gradient
// compressor) the engine's BLAS: OpenBLAS on the CPU, cuBLAS and the kernels
// of cuda/cuda_compute.cu on CUDA. It lives here because models/ is where
// the engine reaches BLAS; engine/host validates the arguments
// (host_compute.cpp) and calls these with arguments already checked.
//
// Every operation is enqueued on the stream it is given, in order with the
// rest of that stream's work: on the CPU a task (inline on the compute
// stream, on the executor thread for the comm stream); on CUDA kernels and
// cuBLAS on the stream's cudaStream_t. Pointers are memory of that device.
//
// Determinism: the same inputs give the same bits, run after run and rank
// after rank. dot, norm and normalize reduce in float64 in one fixed order
// that depends on the length alone, the same on both devices (kComputeLanes
// below), and the elementwise arithmetic is written the same way on both
// (no FMA contraction: compute.cpp is built with -ffp-contract=off), so the
// CPU and a GPU give the same bits for those four. gemm is OpenBLAS's or
// cuBLAS's (deterministic for one library build, thread count and GPU
// model; not equal between them).
//
// Not here: argument checks (engine/host/host_compute.cpp refuses what
// these would misread), dtypes other than float32, and any wait: nothing
// returns a value to the host.
#pragma once

#include <cstddef>
#include <memory>

#include <ddp/plugin.h>

namespace ddp {

class Stream;

// The order of every float64 reduction here, on both devices: lane l (of
// kComputeLanes) sums elements l, l + kComputeLanes, l + 2 kComputeLanes, ...
// in that order from 0.0; then lanes l and l + h are added for h =
// kComputeLanes / 2, kComputeLanes / 4, ..., 1 (a tree; lane 0 holds the
// sum). On CUDA a lane is a thread of one block per vector. A power of two.
constexpr size_t kComputeLanes = 256;

// Element j of vector i of `v`: v.ptr[i * v.stride + j * v.inc].
class Compute {
 public:
  virtual ~Compute() = default;
  // For b < g.batch: C_b = alpha op(A_b) op(B_b) + beta C_b, row-major
  // (ddp_gemm in ddp/abi/values.h); alpha and beta are rounded to float.
  // beta 0 overwrites C, NaN included.
  virtual void gemm(const ddp_gemm& g, Stream& stream) = 0;
  // out[i] = float(sum_j x_ij y_ij), the sum in float64 (the order above).
  virtual void dot(const ddp_vectors& x, const ddp_vectors& y, float* out, Stream& stream) = 0;
  // out[i] = float(sqrt(sum_j x_ij^2)), as dot.
  virtual void norm(const ddp_vectors& x, float* out, Stream& stream) = 0;
  // y_ij = float(y_ij + (alpha s_i) x_ij) in float64, each operation rounded
  // on its own, s_i = scalars[i] (read when the work runs) or 1 if null.
  virtual void axpy(double alpha, const ddp_vectors& x, const float* scalars, const ddp_vectors& y, Stream& stream) = 0;
  // x_ij = x_ij / (norm_i + eps) in float32, norm_i as norm gives it and
  // eps rounded to float (torch's `col /= col.norm() + eps`: a zero vector
  // with eps 0 becomes NaN).
  virtual void normalize(const ddp_vectors& x, double eps, Stream& stream) = 0;
};

// The CPU's: OpenBLAS and the loops of compute.cpp, as tasks on the stream.
std::unique_ptr<Compute> make_cpu_compute();

// The compute of a device of `kind`. A CUDA one works on the device current
// on the calling thread, with cuBLAS handles it makes on first use per
// stream. Throws Error for CUDA in a build without it.
std::unique_ptr<Compute> make_compute(ddp_device_kind kind);

}  // namespace ddp
