// trainer.cpp — one rank's run (see trainer.h). A step, as the strategy
// sees it (plugin.h's hook order):
//   zero grads → per micro-batch: on_step_begin → forward → backward
//   (on_grad_ready after a parameter's last use) → on_backward_end;
//   then finish → optimizer_step (the strategy's, if it owns it, else the
//   engine's on every trainable parameter).
// The pieces live beside it: rank_plugins.h (the plugins, their start and
// shutdown order), step_timeline.h (--trace), summary.h (summary.json),
// model_setup.h (model, init, freezing), optimizer.h.
#include "trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <cblas.h>

#include "agreement.h"
#include "checkpoint.h"
#include "data.h"
#include "layers.h"  // blas_kernel_loaded, blas_build
#include "model_setup.h"
#include "nvtx.h"
#include "optimizer.h"
#include "rank_plugins.h"
#include "replica_check.h"
#include "safetensors.h"
#include "schedule.h"
#include "step_timeline.h"
#include "store.h"
#include "summary.h"
#include "whereabouts.h"

namespace ddp {
namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Folds the memory peaks of the window that just ended into `into`, then
// opens a new window.
void take_peaks(MemoryTracker& memory, PeakBytes& into) {
  for (int c = 0; c < kMemCategories; ++c) into[c] = std::max(into[c], memory.peak(static_cast<MemCategory>(c)));
  memory.reset_peaks();
}

class RankRun {
 public:
  RankRun(const Config& config, const RankEnv& env, TrainObserver* observer)
      : config_(config), env_(env), observer_(observer) {}

  // Set-up, the steps, the outputs. On any failure the plugins are aborted
  // and shut down before the error (with the step it happened in) goes on.
  void run() {
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
      Error error(e.what(), kind_of(e));
      error.at_step(whereabouts::step());
      whereabouts::report_first(error);
      stop_plugins();
      throw error;
    }
    plugins_->shutdown();
  }

 private:
  void set_up() {
    const RankInfo& r = env_.rank;
    openblas_set_num_threads(config_.run.threads);
    device_ = make_device(config_.run.device, r.local_rank, config_.run.share_gpus);
    DataShape shape;
    model_ = set_up_model(config_, *device_, config_.run.seed + static_cast<uint64_t>(r.rank), &shape);
    tokens_per_row_ = shape.kind == DataShape::Tokens ? shape.context : 1;
    set_up_timeline();
    // Batches are host memory (the models upload what they use): on a GPU
    // run the data's buffers come from a host device of their own.
    if (device_->kind() != DDP_DEVICE_CPU) host_device_ = std::make_unique<CpuDevice>();
    data_ = make_dataset(config_, shape, r.rank, r.world_size, host_device_ ? *host_device_ : *device_);
    optimizer_ = std::make_unique<Optimizer>(config_.optimizer, *device_, model_->params());
    check_unfreeze(config_.unfreeze, *model_, config_.model.name);
    if (config_.resume.empty()) refuse_foreign_checkpoints(config_);
    else resume();
    store_ = std::make_unique<Store>(env_.rendezvous, env_.run_id,
                                     std::chrono::milliseconds(int64_t(config_.run.timeout_s * 1000)));
    store_->claim(r.rank);
    services_.rank = r;
    services_.device = device_.get();
    services_.model = model_.get();
    services_.store = store_.get();
    services_.timeout_ms = static_cast<int64_t>(config_.run.timeout_s * 1000);
    services_.run_optimizer = [this](const size_t* indices, size_t count) {
      optimizer_->step(model_->params(), indices, count);
    };
    services_.refresh_param_table();
    refresh_trainable();
    plugins_ = std::make_unique<RankPlugins>(config_, services_);
    plugins_->start(config_, timeline_->trace());
    agree_before_training(*store_, r, fingerprint(config_, model_->params(), plugins_->identity()));
    remaining_uses_.assign(model_->params().size(), 0);
  }

  // `ddp run --trace`: the launcher names this rank's trace file.
  void set_up_timeline() {
    std::unique_ptr<Trace> trace;
    if (const char* path = std::getenv("DDP_TRACE"); path && *path) {
      trace_path_ = path;
      // Room for every step's ranges and collectives (about one per parameter each).
      const size_t per_step = size_t(config_.run.grad_accum_steps + 1) * (model_->params().size() + 8);
      trace = std::make_unique<Trace>(env_.rank.rank, std::min<size_t>(size_t(config_.run.steps) * per_step, 1 << 20));
      model_->set_range_hook([this](const char* name, Clock::time_point begin, Clock::time_point end) {
        timeline_->layer(name, begin, end);
      });
    }
    timeline_ = std::make_unique<StepTimeline>(std::move(trace), device_->compute_stream());
  }

  void train() {
    if (observer_) observer_->on_weights(-1, *model_);
    plugins_->on_train_begin();
    if (observer_) observer_->on_weights(0, *model_);
    take_peaks(device_->memory(), mem_after_setup_);
    records_.reserve(static_cast<size_t>(config_.run.steps));
    const int64_t every = config_.run.check_replicas_every;
    const int64_t checkpoint_every = config_.checkpoint.every;
    for (int64_t step = start_step_; step < config_.run.steps; ++step) {
      whereabouts::enter_step(step);
      records_.push_back(train_step(step));
      if (step == start_step_) optimizer_->drop_unclaimed();  // a resumed run's state not this rank's
      if (observer_) observer_->on_weights(step + 1, *model_);
      if ((step + 1) % config_.run.log_every == 0 || step + 1 == config_.run.steps) report(step);
      if (every > 0 && (step + 1) % every == 0) check_replicas(step);
      if (checkpoint_every > 0 && ((step + 1) % checkpoint_every == 0 || step + 1 == config_.run.steps))
        checkpoint(step + 1);  // and at the end, to go on from
    }
    whereabouts::enter_step(-1);  // what follows is the end of the run, not a step
    const int64_t steps = config_.run.steps;
    if (steps == start_step_ || every == 0 || steps % every != 0) check_replicas(-1);  // unless the last step was checked
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

  // The communication counters and allocations at the start of a step.
  struct Before {
    int64_t blocked_ns, busy_ns, collectives, bytes, bus_bytes, allocations;
  };

  StepRecord train_step(int64_t step) {
    StepRecord rec;
    const CommCounters& c = services_.counters;
    const Before before{c.blocked_ns, c.busy_ns, c.collectives, c.bytes, c.bus_bytes, device_->memory().allocations()};
    timeline_->begin_step(step);
    const auto t0 = Clock::now();
    const StepTimeline::Mark m0 = timeline_->mark();
    const bool params_changed = unfreeze(step);
    rec.lr = scheduled_lr(config_.lr_schedule, config_.optimizer.lr, step);
    optimizer_->begin_step(rec.lr / config_.optimizer.lr);
    for (Parameter& p : model_->params())
      if (p.trainable) device_->fill(p.grad.data(), p.grad.numel(), 0.0f, device_->compute_stream());
    // Micro-batches accumulate into the gradients; each one's loss is scaled
    // by 1/k so the sum is the gradient of the mean over k x the batch.
    const int64_t k = config_.run.grad_accum_steps;
    for (int64_t micro = 0; micro < k; ++micro) {
      const bool sync = micro == k - 1;
      if (sync) rec.collectives_before_sync_micro_batch = c.collectives - before.collectives;
      const ddp_step_info info{sizeof(ddp_step_info), step, int32_t(micro), int32_t(k), sync ? 1 : 0,
                               params_changed && micro == 0 ? 1 : 0};
      StepTimeline::Mark m = timeline_->mark();
      plugins_->on_step_begin(info);
      timeline_->range("on_step_begin", m);
      const auto t = Clock::now();
      const Batch batch = data_->batch(step * k + micro);
      rec.data_s += seconds_since(t);
      forward(batch, k, rec);
      backward(k, before.collectives, rec);
      m = timeline_->mark();
      plugins_->on_backward_end();
      timeline_->range("on_backward_end", m);
    }
    const StepTimeline::Mark m = timeline_->mark();
    plugins_->finish();
    timeline_->range("finish", m);
    if (config_.optimizer.clip_grad_norm > 0) rec.grad_norm = gradient_norm(/*clip=*/true);
    take_peaks(device_->memory(), mem_before_optimizer_);
    optimizer_step(rec);
    // Without clipping, measured where the gradients are host memory: on a
    // GPU it would copy every gradient out each step (summary: null).
    if (config_.optimizer.clip_grad_norm == 0 && device_->kind() == DDP_DEVICE_CPU)
      rec.grad_norm = gradient_norm(/*clip=*/false);
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
    return rec;
  }

  void forward(const Batch& batch, int64_t k, StepRecord& rec) {
    const auto t = Clock::now();
    const StepTimeline::Mark m = timeline_->mark();
    {
      nvtx::Range range("forward");
      rec.loss += model_->forward(batch) / double(k);
    }
    rec.forward_s += seconds_since(t);
    timeline_->range("forward", m);
    if (config_.run.check_finite && !std::isfinite(rec.loss)) throw Error(non_finite_loss(rec.loss, model_->params()));
  }

  // Backward, firing on_grad_ready after each parameter's last use.
  void backward(int64_t k, int64_t collectives_at_start, StepRecord& rec) {
    const auto t = Clock::now();
    const StepTimeline::Mark m = timeline_->mark();
    timeline_->start_layers(m);  // the model's per-layer ranges start here
    {
      nvtx::Range range("backward");
      auto& params = model_->params();
      for (size_t i = 0; i < params.size(); ++i) remaining_uses_[i] = params[i].uses;
      model_->backward(1.0f / float(k), [&](size_t index) {
        if (--remaining_uses_[index] != 0) return;
        rec.collectives_before_last_grad_ready = services_.counters.collectives - collectives_at_start;
        plugins_->on_grad_ready(services_.param_table[index]);
      });
      // On a GPU backward has only been enqueued: wait for it, so that
      // backward_s is its time and the strategy's waits (comm_blocked_s) are
      // communication only. (The CPU's compute stream is this thread: a no-op.)
      device_->compute_stream().synchronize();
    }
    timeline_->range("backward", m);
    rec.backward_s += seconds_since(t);  // the model's backward, as the trace's range
  }

  void optimizer_step(StepRecord& rec) {
    const auto t = Clock::now();
    const StepTimeline::Mark m = timeline_->mark();
    const int64_t blocked_before = services_.counters.blocked_ns;
    {
      nvtx::Range range("optimizer");
      if (plugins_->owns_optimizer()) {
        plugins_->optimizer_step();
      } else {
        optimizer_->step(model_->params(), trainable_);
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

  // Every rank's digest of every parameter, compared (replica_check.h);
  // `step` is the step just done, -1 the end of the run.
  void check_replicas(int64_t step) {
    const auto t = Clock::now();
    const auto& params = model_->params();
    std::vector<int64_t> mine;
    std::vector<std::string> names;
    for (const Parameter& p : params) {
      const std::vector<float> host = device_->kind() == DDP_DEVICE_CPU ? std::vector<float>() : p.data.to_host();
      const Digest d = digest(host.empty() ? p.data.data() : host.data(), p.data.numel());
      if (config_.run.check_finite && !d.finite)
        throw Error("parameter '" + p.name + "' is not finite " +
                    (step >= 0 ? "after step " + std::to_string(step + 1) : std::string("at the end of the run")) +
                    " (run.check_finite = false lets the run go on)");
      mine.push_back(int64_t(d.bits));
      names.push_back(p.name);
    }
    std::vector<int64_t> all(mine.size() * size_t(env_.rank.world_size));
    plugins_->all_gather(mine, all);
    const std::string divergence = first_divergence(names, all, env_.rank.world_size, step);
    if (!divergence.empty()) throw Error(divergence);
    replica_checked_after_.push_back(step + 1);
    replica_check_s_ += seconds_since(t);
  }

  // --resume: the checkpoint's parameters, optimizer state (taken up at
  // each parameter's first step), frozen set and losses; training goes on
  // after its step. A config that changes what the run trains is refused.
  void resume() {
    const Resumed r = resume_run(config_, *model_, *device_, *optimizer_);
    start_step_ = r.step;
    loss_prefix_ = r.losses;
    resumed_from_ = r.path;
    if (env_.rank.rank != 0) return;
    std::printf("resuming from %s after step %lld of %lld\n", r.path.c_str(), static_cast<long long>(r.step),
                static_cast<long long>(config_.run.steps));
    for (const std::string& change : r.changed) std::printf("  changed: %s\n", change.c_str());
    std::fflush(stdout);
  }

  // After `step` steps: every rank's part of a checkpoint (checkpoint.h).
  void checkpoint(int64_t step) {
    const auto t = Clock::now();
    whereabouts::Inside in(nullptr, "writing a checkpoint");
    average_losses();
    CheckpointInput input{config_, env_.rank.rank, env_.rank.world_size, model_->params(), *optimizer_,
                          plugins_->strategy_name(), plugins_->transport_name(), resume_items(config_),
                          loss_prefix_, {}};
    for (const StepRecord& r : records_) input.losses.push_back(r.loss);
    input.all_gather = [this](const std::vector<double>& mine, std::vector<double>& all) {
      plugins_->all_gather(mine, all);
    };
    write_checkpoint(input, step);
    checkpoints_.push_back(step);
    checkpoint_s_ += seconds_since(t);
  }

  // The global L2 norm of the averaged gradients (summed across ranks where
  // the strategy partitions them). With `clip`, after finish: waits for
  // every gradient, then clips them to optimizer.clip_grad_norm; else after
  // the optimizer step, when every strategy has them all in place.
  double gradient_norm(bool clip) {
    if (clip) {
      whereabouts::Inside in(nullptr, "waiting for the gradients to clip");
      device_->comm_stream().synchronize();
    }
    const std::optional<std::vector<size_t>> held = plugins_->held_grads();
    return clip_gradients(model_->params(), held ? *held : trainable_, held.has_value(),
                          clip ? config_.optimizer.clip_grad_norm : 0.0, *device_, env_.rank.world_size,
                          [this](const std::vector<double>& mine, std::vector<double>& all) {
                            plugins_->all_gather(mine, all);
                          }, &optimizer_->grad_squares());  // what this step's update measured
  }

  bool unfreeze(int64_t step) {
    if (!apply_unfreeze(config_.unfreeze, step, *model_, *device_)) return false;
    services_.refresh_param_table();
    refresh_trainable();
    return true;
  }

  // The indices of trainable parameters; kept, not rebuilt every step.
  void refresh_trainable() {
    trainable_.clear();
    for (size_t i = 0; i < model_->params().size(); ++i)
      if (model_->params()[i].trainable) trainable_.push_back(i);
  }

  // Replaces the local losses not yet averaged by their mean over ranks (the
  // loss single-process training would report), summed in rank order: the
  // same bits however the steps are grouped.
  void average_losses() {
    const size_t begin = reported_, count = records_.size() - begin;
    reported_ = records_.size();
    if (count == 0) return;
    std::vector<double> mine, all(count * size_t(env_.rank.world_size));
    for (size_t i = begin; i < records_.size(); ++i) mine.push_back(records_[i].loss);
    plugins_->all_gather(mine, all);
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < env_.rank.world_size; ++r) sum += all[size_t(r) * count + i];
      records_[begin + i].loss = sum / env_.rank.world_size;
    }
  }

  // The averaged losses, then a progress line from rank 0.
  void report(int64_t step) {
    average_losses();
    if (env_.rank.rank != 0) return;
    const StepRecord& r = records_.back();
    std::printf("step %lld/%lld  loss %.6f  step %.2f ms  comm blocked %.2f ms  (%lld collectives, %.3f MB)\n",
                static_cast<long long>(step + 1), static_cast<long long>(config_.run.steps), r.loss,
                r.step_s * 1e3, r.comm_blocked_s * 1e3, static_cast<long long>(r.collectives),
                r.comm_bytes / 1e6);
    std::fflush(stdout);
  }

  // Every rank's totals to every rank; rank 0 writes weights and summary;
  // each rank its trace.
  void finish_run() {
    RankTotals mine;
    for (int c = 0; c < kMemCategories; ++c)
      mine.peaks[c] = std::max({mem_after_setup_[c], mem_before_optimizer_[c], mem_after_optimizer_[c]});
    for (const StepRecord& r : records_) mine.comm_blocked_s += r.comm_blocked_s, mine.comm_busy_s += r.comm_busy_s;
    mine.collective_sequence = services_.counters.sequence_hash.load() >> 12;
    std::vector<double> all(RankTotals::kDoubles * env_.rank.world_size);
    plugins_->all_gather(mine.to_doubles(), all);
    // Every rank has passed its last read of the store (it is in this gather).
    const std::string left = store_->remove_written();
    if (!left.empty()) std::fprintf(stderr, "[rank %d] warning: %s\n", env_.rank.rank, left.c_str());
    if (env_.rank.rank == 0) write_outputs(all);
    if (!trace_path_.empty()) timeline_->write(trace_path_);
  }

  void write_outputs(const std::vector<double>& all) {
    namespace fs = std::filesystem;
    fs::create_directories(config_.run.output_dir);
    std::vector<NamedFloats> weights;
    std::vector<std::vector<float>> host;  // a GPU's weights, copied out
    for (const Parameter& p : model_->params()) {
      const float* values = device_->kind() == DDP_DEVICE_CPU ? p.data.data() : host.emplace_back(p.data.to_host()).data();
      weights.push_back({p.name, p.shape, values});
    }
    write_safetensors((fs::path(config_.run.output_dir) / "weights.safetensors").string(), weights);

    std::vector<RankTotals> ranks;
    for (int r = 0; r < env_.rank.world_size; ++r) ranks.push_back(RankTotals::from_doubles(&all[r * RankTotals::kDoubles]));
    RunFacts facts;
    facts.world_size = env_.rank.world_size, facts.steps = config_.run.steps;
    facts.model = config_.model.name;
    facts.transport = plugins_->transport_name(), facts.strategy = plugins_->strategy_name();
    facts.rows_per_step = double(config_.data.batch_size) * double(config_.run.grad_accum_steps);
    facts.tokens_per_row = tokens_per_row_;
    facts.after_setup = mem_after_setup_, facts.before_optimizer = mem_before_optimizer_;
    facts.after_optimizer = mem_after_optimizer_;
    facts.config_toml = config_.toml_text;
    facts.blas_kernel = layers::blas_kernel_loaded(), facts.blas_build = layers::blas_build();
    if (const char* choice = std::getenv("DDP_BLAS_CHOICE")) facts.blas_choice_json = choice;
    facts.replica_check_every = config_.run.check_replicas_every, facts.replica_check_s = replica_check_s_;
    facts.replica_checked_after = replica_checked_after_, facts.huge_pages = huge_pages_now();
    facts.first_step = start_step_, facts.resumed_from = resumed_from_;
    facts.losses_before = loss_prefix_;
    facts.checkpoints = checkpoints_, facts.checkpoint_s = checkpoint_s_;
    if (const char* restarts = std::getenv("DDP_RESTARTS")) facts.restarts_json = restarts;
    nlohmann::ordered_json stats;
    const bool has_stats = plugins_->stats(&stats);
    const auto summary = run_summary(facts, records_, ranks, has_stats ? &stats : nullptr);
    write_file_atomically((fs::path(config_.run.output_dir) / "summary.json").string(), summary.dump(2) + "\n");
  }

  void stop_plugins() {
    if (!plugins_) return;
    plugins_->abort();  // before draining: queued NCCL kernels would keep the drain waiting for ever
    plugins_->shutdown();
  }

  // What the run is given.
  const Config config_;
  const RankEnv env_;
  TrainObserver* const observer_;
  // What set_up builds, in this order (and destroys in reverse: the device
  // last). The plugins are shut down explicitly before any of it goes.
  std::unique_ptr<Device> device_;       // run.device
  std::unique_ptr<Device> host_device_;  // the data's buffers on a GPU run
  std::unique_ptr<Model> model_;
  std::unique_ptr<StepTimeline> timeline_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Store> store_;
  HostServices services_;
  std::unique_ptr<RankPlugins> plugins_;
  std::string trace_path_;  // empty: no trace
  // The run's state.
  int64_t tokens_per_row_ = 1;      // positions a row trains (lm: context_length)
  std::vector<size_t> trainable_;   // indices of trainable parameters
  std::vector<int> remaining_uses_;  // per parameter, this micro-batch's backward
  std::vector<StepRecord> records_;
  size_t reported_ = 0;
  std::vector<int64_t> replica_checked_after_;  // steps (from 1; 0: the end) whose replicas agreed
  double replica_check_s_ = 0;
  int64_t start_step_ = 0;            // a resumed run's first step
  std::vector<double> loss_prefix_;   // its checkpoint's losses, steps 1..start_step_
  std::string resumed_from_;          // the checkpoint ("": none)
  std::vector<int64_t> checkpoints_;  // after which steps this run wrote one
  double checkpoint_s_ = 0;
  PeakBytes mem_after_setup_{}, mem_before_optimizer_{}, mem_after_optimizer_{};
};

}  // namespace

void train_rank(const Config& config, const RankEnv& env, TrainObserver* observer) {
  RankRun(config, env, observer).run();
}

}  // namespace ddp
