// model.h — what the engine needs of a model: a parameter table in PyTorch's
// named_parameters() order, forward that keeps its activations, and backward
// that accumulates gradients and reports each use of a parameter, so the
// engine can fire on_grad_ready after the last one (PyTorch's
// post-accumulate-grad hook). No general autograd: every model writes its
// backward by hand, layer by layer, in reverse.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ddp/plugin.h>  // ddp_unit_phase

#include "gemm.h"
#include "tensor.h"

namespace ddp {

struct Parameter {
  std::string name;
  Shape shape;
  bool trainable = true;
  int uses = 1;               // uses per forward (2 for a tied weight)
  size_t unit = DDP_NO_UNIT;  // the unit that owns it (Model::units)
  Tensor data;                // category Parameters
  // Category Gradients, iff trainable: a view of the block pack_gradients
  // makes (undefined until it has run: the engine runs it once the
  // strategy could claim), or of memory another holds (the ParamStore
  // knows whose; then undefined while none is bound). Where another holds
  // the values, `data` is a view of its memory, and holds none (data()
  // null) while none is bound.
  Tensor grad;
};

// A unit (plugin.h's ddp_unit): parameters that compute together, in
// forward order; a model's units own every parameter exactly once (one no
// layer reads goes to the first unit), and may read other units' (tied).
struct Unit {
  std::string name;
  std::vector<size_t> params;  // owned, ascending table indices
  std::vector<size_t> tied;    // owned by another unit, read by this one, ascending
};

// Throws Error unless `units` own each of `param_count` parameters exactly
// once and their tied lists name parameters of other units. Pure.
void check_units(const std::vector<Unit>& units, size_t param_count);

// A micro-batch: `rows` samples, row-major. Each model reads the fields it
// trains on: toy models x and y, mlp x and labels, lm tokens.
struct Batch {
  const float* x = nullptr;  // [rows, in] inputs
  const float* y = nullptr;  // [rows, out] float regression targets
  int64_t rows = 0;
  // [rows, context_length + 1] (lm: inputs tokens[:, :T], targets tokens[:, 1:])
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;  // [rows] (mlp class labels)
};

// What a model's batches hold, and their sizes (the data sources shape
// rows to it).
struct DataShape {
  enum Kind { Regression, Classification, Tokens } kind = Regression;
  int64_t in = 0;       // Regression, Classification: input width
  int64_t out = 0;      // Regression: target width; Classification: classes
  int64_t context = 0;  // Tokens: positions per row (rows hold context + 1 ids)
  int64_t vocab = 0;    // Tokens: ids must be < vocab
};

// What a model will hold, computed without building it (`ddp plan`): its
// parameter table and the float32 activation bytes it allocates, exactly,
// on the device kind asked for (tests build each model and compare).
struct ParamSize {
  std::string name;
  int64_t elements = 0;
  std::vector<int64_t> shape;
};

// The most layers a model may have: more than any model trained (GPT-3 has
// 96), few enough that a model's per-layer tables (names, shapes, units)
// stay small. A config beyond it is refused before anything proportional to
// its depth is built (`--set model.depth=100000000` once grew the launcher
// to 8 GB, printing nothing).
constexpr int64_t kMaxLayers = int64_t{1} << 16;

// One activation buffer a model allocates: its shape and element dtype
// (float32; or the compute dtype, for what backward keeps under a 16-bit
// compute). Footprints sum them; models allocate them in the same order.
struct ActBuffer {
  Shape shape;
  ddp_dtype dtype = DDP_FLOAT32;
};
// The bytes of `buffers` (float32 4 each, the 16-bit dtypes 2).
int64_t act_bytes(const std::vector<ActBuffer>& buffers);

class Kernels;
// A kept activation (lm, mlp) from its float32 value, on `kernels`' device:
// nothing where `saved` is float32 (value must then be its own memory),
// else rounded into saved's 16 bits. Throws Error for a float32 `saved`
// computed elsewhere.
void keep_activation(Kernels& kernels, Tensor& saved, const float* value);
// A kept activation in float32: its own memory, or unpacked into `into`
// (at least as large; throws Error if not).
const float* unpack_activation(Kernels& kernels, const Tensor& saved, Tensor& into);

struct Footprint {
  std::vector<ParamSize> params;       // table order
  int64_t setup_activation_bytes = 0;  // held from construction on (lm: RoPE tables)
  int64_t step_activation_bytes = 0;   // allocated by the first forward of `rows` rows, kept
  DataShape data;                      // what its batches hold
  std::vector<Unit> units;             // the model's, as it declares them
  // Transformer-like sizes, for hypothetical layouts (plan/mesh.h): model
  // width D, FFN width F, blocks L, and the activation elements backward
  // keeps per token. Zero for models that are not.
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t layers = 0;
  int ffn_matrices = 2;  // weight matrices of D x F per FFN block (SwiGLU: 3)
  double saved_elements_per_token = 0;
  bool plan_only = false;  // a size `ddp plan` accounts for and `ddp run` cannot build
};

class Model {
 public:
  // Called by backward right after it has added one use's contribution to
  // params()[index].grad. Never called for frozen parameters.
  using GradAccumulated = std::function<void(size_t index)>;

  virtual ~Model() = default;
  std::vector<Parameter>& params() { return params_; }
  const std::vector<Parameter>& params() const { return params_; }

  // Gives the trainable parameters' gradients one block of `device`
  // memory, back to back without gaps in reverse parameter order (the
  // order backward finishes them and strategies pack buckets in), so that
  // a strategy can average a run of them where they are instead of copying
  // them into a buffer (bucket_sync.h; PyTorch's gradient_as_bucket_view).
  // The gradients are zero afterwards. Between steps only.
  // Gradients held elsewhere (held_elsewhere, below) are left out.
  void pack_gradients(Device& device);
  // Which gradients live outside the model's block: set once by the store
  // of parameters (ParamStore), which knows who holds each.
  void set_grads_held_elsewhere(std::function<bool(size_t index)> held) { grads_held_elsewhere_ = std::move(held); }
  bool gradients_packed() const { return packed_; }  // whether pack_gradients has made them

  // Parameter `index`'s initial values, drawn from the model's seed into
  // `out` (its numel floats, on the host). Every model draws in table
  // order from one generator, so one parameter is drawn with no other in
  // memory: in order, the generator goes on; back to an earlier one, it
  // starts again from the seed (time spent, never another value).
  void draw_initial(size_t index, float* out);
  // Gives every parameter its storage on `device` and its drawn values:
  // what building a model for use ends with (the engine defers it where a
  // strategy takes the values unit by unit: ddp_strategy_v1_t::take_values).
  void materialise(Device& device);
  virtual int64_t input_width() const = 0;
  virtual int64_t output_width() const = 0;
  // The dtype the model's GEMMs take their inputs in ([precision] compute;
  // Kernels::set_compute_dtype): float32 unless set. lm and mlp also keep
  // the activations backward reads in it (ActBuffer). Throws Error where the
  // device's kernels do not take it. Call it before the first forward.
  virtual void set_compute_dtype(ddp_dtype dtype) = 0;

  // Runs the model on `batch`, keeps what backward needs, returns the loss
  // (mean over the batch). Activations are allocated on the first call for a
  // given number of rows and reused afterwards.
  virtual float forward(const Batch& batch) = 0;
  // Back-propagates d(loss * loss_scale) from the last forward, adding into
  // the gradients of trainable parameters (callers zero them per step).
  virtual void backward(float loss_scale, const GradAccumulated& accumulated) = 0;

  // Optional (`--trace`): backward reports each layer's part of it as a
  // named range, "backward <layer>", in the order it runs. `name` stays
  // valid while the model lives. No hook: one branch per layer.
  using RangeHook = std::function<void(const char* name, Clock::time_point begin, Clock::time_point end)>;
  void set_range_hook(RangeHook hook) { range_hook_ = std::move(hook); }

  // The units, declared once by the constructor (declare_units), and the
  // hook forward and backward call at each unit's begin and end, from the
  // model's own layer loops: forward in unit order, backward in reverse,
  // each gradient written between its unit's BACKWARD_BEGIN and END.
  const std::vector<Unit>& units() const { return units_; }
  using UnitHook = std::function<void(size_t unit, ddp_unit_phase phase)>;
  void set_unit_hook(UnitHook hook) { unit_hook_ = std::move(hook); }

 protected:
  // How the constructor's model draws parameter `index` from `rng` (the
  // parameters' shapes are in params_ already); the first call after
  // set_draw draws parameter 0.
  using Draw = std::function<void(size_t index, float* out, std::mt19937_64& rng)>;
  void set_draw(uint64_t seed, Draw draw);

  // Appends a parameter named `name` of `shape`: its shape now, its values
  // and storage at materialise. Returns it, for a model to set what else.
  Parameter& declare_param(Device& device, const std::string& name, Shape shape) {
    Parameter p;
    p.name = name;
    p.shape = shape;
    p.data = Tensor::view(device, nullptr, p.shape);
    params_.push_back(std::move(p));
    return params_.back();
  }

  // Sets units_ and each parameter's unit; throws as check_units.
  void declare_units(std::vector<Unit> units);
  void unit_event(size_t unit, ddp_unit_phase phase) const {
    if (unit_hook_) unit_hook_(unit, phase);
  }
  // Where backward adds params_[index]'s gradient: null for a frozen
  // parameter; throws Error for one held elsewhere that is bound to no
  // storage (the engine never writes where the strategy did not say).
  float* grad_out(size_t index) {
    Parameter& p = params_[index];
    if (!p.trainable) return nullptr;
    if (!p.grad.defined()) unbound_gradient(index);
    return p.grad.data();
  }

  // The values forward and backward read of params_[index]; throws Error
  // for a parameter whose values the strategy claimed and bound none to.
  const float* values(size_t index) const {
    const Parameter& p = params_[index];
    if (!p.data.data()) unbound_values(index);
    return p.data.data();
  }

  // Consecutive ranges: lap(name) reports the range since the previous lap
  // (or since construction) under `name`.
  class RangeLaps {
   public:
    explicit RangeLaps(const RangeHook& hook) : hook_(hook) {
      if (hook_) last_ = Clock::now();
    }
    void lap(const char* name) {
      if (!hook_) return;
      const Clock::time_point now = Clock::now();
      hook_(name, last_, now);
      last_ = now;
    }

   private:
    const RangeHook& hook_;
    Clock::time_point last_{};
  };
  [[noreturn]] void unbound_gradient(size_t index) const;
  [[noreturn]] void unbound_values(size_t index) const;

  std::vector<Parameter> params_;
  std::vector<Unit> units_;
  UnitHook unit_hook_;
  Tensor gradient_block_;
  std::function<bool(size_t index)> grads_held_elsewhere_;  // (unset: none)
  bool held_elsewhere(size_t index) const { return grads_held_elsewhere_ && grads_held_elsewhere_(index); }
  bool packed_ = false;  // pack_gradients: the memory of every grad, which are views of it
  RangeHook range_hook_;
  std::vector<std::string> range_names_;  // the models' per-layer names for lap()

 private:
  Draw draw_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  size_t next_draw_ = 0;  // the parameter rng_ draws next
};

// Builds a model by name ("toy", "toy_tied") with parameters initialised
// from `seed` (nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in))). Throws
// Error for an unknown name. (The lm and mlp models, which take sizes, are
// made by make_lm in lm.h and make_mlp in mlp.h; registry.h builds any
// model by name and options.)
// `with_gradients`: with its gradients (pack_gradients); the engine makes
// them itself, once it knows which a strategy claims. `with_values`: with
// its parameters' storage and drawn values (materialise); the engine makes
// them itself, once it knows which a strategy takes unit by unit.
std::unique_ptr<Model> make_model(const std::string& name, Device& device, uint64_t seed, bool with_gradients = true,
                                  bool with_values = true);

}  // namespace ddp
