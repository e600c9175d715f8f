// param_store.h — the one store of the parameters' values and gradients,
// and the one place that knows who holds each: the engine (a Parameter's
// own tensors, its packed gradient block) or a strategy that claimed it
// (ddp_host::claim and bind: DDP_STORAGE_GRAD, 1.4; DDP_STORAGE_DATA, 1.5,
// lent back unit by unit, 1.7). The trainer, the optimizer, checkpoints,
// weights.safetensors, evaluation and the replica check read the values
// through its per-unit view (visit) and the gradients through its answers
// (grad_spans, held_span, zero_grads); none of them asks who owns what. It does not
// step, reduce or write anything: its callers do, through what it hands
// them.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ddp/plugin.h>

#include "device.h"
#include "grad_span.h"
#include "model.h"

namespace ddp {

// What the strategy may do with storage, from its caps and entries.
struct StorageRights {
  bool claims_gradients = false;  // DDP_CAP_OWNS_GRADIENTS
  bool takes_values = false;      // take_values (1.7): claimed values lent unit by unit after on_train_begin
  std::function<void(size_t unit, bool hold)> unit_values;  // the strategy's unit_values (1.5)
  std::function<void(size_t unit)> take_values;             // the strategy's take_values (1.7)
};

class ParamStore {
 public:
  // Attaches the model (its parameters fixed from now on) and the device.
  void attach(Model* model, Device* device);
  void set_rights(StorageRights rights) { rights_ = std::move(rights); }
  bool attached() const { return model_ != nullptr; }

  // The ABI's tables, mirroring the model's parameters and units.
  std::vector<ddp_param> param_table;
  std::vector<ddp_unit> unit_table;
  void refresh_param_table();  // after trainable flags change, or storage moved
  // Parameter `index`; throws Error "<entry>: parameter index ..." outside the table.
  Parameter& param_at(const char* entry, size_t index) const;

  // ddp_host::claim and bind (plugin.h); throw Error naming the parameter.
  // Claims are open where the trainer says (claims_open: create,
  // on_train_begin, on_step_begin of a step's first micro-batch;
  // value_claims_open: create).
  bool claims_open = false;
  bool value_claims_open = false;
  void claim_grads(const size_t* indices, size_t count);
  void bind_grad(size_t index, void* ptr);
  void claim_values(const size_t* indices, size_t count);
  void bind_values(size_t index, void* ptr);

  // The set-up's order: make_values before create for a strategy that does
  // not take values unit by unit, after it for one that does (the values
  // it did not claim); pack_gradients before create for a strategy that
  // cannot claim gradients, after it for one that may.
  void make_values(const std::function<Tensor(size_t index)>& make, bool after_create);
  void pack_gradients(bool after_create);
  // After on_train_begin: lends a strategy that takes values (take_values)
  // each unit's claimed values in turn (made by `make`), then frees the
  // engine's copies of claimed values (the strategy has taken its part).
  void after_train_begin(const std::function<Tensor(size_t index)>& make);
  // After a step's first on_step_begin, where the trainable set changed:
  // the engine's gradient block repacked for a strategy that may claim.
  void after_step_begin(bool params_changed);
  // Whether a parameter newly unfrozen gets its gradient from the engine
  // now (else after the strategy's on_step_begin has claimed or not).
  bool engine_makes_new_grads() const { return !rights_.claims_gradients; }

  // The gradients this rank holds, appended to `spans`: the engine's own of
  // parameters `indices`, each held by `replicas` ranks; then, where the
  // strategy holds gradient storage, the ranges `ranges` returns (its
  // grad_ranges; nullopt where it has none), each held by one rank where
  // partitioned, else by `world`. Returns whether those ranges are
  // partitioned. Throws Error naming `strategy` where it holds gradients
  // and has no grad_ranges, or a range names no elements of one it holds.
  bool grad_spans(const std::vector<size_t>& indices, int replicas, int world,
                  const std::function<std::optional<GradRanges>()>& ranges, const std::string& strategy,
                  std::vector<GradSpan>& spans) const;
  // One held_ranges (1.9) entry of a world of `world` ranks as a span, its
  // grad the engine's own where the entry's is NULL: "" and `span` set, or
  // what is wrong with it ("names no trainable parameter of the table" ...).
  std::string held_span(const ddp_held_range& h, int world, GradSpan& span) const;
  // Whether reading the whole model (visit, host_values) is collective: every
  // rank must do it at the same point (the strategy holds values and gathers
  // them unit by unit). Fixed after on_train_begin.
  bool visit_is_collective() const { return values_lent_; }
  // Zeroes the engine's gradients of trainable parameters on the compute stream.
  void zero_grads();

  // The per-unit view: calls visit(i) for every parameter i with its
  // values bound: in table order where the engine holds every value; else
  // unit by unit in forward order, between the strategy's unit_values(u,
  // true) and (u, false), which every rank must call at the same point.
  // Throws Error naming `reader`, the parameter and its unit where the
  // strategy bound no values, or where the model declares no units.
  void visit(const std::string& reader, const std::function<void(size_t index)>& visit) const;
  // Every parameter's values on the host, in table order, read as visit.
  std::vector<std::vector<float>> host_values(const std::string& reader) const;

  // The engine's own values of claimed parameters, until on_train_begin
  // returns (and those of a unit whose lending failed, until the plugins
  // are stopped: its collectives may still write them).
  std::vector<std::pair<size_t, Tensor>> held_values;
  void release_held_values();

 private:
  void lend_values(const std::function<Tensor(size_t index)>& make);
  bool grad_held_by_strategy(size_t i) const;
  bool any_values_claimed() const;

  Model* model_ = nullptr;
  Device* device_ = nullptr;
  StorageRights rights_;
  // Per parameter (table order): whether the strategy holds its gradient,
  // its values (claimed; the Parameter itself carries no such state).
  std::vector<char> strategy_grad_;
  std::vector<char> strategy_values_;
  bool grads_claimed_ = false;
  bool values_lent_ = false;
};

}  // namespace ddp
