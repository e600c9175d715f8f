// strategy_util.h — what the in-tree strategies (naive, flat, overlap,
// bucketed, sharded) would otherwise each write again: the host, the transport and
// the two events that order work between the training thread, the compute
// stream and the comm stream; the start-of-run broadcast; the float32 check;
// the run's [precision].
// Header-only, so a plugin stays one shared library that links nothing of
// the engine. Everything here throws ddp::plugin::Failure; the plugin's
// entries catch it with ddp::plugin::guard.
#pragma once

#include <ddp/plugin.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ddp {
namespace strategy {

// The keys of a strategy that reads none (ddp_strategy_v1_t::keys).
inline constexpr ddp_key kNoKeys[] = {{nullptr, nullptr, nullptr}};

// The run's [precision] (ABI 1.11): the fields both sides know (a newer
// engine's struct may be longer, an older one's shorter); float32 and no
// loss scaling from an engine older than 1.11.
inline ddp_precision run_precision(const ddp_host* host) {
  ddp_precision out{sizeof(ddp_precision), DDP_FLOAT32, DDP_FLOAT32, 0};
  const ddp_precision* given = DDP_HOST_HAS(host, precision) ? host->precision(host->ctx) : nullptr;
  if (!given) return out;
  std::memcpy(&out, given, std::min<size_t>(given->struct_size, sizeof out));
  out.struct_size = sizeof out;
  return out;
}

// The factor a step's gradients carry (ABI 1.12, ddp_step_info::loss_scale):
// the loss scale under loss scaling, else 1; 0 from an engine older than
// 1.12, which does not say it.
inline double step_loss_scale(const ddp_host* host, const ddp_step_info* info) {
  if (DDP_ABI_MINOR(host->abi_version) < 12 || info->struct_size < offsetof(ddp_step_info, loss_scale) + sizeof(double))
    return 0.0;
  return info->loss_scale;
}

// A string key's fallback that no value written in TOML is: the key unset.
inline constexpr const char* kUnset = "\x01unset";

// The state every strategy starts from; a plugin derives its
// ddp_strategy_s from it. Hooks run on the training thread only, so the
// events are never used from two threads at once.
struct StrategyBase {
  plugin::Host host;
  plugin::Comm comm;
  plugin::Event computed;  // recorded on compute: what compute made so far is final
  plugin::Event done;      // recorded on comm: what comm was given so far has run

  StrategyBase(const ddp_host* h, const ddp_transport_v1_t* transport, ddp_comm* c)
      : host(h), comm(transport, c), computed(h), done(h) {}

  // Makes the comm stream wait for everything enqueued on compute so far:
  // the ABI's rule before comm work reads what compute produced (a gradient,
  // a bucket slot). Non-blocking.
  void comm_after_compute() const {
    computed.record(host.compute_stream());
    computed.make_wait(host.comm_stream());
  }

  // Blocks the training thread until everything enqueued on the comm stream
  // so far has completed; a failed collective throws here with its text.
  void wait_comm() const {
    done.record(host.comm_stream());
    done.synchronize();
  }

  // on_train_begin: every rank takes rank 0's values of every parameter,
  // frozen ones included, one broadcast per parameter in table order.
  // Blocking.
  void broadcast_params_from_rank0() const {
    comm_after_compute();  // whatever initialised the weights is done
    for (size_t i = 0; i < host.param_count(); ++i) {
      const ddp_param& p = host.param(i);
      comm.broadcast(host.floats(p.data, float32_elements(p)), 0, host.comm_stream());
    }
    wait_comm();
  }

  // numel of a float32 parameter; anything else is refused by name (the
  // flat strategies pack gradients byte for byte as floats).
  static size_t float32_elements(const ddp_param& p) {
    if (p.dtype != DDP_FLOAT32)
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, std::string("parameter '") + p.name +
                                                     "' is not float32: only float32 parameters are supported");
    return p.numel;
  }
  static size_t float32_bytes(const ddp_param& p) { return float32_elements(p) * sizeof(float); }

  // Whether the gradients of the parameters `indices`, in that order, lie
  // back to back, each starting where the one before ends (the engine
  // packs the trainable ones so, in reverse parameter order:
  // Model::pack_gradients): then the first one's memory, which a strategy
  // averages where it lies instead of copying; else nullptr (also for
  // none). A fixed order gives every rank the same element layout.
  char* packed_grads(const std::vector<size_t>& indices) const {
    uintptr_t next = 0;
    for (size_t k = 0; k < indices.size(); ++k) {
      const ddp_param& p = host.param(indices[k]);
      const auto grad = reinterpret_cast<uintptr_t>(p.grad);
      if (grad == 0 || (k > 0 && grad != next)) return nullptr;
      next = grad + float32_bytes(p);
    }
    return indices.empty() ? nullptr : static_cast<char*>(host.param(indices.front()).grad);
  }
};

}  // namespace strategy
}  // namespace ddp
