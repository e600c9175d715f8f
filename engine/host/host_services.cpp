// host_services.cpp — HostServices (plugin_host.h): the parameter and unit
// tables the host vtable hands out, and the storage a strategy claims and
// binds (ddp_host::claim, bind): the engine's own gradient block shrinks
// to what it still owns, and a claimed gradient points wherever the
// strategy says, or nowhere; claimed values are the engine's until
// on_train_begin returns, then wherever the strategy says, or nowhere.
#include "plugin_host.h"

#include <algorithm>

#include "whereabouts.h"

namespace ddp {

Parameter& HostServices::param_at(const char* entry, size_t index) const {
  auto& params = model->params();
  if (index >= params.size())
    throw Error(std::string(entry) + ": parameter index " + std::to_string(index) + " is not in the table of " +
                std::to_string(params.size()), DDP_ERR_INVALID_ARGUMENT);
  return params[index];
}

void HostServices::refresh_param_table() {
  param_table.clear();
  unit_table.clear();
  if (!model) return;
  auto& params = model->params();
  param_table.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    ddp_param& e = param_table[i];
    e = ddp_param{};
    e.name = p.name.c_str(), e.index = i, e.data = p.data.data();
    e.grad = p.trainable ? p.grad.data() : nullptr;
    e.numel = numel_of(p.shape), e.dtype = DDP_FLOAT32, e.trainable = p.trainable ? 1 : 0;
    e.ndim = p.shape.size(), e.shape = p.shape.data(), e.unit = p.unit, e.uses = p.uses;
  }
  for (size_t u = 0; u < model->units().size(); ++u) {
    const Unit& unit = model->units()[u];
    unit_table.push_back(ddp_unit{unit.name.c_str(), u, unit.params.data(), unit.params.size(), unit.tied.data(),
                                  unit.tied.size()});
  }
}

void HostServices::claim_grads(const size_t* indices, size_t count) {
  if (!claims_open)
    throw Error("claim: only in create, on_train_begin, or on_step_begin of a step's first micro-batch (the "
                "engine's own gradients hold nothing then)", DDP_ERR_INVALID_ARGUMENT);
  auto& params = model->params();
  for (size_t k = 0; k < count; ++k) {  // all checked before any is taken: a refusal changes nothing
    if (!param_at("claim", indices[k]).trainable)
      throw Error("claim: parameter '" + params[indices[k]].name + "' is frozen: a strategy may claim the "
                  "gradient storage of trainable parameters only", DDP_ERR_INVALID_ARGUMENT);
  }
  bool changed = false;
  for (size_t k = 0; k < count; ++k) {
    Parameter& p = params[indices[k]];
    if (p.claimed) continue;
    p.claimed = true;
    p.grad = Tensor::view(*device, nullptr, p.shape);  // bound to nothing until the strategy binds it
    changed = true;
  }
  if (!changed) return;
  model->pack_gradients(*device);  // the engine's block shrinks to what it still owns
  refresh_param_table();
}

void HostServices::bind_grad(size_t index, void* ptr) {
  Parameter& p = param_at("bind", index);
  if (!p.claimed)
    throw Error("bind: the gradient of parameter '" + p.name + "' is the engine's: claim it first (ddp_host::claim)",
                DDP_ERR_INVALID_ARGUMENT);
  p.grad.point_view_at(static_cast<float*>(ptr));
  param_table[index].grad = ptr;
}

void HostServices::claim_values(const size_t* indices, size_t count) {
  if (!value_claims_open)
    throw Error("claim: parameter values (DDP_STORAGE_DATA) only in create, while the engine still holds them all",
                DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < count; ++k) param_at("claim", indices[k]);  // all checked before any is taken
  for (size_t k = 0; k < count; ++k) {
    Parameter& p = model->params()[indices[k]];
    if (p.values_claimed) continue;
    p.values_claimed = true;
    if (!p.data.defined()) continue;  // none made yet: lent unit by unit (take_values, 1.7)
    float* values = p.data.data();
    held_values.emplace_back(indices[k], std::move(p.data));  // read there until on_train_begin returns
    p.data = Tensor::view(*device, values, p.shape);
  }
}

void HostServices::bind_values(size_t index, void* ptr) {
  Parameter& p = param_at("bind", index);
  if (!p.values_claimed)
    throw Error("bind: the values of parameter '" + p.name + "' are the engine's: claim them first "
                "(ddp_host::claim, DDP_STORAGE_DATA)", DDP_ERR_INVALID_ARGUMENT);
  p.data.point_view_at(static_cast<float*>(ptr));
  param_table[index].data = ptr;
}

void HostServices::release_held_values() {
  auto& params = model->params();
  for (auto& [index, values] : held_values) {
    Parameter& p = params[index];
    if (p.data.data() == values.data()) {  // still read from the engine's copy: unbound from now on
      p.data.point_view_at(nullptr);
      param_table[index].data = nullptr;
    }
  }
  held_values.clear();
}

bool HostServices::claims_any() const {
  if (!model) return false;
  for (const Parameter& p : model->params())
    if (p.claimed) return true;
  return false;
}

void HostServices::begin_finals() {
  finals_said = 0;
  final_named.assign(model ? model->params().size() : 0, 0);
}

void HostServices::say_final(Event* done, const size_t* indices, size_t count, const char* label) {
  if (!finals_open)
    throw Error("grads_final: only from on_step_begin of a step's sync micro-batch until its finish returns "
                "(the engine's optimizer step follows)", DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < count; ++k) {  // all checked before any is taken: a refusal changes nothing
    const Parameter& p = param_at("grads_final", indices[k]);
    if (!p.trainable)
      throw Error("grads_final: parameter '" + p.name + "' is frozen: the optimizer steps trainable parameters only",
                  DDP_ERR_INVALID_ARGUMENT);
    if (final_named[indices[k]] || std::count(indices, indices + k, indices[k]))
      throw Error("grads_final: parameter '" + p.name + "' was said final twice this step",
                  DDP_ERR_INVALID_ARGUMENT);
  }
  for (size_t k = 0; k < count; ++k) final_named[indices[k]] = 1;
  if (finals_said == finals.size()) finals.emplace_back();
  FinalGroup& group = finals[finals_said++];  // (kept: nothing allocated once settled)
  group.done = done;
  group.params.assign(indices, indices + count);
  group.label = label;
}

void HostServices::wait_final(size_t k) {
  const FinalGroup& group = finals[k];
  if (!group.done) return;
  const auto start = Clock::now();
  whereabouts::Inside in(group.label, "grads_final");  // a wait the watchdog times
  try {
    group.done->synchronize(wait_limit());
  } catch (const Error& e) {
    throw Error(std::string(group.label) + ": grads_final: " + e.what(), e.status()).in_plugin(group.label,
                                                                                          "grads_final");
  }
  counters.blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
}

}  // namespace ddp
