// checkpoint_files.h — a checkpoint that proves its own integrity
// (docs/checkpoints.md, "Integrity").
//
// checkpoint.json records every other file of the checkpoint by name, size
// and XXH3-64 digest ("files"), and ends with a digest of its own bytes
// before it ("checksum", its last member). A resumed run checks both before
// it reads any tensor, and checks checkpoint.json against its own shape:
// a changed byte anywhere, a file missing or cut short, an edited step
// count, or a path that leads out of the checkpoint is refused, naming the
// file.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "checkpoint.h"
#include "checksum.h"

namespace ddp {

// A name a checkpoint's file has ("weights.safetensors", "optimizer-<r>
// .safetensors", "weights-<r>.safetensors", "strategy-<r>.safetensors",
// "checkpoint.json"), or its temporary while written
// (atomic_file.h: "<name>.tmp.<pid>.<n>"). Pure.
bool checkpoint_file_name(std::string name);

// checkpoint.json's text, as nlohmann's dump() gives it ("{...}"), with its
// digest appended as the last member: `,\n "checksum": "<16 hex>"\n}\n`,
// the digest taken over every byte before it. Pure.
std::string seal_meta(const std::string& text);

// `text` read from `file`, if its checksum holds; else throws Error naming
// the file. Pure.
std::string unseal_meta(const std::string& text, const std::string& file);

// The files one rank wrote into a checkpoint ("" where it wrote none of
// that kind): its optimizer state, its weights (rank 0, or each rank where
// the replicas differ), its strategy's state.
struct RankFiles {
  std::string optimizer;
  std::string weights;
  std::string strategy;
};

// Every rank calls it once its files are written into `dir` (an engine
// collective). Rank 0 gets every file's digest; the other ranks an empty
// map.
std::map<std::string, FileDigest> gather_file_digests(const CheckpointInput& in, const std::filesystem::path& dir,
                                                      const RankFiles& mine);

// checkpoint.json (`file`) read into `meta`, checked against its own shape:
// a known format, files with valid names, the weights among them, every
// state file among them, a loss per step, step counts within the step
// (AdamW's at least 1). Throws Error naming the file and the entry. Pure.
void check_meta_shape(const CheckpointMeta& meta, const std::string& file);

// Every file `meta` records is at `path` with its size and digest; throws
// Error naming the first that is not.
void verify_checkpoint_files(const std::string& path, const CheckpointMeta& meta);

}  // namespace ddp
