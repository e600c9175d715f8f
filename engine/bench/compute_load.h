// compute_load.h — `ddp bench-comm --load gemm`: a thread that keeps one
// core of each rank busy with single-threaded GEMMs (OpenBLAS, lm-cpu's FFN
// shape) while the rank times its collectives. A strategy that overlaps its
// collectives with backward runs them beside the rank's compute; on a CPU
// whose cores all compute, the transport gets what the GEMMs leave it, and
// a collective takes longer than on idle cores. `ddp plan --bench-busy`
// prices those collectives with the fit measured this way.
#pragma once

#include <atomic>
#include <string>
#include <thread>

namespace ddp {

// "none" | "gemm"; anything else: Error naming the choices.
bool parse_load(const std::string& text);

class ComputeLoad {
 public:
  // Starts the thread when `on` and returns once it is inside its first
  // GEMM; otherwise does nothing.
  explicit ComputeLoad(bool on);
  // Stops the thread after its current GEMM and joins it.
  ~ComputeLoad();
  ComputeLoad(const ComputeLoad&) = delete;
  ComputeLoad& operator=(const ComputeLoad&) = delete;

 private:
  void loop();

  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};
  std::thread thread_;
};

}  // namespace ddp
