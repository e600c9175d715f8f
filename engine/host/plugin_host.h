// plugin_host.h — the engine side of the plugin ABI: the ddp_host vtable a
// plugin receives (PluginHost, one per loaded plugin, over the rank's
// HostServices), and the conversion of a plugin's failure into an Error in
// the plugin's own words, with its kind, plugin and entry.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/plugin.hpp>

#include "compute.h"
#include "device.h"
#include "model.h"
#include "param_store.h"
#include "plugin_section.h"
#include "rank.h"
#include "store.h"

namespace ddp {

// Communication counters of the strategy's collectives. Thread-safe.
struct CommCounters {
  std::atomic<int64_t> collectives{0};
  std::atomic<int64_t> bytes{0};       // buffer bytes: S of each collective (all_gather: the gathered buffer)
  std::atomic<int64_t> bus_bytes{0};   // bytes each rank sends (and receives): bus_bytes() of each collective
  std::atomic<int64_t> largest{0};     // the largest collective's buffer bytes so far (as `bytes` counts them)
  std::atomic<int64_t> busy_ns{0};     // time collectives ran on the comm stream
  std::atomic<int64_t> blocked_ns{0};  // time the training thread waited on events
  // FNV-1a over (op, count, dtype, reduce op / root) of every collective in
  // issue order: equal on every rank iff they issued the same sequence.
  std::atomic<uint64_t> sequence_hash{14695981039346656037ull};
};

// The bytes each rank sends, and receives, for one collective of S buffer
// bytes on `world` ranks under ring algorithms, as nccl-tests' bus
// bandwidth counts them (doc/PERFORMANCE.md): all_reduce 2(n-1)/n S;
// all_gather (S the gathered buffer) and reduce_scatter (S the send
// buffer) (n-1)/n S; broadcast S; barrier 0. One rank sends nothing. Pure.
int64_t bus_bytes(const char* op, int64_t buffer_bytes, int world);

// Everything the host vtable reaches. Owned by the trainer (or a test),
// outlives the plugins.
struct HostServices {
  RankInfo rank;
  Device* device = nullptr;
  Model* model = nullptr;  // for the parameter table; null: no parameters
  Store* store = nullptr;
  int64_t timeout_ms = 30000;
  ddp_precision precision{sizeof(ddp_precision), DDP_FLOAT32, DDP_FLOAT32, 0};  // ddp_host::precision (1.11)
  bool step_skipped = false;  // ddp_host::step_skipped (1.11): the trainer's, from finish to on_step_end's return
  CommCounters counters;
  // The parameters' values and gradients, and who holds each (the ABI's
  // tables, claim and bind): param_store.h.
  ParamStore params;
  // ddp_host::run_optimizer: the engine's optimizer on these parameters.
  std::function<void(const size_t* indices, size_t count)> run_optimizer;
  // ddp_host::run_optimizer_ranges: the same on element ranges.
  std::function<void(const ddp_range* ranges, size_t count)> run_optimizer_ranges;
  // ddp_host::grads_final (1.10): the groups of trainable parameters a
  // strategy said final this step, each once its event (null: now) has
  // fired, in the order said; the trainer's optimizer step waits for each
  // in turn and updates it (wait_final), then the parameters none named.
  // Open from on_step_begin of the sync micro-batch until finish returns
  // (the trainer sets finals_open; begin_finals empties the list).
  struct FinalGroup {
    Event* done = nullptr;
    std::vector<size_t> params;
    const char* label = nullptr;  // the plugin that said it, for a failed wait
  };
  std::vector<FinalGroup> finals;  // [0, finals_said): this step's
  size_t finals_said = 0;
  std::vector<char> final_named;  // per parameter: named this step
  bool finals_open = false;
  void begin_finals();
  // Throws Error "grads_final: ..." naming the parameter, or the window.
  void say_final(Event* done, const size_t* indices, size_t count, const char* label);
  // Blocks until group `k`'s event has fired, counted as blocked time; a
  // failed reduction fails naming the plugin and grads_final.
  void wait_final(size_t k);

  // ddp_host::split and group (ABI 1.9): the metered transport's, while a
  // strategy is up; split only while splits_open (create, on_train_begin).
  std::function<ddp_comm*(ddp_comm* parent, int color, int key, const char* name)> split;
  std::function<const ddp_group*(ddp_comm* comm)> group;
  bool splits_open = false;
  // The label of the group whose collective the comm stream runs now (null:
  // none, or the world's): a wait that gives up names it.
  std::atomic<const char*> group_in_flight{nullptr};

  // How long a blocking wait may take before the engine gives up on a stuck
  // collective: the transport's own timeout plus a grace for it to fire.
  std::chrono::milliseconds wait_limit() const { return std::chrono::milliseconds(timeout_ms + 5000); }

  // The device work of ddp_host's compute entries (1.9), made by the first
  // call (host_compute.cpp), so that a CUDA run makes cuBLAS handles only
  // where a strategy computes. Thread-safe.
  Compute& compute();
  std::mutex compute_mutex;
  std::unique_ptr<Compute> compute_work;  // compute()'s, under compute_mutex
};

// One plugin's view of the host: its TOML section and its ddp_host struct.
class PluginHost {
 public:
  PluginHost(HostServices& services, const PluginSection& section, std::string label);
  const ddp_host* get() const { return &host_; }
  // Throws Error("<label>: <entry>: <plugin's error text>") if status is not
  // DDP_OK, of the status's kind, in this plugin and entry.
  void check(ddp_status status, const char* entry) const;
  const std::string& label() const { return label_; }
  // The plugin's caps (its descriptor's): what it may ask of the host.
  void set_caps(uint64_t caps) { caps_ = caps; }

 private:
  friend struct HostCallbacks;
  friend struct HostCompute;  // host_compute.cpp
  HostServices& services_;
  const PluginSection& section_;
  std::string label_;                // "strategy plugin 'naive'"
  std::deque<std::string> strings_;  // config_string results, kept alive
  uint64_t caps_ = 0;
  ddp_host host_{};
};

// Sets the compute entries of `host` (gemm, dot, norm, axpy, normalize;
// ABI 1.9), a PluginHost's vtable: host_compute.cpp.
void install_compute_entries(ddp_host& host);

// The error text a plugin set on the calling thread (and clears it).
std::string take_plugin_error();

// The host's own entries (and the metered transport's) report a failure as
// a plugin's entries do: through plugin::guard, which sets the calling
// thread's error text, with `fallback` for a failure of no kind. An Error
// is the engine's own type, not the SDK's: it is turned into a
// plugin::Failure of its kind here, at the ABI, with its words unchanged.
const ddp_host* engine_error_sink();
template <typename Body>
ddp_status host_guard(Body&& body, ddp_status fallback = DDP_ERR_INTERNAL) {
  return plugin::guard(
      engine_error_sink(),
      [&] {
        try {
          body();
        } catch (const Error& e) {
          throw plugin::Failure(e.status(), e.what());
        }
      },
      fallback);
}

}  // namespace ddp
