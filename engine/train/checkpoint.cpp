// checkpoint.cpp — see checkpoint.h.
#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "agreement.h"
#include "atomic_file.h"
#include "checkpoint_files.h"
#include "checkpoint_state.h"
#include "error.h"
#include "model_setup.h"
#include "safetensors.h"
#include "whole_model.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr const char* kMeta = "checkpoint.json";
constexpr const char* kPartial = ".partial";

// Runs `f`; its failure as text ("" if none).
template <typename F>
std::string attempt(F&& f) {
  try {
    f();
    return "";
  } catch (const std::exception& e) {
    return words_of(e);
  }
}

// The directory's entries are on disk (a rename is durable once its
// directory is synced).
void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

json meta_json(const CheckpointInput& in, int64_t step, const StateLayout& layout,
               const std::map<std::string, FileDigest>& digests) {
  const json state = state_json(in, layout);
  json trainable = json::array();
  json files = json::object();
  for (const Parameter& p : in.params)
    if (p.trainable) trainable.push_back(p.name);
  for (const auto& [name, d] : digests) files[name] = {{"bytes", d.bytes}, {"xxh3", d.xxh3}};
  json meta = {
      {"format", in.divergent ? "ddp-checkpoint 3" : "ddp-checkpoint 2"}, {"step", step}, {"world_size", in.world}};
  if (in.divergent) meta["divergent"] = true;  // each rank's own files: an older ddp refuses format 3
  meta.update(json{{"strategy", in.strategy},
                   {"transport", in.transport},
                   {"optimizer", in.config.optimizer.name},
                   {"trainable", trainable},
                   {"losses", in.losses},
                   {"state", state},
                   {"config", json(in.config_items)},
                   {"files", files}});
  meta["due"] = {{"eval", in.eval_due}, {"replica_check", in.check_due}};
  json val = json::array();
  for (const auto& [at, loss] : in.val_losses) val.push_back({at, loss});
  meta["val_loss"] = val;
  if (in.loss_scale) meta["loss_scale"] = loss_scale_json(*in.loss_scale);
  return meta;
}

// Rank 0, once every rank's files are in `partial`: the metadata, then the
// rename, then `latest`, then the old checkpoints go.
void complete(const CheckpointInput& in, int64_t step, const json& meta, const fs::path& partial) {
  const fs::path dir = in.config.checkpoint.dir;
  const std::string name = checkpoint_name(step);
  write_file_atomically((partial / kMeta).string(), seal_meta(meta.dump(1)));
  sync_directory(partial);
  const fs::path final_path = dir / name;
  const fs::path replaced = dir / (name + ".replaced");
  if (fs::exists(final_path)) {  // a run resumed from before it comes past it again
    fs::remove_all(replaced);
    fs::rename(final_path, replaced);
  }
  fs::rename(partial, final_path);
  sync_directory(dir);
  write_file_atomically((dir / "latest").string(), name + "\n");
  sync_directory(dir);
  std::error_code ignored;
  for (const std::string& old : checkpoints_to_remove(checkpoint_entries(dir), in.config.checkpoint.keep, name))
    fs::remove_all(dir / old, ignored);
}

// Throws on every rank if any rank failed: the first failing rank's words
// where it is this rank, else its number.
void all_or_none(const CheckpointInput& in, const std::string& failure, const std::string& what) {
  std::vector<double> all(size_t(in.world));
  in.all_gather({failure.empty() ? 1.0 : 0.0}, all);
  for (int r = 0; r < in.world; ++r) {
    if (all[size_t(r)] != 0.0) continue;
    // A checkpoint.dir that cannot take the files would refuse them again:
    // not worth a restart. A peer's failure is the echo (a lost peer's kind).
    if (r == in.rank) throw Error("checkpoint: " + failure, DDP_ERR_INVALID_ARGUMENT);
    throw Error("checkpoint: rank " + std::to_string(r) + " could not " + what + " (its own report says why)",
                DDP_ERR_COMM);
  }
}

// A divergent checkpoint's optimizer state, as rank `rank` reads it: its
// own optimizer-<r>, holding every state whole.
void own_state_files(CheckpointMeta& meta, int rank, const std::string& path) {
  const std::string own = "optimizer-" + std::to_string(rank) + ".safetensors";
  for (auto& [name, state] : meta.state) {
    if (!meta.files.count(own) || !state.pieces.empty())
      throw Error((fs::path(path) / kMeta).string() + ": divergent, but the state of '" + name + "' is not whole in " +
                      own + ", rank " + std::to_string(rank) + "'s own",
                  DDP_ERR_INVALID_ARGUMENT);
    state.file = own;
  }
}

// `meta` with only the files rank `rank` reads: every rank's weights and
// strategy state but its own left out, and, where each rank holds its own
// optimizer state (divergent), the others' too.
CheckpointMeta files_read_by(const CheckpointMeta& meta, int rank) {
  CheckpointMeta mine = meta;
  for (int r = 0; r < meta.world_size; ++r) {
    if (r == rank) continue;
    if (r != 0) mine.files.erase(strategy_state_file(r));  // rank 0's holds the state equal everywhere (1.9)
    if (!meta.divergent) continue;  // every rank reads weights.safetensors, and any optimizer slice
    mine.files.erase(weights_file(r, true));
    mine.files.erase("optimizer-" + std::to_string(r) + ".safetensors");
  }
  if (rank != 0 && meta.divergent) mine.files.erase("weights.safetensors");
  return mine;
}

}  // namespace

int64_t step_of(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return -1;
  const std::string digits =
      name.substr(5, name.find('.') == std::string::npos ? std::string::npos : name.find('.') - 5);
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);  // < 10^18: no overflow
}

std::string weights_file(int rank, bool divergent) {
  return rank == 0 || !divergent ? "weights.safetensors" : "weights-" + std::to_string(rank) + ".safetensors";
}
std::string strategy_state_file(int rank) { return "strategy-" + std::to_string(rank) + ".safetensors"; }

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string latest_name(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  std::string name;
  std::getline(in, name);
  return name;
}

std::string resolve_checkpoint(const std::string& dir, const std::string& given) {
  if (!given.empty() && given != "latest") {
    if (fs::is_regular_file(fs::path(given) / kMeta)) return given;
    if (fs::exists(fs::path(given) / "latest")) return resolve_checkpoint(given, "");
    throw Error(given + ": not a checkpoint (no " + kMeta + " in it, and no 'latest')", DDP_ERR_INVALID_ARGUMENT);
  }
  const fs::path latest = fs::path(dir) / "latest";
  if (!fs::exists(latest))
    throw Error(dir + ": no checkpoint to resume from (no 'latest' in checkpoint.dir)", DDP_ERR_INVALID_ARGUMENT);
  if (fs::is_directory(latest))
    throw Error(latest.string() +
                    " is a directory, where a file naming the latest checkpoint (step-N) belongs: "
                    "remove it, or give --resume a checkpoint's path",
                DDP_ERR_INVALID_ARGUMENT);
  const std::string name = latest_name(dir);
  if (name.empty())
    throw Error(latest.string() + " is empty: give --resume a checkpoint's path", DDP_ERR_INVALID_ARGUMENT);
  if (step_of(name) < 0 || name.find_first_of("/.") != std::string::npos)  // no path leaves the directory
    throw Error(latest.string() + " names '" + name + "', which is not a checkpoint of this directory (step-N)",
                DDP_ERR_INVALID_ARGUMENT);
  const fs::path path = fs::path(dir) / name;
  if (!fs::is_regular_file(path / kMeta))
    throw Error(latest.string() + " names " + name + ", which is not a whole checkpoint" +
                    (fs::exists(fs::path(dir) / (name + ".replaced")) ? " (" + name + ".replaced holds it)" : ""),
                DDP_ERR_INVALID_ARGUMENT);
  return path.string();
}

namespace {

// A whole number of checkpoint.json, in range: nlohmann's get<> would
// truncate 1.9 and wrap 1e30 or -1 without a word.
int64_t whole(const json& j, const char* key, int64_t least) {
  const json& v = j.at(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < least)
    throw json::other_error::create(
        501, std::string("'") + key + "' is " + v.dump() + ", not a whole number of at least " + std::to_string(least),
        &v);
  return v.get<int64_t>();
}

}  // namespace

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  const std::string file = (fs::path(path) / kMeta).string();
  std::error_code ec;
  if (fs::is_symlink(file, ec))  // as every file it records: nothing is read from outside the checkpoint
    throw Error(file + ": a symbolic link, not the checkpoint's own file", DDP_ERR_INVALID_ARGUMENT);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(file + ": cannot read", DDP_ERR_INVALID_ARGUMENT);
  const std::string text = unseal_meta(std::string(std::istreambuf_iterator<char>(in), {}), file);
  CheckpointMeta m;
  try {
    const json j = json::parse(text);
    m.format = j.at("format").get<std::string>();
    m.step = whole(j, "step", 0);
    m.world_size = int(std::min<int64_t>(whole(j, "world_size", 1), kMaxWorldSize + 1));  // past it: refused
    m.divergent = j.contains("divergent") && j.at("divergent").get<bool>();
    m.strategy = j.at("strategy").get<std::string>();
    m.transport = j.at("transport").get<std::string>();
    m.optimizer = j.at("optimizer").get<std::string>();
    m.config = j.at("config").get<std::map<std::string, std::string>>();
    m.trainable = j.at("trainable").get<std::vector<std::string>>();
    for (const json& l : j.at("losses")) m.losses.push_back(l.is_null() ? NAN : l.get<double>());  // null: NaN, inf
    if (j.contains("due")) {  // (absent before [eval] and divergent strategies)
      m.eval_due = j.at("due").at("eval").get<bool>();
      m.check_due = j.at("due").at("replica_check").get<bool>();
    }
    if (j.contains("val_loss"))
      for (const auto& v : j.at("val_loss")) {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || v[0].get<int64_t>() < 1 ||
            v[0].get<int64_t>() > m.step || !(v[1].is_number() || v[1].is_null()))
          throw json::other_error::create(501, "'val_loss' holds " + v.dump() + ", not [a step, its loss]", &v);
        m.val_losses.emplace_back(v[0].get<int64_t>(), v[1].is_null() ? NAN : v[1].get<double>());  // null: NaN
      }
    if (j.contains("loss_scale")) m.loss_scale = loss_scale_of(j.at("loss_scale"));
    for (const auto& [name, s] : j.at("state").items()) {
      CheckpointMeta::State& state = m.state[name];
      state.steps = whole(s, "steps", 0);
      if (!s.contains("pieces")) {
        state.file = s.at("file").get<std::string>();
        continue;
      }
      for (const auto& p : s.at("pieces"))
        state.pieces.push_back(
            {p.at("file").get<std::string>(), size_t(whole(p, "offset", 0)), size_t(whole(p, "count", 1))});
    }
    for (const auto& [name, f] : j.at("files").items())
      m.files[name] = FileDigest{f.at("bytes").get<uint64_t>(), f.at("xxh3").get<std::string>()};
  } catch (const json::exception& e) {
    throw Error(file + ": not a checkpoint's metadata (" + e.what() + ")", DDP_ERR_INVALID_ARGUMENT);
  }
  check_meta_shape(m, file);
  return m;
}

std::vector<int> state_writers(const std::vector<double>& held, size_t params, int world) {
  std::vector<int> writers(params, -1);
  for (size_t i = 0; i < params; ++i)
    for (int r = 0; r < world && writers[i] < 0; ++r)
      if (held[size_t(r) * params + i] != 0.0) writers[i] = r;
  return writers;
}

std::vector<std::string> checkpoints_to_remove(const std::vector<std::string>& names, int64_t keep,
                                               const std::string& writing) {
  std::vector<std::pair<int64_t, std::string>> whole;
  std::vector<std::string> out;
  for (const std::string& name : names) {
    const int64_t step = step_of(name);
    if (step < 0 || name == writing) continue;
    const bool partial = name.size() > 8 && name.compare(name.size() - 8, 8, kPartial) == 0;
    const bool replaced = name.size() > 9 && name.compare(name.size() - 9, 9, ".replaced") == 0;
    if (partial || replaced) {
      out.push_back(name);
    } else if (name.find('.') == std::string::npos) {
      whole.emplace_back(step, name);
    }
  }
  std::sort(whole.begin(), whole.end());
  if (!writing.empty()) whole.emplace_back(step_of(writing), writing);  // the newest
  const int64_t drop = int64_t(whole.size()) - keep;
  for (int64_t k = 0; k < drop; ++k)
    if (whole[size_t(k)].second != writing) out.push_back(whole[size_t(k)].second);
  return out;
}

std::vector<std::string> checkpoint_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool whole = name.find('.') == std::string::npos;
    std::error_code ec;
    bool ours = step_of(name) >= 0 && !entry.is_symlink(ec) && entry.is_directory(ec) &&
                (!whole || fs::is_regular_file(entry.path() / kMeta, ec));
    if (ours)
      for (const auto& file : fs::directory_iterator(entry.path(), ec))
        ours = ours && !file.is_symlink(ec) && file.is_regular_file(ec) &&
               checkpoint_file_name(file.path().filename().string());
    if (ours && !ec) names.push_back(name);
  }
  return names;
}

std::string write_checkpoint(const CheckpointInput& in, int64_t step) {
  const fs::path dir = in.config.checkpoint.dir;
  const fs::path partial = dir / (checkpoint_name(step) + kPartial);
  std::string failure;
  if (in.rank == 0)
    failure = attempt([&] {
      fs::remove_all(partial);
      fs::create_directories(partial);
    });
  // Rank 0's directory is ready; then which rank holds which state.
  all_or_none(in, failure.empty() ? "" : partial.string() + ": " + failure, "create " + partial.string());
  const StateLayout layout = gather_state_layout(in);
  if (in.divergent && !layout.pieces.empty())  // each rank's own state, whole: what a resume reads
    throw Error("checkpoint: strategy '" + in.strategy +
                    "' lets the replicas differ and leaves optimizer state in "
                    "pieces across ranks, which a divergent checkpoint cannot hold",
                DDP_ERR_UNSUPPORTED);
  RankFiles mine;
  failure = attempt([&] {
    mine.optimizer = write_state_file(in, layout, partial);
    if (!in.strategy_state.empty()) {
      mine.strategy = strategy_state_file(in.rank);
      write_safetensors((partial / mine.strategy).string(), in.strategy_state);
    }
  });
  // Rank 0's weights (every rank takes part where the strategy gathers
  // them); where the replicas differ, each rank's own.
  const bool writes_weights = in.rank == 0 || in.divergent;
  if (writes_weights) mine.weights = weights_file(in.rank, in.divergent);
  const std::string weights = write_weights((partial / weights_file(in.rank, in.divergent)).string(), in.params,
                                            writes_weights, in.collective, in.visit_values);
  if (failure.empty()) failure = weights;
  all_or_none(in, failure, "write its files into " + partial.string());
  const std::map<std::string, FileDigest> digests = gather_file_digests(in, partial, mine);
  if (in.rank == 0) {
    failure = attempt([&] { complete(in, step, meta_json(in, step, layout, digests), partial); });
    if (!failure.empty()) throw Error("checkpoint: " + failure, DDP_ERR_INVALID_ARGUMENT);
  }
  return (dir / checkpoint_name(step)).string();
}

void load_checkpoint(const std::string& path, const CheckpointMeta& meta, const std::string& weights_name,
                     std::vector<Parameter>& params, Optimizer& optimizer, InitialValues& values) {
  const std::string file = (fs::path(path) / weights_name).string();
  auto weights = std::make_unique<SafetensorsReader>(file);
  for (Parameter& p : params) {
    const SafetensorsReader::Entry* w = weights->find(p.name);
    if (!w || w->shape != p.shape)
      throw Error(file + ": no tensor '" + p.name + "' of shape " + shape_string(p.shape), DDP_ERR_INVALID_ARGUMENT);
    weights->find_floats(p.name);
  }
  values.read_from(std::move(weights));  // read a tensor at a time, once the strategy has claimed its part
  auto states = std::make_shared<StateReader>(path, meta, params, optimizer);
  // Every parameter trained in the last step has state, if the optimizer keeps any.
  for (size_t i = 0; i < params.size() && meta.step > 0 && optimizer.keeps_state(); ++i)
    if (params[i].trainable && params[i].uses > 0 && !states->has(i))
      throw Error((fs::path(path) / kMeta).string() + ": no optimizer state for '" + params[i].name +
                      "', which trained in step " + std::to_string(meta.step),
                  DDP_ERR_INVALID_ARGUMENT);
  optimizer.restore_on_first_step([states](size_t param, size_t offset, size_t count, SavedState& out) {
    return states->read(param, offset, count, out);  // the slices this rank steps, read as they are first stepped
  });
}

std::map<std::string, std::string> resume_items(const Config& config) {
  std::map<std::string, std::string> items = config_items(config);
  if (!config.data.path.empty()) {  // the file it names, wherever the config is
    std::error_code ec;
    const fs::path data = fs::absolute(config.data.path, ec).lexically_normal();
    const auto bytes = fs::file_size(data, ec);
    items["data.path"] = data.string() + (ec ? "" : " (" + std::to_string(bytes) + " bytes)");
  }
  return items;
}

Resumed resume_run(const Config& config, int rank, Model& model, Device& device, Optimizer& optimizer,
                   InitialValues& values) {
  const std::string path = resolve_checkpoint(config.checkpoint.dir, config.resume);
  refuse_foreign_checkpoints(config, path);
  CheckpointMeta meta = read_checkpoint_meta(path);
  if (meta.divergent && meta.world_size != config.run.world_size)
    throw ConfigError("--resume " + path + ": it holds each rank's own replica (strategy '" + meta.strategy +
                      "' lets them differ) for " + std::to_string(meta.world_size) +
                      " ranks: it resumes on as many, not run.world_size = " + std::to_string(config.run.world_size));
  if (meta.divergent) own_state_files(meta, rank, path);
  const ResumeCheck check = compare_for_resume(meta.config, resume_items(config));
  if (!check.refused.empty()) throw ConfigError("--resume " + path + ": " + check.refused);
  for (const std::string& change : check.changed)  // the sync points follow the strategy and its keys
    if (meta.divergent && change.rfind("strategy.", 0) == 0)
      throw ConfigError("--resume " + path + ": it holds each rank's own replica (strategy '" + meta.strategy +
                        "' lets them differ), which goes on under the same strategy and keys only: " + change);
  if (meta.step > config.run.steps)
    throw ConfigError("--resume " + path + ": the checkpoint is after step " + std::to_string(meta.step) +
                      ", past run.steps = " + std::to_string(config.run.steps));
  for (int64_t step = 0; step < meta.step; ++step) apply_unfreeze(config.unfreeze, step, model, device);
  std::vector<std::string> trainable;
  for (const Parameter& p : model.params())
    if (p.trainable) trainable.push_back(p.name);
  if (trainable != meta.trainable)
    throw ConfigError("--resume " + path + ": the parameters trainable after step " + std::to_string(meta.step) +
                      " differ from the checkpoint's");
  verify_checkpoint_files(path, files_read_by(meta, rank));  // before any tensor is read
  load_checkpoint(path, meta, weights_file(rank, meta.divergent), model.params(), optimizer, values);
  const auto state_path = [&](int r) {
    return meta.files.count(strategy_state_file(r)) ? (fs::path(path) / strategy_state_file(r)).string() : "";
  };
  Resumed resumed{path,
                  meta.step,
                  meta.losses,
                  check.changed,
                  meta.strategy,
                  meta.world_size,
                  meta.divergent,
                  rank < meta.world_size ? state_path(rank) : "",
                  "",
                  meta.eval_due,
                  meta.check_due,
                  meta.val_losses,
                  meta.loss_scale};
  resumed.shared_state = state_path(0);
  return resumed;
}

namespace {

// The directory itself: "runs/x/checkpoints" and "./runs/x/checkpoints/" alike.
bool same_directory(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec);
}

}  // namespace

void refuse_foreign_checkpoints(const Config& config, const std::string& resumed) {
  if (config.checkpoint.every == 0) return;
  const fs::path dir = config.checkpoint.dir;
  if (!fs::exists(dir / "latest")) return;
  if (resumed.empty())
    throw ConfigError("checkpoint.dir " + config.checkpoint.dir +
                      " holds an earlier run's checkpoints: continue it with --resume, or give this run another "
                      "checkpoint.dir (or remove that one)");
  if (!same_directory((fs::path(resumed) / kMeta).parent_path().parent_path(), dir))
    throw ConfigError("checkpoint.dir " + config.checkpoint.dir + " holds other checkpoints than " + resumed +
                      "'s: give this run a checkpoint.dir of its own (or resume from one in " + config.checkpoint.dir +
                      ")");
}

}  // namespace ddp
