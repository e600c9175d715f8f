// metered_transport.h — the transport as the strategy receives it: a
// ddp_transport_v1_t whose every collective is forwarded to the real
// transport and metered into the rank's CommCounters (calls, bytes, busy
// time, the collective-sequence fingerprint) and, with --trace, recorded
// on the trace's communication lane.
#pragma once

#include <cstdint>
#include <vector>

#include <ddp/plugin.h>

#include "plugin_host.h"
#include "stream.h"
#include "trace.h"

namespace ddp {

// A transport vtable and comm handle for the strategy: each call is
// forwarded to the real transport and metered into services.counters.
class MeteredTransport {
 public:
  // `label` names the transport while a call is in it ("transport plugin
  // 'gloo'", kept by the caller), for the crash handler and the watchdog.
  MeteredTransport(const ddp_transport_v1_t* real, ddp_comm* comm, HostServices& services,
                   const char* label = "transport plugin");
  const ddp_transport_v1_t* vtable() const { return &vtable_; }
  ddp_comm* comm() { return reinterpret_cast<ddp_comm*>(this); }
  ~MeteredTransport();  // releases timestamps not yet settled; never throws
  // With a trace, each collective is also recorded there (op, bytes, from
  // when the comm stream starts it to when it is done).
  void set_trace(Trace* trace) { trace_ = trace; }
  // run.debug_collectives (collective_check.h): each collective is first
  // described, all-gathered and compared across ranks; a disagreement fails
  // the call, naming both sides.
  void set_debug_collectives(bool on) { debug_ = on; }
  // A strategy built before ABI 1.4, to which reduce_scatter was never
  // NULL: where the transport has none, it gets an entry that refuses by
  // name (DDP_ERR_UNSUPPORTED) rather than NULL to call.
  void serve_strategy_of_minor(uint32_t minor);

  // How a collective is timed. On a CPU stream: two host tasks around it,
  // which read the host clock (its busy time and trace event are counted
  // when the second one runs). On a device stream: two timestamps of the
  // device (CUDA timing events) around it, no host function, so the
  // device's stream never waits for the host; the collective's NVTX range
  // is its enqueue, which Nsight Systems projects onto its kernels. Its
  // busy time and trace event are counted when settled: settle(false) takes
  // those the device has passed (the trainer, at the end of each step),
  // settle(true) waits for all (at the end of the run).
  void settle(bool wait);

 private:
  friend struct MeterCallbacks;
  struct Pending {  // a collective on a device stream, timestamps unread
    Stream* stream;
    void* begin;
    void* end;
    const char* op;
    int64_t bytes, step;  // step: -1 when not traced
  };
  const ddp_transport_v1_t* real_;
  ddp_comm* real_comm_;
  HostServices& services_;
  const char* label_;
  Trace* trace_ = nullptr;
  bool debug_ = false;
  int64_t described_ = 0;  // collectives described so far (run.debug_collectives)
  ddp_transport_v1_t vtable_{};
  std::vector<Pending> pending_;  // the training thread's only
};

}  // namespace ddp
