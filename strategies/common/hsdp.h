// hsdp.h — the two groups of HSDP (PyTorch FSDP2's 2-D mesh, HYBRID_SHARD)
// for a strategy that shards within groups of `shard_size` ranks and
// replicates across them: the key, the groups (ABI 1.9's ddp_host::split),
// the average across replicas, and the plan's collectives of each group.
// It does not shard anything itself: the strategy lays its shards out over
// size() ranks and this rank's place rank(), and communicates through
// shard() and across().
//
// For a world N = g r (r groups of g = shard_size): the shard groups are
// the ranks {0..g-1}, {g..2g-1}, ... (split color rank / g, key rank), the
// replica groups the ranks of the same place in each (color rank % g), so
// a rank's place in its shard group is rank % g. With g = N nothing is
// split: shard() is the world's comm, there is no replica group, and a
// strategy issues what it issued before the key existed.
// Header-only; throws ddp::plugin::Failure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strategy_util.h"

namespace ddp {
namespace strategy {

// The key shard_size (default: the world): at least 1, else
// DDP_ERR_INVALID_ARGUMENT; a divisor of the world, else
// DDP_ERR_UNSUPPORTED naming the key and the world (the worlds this
// strategy does not run on: ddp-conformance skips those its plan refuses
// so). Read alike by create and by the plan entry.
inline int read_shard_size(const plugin::Host& h) {
  const int world = h.world_size();
  const int64_t g = h.config_int("shard_size", world);
  if (g < 1)
    throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                          "strategy.shard_size must be a number of ranks >= 1 (got " + std::to_string(g) + ")");
  if (g > world || world % g != 0)
    throw plugin::Failure(DDP_ERR_UNSUPPORTED, "strategy.shard_size = " + std::to_string(g) +
                                                   " does not divide the world of " + std::to_string(world) +
                                                   " ranks: HSDP needs world = shard_size x replicas");
  return int(g);
}

class Hsdp {
 public:
  // Until split(): the world alone (g = N, no replicas).
  explicit Hsdp(const StrategyBase& base)
      : shard_(base.comm), size_(base.host.world_size()), rank_(base.host.rank()), world_(base.host.world_size()) {}
  Hsdp(const Hsdp&) = delete;
  Hsdp& operator=(const Hsdp&) = delete;

  // create: groups of `shard_size` over `world` (create's comm, with
  // create's transport): collective over the world, every rank in the same
  // order, shard groups first. Nothing where shard_size is the world.
  void split(const plugin::Host& h, const ddp_transport_v1_t* transport, ddp_comm* world, int shard_size) {
    if (shard_size == world_) return;
    if (!DDP_HOST_HAS(h.raw(), split) || !DDP_HOST_HAS(h.raw(), group))
      throw plugin::Failure(DDP_ERR_UNSUPPORTED, "strategy.shard_size = " + std::to_string(shard_size) +
                                                     " makes process groups: it needs an engine of ABI 1.9 or newer");
    const int rank = h.rank();
    ddp_comm* shard = h.split(world, rank / shard_size, rank, "shard");
    ddp_comm* replica = h.split(world, rank % shard_size, rank, "replicate");
    const ddp_group& mine = h.group(shard);
    if (mine.size != shard_size || mine.rank != rank % shard_size || h.group(replica).size != world_ / shard_size)
      throw plugin::Failure(DDP_ERR_INTERNAL,
                            "split: rank " + std::to_string(rank) + " is place " + std::to_string(mine.rank) +
                                " of a group of " + std::to_string(mine.size) + ", not " +
                                std::to_string(rank % shard_size) + " of " + std::to_string(shard_size));
    shard_ = plugin::Comm(transport, shard);
    replica_.emplace(transport, replica);
    size_ = shard_size;
    rank_ = mine.rank;
  }

  // The shard group's comm (the world's where nothing was split).
  const plugin::Comm& shard() const { return shard_; }
  // The replica group's comm, or nullptr where there is none (g = N).
  const plugin::Comm* across() const { return replica_ ? &*replica_ : nullptr; }
  int size() const { return size_; }               // g
  int rank() const { return rank_; }               // this rank's place in its shard group
  int replicas() const { return world_ / size_; }  // r = N / g

  // Enqueues the average of `b` across the replica group on `stream`
  // (`op` SUM for a compressed wire, whose buffers are divided by N
  // already); nothing where there is no replica group.
  void across_replicas(const ddp_buffer& b, ddp_stream stream, ddp_reduce_op op = DDP_REDUCE_AVG) const {
    if (replica_) replica_->all_reduce(b, op, stream);
  }

  // Members for the strategy's stats JSON.
  std::string json_members() const {
    return "\"shard_size\": " + std::to_string(size_) + ", \"replicas\": " + std::to_string(replicas());
  }

  // `ddp plan`: a collective of a group of `group` ranks of a world of
  // `world`: the world's (plan.collective) where it is the world, else
  // ddp_plan::group_collective.
  static void plan(const plugin::Plan& plan, int world, int group, ddp_collective_op op, size_t count,
                   ddp_dtype dtype = DDP_FLOAT32, bool beside_compute = false) {
    if (group == world) {
      plan.collective(op, count, dtype, beside_compute);
      return;
    }
    plan.group_collective(op, count, group, dtype, beside_compute);
  }

 private:
  plugin::Comm shard_;
  std::optional<plugin::Comm> replica_;
  int size_;
  int rank_;
  int world_;
};

}  // namespace strategy
}  // namespace ddp
