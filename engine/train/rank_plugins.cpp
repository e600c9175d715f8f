// rank_plugins.cpp — see rank_plugins.h.
#include "rank_plugins.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "collective_check.h"
#include "mapped.h"
#include "staged.h"
#include "whereabouts.h"

namespace ddp {

RankPlugins::RankPlugins(const Config& config, HostServices& services) : services_(services) {
  transport_lib_ = load_plugin(PluginKind::Transport, config.transport_plugin);
  require_device_cap("transport", transport_lib_->transport()->name, transport_lib_->transport()->caps);
  strategy_lib_ = load_plugin(PluginKind::Strategy, config.strategy_plugin);
  require_device_cap("strategy", strategy_api().name, strategy_api().caps);
  const std::string reduce = reduce_refusal(strategy_api().caps, config.precision.reduce, config.strategy_plugin);
  if (!reduce.empty()) throw ConfigError(config.file + ": " + reduce);
  // Before init: ranks another launcher started (mpirun, srun) were not
  // checked by `ddp run`'s launcher.
  check_declared_keys(*transport_lib_, config.transport);
  check_declared_keys(*strategy_lib_, config.strategy);
  // A unit's hooks by the unit's name: where a stuck gather waits, named.
  for (const ddp_unit& u : services_.params.unit_table) {
    for (const char* phase : {"FORWARD_BEGIN", "FORWARD_END", "BACKWARD_BEGIN", "BACKWARD_END"})
      unit_entries_.push_back(std::string("on_unit(") + u.name + ", " + phase + ")");
    unit_entries_.push_back(std::string("unit_values(") + u.name + ")");
    unit_entries_.push_back(std::string("take_values(") + u.name + ")");
  }
}

void RankPlugins::start(const Config& config, Trace* trace) {
  try {
    start_transport(config);        // config → engine → transport
    start_strategy(config, trace);  // engine → strategy (→ transport, metered)
  } catch (const std::bad_alloc& e) {
    const Error error(words_of(e), DDP_ERR_OUT_OF_MEMORY);
    whereabouts::report_first(error);  // as below
    abort();
    shutdown();
    throw error;
  } catch (const std::exception& e) {
    whereabouts::report_first(e);  // first: the mpi transport's abort ends the process (MPI_Abort)
    abort();
    shutdown();
    throw;
  } catch (...) {
    abort();
    shutdown();
    throw;
  }
}

RankPlugins::~RankPlugins() { shutdown(); }

std::string RankPlugins::identity() const {
  const ddp_transport_v1_t& t = *transport_lib_->transport();
  return std::string("transport ") + t.name + " " + t.version + ", strategy " + strategy_api().name + " " +
         strategy_api().version;
}

void RankPlugins::start_transport(const Config& config) {
  const ddp_transport_v1_t* t = transport_lib_->transport();
  transport_host_ =
      std::make_unique<PluginHost>(services_, config.transport, std::string("transport plugin '") + t->name + "'");
  ddp_status status;
  {
    whereabouts::Inside in(transport_host_->label().c_str(), "init");
    status = t->init(transport_host_->get(), &comm_);
  }
  whereabouts::arm_exit_report();  // before exit handlers its init registered (mpi: MPI_Finalize)
  transport_host_->check(status, "init");
  config.transport.check_all_read("transport", t->name);
}

void RankPlugins::start_strategy(const Config& config, Trace* trace) {
  const ddp_strategy_v1_t* s = strategy_lib_->strategy();
  strategy_host_ =
      std::make_unique<PluginHost>(services_, config.strategy, std::string("strategy plugin '") + s->name + "'");
  strategy_host_->set_caps(s->caps);
  metered_ = std::make_unique<MeteredTransport>(transport_lib_->transport(), comm_, services_,
                                                transport_host_->label().c_str());
  metered_->set_trace(trace);
  metered_->serve_strategy_of_minor(DDP_ABI_MINOR(s->abi_version));
  metered_->set_debug_collectives(config.run.debug_collectives);
  services_.split = [this](ddp_comm* parent, int color, int key, const char* name) {
    return metered_->split(parent, color, key, name);
  };
  services_.group = [this](ddp_comm* comm) { return metered_->group(comm); };
  SplitsOpen open(services_);
  call("create", [&] { return s->create(strategy_host_->get(), metered_->vtable(), metered_->comm(), &strategy_); });
  whereabouts::arm_exit_report();  // before exit handlers its create registered
  config.strategy.check_all_read("strategy", s->name);
}

void RankPlugins::require_device_cap(const char* kind, const char* name, uint64_t caps) const {
  const bool cuda = services_.device->kind() == DDP_DEVICE_CUDA;
  if (!supports_device(caps, services_.device->kind()))
    throw Error(std::string(kind) + " plugin '" + name + "' does not support device '" + (cuda ? "cuda" : "cpu") +
                    "' (its caps lack DDP_CAP_DEVICE_" + (cuda ? "CUDA" : "CPU") + ")",
                DDP_ERR_UNSUPPORTED);
}

void RankPlugins::on_train_begin() {
  SplitsOpen open(services_);
  call("on_train_begin", [&] { return strategy_api().on_train_begin(strategy_); });
}
// The hooks a strategy may leave NULL (1.4) do nothing then.
void RankPlugins::on_step_begin(const ddp_step_info& info) {
  if (strategy_api().on_step_begin)
    call("on_step_begin", [&] { return strategy_api().on_step_begin(strategy_, &info); });
}
void RankPlugins::on_grad_ready(const ddp_param& param) {
  if (strategy_api().on_grad_ready)
    call("on_grad_ready", [&] { return strategy_api().on_grad_ready(strategy_, &param); });
}
void RankPlugins::on_backward_end() {
  if (strategy_api().on_backward_end)
    call("on_backward_end", [&] { return strategy_api().on_backward_end(strategy_); });
}
void RankPlugins::finish() {
  call("finish", [&] { return strategy_api().finish(strategy_); });
}
void RankPlugins::optimizer_step() {
  call("optimizer_step", [&] { return strategy_api().optimizer_step(strategy_); });
}
void RankPlugins::on_unit(size_t unit, ddp_unit_phase phase) {
  const char* entry = unit < unit_entries_.size() / 6 ? unit_entries_[6 * unit + size_t(phase)].c_str() : "on_unit";
  if (strategy_api().on_unit) call(entry, [&] { return strategy_api().on_unit(strategy_, unit, phase); });
}
void RankPlugins::on_train_end() {
  if (strategy_api().on_train_end) call("on_train_end", [&] { return strategy_api().on_train_end(strategy_); });
}

bool RankPlugins::on_step_end(const ddp_step_info& info) {
  if (!strategy_api().on_step_end) return true;
  int synced = 1;
  // Under a divergent strategy the ranks' answers are compared every step,
  // and what it issues in the entry before each collective (set_step_end):
  // ranks that disagree stop here, naming the step and what each did,
  // before their collectives can mismatch (a transport's timeout or abort).
  const bool check = divergent() && services_.rank.world_size > 1;
  struct StepEnd {
    MeteredTransport& metered;
    ~StepEnd() { metered.set_step_end(false, 0); }
  } step_end{*metered_};  // (the check ends with the entry, however it ends)
  metered_->set_step_end(check, info.step);
  call("on_step_end", [&] { return strategy_api().on_step_end(strategy_, &info, &synced); });
  if (synced == 0 && !divergent())
    throw Error(strategy_host_->label() + ": on_step_end said the replicas may differ after step " +
                    std::to_string(info.step + 1) +
                    ", but its caps lack DDP_CAP_DIVERGENT (replicas that may "
                    "differ between sync points)",
                DDP_ERR_INTERNAL);
  if (check) compare_step_end(info.step, synced != 0);
  return synced != 0;
}

// What `state` (or another entry) points the engine at, checked before it
// is read: a count larger than the memory behind the pointer ("" where the
// device's memory is not this process's to look up).
std::string RankPlugins::unreadable_on_cpu(const void* ptr, size_t count, size_t size) const {
  if (services_.device->kind() != DDP_DEVICE_CPU) return "";
  if (count > SIZE_MAX / size)
    return "its " + std::to_string(count) + " elements of " + std::to_string(size) + " bytes overflow a size";
  return unreadable(ptr, count * size);
}

// Each rank's return from on_step_end (kStepEnd), gathered as the metered
// transport gathers a description: a rank still in the entry, about to
// issue a collective the others do not, meets it in the same all-gather.
void RankPlugins::compare_step_end(int64_t step, bool synced) {
  const size_t world = size_t(services_.rank.world_size);
  std::vector<int64_t> mine(kCallWords);
  std::vector<int64_t> all(kCallWords * world);
  to_words(CollectiveCall{0, kStepEnd, synced ? 1 : 0, 0, step, -1}, mine.data());
  {
    whereabouts::Inside in(strategy_host_->label().c_str(), "on_step_end (the ranks comparing their answers)");
    gather_words(mine.data(), all.data(), mine.size(), all.size(), DDP_FLOAT64,
                 "all_gather of the ranks' answers to on_step_end", &step_end_staged_);
  }
  std::vector<std::string> names;
  for (const ddp_param& p : services_.params.param_table) names.emplace_back(p.name);
  const std::string mismatch = step_end_mismatch(all, int(world), names, step);
  if (!mismatch.empty()) throw Error(strategy_host_->label() + ": on_step_end: " + mismatch, DDP_ERR_INVALID_ARGUMENT);
}

std::vector<RankPlugins::StateBuffer> RankPlugins::state() {
  std::vector<StateBuffer> out;
  if (!strategy_api().state) return out;
  const ddp_state_buffer* buffers = nullptr;
  size_t count = 0;
  call("state", [&] { return strategy_api().state(strategy_, &buffers, &count); });
  const std::string label = strategy_host_->label() + ": state: ";
  if (count > 0 && !buffers) throw Error(label + std::to_string(count) + " buffers at NULL", DDP_ERR_INVALID_ARGUMENT);
  if (const std::string past = unreadable_on_cpu(buffers, count, sizeof(ddp_state_buffer)); !past.empty())
    throw Error(label + "its " + std::to_string(count) + " buffers: " + past, DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < count; ++k) {
    const ddp_state_buffer& b = buffers[k];
    std::string name = b.name ? b.name : "";
    const std::string which = "buffer " + std::to_string(k) + " ('" + name + "')";
    bool unique =
        !name.empty() &&
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") == std::string::npos;
    for (const StateBuffer& earlier : out) unique = unique && earlier.name != name;
    unique = unique && name != "__metadata__";  // the safetensors header's own
    if (!unique) throw Error(label + which + " needs a name of its own of [A-Za-z0-9_.]", DDP_ERR_INVALID_ARGUMENT);
    if (b.count > 0 && !b.ptr)
      throw Error(label + which + " is NULL with " + std::to_string(b.count) + " elements", DDP_ERR_INVALID_ARGUMENT);
    if (const std::string past = unreadable_on_cpu(b.ptr, b.count, sizeof(float)); !past.empty())
      throw Error(label + which + " of " + std::to_string(b.count) + " elements: " + past, DDP_ERR_INVALID_ARGUMENT);
    out.push_back({std::move(name), static_cast<float*>(b.ptr), b.count});
  }
  if (!strategy_api().state_scopes || out.empty()) return out;
  const ddp_state_scope* scopes = nullptr;
  size_t scoped = 0;
  call("state_scopes", [&] { return strategy_api().state_scopes(strategy_, &scopes, &scoped); });
  if (!scopes)
    throw Error(strategy_host_->label() + ": state_scopes: no scopes (NULL) for the " + std::to_string(out.size()) +
                    " buffers state gave",
                DDP_ERR_INVALID_ARGUMENT);
  if (scoped != out.size())
    throw Error(strategy_host_->label() + ": state_scopes: " + std::to_string(scoped) + " scopes for the " +
                    std::to_string(out.size()) + " buffers state gave",
                DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < out.size(); ++k) {
    if (scopes[k] != DDP_STATE_PER_RANK && scopes[k] != DDP_STATE_EQUAL)
      throw Error(strategy_host_->label() + ": state_scopes: buffer '" + out[k].name + "' has scope " +
                      std::to_string(int(scopes[k])) + ", neither DDP_STATE_PER_RANK nor DDP_STATE_EQUAL",
                  DDP_ERR_INVALID_ARGUMENT);
    out[k].equal = scopes[k] == DDP_STATE_EQUAL;
  }
  return out;
}

void RankPlugins::unit_values(size_t unit, bool hold) {
  const char* entry = unit < unit_entries_.size() / 6 ? unit_entries_[6 * unit + 4].c_str() : "unit_values";
  call(entry, [&] { return strategy_api().unit_values(strategy_, unit, hold ? 1 : 0); });
}

bool RankPlugins::takes_values() const {
  return strategy_api().take_values != nullptr && (strategy_api().caps & DDP_CAP_OWNS_PARAMETERS) &&
         !services_.params.unit_table.empty();
}

void RankPlugins::take_values(size_t unit) {
  const char* entry = unit < unit_entries_.size() / 6 ? unit_entries_[6 * unit + 5].c_str() : "take_values";
  call(entry, [&] { return strategy_api().take_values(strategy_, unit); });
}

std::optional<std::vector<size_t>> RankPlugins::held_grads() {
  const ddp_strategy_v1_t& api = strategy_api();
  if (!api.held_grads) return std::nullopt;
  std::vector<size_t> held(services_.params.param_table.size());
  size_t count = 0;
  int partitioned = 0;
  call("held_grads", [&] { return api.held_grads(strategy_, held.data(), held.size(), &count, &partitioned); });
  if (!partitioned) return std::nullopt;
  if (count > held.size())
    throw Error(strategy_host_->label() + ": held_grads: count " + std::to_string(count) + " exceeds the " +
                std::to_string(held.size()) + " parameters");
  held.resize(count);
  return held;
}

std::optional<GradRanges> RankPlugins::grad_ranges() {
  const ddp_strategy_v1_t& api = strategy_api();
  if (!api.grad_ranges) return std::nullopt;
  const ddp_range* ranges = nullptr;
  size_t count = 0;
  int partitioned = 0;
  call("grad_ranges", [&] { return api.grad_ranges(strategy_, &ranges, &count, &partitioned); });
  if (count > 0 && !ranges)
    throw Error(strategy_host_->label() + ": grad_ranges: " + std::to_string(count) + " ranges at NULL",
                DDP_ERR_INVALID_ARGUMENT);
  return GradRanges{ranges, count, partitioned != 0};
}

std::vector<ddp_held_range> RankPlugins::held_ranges() {
  const ddp_held_range* held = nullptr;
  size_t count = 0;
  call("held_ranges", [&] { return strategy_api().held_ranges(strategy_, &held, &count); });
  if (count > 0 && !held)
    throw Error(strategy_host_->label() + ": held_ranges: " + std::to_string(count) + " ranges at NULL",
                DDP_ERR_INVALID_ARGUMENT);
  if (const std::string past = unreadable(held, count > SIZE_MAX / sizeof *held ? SIZE_MAX : count * sizeof *held);
      !past.empty())
    throw Error(strategy_host_->label() + ": held_ranges: its " + std::to_string(count) + " ranges: " + past,
                DDP_ERR_INVALID_ARGUMENT);
  return std::vector<ddp_held_range>(held, held + count);
}

bool RankPlugins::stats(nlohmann::ordered_json* out) {
  const ddp_strategy_v1_t& api = strategy_api();
  if (!api.stats) return false;
  std::string buf(4096, '\0');
  size_t needed = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    call("stats", [&] { return api.stats(strategy_, buf.data(), buf.size(), &needed); });
    if (needed < buf.size()) break;
    buf.assign(needed + 1, '\0');
  }
  buf.resize(std::strlen(buf.c_str()));
  nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(buf, nullptr, /*allow_exceptions=*/false);
  *out = parsed.is_discarded() ? nlohmann::ordered_json(buf) : parsed;
  return true;
}

void RankPlugins::engine_collective(const Call& call, const char* what,
                                    std::initializer_list<std::pair<void*, size_t>> host, std::vector<Tensor>* keep) {
  Device& device = *services_.device;
  Stream& stream = device.comm_stream();
  const ddp_status status = run_staged(
      device, stream,
      [&](void* const* ptrs) {
        return call(*transport_lib_->transport(), comm_, reinterpret_cast<ddp_stream>(&stream), ptrs, device.kind());
      },
      host, services_.wait_limit(), keep);
  transport_host_->check(status, what);
}

void RankPlugins::all_gather(const std::vector<double>& mine, std::vector<double>& all) {
  gather_words(mine.data(), all.data(), mine.size(), all.size(), DDP_FLOAT64, "all_gather of the rank summaries");
}

void RankPlugins::step_all_gather(const std::vector<double>& mine, std::vector<double>& all) {
  gather_words(mine.data(), all.data(), mine.size(), all.size(), DDP_FLOAT64,
               "all_gather of the gradients' norm parts or overflow verdicts", &step_gather_staged_);
}

void RankPlugins::all_gather(const std::vector<int64_t>& mine, std::vector<int64_t>& all) {
  // As float64 words: every transport supports float64 (int64 is optional
  // in the ABI), and an all-gather copies the bits whatever they are.
  gather_words(mine.data(), all.data(), mine.size(), all.size(), DDP_FLOAT64, "all_gather of the replica digests");
}

void RankPlugins::gather_words(const void* mine, void* all, size_t send, size_t recv, ddp_dtype dtype, const char* what,
                               std::vector<Tensor>* keep) {
  std::vector<char> copy(static_cast<const char*>(mine), static_cast<const char*>(mine) + send * 8);  // read-write
  engine_collective(
      [send, recv, dtype](const ddp_transport_v1_t& t, ddp_comm* comm, ddp_stream s, void* const* ptrs,
                          ddp_device_kind kind) {
        const ddp_buffer send_buf{ptrs[0], send, dtype, kind};
        const ddp_buffer recv_buf{ptrs[1], recv, dtype, kind};
        return t.all_gather(comm, &send_buf, &recv_buf, s);
      },
      what, {{copy.data(), send * 8}, {all, recv * 8}}, keep);
}

void RankPlugins::abort() {
  aborted_ = true;
  const ddp_transport_v1_t* t = transport_lib_ ? transport_lib_->transport() : nullptr;
  if (metered_) metered_->abort_groups();
  if (t && t->abort && comm_) t->abort(comm_);
}

// Nothing enqueued may outlive the code it calls into: the streams are
// drained before each plugin is destroyed and after (destroy may enqueue),
// all before the libraries are unloaded. A failed stream cancels what is
// left at once.
void RankPlugins::shutdown() {
  if (strategy_) {
    drain();
    whereabouts::Inside in(strategy_host_->label().c_str(), "destroy");
    strategy_api().destroy(strategy_);
    strategy_ = nullptr;
  }
  drain();
  services_.split = nullptr;
  services_.group = nullptr;
  if (metered_) metered_->release_groups();  // the groups' communicators, before the world's
  drain();
  step_end_staged_.clear();  // device memory, as the metered transport's below
  step_gather_staged_.clear();
  metered_.reset();  // releases its device timestamps
  if (comm_) {
    whereabouts::Inside in(transport_host_->label().c_str(), "destroy");
    transport_lib_->transport()->destroy(comm_);
    comm_ = nullptr;
  }
  drain();
  strategy_host_.reset();
  transport_host_.reset();
  strategy_lib_.reset();
  transport_lib_.reset();
}

void RankPlugins::drain() {
  Device* device = services_.device;
  if (!device) return;
  whereabouts::Inside in(nullptr, "draining the streams");  // bounded by the watchdog
  if (aborted_) {
    for (Stream* stream : {&device->comm_stream(), &device->compute_stream()}) {
      if (stream->drained_within(std::chrono::seconds(1))) continue;
      std::fflush(nullptr);  // the failure is reported; what was printed stays
      std::_Exit(1);
    }
    return;
  }
  try {
    device->comm_stream().synchronize();
  } catch (const std::exception&) {}
  try {  // a GPU's compute stream may hold a plugin's host functions too
    device->compute_stream().synchronize();
  } catch (const std::exception&) {}
}

}  // namespace ddp
