// gemm_floor.h — the GEMM-only floor of a step (`ddp gemm-floor CONFIG`,
// tools/bench_gemm_floor.py): the GEMMs one rank's forward and backward
// run, recorded from the config's model on the CPU at its rows per rank
// (layers::record_gemms: same shapes, transposes and order), then run
// again alone on the model's own buffers (layers::replay_gemms), the
// median of `repeats`, on run.threads BLAS threads as the ranks. What no
// change around the GEMMs can beat with this BLAS kernel. The replays
// write into the model's activations and gradients (scores where the
// softmax left probabilities, gradients added to again): the model is
// only measured, never trained or read afterwards, and it outlives them.
#pragma once

#include <nlohmann/json.hpp>

#include "config.h"

namespace ddp {

// {"forward_s", "backward_s", "gemms": {"forward", "backward"}, "gflop":
//  {"forward", "backward"}, "kernel"}. Throws Error for a config whose
// model cannot be built on the CPU.
nlohmann::json gemm_floor(const Config& config, int repeats);

}  // namespace ddp
