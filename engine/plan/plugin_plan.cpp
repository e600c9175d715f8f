// plugin_plan.cpp — see plugin_plan.h.
#include "plugin_plan.h"

#include <deque>
#include <functional>

#include "error.h"

namespace ddp {
namespace plan {
namespace {

// The host a plan entry gets (ddp/abi/host.h: which entries it has) and the
// ddp_plan it reports through, for one call.
class PlanningCall {
 public:
  PlanningCall(const PluginSection& section, const PlanRun& run, int rank, std::string label)
      : section_(section), run_(run), part_() {
    part_.label = std::move(label);
    part_.planned = true;
    const Footprint& f = *run.model;
    part_.claimed.assign(f.params.size(), false);
    part_.claimed_values.assign(f.params.size(), false);
    std::vector<size_t> unit_of(f.params.size(), DDP_NO_UNIT);
    for (size_t u = 0; u < f.units.size(); ++u)
      for (size_t i : f.units[u].params) unit_of[i] = u;
    for (size_t i = 0; i < f.params.size(); ++i) {
      ddp_param p{};
      p.name = f.params[i].name.c_str();
      p.index = i;
      p.numel = size_t(f.params[i].elements);
      p.dtype = DDP_FLOAT32;  // `ddp plan` plans runs that train every parameter
      p.trainable = 1;
      p.ndim = f.params[i].shape.size();
      p.shape = f.params[i].shape.data();
      p.unit = unit_of[i];
      p.uses = 1;
      params_.push_back(p);
    }
    for (size_t u = 0; u < f.units.size(); ++u)
      units_.push_back({f.units[u].name.c_str(), u, f.units[u].params.data(), f.units[u].params.size(),
                        f.units[u].tied.data(), f.units[u].tied.size()});
    host_.abi_version = DDP_ABI_VERSION;
    host_.struct_size = sizeof(ddp_host);
    host_.ctx = this;
    host_.rank = rank;
    host_.world_size = run.world;
    host_.local_rank = rank;
    host_.device = run.device;
    host_.timeout_ms = run.timeout_ms;
    host_.log = [](void*, ddp_log_level, const char*) {};
    host_.set_error = [](void* ctx, const char* m) { self(ctx).error_ = m ? m : ""; };
    host_.config_int = [](void* ctx, const char* key, int64_t fallback, int64_t* out) {
      return self(ctx).read([&] { *out = self(ctx).section_.get_int(key, fallback); });
    };
    host_.config_float = [](void* ctx, const char* key, double fallback, double* out) {
      return self(ctx).read([&] { *out = self(ctx).section_.get_float(key, fallback); });
    };
    host_.config_bool = [](void* ctx, const char* key, int fallback, int* out) {
      return self(ctx).read([&] { *out = self(ctx).section_.get_bool(key, fallback != 0) ? 1 : 0; });
    };
    host_.config_string = [](void* ctx, const char* key, const char* fallback, const char** out) {
      return self(ctx).read([&] {
        self(ctx).strings_.push_back(self(ctx).section_.get_string(key, fallback ? fallback : ""));
        *out = self(ctx).strings_.back().c_str();
      });
    };
    host_.param_count = [](void* ctx) { return self(ctx).params_.size(); };
    host_.param = [](void* ctx, size_t i) -> const ddp_param* {
      return i < self(ctx).params_.size() ? &self(ctx).params_[i] : nullptr;
    };
    host_.precision = [](void* ctx) -> const ddp_precision* { return &self(ctx).run_.precision; };
    host_.unit_count = [](void* ctx) { return self(ctx).units_.size(); };
    host_.unit = [](void* ctx, size_t i) -> const ddp_unit* {
      return i < self(ctx).units_.size() ? &self(ctx).units_[i] : nullptr;
    };
    set_up_plan();
  }

 private:
  // The ddp_plan the entry reports through: each callback records into part_.
  void set_up_plan() {
    plan_.struct_size = sizeof(ddp_plan);
    plan_.ctx = this;
    plan_.micro_steps = run_.micro_steps;
    plan_.clips = run_.clips ? 1 : 0;
    plan_.collective = [](void* ctx, const ddp_plan_collective* c) {
      return self(ctx).record([&] {
        if (!c || c->op < DDP_OP_ALL_REDUCE || c->op > DDP_OP_BARRIER || ddp_dtype_size(c->dtype) == 0)
          throw Error("collective: not a collective this ABI names (op " + std::to_string(c ? int(c->op) : -1) + ")");
        const size_t size = ddp_dtype_size(c->dtype);
        const std::string problem = plan_bytes_problem(c->count > UINT64_MAX / size ? UINT64_MAX : c->count * size,
                                                       self(ctx).collective_bytes_);
        if (!problem.empty())
          throw Error("collective: " + std::to_string(c->count) + " elements of " + std::to_string(size) +
                      " bytes: " + problem);
        self(ctx).collective_bytes_ += int64_t(c->count * size);
        self(ctx).part_.collectives.push_back(*c);
        self(ctx).part_.every.push_back(self(ctx).every_);
        self(ctx).part_.groups.push_back(0);
      });
    };
    plan_.group_collective = [](void* ctx, const ddp_plan_collective* c, int group_size) {
      const ddp_status status = self(ctx).plan_.collective(ctx, c);
      if (status != DDP_OK) return status;
      return self(ctx).record([&] {
        const int world = self(ctx).run_.world;
        if (group_size < 1 || group_size > world)
          throw Error("group_collective: a group of " + std::to_string(group_size) + " ranks in a world of " +
                      std::to_string(world));
        self(ctx).part_.groups.back() = group_size == world ? 0 : group_size;
      });
    };
    plan_.every = [](void* ctx, int64_t steps) {
      return self(ctx).record([&] {
        int64_t& every = self(ctx).every_;
        for (int64_t other : self(ctx).part_.every)
          if (other != 1 && other != steps && steps != 1)
            throw Error("every: collectives every " + std::to_string(steps) + " steps and every " +
                        std::to_string(other) + ": one period a plan");
        if (steps < 1) throw Error("every: " + std::to_string(steps) + " steps: at least 1");
        every = steps;
      });
    };
    plan_.buffer = [](void* ctx, ddp_mem_category category, size_t bytes, ddp_plan_when when) {
      return self(ctx).record([&] { self(ctx).add_buffer(category, bytes, when); });
    };
    plan_.steps = [](void* ctx, size_t param, size_t offset, size_t count) {
      return self(ctx).record([&] { self(ctx).add_steps(param, offset, count); });
    };
    plan_.claims = [](void* ctx, ddp_storage what, size_t param) {
      return self(ctx).record([&] {
        if (what != DDP_STORAGE_GRAD && what != DDP_STORAGE_DATA)
          throw Error("claims: storage " + std::to_string(int(what)) +
                      " is none of DDP_STORAGE_GRAD and DDP_STORAGE_DATA");
        self(ctx).param_at(param, "claims");
        (what == DDP_STORAGE_GRAD ? self(ctx).part_.claimed : self(ctx).part_.claimed_values)[param] = true;
      });
    };
    plan_.leaner = [](void* ctx, const char* key, const char* value) {
      return self(ctx).record([&] {
        if (!key || !*key || !value || !*value) throw Error("leaner: a key and a value, neither empty");
        self(ctx).part_.leaner.emplace_back(key, value);
      });
    };
  }

 public:
  const ddp_host* host() const { return &host_; }
  ddp_plan* plan() { return &plan_; }
  // The part, or Error in the plugin's words where `status` says it failed.
  // A callback's refusal stands even where the entry went on to return DDP_OK.
  PluginPart take(ddp_status status) {
    if (status != DDP_OK || !error_.empty())
      throw Error(part_.label + ": plan: " + (error_.empty() ? std::string("failed without an error message") : error_),
                  status != DDP_OK ? status : DDP_ERR_INVALID_ARGUMENT);
    return std::move(part_);
  }

 private:
  static PlanningCall& self(void* ctx) { return *static_cast<PlanningCall*>(ctx); }
  template <typename Body>
  ddp_status read(Body&& body) {
    try {
      body();
      return DDP_OK;
    } catch (const std::exception& e) {
      error_ = e.what();
      return DDP_ERR_INVALID_ARGUMENT;
    }
  }
  template <typename Body>
  ddp_status record(Body&& body) {
    return read(std::forward<Body>(body));
  }
  const ddp_param& param_at(size_t param, const char* entry) const {
    if (param >= params_.size())
      throw Error(std::string(entry) + ": parameter " + std::to_string(param) + " is not in the table of " +
                  std::to_string(params_.size()));
    return params_[param];
  }
  void add_buffer(ddp_mem_category category, size_t bytes, ddp_plan_when when) {
    if (category < 0 || category >= DDP_MEM_CATEGORY_COUNT)
      throw Error("buffer: unknown memory category " + std::to_string(int(category)));
    if (when != DDP_PLAN_SETUP && when != DDP_PLAN_STEP) throw Error("buffer: `when` is neither SETUP nor STEP");
    if (const std::string problem = plan_bytes_problem(bytes, buffer_bytes_); !problem.empty())
      throw Error("buffer: " + problem);
    buffer_bytes_ += int64_t(bytes);
    (when == DDP_PLAN_SETUP ? part_.setup : part_.step)[size_t(category)] += int64_t(bytes);
  }
  void add_steps(size_t param, size_t offset, size_t count) {
    const ddp_param& p = param_at(param, "steps");
    if (offset > p.numel || count > p.numel - offset)
      throw Error("steps: elements [" + std::to_string(offset) + ", " + std::to_string(offset + count) +
                  ") are outside parameter '" + p.name + "' of " + std::to_string(p.numel));
    part_.says_steps = true;
    part_.stepped += int64_t(count);
  }

  const PluginSection& section_;
  const PlanRun& run_;
  PluginPart part_;
  int64_t every_ = 1;         // the period of the collectives reported now (1.8)
  int64_t buffer_bytes_ = 0;  // recorded so far (each within kMaxPlannedBytes)
  int64_t collective_bytes_ = 0;
  std::string error_;
  std::deque<std::string> strings_;
  std::vector<ddp_param> params_;
  std::vector<ddp_unit> units_;
  ddp_host host_{};
  ddp_plan plan_{};
};

// A plugin without a plan entry: nothing planned.
PluginPart unplanned(const std::string& label) {
  PluginPart part;
  part.label = label;
  return part;
}

}  // namespace

std::string plan_bytes_problem(uint64_t bytes, int64_t recorded) {
  if (bytes <= uint64_t(kMaxPlannedBytes - recorded)) return "";
  return std::to_string(bytes) + " bytes" +
         (recorded > 0 ? " (with the " + std::to_string(recorded) + " it reported before)" : std::string()) +
         " are more than a rank can hold: a plan entry's sizes add up to at most 2^50 bytes (1 PiB) a rank";
}

PluginPart plan_strategy(const ddp_strategy_v1_t& s, const ddp_transport_v1_t& t, const PluginSection& section,
                         const PlanRun& run, int rank) {
  const std::string label = std::string("strategy plugin '") + s.name + "'";
  if (!DDP_PLUGIN_HAS(&s, plan)) return unplanned(label);
  PlanningCall call(section, run, rank, label);
  PluginPart part = call.take(s.plan(call.host(), &t, call.plan()));
  part.takes_values = DDP_PLUGIN_HAS(&s, take_values) && (s.caps & DDP_CAP_OWNS_PARAMETERS) &&
                      !run.model->units.empty();  // as the engine lends them (rank_plugins.h)
  return part;
}

PluginPart plan_transport(const ddp_transport_v1_t& t, const PluginSection& section, const PlanRun& run, int rank,
                          const std::vector<ddp_plan_collective>& collectives, const std::vector<int>& groups) {
  const std::string label = std::string("transport plugin '") + t.name + "'";
  if (!DDP_PLUGIN_HAS(&t, plan)) return unplanned(label);
  PlanningCall call(section, run, rank, label);
  call.plan()->collectives = collectives.data();
  call.plan()->collective_count = collectives.size();
  std::vector<int32_t> sizes;  // (1.9) each collective's group size, the world's where it names none
  for (size_t k = 0; k < collectives.size(); ++k)
    sizes.push_back(k < groups.size() && groups[k] ? groups[k] : run.world);
  call.plan()->group_sizes = sizes.data();
  return call.take(t.plan(call.host(), call.plan()));
}

Collective collective_of(const ddp_plan_collective& c) {
  static const char* kOps[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  return {kOps[c.op], int64_t(c.count * ddp_dtype_size(c.dtype)), c.beside_compute != 0};  // op checked on record
}

}  // namespace plan
}  // namespace ddp
