// update_rules.h — the per-element update rules' scalars, shared by the
// optimizer's CPU loops (engine/train/optimizer.cpp) and its CUDA kernels
// (cuda/cuda_ops.cu), so both devices apply the same float32 constants.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ddp {

// torch.optim.AdamW's per-step constants (_single_tensor_adamw, PyTorch
// 1.13), each computed in double and rounded once to float32 as a Python
// float is when PyTorch applies it to a float32 tensor. Per element:
//   w *= decay;  m = m*b1 + one_minus_b1*g;  v = v*b2 + one_minus_b2*g*g;
//   denom = sqrt(v) / bias2_sqrt + eps;  w = w + (-step_size) * m / denom
// each operation rounded on its own (no fused multiply-add).
struct AdamScalars {
  float decay;
  float b1;
  float one_minus_b1;
  float b2;
  float one_minus_b2;
  float bias2_sqrt;
  float eps;
  float step_size;
};

// A gradient's squared L2 norm is summed in float64 in kSquareLanes fixed
// lanes: element i goes to lane i % kSquareLanes, each lane adds in element
// order, then the lanes are added in lane order. Each square of a float32 is
// exact in float64, so the sum has the same bits on every machine, whether
// or not the compiler vectorises or fuses, and wherever it is taken
// (sum_squares_while below: sum_of_squares, the AdamW update's). A build
// that would reorder the lanes stops here.
#if defined(__FAST_MATH__) || defined(__ASSOCIATIVE_MATH__)
#error "built with -ffast-math or -fassociative-math: the lanes of a sum of squares would be reordered"
#endif
constexpr size_t kSquareLanes = 16;

// Calls each(k) for k = 0 .. n-1 in order and returns the sum of g[k]² in
// those lanes: the one loop of every such sum, so that a pass that reads g
// anyway (the AdamW update) measures it bit for bit as a pass of its own
// (sum_of_squares) does.
template <class Each>
inline double sum_squares_while(const float* g, size_t n, Each&& each) {
  double lane[kSquareLanes] = {};
  size_t i = 0;
  for (; i + kSquareLanes <= n; i += kSquareLanes)
    for (size_t k = 0; k < kSquareLanes; ++k) {
      each(i + k);
      lane[k] += double(g[i + k]) * double(g[i + k]);
    }
  for (size_t k = 0; i + k < n; ++k) {
    each(i + k);
    lane[k] += double(g[i + k]) * double(g[i + k]);
  }
  double sum = 0;
  for (double l : lane) sum += l;
  return sum;
}

// The sum of x[i]² over i < n in float64, in the fixed lanes above: the
// same bits on every machine (OpenBLAS's dsdot sums in an order of its
// kernel's choosing). Pure.
double sum_of_squares(const float* x, size_t n);

// The constants for step `step` (1-based) with these hyper-parameters.
AdamScalars adamw_scalars(double lr, double weight_decay, double beta1, double beta2, double eps, int64_t step);

}  // namespace ddp
