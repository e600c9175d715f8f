// param_store.cpp — ParamStore (param_store.h): the tables the host vtable
// hands out, the storage a strategy claims and binds (the engine's own
// gradient block shrinks to what it still owns, and a claimed gradient
// points wherever the strategy says, or nowhere; claimed values are the
// engine's until on_train_begin returns, then wherever the strategy says,
// or nowhere), the values lent unit by unit, and the per-unit view.
#include "param_store.h"

#include "error.h"

namespace ddp {

void ParamStore::attach(Model* model, Device* device) {
  model_ = model;
  device_ = device;
  strategy_grad_.assign(model->params().size(), 0);
  strategy_values_.assign(model->params().size(), 0);
  model->set_grads_held_elsewhere([this](size_t i) { return grad_held_by_strategy(i); });
}

Parameter& ParamStore::param_at(const char* entry, size_t index) const {
  auto& params = model_->params();
  if (index >= params.size())
    throw Error(std::string(entry) + ": parameter index " + std::to_string(index) + " is not in the table of " +
                    std::to_string(params.size()),
                DDP_ERR_INVALID_ARGUMENT);
  return params[index];
}

void ParamStore::refresh_param_table() {
  param_table.clear();
  unit_table.clear();
  if (!model_) return;
  auto& params = model_->params();
  param_table.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter& p = params[i];
    ddp_param& e = param_table[i];
    e = ddp_param{};
    e.name = p.name.c_str();
    e.index = i;
    e.data = p.data.data();
    e.grad = p.trainable ? p.grad.data() : nullptr;
    e.numel = numel_of(p.shape);
    e.dtype = DDP_FLOAT32;
    e.trainable = p.trainable ? 1 : 0;
    e.ndim = p.shape.size();
    e.shape = p.shape.data();
    e.unit = p.unit;
    e.uses = p.uses;
  }
  for (size_t u = 0; u < model_->units().size(); ++u) {
    const Unit& unit = model_->units()[u];
    unit_table.push_back(
        ddp_unit{unit.name.c_str(), u, unit.params.data(), unit.params.size(), unit.tied.data(), unit.tied.size()});
  }
}

void ParamStore::claim_grads(const size_t* indices, size_t count) {
  if (!claims_open)
    throw Error(
        "claim: only in create, on_train_begin, or on_step_begin of a step's first micro-batch (the "
        "engine's own gradients hold nothing then)",
        DDP_ERR_INVALID_ARGUMENT);
  auto& params = model_->params();
  for (size_t k = 0; k < count; ++k) {  // all checked before any is taken: a refusal changes nothing
    if (!param_at("claim", indices[k]).trainable)
      throw Error("claim: parameter '" + params[indices[k]].name +
                      "' is frozen: a strategy may claim the "
                      "gradient storage of trainable parameters only",
                  DDP_ERR_INVALID_ARGUMENT);
  }
  bool changed = false;
  for (size_t k = 0; k < count; ++k) {
    Parameter& p = params[indices[k]];
    if (strategy_grad_[indices[k]]) continue;
    strategy_grad_[indices[k]] = 1;
    p.grad = Tensor::view(*device_, nullptr, p.shape);  // bound to nothing until the strategy binds it
    changed = true;
  }
  if (!changed) return;
  grads_claimed_ = true;
  model_->pack_gradients(*device_);  // the engine's block shrinks to what it still owns
  refresh_param_table();
}

void ParamStore::bind_grad(size_t index, void* ptr) {
  Parameter& p = param_at("bind", index);
  if (!strategy_grad_[index])
    throw Error("bind: the gradient of parameter '" + p.name + "' is the engine's: claim it first (ddp_host::claim)",
                DDP_ERR_INVALID_ARGUMENT);
  p.grad.point_view_at(static_cast<float*>(ptr));
  param_table[index].grad = ptr;
}

void ParamStore::claim_values(const size_t* indices, size_t count) {
  if (!value_claims_open)
    throw Error("claim: parameter values (DDP_STORAGE_DATA) only in create, while the engine still holds them all",
                DDP_ERR_INVALID_ARGUMENT);
  for (size_t k = 0; k < count; ++k) param_at("claim", indices[k]);  // all checked before any is taken
  for (size_t k = 0; k < count; ++k) {
    Parameter& p = model_->params()[indices[k]];
    if (strategy_values_[indices[k]]) continue;
    strategy_values_[indices[k]] = 1;
    if (!p.data.defined()) continue;  // none made yet: lent unit by unit (take_values, 1.7)
    float* values = p.data.data();
    held_values.emplace_back(indices[k], std::move(p.data));  // read there until on_train_begin returns
    p.data = Tensor::view(*device_, values, p.shape);
  }
}

void ParamStore::bind_values(size_t index, void* ptr) {
  Parameter& p = param_at("bind", index);
  if (!strategy_values_[index])
    throw Error("bind: the values of parameter '" + p.name +
                    "' are the engine's: claim them first "
                    "(ddp_host::claim, DDP_STORAGE_DATA)",
                DDP_ERR_INVALID_ARGUMENT);
  p.data.point_view_at(static_cast<float*>(ptr));
  param_table[index].data = ptr;
}

void ParamStore::release_held_values() {
  auto& params = model_->params();
  for (auto& [index, values] : held_values) {
    Parameter& p = params[index];
    if (p.data.data() == values.data()) {  // still read from the engine's copy: unbound from now on
      p.data.point_view_at(nullptr);
      param_table[index].data = nullptr;
    }
  }
  held_values.clear();
}

bool ParamStore::any_values_claimed() const {
  for (char held : strategy_values_)
    if (held) return true;
  return false;
}

void ParamStore::make_values(const std::function<Tensor(size_t index)>& make, bool after_create) {
  if (after_create != rights_.takes_values) return;  // (the other call makes them)
  for (size_t i = 0; i < model_->params().size(); ++i) {
    Parameter& p = model_->params()[i];
    if (!p.data.defined() && !strategy_values_[i]) p.data = make(i);
  }
  refresh_param_table();
}

void ParamStore::pack_gradients(bool after_create) {
  if (after_create ? model_->gradients_packed() : rights_.claims_gradients) return;
  model_->pack_gradients(*device_);
  refresh_param_table();
}

void ParamStore::after_step_begin(bool params_changed) {
  if (!params_changed || !rights_.claims_gradients) return;
  model_->pack_gradients(*device_);
  refresh_param_table();
}

void ParamStore::after_train_begin(const std::function<Tensor(size_t index)>& make) {
  if (rights_.takes_values && any_values_claimed()) lend_values(make);  // (none claimed: nothing to lend)
  release_held_values();  // the strategy has taken its part of the values it claimed
  values_lent_ = any_values_claimed();
}

void ParamStore::lend_values(const std::function<Tensor(size_t index)>& make) {
  auto& params = model_->params();
  for (size_t u = 0; u < model_->units().size(); ++u) {
    struct Lent {
      size_t index;
      Tensor values;
      float* bound;  // where the strategy had bound them (null: nowhere), bound again after
    };
    std::vector<Lent> lent;  // the unit's claimed parameters
    const auto give_back = [&] {
      for (Lent& l : lent) {
        if (params[l.index].data.data() != l.values.data()) continue;  // the strategy bound its own since
        params[l.index].data.point_view_at(l.bound);
        param_table[l.index].data = l.bound;
      }
    };
    try {
      for (size_t i : model_->units()[u].params)
        if (strategy_values_[i]) lent.push_back({i, make(i), params[i].data.data()});
      for (Lent& l : lent) {
        params[l.index].data.point_view_at(l.values.data());
        param_table[l.index].data = l.values.data();
      }
      rights_.take_values(u);
    } catch (...) {
      // Its collectives may still write them: they go with the engine's
      // held values, after the plugins are stopped.
      give_back();
      for (Lent& l : lent) held_values.emplace_back(l.index, std::move(l.values));
      throw;
    }
    give_back();
  }
}

bool ParamStore::grad_held_by_strategy(size_t i) const { return i < strategy_grad_.size() && strategy_grad_[i]; }

bool ParamStore::grad_spans(const std::vector<size_t>& indices, int replicas, int world,
                            const std::function<std::optional<GradRanges>()>& ranges, const std::string& strategy,
                            std::vector<GradSpan>& spans) const {
  auto& params = model_->params();
  for (size_t i : indices)
    if (!grad_held_by_strategy(i)) spans.push_back({i, params[i].grad.data(), params[i].grad.numel(), true, replicas});
  if (!grads_claimed_) return false;
  const std::optional<GradRanges> held = ranges();
  if (!held)
    throw Error("strategy plugin '" + strategy +
                    "' claimed gradient storage and has no grad_ranges entry: the engine cannot measure or clip "
                    "the gradients it holds",
                DDP_ERR_UNSUPPORTED);
  for (size_t k = 0; k < held->count; ++k) {
    const ddp_range& r = held->ranges[k];
    const bool names_held = r.param < params.size() && grad_held_by_strategy(r.param) && r.grad;
    if (!names_held || r.offset > params[r.param].data.numel() || r.count > params[r.param].data.numel() - r.offset)
      throw Error("strategy plugin '" + strategy + "': grad_ranges: range " + std::to_string(k) +
                      " names no elements of a claimed gradient of the table",
                  DDP_ERR_INVALID_ARGUMENT);
    spans.push_back({r.param, static_cast<float*>(r.grad), r.count, false, held->partitioned ? 1 : world, r.offset});
  }
  return held->partitioned;
}

std::string ParamStore::held_span(const ddp_held_range& h, int world, GradSpan& span) const {
  auto& params = model_->params();
  Parameter* p = h.param < params.size() ? &params[h.param] : nullptr;
  const size_t numel = p ? p->data.numel() : 0;
  if (!p || !p->trainable) return "names no trainable parameter of the table";
  if (h.offset > numel || h.count > numel - h.offset) return "names elements outside its parameter";
  if (!h.grad && (grad_held_by_strategy(h.param) || !p->grad.data()))
    return "has grad NULL, but the engine holds no gradient of it";
  if (h.replicas < 1 || h.replicas > world) return "says it is held by " + std::to_string(h.replicas) + " ranks";
  float* grad = h.grad ? static_cast<float*>(h.grad) : p->grad.data() + h.offset;
  span = {h.param, grad, h.count, !h.grad && h.offset == 0 && h.count == numel, h.replicas, h.offset};
  return "";
}

void ParamStore::zero_grads() {
  for (size_t i = 0; i < model_->params().size(); ++i) {
    Parameter& p = model_->params()[i];
    if (p.trainable && !strategy_grad_[i] && p.grad.defined())  // (just unfrozen: made zero after on_step_begin)
      device_->fill(p.grad.data(), p.grad.numel(), 0.0f, device_->compute_stream());
  }
}

void ParamStore::visit(const std::string& reader, const std::function<void(size_t index)>& visit) const {
  const std::vector<Parameter>& params = model_->params();
  if (!values_lent_) {
    for (size_t i = 0; i < params.size(); ++i) visit(i);
    return;
  }
  const std::vector<Unit>& units = model_->units();
  if (units.empty())
    throw Error(reader +
                    " reads every parameter, whose values the strategy claimed, unit by unit, and this model "
                    "declares no units",
                DDP_ERR_UNSUPPORTED);
  for (size_t u = 0; u < units.size(); ++u) {
    rights_.unit_values(u, true);
    for (size_t i : units[u].params)
      if (!params[i].data.data())
        throw Error(reader + " reads the values of '" + params[i].name + "', which the strategy claimed and did " +
                        "not bind in unit_values(unit '" + units[u].name + "', 1)",
                    DDP_ERR_INVALID_ARGUMENT);
    for (size_t i : units[u].params) visit(i);
    rights_.unit_values(u, false);
  }
}

std::vector<std::vector<float>> ParamStore::host_values(const std::string& reader) const {
  std::vector<std::vector<float>> out(model_->params().size());
  visit(reader, [&](size_t i) { out[i] = model_->params()[i].data.to_host(); });
  return out;
}

}  // namespace ddp
