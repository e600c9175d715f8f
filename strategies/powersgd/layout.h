// layout.h — the pure part of the `powersgd` strategy: which gradients are
// compressed and at which rank, where each matrix's error, P and Q lie in
// the strategy's buffers, what a step sends, the names of its state, and
// the initial Q drawn from the seed. No host, no device, no I/O: a function
// of the parameter table and the keys, the same on every rank and in
// `ddp plan`, unit-tested in tests/powersgd_layout_test.cpp.
//
// Not here: the arithmetic (powersgd.cpp enqueues it through the host's
// compute entries) and anything that allocates device memory.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace ddp {
namespace powersgd {

// A parameter as the layout sees it: its table index, name, shape and
// whether it trains now (frozen ones are neither compressed nor sent).
struct Tensor {
  size_t index = 0;
  std::string name;
  std::vector<int64_t> shape;  // [] for a scalar
  bool trainable = false;
};

// A gradient of 2 or more dimensions, seen as rows × cols (its first
// dimension × the rest) and compressed at `rank`. Offsets in elements into
// the error buffer ([rows, cols] per matrix), P ([rows, rank]) and Q
// ([cols, rank]).
struct Matrix {
  size_t param = 0;
  size_t rows = 0;
  size_t cols = 0;
  size_t rank = 0;
  size_t group = 0;
  size_t error_offset = 0;
  size_t p_offset = 0;
  size_t q_offset = 0;
  size_t elements() const { return rows * cols; }
};

// Matrices of one shape and rank, back to back in every buffer, so that
// one batched call of a compute entry serves them all. Its members are
// matrices [first, first + count), in packing order (reverse table order,
// as the engine lays out gradients: their gradients then ascend in memory).
struct Group {
  size_t rows = 0;
  size_t cols = 0;
  size_t rank = 0;
  size_t first = 0;
  size_t count = 0;
  size_t error_offset = 0;
  size_t p_offset = 0;
  size_t q_offset = 0;
};

// A gradient of fewer than 2 dimensions: all-reduced uncompressed, from
// its slot in one flat buffer.
struct Vector {
  size_t param = 0;
  size_t numel = 0;
  size_t offset = 0;  // elements into the flat buffer
};

struct Layout {
  std::vector<Matrix> matrices;  // in packing order, grouped
  std::vector<Group> groups;     // in order of first appearance (packing order)
  std::vector<Vector> vectors;   // in packing order
  size_t error_elements = 0;     // Σ rows·cols
  size_t p_elements = 0;         // Σ rows·rank
  size_t q_elements = 0;         // Σ cols·rank
  size_t vector_elements = 0;    // Σ numel of the vectors
  size_t scratch_elements = 0;   // dot's out in Gram-Schmidt: max(group count, rank − 1)

  // Bytes each rank sends per compressed step: P, Q and the vectors (float32).
  size_t bytes_per_step() const { return 4 * (p_elements + q_elements + vector_elements); }
  // Bytes an all-reduce of the same trainable gradients sends.
  size_t dense_bytes() const { return 4 * (error_elements + vector_elements); }
  // dense_bytes / bytes_per_step (PyTorch's compression rate); 0 where nothing is sent.
  double compression_ratio() const {
    return bytes_per_step() == 0 ? 0.0 : double(dense_bytes()) / double(bytes_per_step());
  }
};

// The rank of a rows × cols matrix under the key `rank`: clamped to min(rows, cols).
inline size_t clamp_rank(size_t rank, size_t rows, size_t cols) {
  size_t r = rank < rows ? rank : rows;
  return r < cols ? r : cols;
}

inline size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (const int64_t d : shape) n *= size_t(d);
  return n;
}

// The layout of `params` (the whole table, in table order) at rank `rank`
// (>= 1). Trainable gradients of 2+ dimensions are matrices; the other
// trainable ones vectors; empty ones are skipped. Matrices are grouped by
// (rows, cols, rank), groups in order of first appearance in packing order.
inline Layout lay_out(const std::vector<Tensor>& params, size_t rank) {
  Layout out;
  std::map<std::tuple<size_t, size_t, size_t>, std::vector<Matrix>> by_shape;
  std::vector<std::tuple<size_t, size_t, size_t>> order;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const Tensor& t = *it;
    const size_t numel = numel_of(t.shape);
    if (!t.trainable || numel == 0) continue;
    if (t.shape.size() < 2) {
      out.vectors.push_back({t.index, numel, out.vector_elements});
      out.vector_elements += numel;
      continue;
    }
    Matrix m;
    m.param = t.index;
    m.rows = size_t(t.shape[0]);
    m.cols = numel / m.rows;
    m.rank = clamp_rank(rank, m.rows, m.cols);
    const auto key = std::make_tuple(m.rows, m.cols, m.rank);
    if (!by_shape.count(key)) order.push_back(key);
    by_shape[key].push_back(m);
  }
  for (const auto& key : order) {
    Group g;
    std::tie(g.rows, g.cols, g.rank) = key;
    g.first = out.matrices.size();
    g.count = by_shape[key].size();
    g.error_offset = out.error_elements;
    g.p_offset = out.p_elements;
    g.q_offset = out.q_elements;
    for (Matrix m : by_shape[key]) {
      m.group = out.groups.size();
      m.error_offset = out.error_elements;
      m.p_offset = out.p_elements;
      m.q_offset = out.q_elements;
      out.error_elements += m.rows * m.cols;
      out.p_elements += m.rows * m.rank;
      out.q_elements += m.cols * m.rank;
      out.matrices.push_back(m);
    }
    out.groups.push_back(g);
    const size_t need = g.count > g.rank - 1 ? g.count : g.rank - 1;
    if (need > out.scratch_elements) out.scratch_elements = need;
  }
  return out;
}

// A state buffer's name: the parameter's, each character outside
// [A-Za-z0-9_.] made '_', then `suffix` (".error", ".q").
inline std::string state_name(const std::string& param, const char* suffix) {
  std::string out;
  for (const char c : param) {
    const bool plain =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.';
    out += plain ? c : '_';
  }
  return out + suffix;
}

// 64-bit FNV-1a of `text`: the parameter's share of its Q's seed.
inline uint64_t fnv1a(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// SplitMix64 (Steele, Lea and Flood 2014): one step of the generator.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The initial Q of parameter `name` under `seed`: `count` standard normal
// floats, row-major [cols, rank], the same on every rank and every run. A
// SplitMix64 stream started at seed ^ fnv1a(name) gives uniforms u1 in
// (0, 1] and u2 in [0, 1) from its top 53 bits; Box-Muller turns each pair
// into sqrt(-2 ln u1) cos(2π u2) and sqrt(-2 ln u1) sin(2π u2), in double,
// rounded to float, in that order. (PyTorch draws with torch.randn from a
// seed of its own generator: the same distribution, other values.)
inline void initial_q(uint64_t seed, const std::string& name, float* out, size_t count) {
  uint64_t state = seed ^ fnv1a(name);
  const double two_pi = 6.283185307179586476925286766559;
  for (size_t k = 0; k < count; k += 2) {
    const double u1 = double((splitmix64(state) >> 11) + 1) * 0x1.0p-53;
    const double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[k] = float(radius * std::cos(two_pi * u2));
    if (k + 1 < count) out[k + 1] = float(radius * std::sin(two_pi * u2));
  }
}

}  // namespace powersgd
}  // namespace ddp
