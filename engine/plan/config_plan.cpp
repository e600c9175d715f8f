// config_plan.cpp — see config_plan.h.
#include "config_plan.h"

#include <memory>
#include <utility>

#include "error.h"
#include "plugin_host.h"
#include "plugin_loader.h"
#include "plugin_plan.h"
#include "registry.h"
#include "whereabouts.h"

namespace ddp {
namespace {

// The plugins the run would load, loaded and checked as `ddp run` checks
// them (keys against their declarations, the run's device against their
// caps): strategy, then transport.
std::pair<std::unique_ptr<LoadedPlugin>, std::unique_ptr<LoadedPlugin>> load_plugins(const Config& c) {
  auto strategy = load_and_check(PluginKind::Strategy, c.strategy_plugin, c.strategy);
  auto transport = load_and_check(PluginKind::Transport, c.transport_plugin, c.transport);
  const std::pair<const char*, uint64_t> caps[] = {{"strategy", strategy->strategy()->caps},
                                                   {"transport", transport->transport()->caps}};
  for (const auto& [kind, bits] : caps)
    if (!supports_device(bits, c.run.device))
      throw ConfigError(c.file + ": " + kind + " plugin '" + (kind[0] == 's' ? c.strategy_plugin : c.transport_plugin) +
                        "' does not run on run.device = \"" + (c.run.device == DDP_DEVICE_CUDA ? "cuda" : "cpu") +
                        "\"");
  const std::string reduce = reduce_refusal(strategy->strategy()->caps, c.precision.reduce, c.strategy_plugin);
  if (!reduce.empty()) throw ConfigError(c.file + ": " + reduce);
  return {std::move(strategy), std::move(transport)};
}

}  // namespace

plan::PlanRun plan_run_of(const Config& c) {
  plan::PlanRun run;
  run.world = c.run.world_size;
  run.device = c.run.device;
  run.timeout_ms = int64_t(c.run.timeout_s * 1000);
  run.micro_steps = int(c.run.grad_accum_steps);
  run.clips = c.optimizer.clip_grad_norm > 0 || c.precision.loss_scale;  // both wait for every gradient
  run.precision = abi_precision(c.precision);
  return run;
}

// The engine's part, and each rank's plugins' (their plan entries, through
// plugin_plan.h).
plan::RunPlan plan_config(const Config& c, const Footprint& model, bool check_keys) {
  const auto [strategy, transport] = load_plugins(c);
  plan::RunInput in;
  in.model = model;
  in.world_size = c.run.world_size;
  in.rows_per_rank = c.data.batch_size / c.run.world_size;
  in.optimizer = c.optimizer.name;
  in.momentum = c.optimizer.momentum;
  plan::PlanRun run = plan_run_of(c);
  run.model = &in.model;
  std::vector<plan::RankParts> parts;
  // Where a plan entry that exits, crashes or hangs is (isolated.h).
  const char* const strategy_label = whereabouts::intern("strategy plugin '" + strategy->path() + "'");
  const char* const transport_label = whereabouts::intern("transport plugin '" + transport->path() + "'");
  for (int r = 0; r < c.run.world_size; ++r) {
    plan::RankParts p;
    try {
      {
        const whereabouts::Inside in(strategy_label, "plan");
        p.strategy = plan::plan_strategy(*strategy->strategy(), *transport->transport(), c.strategy, run, r);
      }
      const whereabouts::Inside in(transport_label, "plan");
      p.transport =
          plan::plan_transport(*transport->transport(), c.transport, run, r, p.strategy.collectives, p.strategy.groups);
    } catch (const Error& e) {  // the plugin's words, in the config's file
      throw Error(c.file + ": " + e.what(), e.status());
    }
    p.owns_optimizer = (strategy->strategy()->caps & DDP_CAP_OWNS_OPTIMIZER) != 0;
    parts.push_back(std::move(p));
  }
  // A plugin that plans reads its keys as it does when it starts: a key it
  // did not read is refused here as `ddp run` would refuse it.
  if (check_keys && parts[0].strategy.planned) c.strategy.check_all_read("strategy", strategy->strategy()->name);
  if (check_keys && parts[0].transport.planned) c.transport.check_all_read("transport", transport->transport()->name);
  plan::RunPlan p = plan::plan_run(in, parts);
  p.leaner = parts[0].strategy.leaner;
  return p;
}

Footprint config_footprint(const Config& c) {
  try {
    return model_footprint(c.model.name, c.model.options, c.data.batch_size / c.run.world_size, c.run.device,
                           c.precision.compute);
  } catch (const Error& e) {
    throw Error(c.file + ": " + e.what());
  }
}

}  // namespace ddp
