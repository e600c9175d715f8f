// run_end.cpp — what a rank's run checks and leaves besides its steps
// (rank_run.h): the replica checks, --resume and checkpoints, the losses
// averaged over ranks and the progress line, then summary.json, the
// weights and the trace.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "agreement.h"
#include "blas_info.h"
#include "checkpoint.h"
#include "checksum.h"
#include "env.h"
#include "rank_run.h"
#include "replica_check.h"
#include "safetensors.h"
#include "whereabouts.h"

namespace ddp {

void RankRun::check_replicas(int64_t step) {
  const auto t = Clock::now();
  const auto& params = model_->params();
  std::vector<int64_t> mine(params.size());
  std::vector<std::string> names;
  for (const Parameter& p : params) names.push_back(p.name);
  services_.params.visit("the replica check", [&](size_t i) {
    const Parameter& p = params[i];
    const std::vector<float> host = device_->kind() == DDP_DEVICE_CPU ? std::vector<float>() : p.data.to_host();
    const Digest d = digest(host.empty() ? p.data.data() : host.data(), p.data.numel());
    if (config_.run.check_finite && !d.finite)
      throw Error("parameter '" + p.name + "' is not finite " +
                  (step >= 0 ? "after step " + std::to_string(step + 1) : std::string("at the end of the run")) +
                  " (run.check_finite = false lets the run go on)");
    mine[i] = int64_t(d.bits);
  });
  std::vector<int64_t> all(mine.size() * size_t(env_.rank.world_size));
  plugins_->all_gather(mine, all);
  const std::string divergence = first_divergence(names, all, env_.rank.world_size, step);
  if (!divergence.empty()) throw Error(divergence);
  replica_checked_after_.push_back(step + 1);
  replica_check_s_ += seconds_since(t);
}

double RankRun::evaluate() {
  const auto t = Clock::now();
  whereabouts::Inside in(nullptr, "evaluating the held-out rows");
  evaluating_ = true;
  double sum = 0;
  for (int64_t b = 0; b < config_.eval.batches; ++b) sum += model_->forward(eval_data_->batch(b));
  evaluating_ = false;
  const int world = env_.rank.world_size;
  std::vector<double> all(size_t(world), 0.0);
  plugins_->all_gather({sum / double(config_.eval.batches)}, all);
  double mean = 0;
  for (int r = 0; r < world; ++r) mean += all[size_t(r)];  // rank order: the same bits on every rank
  eval_s_ += seconds_since(t);
  return mean / world;
}

void RankRun::resume() {
  const Resumed r = resume_run(config_, env_.rank.rank, *model_, *device_, *optimizer_, *initial_);
  resumed_ = r;
  start_step_ = r.step;
  eval_due_ = r.eval_due && config_.eval.every > 0;  // waiting for a sync point
  check_due_ = r.check_due;
  loss_prefix_ = r.losses;
  resumed_from_ = r.path;
  if (config_.precision.loss_scale && !r.loss_scale)  // (a config that scaled when it was written says so)
    throw Error(r.path +
                    "/checkpoint.json: holds no \"loss_scale\", and precision.loss_scale = \"dynamic\" needs "
                    "the scale to go on from",
                DDP_ERR_INVALID_ARGUMENT);
  if (r.loss_scale) scale_ = *r.loss_scale;
  if (env_.rank.rank != 0) return;
  std::printf("resuming from %s after step %lld of %lld\n", r.path.c_str(), static_cast<long long>(r.step),
              static_cast<long long>(config_.run.steps));
  for (const std::string& change : r.changed) std::printf("  changed: %s\n", change.c_str());
  std::fflush(stdout);
}

void RankRun::put_back_resumed_state() {
  if (resumed_from_.empty()) return;
  auto& params = model_->params();
  std::vector<float> host;
  for (size_t i = 0; i < params.size() && resumed_.divergent; ++i) {
    if (!params[i].data.defined()) continue;  // (held by the strategy: none where replicas differ)
    host.resize(params[i].data.numel());
    initial_->fill(i, host.data());
    device_->upload(params[i].data.data(), host.data(), host.size() * sizeof(float));
  }
  put_back_strategy_state(plugins_->state());
}

// The strategy's state from the checkpoint (1.8): of the same strategy,
// each buffer equal on every rank (1.9) from rank 0's file, on any world
// size; each per-rank buffer from this rank's own, on the same world size
// only (else it starts afresh, and rank 0 says so).
void RankRun::put_back_strategy_state(const std::vector<RankPlugins::StateBuffer>& buffers) {
  const std::string name = plugins_->strategy_name();
  const bool same_world = resumed_.world == env_.rank.world_size;
  if (buffers.empty()) return;
  if (resumed_.strategy != name || (resumed_.strategy_state.empty() && resumed_.shared_state.empty())) {
    if (resumed_.divergent)
      throw ConfigError("--resume " + resumed_from_ + ": strategy plugin '" + name + "' keeps state across steps ('" +
                        buffers[0].name + "' first), and the checkpoint, written by strategy '" + resumed_.strategy +
                        "', holds none of it");
    if (env_.rank.rank == 0)  // replicas equal: a strategy's state may start afresh
      std::printf(
          "  strategy plugin '%s' starts its state afresh: the checkpoint (strategy '%s', %d ranks) holds "
          "none for it\n",
          name.c_str(), resumed_.strategy.c_str(), resumed_.world);
    return;
  }
  std::unique_ptr<SafetensorsReader> own;
  std::unique_ptr<SafetensorsReader> shared;
  if (same_world && !resumed_.strategy_state.empty())
    own = std::make_unique<SafetensorsReader>(resumed_.strategy_state);
  if (!resumed_.shared_state.empty()) shared = std::make_unique<SafetensorsReader>(resumed_.shared_state);
  if (own) refuse_untaken_state(*own, buffers);
  std::vector<std::string> afresh;
  std::vector<float> host;
  for (const RankPlugins::StateBuffer& b : buffers) {
    SafetensorsReader* file = b.equal && shared && shared->find_floats(b.name) ? shared.get() : own.get();
    if (!file) {  // a per-rank buffer of another world size's run (or of none kept)
      afresh.push_back(b.name);
      continue;
    }
    const SafetensorsReader::Entry* e = file->find_floats(b.name);
    if (!e || size_t(numel_of(e->shape)) != b.count)
      throw ConfigError(file->path() + ": no tensor '" + b.name + "' of " + std::to_string(b.count) +
                        " float32, where strategy plugin '" + name +
                        "' keeps state across steps (the checkpoint "
                        "was written by strategy '" +
                        resumed_.strategy + "')");
    host.resize(b.count);
    file->read_floats(b.name, 0, b.count, host.data());
    device_->upload(b.data, host.data(), b.count * sizeof(float));
  }
  if (afresh.empty()) return;
  if (resumed_.divergent)  // (a divergent checkpoint is resumed on its own world size only)
    throw ConfigError("--resume " + resumed_from_ + ": no state '" + afresh[0] + "' of this rank's in the checkpoint");
  if (env_.rank.rank == 0)
    std::printf(
        "  strategy plugin '%s' starts its per-rank state afresh ('%s'%s): the checkpoint holds it for %d "
        "ranks, this run has %d\n",
        name.c_str(), afresh[0].c_str(), afresh.size() > 1 ? " and more" : "", resumed_.world, env_.rank.world_size);
}

// A tensor in this rank's state file that the strategy no longer takes:
// its state entry names other buffers now.
void RankRun::refuse_untaken_state(const SafetensorsReader& file,
                                   const std::vector<RankPlugins::StateBuffer>& buffers) const {
  for (const auto& [tensor, entry] : file.entries()) {
    bool taken = false;
    for (const RankPlugins::StateBuffer& b : buffers) taken = taken || b.name == tensor;
    if (!taken)
      throw ConfigError(file.path() + ": holds state '" + tensor + "' that strategy plugin '" +
                        plugins_->strategy_name() + "' does not take (its state entry names other buffers now)");
  }
}

// Every rank's strategy gives the same buffers, of the same counts and
// scopes: one digest of them, gathered (an engine collective: every rank
// of a strategy with a state entry calls it), else the ranks would write
// and compare other things (a check of equal buffers that disagree on
// their number would not even line up).
void RankRun::agree_on_state(const std::vector<RankPlugins::StateBuffer>& buffers) {
  std::string shape;
  for (const RankPlugins::StateBuffer& b : buffers)
    shape += b.name + ":" + std::to_string(b.count) + (b.equal ? ":equal;" : ":rank;");
  const std::vector<double> mine{double(digest_bits(xxh3_hex(shape.data(), shape.size())) >> 16)};
  std::vector<double> all(size_t(env_.rank.world_size));
  plugins_->all_gather(mine, all);
  for (int r = 1; r < env_.rank.world_size; ++r)
    if (all[size_t(r)] != all[0])
      throw Error(std::string("strategy plugin '") + plugins_->strategy_name() + "': state: rank " + std::to_string(r) +
                      " gives other buffers, counts or scopes (state_scopes) than rank 0: "
                      "every rank must give the same (writing a checkpoint)",
                  DDP_ERR_INVALID_ARGUMENT);
}

// This rank's state buffers for its checkpoint file: its per-rank ones,
// and on rank 0 the equal ones too, once every rank's digests of those
// agree (an engine collective: every rank calls it).
std::vector<NamedFloats> RankRun::strategy_state(std::vector<std::vector<float>>& storage) {
  std::vector<NamedFloats> out;
  const std::vector<RankPlugins::StateBuffer> buffers = plugins_->state();
  if (plugins_->keeps_state()) agree_on_state(buffers);
  std::vector<double> digests;  // 48 bits of each equal buffer's XXH3: exact in a double
  std::vector<const RankPlugins::StateBuffer*> equal;
  for (const RankPlugins::StateBuffer& b : buffers) {
    storage.emplace_back(b.count);
    device_->download(storage.back().data(), b.data, b.count * sizeof(float));
    if (b.equal) {
      const uint64_t bits = digest_bits(xxh3_hex(storage.back().data(), b.count * sizeof(float)));
      digests.push_back(double(bits >> 16));
      equal.push_back(&b);
    }
    if (!b.equal || env_.rank.rank == 0) out.push_back({b.name, Shape{int64_t(b.count)}, storage.back().data()});
  }
  if (digests.empty()) return out;
  std::vector<double> all(digests.size() * size_t(env_.rank.world_size));
  plugins_->all_gather(digests, all);
  for (int r = 1; r < env_.rank.world_size; ++r)
    for (size_t k = 0; k < digests.size(); ++k)
      if (all[size_t(r) * digests.size() + k] != all[k])
        throw Error(std::string("strategy plugin '") + plugins_->strategy_name() + "': state '" + equal[k]->name +
                        "' is equal on every rank by its state_scopes, but rank " + std::to_string(r) +
                        "'s differs from rank 0's (writing a checkpoint)",
                    DDP_ERR_INTERNAL);
  return out;
}

void RankRun::checkpoint(int64_t step) {
  const auto t = Clock::now();
  whereabouts::Inside in(nullptr, "writing a checkpoint");
  average_losses();
  CheckpointInput input{config_,
                        env_.rank.rank,
                        env_.rank.world_size,
                        model_->params(),
                        *optimizer_,
                        plugins_->strategy_name(),
                        plugins_->transport_name(),
                        resume_items(config_),
                        loss_prefix_,
                        {},
                        {}};
  for (const StepRecord& r : records_) input.losses.push_back(r.loss);
  input.collective = services_.params.visit_is_collective();  // the strategy gathers them unit by unit, on every rank
  input.divergent = plugins_->divergent();                    // every rank's own weights and state
  std::vector<std::vector<float>> state;
  input.strategy_state = strategy_state(state);
  input.eval_due = eval_due_;
  input.check_due = check_due_;
  input.val_losses = val_losses();
  if (config_.precision.loss_scale) input.loss_scale = scale_;
  input.visit_values = host_visit("the checkpoint");
  input.all_gather = [this](const std::vector<double>& mine, std::vector<double>& all) {
    plugins_->all_gather(mine, all);
  };
  write_checkpoint(input, step);
  checkpoints_.push_back(step);
  checkpoint_s_ += seconds_since(t);
}

std::vector<std::pair<int64_t, double>> RankRun::val_losses() const {
  std::vector<std::pair<int64_t, double>> out = resumed_.val_losses;  // a resumed run's before it
  for (size_t k = 0; k < records_.size(); ++k)
    if (!std::isnan(records_[k].val_loss)) out.emplace_back(start_step_ + int64_t(k) + 1, records_[k].val_loss);
  return out;
}

void RankRun::average_losses() {
  const size_t begin = reported_;
  const size_t count = records_.size() - begin;
  reported_ = records_.size();
  if (count == 0) return;
  std::vector<double> mine;
  std::vector<double> all(count * size_t(env_.rank.world_size));
  for (size_t i = begin; i < records_.size(); ++i) mine.push_back(records_[i].loss);
  plugins_->all_gather(mine, all);
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    for (int r = 0; r < env_.rank.world_size; ++r) sum += all[size_t(r) * count + i];
    records_[begin + i].loss = sum / env_.rank.world_size;
  }
}

void RankRun::report(int64_t step) {
  average_losses();
  if (env_.rank.rank != 0) return;
  const StepRecord& r = records_.back();
  std::printf("step %lld/%lld  loss %.6f  step %.2f ms  comm blocked %.2f ms  (%lld collectives, %.3f MB)",
              static_cast<long long>(step + 1), static_cast<long long>(config_.run.steps), r.loss, r.step_s * 1e3,
              r.comm_blocked_s * 1e3, static_cast<long long>(r.collectives), r.comm_bytes / 1e6);
  if (!std::isnan(r.val_loss)) std::printf("  val loss %.6f", r.val_loss);
  std::printf("\n");
  std::fflush(stdout);
}

HostVisit RankRun::host_visit(const char* reader) {
  return [this, reader](const std::function<void(size_t, const float*)>& put) {
    services_.params.visit(reader, [&](size_t i) {
      const Tensor& values = model_->params()[i].data;
      if (device_->kind() == DDP_DEVICE_CPU) return put(i, values.data());
      put(i, values.to_host().data());  // a GPU's, one tensor at a time
    });
  };
}

void RankRun::finish_run() {
  // The trace first: a rank that cannot write it fails before rank 0, which
  // waits for it in the collectives below, writes any output.
  if (!trace_path_.empty()) timeline_->write(trace_path_);
  // weights.safetensors, tensor by tensor as rank 0 reads them: where the
  // strategy holds the values, unit by unit on every rank (it gathers them).
  namespace fs = std::filesystem;
  const bool writes = env_.rank.rank == 0;
  const std::string weights_path = (fs::path(config_.run.output_dir) / "weights.safetensors").string();
  if (writes) fs::create_directories(config_.run.output_dir);
  const std::string failure = write_weights(weights_path, model_->params(), writes,
                                            services_.params.visit_is_collective(), host_visit("weights.safetensors"));
  if (!failure.empty()) throw Error(failure);
  // Every rank's totals, the peak resident memory last: the outputs' writing included.
  RankTotals mine;
  for (int c = 0; c < kMemCategories; ++c)
    mine.peaks[c] = std::max({mem_after_setup_[c], mem_before_optimizer_[c], mem_after_optimizer_[c]});
  for (const StepRecord& r : records_) {
    mine.comm_blocked_s += r.comm_blocked_s;
    mine.comm_busy_s += r.comm_busy_s;
  }
  mine.collective_sequence = services_.counters.sequence_hash.load() >> 12;
  mine.peak_resident_bytes = peak_resident_bytes();
  std::vector<double> all(RankTotals::kDoubles * env_.rank.world_size);
  plugins_->all_gather(mine.to_doubles(), all);
  // Every rank has passed its last read of the store (it is in this gather).
  const std::string left = store_->remove_written();
  if (!left.empty()) std::fprintf(stderr, "[rank %d] warning: %s\n", env_.rank.rank, left.c_str());
  if (!writes) return;
  try {
    write_summary(all);
  } catch (...) {  // all or nothing: summary.json, written last, says the outputs are whole
    std::error_code ignored;
    fs::remove(weights_path, ignored);
    throw;
  }
}

void RankRun::write_summary(const std::vector<double>& all) {
  namespace fs = std::filesystem;

  std::vector<RankTotals> ranks;
  for (int r = 0; r < env_.rank.world_size; ++r)
    ranks.push_back(RankTotals::from_doubles(&all[r * RankTotals::kDoubles]));
  RunFacts facts;
  facts.world_size = env_.rank.world_size;
  facts.steps = config_.run.steps;
  facts.model = config_.model.name;
  facts.transport = plugins_->transport_name();
  facts.strategy = plugins_->strategy_name();
  facts.compute = compute_name(config_.precision.compute);
  if (config_.precision.loss_scale) facts.loss_scale = scale_;
  facts.rows_per_step = double(config_.data.batch_size) * double(config_.run.grad_accum_steps);
  facts.tokens_per_row = tokens_per_row_;
  facts.after_setup = mem_after_setup_;
  facts.before_optimizer = mem_before_optimizer_;
  facts.after_optimizer = mem_after_optimizer_;
  facts.config_toml = config_.toml_text;
  facts.blas_kernel = blas_kernel_loaded();
  facts.blas_build = blas_build();
  facts.blas_choice_json = ddp::env().blas_choice.value_or("");  // DDP_BLAS_CHOICE
  facts.replica_check_every = config_.run.check_replicas_every;
  facts.replica_check_s = replica_check_s_;
  facts.divergent = plugins_->divergent();
  facts.weights_synced = weights_synced_;
  facts.eval_every = config_.eval.every;
  facts.eval_batches = config_.eval.batches;
  facts.eval_s = eval_s_;
  facts.val_losses = val_losses();
  facts.replica_checked_after = replica_checked_after_;
  facts.huge_pages = huge_pages_now();
  facts.first_step = start_step_;
  facts.resumed_from = resumed_from_;
  facts.losses_before = loss_prefix_;
  facts.checkpoints = checkpoints_;
  facts.checkpoint_s = checkpoint_s_;
  facts.restarts_json = ddp::env().restarts.value_or("");  // DDP_RESTARTS
  const std::vector<GroupReport> groups = plugins_->metered().reports();
  for (const GroupReport& g : groups)
    if (groups.size() > 1) facts.groups.push_back({g.name, g.ranks, g.collectives, g.bytes, g.bus_bytes});
  nlohmann::ordered_json stats;
  const bool has_stats = plugins_->stats(&stats);
  const auto summary = run_summary(facts, records_, ranks, has_stats ? &stats : nullptr);
  write_file_atomically((fs::path(config_.run.output_dir) / "summary.json").string(), summary.dump(2) + "\n");
}

void RankRun::stop_plugins() {
  if (!plugins_) return;
  plugins_->abort();  // before draining: queued NCCL kernels would keep the drain waiting for ever
  plugins_->shutdown();
}

}  // namespace ddp
