// plan_command.h — `ddp plan CONFIG`: run_plan.h and mesh.h for a config,
// read as `ddp run` reads it, printed as tables or as JSON (--json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct PlanOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set section.key=value
  bool json = false;
  std::string bench_file;        // a bench_comm.json: its all_reduce fit at the run's world size
  std::vector<double> overhead;  // {o in µs, w in GB/s}, instead of bench_file
  std::string bench_busy_file;   // a bench_comm.json of --load gemm: prices collectives beside compute
  std::vector<int64_t> mesh;     // {X, Y}: FSDP x TP, for the mesh accounting
  std::string hardware = "h100-80gb";
  std::vector<std::string> hardware_set;  // KEY=VALUE: memory, bandwidth, flops (overriding the preset's)
  std::vector<int> axes;                  // {M_X, M_Y}; default: the hardware's
  double tokens = 0;                      // per device, for the mesh's activations and compute
  double activation_shard = 0.5;          // fraction of activations sharded over X
  std::vector<std::string> precision;     // class=bytes: master, gradients, optimizer, activations, comm
};

// Prints the plan on stdout; throws Error (ConfigError naming the file and
// key) for what it cannot plan.
void plan_command(const PlanOptions& options);

}  // namespace ddp
