// reseal.h — a checkpoint edited as a user who knows its format would:
// checkpoint.json changed by `edit`, every file's digest recomputed, and the
// file sealed again (engine/train/checkpoint_files.h), so that what a test
// checks next is the checkpoint's shape or contents, not its checksums.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint_files.h"

namespace ddp::test {

inline void edit_and_reseal(const std::string& checkpoint,
                            const std::function<void(nlohmann::ordered_json&)>& edit = {}) {
  const std::string meta = checkpoint + "/checkpoint.json";
  std::ifstream in(meta, std::ios::binary);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  j.erase("checksum");
  if (edit) edit(j);
  for (auto& [name, f] : j["files"].items()) {
    if (!std::filesystem::is_regular_file(checkpoint + "/" + name)) continue;
    const FileDigest d = file_digest(checkpoint + "/" + name);
    f = {{"bytes", d.bytes}, {"xxh3", d.xxh3}};
  }
  std::ofstream(meta, std::ios::binary | std::ios::trunc) << seal_meta(j.dump(1));
}

}  // namespace ddp::test
