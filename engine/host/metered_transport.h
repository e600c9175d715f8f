// metered_transport.h — the transport as the strategy receives it: a
// ddp_transport_v1_t whose every collective is forwarded to the real
// transport and metered into the rank's CommCounters (calls, bytes, busy
// time, the collective-sequence fingerprint) and its group's, and, with
// --trace, recorded on the trace's communication lane.
//
// Groups (ABI 1.9). Each communicator the strategy holds is a MeteredComm:
// the world's, and one per group it made with ddp_host::split. A
// collective is metered with its group's size (bus bytes), traced under
// its group, compared within its group (run.debug_collectives), and a
// failure or a stuck wait in it names the group and its ranks.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/plugin.h>

#include "plugin_host.h"
#include "stream.h"
#include "tensor.h"
#include "trace.h"

namespace ddp {

class MeteredTransport;

// One communicator a strategy holds: the world, or a group of it. Its
// handle (comm()) is what the strategy passes to the metered vtable.
struct MeteredComm {
  MeteredTransport* owner = nullptr;
  ddp_comm* real = nullptr;  // the transport's own
  std::string name;          // "world", or split's name
  std::vector<int> ranks;    // members' world ranks, in group order
  int rank = 0;
  int size = 1;
  int color = 0;
  std::string label;      // "group 'shard' (ranks 0, 1)"; "" for the world
  ddp_group abi{};        // what ddp_host::group returns
  int64_t described = 0;  // collectives described so far (run.debug_collectives)
  // Its rendezvous tag ("ddp.group" for the world; a group's is its
  // parent's, the parent's count of splits before it and its color: the
  // same on every member, another for every group of the run, nested too).
  std::string tag = "ddp.group";
  int splits = 0;  // splits made of it so far (every member makes them in one order)
  // Its own share of the counters (the rank's totals count every group).
  std::atomic<int64_t> collectives{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> bus_bytes{0};
  bool world() const { return label.empty(); }
  ddp_comm* comm() { return reinterpret_cast<ddp_comm*>(this); }
};

// What summary.json says of one group of rank 0's: its figures for the run.
struct GroupReport {
  std::string name;
  std::vector<int> ranks;
  int64_t collectives = 0;
  int64_t bytes = 0;
  int64_t bus_bytes = 0;
};

// A transport vtable and comm handles for the strategy: each call is
// forwarded to the real transport and metered into services.counters.
class MeteredTransport {
 public:
  // `label` names the transport while a call is in it ("transport plugin
  // 'gloo'", kept by the caller), for the crash handler and the watchdog.
  MeteredTransport(const ddp_transport_v1_t* real, ddp_comm* comm, HostServices& services,
                   const char* label = "transport plugin");
  const ddp_transport_v1_t* vtable() const { return &vtable_; }
  ddp_comm* comm() { return comms_.front().comm(); }  // the world's
  ~MeteredTransport();  // releases timestamps not yet settled and the groups; never throws
  // With a trace, each collective is also recorded there (op, bytes, group,
  // from when the comm stream starts it to when it is done).
  void set_trace(Trace* trace) { trace_ = trace; }
  // run.debug_collectives (collective_check.h): each collective is first
  // described, all-gathered and compared across the ranks of its group; a
  // disagreement fails the call, naming both sides.
  void set_debug_collectives(bool on) { debug_ = on; }
  // Under a divergent strategy, on_step_end of `step` (from 0) is checked
  // whatever run.debug_collectives says: while `on`, each collective the
  // strategy issues on the world is described and compared as above, the
  // sentence step_end_mismatch's (a group's only with the debug check on).
  // The engine then gathers each rank's return (kStepEnd) the same way
  // (RankPlugins::on_step_end): a rank that returned meets, in one
  // all-gather, the description of a collective another is about to issue.
  void set_step_end(bool on, int64_t step) {
    step_end_ = on;
    step_end_step_ = step;
  }
  // A strategy built before ABI 1.4, to which reduce_scatter was never
  // NULL: where the transport has none, it gets an entry that refuses by
  // name (DDP_ERR_UNSUPPORTED) rather than NULL to call.
  void serve_strategy_of_minor(uint32_t minor);

  // ddp_host::split (ABI 1.9): every rank of `parent`'s group gathers the
  // colors and keys (through the real transport, unmetered), takes its
  // place (groups.h) and has the transport make the group's communicator;
  // the group's handle. Throws Error saying why not.
  ddp_comm* split(ddp_comm* parent, int color, int key, const char* name);
  // ddp_host::group: what `comm` is; nullptr for a handle not of ours.
  const ddp_group* group(ddp_comm* comm) const;
  // Destroys the groups' communicators, the newest first (after the
  // strategy, before the world's). Idempotent; never throws.
  void release_groups();
  // The transport's abort on every group's communicator (the world's is
  // the caller's). Any thread.
  void abort_groups();
  // Each communicator's figures so far, the world's first.
  std::vector<GroupReport> reports() const;

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
    const char* group;  // null: the world
    int64_t bytes;
    int64_t step;  // -1 when not traced
  };
  MeteredComm& add_comm(ddp_comm* real, std::string name, std::vector<int> ranks, int rank, int color,
                        std::string tag = "ddp.group");
  const ddp_transport_v1_t* real_;
  HostServices& services_;
  const char* label_;
  Trace* trace_ = nullptr;
  bool debug_ = false;
  bool step_end_ = false;       // within on_step_end of a divergent strategy (set_step_end)
  int64_t step_end_step_ = 0;   // its step
  std::vector<Tensor> staged_;  // the descriptions' device copies (run_staged), kept from call to call
  ddp_transport_v1_t vtable_{};
  std::deque<MeteredComm> comms_;   // the world's first; stable addresses (their handles)
  mutable std::mutex comms_mutex_;  // split and release against abort_groups, which any thread may call
  std::vector<Pending> pending_;    // the training thread's only
};

}  // namespace ddp
