// config_plan.h — a run's plan (run_plan.h) from its config, as `ddp run`
// reads it: the model's footprint at the config's rows per rank, and each
// rank's plugins' parts from their plan entries. What `ddp plan` prints and
// what `ddp run` checks against this host's memory before any rank starts
// (fit_check.h).
#pragma once

#include "config.h"
#include "model.h"
#include "plugin_plan.h"
#include "run_plan.h"

namespace ddp {

// Loads the config's plugins and checks them as `ddp run` does (keys
// against their declarations, the run's device against their caps). Throws
// ConfigError / Error naming the config's file; std::invalid_argument for
// what run_plan.h cannot plan.
// `check_keys` false: keys of the plugins' tables that their plan entries
// did not read are let be (the fit check's variants of a config: stage 3
// of a table written for stage 1).
plan::RunPlan plan_config(const Config& c, const Footprint& model, bool check_keys = true);

// The run a plan entry is told of (the planning host's), as the config
// says: world, device, timeout, micro-batches, whether the engine waits
// for every gradient (clipping, loss scaling), [precision]; its model is
// the caller's to set. Pure.
plan::PlanRun plan_run_of(const Config& c);

// The model's footprint at the config's rows per rank and compute dtype;
// throws Error naming the config's file.
Footprint config_footprint(const Config& c);

}  // namespace ddp
