// mesh.h — accounting for layouts the engine does not run (yet): FSDP
// (ZeRO-3) over X devices times tensor parallelism over Y, with a precision
// per class of tensor, on described hardware. Memory per device, the
// smallest FSDP degree that fits, and when a Transformer's FFN blocks are
// compute-bound, by the cost model of the TPU Scaling Book, part 5
// ("How to Parallelize a Transformer for Training", Austin et al., 2025):
// per block's forward, with a batch of B tokens over N = X Y devices, m
// weight matrices of D x F per block (2: the assignment's FFN; SwiGLU 3)
// and collectives moving `comm` bytes per element,
//   T_math = 2 m B D F / (N C)
//   T_FSDP = m comm D F / (Y W M_X)   (all-gather the weights over X)
//   T_TP   = 2 comm B D / (X W M_Y)   (all-gather in, reduce-scatter out over Y)
// so, with alpha = C / W: FSDP is compute-bound when the per-device batch
// B / N >= comm alpha / (2 Y M_X), and TP when Y <= m M_Y F / (comm alpha),
// whatever the batch. The two axes use different links: the step is
// compute-bound when both are. docs/plan.md derives them.
//
// Memory per device follows CS336's communication_accounting (b): the
// states over X Y; of the activations A of the batch (what one device
// would hold), a fraction f sharded over X, the rest on every device:
// A (1 - f) + A f / X.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {
namespace plan {

// Bytes per element of each class of tensor.
struct Precisions {
  double master = 4;       // master weights (fp32)
  double gradients = 4;    // accumulated gradients (fp32)
  double optimizer = 8;    // optimizer state (AdamW: two fp32 moments)
  double activations = 2;  // activations kept for backward (bf16)
  double comm = 2;         // what collectives move (bf16)
};

struct Hardware {
  std::string name;
  double memory_bytes = 0;      // per device
  double link_bytes_per_s = 0;  // W: one device's link bandwidth along a mesh axis
  double flops = 0;             // C: per device
  int axes_x = 1;               // M_X: mesh axes (links) the X dimension spans
  int axes_y = 1;               // M_Y: mesh axes (links) the Y dimension spans
};

// "h100-80gb", "tpu-v5p", in that order.
const std::vector<Hardware>& hardware_presets();
// The preset of that name; throws std::invalid_argument listing them.
Hardware hardware_preset(const std::string& name);

struct MeshInput {
  double params = 0;                    // P
  double saved_elements_per_token = 0;  // activations backward keeps, per token
  double d_model = 0;                   // D (of the FFN blocks)
  double d_ff = 0;                      // F (of the FFN blocks)
  int ffn_matrices = 2;                 // m
  double tokens = 0;                    // B: the batch, in tokens
  int64_t x = 1;                        // FSDP degree
  int64_t y = 1;                        // TP degree
  double activation_shard = 0.5;        // fraction of the activations sharded over X
  Precisions precision;
  Hardware hardware;
};

struct MeshPlan {
  // Bytes per device.
  double master = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double total = 0;
  double devices_of_memory = 0;  // total x N / the hardware's memory: devices' worth
  int64_t min_x_to_fit = 0;      // smallest FSDP degree (this Y) within memory; 0: none does
  double alpha = 0;              // C / W
  double t_math = 0;             // seconds per block's forward at this batch
  double t_fsdp = 0;
  double t_tp = 0;
  double fsdp_min_tokens_per_device = 0;  // B / N from which FSDP is compute-bound
  double tp_max_y = 0;                    // the largest Y at which TP is compute-bound
  bool tp_compute_bound = false;
  bool compute_bound = false;  // at this batch, both axes
};

// Throws std::invalid_argument for degrees below 1 (or X Y above 2^40),
// hardware figures or precisions that are not finite numbers > 0, mesh
// axes below 1, a negative or non-finite batch, or a shard fraction
// outside [0, 1].
MeshPlan plan_mesh(const MeshInput& in);

}  // namespace plan
}  // namespace ddp
