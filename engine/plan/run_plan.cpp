// run_plan.cpp — the rules of run_plan.h.
#include "run_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "buckets.h"
#include "partition.h"
#include "plugin_host.h"  // bus_bytes

namespace ddp {
namespace plan {
namespace {

constexpr int64_t kFloat = 4;

std::vector<strategy::ParamInfo> param_infos(const Footprint& f) {
  std::vector<strategy::ParamInfo> infos;
  for (size_t i = 0; i < f.params.size(); ++i)
    infos.push_back({i, static_cast<size_t>(f.params[i].elements * kFloat), true});
  return infos;
}

// Bytes of the data loader's batch buffers (engine/io/data.cpp): device
// memory for x (and y), host memory for token and label ids.
int64_t data_bytes(const DataShape& d, int64_t rows) {
  switch (d.kind) {
    case DataShape::Regression: return rows * (d.in + d.out) * kFloat;
    case DataShape::Classification: return rows * d.in * kFloat;
    case DataShape::Tokens: return 0;
  }
  return 0;
}

// Elements each rank owns under sharded's partition (all on rank 0 for
// every other strategy's single optimizer).
std::vector<int64_t> owned_elements(const RunInput& in) {
  std::vector<int64_t> owned(static_cast<size_t>(in.world_size), 0);
  const auto infos = param_infos(in.model);
  if (in.strategy != "sharded") {
    int64_t all = 0;
    for (const ParamSize& p : in.model.params) all += p.elements;
    std::fill(owned.begin(), owned.end(), all);
    return owned;
  }
  const std::vector<int> owners = strategy::partition_params(infos, in.world_size);
  for (size_t i = 0; i < owners.size(); ++i)
    if (owners[i] != strategy::kNoOwner) owned[static_cast<size_t>(owners[i])] += in.model.params[i].elements;
  return owned;
}

int64_t state_bytes_per_element(const RunInput& in) {
  if (in.optimizer == "adamw") return 2 * kFloat;
  if (in.optimizer == "sgd") return in.momentum != 0.0 ? kFloat : 0;
  throw std::invalid_argument("plan: unknown optimizer '" + in.optimizer + "' (sgd or adamw)");
}

// Each bucket's all-reduce, and the buffers bucket_sync.h makes for them:
// a wire buffer for compress, and a float32 one only where the bucket is
// not averaged in place (the engine packs the gradients so that every
// bucket could be: Model::pack_gradients).
void add_buckets(const RunInput& in, int64_t wire_bytes, int64_t* buffers, std::vector<Collective>* steps) {
  if (!(in.bucket_mb > 0) || !std::isfinite(in.bucket_mb))
    throw std::invalid_argument("strategy.bucket_mb must be a finite number of MiB > 0");
  const size_t cap = strategy::cap_bytes_of_mib(in.bucket_mb);
  for (const strategy::Bucket& b : strategy::assign_buckets(param_infos(in.model), cap)) {
    const int64_t elements = static_cast<int64_t>(b.bytes) / kFloat;
    *buffers += (in.in_place ? 0 : static_cast<int64_t>(b.bytes)) + (wire_bytes != kFloat ? elements * wire_bytes : 0);
    steps->push_back({"all_reduce", elements * wire_bytes, true});
  }
  // flush() launches the last when backward ends: beside the updates of
  // the others where the strategy makes them as averages arrive (and there
  // are others, and no clipping makes the engine wait for all); alone
  // otherwise.
  if (!steps->empty())
    steps->back().beside_compute = in.strategy == "bucketed" && in.overlap_optimizer && !in.clips && steps->size() > 1;
}

// The comm buffers one rank holds and the collectives of one step.
int64_t strategy_comm(const RunInput& in, std::vector<Collective>* steps) {
  const std::string& s = in.strategy;
  int64_t buffers = 0, total = 0;
  for (const ParamSize& p : in.model.params) total += p.elements * kFloat;
  if (s == "naive" || s == "overlap") {
    for (const ParamSize& p : in.model.params) steps->push_back({"all_reduce", p.elements * kFloat});
    if (s == "overlap") {  // each as its gradient is final, the first parameter's when backward ends
      std::reverse(steps->begin(), steps->end());
      for (size_t i = 0; i + 1 < steps->size(); ++i) (*steps)[i].beside_compute = true;
    }
  } else if (s == "flat") {  // in place: the packed gradients are the buffer
    buffers = in.in_place ? 0 : total;
    if (total > 0) steps->push_back({"all_reduce", total});
  } else if (s == "bucketed") {
    if (in.compress != "none" && in.compress != "bf16" && in.compress != "fp16")
      throw std::invalid_argument("plan: unknown compress '" + in.compress + "' (none, bf16 or fp16)");
    add_buckets(in, in.compress == "none" ? kFloat : 2, &buffers, steps);
  } else if (s == "sharded" && in.variant == "broadcast") {
    add_buckets(in, kFloat, &buffers, steps);
    for (const ParamSize& p : in.model.params) steps->push_back({"broadcast", p.elements * kFloat});
  } else if (s == "sharded" && in.variant == "allgather") {
    const std::vector<int64_t> owned = owned_elements(in);
    const int64_t shard = *std::max_element(owned.begin(), owned.end());
    const int64_t n = in.world_size;
    if (shard > 0) {
      buffers = shard * (n + 1) * kFloat;
      steps->push_back({"reduce_scatter", shard * n * kFloat});
      steps->push_back({"all_gather", shard * n * kFloat});
    }
  } else if (s == "sharded") {
    throw std::invalid_argument("plan: unknown sharded variant '" + in.variant + "' (broadcast or allgather)");
  } else {
    throw std::invalid_argument("plan: no rules for strategy '" + s +
                                "' (the shipped ones: naive, flat, overlap, bucketed, sharded)");
  }
  return buffers;
}

// The transport's own communication buffers, for the step's collectives.
int64_t transport_comm(const RunInput& in, const std::vector<Collective>& steps) {
  if (in.transport == "mpi") return 0;
  if (in.transport == "nccl") return kFloat;  // its barrier's one float, from setup on
  if (in.transport != "gloo")
    throw std::invalid_argument("plan: no rules for transport '" + in.transport + "' (gloo, mpi, nccl)");
  if (in.device != DDP_DEVICE_CPU)
    throw std::invalid_argument("plan: gloo on a GPU stages through host memory, which `ddp plan` does not "
                                "count: plan GPU runs with transport nccl");
  int64_t scratch = 0;
  const int64_t n = in.world_size;
  for (const Collective& c : steps)
    if (c.op == "reduce_scatter") scratch = std::max(scratch, (n - 1) * (c.bytes / n));
  return scratch;
}

}  // namespace

int64_t RunPlan::comm_bytes() const {
  int64_t sum = 0;
  for (const Collective& c : collectives) sum += c.bytes;
  return sum;
}

RunPlan plan_run(const RunInput& in) {
  if (in.world_size < 1) throw std::invalid_argument("plan: world size must be at least 1");
  RunPlan plan;
  const int64_t comm = strategy_comm(in, &plan.collectives);
  const int64_t transport = transport_comm(in, plan.collectives);
  const int64_t per_element = state_bytes_per_element(in);
  const std::vector<int64_t> owned = owned_elements(in);
  int64_t params = 0;
  for (const ParamSize& p : in.model.params) params += p.elements * kFloat;
  const int64_t setup_acts = in.model.setup_activation_bytes + data_bytes(in.model.data, in.rows_per_rank);
  for (int r = 0; r < in.world_size; ++r) {
    RankMemory m;
    m.after_setup = {params, params, 0, comm + (in.transport == "nccl" ? transport : 0), setup_acts};
    m.before_optimizer_step = {params, params, owned[static_cast<size_t>(r)] * per_element, comm + transport,
                               setup_acts + in.model.step_activation_bytes};
    m.after_optimizer_step = m.before_optimizer_step;
    plan.ranks.push_back(m);
  }
  return plan;
}

double collective_seconds(const Collective& c, const strategy::OverheadFit& idle, int world,
                          const strategy::OverheadFit* busy) {
  if (world < 2) return 0.0;  // nothing crosses between ranks
  const strategy::OverheadFit& fit = busy && c.beside_compute ? *busy : idle;
  // An all-reduce of b bytes moves bus_bytes = 2 (N - 1) / N b in b / w: the
  // link moves bus bytes at that rate, whatever the collective.
  const double all_reduce_bus = static_cast<double>(bus_bytes("all_reduce", 1 << 20, world)) / (1 << 20);
  return std::max(0.0, fit.o_s + static_cast<double>(bus_bytes(c.op.c_str(), c.bytes, world)) / all_reduce_bus /
                           fit.w_bytes_per_s);
}

double comm_seconds(const std::vector<Collective>& collectives, const strategy::OverheadFit& fit, int world,
                    const strategy::OverheadFit* busy) {
  double seconds = 0.0;
  for (const Collective& c : collectives)
    seconds += collective_seconds(c, fit, world, busy);
  return seconds;
}

}  // namespace plan
}  // namespace ddp
