// metered_transport.cpp — see metered_transport.h.
#include "metered_transport.h"

#include <cstdint>

#include "collective_check.h"
#include "groups.h"
#include "nvtx.h"
#include "plugin_host.h"
#include "staged.h"
#include "whereabouts.h"

namespace ddp {
namespace {

Stream* to_stream(ddp_stream s) { return reinterpret_cast<Stream*>(s); }

}  // namespace

struct MeterCallbacks {
  static MeteredComm& group(ddp_comm* comm) { return *reinterpret_cast<MeteredComm*>(comm); }
  static MeteredTransport& self(ddp_comm* comm) { return *group(comm).owner; }

  // Brackets the real call with two host functions on the same stream: the
  // second one runs when the collective has finished, in stream order.
  // Issue order is the training thread's order, so the hash is race-free.
  // A group's collective hashes its group's size too (the world's does
  // not: a run without groups keeps the fingerprint it always had).
  static void fingerprint(ddp_comm* comm, uint64_t op, uint64_t count, uint64_t dtype, uint64_t arg) {
    std::atomic<uint64_t>& h = self(comm).services_.counters.sequence_hash;
    uint64_t v = h.load();
    const uint64_t size = group(comm).world() ? 0 : uint64_t(group(comm).size);
    for (uint64_t word : {op, count, dtype, arg, size})
      for (int b = 0; b < 8; ++b) v = (v ^ ((word >> (8 * b)) & 0xff)) * 1099511628211ull;
    h.store(v);
  }

  // The parameter whose data or gradient holds all `bytes` at `p`, -1 if
  // none (a bucket averaged in the gradients' memory spans several).
  static int64_t param_of(const HostServices& services, const void* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    for (const ddp_param& q : services.params.param_table)
      for (const void* base : {q.data, q.grad}) {
        const auto b = reinterpret_cast<uintptr_t>(base);
        const size_t size = q.numel * ddp_dtype_size(q.dtype);
        if (b && at >= b && at < b + size && bytes <= b + size - at) return int64_t(q.index);
      }
    return -1;
  }

  // run.debug_collectives: every rank's description of the call it is about
  // to make, all-gathered within its group on the call's stream (through the
  // real transport, unmetered) and compared before the call is made. Under
  // a divergent strategy, the world's in on_step_end always (set_step_end).
  static ddp_status agree(ddp_comm* comm, ddp_stream stream, CollectiveCall call, const void* data) {
    MeteredTransport& m = self(comm);
    MeteredComm& g = group(comm);
    const bool step_end = m.step_end_ && g.world() && g.size > 1;  // on_step_end of a divergent strategy
    if (!m.debug_ && !step_end) return DDP_OK;
    if (Stream::in_task() && !m.debug_) return DDP_OK;  // a host function's: compared under the debug check only
    if (Stream::in_task())
      return host_guard([] {
        throw Error(
            "run.debug_collectives: a collective issued inside a host function cannot be checked (the "
            "check waits for its stream): issue it at enqueue time, or turn the check off",
            DDP_ERR_UNSUPPORTED);
      });
    call.seq = g.described++;
    call.param = param_of(m.services_, data, size_t(call.count) * ddp_dtype_size(ddp_dtype(call.dtype)));
    std::vector<int64_t> mine(kCallWords);
    std::vector<int64_t> all(kCallWords * size_t(g.size));
    to_words(call, mine.data());
    ddp_status status = DDP_OK;
    const ddp_status thrown = host_guard(
        [&] {
          whereabouts::Inside in(m.label_,
                                 m.debug_ ? "all_gather (run.debug_collectives)" : "all_gather (on_step_end's check)");
          try {
            status = gather_words(m, g, stream, mine.data(), all.data(), mine.size(), all.size());
          } catch (const Error& e) {  // a rank never came to compare its next collective: say where
            throw Error(std::string(e.what()) +
                            (m.debug_ ? " (run.debug_collectives comparing the next collective"
                                      : " (comparing the next collective in on_step_end") +
                            (g.world() ? "" : " of " + g.label) + ")",
                        e.status());
          }
        },
        DDP_ERR_COMM);
    if (thrown != DDP_OK || status != DDP_OK) return thrown != DDP_OK ? thrown : status;  // the error text is set
    const std::vector<std::string> names = param_names(m);
    bool returned = false;  // a rank that returned from on_step_end: step_end_mismatch's sentence
    for (int r = 0; r < g.size; ++r) returned |= all[size_t(r) * kCallWords + 1] == kStepEnd;
    const std::string mismatch = step_end ? step_end_mismatch(all, g.size, names, m.step_end_step_)
                                          : first_mismatch(all, g.size, names, g.ranks, g.label);
    if (mismatch.empty()) return DDP_OK;
    const std::string why = (m.debug_ && !returned ? "run.debug_collectives: " : "") + mismatch;
    return host_guard([&] { throw Error(why, DDP_ERR_INVALID_ARGUMENT); });
  }

  static std::vector<std::string> param_names(const MeteredTransport& m) {
    std::vector<std::string> names;
    for (const ddp_param& q : m.services_.params.param_table) names.emplace_back(q.name);
    return names;
  }

  // An all-gather of int64 words within `g`, through the real transport,
  // waited for: sent as float64 (which every transport supports), copied,
  // not computed on.
  static ddp_status gather_words(MeteredTransport& m, MeteredComm& g, ddp_stream stream, int64_t* mine, int64_t* all,
                                 size_t send, size_t recv) {
    const ddp_device_kind kind = m.services_.device->kind();
    return run_staged(
        *m.services_.device, *to_stream(stream),
        [&](void* const* p) {
          const ddp_buffer s{p[0], send, DDP_FLOAT64, kind};
          const ddp_buffer r{p[1], recv, DDP_FLOAT64, kind};
          return m.real_->all_gather(g.real, &s, &r, stream);
        },
        {{mine, send * sizeof(int64_t)}, {all, recv * sizeof(int64_t)}}, m.services_.wait_limit(), &m.staged_);
  }

  // What the closing host function needs (the start, and for a trace the
  // collective): heap-held so the tasks stay two pointers, as without a trace.
  struct Span {
    Clock::time_point start;
    Trace* trace;  // null: not traced
    const char* op;
    int64_t bytes;
    int64_t step;
    const char* group;                    // a group's label; null: the world
    std::atomic<const char*>* in_flight;  // the rank's note of the group whose collective runs
    uint64_t nvtx = 0;                    // the collective's NVTX range (GPU builds)
  };

  // Counted once the transport took it: the rank's totals and the group's,
  // bus bytes on the group's size.
  static void count(MeteredComm& g, size_t bytes, const char* op) {
    CommCounters& c = g.owner->services_.counters;
    const int64_t bus = bus_bytes(op, int64_t(bytes), g.size);
    c.collectives += 1;
    c.bytes += static_cast<int64_t>(bytes);
    c.bus_bytes += bus;
    int64_t largest = c.largest.load();  // a maximum two streams may raise at once
    while (int64_t(bytes) > largest && !c.largest.compare_exchange_weak(largest, int64_t(bytes))) {}
    g.collectives += 1;
    g.bytes += static_cast<int64_t>(bytes);
    g.bus_bytes += bus;
  }

  template <typename Call>
  static ddp_status metered(ddp_comm* comm, ddp_stream stream, const char* op, size_t bytes, Call&& call) {
    MeteredTransport& m = self(comm);
    MeteredComm& g = group(comm);
    Stream& s = *to_stream(stream);
    if (s.native()) return metered_on_device(g, s, op, bytes, std::forward<Call>(call));
    const char* label = g.world() ? nullptr : g.label.c_str();
    auto* span = new Span{Clock::time_point(), nullptr, op, int64_t(bytes), 0, label, &m.services_.group_in_flight};
    // A device stream's enqueue can fail (cudaLaunchHostFunc): the error
    // goes back as a status, never as an exception across the C ABI. A
    // group's collective is noted while it runs: its failure, or a wait
    // that gives up on it, names the group and its ranks.
    ddp_status queued = host_guard(
        [&] {
          s.enqueue([span](bool cancelled) {
            span->start = Clock::now();
            span->nvtx = nvtx::start(span->op);
            if (cancelled) return;  // the stream failed before: its failure names what ran then
            Stream::set_task_note(span->group);
            span->in_flight->store(span->group);
          });
        },
        DDP_ERR_COMM);
    if (queued != DDP_OK) {
      delete span;
      return queued;
    }
    ddp_status status;
    {
      whereabouts::Inside in(m.label_, op);
      status = call(m.real_, g.real);
    }
    if (status == DDP_OK && m.trace_) {  // traced iff counted, under the step that issued it
      span->trace = m.trace_;
      span->step = m.trace_->step();
    }
    CommCounters* counters = &m.services_.counters;
    // (If this enqueue fails, the first task still holds span: it leaks.)
    queued = host_guard(
        [&] {
          s.enqueue([span, counters](bool cancelled) {
            nvtx::end(span->nvtx);
            Stream::set_task_note(nullptr);
            if (!cancelled) {
              span->in_flight->store(nullptr);
              const Clock::time_point end = Clock::now();
              counters->busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - span->start).count();
              if (span->trace)
                span->trace->collective(span->op, span->bytes, span->step, span->start, end, span->group);
            }
            delete span;
          });
        },
        DDP_ERR_COMM);
    if (queued != DDP_OK) return queued;
    if (status == DDP_OK) count(g, bytes, op);
    return status;
  }

  // A device stream: timestamps around the collective, read in settle().
  template <typename Call>
  static ddp_status metered_on_device(MeteredComm& g, Stream& s, const char* op, size_t bytes, Call&& call) {
    MeteredTransport& m = *g.owner;
    void* begin = nullptr;
    void* end = nullptr;
    ddp_status queued = host_guard([&] { begin = s.record_timestamp(); }, DDP_ERR_COMM);
    if (queued != DDP_OK) return queued;
    ddp_status status;
    {
      nvtx::Range range(op);
      whereabouts::Inside in(m.label_, op);
      status = call(m.real_, g.real);
    }
    queued = host_guard(
        [&] {
          end = s.record_timestamp();
          m.pending_.push_back(MeteredTransport::Pending{&s, begin, end, op, g.world() ? nullptr : g.label.c_str(),
                                                         int64_t(bytes),
                                                         status == DDP_OK && m.trace_ ? m.trace_->step() : -1});
        },
        DDP_ERR_COMM);
    if (queued != DDP_OK) {
      s.release_timestamp(begin);
      s.release_timestamp(end);
      return queued;
    }
    if (status == DDP_OK) count(g, bytes, op);
    return status;
  }

  static ddp_status init(const ddp_host*, ddp_comm**) {
    return host_guard([] { throw Error("a strategy may not create another communicator", DDP_ERR_UNSUPPORTED); });
  }
  static void destroy(ddp_comm*) {}
  static ddp_status all_reduce(ddp_comm* c, const ddp_buffer* buf, ddp_reduce_op op, ddp_stream s) {
    if (ddp_status bad = agree(c, s, {0, 1, int64_t(buf->count), buf->dtype, op}, buf->ptr)) return bad;
    fingerprint(c, 1, buf->count, buf->dtype, op);
    return metered(c, s, "all_reduce", buf->count * ddp_dtype_size(buf->dtype),
                   [&](auto* t, ddp_comm* rc) { return t->all_reduce(rc, buf, op, s); });
  }
  static ddp_status broadcast(ddp_comm* c, const ddp_buffer* buf, int root, ddp_stream s) {
    if (ddp_status bad = agree(c, s, {0, 2, int64_t(buf->count), buf->dtype, root}, buf->ptr)) return bad;
    fingerprint(c, 2, buf->count, buf->dtype, uint64_t(root));
    return metered(c, s, "broadcast", buf->count * ddp_dtype_size(buf->dtype),
                   [&](auto* t, ddp_comm* rc) { return t->broadcast(rc, buf, root, s); });
  }
  static ddp_status all_gather(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv, ddp_stream s) {
    if (ddp_status bad = agree(c, s, {0, 3, int64_t(send->count), send->dtype, int64_t(recv->count)}, send->ptr))
      return bad;
    fingerprint(c, 3, send->count, send->dtype, recv->count);
    return metered(c, s, "all_gather", recv->count * ddp_dtype_size(recv->dtype),
                   [&](auto* t, ddp_comm* rc) { return t->all_gather(rc, send, recv, s); });
  }
  static ddp_status reduce_scatter(ddp_comm* c, const ddp_buffer* send, const ddp_buffer* recv, ddp_reduce_op op,
                                   ddp_stream s) {
    if (ddp_status bad = agree(c, s, {0, 4, int64_t(send->count), send->dtype, op}, send->ptr)) return bad;
    fingerprint(c, 4, send->count, send->dtype, op);
    return metered(c, s, "reduce_scatter", send->count * ddp_dtype_size(send->dtype),
                   [&](auto* t, ddp_comm* rc) { return t->reduce_scatter(rc, send, recv, op, s); });
  }
  static ddp_status barrier(ddp_comm* c, ddp_stream s) {
    if (ddp_status bad = agree(c, s, {0, 5, 0, 0, 0}, nullptr)) return bad;
    fingerprint(c, 5, 0, 0, 0);
    return metered(c, s, "barrier", 0, [&](auto* t, ddp_comm* rc) { return t->barrier(rc, s); });
  }
  // What a strategy of ABI < 1.4 calls where the transport has no
  // reduce_scatter (optional since 1.4).
  static ddp_status missing_reduce_scatter(ddp_comm* c, const ddp_buffer*, const ddp_buffer*, ddp_reduce_op,
                                           ddp_stream) {
    return host_guard(
        [&] {
          throw Error(
              std::string("reduce_scatter: transport '") + self(c).real_->name + "' has none (optional since ABI 1.4)",
              DDP_ERR_UNSUPPORTED);
        },
        DDP_ERR_UNSUPPORTED);
  }
  static void abort(ddp_comm* c) {
    MeteredTransport& m = self(c);
    if (m.real_->abort) m.real_->abort(group(c).real);
  }
};

MeteredTransport::~MeteredTransport() {
  for (const Pending& p : pending_) {
    p.stream->release_timestamp(p.begin);
    p.stream->release_timestamp(p.end);
  }
  release_groups();
}

void MeteredTransport::settle(bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    const Pending p = pending_[i];
    if (!wait && !p.stream->timestamp_passed(p.end)) {
      pending_[kept++] = p;
      continue;
    }
    void* const stamps[2] = {p.begin, p.end};
    Clock::time_point at[2];
    p.stream->resolve_timestamps(stamps, 2, at);
    const Clock::time_point begin = at[0];
    const Clock::time_point end = at[1];
    p.stream->release_timestamp(p.begin);
    p.stream->release_timestamp(p.end);
    services_.counters.busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
    if (trace_ && p.step >= 0) trace_->collective(p.op, p.bytes, p.step, begin, end, p.group);
  }
  pending_.resize(kept);
}

void MeteredTransport::serve_strategy_of_minor(uint32_t minor) {
  if (minor < 4 && !real_->reduce_scatter) vtable_.reduce_scatter = MeterCallbacks::missing_reduce_scatter;
}

MeteredTransport::MeteredTransport(const ddp_transport_v1_t* real, ddp_comm* comm, HostServices& services,
                                   const char* label)
    : real_(real), services_(services), label_(label) {
  // Every entry is listed here: a new one must be metered (or refused), never
  // passed through with the wrapper's handle.
  static_assert(sizeof(ddp_transport_v1_t) == 4 + 4 + 2 * sizeof(void*) + 8 + 8 * sizeof(void*) + 8 + 3 * sizeof(void*),
                "ddp_transport_v1_t changed: update MeteredTransport");
  vtable_ = ddp_transport_v1_t{};
  vtable_.abi_version = real->abi_version;
  vtable_.name = real->name;
  vtable_.version = real->version;
  vtable_.caps = real->caps;
  vtable_.struct_size = sizeof(ddp_transport_v1_t);
  vtable_.init = MeterCallbacks::init;
  vtable_.destroy = MeterCallbacks::destroy;
  vtable_.all_reduce = MeterCallbacks::all_reduce;
  vtable_.broadcast = MeterCallbacks::broadcast;
  vtable_.all_gather = MeterCallbacks::all_gather;
  // Optional (1.4): a transport without one offers none through the meter either.
  vtable_.reduce_scatter = real->reduce_scatter ? MeterCallbacks::reduce_scatter : nullptr;
  vtable_.barrier = MeterCallbacks::barrier;
  vtable_.abort = MeterCallbacks::abort;
  vtable_.dtypes = real->dtypes;  // `real` is the loader's host-sized copy: 0 where the plugin lacks it
  vtable_.keys = real->keys;
  vtable_.plan = nullptr;   // planning happens before any rank starts, on the real descriptor
  vtable_.split = nullptr;  // a strategy makes groups through ddp_host::split, which the engine meters
  std::vector<int> everyone;
  for (int r = 0; r < services.rank.world_size; ++r) everyone.push_back(r);
  add_comm(comm, "world", std::move(everyone), services.rank.rank, 0);
}

MeteredComm& MeteredTransport::add_comm(ddp_comm* real, std::string name, std::vector<int> ranks, int rank, int color,
                                        std::string tag) {
  MeteredComm& g = comms_.emplace_back();  // (split holds comms_mutex_; the constructor is alone)
  g.owner = this;
  g.real = real;
  g.name = std::move(name);
  g.ranks = std::move(ranks);
  g.tag = std::move(tag);
  g.rank = rank;
  g.size = int(g.ranks.size());
  g.color = color;
  if (comms_.size() > 1) g.label = group_label(g.name, g.ranks);
  g.abi.struct_size = sizeof(ddp_group);
  g.abi.name = g.name.c_str();
  g.abi.rank = g.rank;
  g.abi.size = g.size;
  g.abi.ranks = g.ranks.data();
  g.abi.color = g.color;
  return g;
}

ddp_comm* MeteredTransport::split(ddp_comm* parent_handle, int color, int key, const char* name) {
  const ddp_group* known = group(parent_handle);
  if (!known)
    throw Error(
        "split: the parent is no communicator of this strategy's (the comm create was given, "
        "or one split made)",
        DDP_ERR_INVALID_ARGUMENT);
  const std::string problem = group_name_problem(name);
  if (!problem.empty()) throw Error("split: " + problem, DDP_ERR_INVALID_ARGUMENT);
  for (const MeteredComm& g : comms_)
    if (g.name == name)
      throw Error("split: this strategy has a group named '" + std::string(name) + "' already: give each its own name",
                  DDP_ERR_INVALID_ARGUMENT);
  if (!DDP_PLUGIN_HAS(real_, split))
    throw Error(std::string("split: transport '") + real_->name + "' makes no groups (it has no split entry)",
                DDP_ERR_UNSUPPORTED);
  MeteredComm& parent = MeterCallbacks::group(parent_handle);
  // Every rank's color and key, in parent rank order: who is in which group.
  std::vector<int64_t> mine{color, key};
  std::vector<int64_t> all(2 * size_t(parent.size));
  Stream& comm = services_.device->comm_stream();
  {
    whereabouts::Inside in(label_, "all_gather (split)");
    ddp_status status = DDP_OK;
    try {
      status = MeterCallbacks::gather_words(*this, parent, reinterpret_cast<ddp_stream>(&comm), mine.data(), all.data(),
                                            2, all.size());
    } catch (const Error& e) {  // a stuck or failed gather: every rank of the parent must split here
      throw Error(std::string("split '") + name + "': gathering every rank's color and key: " + e.what(), e.status());
    }
    if (status != DDP_OK)
      throw Error(std::string("split '") + name + "': gathering every rank's color and key: " + take_plugin_error(),
                  status);
  }
  const GroupPlace place = place_in_group(all, parent.rank);
  std::vector<int> world_ranks;
  for (int r : place.members) world_ranks.push_back(parent.ranks[size_t(r)]);
  // The tag: the same on every member, one per group of the run (two
  // parents split at the same point with the same color get two).
  const std::string tag = parent.tag + "." + std::to_string(parent.splits++) + "." + std::to_string(color);
  const ddp_split how{sizeof(ddp_split), color, key, place.rank, place.size, tag.c_str()};
  ddp_comm* made = nullptr;
  ddp_status status;
  {
    whereabouts::Inside in(label_, "split");
    status = real_->split(parent.real, &how, &made);
  }
  if (status != DDP_OK)
    throw Error(
        std::string(label_) + ": split: " + take_plugin_error() + " (making " + group_label(name, world_ranks) + ")",
        status);
  if (!made) throw Error(std::string(label_) + ": split: no communicator made, and no error", DDP_ERR_INTERNAL);
  std::lock_guard<std::mutex> lock(comms_mutex_);
  return add_comm(made, name, std::move(world_ranks), place.rank, color, tag).comm();
}

const ddp_group* MeteredTransport::group(ddp_comm* comm) const {
  for (const MeteredComm& g : comms_)
    if (reinterpret_cast<const ddp_comm*>(&g) == comm) return &g.abi;
  return nullptr;
}

void MeteredTransport::release_groups() {
  std::lock_guard<std::mutex> lock(comms_mutex_);
  while (comms_.size() > 1) {
    MeteredComm& g = comms_.back();
    if (g.real) {
      whereabouts::Inside in(label_, "destroy");
      real_->destroy(g.real);
    }
    comms_.pop_back();
  }
}

void MeteredTransport::abort_groups() {
  std::lock_guard<std::mutex> lock(comms_mutex_);
  if (!real_->abort) return;
  for (size_t k = 1; k < comms_.size(); ++k) real_->abort(comms_[k].real);
}

std::vector<GroupReport> MeteredTransport::reports() const {
  std::vector<GroupReport> out;
  for (const MeteredComm& g : comms_) out.push_back({g.name, g.ranks, g.collectives, g.bytes, g.bus_bytes});
  return out;
}

}  // namespace ddp
