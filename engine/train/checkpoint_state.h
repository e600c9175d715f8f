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
// On resume the pieces are joined into the whole parameter's state, which
// any layout of ranks and strategy then takes its slices of.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "optimizer.h"

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

// One parameter's state joined from its pieces: `numel` elements, or throws
// Error naming `what` (the parameter) where the pieces do not tile [0,
// numel) exactly. Pure.
std::vector<float> join_pieces(const std::vector<std::pair<size_t, std::vector<float>>>& pieces, size_t numel,
                               const std::string& what);

// The state of every parameter that has some in `meta`, read from the
// checkpoint at `path` and joined; throws Error naming the file and tensor
// that is missing or wrong.
std::map<size_t, SavedState> read_states(const std::string& path, const CheckpointMeta& meta,
                                         const std::vector<Parameter>& params, const Optimizer& optimizer);

}  // namespace ddp
