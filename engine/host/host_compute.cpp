// host_compute.cpp — ddp_host's compute entries (ABI 1.9: gemm, dot, norm,
// axpy, normalize), which lend a strategy the engine's BLAS: the argument
// checks, each refusal naming the entry and what is wrong, then the
// device's Compute (engine/models/compute.h), which enqueues the work on the
// stream. Failures become a status and text through host_guard, as the
// entries of plugin_host.cpp do. Not here: the arithmetic (compute.cpp and
// cuda/cuda_compute.cu in engine/models/), and any check that needs the device
// (whether a pointer is its memory; copy does not check it either).
#include <climits>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "plugin_host.h"
#include "stream.h"

namespace ddp {

Compute& HostServices::compute() {
  // A throw (no cuBLAS) leaves it unmade: the next call tries again.
  std::lock_guard<std::mutex> lock(compute_mutex);
  if (!compute_work) compute_work = make_compute(device->kind());
  return *compute_work;
}

namespace {

std::string num(size_t v) { return std::to_string(v); }

[[noreturn]] void refuse(const char* entry, const std::string& why, ddp_status kind = DDP_ERR_INVALID_ARGUMENT) {
  throw Error(std::string(entry) + ": " + why, kind);
}

// As every entry that reaches the device (HostCallbacks::refusal, in
// plugin_host.cpp, in the same words): CUDA allows no CUDA call inside a
// host function, so the work could not be enqueued there.
void refuse_in_device_task(const char* entry) {
  if (Stream::in_device_task())
    refuse(entry,
           "not allowed inside a host function on a device stream (CUDA allows no CUDA calls there, and none may "
           "block): call it at enqueue time, on the calling thread",
           DDP_ERR_UNSUPPORTED);
}

Stream& stream_of(const char* entry, ddp_stream stream) {
  if (!stream) refuse(entry, "NULL stream");
  return *reinterpret_cast<Stream*>(stream);
}

// OpenBLAS's cblas (32-bit blasint) and cuBLAS take int sizes.
void require_int(const char* what, size_t v) {
  if (v > static_cast<size_t>(INT_MAX))
    refuse("gemm",
           std::string(what) + " " + num(v) + " is beyond the int range BLAS takes (at most " + num(INT_MAX) + ")");
}

// A matrix's leading dimension against its row: `ld` elements from one row
// to the next cannot be fewer than the row holds.
void require_row(const char* ld_name, size_t ld, const char* matrix, size_t row, const std::string& row_is) {
  if (ld < row)
    refuse("gemm", std::string(ld_name) + " " + num(ld) + " is less than a row of " + matrix + " (" + num(row) +
                       " elements: " + row_is + ")");
}

// The elements from v's first to its last (indices from v.ptr).
size_t extent(const ddp_vectors& v) {
  if (v.count == 0 || v.length == 0) return 0;
  return (v.count - 1) * v.stride + (v.length - 1) * v.inc + 1;
}

// The residues modulo v.inc of v's elements, from v.ptr: every element
// of vector i lies at i·stride + k·inc. Empty where there are too many
// vectors to list (then the caller takes them as meeting).
std::vector<bool> residues(const ddp_vectors& v) {
  if (v.inc < 2 || v.count > 4096) return {};
  std::vector<bool> seen(v.inc, false);
  for (size_t i = 0; i < v.count; ++i) seen[(i * v.stride) % v.inc] = true;
  return seen;
}

// Whether operands a and b may share an element: their address ranges
// meet, unless their elements lie at other residues modulo one inc
// (columns of one row-major matrix: Gram-Schmidt's column i against the
// columns after it, in one matrix or across a batch). A sufficient test
// of being apart.
bool may_share(const ddp_vectors& a, const ddp_vectors& b) {
  const auto begin_a = reinterpret_cast<uintptr_t>(a.ptr);
  const auto begin_b = reinterpret_cast<uintptr_t>(b.ptr);
  const uintptr_t end_a = begin_a + extent(a) * sizeof(float);
  const uintptr_t end_b = begin_b + extent(b) * sizeof(float);
  if (extent(a) == 0 || extent(b) == 0 || end_a <= begin_b || end_b <= begin_a) return false;
  if (a.inc != b.inc || (begin_b - begin_a) % sizeof(float) != 0) return true;
  const std::vector<bool> ra = residues(a);
  const std::vector<bool> rb = residues(b);
  if (ra.empty() || rb.empty()) return true;
  const auto inc = static_cast<int64_t>(a.inc);
  const int64_t shift = (static_cast<int64_t>(begin_b) - static_cast<int64_t>(begin_a)) / int64_t(sizeof(float));
  for (int64_t r = 0; r < inc; ++r)
    if (rb[size_t(r)] && ra[size_t(((r + shift) % inc + inc) % inc)]) return true;
  return false;
}

// An output an entry writes may share no element with an operand it reads.
void apart(const char* entry, const char* written, const ddp_vectors& w, const char* read, const ddp_vectors& r) {
  if (may_share(w, r))
    refuse(entry, std::string(written) + " overlaps " + read + ": an entry's output may share no element with " +
                      "what it reads");
}

// `count` floats at p, as one vector.
ddp_vectors floats_at(const float* p, size_t count) { return ddp_vectors{const_cast<float*>(p), count, 1, 1, count}; }

// The fields of ABI 1.9's ddp_gemm, checked. A newer plugin's larger struct
// is read as far as this engine knows it.
ddp_gemm checked_gemm(const ddp_gemm* given) {
  if (!given) refuse("gemm", "NULL ddp_gemm");
  if (given->struct_size < sizeof(ddp_gemm))
    refuse("gemm", "struct_size " + num(given->struct_size) + " is less than ABI 1.9's ddp_gemm (" +
                       num(sizeof(ddp_gemm)) + " bytes): set it to sizeof(ddp_gemm)");
  const ddp_gemm g = *given;
  if (g.trans_a != 0 && g.trans_a != 1) refuse("gemm", "trans_a is " + std::to_string(g.trans_a) + " (0 or 1)");
  if (g.trans_b != 0 && g.trans_b != 1) refuse("gemm", "trans_b is " + std::to_string(g.trans_b) + " (0 or 1)");
  if (g.batch == 0) refuse("gemm", "batch is 0 (at least 1 product)");
  if (!g.a) refuse("gemm", "a is NULL");
  if (!g.b) refuse("gemm", "b is NULL");
  if (!g.c) refuse("gemm", "c is NULL");
  require_row("lda", g.lda, "A", g.trans_a ? g.m : g.k, g.trans_a ? "m, as trans_a is 1" : "k, as trans_a is 0");
  require_row("ldb", g.ldb, "B", g.trans_b ? g.k : g.n, g.trans_b ? "k, as trans_b is 1" : "n, as trans_b is 0");
  require_row("ldc", g.ldc, "C", g.n, "n");
  if (g.batch > 1 && g.m > 0 && g.n > 0) {
    const size_t extent = (g.m - 1) * g.ldc + g.n;  // one C, from its first element to its last
    if (g.stride_c < extent)
      refuse("gemm", "stride_c " + num(g.stride_c) + " is less than one C (" + num(extent) +
                         " elements from its first to its last): the products would write over each other");
  }
  require_int("m", g.m);
  require_int("n", g.n);
  require_int("k", g.k);
  require_int("lda", g.lda);
  require_int("ldb", g.ldb);
  require_int("ldc", g.ldc);
  require_int("batch", g.batch);
  if (!std::isfinite(g.alpha) || !std::isfinite(g.beta)) refuse("gemm", "alpha and beta are finite numbers");
  // C, A and B as the elements from each one's first to its last.
  const auto span = [&](const float* p, size_t rows, size_t ld, size_t row, size_t stride) {
    const size_t one = rows == 0 || row == 0 ? 0 : (rows - 1) * ld + row;
    return floats_at(p, one == 0 ? 0 : (g.batch - 1) * stride + one);
  };
  const ddp_vectors c = span(g.c, g.m, g.ldc, g.n, g.stride_c);
  apart("gemm", "c", c, "a", span(g.a, g.trans_a ? g.k : g.m, g.lda, g.trans_a ? g.m : g.k, g.stride_a));
  apart("gemm", "c", c, "b", span(g.b, g.trans_b ? g.n : g.k, g.ldb, g.trans_b ? g.k : g.n, g.stride_b));
  return g;
}

// Whether no two of v's vectors share an element: they lie one after the
// other (stride past a whole vector), or interleaved (a matrix's columns:
// inc past all the vectors' starts). A sufficient test, which every
// matrix's rows and columns pass.
bool disjoint(const ddp_vectors& v) {
  if (v.count <= 1 || v.length == 0) return true;
  const bool after = v.stride >= (v.length - 1) * v.inc + 1;
  const bool interleaved = v.stride >= 1 && v.inc >= (v.count - 1) * v.stride + 1;
  return after || interleaved;
}

// Operand `name` of `entry`; `written`: the entry writes it, so its vectors
// may not share an element (they would race on a GPU).
const ddp_vectors& checked(const char* entry, const char* name, const ddp_vectors* v, bool written) {
  const std::string what = std::string(name);
  if (!v) refuse(entry, what + " is NULL");
  if (!v->ptr) refuse(entry, what + "'s ptr is NULL");
  if (v->inc == 0 && v->length > 1)
    refuse(entry, what + "'s inc is 0, which makes its " + num(v->length) +
                      " elements one (1 for a row of a matrix, the row length for a column)");
  if (written && !disjoint(*v))
    refuse(entry, what + "'s vectors overlap (" + num(v->count) + " of " + num(v->length) + " elements, inc " +
                      num(v->inc) + ", stride " + num(v->stride) +
                      "): the vectors an entry writes may share no element");
  return *v;
}

void same_shape(const char* entry, const ddp_vectors& x, const ddp_vectors& y) {
  if (x.count != y.count)
    refuse(entry, "x holds " + num(x.count) + " vectors and y " + num(y.count) + ": the counts must be equal");
  if (x.length != y.length)
    refuse(entry,
           "x's vectors hold " + num(x.length) + " elements and y's " + num(y.length) + ": the lengths must be equal");
}

void require_out(const char* entry, const float* out) {
  if (!out) refuse(entry, "out is NULL");
}

}  // namespace

// The entries. Each refuses inside a device task first, as copy does, then
// checks its arguments before anything is enqueued.
struct HostCompute {
  static HostServices& svc(void* ctx) { return static_cast<PluginHost*>(ctx)->services_; }

  static ddp_status gemm(void* ctx, const ddp_gemm* g, ddp_stream stream) {
    return host_guard([&] {
      refuse_in_device_task("gemm");
      const ddp_gemm checked_g = checked_gemm(g);
      svc(ctx).compute().gemm(checked_g, stream_of("gemm", stream));
    });
  }
  static ddp_status dot(void* ctx, const ddp_vectors* x, const ddp_vectors* y, float* out, ddp_stream stream) {
    return host_guard([&] {
      refuse_in_device_task("dot");
      const ddp_vectors& cx = checked("dot", "x", x, false);
      const ddp_vectors& cy = checked("dot", "y", y, false);
      same_shape("dot", cx, cy);
      require_out("dot", out);
      apart("dot", "out", floats_at(out, cx.count), "x", cx);
      apart("dot", "out", floats_at(out, cx.count), "y", cy);
      svc(ctx).compute().dot(cx, cy, out, stream_of("dot", stream));
    });
  }
  static ddp_status norm(void* ctx, const ddp_vectors* x, float* out, ddp_stream stream) {
    return host_guard([&] {
      refuse_in_device_task("norm");
      const ddp_vectors& cx = checked("norm", "x", x, false);
      require_out("norm", out);
      apart("norm", "out", floats_at(out, cx.count), "x", cx);
      svc(ctx).compute().norm(cx, out, stream_of("norm", stream));
    });
  }
  static ddp_status axpy(void* ctx, double alpha, const ddp_vectors* x, const float* scalars, const ddp_vectors* y,
                         ddp_stream stream) {
    return host_guard([&] {
      refuse_in_device_task("axpy");
      const ddp_vectors& cx = checked("axpy", "x", x, false);
      const ddp_vectors& cy = checked("axpy", "y", y, true);
      same_shape("axpy", cx, cy);
      if (!std::isfinite(alpha)) refuse("axpy", "alpha is not a finite number");
      apart("axpy", "y", cy, "x", cx);
      if (scalars) apart("axpy", "y", cy, "scalars", floats_at(scalars, cx.count));
      svc(ctx).compute().axpy(alpha, cx, scalars, cy, stream_of("axpy", stream));
    });
  }
  static ddp_status normalize(void* ctx, const ddp_vectors* x, double eps, ddp_stream stream) {
    return host_guard([&] {
      refuse_in_device_task("normalize");
      const ddp_vectors& cx = checked("normalize", "x", x, true);
      if (!(eps >= 0.0 && std::isfinite(eps))) {
        std::ostringstream text;
        text << "eps " << eps << " is not a finite number >= 0";
        refuse("normalize", text.str());
      }
      svc(ctx).compute().normalize(cx, eps, stream_of("normalize", stream));
    });
  }
};

void install_compute_entries(ddp_host& host) {
  host.gemm = HostCompute::gemm;
  host.dot = HostCompute::dot;
  host.norm = HostCompute::norm;
  host.axpy = HostCompute::axpy;
  host.normalize = HostCompute::normalize;
}

}  // namespace ddp
