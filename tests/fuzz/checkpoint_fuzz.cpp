// checkpoint_fuzz.cpp — a checkpoint directory's checkpoint.json
// (engine/train/checkpoint_files.h) on arbitrary bytes, read as --resume
// reads it: its seal, its shape, the files it records. With the first
// byte odd, the rest is sealed first (as a user who recomputes the
// checksum would), so that the fuzzer reaches the shape checks behind the
// seal. Anything but a result or a ddp::Error fails.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint.h"
#include "checkpoint_files.h"
#include "error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = "/tmp/ddp-checkpoint-fuzz-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
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
