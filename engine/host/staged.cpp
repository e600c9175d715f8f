// staged.cpp — see staged.h.
#include "staged.h"

#include <vector>

#include "tensor.h"

namespace ddp {

ddp_status run_staged(Device& device, Stream& stream, const std::function<ddp_status(void* const* ptrs)>& call,
                      std::initializer_list<std::pair<void*, size_t>> host, std::chrono::milliseconds limit,
                      std::vector<Tensor>* keep) {
  const bool staged = device.kind() != DDP_DEVICE_CPU;
  std::vector<Tensor> own;
  std::vector<Tensor>& copies = keep ? *keep : own;
  std::vector<void*> ptrs;
  size_t k = 0;
  for (const auto& [ptr, bytes] : host) {
    if (!staged) {
      ptrs.push_back(ptr);
      continue;
    }
    const int64_t floats = int64_t((bytes + sizeof(float) - 1) / sizeof(float));
    if (copies.size() <= k) copies.emplace_back();
    if (!copies[k].defined() || copies[k].numel() < size_t(floats))
      copies[k] = Tensor(device, Shape{floats}, MemCategory::CommBuffers);
    device.upload(copies[k].data(), ptr, bytes);
    ptrs.push_back(copies[k++].data());
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
