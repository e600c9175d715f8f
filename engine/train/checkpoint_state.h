// checkpoint_state.h — the optimizer state in a checkpoint (checkpoint.h):
// which rank writes which parameter's state, the optimizer-<r> files, their
// entries in checkpoint.json, and the state taken back on resume.
//
// A parameter's state is held whole (every strategy but sharded stage 2:
// the lowest rank holding it writes it, under "<name>.exp_avg", ...), or in
// pieces, element ranges on the ranks that step them (stage 2): each rank
// writes its pieces, under "<name>.exp_avg@<offset>" of shape [count], and
// checkpoint.json lists them:
//   "state": {"<name>": {"file": "optimizer-0.safetensors", "steps": 3}, ...
//             "<name>": {"steps": 3, "pieces": [{"file": ..., "offset": 0,
//                                                "count": 96}, ...]}}
// On resume any layout of ranks and strategy takes its slices of them,
// each rank reading only the slices it steps (StateReader).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "optimizer.h"
#include "safetensors.h"

namespace ddp {

// Who writes what, the same on every rank (it is gathered).
struct StateLayout {
  std::vector<int> whole_writer;  // per parameter: the rank that writes it whole, -1 if none does
  std::vector<int64_t> steps;     // per parameter: AdamW's step count
  // Per parameter held in pieces: every rank's pieces, by offset.
  std::map<size_t, std::vector<CheckpointMeta::Piece>> pieces;
};

// Gathers every rank's state (engine collectives: every rank calls it).
StateLayout gather_state_layout(const CheckpointInput& in);
// This rank's part of the state: whole states it writes, and its pieces.
// Writes nothing and returns "" where checkpoint.json names no state of
// this rank's (a file without tensors where it names state that has none:
// plain SGD's).
std::string write_state_file(const CheckpointInput& in, const StateLayout& layout, const std::filesystem::path& dir);
// checkpoint.json's "state".
nlohmann::ordered_json state_json(const CheckpointInput& in, const StateLayout& layout);

// Throws Error naming `what` (a parameter of `numel` elements) unless its
// pieces of state, (offset, count) by offset, tile [0, numel) exactly.
// Pure.
void check_pieces(const std::vector<std::pair<size_t, size_t>>& pieces, size_t numel, const std::string& what);

// The optimizer state of the checkpoint at `path`, read a slice at a time:
// the slices the ranges a rank steps take up at their first step
// (Optimizer::restore_on_first_step), so a rank of `sharded` reads its
// shard and nothing else, whatever layout wrote the checkpoint. Opening
// checks every parameter that has state in `meta` against the files'
// headers: each tensor there, float32, whole of the parameter's size or in
// pieces that tile it (check_pieces); throws Error naming the file and
// tensor that is missing or wrong.
class StateReader {
 public:
  StateReader(const std::string& path, const CheckpointMeta& meta, const std::vector<Parameter>& params,
              const Optimizer& optimizer);
  bool has(size_t param) const { return states_.count(param) != 0; }
  // Elements [offset, offset + count) of params[param]'s state into `out`
  // (its steps, moments and range); false where the checkpoint holds none.
  bool read(size_t param, size_t offset, size_t count, SavedState& out);

 private:
  struct Part {  // a whole state, or a piece: both its moments' tensors, in one file
    SafetensorsReader* file;
    std::string first;
    std::string second;
    size_t offset;
    size_t count;
  };
  struct State {
    int64_t steps = 0;
    std::vector<Part> parts;  // by offset
  };
  Part part(const std::string& path, const std::string& file, const std::string& first, const std::string& second,
            size_t offset, size_t count);
  bool firsts_;  // which moments the optimizer keeps
  bool seconds_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> files_;
  std::map<size_t, State> states_;
};

}  // namespace ddp
