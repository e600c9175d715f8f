// powersgd.cpp — the `powersgd` strategy: PowerSGD (Vogels, Karimireddy and
// Jaggi, 2019) as PyTorch's powerSGD_hook, with error feedback and warm
// start. Rank 0's parameters are broadcast at the start. On the micro-batch
// with sync_grads, from step `start_step` on, every trainable gradient of
// 2 or more dimensions is a matrix n × m (its first dimension × the rest),
// compressed at rank r = min(rank, n, m):
//   M = grad + error                       (error feedback, this rank's)
//   orthogonalize Q; P = M Q               (Q [m, r], warm: last step's)
//   all-reduce P (sum; one buffer for every matrix); orthogonalize P
//   Q = Mᵀ P; all-reduce Q (sum; one buffer); Q /= world
//   grad = P Qᵀ;  error = M − grad
// and the other trainable gradients (1-D) are averaged uncompressed in one
// buffer. Before start_step every gradient is averaged uncompressed
// (PyTorch's vanilla all-reduce before start_powerSGD_iter). Each rank
// sends Σ (n + m) r + (1-D elements) floats a compressed step.
//
// All arithmetic goes through ABI 1.9's compute entries (arithmetic.h); the
// layout, the state's names and the initial Q are pure (layout.h). The
// vectors' all-reduce runs on the comm stream while the compute stream
// forms P; P's all-reduce waits for an event recorded on compute, and
// everything after it runs on the comm stream, which finish waits for.
// Memory is allocated at train begin and again only when the trainable set
// changes; a checkpoint keeps each matrix's error (per rank) and Q (equal
// on every rank). Keys: rank (default 2), start_step (0), epsilon (1e-8),
// seed (0).
//
// Under loss scaling (ddp_precision::loss_scaled) the gradients carry the
// step's scale S (ddp_step_info::loss_scale, ABI 1.12) and the error is
// kept divided by it: M/S = error + grad/S, P and Q from M/S, grad = S P Qᵀ
// (the engine divides S out) and error = M/S − grad/S. Where S is a power
// of two (the default factors) each is M's value divided by S exactly:
// where the gradients are S times an unscaled run's, the same bits as it,
// whatever the scale does between steps. A skipped step
// (ddp_host::step_skipped: an inf or NaN on some rank, which reaches
// every rank's P through its all-reduce) puts back the error and Q it
// started from, copied aside at its start (a second error buffer and a
// second Q).
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../common/stats.h"
#include "../common/strategy_util.h"
#include "arithmetic.h"
#include "layout.h"

using ddp::plugin::DeviceBuffer;
using ddp::plugin::Failure;
using ddp::plugin::guard;
using ddp::plugin::Host;
using ddp::powersgd::Group;
using ddp::powersgd::Layout;
using ddp::powersgd::Matrix;
using ddp::strategy::StrategyBase;

namespace {

// Page-locked host memory (ddp_host::alloc_host: staging for the device's
// buffers, accounted under its category), freed with this.
class HostFloats {
 public:
  HostFloats() = default;
  HostFloats(const Host& h, size_t count, ddp_mem_category category) : h_(h.raw()) {
    if (count) p_ = static_cast<float*>(h.alloc_host(count * sizeof(float), category));
  }
  ~HostFloats() {
    if (p_) h_->free_host(h_->ctx, p_);
  }
  HostFloats(HostFloats&& o) noexcept : h_(o.h_), p_(std::exchange(o.p_, nullptr)) {}
  HostFloats& operator=(HostFloats&& o) noexcept {
    std::swap(h_, o.h_);
    std::swap(p_, o.p_);
    return *this;
  }
  float* get() const { return p_; }

 private:
  const ddp_host* h_ = nullptr;
  float* p_ = nullptr;
};

struct Keys {
  int64_t rank = 2;
  int64_t start_step = 0;
  double epsilon = 1e-8;
  int64_t seed = 0;
};

}  // namespace

struct ddp_strategy_s : StrategyBase {
  ddp_strategy_s(const ddp_host* h, const ddp_transport_v1_t* t, ddp_comm* c, const Keys& k)
      : StrategyBase(h, t, c), keys(k) {}
  Keys keys;
  Layout layout;             // of the trainable set now
  DeviceBuffer error;        // [error_elements]: each matrix's error; M while a step runs
  DeviceBuffer q;            // [q_elements]: each matrix's Q [m, r], equal on every rank
  DeviceBuffer p;            // [p_elements]: each matrix's P [n, r], all-reduced as one
  DeviceBuffer flat;         // [vector_elements]: the 1-D gradients, all-reduced as one
  DeviceBuffer scratch;      // [scratch_elements]: Gram-Schmidt's projections
  DeviceBuffer saved_error;  // under loss scaling: the error and Q a step started from
  DeviceBuffer saved_q;
  HostFloats staging;                 // [q_elements] page-locked: the initial Qs on their way to the device
  std::vector<DeviceBuffer> retired;  // the last layout's, freed once the copies from them ran (finish)
  std::vector<HostFloats> retired_staging;
  std::vector<std::string> names;  // of the state buffers
  std::vector<ddp_state_buffer> state;
  std::vector<ddp_state_scope> scopes;
  bool syncing = false;
  int64_t step = 0;
  bool loss_scaled = false;  // ddp_precision::loss_scaled
  double scale = 1.0;        // this step's loss scale (1 unscaled)
  bool saved = false;        // this step copied its error and Q aside (compress, under loss scaling)
  // Sync micro-batches of each kind (stats).
  int64_t compressed_steps = 0;
  int64_t plain_steps = 0;
};

namespace {

constexpr ddp_key kKeys[] = {
    {"rank", "int >= 1", "the rank r of each matrix's approximation, clamped to min(n, m) (default 2)"},
    {"start_step", "int >= 0", "steps before this one average the gradients uncompressed (default 0)"},
    {"epsilon", "float >= 0", "added to each column's norm in Gram-Schmidt (default 1e-8)"},
    {"seed", "int", "the seed of the initial Qs, the same on every rank (default 0)"},
    {nullptr, nullptr, nullptr},
};

Keys read_keys(const Host& h) {
  Keys k;
  k.rank = h.config_int("rank", 2);
  k.start_step = h.config_int("start_step", 0);
  k.epsilon = h.config_float("epsilon", 1e-8);
  k.seed = h.config_int("seed", 0);
  if (k.rank < 1)
    throw Failure(DDP_ERR_INVALID_ARGUMENT,
                  "strategy.rank must be an integer >= 1 (got " + std::to_string(k.rank) + ")");
  if (k.start_step < 0)
    throw Failure(DDP_ERR_INVALID_ARGUMENT,
                  "strategy.start_step must be an integer >= 0 (got " + std::to_string(k.start_step) + ")");
  if (!(k.epsilon >= 0) || !std::isfinite(k.epsilon))
    throw Failure(DDP_ERR_INVALID_ARGUMENT,
                  "strategy.epsilon must be a finite number >= 0 (got " + ddp::strategy::json_number(k.epsilon) + ")");
  // The error feedback is made of gradients: under a scaled loss it is
  // kept divided by each step's scale, which an older engine does not say.
  if (ddp::strategy::run_precision(h.raw()).loss_scaled && DDP_ABI_MINOR(h.raw()->abi_version) < 12)
    throw Failure(DDP_ERR_UNSUPPORTED,
                  "precision.loss_scale = \"dynamic\": powersgd keeps its error feedback divided by each step's "
                  "loss scale, which an engine older than ABI 1.12 does not give; use precision.loss_scale = "
                  "\"none\" (or compute = \"bf16\")");
  return k;
}

// The parameter table as layout.h takes it (float32 only, refused by name).
std::vector<ddp::powersgd::Tensor> tensors(const Host& h) {
  std::vector<ddp::powersgd::Tensor> out;
  for (size_t i = 0; i < h.param_count(); ++i) {
    const ddp_param& p = h.param(i);
    StrategyBase::float32_elements(p);
    ddp::powersgd::Tensor t{i, p.name, {}, p.trainable != 0};
    if (p.shape) t.shape.assign(p.shape, p.shape + p.ndim);
    if (p.ndim == 0 && p.numel != 1) t.shape = {int64_t(p.numel)};  // no shape given: a vector
    out.push_back(std::move(t));
  }
  return out;
}

DeviceBuffer device_floats(const Host& h, size_t count, ddp_mem_category category) {
  return count ? DeviceBuffer(h.raw(), count * sizeof(float), category) : DeviceBuffer();
}

// The state entry's buffers: each matrix's error (this rank's) and Q
// (equal on every rank), named from its parameter.
void name_state(ddp_strategy* s) {
  const Host& h = s->host;
  s->names.clear();
  s->state.clear();
  s->scopes.clear();
  for (const Matrix& m : s->layout.matrices) {
    s->names.push_back(ddp::powersgd::state_name(h.param(m.param).name, ".error"));
    s->names.push_back(ddp::powersgd::state_name(h.param(m.param).name, ".q"));
  }
  for (size_t k = 0; k < s->layout.matrices.size(); ++k) {
    const Matrix& m = s->layout.matrices[k];
    s->state.push_back({s->names[2 * k].c_str(), s->error.floats() + m.error_offset, m.rows * m.cols});
    s->state.push_back({s->names[2 * k + 1].c_str(), s->q.floats() + m.q_offset, m.cols * m.rank});
    s->scopes.push_back(DDP_STATE_PER_RANK);
    s->scopes.push_back(DDP_STATE_EQUAL);
  }
}

// Each matrix's error and Q in the new buffers: carried over from the last
// layout where it was there (on the compute stream), else zero and drawn
// from the seed (layout.h's initial_q, through the page-locked `staging`).
void carry_state(ddp_strategy* s, const Layout& old, const DeviceBuffer& old_error, const DeviceBuffer& old_q) {
  const Host& h = s->host;
  const ddp_stream c = h.compute_stream();
  std::map<size_t, const Matrix*> before;
  for (const Matrix& m : old.matrices) before[m.param] = &m;
  s->retired_staging.push_back(std::move(s->staging));
  s->staging = HostFloats(h, s->layout.q_elements, DDP_MEM_COMM_BUFFERS);
  for (const Matrix& m : s->layout.matrices) {
    const size_t q_count = m.cols * m.rank;
    const auto was = before.find(m.param);
    if (was != before.end() && was->second->rank == m.rank && was->second->elements() == m.elements()) {
      h.copy(s->error.floats() + m.error_offset, old_error.floats() + was->second->error_offset,
             m.elements() * sizeof(float), c);
      h.copy(s->q.floats() + m.q_offset, old_q.floats() + was->second->q_offset, q_count * sizeof(float), c);
      continue;
    }
    ddp::powersgd::initial_q(uint64_t(s->keys.seed), h.param(m.param).name, s->staging.get() + m.q_offset, q_count);
    h.copy(s->q.floats() + m.q_offset, s->staging.get() + m.q_offset, q_count * sizeof(float), c);
  }
}

// At train begin and whenever the trainable set changes (between steps):
// the layout and its buffers; the last layout's are retired until finish.
void lay_out(ddp_strategy* s) {
  const Host& h = s->host;
  const Layout old = s->layout;
  DeviceBuffer old_error = std::move(s->error);
  DeviceBuffer old_q = std::move(s->q);
  s->retired.push_back(std::move(s->p));
  s->retired.push_back(std::move(s->flat));
  s->retired.push_back(std::move(s->scratch));
  s->layout = ddp::powersgd::lay_out(tensors(h), size_t(s->keys.rank));
  s->error = device_floats(h, s->layout.error_elements, DDP_MEM_OPTIMIZER_STATE);
  s->q = device_floats(h, s->layout.q_elements, DDP_MEM_OPTIMIZER_STATE);
  s->p = device_floats(h, s->layout.p_elements, DDP_MEM_COMM_BUFFERS);
  s->flat = device_floats(h, s->layout.vector_elements, DDP_MEM_COMM_BUFFERS);
  s->scratch = device_floats(h, s->layout.scratch_elements, DDP_MEM_COMM_BUFFERS);
  s->retired.push_back(std::move(s->saved_error));
  s->retired.push_back(std::move(s->saved_q));
  if (s->loss_scaled) {
    s->saved_error = device_floats(h, s->layout.error_elements, DDP_MEM_OPTIMIZER_STATE);
    s->saved_q = device_floats(h, s->layout.q_elements, DDP_MEM_OPTIMIZER_STATE);
  }
  carry_state(s, old, old_error, old_q);
  s->retired.push_back(std::move(old_error));
  s->retired.push_back(std::move(old_q));
  name_state(s);
}

// Once the copies of a new layout have run (the training thread has waited
// for the comm stream, which waited for compute): their sources go.
void release_retired(ddp_strategy* s) {
  s->retired.clear();
  s->retired_staging.clear();
}

ddp_status powersgd_create(const ddp_host* host, const ddp_transport_v1_t* transport, ddp_comm* comm,
                           ddp_strategy** out) {
  return guard(host, [&] {
    const Host h(host);
    const Keys keys = read_keys(h);
    if (!DDP_HOST_HAS(host, gemm) || !DDP_HOST_HAS(host, normalize))
      throw Failure(DDP_ERR_UNSUPPORTED,
                    "powersgd computes through the host's gemm, dot, norm, axpy and normalize: "
                    "it needs an engine of ABI 1.9 or newer");
    *out = new ddp_strategy_s(host, transport, comm, keys);
    (*out)->loss_scaled = ddp::strategy::run_precision(host).loss_scaled != 0;
  });
}

ddp_status powersgd_on_train_begin(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    s->broadcast_params_from_rank0();
    lay_out(s);
    s->comm_after_compute();  // the initial Qs are on the device
    s->wait_comm();
    release_retired(s);
  });
}

ddp_status powersgd_on_step_begin(ddp_strategy* s, const ddp_step_info* info) {
  return guard(s->host.raw(), [&] {
    if (info->params_changed) lay_out(s);
    s->syncing = info->sync_grads != 0;
    s->step = info->step;
    s->scale = s->loss_scaled ? ddp::strategy::step_loss_scale(s->host.raw(), info) : 1.0;
    if (!(s->scale > 0) || !std::isfinite(s->scale))
      throw Failure(DDP_ERR_INVALID_ARGUMENT, "the engine's loss scale for step " + std::to_string(info->step + 1) +
                                                  " is " + ddp::strategy::json_number(s->scale) +
                                                  ", not a finite number > 0");
  });
}

// Before start_step: every trainable gradient averaged where it lies, in
// one all-reduce where the engine packed them back to back, else one each.
void average_uncompressed(ddp_strategy* s) {
  const Host& h = s->host;
  std::vector<size_t> order;  // packing order: reverse table order
  size_t total = 0;
  for (size_t i = h.param_count(); i-- > 0;)
    if (h.param(i).trainable && h.param(i).numel > 0) {
      order.push_back(i);
      total += h.param(i).numel;
    }
  s->comm_after_compute();
  if (char* packed = s->packed_grads(order)) {
    s->comm.all_reduce(h.floats(packed, total), DDP_REDUCE_AVG, h.comm_stream());
    return;
  }
  for (const size_t i : order)
    s->comm.all_reduce(h.floats(h.param(i).grad, h.param(i).numel), DDP_REDUCE_AVG, h.comm_stream());
}

// The 1-D gradients: copied into the flat buffer, averaged, copied back,
// on the comm stream (after what compute made so far).
void average_vectors(ddp_strategy* s) {
  const Host& h = s->host;
  const ddp_stream comm = h.comm_stream();
  if (s->layout.vectors.empty()) return;
  s->comm_after_compute();
  for (const auto& v : s->layout.vectors)
    h.copy(s->flat.floats() + v.offset, h.param(v.param).grad, v.numel * sizeof(float), comm);
  s->comm.all_reduce(h.floats(s->flat.get(), s->layout.vector_elements), DDP_REDUCE_AVG, comm);
  for (const auto& v : s->layout.vectors)
    h.copy(h.param(v.param).grad, s->flat.floats() + v.offset, v.numel * sizeof(float), comm);
}

// One compressed sync (see the top): M and P on the compute stream, the
// rest on the comm stream after P's all-reduce. Non-blocking.
void compress(ddp_strategy* s) {
  using namespace ddp::powersgd;
  const Host& h = s->host;
  const Layout& l = s->layout;
  const ddp_stream compute = h.compute_stream();
  const ddp_stream comm = h.comm_stream();
  const double eps = s->keys.epsilon;
  float* error = s->error.floats();
  float* p = s->p.floats();
  float* q = s->q.floats();
  float* scratch = s->scratch.floats();
  average_vectors(s);
  if (l.matrices.empty()) return;
  if (s->loss_scaled) {  // what a skipped step puts back
    h.copy(s->saved_error.get(), error, l.error_elements * sizeof(float), compute);
    h.copy(s->saved_q.get(), q, l.q_elements * sizeof(float), compute);
    s->saved = true;
  }
  const double scale = s->scale;
  for (const Group& g : l.groups) {
    add_gradients(h, l, g, error, 1.0 / scale, compute);  // error holds M (divided by the scale) from here
    orthogonalize(h, q + g.q_offset, g.cols, g.rank, g.count, eps, scratch, compute);
    p_from_q(h, g, error, q, p, compute);
  }
  s->comm_after_compute();
  s->comm.all_reduce(h.floats(p, l.p_elements), DDP_REDUCE_SUM, comm);
  for (const Group& g : l.groups) {
    orthogonalize(h, p + g.p_offset, g.rows, g.rank, g.count, eps, scratch, comm);
    q_from_p(h, g, error, p, q, comm);
  }
  s->comm.all_reduce(h.floats(q, l.q_elements), DDP_REDUCE_SUM, comm);
  h.scale(h.floats(q, l.q_elements), 1.0 / h.world_size(), comm);
  for (const Group& g : l.groups) {
    decompress(h, l, g, p, q, scale, comm);
    add_gradients(h, l, g, error, -1.0 / scale, comm);  // error = M − grad
  }
}

ddp_status powersgd_on_backward_end(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->syncing) return;
    s->syncing = false;
    if (s->step < s->keys.start_step) {
      average_uncompressed(s);
      ++s->plain_steps;
      return;
    }
    compress(s);
    ++s->compressed_steps;
  });
}

// A skipped step's error and Q put back as it found them (the engine
// skipped its update: an inf or NaN on some rank, in every rank's P).
ddp_status powersgd_on_step_end(ddp_strategy* s, const ddp_step_info*, int* synced) {
  return guard(s->host.raw(), [&] {
    *synced = 1;
    const bool saved = std::exchange(s->saved, false);
    const Host& h = s->host;
    if (!saved || !h.raw()->step_skipped(h.raw()->ctx)) return;
    s->comm_after_compute();
    h.copy(s->error.get(), s->saved_error.get(), s->layout.error_elements * sizeof(float), h.comm_stream());
    h.copy(s->q.get(), s->saved_q.get(), s->layout.q_elements * sizeof(float), h.comm_stream());
    s->wait_comm();
  });
}

// The retired buffers go once the copies from them ran on compute (the
// comm stream waits for it here too, where this step enqueued nothing).
ddp_status powersgd_finish(ddp_strategy* s) {
  return guard(s->host.raw(), [&] {
    if (!s->retired.empty()) s->comm_after_compute();
    s->wait_comm();
    release_retired(s);
  });
}

// {"rank": 2, "start_step": 0, "epsilon": 1e-08, "seed": 0, "matrices": [{"name": "fc1.weight", "shape": [n, m],
//  "rank": r}, ...], "vector_elements": v, "bytes_per_step": b, "all_reduce_bytes": a, "compression_ratio": a / b,
//  "compressed_steps": c, "uncompressed_steps": u}
ddp_status powersgd_stats(ddp_strategy* s, char* buf, size_t cap, size_t* needed) {
  return guard(s->host.raw(), [&] {
    using ddp::strategy::json_number;
    const Layout& l = s->layout;
    std::string matrices;
    for (const Matrix& m : l.matrices)
      matrices += (matrices.empty() ? "" : ", ") + std::string("{\"name\": ") +
                  ddp::strategy::json_quote(s->host.param(m.param).name) + ", \"shape\": [" + std::to_string(m.rows) +
                  ", " + std::to_string(m.cols) + "], \"rank\": " + std::to_string(m.rank) + "}";
    ddp::strategy::write_stats(
        "{\"rank\": " + std::to_string(s->keys.rank) + ", \"start_step\": " + std::to_string(s->keys.start_step) +
            ", \"epsilon\": " + json_number(s->keys.epsilon) + ", \"seed\": " + std::to_string(s->keys.seed) +
            ", \"matrices\": [" + matrices + "], \"vector_elements\": " + std::to_string(l.vector_elements) +
            ", \"bytes_per_step\": " + std::to_string(l.bytes_per_step()) + ", \"all_reduce_bytes\": " +
            std::to_string(l.dense_bytes()) + ", \"compression_ratio\": " + json_number(l.compression_ratio()) +
            ", \"compressed_steps\": " + std::to_string(s->compressed_steps) +
            ", \"uncompressed_steps\": " + std::to_string(s->plain_steps) + "}",
        buf, cap, needed);
  });
}

ddp_status powersgd_state(ddp_strategy* s, const ddp_state_buffer** out, size_t* count) {
  *out = s->state.data();
  *count = s->state.size();
  return DDP_OK;
}

ddp_status powersgd_state_scopes(ddp_strategy* s, const ddp_state_scope** scopes, size_t* count) {
  *scopes = s->scopes.data();
  *count = s->scopes.size();
  return DDP_OK;
}

void powersgd_destroy(ddp_strategy* s) { delete s; }

// `ddp plan`, for the steps from start_step on: the vectors' all-reduce,
// P's and Q's, none beside compute (all follow backward); the error and Q
// (optimizer state), P, the flat buffer, the projections and Q's staging
// (communication buffers), from set-up on.
ddp_status powersgd_plan(const ddp_host* host, const ddp_transport_v1_t*, ddp_plan* out) {
  return guard(host, [&] {
    const Host h(host);
    const ddp::plugin::Plan plan(out);
    const Keys keys = read_keys(h);
    const Layout l = ddp::powersgd::lay_out(tensors(h), size_t(keys.rank));
    plan.buffer(DDP_MEM_OPTIMIZER_STATE, l.error_elements * sizeof(float));
    plan.buffer(DDP_MEM_OPTIMIZER_STATE, l.q_elements * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, l.p_elements * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, l.vector_elements * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, l.scratch_elements * sizeof(float));
    plan.buffer(DDP_MEM_COMM_BUFFERS, l.q_elements * sizeof(float));  // the initial Qs' staging (alloc_host)
    if (ddp::strategy::run_precision(host).loss_scaled) {             // the error and Q a step started from
      plan.buffer(DDP_MEM_OPTIMIZER_STATE, l.error_elements * sizeof(float));
      plan.buffer(DDP_MEM_OPTIMIZER_STATE, l.q_elements * sizeof(float));
    }
    if (l.vector_elements) plan.collective(DDP_OP_ALL_REDUCE, l.vector_elements);
    if (l.matrices.empty()) return;
    plan.collective(DDP_OP_ALL_REDUCE, l.p_elements);
    plan.collective(DDP_OP_ALL_REDUCE, l.q_elements);
  });
}

}  // namespace

DDP_STRATEGY_ENTRY = {
    .abi_version = DDP_ABI_VERSION,
    .struct_size = sizeof(ddp_strategy_v1_t),
    .name = "powersgd",
    .version = "0.1.0",
    .caps = DDP_CAP_DEVICE_CPU | DDP_CAP_DEVICE_CUDA,
    .create = powersgd_create,
    .on_train_begin = powersgd_on_train_begin,
    .on_step_begin = powersgd_on_step_begin,
    .on_backward_end = powersgd_on_backward_end,
    .finish = powersgd_finish,
    .stats = powersgd_stats,
    .destroy = powersgd_destroy,
    .keys = kKeys,
    .plan = powersgd_plan,
    .on_step_end = powersgd_on_step_end,
    .state = powersgd_state,
    .state_scopes = powersgd_state_scopes,
};
