// staged.cpp — see staged.h.
#include "staged.h"

#include <vector>

#include "tensor.h"

namespace ddp {

ddp_status run_staged(Device& device, Stream& stream, const std::function<ddp_status(void* const* ptrs)>& call,
                      std::initializer_list<std::pair<void*, size_t>> host, std::chrono::milliseconds limit) {
  const bool staged = device.kind() != DDP_DEVICE_CPU;
  std::vector<Tensor> copies;
  std::vector<void*> ptrs;
  for (const auto& [ptr, bytes] : host) {
    if (!staged) {
      ptrs.push_back(ptr);
      continue;
    }
    copies.emplace_back(device, Shape{int64_t((bytes + sizeof(float) - 1) / sizeof(float))}, MemCategory::CommBuffers);
    device.upload(copies.back().data(), ptr, bytes);
    ptrs.push_back(copies.back().data());
  }
  const ddp_status status = call(ptrs.data());
  if (status != DDP_OK) return status;
  Event done;
  done.record(stream);
  done.synchronize(limit);
  if (!staged) return DDP_OK;
  size_t i = 0;
  for (const auto& [ptr, bytes] : host) device.download(ptr, copies[i++].data(), bytes);
  return DDP_OK;
}

}  // namespace ddp
