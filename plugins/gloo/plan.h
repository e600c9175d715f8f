// plan.h — the gloo transport's plan entry (ABI 1.4, ddp/abi/plan.h): on a
// CPU run it holds one buffer of its own, reduce_scatter's scratch, grown
// on demand to (N - 1) receive buffers of the largest reduce-scatter of
// the step, made on the first: one per communicator (N its group's size). (On a CUDA run it stages every buffer
// through page-locked host memory, per stream, which it does not plan.)
#pragma once

#include <ddp/plugin.hpp>

#include <algorithm>
#include <map>

namespace ddp {
namespace gloo_transport {

inline ddp_status plan(const ddp_host* host, ddp_plan* out) {
  return plugin::guard(host, [&] {
    const plugin::Plan plan(out);
    const plugin::Host h(host);
    for (const char* key : {"hostname", "interface", "algorithm"})
      (void)h.config_string(key, "");  // as init reads them
    if (host->device != DDP_DEVICE_CPU)
      throw plugin::Failure(DDP_ERR_UNSUPPORTED,
                            "gloo on a GPU stages through host memory, which `ddp plan` does "
                            "not count: plan GPU runs with transport nccl");
    // Each communicator (the world, a group: ABI 1.9) keeps its own
    // scratch: the largest reduce-scatter of each group size, one group
    // of each size (as a strategy's groups are: HSDP's shard groups).
    const int32_t* sizes = DDP_PLAN_HAS(out, group_sizes) ? out->group_sizes : nullptr;
    std::map<size_t, size_t> scratch;  // group size → bytes
    for (size_t k = 0; k < out->collective_count; ++k) {
      const ddp_plan_collective& c = out->collectives[k];
      const size_t n = size_t(sizes ? sizes[k] : host->world_size);
      if (c.op == DDP_OP_REDUCE_SCATTER)
        scratch[n] = std::max(scratch[n], (n - 1) * (c.count / n) * ddp_dtype_size(c.dtype));
    }
    for (const auto& [n, bytes] : scratch) plan.buffer(DDP_MEM_COMM_BUFFERS, bytes, DDP_PLAN_STEP);
  });
}

}  // namespace gloo_transport
}  // namespace ddp
