// checkpoint_integrity_test.cpp — a checkpoint proves its own integrity
// (engine/train/checkpoint_files.h):
//  - every single changed byte of every file of a checkpoint, tried one at a
//    time, is refused naming that file; through `--resume`, one byte of
//    each file;
//  - checkpoint.json edited and resealed (as a user who recomputes the
//    checksums would) is checked against its own shape: step counts, losses,
//    state files that are not its files, paths that leave the checkpoint;
//  - the pure parts: sealing and unsealing, file names.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "checkpoint_files.h"
#include "harness.h"
#include "reseal.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using harness::RunResult;

const std::string kFixtures = std::string(DDP_TEST_DATA_DIR) + "/fixtures/";

// Four steps of the toy model with AdamW under ZeRO-2 on two ranks: state in
// pieces, in optimizer-0 and optimizer-1.
std::string toml() {
  return "[run]\nsteps = 4\nseed = 7\ntimeout_s = 30\n"
         "[model]\nname = \"toy\"\ninit_from = \"" + kFixtures + "toy_init.safetensors\"\n"
         "[data]\npath = \"" + kFixtures + "toy_data.safetensors\"\nbatch_size = 20\n"
         "[optimizer]\nname = \"adamw\"\nlr = 0.05\nweight_decay = 0.1\n"
         "[transport]\nplugin = \"gloo\"\n[strategy]\nplugin = \"sharded\"\nstage = 2\nbucket_mb = 0.0001\n";
}

// A directory for one test's checkpoints, removed at the end.
struct TempDir : harness::TempDir {
  TempDir() : harness::TempDir("ddp-integrity-test") {}
};

std::vector<std::string> checkpointing(const std::string& dir) {
  return {"checkpoint.every=2", "checkpoint.keep=5", "checkpoint.dir=\"" + dir + "\""};
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// What --resume checks before it reads a tensor.
std::string refusal(const std::string& checkpoint) {
  try {
    verify_checkpoint_files(checkpoint, read_checkpoint_meta(checkpoint));
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

class Integrity : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    const RunResult r = harness::run(toml(), 2, checkpointing(dir_->path));
    for (const auto& f : r.failures) ADD_FAILURE() << f;
  }
  static void TearDownTestSuite() { delete dir_; }
  // A fresh copy of the step-2 checkpoint in its own checkpoint.dir.
  std::string copy(const std::string& name) {
    const std::string to = dir_->path + "/" + name;
    fs::remove_all(to);
    fs::create_directories(to);
    fs::copy(dir_->path + "/step-00000002", to + "/step-00000002");
    return to + "/step-00000002";
  }
  static TempDir* dir_;
};
TempDir* Integrity::dir_ = nullptr;

TEST_F(Integrity, EveryFileIsRecordedAndTheCheckpointVerifies) {
  const std::string c = copy("whole");
  const CheckpointMeta meta = read_checkpoint_meta(c);
  std::vector<std::string> names;
  for (const auto& [name, d] : meta.files) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"optimizer-0.safetensors", "optimizer-1.safetensors",
                                             "weights.safetensors"}));
  EXPECT_EQ(refusal(c), "");
  for (const auto& [name, d] : meta.files) EXPECT_EQ(d.bytes, fs::file_size(c + "/" + name)) << name;
}

// Every byte of every file, one at a time (one bit of the even bytes, all
// eight of the odd ones): each changed byte is refused, naming its file.
TEST_F(Integrity, EveryChangedByteOfEveryFileIsRefusedNamingTheFile) {
  const std::string c = copy("flips");
  for (const auto& entry : fs::directory_iterator(c)) {
    const std::string file = entry.path().string(), original = read_all(file);
    ASSERT_FALSE(original.empty()) << file;
    for (size_t at = 0; at < original.size(); ++at) {
      std::string flipped = original;
      flipped[at] = char(flipped[at] ^ (at % 2 ? 0xff : 0x01));  // one bit, or all eight
      write_all(file, flipped);
      const std::string why = refusal(c);
      ASSERT_EQ(why.rfind(file + ": ", 0), 0u) << "byte " << at << " of " << file << ": " << why;
    }
    write_all(file, original);
    ASSERT_EQ(refusal(c), "") << file;
  }
}

// Through the engine: --resume refuses on every rank, naming the file.
TEST_F(Integrity, ResumeRefusesAChangedByteInAnyFile) {
  for (const std::string name :
       {"weights.safetensors", "optimizer-0.safetensors", "optimizer-1.safetensors", "checkpoint.json"}) {
    const std::string c = copy("resume-" + name), file = c + "/" + name;
    std::string bytes = read_all(file);
    bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 0x20);
    write_all(file, bytes);
    const RunResult r = harness::run(toml(), 2, checkpointing(fs::path(c).parent_path().string()), c);
    ASSERT_EQ(r.failures.size(), 2u) << name;
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(r.failures[size_t(rank)].rfind("rank " + std::to_string(rank) + ": " + file + ": ", 0), 0u)
          << r.failures[size_t(rank)];
  }
}

TEST_F(Integrity, AFileCutShortOrMissingIsNamed) {
  const std::string c = copy("short"), file = c + "/optimizer-1.safetensors";
  const std::string bytes = read_all(file);
  write_all(file, bytes.substr(0, bytes.size() - 1));
  EXPECT_EQ(refusal(c), file + ": " + std::to_string(bytes.size() - 1) + " bytes, but checkpoint.json records " +
                            std::to_string(bytes.size()) + ": cut short or changed after it was written");
  fs::remove(file);
  EXPECT_EQ(refusal(c), file + ": missing, or not a regular file (checkpoint.json records it)");
}

// No file is read from outside the checkpoint: a symbolic link is refused,
// whether to a recorded file or to checkpoint.json itself (a whole
// checkpoint's, elsewhere).
TEST_F(Integrity, ASymbolicLinkIsRefusedForAnyFile) {
  const std::string c = copy("links"), elsewhere = copy("elsewhere");
  for (const std::string name : {"weights.safetensors", "checkpoint.json"}) {
    const std::string file = c + "/" + name;
    fs::remove(file);
    fs::create_symlink(elsewhere + "/" + name, file);
    EXPECT_EQ(refusal(c), file + (name == "checkpoint.json"
                                      ? ": a symbolic link, not the checkpoint's own file"
                                      : ": missing, or not a regular file (checkpoint.json records it)"));
    fs::remove(file);
    fs::copy_file(elsewhere + "/" + name, file);
    EXPECT_EQ(refusal(c), "") << name;
  }
}

// Resealed edits: the checksums hold, the shape does not.
TEST_F(Integrity, ResealedEditsAreCheckedAgainstTheCheckpointsShape) {
  const std::string c = copy("edits"), meta = c + "/checkpoint.json";
  const auto refused_after = [&](const std::function<void(nlohmann::ordered_json&)>& edit) {
    const std::string saved = read_all(meta);
    test::edit_and_reseal(c, edit);
    const std::string why = refusal(c);
    write_all(meta, saved);
    return why;
  };
  EXPECT_EQ(refused_after([](auto&) {}), "");
  EXPECT_EQ(refused_after([](auto& j) { j["state"]["fc1.weight"]["steps"] = 400; }),
            meta + ": state of 'fc1.weight': 400 steps, outside [1, 2] at step 2");
  EXPECT_EQ(refused_after([](auto& j) { j["state"]["fc1.weight"]["steps"] = 0; }),
            meta + ": state of 'fc1.weight': 0 steps, outside [1, 2] at step 2");
  EXPECT_EQ(refused_after([](auto& j) { j["step"] = 3; }), meta + ": 2 losses for 3 steps");
  EXPECT_EQ(refused_after([](auto& j) { j["world_size"] = int64_t{1} << 62; }),
            meta + ": world_size is more than 1048576 ranks (config.h's kMaxWorldSize)")
      << "a world size past any run's, refused before anything loops over its ranks";
  EXPECT_EQ(refused_after([](auto& j) { j["state"]["fc1.weight"]["pieces"][0]["file"] =
                                            "../../elsewhere/optimizer-1.safetensors"; }),
            meta + ": state of 'fc1.weight': file \"../../elsewhere/optimizer-1.safetensors\" is not among its files");
  EXPECT_EQ(refused_after([](auto& j) { j["files"]["../optimizer-7.safetensors"] = j["files"]["weights.safetensors"]; }),
            meta + ": files: \"../optimizer-7.safetensors\" is not a checkpoint file with a 16-digit xxh3");
  EXPECT_EQ(refused_after([](auto& j) { j["files"].erase("weights.safetensors"); }),
            meta + ": files: no weights.safetensors");
  EXPECT_EQ(refused_after([](auto& j) { j["format"] = "ddp-checkpoint 1"; }),
            meta + ": format \"ddp-checkpoint 1\" is not \"ddp-checkpoint 2\" or 3, those this ddp reads");
  EXPECT_EQ(refused_after([](auto& j) { j.erase("losses"); }).rfind(meta + ": not a checkpoint's metadata (", 0), 0u);
  // The optimizer named twice must agree (AdamW's moments read as SGD's).
  EXPECT_EQ(refused_after([](auto& j) {
              j["optimizer"] = "sgd";
              for (auto& [name, state] : j["state"].items()) state["steps"] = 0;
            }),
            meta + ": optimizer \"sgd\" is not its config's optimizer.name \"adamw\"");
  // Numbers that are not whole, or out of range, are named, never truncated or wrapped.
  const auto not_whole = [&](const std::function<void(nlohmann::ordered_json&)>& edit, const std::string& what) {
    const std::string why = refused_after(edit);
    EXPECT_EQ(why.rfind(meta + ": not a checkpoint's metadata (", 0), 0u) << why;
    EXPECT_NE(why.find(what), std::string::npos) << why;
  };
  not_whole([](auto& j) { j["state"]["fc1.weight"]["steps"] = 1.9; }, "'steps' is 1.9, not a whole number");
  not_whole([](auto& j) { j["step"] = 1e30; }, "'step' is 1e+30, not a whole number");
  not_whole([](auto& j) { j["step"] = 18446744073709551615ull; }, "'step' is 18446744073709551615, not");
  not_whole([](auto& j) { j["state"]["fc1.weight"]["pieces"][0]["offset"] = -1; }, "'offset' is -1, not");
}

TEST(SealMeta, TheDigestCoversEveryByteBeforeIt) {
  const std::string sealed = seal_meta("{\n \"step\": 2\n}");
  EXPECT_EQ(sealed.rfind("{\n \"step\": 2,\n \"checksum\": \"", 0), 0u) << sealed;
  EXPECT_EQ(sealed.substr(sealed.size() - 4), "\"\n}\n");
  EXPECT_EQ(nlohmann::json::parse(sealed)["step"], 2);
  EXPECT_EQ(unseal_meta(sealed, "m"), sealed);
  EXPECT_EQ(seal_meta("{\n \"step\": 2\n}\n"), sealed) << "a trailing newline is not part of the object";
  EXPECT_THROW(seal_meta("{}"), Error);
  try {
    unseal_meta("{\n \"step\": 2\n}\n", "m");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "m: no checksum at its end: cut short, edited, or written by a ddp before "
                                     "checksums (format \"ddp-checkpoint 2\")");
  }
  try {
    unseal_meta(sealed + " ", "m");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "m: changed after it was written (something follows its checksum)");
  }
}

TEST(Checksum, DigestsAreSixteenHexDigitsBothWays) {
  EXPECT_EQ(digest_hex(0), "0000000000000000");
  EXPECT_EQ(digest_hex(0xfedcba9876543210ull), "fedcba9876543210");
  EXPECT_EQ(digest_bits("fedcba9876543210"), 0xfedcba9876543210ull);
  EXPECT_EQ(digest_bits(""), 0u);
  EXPECT_EQ(xxh3_hex("abc", 3), "78af5f94892f3950") << "the XXH3-64 Python's xxhash gives";
}

TEST(CheckpointFileName, OnlyTheFilesACheckpointWrites) {
  for (const char* ok : {"checkpoint.json", "weights.safetensors", "optimizer-0.safetensors",
                         "optimizer-12.safetensors", "weights.safetensors.tmp.12.3"})
    EXPECT_TRUE(checkpoint_file_name(ok)) << ok;
  for (const char* no : {"", "notes.txt", "optimizer-.safetensors", "optimizer-a.safetensors", "../weights.safetensors",
                         "optimizer-1/../../x.safetensors", "optimizer-1234567890.safetensors"})
    EXPECT_FALSE(checkpoint_file_name(no)) << no;
}

}  // namespace
}  // namespace ddp
