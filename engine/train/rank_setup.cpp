// rank_setup.cpp — one rank's set-up (rank_run.h): the device, the model
// and its first values, the data, the optimizer, the rendezvous store and
// the plugins, in the order the ABI gives them life; and the values a
// strategy takes unit by unit (take_values). The steps are trainer.cpp's.
#include <algorithm>
#include <cstdlib>

#include <cblas.h>

#include "agreement.h"
#include "checkpoint.h"
#include "env.h"
#include "model_setup.h"
#include "rank_run.h"
#include "whereabouts.h"

namespace ddp {

void RankRun::set_up() {
  const RankInfo& r = env_.rank;
  openblas_set_num_threads(config_.run.threads);
  device_ = make_device(config_.run.device, r.local_rank, config_.run.share_gpus);
  DataShape shape;
  model_ = set_up_model(config_, *device_, config_.run.seed + static_cast<uint64_t>(r.rank), &shape, &initial_);
  tokens_per_row_ = shape.kind == DataShape::Tokens ? shape.context : 1;
  set_up_timeline();
  // Batches are host memory (the models upload what they use): on a GPU
  // run the data's buffers come from a host device of their own.
  if (device_->kind() != DDP_DEVICE_CPU) host_device_ = std::make_unique<CpuDevice>();
  data_ = make_dataset(config_, shape, r.rank, r.world_size, host_device_ ? *host_device_ : *device_);
  if (config_.eval.every > 0) {
    eval_data_ = make_eval_dataset(config_, shape, r.rank, r.world_size, host_device_ ? *host_device_ : *device_);
    const std::string source = config_.eval.path.empty() ? config_.data.path : config_.eval.path;
    if (const std::string beyond =
            eval_batches_beyond(config_.eval.batches, config_.data.batch_size, eval_data_->rows());
        !beyond.empty())
      throw ConfigError(source + ": " + beyond);
    for (int64_t b = 0; b < config_.eval.batches; ++b) eval_data_->batch(b);  // a bad row fails now, not later
  }
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, *device_, model_->params());
  check_unfreeze(config_.unfreeze, *model_, config_.model.name);
  if (config_.resume.empty())
    refuse_foreign_checkpoints(config_);
  else
    resume();
  store_ = std::make_unique<Store>(env_.rendezvous, env_.run_id,
                                   std::chrono::milliseconds(int64_t(config_.run.timeout_s * 1000)));
  store_->claim(r.rank, r.world_size);
  services_.rank = r;
  services_.device = device_.get();
  services_.model = model_.get();
  services_.params.attach(model_.get(), device_.get());
  services_.store = store_.get();
  services_.timeout_ms = static_cast<int64_t>(config_.run.timeout_s * 1000);
  services_.precision = abi_precision(config_.precision);
  services_.run_optimizer = [this](const size_t* indices, size_t count) {
    optimizer_->step(model_->params(), indices, count);
  };
  services_.run_optimizer_ranges = [this](const ddp_range* ranges, size_t count) {
    step_ranges_.clear();  // reserved below: nothing allocated once settled
    for (size_t k = 0; k < count; ++k)
      step_ranges_.push_back(StepRange{ranges[k].param, ranges[k].offset, ranges[k].count,
                                       static_cast<const float*>(ranges[k].grad), static_cast<float*>(ranges[k].data)});
    optimizer_->step_ranges(model_->params(), step_ranges_.data(), step_ranges_.size());
  };
  step_ranges_.reserve(4 * model_->params().size());
  services_.params.refresh_param_table();
  refresh_trainable();
  plugins_ = std::make_unique<RankPlugins>(config_, services_);
  if (resumed_.divergent && !plugins_->divergent())
    throw ConfigError("--resume " + resumed_from_ + ": it holds each rank's own replica (strategy '" +
                      resumed_.strategy + "' lets them differ), and strategy plugin '" + plugins_->strategy_name() +
                      "' keeps the replicas equal: resume it with a strategy whose replicas may differ "
                      "(DDP_CAP_DIVERGENT)");
  ParamStore& store = services_.params;
  store.set_rights(StorageRights{plugins_->owns_gradients(), plugins_->takes_values(),
                                 [this](size_t unit, bool hold) { plugins_->unit_values(unit, hold); },
                                 [this](size_t unit) { plugins_->take_values(unit); }});
  const auto make = [this](size_t i) { return initial_->make(i, *device_); };
  // The values, and the engine's gradients: before create, as ever, where
  // the strategy cannot claim them; after it where it may, once it knows
  // which it holds (then a claimed gradient is never made).
  store.make_values(make, /*after_create=*/false);
  store.pack_gradients(/*after_create=*/false);
  store.claims_open = true;        // a strategy may claim gradient storage in create,
  store.value_claims_open = true;  // and parameter values (ABI 1.5)
  plugins_->start(config_, timeline_->trace());
  store.claims_open = false;
  store.value_claims_open = false;
  store.make_values(make, /*after_create=*/true);  // those the strategy did not claim
  store.pack_gradients(/*after_create=*/true);
  model_->set_unit_hook([this](size_t unit, ddp_unit_phase phase) { on_unit(unit, phase); });
  agree_before_training(*store_, r, fingerprint(config_, model_->params(), plugins_->identity(), model_->units()));
  remaining_uses_.assign(model_->params().size(), 0);
}

std::vector<std::vector<float>> RankRun::initial_snapshot() {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < model_->params().size(); ++i) {
    const Parameter& p = model_->params()[i];
    if (p.data.defined()) {
      out.push_back(p.data.to_host());
      continue;
    }
    out.emplace_back(numel_of(p.shape));  // to be lent unit by unit (take_values): not made yet
    initial_->fill(i, out.back().data());
  }
  return out;
}

void RankRun::set_up_timeline() {
  std::unique_ptr<Trace> trace;
  if (const std::string& path = ddp::env().trace; !path.empty()) {  // DDP_TRACE
    trace_path_ = path;
    // Room for every step's ranges and collectives (about one per parameter each).
    const size_t per_step =
        size_t(config_.run.grad_accum_steps + 1) * (model_->params().size() + model_->units().size() + 8);
    trace = std::make_unique<Trace>(env_.rank.rank, std::min<size_t>(size_t(config_.run.steps) * per_step, 1 << 20));
    model_->set_range_hook([this](const char* name, Clock::time_point begin, Clock::time_point end) {
      timeline_->layer(name, begin, end);
    });
    for (const Unit& u : model_->units()) forward_ranges_.push_back("forward " + u.name);
  }
  timeline_ = std::make_unique<StepTimeline>(std::move(trace), device_->compute_stream());
}

}  // namespace ddp
