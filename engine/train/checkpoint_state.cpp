// checkpoint_state.cpp — see checkpoint_state.h.
#include "checkpoint_state.h"

#include <algorithm>

#include "checksum.h"
#include "error.h"
#include "safetensors.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

// The suffixes of a parameter's state tensors: first, second.
std::pair<std::string, std::string> state_names(bool adamw) {
  return adamw ? std::make_pair(".exp_avg", ".exp_avg_sq") : std::make_pair(".momentum_buffer", "");
}

std::string state_file(int rank) { return "optimizer-" + std::to_string(rank) + ".safetensors"; }
std::string piece_name(const std::string& tensor, size_t offset) { return tensor + "@" + std::to_string(offset); }

enum Held { kNone = 0, kWhole = 1, kPieces = 2 };
constexpr size_t kPieceWords = 4;  // a piece on the wire: param, offset, count, digest

// This rank's pieces of the parameters no rank holds whole, as (param,
// offset, count, digest) quadruples (48 bits of the XXH3 of the piece's
// moments: exact in a double), padded with -1 to `slots` of them.
std::vector<double> my_pieces(const CheckpointInput& in, const std::vector<int>& whole_writer, size_t slots) {
  std::vector<double> out;
  for (size_t i = 0; i < in.params.size(); ++i) {
    if (whole_writer[i] >= 0) continue;
    for (const SavedState& s : in.optimizer.saved(i)) {
      std::vector<float> both = s.first;
      both.insert(both.end(), s.second.begin(), s.second.end());
      const uint64_t digest = digest_bits(xxh3_hex(both.data(), both.size() * sizeof(float)));
      out.insert(out.end(), {double(i), double(s.offset), double(s.count), double(digest >> 16)});
    }
  }
  out.resize(kPieceWords * slots, -1.0);
  return out;
}

// Adds rank `rank`'s piece `t` (kPieceWords) of its parameter to `layout`:
// a piece that a lower rank holds too (a replica's, HSDP) is written once,
// by that rank, and must hold the same state.
void add_piece(StateLayout& layout, const CheckpointInput& in, int rank, const double* t,
               std::map<std::pair<size_t, size_t>, std::pair<int, double>>& seen) {
  const size_t param = size_t(t[0]);
  const size_t offset = size_t(t[1]);
  const size_t count = size_t(t[2]);
  const auto key = std::make_pair(param, offset);
  const auto first = seen.find(key);
  if (first != seen.end() && size_t(first->second.first) < size_t(rank)) {
    const CheckpointMeta::Piece& kept =
        *std::find_if(layout.pieces[param].begin(), layout.pieces[param].end(),
                      [&](const CheckpointMeta::Piece& p) { return p.offset == offset; });
    if (kept.count == count) {
      if (first->second.second != t[3])
        throw Error("checkpoint: the optimizer state of '" + in.params[param].name + "' elements [" +
                        std::to_string(offset) + ", " + std::to_string(offset + count) + ") differs between rank " +
                        std::to_string(first->second.first) + " and rank " + std::to_string(rank) +
                        ", which both hold it: replicas of a piece must hold the same state",
                    DDP_ERR_INTERNAL);
      return;  // a replica's: written once, by the lower rank
    }
  }
  seen[key] = {rank, t[3]};
  layout.pieces[param].push_back({state_file(rank), offset, count});
}

// Whether `layout` has rank `rank` write its piece [offset, offset +
// count) of parameter `param` (not a lower rank holding the same piece).
bool writes_piece(const StateLayout& layout, size_t param, int rank, size_t offset, size_t count) {
  const auto it = layout.pieces.find(param);
  if (it == layout.pieces.end()) return false;
  for (const CheckpointMeta::Piece& p : it->second)
    if (p.offset == offset && p.count == count) return p.file == state_file(rank);
  return false;
}

// 48 bits of the XXH3 of a parameter's saved state (its moments), exact in
// a double.
double state_digest(const CheckpointInput& in, size_t i) {
  std::vector<float> both;
  for (const SavedState& s : in.optimizer.saved(i)) {
    both.insert(both.end(), s.first.begin(), s.first.end());
    both.insert(both.end(), s.second.begin(), s.second.end());
  }
  return double(digest_bits(xxh3_hex(both.data(), both.size() * sizeof(float))) >> 16);
}

// Where several ranks hold a parameter's whole state (replicas: DDP, or
// HSDP's owners in each group), it is written once, by the lowest: their
// digests must agree, else the checkpoint would keep one of two states.
void check_whole_replicas(const CheckpointInput& in, const std::vector<double>& all, size_t stride) {
  const size_t n = in.params.size();
  for (size_t i = 0; i < n && !in.divergent; ++i) {  // (divergent: each rank writes its own)
    int first = -1;
    for (int r = 0; r < in.world; ++r) {
      const double* w = &all[size_t(r) * stride];
      if (w[i] != kWhole) continue;
      if (first < 0) {
        first = r;
        continue;
      }
      if (w[2 * n + 1 + i] != all[size_t(first) * stride + 2 * n + 1 + i])
        throw Error("checkpoint: the optimizer state of '" + in.params[i].name + "' differs between rank " +
                        std::to_string(first) + " and rank " + std::to_string(r) +
                        ", which both hold it whole: replicas must hold the same state",
                    DDP_ERR_INTERNAL);
    }
  }
}

}  // namespace

StateLayout gather_state_layout(const CheckpointInput& in) {
  const size_t n = in.params.size();
  const size_t stride = 3 * n + 1;  // kinds, steps, pieces, whole states' digests
  std::vector<double> mine(stride, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (!in.optimizer.has_state(i)) continue;
    const bool whole = in.optimizer.whole_state(i, in.params[i].data.numel());
    mine[i] = whole ? kWhole : kPieces;
    mine[n + i] = double(in.optimizer.state_steps(i));
    if (!whole) mine[2 * n] += double(in.optimizer.state_ranges(i).size());
    if (whole && !in.divergent) mine[2 * n + 1 + i] = state_digest(in, i);
  }
  std::vector<double> all(stride * size_t(in.world));
  in.all_gather(mine, all);
  check_whole_replicas(in, all, stride);
  StateLayout layout;
  std::vector<double> whole(n * size_t(in.world));
  size_t slots = 0;
  for (int r = 0; r < in.world; ++r) {
    for (size_t i = 0; i < n; ++i) whole[size_t(r) * n + i] = all[size_t(r) * stride + i] == kWhole ? 1.0 : 0.0;
    slots = std::max(slots, size_t(all[size_t(r) * stride + 2 * n]));
  }
  layout.whole_writer = state_writers(whole, n, in.world);
  layout.steps.assign(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (int r = in.world - 1; r >= 0; --r)  // the writer's, else the lowest piece holder's
      if (all[size_t(r) * stride + i] != kNone && (layout.whole_writer[i] < 0 || layout.whole_writer[i] == r))
        layout.steps[i] = int64_t(all[size_t(r) * stride + n + i]);
  if (slots == 0) return layout;
  const std::vector<double> pieces = my_pieces(in, layout.whole_writer, slots);
  std::vector<double> every(pieces.size() * size_t(in.world));
  in.all_gather(pieces, every);
  std::map<std::pair<size_t, size_t>, std::pair<int, double>> seen;  // (param, offset) → (first rank, digest)
  for (int r = 0; r < in.world; ++r)
    for (size_t k = 0; k < slots; ++k) {
      const double* t = &every[(size_t(r) * slots + k) * kPieceWords];
      if (t[0] >= 0) add_piece(layout, in, r, t, seen);
    }
  for (auto& [i, list] : layout.pieces)
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  return layout;
}

std::string write_state_file(const CheckpointInput& in, const StateLayout& layout, const fs::path& dir) {
  const auto [first, second] = state_names(in.optimizer.is_adamw());
  std::vector<std::vector<float>> values;  // kept alive until written
  std::vector<NamedFloats> tensors;
  bool named = false;  // checkpoint.json names this rank's file (plain SGD: state without tensors)
  const auto add = [&](const std::string& name, Shape shape, std::vector<float>&& v) {
    if (!v.empty()) tensors.push_back({name, std::move(shape), values.emplace_back(std::move(v)).data()});
  };
  for (size_t i = 0; i < in.params.size(); ++i) {
    const Parameter& p = in.params[i];
    // Where the replicas differ, every rank writes its own (the same names).
    const bool writes_whole = layout.whole_writer[i] == in.rank || (in.divergent && layout.whole_writer[i] >= 0);
    if (!writes_whole && (layout.whole_writer[i] >= 0 || !layout.pieces.count(i))) continue;
    bool mine = writes_whole;  // a piece of its own that no lower replica writes
    for (const CheckpointMeta::Piece& p : writes_whole ? std::vector<CheckpointMeta::Piece>() : layout.pieces.at(i))
      mine = mine || p.file == state_file(in.rank);
    if (!mine) continue;
    named = true;
    for (SavedState& s : in.optimizer.saved(i)) {
      if (!writes_whole && !writes_piece(layout, i, in.rank, s.offset, s.count)) continue;  // a lower replica's
      if (writes_whole) {
        add(p.name + first, p.shape, std::move(s.first));
        add(p.name + second, p.shape, std::move(s.second));
      } else {
        add(piece_name(p.name + first, s.offset), Shape{int64_t(s.count)}, std::move(s.first));
        if (!second.empty()) add(piece_name(p.name + second, s.offset), Shape{int64_t(s.count)}, std::move(s.second));
      }
    }
  }
  if (!named) return "";
  const std::string file = state_file(in.rank);
  write_safetensors((dir / file).string(), tensors);
  return file;
}

json state_json(const CheckpointInput& in, const StateLayout& layout) {
  json state = json::object();
  for (size_t i = 0; i < in.params.size(); ++i) {
    const std::string& name = in.params[i].name;
    if (layout.whole_writer[i] >= 0) {
      state[name] = {{"file", state_file(layout.whole_writer[i])}, {"steps", layout.steps[i]}};
    } else if (layout.pieces.count(i)) {
      json pieces = json::array();
      for (const CheckpointMeta::Piece& p : layout.pieces.at(i))
        pieces.push_back({{"file", p.file}, {"offset", p.offset}, {"count", p.count}});
      state[name] = {{"steps", layout.steps[i]}, {"pieces", pieces}};
    }
  }
  return state;
}

void check_pieces(const std::vector<std::pair<size_t, size_t>>& pieces, size_t numel, const std::string& what) {
  size_t next = 0;
  for (const auto& [offset, count] : pieces) {
    if (offset != next || count > numel - offset)
      throw Error(what + ": its pieces of optimizer state do not cover its " + std::to_string(numel) +
                      " elements once each (a piece at " + std::to_string(offset) + " where " + std::to_string(next) +
                      " was next)",
                  DDP_ERR_INVALID_ARGUMENT);
    next = offset + count;
  }
  if (next != numel)
    throw Error(what + ": its pieces of optimizer state end at element " + std::to_string(next) + " of " +
                    std::to_string(numel),
                DDP_ERR_INVALID_ARGUMENT);
}

StateReader::StateReader(const std::string& path, const CheckpointMeta& meta, const std::vector<Parameter>& params,
                         const Optimizer& optimizer)
    : firsts_(optimizer.keeps_state()), seconds_(optimizer.is_adamw()) {
  const auto [first, second] = state_names(optimizer.is_adamw());
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    const auto s = meta.state.find(p.name);
    if (s == meta.state.end()) continue;
    State& state = states_[i];
    state.steps = s->second.steps;
    if (s->second.pieces.empty()) {
      state.parts.push_back(part(path, s->second.file, p.name + first, p.name + second, 0, p.data.numel()));
      if (state.parts.back().count != p.data.numel())
        throw Error("checkpoint: optimizer state of '" + p.name + "' has " + std::to_string(state.parts.back().count) +
                    " elements, the parameter " + std::to_string(p.data.numel()));
      continue;
    }
    std::vector<std::pair<size_t, size_t>> spans;
    for (const CheckpointMeta::Piece& piece : s->second.pieces) {
      state.parts.push_back(part(path, piece.file, piece_name(p.name + first, piece.offset),
                                 piece_name(p.name + second, piece.offset), piece.offset, piece.count));
      spans.emplace_back(piece.offset, state.parts.back().count);
    }
    check_pieces(spans, p.data.numel(), (fs::path(path) / "checkpoint.json").string() + ": '" + p.name + "'");
  }
}

// What checkpoint.json says is there must be: a state taken up without its
// moments would train on from zeros without a word. (What the optimizer
// keeps none of is not looked for.) Checked from the file's header; the
// data is read a slice at a time.
StateReader::Part StateReader::part(const std::string& path, const std::string& file, const std::string& first,
                                    const std::string& second, size_t offset, size_t count) {
  auto& reader = files_[file];
  if (!reader) reader = std::make_unique<SafetensorsReader>((fs::path(path) / file).string());
  Part out{reader.get(), first, second, offset, count};  // the tensors' own count where there are any
  bool counted = false;
  for (const auto& [name, wanted] : {std::pair{first, firsts_}, std::pair{second, seconds_}}) {
    if (!wanted) continue;
    const SafetensorsReader::Entry* e = reader->find_floats(name);
    if (!e)
      throw Error(reader->path() + ": no tensor '" + name + "', which checkpoint.json says holds its state",
                  DDP_ERR_INVALID_ARGUMENT);
    const size_t n = e->bytes / sizeof(float);
    if (counted && n != out.count)
      throw Error(reader->path() + ": tensor '" + name + "' has " + std::to_string(n) + " elements, '" + first + "' " +
                      std::to_string(out.count) + ": the moments of one state differ",
                  DDP_ERR_INVALID_ARGUMENT);
    out.count = n;
    counted = true;
  }
  return out;
}

bool StateReader::read(size_t param, size_t offset, size_t count, SavedState& out) {
  const auto it = states_.find(param);
  if (it == states_.end()) return false;
  out = SavedState{it->second.steps, {}, {}, offset, count};
  if (firsts_) out.first.resize(count);
  if (seconds_) out.second.resize(count);
  for (const Part& p : it->second.parts) {  // the parts [offset, offset + count) overlaps, each in its slice
    const size_t from = std::max(offset, p.offset);
    const size_t to = std::min(offset + count, p.offset + p.count);
    if (from >= to) continue;
    if (firsts_) p.file->read_floats(p.first, from - p.offset, to - from, out.first.data() + (from - offset));
    if (seconds_) p.file->read_floats(p.second, from - p.offset, to - from, out.second.data() + (from - offset));
  }
  return true;
}

}  // namespace ddp
