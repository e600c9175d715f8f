// checkpoint_fuzz.cpp — a checkpoint directory on arbitrary bytes. With
// the first byte's bit 1 clear: its checkpoint.json
// (engine/train/checkpoint_files.h), read as --resume reads it: its seal,
// its shape, the files it records; with the first byte odd, the rest is
// sealed first (as a user who recomputes the checksum would), so that the
// fuzzer reaches the shape checks behind the seal. With bit 1 set: the
// rest as the entries of checkpoint.dir, one name a line, which rotation
// sorts (it may remove only entries it was given, never the one being
// written, and only step-N ones), and its first line as `latest`, which
// --resume follows (never out of the directory). Anything but a result or
// a ddp::Error fails.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "checkpoint_files.h"
#include "error.h"

namespace {

void entries(const std::string& dir, const std::string& text, int64_t keep) {
  std::vector<std::string> names;
  std::istringstream lines(text);
  for (std::string line; names.size() < 64 && std::getline(lines, line);) names.push_back(line);
  const std::string writing = !names.empty() && ddp::step_of(names[0]) >= 0 ? names[0] : "";
  for (const std::string& removed : ddp::checkpoints_to_remove(names, keep, writing))
    if (std::find(names.begin(), names.end(), removed) == names.end() || removed == writing ||
        ddp::step_of(removed) < 0)
      __builtin_trap();
  std::ofstream(dir + "/latest", std::ios::binary | std::ios::trunc) << (names.empty() ? "" : names[0]);
  try {
    const std::string path = ddp::resolve_checkpoint(dir, "");
    if (std::filesystem::path(path).parent_path() != std::filesystem::path(dir)) __builtin_trap();
  } catch (const ddp::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/ddp-checkpoint-fuzz-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  if (size > 0 && (data[0] & 2)) {
    entries(dir, std::string(reinterpret_cast<const char*>(data) + 1, size - 1), int64_t(data[0] >> 2) % 8);
    return 0;
  }
  std::string text(reinterpret_cast<const char*>(data), size);
  const bool seal = !text.empty() && (text[0] & 1);
  if (!text.empty()) text.erase(0, 1);
  try {
    if (seal) text = ddp::seal_meta(text);
  } catch (const ddp::Error&) {
    return 0;  // not an object with members: nothing to seal
  }
  std::ofstream(dir + "/checkpoint.json", std::ios::binary | std::ios::trunc) << text;
  try {
    const ddp::CheckpointMeta meta = ddp::read_checkpoint_meta(dir);
    ddp::verify_checkpoint_files(dir, meta);
  } catch (const ddp::Error&) {
  }
  return 0;
}
