// transport_rank.h — one rank of a transport test, set up as the engine does:
// a device, a file store in the test's directory, HostServices and a
// PluginHost over them, the transport plugin loaded and init'ed. Collectives
// go on the device's comm stream; sync() waits for them as the engine does
// (an event). Throws (rank_checks.h's fail) where set-up goes wrong; each
// test file wraps it with collectives on its own buffer types.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device.h"
#include "plugin_host.h"
#include "plugin_loader.h"
#include "rank_checks.h"
#include "store.h"

namespace ddp::test {

class TransportRank {
 public:
  // `plugin`: a name or a path, from DDP_TEST_PLUGIN_DIR; `timeout_ms`: the
  // run timeout the transport gets (host->timeout_ms); the store keeps 30 s
  // so that a slow start never fails the rendezvous.
  TransportRank(std::unique_ptr<Device> device, int rank, int world, const std::string& dir,
                const std::string& store_prefix, const std::string& plugin, const std::vector<std::string>& sets,
                int64_t timeout_ms = 30000)
      : device_(std::move(device)),
        store_("file:" + dir, store_prefix, std::chrono::milliseconds(30000)),
        section_(plugin_section_from_overrides("transport", sets)) {
    services_.rank = RankInfo{rank, world, rank};
    services_.device = device_.get();
    services_.store = &store_;
    services_.timeout_ms = timeout_ms;
    host_ = std::make_unique<PluginHost>(services_, section_, "transport plugin 'gloo'");
    plugin_ = load_plugin(PluginKind::Transport, plugin, DDP_TEST_PLUGIN_DIR);
    t_ = plugin_->transport();
    if (!t_) fail("load_plugin returned no transport descriptor");
    host_->check(t_->init(host_->get(), &comm_), "init");
  }
  ~TransportRank() {
    try {
      device_->comm_stream().synchronize();
    } catch (...) {
    }
    if (comm_) t_->destroy(comm_);
  }
  TransportRank(const TransportRank&) = delete;
  TransportRank& operator=(const TransportRank&) = delete;

  int rank() const { return services_.rank.rank; }
  int world() const { return services_.rank.world_size; }
  Device& device() { return *device_; }
  const ddp_transport_v1_t* t() const { return t_; }
  ddp_comm* comm() const { return comm_; }
  PluginHost& host() { return *host_; }
  ddp_stream stream() { return reinterpret_cast<ddp_stream>(&device_->comm_stream()); }
  void check(ddp_status s, const char* entry) { host_->check(s, entry); }
  // Waits for everything enqueued so far, as the engine does: with an event.
  void sync() {
    Event e;
    e.record(device_->comm_stream());
    e.synchronize();
  }

  void all_reduce(const ddp_buffer& b, ddp_reduce_op op) { check(t_->all_reduce(comm_, &b, op, stream()), "all_reduce"); }
  void broadcast(const ddp_buffer& b, int root) { check(t_->broadcast(comm_, &b, root, stream()), "broadcast"); }
  void all_gather(const ddp_buffer& send, const ddp_buffer& recv) {
    check(t_->all_gather(comm_, &send, &recv, stream()), "all_gather");
  }
  void reduce_scatter(const ddp_buffer& send, const ddp_buffer& recv, ddp_reduce_op op) {
    check(t_->reduce_scatter(comm_, &send, &recv, op, stream()), "reduce_scatter");
  }
  void barrier() { check(t_->barrier(comm_, stream()), "barrier"); }

 private:
  std::unique_ptr<Device> device_;
  Store store_;
  HostServices services_;
  PluginSection section_;
  std::unique_ptr<PluginHost> host_;
  std::unique_ptr<LoadedPlugin> plugin_;
  const ddp_transport_v1_t* t_ = nullptr;
  ddp_comm* comm_ = nullptr;
};

}  // namespace ddp::test
