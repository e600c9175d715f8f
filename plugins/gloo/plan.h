// plan.h — the gloo transport's plan entry (ABI 1.4, ddp/abi/plan.h): on a
// CPU run it holds one buffer of its own, reduce_scatter's scratch, grown
// on demand to (N - 1) receive buffers of the largest reduce-scatter of
// the step, made on the first. (On a CUDA run it stages every buffer
// through page-locked host memory, per stream, which it does not plan.)
#pragma once

#include <ddp/plugin.hpp>

#include <algorithm>

namespace ddp {
namespace gloo_transport {

inline ddp_status plan(const ddp_host* host, ddp_plan* out) {
  return plugin::guard(host, [&] {
    const plugin::Plan plan(out);
    const plugin::Host h(host);
    for (const char* key : {"hostname", "interface", "algorithm"}) (void)h.config_string(key, "");  // as init reads them
    if (host->device != DDP_DEVICE_CPU)
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, "gloo on a GPU stages through host memory, which `ddp plan` does "
                                                 "not count: plan GPU runs with transport nccl");
    const size_t n = size_t(host->world_size);
    size_t scratch = 0;
    for (const ddp_plan_collective& c : plan)
      if (c.op == DDP_OP_REDUCE_SCATTER) scratch = std::max(scratch, (n - 1) * (c.count / n) * ddp_dtype_size(c.dtype));
    plan.buffer(DDP_MEM_COMM_BUFFERS, scratch, DDP_PLAN_STEP);
  });
}

}  // namespace gloo_transport
}  // namespace ddp
