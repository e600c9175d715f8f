// compute_load.cpp — compute_load.h over OpenBLAS's cblas_sgemm.
#include "compute_load.h"

#include <cblas.h>

#include <string>
#include <vector>

#include "error.h"

namespace ddp {

bool parse_load(const std::string& text) {
  if (text == "none") return false;
  if (text == "gemm") return true;
  throw Error("--load: unknown load '" + text + "' (none, or gemm: one core per rank busy with GEMMs)");
}

ComputeLoad::ComputeLoad(bool on) {
  if (!on) return;
  openblas_set_num_threads(1);  // one core: what a rank's backward holds with run.threads = 1
  thread_ = std::thread([this] { loop(); });
  while (!running_.load()) std::this_thread::yield();  // loaded from the first timed collective on
}

ComputeLoad::~ComputeLoad() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ComputeLoad::loop() {
  // C[m, n] = A[m, k] B[k, n] at lm-cpu's FFN shape: 1024 tokens, d_model
  // 256, d_ff 1024 (0.5 GFLOP, a few ms: the stop flag is seen soon).
  constexpr int m = 1024;
  constexpr int k = 256;
  constexpr int n = 1024;
  std::vector<float> a(size_t(m) * k, 0.5f);
  std::vector<float> b(size_t(k) * n, 0.25f);
  std::vector<float> c(size_t(m) * n);
  running_ = true;
  while (!stop_.load()) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  }
}

}  // namespace ddp
