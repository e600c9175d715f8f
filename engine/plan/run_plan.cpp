// run_plan.cpp — the rules of run_plan.h.
#include "run_plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "plugin_host.h"  // bus_bytes

namespace ddp {
namespace plan {
namespace {

constexpr int64_t kFloat = 4;

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

int64_t state_bytes_per_element(const RunInput& in) {
  if (in.optimizer == "adamw") return 2 * kFloat;
  if (in.optimizer == "sgd") return in.momentum != 0.0 ? kFloat : 0;
  throw std::invalid_argument("plan: unknown optimizer '" + in.optimizer + "' (sgd or adamw)");
}

void add(Bytes& into, const Bytes& b) {
  for (size_t c = 0; c < into.size(); ++c) into[c] += b[c];
}

// One rank's memory: the engine's own, then what its plugins hold.
RankMemory rank_memory(const RunInput& in, const RankParts& part, int64_t per_element) {
  int64_t params = 0;
  int64_t engine_grads = 0;
  int64_t all = 0;
  int64_t lent = 0;
  const auto values_claimed = [&](size_t i) {
    return i < part.strategy.claimed_values.size() && part.strategy.claimed_values[i];
  };
  for (size_t i = 0; i < in.model.params.size(); ++i) {
    const int64_t n = in.model.params[i].elements;
    params += n * kFloat;
    all += n;
    const bool claimed = i < part.strategy.claimed.size() && part.strategy.claimed[i];
    if (!claimed) engine_grads += n * kFloat;
    if (values_claimed(i)) lent += n * kFloat;
  }
  // Claimed values (1.5): the engine holds its own through set-up, beside
  // what the strategy makes there, and frees them when set-up ends; lent
  // unit by unit (take_values, 1.7), one unit's at a time, the largest.
  int64_t held = lent;
  if (part.strategy.takes_values) {
    held = 0;
    for (const Unit& u : in.model.units) {
      int64_t unit = 0;
      for (size_t i : u.params)
        if (values_claimed(i)) unit += in.model.params[i].elements * kFloat;
      held = std::max(held, unit);
    }
  }
  const int64_t stepped = part.strategy.says_steps ? part.strategy.stepped : part.owns_optimizer ? 0 : all;
  const int64_t setup_acts = in.model.setup_activation_bytes + data_bytes(in.model.data, in.rows_per_rank);
  RankMemory m;
  m.after_setup = {params - lent + held, engine_grads, 0, 0, setup_acts};
  add(m.after_setup, part.strategy.setup);
  add(m.after_setup, part.transport.setup);
  m.before_optimizer_step = m.after_setup;
  m.before_optimizer_step[DDP_MEM_PARAMETERS] -= held;
  m.before_optimizer_step[DDP_MEM_OPTIMIZER_STATE] += stepped * per_element;
  m.before_optimizer_step[DDP_MEM_ACTIVATIONS] += in.model.step_activation_bytes;
  add(m.before_optimizer_step, part.strategy.step);
  add(m.before_optimizer_step, part.transport.step);
  m.after_optimizer_step = m.before_optimizer_step;
  return m;
}

bool same_collectives(const PluginPart& a, const PluginPart& b) {
  if (a.collectives.size() != b.collectives.size() || a.groups != b.groups) return false;
  for (size_t k = 0; k < a.collectives.size(); ++k) {
    const ddp_plan_collective& x = a.collectives[k];
    const ddp_plan_collective& y = b.collectives[k];
    if (x.op != y.op || x.count != y.count || x.dtype != y.dtype) return false;
  }
  return true;
}

}  // namespace

int64_t RunPlan::every() const {
  for (const Collective& c : collectives)
    if (c.every > 1) return c.every;
  return 1;
}

std::vector<Collective> RunPlan::step_collectives(bool periodic) const {
  std::vector<Collective> out;
  for (const Collective& c : collectives)
    if ((c.every > 1) == periodic) out.push_back(c);
  return out;
}

RunPlan plan_run(const RunInput& in, const std::vector<RankParts>& parts) {
  if (in.world_size < 1) throw std::invalid_argument("plan: world size must be at least 1");
  if (parts.size() != size_t(in.world_size))
    throw std::invalid_argument("plan: " + std::to_string(parts.size()) + " ranks' plans for a world of " +
                                std::to_string(in.world_size));
  const int64_t per_element = state_bytes_per_element(in);
  RunPlan plan;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!same_collectives(parts[r].strategy, parts[0].strategy))
      throw std::invalid_argument(parts[r].strategy.label + ": plan: rank " + std::to_string(r) +
                                  " plans other collectives than rank 0 (every rank must issue the same)");
    plan.ranks.push_back(rank_memory(in, parts[r], per_element));
  }
  const PluginPart& strategy = parts[0].strategy;
  for (size_t k = 0; k < strategy.collectives.size(); ++k) {
    plan.collectives.push_back(collective_of(strategy.collectives[k]));
    if (k < strategy.every.size()) plan.collectives.back().every = strategy.every[k];
    if (k < strategy.groups.size()) plan.collectives.back().group = strategy.groups[k];
  }
  for (const PluginPart* p : {&parts[0].strategy, &parts[0].transport})
    if (!p->planned) plan.unplanned.push_back(p->label);
  return plan;
}

double collective_seconds(const Collective& c, const strategy::OverheadFit& idle, int world,
                          const strategy::OverheadFit* busy) {
  world = c.ranks(world);     // a group's collective crosses between its ranks (1.9)
  if (world < 2) return 0.0;  // nothing crosses between ranks
  const strategy::OverheadFit& fit = busy && c.beside_compute ? *busy : idle;
  // An all-reduce of b bytes moves bus_bytes = 2 (N - 1) / N b in b / w: the
  // link moves bus bytes at that rate, whatever the collective.
  const double all_reduce_bus = static_cast<double>(bus_bytes("all_reduce", 1 << 20, world)) / (1 << 20);
  return std::max(
      0.0, fit.o_s + static_cast<double>(bus_bytes(c.op.c_str(), c.bytes, world)) / all_reduce_bus / fit.w_bytes_per_s);
}

double comm_seconds(const std::vector<Collective>& collectives, const strategy::OverheadFit& fit, int world,
                    const strategy::OverheadFit* busy) {
  double seconds = 0.0;
  for (const Collective& c : collectives) seconds += collective_seconds(c, fit, world, busy);
  return seconds;
}

}  // namespace plan
}  // namespace ddp
