// trainer.cpp — one rank's run (see trainer.h). The step, as the strategy
// sees it:
//   zero grads → on_step_begin → forward → backward (on_grad_ready after a
//   parameter's last use) → on_backward_end → finish → optimizer_step
//   (the strategy's, if it owns it, else the engine's on all trainable).
#include "trainer.h"

#include <cstring>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include <cblas.h>

#include "data.h"
#include "nvtx.h"
#include "lm.h"
#include "mlp.h"
#include "plugin_loader.h"
#include "safetensors.h"
#include "trace.h"

namespace ddp {
namespace {

using json = nlohmann::ordered_json;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void load_init(const std::string& path, Model& model, Device& device) {
  auto tensors = read_safetensors(path);
  for (Parameter& p : model.params()) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) throw Error(path + ": missing tensor '" + p.name + "'");
    if (it->second.shape != p.shape)
      throw Error(path + ": tensor '" + p.name + "' has shape " + shape_string(it->second.shape) +
                  ", model expects " + shape_string(p.shape));
    std::vector<float> values = it->second.as_floats(path, p.name);
    device.upload(p.data.data(), values.data(), p.data.bytes());
  }
}

struct StepRecord {
  double loss = 0, step_s = 0, data_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0;
  double comm_blocked_s = 0, comm_busy_s = 0;
  int64_t collectives = 0, comm_bytes = 0;
  // Collectives the strategy had enqueued when the step's last
  // on_grad_ready was called: > 0 means communication overlapped backward.
  int64_t collectives_before_last_grad_ready = 0;
  // Collectives enqueued during micro-batches without sync_grads: must be 0.
  int64_t collectives_before_sync_micro_batch = 0;
  int64_t comm_buffer_bytes = 0;  // current at the end of the step (a leak grows it)
  int64_t device_allocations = 0;  // device memory allocated during the step
};

using PeakBytes = std::array<size_t, kMemCategories>;

// Folds the peaks of the window that just ended into `into`, then opens a
// new window.
void take_peaks(MemoryTracker& memory, PeakBytes& into) {
  for (int c = 0; c < kMemCategories; ++c)
    into[c] = std::max(into[c], memory.peak(static_cast<MemCategory>(c)));
  memory.reset_peaks();
}

json peaks_json(const PeakBytes& peaks) {
  json j = json::object();
  size_t total = 0;
  for (int c = 0; c < kMemCategories; ++c) {
    j[to_string(static_cast<MemCategory>(c))] = peaks[c];
    total += peaks[c];
  }
  j["total"] = total;
  return j;
}

// The loaded plugins and their handles (destroyed by RankRun, in order).
struct Plugins {
  std::unique_ptr<LoadedPlugin> transport_lib, strategy_lib;
  std::unique_ptr<PluginHost> transport_host, strategy_host;
  ddp_comm* comm = nullptr;
  std::unique_ptr<MeteredTransport> metered;
  ddp_strategy* strategy = nullptr;
};

class RankRun {
 public:
  RankRun(const Config& config, const RankEnv& env, TrainObserver* observer)
      : config_(config), env_(env), observer_(observer) {}
  // Nothing enqueued may outlive the code it calls into: the comm stream is
  // drained before each plugin is destroyed and again after (destroy may
  // enqueue), all before the libraries are unloaded. A failed stream
  // cancels what is left at once.
  ~RankRun() {
    drain();
    if (plugins_.strategy) plugins_.strategy_lib->strategy()->destroy(plugins_.strategy);
    drain();
    if (plugins_.comm) plugins_.transport_lib->transport()->destroy(plugins_.comm);
    drain();
  }
  void drain() {
    if (!device_) return;
    try {
      device_->comm_stream().synchronize();
    } catch (const std::exception&) {
    }
    try {  // a GPU's compute stream may hold a plugin's host functions too
      device_->compute_stream().synchronize();
    } catch (const std::exception&) {
    }
  }

  // On any failure (a wait given up on a stuck collective among them) the
  // transport is aborted before the streams are drained: queued NCCL
  // kernels would otherwise keep the drain waiting for ever.
  void run() {
    try {
      run_steps();
    } catch (...) {
      const ddp_transport_v1_t* t = plugins_.transport_lib ? plugins_.transport_lib->transport() : nullptr;
      if (t && t->abort && plugins_.comm) t->abort(plugins_.comm);
      throw;
    }
  }

 private:
  void run_steps() {
    // `ddp run --trace`: the launcher names this rank's trace file.
    if (const char* path = std::getenv("DDP_TRACE"); path && *path) trace_path_ = path;
    set_up();
    const ddp_strategy_v1_t& api = *plugins_.strategy_lib->strategy();
    const PluginHost& sh = *plugins_.strategy_host;
    if (observer_) observer_->on_weights(-1, *model_);
    sh.check(api.on_train_begin(plugins_.strategy), "on_train_begin");
    if (observer_) observer_->on_weights(0, *model_);
    take_peaks(device_->memory(), mem_after_setup_);

    records_.reserve(static_cast<size_t>(config_.run.steps));
    for (int64_t step = 0; step < config_.run.steps; ++step) {
      records_.push_back(train_step(step, api, sh));
      if (observer_) observer_->on_weights(step + 1, *model_);
      if ((step + 1) % config_.run.log_every == 0 || step + 1 == config_.run.steps) report(step);
    }
    device_->comm_stream().synchronize();
    // A GPU's collectives still unsettled (a step's last ones may end after
    // it): their busy time goes to the last step.
    const int64_t busy_before = services_.counters.busy_ns;
    plugins_.metered->settle(/*wait=*/true);
    if (!records_.empty()) records_.back().comm_busy_s += double(services_.counters.busy_ns - busy_before) * 1e-9;
    finish_run(api);
    if (trace_) {
      const auto dir = std::filesystem::path(trace_path_).parent_path();
      if (!dir.empty()) std::filesystem::create_directories(dir);
      trace_->write(trace_path_);
    }
  }

  void set_up() {
    const RankInfo& r = env_.rank;
    openblas_set_num_threads(config_.run.threads);
    device_ = make_device(config_.run.device, r.local_rank, config_.run.share_gpus);
    DataShape shape;
    model_ = build_model(config_.model, *device_, config_.run.seed + static_cast<uint64_t>(r.rank), &shape);
    if (!trace_path_.empty()) {
      // Room for every step's ranges and collectives (about one per parameter each).
      const size_t per_step = size_t(config_.run.grad_accum_steps + 1) * (model_->params().size() + 8);
      trace_ = std::make_unique<Trace>(r.rank, std::min<size_t>(size_t(config_.run.steps) * per_step, 1 << 20));
      model_->set_range_hook([this](const char* name, Clock::time_point begin, Clock::time_point end) {
        trace_lap(name, begin, end);
      });
    }
    tokens_per_row_ = shape.kind == DataShape::Tokens ? shape.context : 1;
    if (!config_.model.init_from.empty()) load_init(config_.model.init_from, *model_, *device_);
    for (const std::string& pattern : config_.model.freeze) {
      bool used = false;
      for (Parameter& p : model_->params()) {
        if (!name_matches(pattern, p.name)) continue;
        used = true;
        p.trainable = false;
        p.grad.reset();
      }
      if (!used) throw ConfigError("model.freeze: '" + pattern + "' matches no parameter of model '" + config_.model.name + "'");
    }
    // Batches are host memory (the models upload what they use): on a GPU
    // run the data's buffers come from a host device of their own.
    if (device_->kind() != DDP_DEVICE_CPU) host_device_ = std::make_unique<CpuDevice>();
    data_ = make_dataset(config_, shape, r.rank, r.world_size, host_device_ ? *host_device_ : *device_);
    optimizer_ = std::make_unique<Optimizer>(config_.optimizer, *device_, model_->params());
    for (size_t u = 0; u < config_.unfreeze.size(); ++u) {
      bool used = false;
      for (const Parameter& p : model_->params()) used |= name_matches(config_.unfreeze[u].params, p.name);
      if (!used)
        throw ConfigError("schedule.unfreeze[" + std::to_string(u) + "].params: '" + config_.unfreeze[u].params +
                          "' matches no parameter of model '" + config_.model.name + "'");
    }
    store_ = std::make_unique<Store>(env_.rendezvous, env_.run_id,
                                     std::chrono::milliseconds(int64_t(config_.run.timeout_s * 1000)));

    services_.rank = r;
    services_.device = device_.get();
    services_.model = model_.get();
    services_.optimizer = optimizer_.get();
    services_.store = store_.get();
    services_.timeout_ms = static_cast<int64_t>(config_.run.timeout_s * 1000);
    services_.refresh_param_table();
    refresh_trainable();

    // config → engine → transport
    plugins_.transport_lib = load_plugin(PluginKind::Transport, config_.transport_plugin);
    const ddp_transport_v1_t* t = plugins_.transport_lib->transport();
    require_device_cap("transport", t->name, t->caps);
    plugins_.transport_host = std::make_unique<PluginHost>(
        services_, config_.transport, std::string("transport plugin '") + t->name + "'");
    plugins_.transport_host->check(t->init(plugins_.transport_host->get(), &plugins_.comm), "init");
    config_.transport.check_all_read("transport", t->name);

    // engine → strategy (→ transport, metered)
    plugins_.strategy_lib = load_plugin(PluginKind::Strategy, config_.strategy_plugin);
    const ddp_strategy_v1_t* s = plugins_.strategy_lib->strategy();
    require_device_cap("strategy", s->name, s->caps);
    plugins_.strategy_host = std::make_unique<PluginHost>(
        services_, config_.strategy, std::string("strategy plugin '") + s->name + "'");
    plugins_.metered = std::make_unique<MeteredTransport>(t, plugins_.comm, services_);
    plugins_.metered->set_trace(trace_.get());
    plugins_.strategy_host->check(s->create(plugins_.strategy_host->get(), plugins_.metered->vtable(),
                                            plugins_.metered->comm(), &plugins_.strategy),
                                  "create");
    config_.strategy.check_all_read("strategy", s->name);
    remaining_uses_.assign(model_->params().size(), 0);
  }

  void require_device_cap(const char* kind, const char* name, uint64_t caps) const {
    const bool cuda = device_->kind() == DDP_DEVICE_CUDA;
    if (!(caps & (cuda ? DDP_CAP_DEVICE_CUDA : DDP_CAP_DEVICE_CPU)))
      throw Error(std::string(kind) + " plugin '" + name + "' does not support device '" + (cuda ? "cuda" : "cpu") +
                  "' (its caps lack DDP_CAP_DEVICE_" + (cuda ? "CUDA" : "CPU") + ")");
  }

  StepRecord train_step(int64_t step, const ddp_strategy_v1_t& api, const PluginHost& sh) {
    StepRecord rec;
    CommCounters& c = services_.counters;
    const int64_t blocked0 = c.blocked_ns, busy0 = c.busy_ns, calls0 = c.collectives, bytes0 = c.bytes;
    const int64_t allocations0 = device_->memory().allocations();
    if (trace_) trace_->set_step(step);
    const auto t0 = Clock::now();
    const Mark m0 = mark();
    const bool params_changed = apply_unfreeze(step);
    auto& params = model_->params();
    for (Parameter& p : params) {
      if (p.trainable) device_->fill(p.grad.data(), p.grad.numel(), 0.0f, device_->compute_stream());
    }
    // Micro-batches accumulate into the gradients; each one's loss is scaled
    // by 1/k so the sum is the gradient of the mean over k x the batch.
    const int64_t k = config_.run.grad_accum_steps;
    for (int64_t micro = 0; micro < k; ++micro) {
      if (micro == k - 1) rec.collectives_before_sync_micro_batch = c.collectives - calls0;
      for (size_t i = 0; i < params.size(); ++i) remaining_uses_[i] = params[i].uses;
      ddp_step_info info{sizeof(ddp_step_info), step, int32_t(micro), int32_t(k), micro == k - 1 ? 1 : 0,
                         params_changed && micro == 0 ? 1 : 0};
      auto t = Clock::now();
      Mark m = mark();
      sh.check(api.on_step_begin(plugins_.strategy, &info), "on_step_begin");
      trace_range("on_step_begin", m);
      t = Clock::now();
      const Batch batch = data_->batch(step * k + micro);
      rec.data_s += seconds_since(t);
      t = Clock::now();
      m = mark();
      {
        nvtx::Range range("forward");
        rec.loss += model_->forward(batch) / double(k);
      }
      rec.forward_s += seconds_since(t);
      trace_range("forward", m);
      t = Clock::now();
      m = mark();
      lap_ = m;  // the model's per-layer ranges start here
      nvtx::Range backward_range("backward");
      model_->backward(1.0f / float(k), [&](size_t index) {
        if (--remaining_uses_[index] != 0) return;
        rec.collectives_before_last_grad_ready = c.collectives - calls0;
        sh.check(api.on_grad_ready(plugins_.strategy, &services_.param_table[index]), "on_grad_ready");
      });
      // On a GPU backward has only been enqueued: wait for it, so that
      // backward_s is its time and the strategy's waits (comm_blocked_s) are
      // communication only. (The CPU's compute stream is this thread: a no-op.)
      device_->compute_stream().synchronize();
      trace_range("backward", m);
      rec.backward_s += seconds_since(t);  // the model's backward, as the trace's range
      const Mark backward_end = mark();
      sh.check(api.on_backward_end(plugins_.strategy), "on_backward_end");
      trace_range("on_backward_end", backward_end);
    }
    Mark m = mark();
    sh.check(api.finish(plugins_.strategy), "finish");
    trace_range("finish", m);
    take_peaks(device_->memory(), mem_before_optimizer_);

    auto t = Clock::now();
    m = mark();
    const int64_t blocked_before_optimizer = c.blocked_ns;
    {
      nvtx::Range optimizer_range("optimizer");
      if (api.caps & DDP_CAP_OWNS_OPTIMIZER) {
        sh.check(api.optimizer_step(plugins_.strategy), "optimizer_step");
      } else {
        optimizer_->step(params, trainable_);
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
    if (device_->comm_stream().failed()) throw Error(device_->comm_stream().error());
    plugins_.metered->settle(/*wait=*/false);  // a GPU's collectives the device has done
    rec.optimizer_s = seconds_since(t) - (c.blocked_ns - blocked_before_optimizer) * 1e-9;
    trace_range("optimizer", m);
    take_peaks(device_->memory(), mem_after_optimizer_);

    rec.step_s = seconds_since(t0);
    trace_range("step", m0);
    flush_device_ranges();
    rec.comm_blocked_s = (c.blocked_ns - blocked0) * 1e-9;
    rec.comm_busy_s = (c.busy_ns - busy0) * 1e-9;
    rec.collectives = c.collectives - calls0;
    rec.comm_bytes = c.bytes - bytes0;
    rec.comm_buffer_bytes = int64_t(device_->memory().current(MemCategory::CommBuffers));
    rec.device_allocations = device_->memory().allocations() - allocations0;
    return rec;
  }

  // Trace marks. On the CPU a mark is the host clock, which is when the
  // compute stream (the training thread) got there. On a GPU run the host
  // only enqueues: a mark is also a timestamp the compute stream takes when
  // the GPU gets there (a CUDA event), and the step's ranges are resolved to
  // those times at its end.
  struct Mark {
    Clock::time_point host;
    int stamp = -1;  // index in stamps_ (GPU runs with a trace)
  };
  Mark mark() {
    Mark m{Clock::now()};
    if (trace_ && device_->compute_stream().native()) {
      m.stamp = int(stamps_.size());
      stamps_.push_back(device_->compute_stream().record_timestamp());
    }
    return m;
  }

  // [begin, now] on the trace's compute lane, when tracing.
  void trace_range(const char* name, const Mark& begin) {
    if (!trace_) return;
    const Mark end = mark();
    if (begin.stamp < 0) {
      trace_->compute(name, begin.host, end.host);
    } else {
      device_ranges_.push_back({name, begin.stamp, end.stamp});
    }
  }

  // The model's per-layer backward ranges: each from the previous one's end.
  void trace_lap(const char* name, Clock::time_point begin, Clock::time_point end) {
    if (lap_.stamp < 0) {
      trace_->compute(name, begin, end);
      return;
    }
    const Mark now = mark();
    device_ranges_.push_back({name, lap_.stamp, now.stamp});
    lap_ = now;
  }

  // GPU runs: the step's ranges at the times the GPU reached their marks.
  void flush_device_ranges() {
    if (stamps_.empty()) return;
    Stream& s = device_->compute_stream();
    std::vector<Clock::time_point> at(stamps_.size());
    s.resolve_timestamps(stamps_.data(), stamps_.size(), at.data());
    for (const DeviceRange& r : device_ranges_) trace_->compute(r.name, at[r.begin], at[r.end]);
    for (void* stamp : stamps_) s.release_timestamp(stamp);
    stamps_.clear();
    device_ranges_.clear();
  }

  // Makes the parameters scheduled for `step` trainable (with a zeroed
  // gradient); returns whether any changed.
  bool apply_unfreeze(int64_t step) {
    bool changed = false;
    for (const UnfreezeConfig& u : config_.unfreeze) {
      if (u.step != step) continue;
      for (Parameter& p : model_->params()) {
        if (p.trainable || !name_matches(u.params, p.name)) continue;
        p.trainable = true;
        p.grad = Tensor(*device_, p.shape, MemCategory::Gradients);
        changed = true;
      }
    }
    if (changed) {
      services_.refresh_param_table();
      refresh_trainable();
    }
    return changed;
  }

  // The indices of trainable parameters; kept, not rebuilt every step.
  void refresh_trainable() {
    trainable_.clear();
    for (size_t i = 0; i < model_->params().size(); ++i)
      if (model_->params()[i].trainable) trainable_.push_back(i);
  }

  // An engine collective (not the strategy's): on the comm stream, waited
  // for here, not counted in the strategy's communication. `host` lists the
  // host buffers it reads and writes; on a GPU they travel through device
  // copies (a transport like nccl reads device memory only), and `call`
  // gets the pointers to use, in the same order, with the device's kind.
  using CollectiveCall =
      std::function<ddp_status(const ddp_transport_v1_t&, ddp_comm*, ddp_stream, void* const* ptrs, ddp_device_kind)>;
  void engine_collective(const CollectiveCall& call, const char* what,
                         std::initializer_list<std::pair<void*, size_t>> host) {
    const ddp_transport_v1_t& t = *plugins_.transport_lib->transport();
    Stream& stream = device_->comm_stream();
    const bool staged = device_->kind() != DDP_DEVICE_CPU;
    std::vector<Tensor> copies;
    std::vector<void*> ptrs;
    for (const auto& [ptr, bytes] : host) {
      if (!staged) {
        ptrs.push_back(ptr);
        continue;
      }
      copies.emplace_back(*device_, Shape{int64_t((bytes + sizeof(float) - 1) / sizeof(float))}, MemCategory::CommBuffers);
      device_->upload(copies.back().data(), ptr, bytes);
      ptrs.push_back(copies.back().data());
    }
    plugins_.transport_host->check(call(t, plugins_.comm, reinterpret_cast<ddp_stream>(&stream), ptrs.data(), device_->kind()), what);
    Event done;
    done.record(stream);
    done.synchronize(services_.wait_limit());
    if (!staged) return;
    size_t i = 0;
    for (const auto& [ptr, bytes] : host) device_->download(ptr, copies[i++].data(), bytes);
  }

  // Replaces the local losses since the last report by the global mean (the
  // loss single-process training would report), then prints from rank 0.
  void report(int64_t step) {
    const size_t begin = reported_;
    std::vector<float> losses;
    for (size_t i = begin; i < records_.size(); ++i) losses.push_back(static_cast<float>(records_[i].loss));
    engine_collective([&](const ddp_transport_v1_t& t, ddp_comm* comm, ddp_stream s, void* const* ptrs, ddp_device_kind kind) {
      const ddp_buffer buf{ptrs[0], losses.size(), DDP_FLOAT32, kind};
      return t.all_reduce(comm, &buf, DDP_REDUCE_AVG, s);
    }, "all_reduce of the loss", {{losses.data(), losses.size() * sizeof(float)}});
    for (size_t i = begin; i < records_.size(); ++i) records_[i].loss = losses[i - begin];
    reported_ = records_.size();
    if (env_.rank.rank != 0) return;
    const StepRecord& r = records_.back();
    std::printf("step %lld/%lld  loss %.6f  step %.2f ms  comm blocked %.2f ms  (%lld collectives, %.3f MB)\n",
                static_cast<long long>(step + 1), static_cast<long long>(config_.run.steps), r.loss,
                r.step_s * 1e3, r.comm_blocked_s * 1e3, static_cast<long long>(r.collectives),
                r.comm_bytes / 1e6);
    std::fflush(stdout);
  }

  void finish_run(const ddp_strategy_v1_t& api) {
    // Per-rank figures, gathered to every rank: peak bytes by category and
    // total communication time.
    std::vector<double> mine;
    for (int c = 0; c < kMemCategories; ++c)
      mine.push_back(double(std::max({mem_after_setup_[c], mem_before_optimizer_[c], mem_after_optimizer_[c]})));
    double blocked = 0, busy = 0;
    for (const auto& r : records_) blocked += r.comm_blocked_s, busy += r.comm_busy_s;
    mine.push_back(blocked);
    mine.push_back(busy);
    // 52 bits of the sequence fingerprint: exact in a double.
    mine.push_back(double(services_.counters.sequence_hash.load() >> 12));
    std::vector<double> all(mine.size() * env_.rank.world_size);
    engine_collective([&](const ddp_transport_v1_t& t, ddp_comm* comm, ddp_stream s, void* const* ptrs, ddp_device_kind kind) {
      const ddp_buffer send{ptrs[0], mine.size(), DDP_FLOAT64, kind};
      const ddp_buffer recv{ptrs[1], all.size(), DDP_FLOAT64, kind};
      return t.all_gather(comm, &send, &recv, s);
    }, "all_gather of the rank summaries", {{mine.data(), mine.size() * sizeof(double)}, {all.data(), all.size() * sizeof(double)}});
    if (env_.rank.rank != 0) return;

    namespace fs = std::filesystem;
    fs::create_directories(config_.run.output_dir);
    std::vector<NamedFloats> weights;
    std::vector<std::vector<float>> host;  // a GPU's weights, copied out
    for (const Parameter& p : model_->params()) {
      const float* values = device_->kind() == DDP_DEVICE_CPU ? p.data.data() : host.emplace_back(p.data.to_host()).data();
      weights.push_back({p.name, p.shape, values});
    }
    write_safetensors((fs::path(config_.run.output_dir) / "weights.safetensors").string(), weights);

    json summary;
    summary["world_size"] = env_.rank.world_size;
    summary["steps"] = config_.run.steps;
    summary["model"] = config_.model.name;
    summary["transport"] = plugins_.transport_lib->transport()->name;
    summary["strategy"] = api.name;
    auto column = [&](auto member) {
      json a = json::array();
      for (const auto& r : records_) a.push_back(r.*member);
      return a;
    };
    summary["loss"] = column(&StepRecord::loss);
    summary["step_time_s"] = column(&StepRecord::step_s);
    double total = 0;
    for (const auto& r : records_) total += r.step_s;
    summary["mean_step_time_s"] = records_.empty() ? 0.0 : total / records_.size();
    // Samples (tokens for lm) the whole run processes per second of step time.
    const double per_step = double(config_.data.batch_size) * double(config_.run.grad_accum_steps) *
                            double(tokens_per_row_);
    summary[tokens_per_row_ > 1 ? "tokens_per_s" : "samples_per_s"] = total > 0 ? per_step * records_.size() / total : 0.0;
    summary["data_s"] = column(&StepRecord::data_s);
    summary["forward_s"] = column(&StepRecord::forward_s);
    summary["backward_s"] = column(&StepRecord::backward_s);
    summary["optimizer_s"] = column(&StepRecord::optimizer_s);
    summary["comm_blocked_s"] = column(&StepRecord::comm_blocked_s);
    summary["comm_busy_s"] = column(&StepRecord::comm_busy_s);
    summary["collectives"] = column(&StepRecord::collectives);
    summary["comm_bytes"] = column(&StepRecord::comm_bytes);
    summary["collectives_before_last_grad_ready"] = column(&StepRecord::collectives_before_last_grad_ready);
    summary["collectives_before_sync_micro_batch"] = column(&StepRecord::collectives_before_sync_micro_batch);
    summary["comm_buffer_bytes"] = column(&StepRecord::comm_buffer_bytes);
    summary["device_allocations"] = column(&StepRecord::device_allocations);
    summary["total_comm_blocked_s"] = blocked;
    summary["total_comm_busy_s"] = busy;
    summary["peak_bytes"] = {{"after_setup", peaks_json(mem_after_setup_)},
                             {"before_optimizer_step", peaks_json(mem_before_optimizer_)},
                             {"after_optimizer_step", peaks_json(mem_after_optimizer_)}};
    json ranks = json::array();
    for (int r = 0; r < env_.rank.world_size; ++r) {
      const double* v = all.data() + r * mine.size();
      json peaks = json::object();
      for (int c = 0; c < kMemCategories; ++c) peaks[to_string(static_cast<MemCategory>(c))] = int64_t(v[c]);
      ranks.push_back({{"rank", r}, {"peak_bytes", peaks}, {"total_comm_blocked_s", v[kMemCategories]},
                       {"total_comm_busy_s", v[kMemCategories + 1]},
                       {"collective_sequence", uint64_t(v[kMemCategories + 2])}});
    }
    summary["ranks"] = ranks;
    bool agree = true;
    for (const auto& r : ranks) agree &= r["collective_sequence"] == ranks[0]["collective_sequence"];
    // A false here means ranks issued different collectives: with Gloo that
    // usually hangs; when it does not, data were silently mixed.
    summary["collective_sequences_agree"] = agree;
    if (api.stats) summary["strategy_stats"] = strategy_stats(api);
    summary["config"] = config_.toml_text;
    write_file_atomically((fs::path(config_.run.output_dir) / "summary.json").string(), summary.dump(2) + "\n");
  }

  json strategy_stats(const ddp_strategy_v1_t& api) {
    std::string buf(4096, '\0');
    size_t needed = 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      plugins_.strategy_host->check(api.stats(plugins_.strategy, buf.data(), buf.size(), &needed), "stats");
      if (needed < buf.size()) break;
      buf.assign(needed + 1, '\0');
    }
    buf.resize(std::strlen(buf.c_str()));
    json parsed = json::parse(buf, nullptr, /*allow_exceptions=*/false);
    return parsed.is_discarded() ? json(buf) : parsed;
  }

  Config config_;
  RankEnv env_;
  TrainObserver* observer_;
  std::string trace_path_;        // empty: no trace
  std::unique_ptr<Trace> trace_;  // before device_: outlives the comm stream's tasks
  struct DeviceRange {
    const char* name;
    int begin, end;  // indices in stamps_
  };
  std::vector<void*> stamps_;  // this step's device timestamps (GPU runs with a trace)
  std::vector<DeviceRange> device_ranges_;
  Mark lap_;  // where the model's next per-layer range begins
  std::unique_ptr<Device> device_;  // run.device; made first in set_up
  std::unique_ptr<Device> host_device_;  // the data's buffers on a GPU run
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Store> store_;
  HostServices services_;
  Plugins plugins_;  // after services_: destroyed before what it points to
  std::unique_ptr<Dataset> data_;
  std::vector<size_t> trainable_;  // indices of trainable parameters
  int64_t tokens_per_row_ = 1;  // positions a row trains (lm: context_length)
  std::vector<int> remaining_uses_;
  std::vector<StepRecord> records_;
  size_t reported_ = 0;
  PeakBytes mem_after_setup_{}, mem_before_optimizer_{}, mem_after_optimizer_{};
};

}  // namespace

// The model the config names, and what data it consumes.
std::unique_ptr<Model> build_model(const ModelConfig& m, Device& device, uint64_t seed, DataShape* shape) {
  if (m.name == "lm") {
    LmConfig c = lm_preset(m.preset);
    for (auto [field, value] : {std::pair{&c.vocab_size, m.vocab_size}, {&c.context_length, m.context_length},
                                {&c.d_model, m.d_model}, {&c.num_layers, m.num_layers}, {&c.num_heads, m.num_heads},
                                {&c.d_ff, m.d_ff}})
      if (value) *field = value;
    if (m.rope_theta > 0) c.rope_theta = m.rope_theta;
    *shape = DataShape{DataShape::Tokens, 0, 0, c.context_length, c.vocab_size};
    return make_lm(c, device, seed);
  }
  if (m.name == "mlp") {
    *shape = DataShape{DataShape::Classification, m.width, m.classes, 0, 0};
    return make_mlp(MlpConfig{m.width, m.depth, m.classes}, device, seed);
  }
  auto model = make_model(m.name, device, seed);
  *shape = DataShape{DataShape::Regression, model->input_width(), model->output_width(), 0, 0};
  return model;
}

void train_rank(const Config& config, const RankEnv& env, TrainObserver* observer) {
  RankRun(config, env, observer).run();
}

}  // namespace ddp
