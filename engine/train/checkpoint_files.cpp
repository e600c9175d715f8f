// checkpoint_files.cpp — see checkpoint_files.h.
#include "checkpoint_files.h"

#include <cstdint>
#include <vector>

#include "error.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSealMarker = ",\n \"checksum\": \"";
constexpr const char* kSealEnd = "\"\n}\n";
constexpr size_t kHexDigits = 16;

Error bad(const std::string& file, const std::string& why) {
  return Error(file + ": " + why, DDP_ERR_INVALID_ARGUMENT);
}

bool is_hex(const std::string& s) {
  return s.size() == kHexDigits && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

// A 64-bit number as two doubles (each half is exact), and back.
void push_u64(std::vector<double>& out, uint64_t v) {
  out.push_back(double(v >> 32));
  out.push_back(double(v & 0xffffffffu));
}
uint64_t u64_at(const std::vector<double>& v, size_t i) { return (uint64_t(v[i]) << 32) | uint64_t(v[i + 1]); }

}  // namespace

bool checkpoint_file_name(std::string name) {
  if (const size_t tmp = name.find(".tmp."); tmp != std::string::npos) name.resize(tmp);
  if (name == "checkpoint.json" || name == "weights.safetensors") return true;
  const std::string suffix = ".safetensors";
  for (const std::string prefix : {"optimizer-", "weights-", "strategy-"}) {
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string rank = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    return rank.size() <= 9 && rank.find_first_not_of("0123456789") == std::string::npos;
  }
  return false;
}

std::string seal_meta(const std::string& text) {
  const size_t open = text.find_first_not_of(" \n");
  const size_t close = text.find_last_not_of(" \n");
  const size_t last = close == std::string::npos || close == 0 ? open : text.find_last_not_of(" \n", close - 1);
  if (open == std::string::npos || text[open] != '{' || text[close] != '}' || last == open)
    throw Error("checkpoint metadata to seal is not a JSON object with members", DDP_ERR_INTERNAL);
  std::string out = text.substr(0, last + 1) + kSealMarker;
  return out + xxh3_hex(out.data(), out.size()) + kSealEnd;
}

std::string unseal_meta(const std::string& text, const std::string& file) {
  const std::string marker = kSealMarker;
  const size_t at = text.rfind(marker);
  if (at == std::string::npos)
    throw bad(file,
              "no checksum at its end: cut short, edited, or written by a ddp before checksums "
              "(format \"ddp-checkpoint 2\")");
  const size_t digits = at + marker.size();
  if (text.size() != digits + kHexDigits + std::string(kSealEnd).size() ||
      text.compare(digits + kHexDigits, std::string::npos, kSealEnd) != 0)
    throw bad(file, "changed after it was written (something follows its checksum)");
  const std::string recorded = text.substr(digits, kHexDigits);
  const std::string actual = xxh3_hex(text.data(), digits);
  if (recorded != actual)
    throw bad(file,
              "changed after it was written (its checksum says " + recorded + ", its contents hash to " + actual + ")");
  return text;
}

std::map<std::string, FileDigest> gather_file_digests(const CheckpointInput& in, const fs::path& dir,
                                                      const RankFiles& mine) {
  // Per rank, per kind: whether it wrote one, its size and digest.
  const std::string RankFiles::*kinds[] = {&RankFiles::optimizer, &RankFiles::weights, &RankFiles::strategy};
  std::vector<double> words;
  for (const auto kind : kinds) {
    const std::string& name = mine.*kind;
    const FileDigest digest = name.empty() ? FileDigest{} : file_digest((dir / name).string());
    words.push_back(name.empty() ? 0.0 : 1.0);
    push_u64(words, digest.bytes);
    push_u64(words, digest_bits(digest.xxh3));
  }
  std::vector<double> all(words.size() * size_t(in.world));
  in.all_gather(words, all);
  std::map<std::string, FileDigest> files;
  if (in.rank != 0) return files;
  const size_t per_kind = words.size() / 3;
  for (int r = 0; r < in.world; ++r)
    for (size_t k = 0; k < 3; ++k) {
      const size_t at = words.size() * size_t(r) + per_kind * k;
      if (all[at] == 0.0) continue;
      const std::string name = k == 0   ? "optimizer-" + std::to_string(r) + ".safetensors"
                               : k == 1 ? weights_file(r, in.divergent)
                                        : strategy_state_file(r);
      files[name] = FileDigest{u64_at(all, at + 1), digest_hex(u64_at(all, at + 3))};
    }
  return files;
}

void check_meta_shape(const CheckpointMeta& meta, const std::string& file) {
  if (meta.format != "ddp-checkpoint 2" && meta.format != "ddp-checkpoint 3")
    throw bad(file, "format \"" + meta.format + "\" is not \"ddp-checkpoint 2\" or 3, those this ddp reads");
  if (meta.step < 0) throw bad(file, "step " + std::to_string(meta.step) + " is negative");
  if (meta.world_size < 1) throw bad(file, "world_size " + std::to_string(meta.world_size) + " is below 1");
  if (meta.world_size > kMaxWorldSize)
    throw bad(file, "world_size is more than " + std::to_string(kMaxWorldSize) + " ranks (config.h's kMaxWorldSize)");
  const auto named = meta.config.find("optimizer.name");
  if (named != meta.config.end() && named->second != meta.optimizer)
    throw bad(file,
              "optimizer \"" + meta.optimizer + "\" is not its config's optimizer.name \"" + named->second + "\"");
  if (meta.losses.size() != size_t(meta.step))
    throw bad(file, std::to_string(meta.losses.size()) + " losses for " + std::to_string(meta.step) + " steps");
  for (const auto& [name, digest] : meta.files)
    if (!checkpoint_file_name(name) || name.find(".tmp.") != std::string::npos || name == "checkpoint.json" ||
        !is_hex(digest.xxh3))
      throw bad(file, "files: \"" + name + "\" is not a checkpoint file with a 16-digit xxh3");
  if (!meta.files.count("weights.safetensors")) throw bad(file, "files: no weights.safetensors");
  if ((meta.format == "ddp-checkpoint 3") != meta.divergent)
    throw bad(file, std::string(meta.divergent ? "divergent in format 2" : "format 3 without \"divergent\": true"));
  for (int r = 1; meta.divergent && r < meta.world_size; ++r)
    if (!meta.files.count(weights_file(r, true)))
      throw bad(file, "files: no " + weights_file(r, true) + ", rank " + std::to_string(r) + "'s replica");
  const auto listed = [&](const std::string& state_file, const std::string& param) {
    if (!meta.files.count(state_file))
      throw bad(file, "state of '" + param + "': file \"" + state_file + "\" is not among its files");
  };
  for (const auto& [param, state] : meta.state) {
    if (state.pieces.empty()) listed(state.file, param);
    for (const CheckpointMeta::Piece& piece : state.pieces) listed(piece.file, param);
    // (AdamW's count starts at 1 with its state, but for state made at a
    // step loss scaling skipped: 0.)
    const bool adamw = meta.optimizer == "adamw" && !meta.loss_scale;
    if (state.steps > meta.step || state.steps < (adamw ? 1 : 0))
      throw bad(file, "state of '" + param + "': " + std::to_string(state.steps) + " steps, outside [" +
                          (adamw ? "1" : "0") + ", " + std::to_string(meta.step) + "] at step " +
                          std::to_string(meta.step));
  }
}

void verify_checkpoint_files(const std::string& path, const CheckpointMeta& meta) {
  for (const auto& [name, want] : meta.files) {
    const std::string file = (fs::path(path) / name).string();
    std::error_code ec;
    if (fs::is_symlink(file, ec) || !fs::is_regular_file(file, ec))
      throw bad(file, "missing, or not a regular file (checkpoint.json records it)");
    const FileDigest got = file_digest(file);
    if (got.bytes != want.bytes)
      throw bad(file, std::to_string(got.bytes) + " bytes, but checkpoint.json records " + std::to_string(want.bytes) +
                          ": cut short or changed after it was written");
    if (got.xxh3 != want.xxh3)
      throw bad(file, "changed after it was written (checkpoint.json records xxh3 " + want.xxh3 +
                          ", its contents hash to " + got.xxh3 + ")");
  }
}

}  // namespace ddp
