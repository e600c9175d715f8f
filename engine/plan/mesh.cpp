// mesh.cpp — the formulas of mesh.h.
#include "mesh.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace ddp {
namespace plan {

const std::vector<Hardware>& hardware_presets() {
  // H100 SXM 80 GB: dense BF16 989 TFLOP/s, NVLink 4 450 GB/s each way.
  // TPU v5p: 95 GB HBM; C = 4.6e14 and W_ici = 2 x 9e10 = 1.8e11 B/s (a
  // link's bidirectional bandwidth) as CS336's communication_accounting
  // gives them from the Scaling Book; its mesh M_X = 2, M_Y = 1.
  static const std::vector<Hardware> presets = {
      {"h100-80gb", 80e9, 4.5e11, 9.89e14, 1, 1},
      {"tpu-v5p", 95e9, 1.8e11, 4.6e14, 2, 1},
  };
  return presets;
}

Hardware hardware_preset(const std::string& name) {
  std::string known;
  for (const Hardware& h : hardware_presets()) {
    if (h.name == name) return h;
    known += (known.empty() ? "" : ", ") + h.name;
  }
  throw std::invalid_argument("unknown hardware '" + name + "' (known: " + known + ")");
}

namespace {

struct DeviceBytes {
  double master;
  double gradients;
  double optimizer;
  double activations;
  double total() const { return master + gradients + optimizer + activations; }
};

DeviceBytes bytes_per_device(const MeshInput& in, double x) {
  const double shards = x * static_cast<double>(in.y);  // weights and their state: over X and Y
  const double acts = in.tokens * in.saved_elements_per_token * in.precision.activations;
  return {in.params * in.precision.master / shards, in.params * in.precision.gradients / shards,
          in.params * in.precision.optimizer / shards,
          acts * (1.0 - in.activation_shard) + acts * in.activation_shard / x};
}

}  // namespace

namespace {

bool positive(double v) { return v > 0 && std::isfinite(v); }

void check(const MeshInput& in) {
  const Hardware& hw = in.hardware;
  if (in.x < 1 || in.y < 1 || double(in.x) * double(in.y) > double(int64_t{1} << 40))
    throw std::invalid_argument("mesh: FSDP and TP degrees must be at least 1 (and X Y at most 2^40)");
  if (!positive(hw.link_bytes_per_s) || !positive(hw.flops) || !positive(hw.memory_bytes))
    throw std::invalid_argument("mesh: hardware '" + hw.name + "' needs memory, bandwidth and FLOP/s: finite, > 0");
  if (hw.axes_x < 1 || hw.axes_y < 1) throw std::invalid_argument("mesh: the axes M_X and M_Y must be at least 1");
  const Precisions& p = in.precision;
  for (const double bytes : {p.master, p.gradients, p.optimizer, p.activations, p.comm})
    if (!positive(bytes)) throw std::invalid_argument("mesh: bytes per element must be finite and > 0");
  if (!(in.tokens >= 0) || !std::isfinite(in.tokens)) throw std::invalid_argument("mesh: tokens must be finite, >= 0");
  if (!(in.activation_shard >= 0 && in.activation_shard <= 1))
    throw std::invalid_argument("mesh: the activation shard fraction must be in [0, 1]");
  if (in.ffn_matrices < 1) throw std::invalid_argument("mesh: a block needs at least one weight matrix");
}

}  // namespace

MeshPlan plan_mesh(const MeshInput& in) {
  const Hardware& hw = in.hardware;
  check(in);
  MeshPlan p;
  const DeviceBytes b = bytes_per_device(in, static_cast<double>(in.x));
  p.master = b.master;
  p.gradients = b.gradients;
  p.optimizer = b.optimizer;
  p.activations = b.activations;
  p.total = b.total();
  const double n = static_cast<double>(in.x) * static_cast<double>(in.y);
  p.devices_of_memory = p.total * n / hw.memory_bytes;
  // The total falls as X grows (to the unsharded activations): the first
  // X that fits, by doubling then bisecting.
  if (bytes_per_device(in, 1.0).total() <= hw.memory_bytes) {
    p.min_x_to_fit = 1;
  } else {
    int64_t hi = 1;
    while (hi < (int64_t{1} << 40) && bytes_per_device(in, static_cast<double>(hi)).total() > hw.memory_bytes) hi *= 2;
    if (bytes_per_device(in, static_cast<double>(hi)).total() <= hw.memory_bytes) {
      int64_t lo = hi / 2;  // does not fit
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (bytes_per_device(in, static_cast<double>(mid)).total() <= hw.memory_bytes ? hi : lo) = mid;
      }
      p.min_x_to_fit = hi;
    }
  }
  const double c = hw.flops;
  const double w = hw.link_bytes_per_s;
  const double d = in.d_model;
  const double f = in.d_ff;
  const double m = in.ffn_matrices;
  const double mx = hw.axes_x;
  const double my = hw.axes_y;
  const double y = static_cast<double>(in.y);
  const double x = static_cast<double>(in.x);
  const double tokens = in.tokens;
  const double comm = in.precision.comm;
  p.alpha = c / w;
  p.t_math = 2.0 * m * tokens * d * f / (n * c);
  p.t_fsdp = in.x > 1 ? m * comm * d * f / (y * w * mx) : 0.0;
  p.t_tp = in.y > 1 ? 2.0 * comm * tokens * d / (x * w * my) : 0.0;
  p.fsdp_min_tokens_per_device = in.x > 1 ? comm * p.alpha / (2.0 * y * mx) : 0.0;
  p.tp_max_y = m * my * f / (comm * p.alpha);
  p.tp_compute_bound = in.y == 1 || y <= p.tp_max_y;
  p.compute_bound = p.t_math >= p.t_fsdp && p.t_math >= p.t_tp && p.t_math > 0;
  // Sizes beyond a double (a batch of 1e308 tokens): no plan, rather than
  // "inf" bytes and bounds that contradict each other.
  for (const double v : {p.total, p.devices_of_memory, p.t_math, p.t_fsdp, p.t_tp}) {
    if (std::isfinite(v)) continue;
    std::ostringstream text;
    text << "mesh: the plan overflows a double at these sizes (" << in.params << " parameters, a batch of " << tokens
         << " tokens): give smaller ones";
    throw std::invalid_argument(text.str());
  }
  return p;
}

}  // namespace plan
}  // namespace ddp
