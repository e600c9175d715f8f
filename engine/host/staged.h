// staged.h — a collective the engine issues itself, on host memory: the
// loss all-reduce, the summaries and replica digests, run.debug_collectives'
// descriptions. On a device other than the CPU each buffer is staged
// through device memory; the call is waited for before it returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include <ddp/plugin.h>

#include "device.h"
#include "stream.h"
#include "tensor.h"

namespace ddp {

// Runs `call` with one pointer per entry of `host` ({pointer, bytes}, all
// read-write), usable on `device`, on `stream`; waits up to `limit` for it
// and copies each buffer back. Returns the call's status (nothing waited
// for, nothing copied back, if it is not DDP_OK); throws on a stuck or
// failed stream. With `keep`, the device copies are kept there, one per
// entry, and reused by the next call that fits them (grown where it does
// not): a caller of fixed sizes allocates once, not on every call.
ddp_status run_staged(Device& device, Stream& stream, const std::function<ddp_status(void* const* ptrs)>& call,
                      std::initializer_list<std::pair<void*, size_t>> host, std::chrono::milliseconds limit,
                      std::vector<Tensor>* keep = nullptr);

}  // namespace ddp
