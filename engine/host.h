// host.h — the engine side of the plugin ABI: builds the ddp_host vtable a
// plugin receives, turns plugin failures into Errors with the plugin's own
// words, and wraps the transport handed to the strategy so every collective
// it issues is counted (bytes, calls) and timed on the communication stream.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "config.h"
#include "device.h"
#include "model.h"
#include "optimizer.h"
#include "store.h"
#include "trace.h"

namespace ddp {

// Communication counters of the strategy's collectives. Thread-safe.
struct CommCounters {
  std::atomic<int64_t> collectives{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> busy_ns{0};     // time collectives ran on the comm stream
  std::atomic<int64_t> blocked_ns{0};  // time the training thread waited on events
  // FNV-1a over (op, count, dtype, reduce op / root) of every collective in
  // issue order: equal on every rank iff they issued the same sequence.
  std::atomic<uint64_t> sequence_hash{14695981039346656037ull};
};

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
};

// Everything the host vtable reaches. Owned by the trainer, outlives plugins.
struct HostServices {
  RankInfo rank;
  Device* device = nullptr;
  Model* model = nullptr;
  Optimizer* optimizer = nullptr;
  Store* store = nullptr;
  int64_t timeout_ms = 30000;
  CommCounters counters;
  std::vector<ddp_param> param_table;  // mirrors model->params()

  // How long a blocking wait may take before the engine gives up on a stuck
  // collective: the transport's own timeout plus a grace for it to fire.
  std::chrono::milliseconds wait_limit() const { return std::chrono::milliseconds(timeout_ms + 5000); }

  void refresh_param_table();  // after trainable flags change
};

// One plugin's view of the host: its TOML section and its ddp_host struct.
class PluginHost {
 public:
  PluginHost(HostServices& services, const PluginSection& section, std::string label);
  const ddp_host* get() const { return &host_; }
  // Throws Error("<label>: <plugin's error text>") if status is not DDP_OK.
  void check(ddp_status status, const char* entry) const;
  const std::string& label() const { return label_; }

 private:
  friend struct HostCallbacks;
  HostServices& services_;
  const PluginSection& section_;
  std::string label_;  // "strategy plugin 'naive'"
  std::deque<std::string> strings_;  // config_string results, kept alive
  ddp_host host_{};
};

// The error text a plugin set on the calling thread (and clears it).
std::string take_plugin_error();

// A transport vtable and comm handle for the strategy: each call is
// forwarded to the real transport and metered into services.counters.
class MeteredTransport {
 public:
  MeteredTransport(const ddp_transport_v1_t* real, ddp_comm* comm, HostServices& services);
  const ddp_transport_v1_t* vtable() const { return &vtable_; }
  ddp_comm* comm() { return reinterpret_cast<ddp_comm*>(this); }
  ~MeteredTransport();  // releases timestamps not yet settled; never throws
  // With a trace, each collective is also recorded there (op, bytes, from
  // when the comm stream starts it to when it is done).
  void set_trace(Trace* trace) { trace_ = trace; }

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
  Trace* trace_ = nullptr;
  ddp_transport_v1_t vtable_{};
  std::vector<Pending> pending_;  // the training thread's only
};

}  // namespace ddp
