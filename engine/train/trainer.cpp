// trainer.cpp — one rank's run (see trainer.h). A step, as the strategy
// sees it (plugin.h's hook order):
//   zero grads → per micro-batch: on_step_begin → forward → backward
//   (on_grad_ready after a parameter's last use) → on_backward_end;
//   then finish → optimizer_step (the strategy's, if it owns it, else the
//   engine's on every trainable parameter: first the groups the strategy
//   said final, grads_final, each once its reduction is done).
// The pieces live beside it: rank_plugins.h (the plugins, their start and
// shutdown order), step_timeline.h (--trace), summary.h (summary.json),
// model_setup.h (model, init, freezing), optimizer.h; the set-up is
// rank_setup.cpp's, and what follows the steps run_end.cpp's.
#include "trainer.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <cblas.h>

#include "agreement.h"
#include "checkpoint.h"
#include "model_setup.h"
#include "nvtx.h"
#include "rank_run.h"
#include "replica_check.h"
#include "schedule.h"
#include "whereabouts.h"

namespace ddp {
namespace {

// Folds the memory peaks of the window that just ended into `into`, then
// opens a new window.
void take_peaks(MemoryTracker& memory, PeakBytes& into) {
  for (int c = 0; c < kMemCategories; ++c) into[c] = std::max(into[c], memory.peak(static_cast<MemCategory>(c)));
  memory.reset_peaks();
}

}  // namespace

void RankRun::run() {
  whereabouts::bind_training_thread();
  try {
    set_up();
    train();
    finish_run();
  } catch (Error& e) {
    if (e.step() < 0) e.at_step(whereabouts::step());
    whereabouts::report_first(e);  // before a teardown that could crash or hang
    stop_plugins();
    throw;
  } catch (const std::exception& e) {
    Error error(words_of(e), kind_of(e));
    error.at_step(whereabouts::step());
    whereabouts::report_first(error);
    stop_plugins();
    throw error;
  }
  plugins_->shutdown();
}

void RankRun::on_unit(size_t unit, ddp_unit_phase phase) {
  if (evaluating_) return;  // a forward of its own: the strategy's units hold their values (not claimed)
  const bool traced = !forward_ranges_.empty();
  if (traced && phase == DDP_UNIT_FORWARD_END) timeline_->range(forward_ranges_[unit].c_str(), unit_begin_);
  plugins_->on_unit(unit, phase);
  if (traced && phase == DDP_UNIT_FORWARD_BEGIN) unit_begin_ = timeline_->mark();
}

void RankRun::train() {
  if (observer_) observer_->on_weights(-1, initial_snapshot());
  ParamStore& store = services_.params;
  store.claims_open = true;  // a strategy may claim gradient storage here
  plugins_->on_train_begin();
  store.claims_open = false;
  store.after_train_begin([this](size_t i) { return initial_->make(i, *device_); });
  put_back_resumed_state();
  initial_.reset();  // every value has been made: a resumed checkpoint's file closes
  if (observer_) observer_->on_weights(0, store.host_values("a snapshot"));
  take_peaks(device_->memory(), mem_after_setup_);
  // The records of the first steps, reserved (growing past them is rare and
  // cheap; reserving run.steps = 1e8 records would be 12 GB of address space).
  records_.reserve(static_cast<size_t>(std::min<int64_t>(config_.run.steps, int64_t(1) << 16)));
  if (eval_data_ && store.visit_is_collective())
    throw Error(std::string("eval.every: strategy plugin '") + plugins_->strategy_name() +
                    "' holds the parameters' values (it claimed them), and evaluating reads the whole model: "
                    "not supported yet; set eval.every = 0",
                DDP_ERR_UNSUPPORTED);
  for (int64_t step = start_step_; step < config_.run.steps; ++step) {
    whereabouts::enter_step(step);
    records_.push_back(train_step(step));
    if (step == start_step_) optimizer_->drop_unclaimed();  // a resumed run's state not this rank's
    if (observer_) observer_->on_weights(step + 1, store.host_values("a snapshot"));
    after_step(step);
  }
  whereabouts::enter_step(-1);  // what follows is the end of the run, not a step
  if (eval_due_ && env_.rank.rank == 0)
    std::printf("note: the held-out loss due at the end was not evaluated: the run ended between sync points\n");
  optimizer_->drop_unclaimed();  // (a run resumed at its last step stepped nothing: its files close)
  plugins_->on_train_end();
  // The end of the run is checked where the replicas are equal then, unless
  // its last step was just checked.
  const bool equal = records_.empty() ? !plugins_->divergent() : records_.back().synced;
  if (equal && (replica_checked_after_.empty() || replica_checked_after_.back() != config_.run.steps))
    check_replicas(-1);
  weights_synced_ = equal;
  if (!equal && env_.rank.rank == 0)
    std::printf("note: %s\n", unsynced_weights_note(plugins_->strategy_name(), config_.run.steps).c_str());
  {
    whereabouts::Inside in(nullptr, "waiting for the last collectives");
    device_->comm_stream().synchronize();
  }
  // A GPU's collectives still unsettled (a step's last ones may end after
  // it): their busy time goes to the last step.
  const int64_t busy_before = services_.counters.busy_ns;
  plugins_->metered().settle(/*wait=*/true);
  if (!records_.empty()) records_.back().comm_busy_s += double(services_.counters.busy_ns - busy_before) * 1e-9;
}

// What follows a step: held-out loss and replica check when due (every
// eval.every or run.check_replicas_every steps, at the first sync point
// from there: each step is one but under a divergent strategy), the
// progress line, a checkpoint.
void RankRun::after_step(int64_t step) {
  const int64_t done = step + 1;
  const int64_t steps = config_.run.steps;
  const bool synced = records_.back().synced;
  eval_due_ |= eval_data_ && (done % config_.eval.every == 0 || done == steps);
  if (eval_due_ && synced) {
    records_.back().val_loss = evaluate();
    eval_due_ = false;
  }
  if (done % config_.run.log_every == 0 || done == steps || !std::isnan(records_.back().val_loss)) report(step);
  const int64_t every = config_.run.check_replicas_every;
  check_due_ |= every > 0 && done % every == 0;
  if (check_due_ && synced) {
    check_replicas(step);
    check_due_ = false;
  }
  const int64_t checkpoint_every = config_.checkpoint.every;
  if (checkpoint_every > 0 && (done % checkpoint_every == 0 || done == steps)) checkpoint(done);  // and at the end
}

StepRecord RankRun::train_step(int64_t step) {
  StepRecord rec;
  const CommCounters& c = services_.counters;
  const Before before{c.blocked_ns, c.busy_ns, c.collectives, c.bytes, c.bus_bytes, device_->memory().allocations()};
  timeline_->begin_step(step);
  const auto t0 = Clock::now();
  const StepTimeline::Mark m0 = timeline_->mark();
  const bool params_changed = unfreeze(step);
  rec.lr = scheduled_lr(config_.lr_schedule, config_.optimizer.lr, step);
  optimizer_->begin_step(rec.lr / config_.optimizer.lr);
  services_.begin_finals();
  services_.params.zero_grads();  // the engine's own (a claimed one is the strategy's to clear)
  // Micro-batches accumulate into the gradients; each one's loss is scaled
  // by 1/k so the sum is the gradient of the mean over k x the batch.
  const int64_t k = config_.run.grad_accum_steps;
  // (A test's injected overflow: this rank's loss inf, every gradient inf or NaN.)
  const bool overflow = observer_ && observer_->overflow(step);
  const float seed = overflow ? INFINITY : float(scale_.scale) / float(k);
  ddp_step_info info{};
  for (int64_t micro = 0; micro < k; ++micro) {
    const bool sync = micro == k - 1;
    if (sync) rec.collectives_before_sync_micro_batch = c.collectives - before.collectives;
    info = ddp_step_info{sizeof(ddp_step_info), step,
                         int32_t(micro),        int32_t(k),
                         sync ? 1 : 0,          params_changed && micro == 0 ? 1 : 0,
                         config_.run.steps,     config_.precision.loss_scale ? scale_.scale : 1.0};
    StepTimeline::Mark m = timeline_->mark();
    services_.finals_open = sync;               // grads_final: from here until finish returns
    services_.params.claims_open = micro == 0;  // before anything is written into the gradients
    plugins_->on_step_begin(info);
    services_.params.claims_open = false;
    if (micro == 0) services_.params.after_step_begin(params_changed);
    timeline_->range("on_step_begin", m);
    const auto t = Clock::now();
    const Batch batch = data_->batch(step * k + micro);
    rec.data_s += seconds_since(t);
    if (overflow) rec.loss = INFINITY;
    forward(batch, k, rec);
    backward(seed, before.collectives, rec);
    m = timeline_->mark();
    plugins_->on_backward_end();
    timeline_->range("on_backward_end", m);
  }
  const StepTimeline::Mark m = timeline_->mark();
  plugins_->finish();
  services_.finals_open = false;
  timeline_->range("finish", m);
  if (config_.precision.loss_scale) {
    unscale_gradients(rec);
  } else if (config_.optimizer.clip_grad_norm > 0) {
    rec.grad_norm = gradient_norm(/*clip=*/true);
  }
  take_peaks(device_->memory(), mem_before_optimizer_);
  optimizer_step(rec);
  // Without clipping, measured on the CPU only, where AdamW's update has
  // measured most of it already; on a GPU it would be a pass of its own
  // over every gradient each step (summary: null).
  if (config_.optimizer.clip_grad_norm == 0 && !config_.precision.loss_scale && device_->kind() == DDP_DEVICE_CPU)
    rec.grad_norm = gradient_norm(/*clip=*/false);
  const StepTimeline::Mark end = timeline_->mark();
  rec.synced = plugins_->on_step_end(info);  // (1.8) a strategy may average here: its bytes are the step's
  services_.step_skipped = false;
  timeline_->range("on_step_end", end);
  take_peaks(device_->memory(), mem_after_optimizer_);
  rec.step_s = seconds_since(t0);
  timeline_->range("step", m0);
  timeline_->end_step();
  rec.comm_blocked_s = (c.blocked_ns - before.blocked_ns) * 1e-9;
  rec.comm_busy_s = (c.busy_ns - before.busy_ns) * 1e-9;
  rec.collectives = c.collectives - before.collectives;
  rec.comm_bytes = c.bytes - before.bytes;
  rec.bus_bytes = c.bus_bytes - before.bus_bytes;
  rec.comm_buffer_bytes = int64_t(device_->memory().current(MemCategory::CommBuffers));
  rec.device_allocations = device_->memory().allocations() - before.allocations;
  rec.largest_collective_bytes = c.largest;
  return rec;
}

void RankRun::forward(const Batch& batch, int64_t k, StepRecord& rec) {
  const auto t = Clock::now();
  const StepTimeline::Mark m = timeline_->mark();
  {
    nvtx::Range range("forward");
    rec.loss += model_->forward(batch) / double(k);
  }
  rec.forward_s += seconds_since(t);
  timeline_->range("forward", m);
  // (Under loss scaling a non-finite loss is an fp16 overflow like any
  // other: its step is skipped, and a scale that keeps falling stops the run.)
  if (config_.run.check_finite && !config_.precision.loss_scale && !std::isfinite(rec.loss)) {
    const ParamStore& store = services_.params;
    std::vector<std::string> names;
    for (const Parameter& p : model_->params()) names.push_back(p.name);
    const bool readable = !store.visit_is_collective();  // (this rank alone cannot make a collective read)
    const auto values = readable ? store.host_values("run.check_finite") : std::vector<std::vector<float>>{};
    throw Error(non_finite_loss(rec.loss, names, readable ? &values : nullptr));
  }
}

void RankRun::backward(float seed, int64_t collectives_at_start, StepRecord& rec) {
  const auto t = Clock::now();
  const StepTimeline::Mark m = timeline_->mark();
  timeline_->start_layers(m);  // the model's per-layer ranges start here
  {
    nvtx::Range range("backward");
    auto& params = model_->params();
    for (size_t i = 0; i < params.size(); ++i) remaining_uses_[i] = params[i].uses;
    model_->backward(seed, [&](size_t index) {
      if (--remaining_uses_[index] != 0) return;
      rec.collectives_before_last_grad_ready = services_.counters.collectives - collectives_at_start;
      plugins_->on_grad_ready(services_.params.param_table[index]);
    });
    // On a GPU backward has only been enqueued: wait for it, so that
    // backward_s is its time and the strategy's waits (comm_blocked_s) are
    // communication only. (The CPU's compute stream is this thread: a no-op.)
    device_->compute_stream().synchronize();
  }
  timeline_->range("backward", m);
  rec.backward_s += seconds_since(t);  // the model's backward, as the trace's range
}

void RankRun::optimizer_step(StepRecord& rec) {
  const auto t = Clock::now();
  const StepTimeline::Mark m = timeline_->mark();
  const int64_t blocked_before = services_.counters.blocked_ns;
  {
    nvtx::Range range("optimizer");
    if (plugins_->owns_optimizer()) {
      plugins_->optimizer_step();
    } else {
      step_in_final_order();
    }
  }
  // A strategy's optimizer_step may wait for communication (bucketed waits
  // for each bucket); that wait is exposed communication, not optimizer.
  // The step ends when the device has done it (a no-op on the CPU, whose
  // compute stream is the training thread).
  device_->compute_stream().synchronize();
  // A strategy may order compute after communication on the device
  // (stream_wait_event), which on a GPU carries no failure across: a
  // collective of this step that failed fails the step here.
  Stream& comm = device_->comm_stream();
  if (comm.failed()) throw Error(comm.error(), comm.error_kind());
  plugins_->metered().settle(/*wait=*/false);  // a GPU's collectives the device has done
  rec.optimizer_s = seconds_since(t) - (services_.counters.blocked_ns - blocked_before) * 1e-9;
  timeline_->range("optimizer", m);
}

// The engine's optimizer step: each group the strategy said final
// (grads_final), in its order, once its reduction is done, so that its
// update overlaps the reductions still running; then every trainable
// parameter none named. The update is per parameter: the order changes no
// result.
void RankRun::step_in_final_order() {
  if (services_.finals_said == 0) {
    optimizer_->step(model_->params(), trainable_);
    return;
  }
  for (size_t k = 0; k < services_.finals_said; ++k) {
    services_.wait_final(k);
    optimizer_->step(model_->params(), services_.finals[k].params);
  }
  unnamed_.clear();
  for (size_t i : trainable_)
    if (!services_.final_named[i]) unnamed_.push_back(i);
  if (!unnamed_.empty()) optimizer_->step(model_->params(), unnamed_);
}

void RankRun::unscale_gradients(StepRecord& rec) {
  rec.loss_scale = scale_.scale;
  // The norm of the unscaled gradients (clipped only where configured): not
  // finite, or beyond a float's range (an unscaled element may be), is an
  // overflow.
  bool global = false;
  const double norm = gradient_norm(/*clip=*/true, 1.0 / scale_.scale, &global);
  const int world = env_.rank.world_size;
  std::vector<double> found(size_t(world), norm <= FLT_MAX ? 0.0 : 1.0);  // (NaN: found)
  // Every rank decides alike: a norm made of every rank's part already is
  // every rank's verdict; else the ranks gather theirs.
  if (world > 1 && !global) plugins_->step_all_gather(std::vector<double>{found[0]}, found);
  rec.step_skipped = std::any_of(found.begin(), found.end(), [](double f) { return f != 0.0; });
  services_.step_skipped = rec.step_skipped;      // ddp_host::step_skipped, until on_step_end returns
  if (rec.step_skipped) optimizer_->skip_step();  // run_optimizer* update nothing this step
  rec.grad_norm = rec.step_skipped ? NAN : norm;
  scale_ = next_loss_scale(scale_, config_.precision, rec.step_skipped);
  if (rec.step_skipped && env_.rank.rank == 0)
    std::printf("note: step %lld skipped: a gradient held inf or NaN (on some rank); loss scale %g -> %g\n",
                static_cast<long long>(whereabouts::step() + 1), rec.loss_scale, scale_.scale);
  if (scale_.scale < FLT_MIN)  // (the same verdicts on every rank: every rank stops here)
    throw Error("precision.loss_scale: the scale fell below FLT_MIN (" + std::to_string(scale_.skipped_steps) +
                    " steps skipped in the run): the gradients overflow whatever the scale (a diverged model, or a "
                    "batch whose loss is inf or NaN), not for want of range",
                DDP_ERR_INVALID_ARGUMENT);
}

double RankRun::gradient_norm(bool clip, double unscale, bool* global) {
  if (clip) {
    whereabouts::Inside in(nullptr, "waiting for the gradients to clip or unscale");
    device_->comm_stream().synchronize();
  }
  const bool gather = held_gradients(spans_);
  if (global) *global = gather;
  // held_ranges (1.9): what every rank holds travels with the norm's
  // gather, checked to cover each trainable parameter once.
  const bool check = plugins_->has_held_ranges();
  return clip_gradients(
      spans_, gather, clip ? config_.optimizer.clip_grad_norm : 0.0, *device_, env_.rank.world_size,
      [this, check](const std::vector<double>& mine, std::vector<double>& all) {
        if (check) return gather_checking_coverage(mine, all);
        plugins_->step_all_gather(mine, all);
      },
      &optimizer_->grad_squares(), unscale);  // what this step's update measured
}

// The norm's all-gather, with every rank's held_once of its spans beside
// its part: refused by name where the ranks do not hold each trainable
// parameter's averaged gradient once (a wrong norm, a clip that misses).
void RankRun::gather_checking_coverage(const std::vector<double>& mine, std::vector<double>& all) {
  const auto& params = model_->params();
  std::vector<double> send = mine;
  const std::vector<double> held = held_once(spans_, params.size());
  send.insert(send.end(), held.begin(), held.end());
  const size_t world = size_t(env_.rank.world_size);
  const size_t stride = send.size();
  std::vector<double> got(stride * world);
  std::vector<double> every;
  plugins_->step_all_gather(send, got);
  std::vector<size_t> numel;
  std::vector<bool> trainable;
  std::vector<std::string> names;
  for (const Parameter& p : params) {
    numel.push_back(p.data.numel() ? p.data.numel() : numel_of(p.shape));
    trainable.push_back(p.trainable);
    names.push_back(p.name);
  }
  for (size_t r = 0; r < world; ++r) {
    for (size_t k = 0; k < mine.size(); ++k) all[r * mine.size() + k] = got[r * stride + k];
    every.insert(every.end(), got.begin() + long(r * stride + mine.size()), got.begin() + long((r + 1) * stride));
  }
  const std::string problem = coverage_problem(every, int(world), numel, trainable, names);
  if (!problem.empty())
    throw Error(std::string("strategy plugin '") + plugins_->strategy_name() + "': held_ranges: " + problem,
                DDP_ERR_INVALID_ARGUMENT);
}

// The averaged gradients this rank holds, into `spans`: where the strategy
// says (held_ranges, 1.9), those; else the engine's own gradients of the
// trainable parameters (those the strategy's held_grads names, where it
// partitions them), then the ranges of the storage it claimed
// (grad_ranges). Whether the norm adds every rank's.
bool RankRun::held_gradients(std::vector<GradSpan>& spans) {
  spans.clear();
  if (plugins_->has_held_ranges()) return held_ranges(spans);
  const int world = env_.rank.world_size;
  const std::optional<std::vector<size_t>> held = plugins_->held_grads();
  const bool partitioned = services_.params.grad_spans(
      held ? *held : trainable_, held ? 1 : world, world, [this] { return plugins_->grad_ranges(); },
      plugins_->strategy_name(), spans);
  return held.has_value() || partitioned;
}

// held_ranges (1.9): each range checked against the table, the engine's
// own gradient where its grad is NULL. Every rank gathers: the strategy
// has the entry on every rank.
bool RankRun::held_ranges(std::vector<GradSpan>& spans) {
  auto& params = model_->params();
  const std::vector<ddp_held_range> held = plugins_->held_ranges();
  for (size_t k = 0; k < held.size(); ++k) {
    GradSpan span;
    const std::string wrong = services_.params.held_span(held[k], env_.rank.world_size, span);
    if (!wrong.empty())
      throw Error(std::string("strategy plugin '") + plugins_->strategy_name() + "': held_ranges: range " +
                      std::to_string(k) + " " + wrong + " (of a world of " + std::to_string(env_.rank.world_size) + ")",
                  DDP_ERR_INVALID_ARGUMENT);
    spans.push_back(span);
  }
  std::vector<std::string> names;
  for (const Parameter& q : params) names.push_back(q.name);
  const std::string overlap = overlapping_spans(spans, names);
  if (!overlap.empty())
    throw Error(std::string("strategy plugin '") + plugins_->strategy_name() + "': held_ranges: " + overlap +
                    ": each element this rank holds is named once",
                DDP_ERR_INVALID_ARGUMENT);
  return true;
}

bool RankRun::unfreeze(int64_t step) {
  // A strategy that may claim gradients claims the new ones in on_step_begin;
  // the engine makes those it still holds after that (train_step).
  if (!apply_unfreeze(config_.unfreeze, step, *model_, *device_, services_.params.engine_makes_new_grads()))
    return false;
  services_.params.refresh_param_table();
  refresh_trainable();
  return true;
}

void RankRun::refresh_trainable() {
  trainable_.clear();
  for (size_t i = 0; i < model_->params().size(); ++i)
    if (model_->params()[i].trainable) trainable_.push_back(i);
}
void train_rank(const Config& config, const RankEnv& env, TrainObserver* observer) {
  RankRun(config, env, observer).run();
}

}  // namespace ddp
