// rank_plugins.h — this rank's transport and strategy, in the order the ABI
// gives them life and takes it back:
//   load:     both libraries, each checked for the run's device;
//   start:    init the transport (the rendezvous), check its keys were all
//             read; create the strategy over the metered transport, check
//             its keys;
//   shutdown: drain the streams, destroy the strategy, drain (destroy may
//             enqueue), destroy the transport, drain, unload both libraries.
// After a failure, abort() first: it makes the transport fail what it still
// has queued (a stuck collective), so that the drain cannot wait for ever;
// and on the CPU a drain after it waits 1 s at most: a task still running
// then (a plugin's host function that never returns, a collective waiting
// out its own timeout) cannot be waited out nor its code unloaded, and the
// failure is reported already, so the process ends there (exit 1, without
// the destructors). A GPU's drain stays bounded by the watchdog.
//
// The trainer calls the strategy's hooks through the methods below, each
// checked: a failure throws Error in the plugin's words, of the kind of the
// status it returned, naming the plugin and the entry. The engine's own
// collectives (the loss, the summary's per-rank totals) go to the real
// transport, not the metered one: they are not the strategy's.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ddp/plugin.h>
#include <nlohmann/json.hpp>

#include "config.h"
#include "grad_span.h"
#include "metered_transport.h"
#include "plugin_host.h"
#include "plugin_loader.h"
#include "tensor.h"
#include "whereabouts.h"

namespace ddp {

class RankPlugins {
 public:
  // Loads both plugins for `config` and checks they support the device of
  // `services`; start() starts them. Throws Error naming a plugin that
  // cannot be loaded.
  RankPlugins(const Config& config, HostServices& services);
  // Starts both plugins (services' device, store and rank set); `trace` (or
  // null) records the strategy's collectives. Throws Error; whatever
  // started is shut down again. `config` must outlive this object (the
  // plugins' hosts read its tables).
  void start(const Config& config, Trace* trace);
  // "transport gloo 0.3.0, strategy naive 0.1.0": what ranks must agree on.
  std::string identity() const;
  ~RankPlugins();  // shutdown(), if not done; never throws
  RankPlugins(const RankPlugins&) = delete;
  RankPlugins& operator=(const RankPlugins&) = delete;

  const char* transport_name() const { return transport_lib_->transport()->name; }
  const char* strategy_name() const { return strategy_api().name; }
  bool owns_optimizer() const { return strategy_api().caps & DDP_CAP_OWNS_OPTIMIZER; }
  bool owns_gradients() const { return strategy_api().caps & DDP_CAP_OWNS_GRADIENTS; }
  // (1.8) Whether the replicas may differ between sync points.
  bool divergent() const { return strategy_api().caps & DDP_CAP_DIVERGENT; }
  MeteredTransport& metered() { return *metered_; }

  // The strategy's hooks (plugin.h gives their contract and order).
  void on_train_begin();
  void on_step_begin(const ddp_step_info& info);
  void on_grad_ready(const ddp_param& param);
  void on_backward_end();
  void finish();
  void optimizer_step();
  void on_unit(size_t unit, ddp_unit_phase phase);  // (1.4) nothing where the strategy has none
  void on_train_end();
  // (1.8) After the optimizer step: whether every rank holds the same
  // parameters now (a sync point); true where the strategy has no entry.
  bool on_step_end(const ddp_step_info& info);
  // (1.8) The strategy's own state that checkpoints keep (its `state`
  // entry), checked: unique names, memory where there are elements. Empty
  // where it has none. Valid until its next entry.
  struct StateBuffer {
    std::string name;
    float* data;
    size_t count;
    bool equal = false;  // the same on every rank (state_scopes, 1.9); else this rank's own
  };
  std::vector<StateBuffer> state();
  bool keeps_state() const { return strategy_api().state != nullptr; }
  void unit_values(size_t unit, bool hold);  // (1.5) where the strategy claims values
  // (1.7) Whether the strategy takes values unit by unit (take_values, a
  // model with units): then none exist in create.
  bool takes_values() const;
  void take_values(size_t unit);
  // After finish: the parameters whose averaged gradient this rank holds,
  // when the strategy leaves each on one rank (held_grads, ABI 1.2);
  // nullopt when every rank holds every one.
  std::optional<std::vector<size_t>> held_grads();
  // After finish: the gradients the strategy holds in storage it claimed
  // (grad_ranges, ABI 1.4), valid until the next hook; nullopt where it has
  // no such entry.
  std::optional<GradRanges> grad_ranges();
  // (1.9) Whether the strategy says what it holds through held_ranges,
  // and what: a copy, each range as the strategy gave it.
  bool has_held_ranges() const { return strategy_api().held_ranges != nullptr; }
  std::vector<ddp_held_range> held_ranges();
  // The strategy's stats as JSON (a string if it wrote something else);
  // false if it has none.
  bool stats(nlohmann::ordered_json* out);

  // Engine collectives, blocking: `all` (world × mine.size()) receives
  // every rank's `mine`, rank order.
  void all_gather(const std::vector<double>& mine, std::vector<double>& all);
  void all_gather(const std::vector<int64_t>& mine, std::vector<int64_t>& all);
  // all_gather of doubles, for a gather inside every step (the gradients'
  // norm, fp16's overflow verdict): on a GPU through device copies kept
  // from step to step, so that a step after the first allocates nothing.
  void step_all_gather(const std::vector<double>& mine, std::vector<double>& all);

  void abort();     // the transport's abort, if it has one; any thread
  void shutdown();  // see above; idempotent, never throws

 private:
  const ddp_strategy_v1_t& strategy_api() const { return *strategy_lib_->strategy(); }
  // One strategy entry: `entry` names it to the crash handler and the
  // watchdog while it runs, and to the user if it fails.
  template <typename Call>
  void call(const char* entry, Call&& entry_call) {
    ddp_status status;
    {
      whereabouts::Inside in(strategy_host_->label().c_str(), entry);
      status = entry_call();
    }
    strategy_host_->check(status, entry);
  }
  void start_transport(const Config& config);
  void start_strategy(const Config& config, Trace* trace);
  void require_device_cap(const char* kind, const char* name, uint64_t caps) const;
  std::string unreadable_on_cpu(const void* ptr, size_t count, size_t size) const;
  void drain();
  // ddp_host::split is open for the scope of an entry (create,
  // on_train_begin), on every rank at the same point.
  struct SplitsOpen {
    explicit SplitsOpen(HostServices& s) : services(s) { services.splits_open = true; }
    ~SplitsOpen() { services.splits_open = false; }
    HostServices& services;
  };
  bool aborted_ = false;
  std::vector<std::string> unit_entries_;  // per unit: its 4 on_unit phases, unit_values, take_values, by name
  // One engine collective on the comm stream, waited for. On a GPU the host
  // buffers travel through device copies (a transport like nccl reads device
  // memory only); `call` gets the pointers to use, in order.
  using Call = std::function<ddp_status(const ddp_transport_v1_t&, ddp_comm*, ddp_stream, void* const* ptrs,
                                        ddp_device_kind device)>;
  // `keep`: run_staged's, the device copies kept for the next call.
  void engine_collective(const Call& call, const char* what, std::initializer_list<std::pair<void*, size_t>> host,
                         std::vector<Tensor>* keep = nullptr);
  // all_gather of 8-byte words (float64 or int64).
  void gather_words(const void* mine, void* all, size_t send, size_t recv, ddp_dtype dtype, const char* what,
                    std::vector<Tensor>* keep = nullptr);
  // After on_step_end of a divergent strategy: the ranks' answers compared
  // (step_end_mismatch); throws Error naming the disagreement.
  void compare_step_end(int64_t step, bool synced);

  HostServices& services_;
  std::unique_ptr<LoadedPlugin> transport_lib_;
  std::unique_ptr<LoadedPlugin> strategy_lib_;
  std::unique_ptr<PluginHost> transport_host_;
  std::unique_ptr<PluginHost> strategy_host_;
  ddp_comm* comm_ = nullptr;
  std::unique_ptr<MeteredTransport> metered_;
  ddp_strategy* strategy_ = nullptr;
  std::vector<Tensor> step_end_staged_;     // compare_step_end's device copies (a GPU's), kept from step to step
  std::vector<Tensor> step_gather_staged_;  // step_all_gather's, likewise
};

}  // namespace ddp
