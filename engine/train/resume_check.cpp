// resume_check.cpp — which config changes a resumed run may make
// (checkpoint.h's compare_for_resume): pure.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "checkpoint.h"

namespace ddp {
namespace {

// Keys a resumed run may change: how many steps, on how many ranks, with
// which plugins, and how it is run and checked. Everything else shapes the
// trajectory (model, data, optimizer, schedule, seed, batch).
bool may_change(const std::string& key) {
  static const std::set<std::string> run_keys = {"run.steps",
                                                 "run.world_size",
                                                 "run.timeout_s",
                                                 "run.output_dir",
                                                 "run.log_every",
                                                 "run.threads",
                                                 "run.device",
                                                 "run.share_gpus",
                                                 "run.check_finite",
                                                 "run.check_replicas_every",
                                                 "run.debug_collectives",
                                                 "run.max_restarts",
                                                 "run.check_memory"};
  for (const char* section : {"strategy.", "transport.", "checkpoint."})
    if (key.rfind(section, 0) == 0) return true;
  // What is evaluated, and when: not what trains (eval.holdout_rows is: the rows set aside).
  if (key == "eval.every" || key == "eval.batches" || key == "eval.path" || key == "eval.kind") return true;
  // The weights come from the checkpoint: where they first came from no longer
  // matters. How gradients travel may change, as the strategy may.
  return run_keys.count(key) != 0 || key == "model.init_from" || key == "precision.reduce";
}

// The order refusals are named in: what the run trains first.
int refusal_rank(const std::string& key) {
  int rank = 0;
  for (const char* section : {"model.", "data.", "optimizer.", "schedule."}) {
    if (key.rfind(section, 0) == 0) return rank;
    ++rank;
  }
  return rank;
}

std::string shown(const std::string& value) { return value.empty() ? "(not set)" : value; }

}  // namespace

ResumeCheck compare_for_resume(const std::map<std::string, std::string>& saved,
                               const std::map<std::string, std::string>& now) {
  // Keys added after checkpoints were written, as they are unset: a
  // checkpoint without one was written with that default in effect.
  static const std::map<std::string, std::string> kAdded = {{"data.teacher", "false"},
                                                            {"eval.every", "0"},
                                                            {"eval.batches", "1"},
                                                            {"eval.holdout_rows", "0"},
                                                            {"eval.kind", "tokens"},
                                                            {"precision.compute", "fp32"},
                                                            {"precision.loss_scale", "none"},
                                                            {"precision.reduce", "fp32"},
                                                            {"precision.init_scale", "65536"},
                                                            {"precision.growth_factor", "2"},
                                                            {"precision.backoff_factor", "0.5"},
                                                            {"precision.growth_interval", "2000"}};
  const auto saved_value = [&](const std::string& key) {
    const auto a = saved.find(key);
    const auto added = kAdded.find(key);
    return a != saved.end() ? a->second : added != kAdded.end() ? added->second : std::string();
  };
  std::set<std::string> keys;
  for (const auto& [k, v] : saved) keys.insert(k);
  for (const auto& [k, v] : now) keys.insert(k);
  ResumeCheck check;
  std::vector<std::pair<int, std::string>> refused;  // (order, key)
  for (const std::string& key : keys) {
    const auto b = now.find(key);
    const std::string was = saved_value(key);
    const std::string is = b == now.end() ? "" : b->second;
    if (was == is) continue;
    if (may_change(key)) {
      check.changed.push_back(key + " " + shown(was) + " → " + shown(is));
    } else {
      refused.emplace_back(refusal_rank(key), key);
    }
  }
  if (refused.empty()) return check;
  std::stable_sort(refused.begin(), refused.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  const std::string& key = refused[0].second;
  const std::string was = saved_value(key);
  const std::string is = now.count(key) ? now.at(key) : "";
  check.refused = key + " is " + shown(is) + " but was " + shown(was) + " in the checkpoint";
  if (key == "schedule.cosine_steps")
    check.refused += " (unless set, it follows run.steps: --set schedule.cosine_steps=" + was + " keeps the schedule)";
  for (size_t k = 1; k < refused.size(); ++k) check.refused += (k == 1 ? "; also " : ", ") + refused[k].second;
  check.refused +=
      ": a resumed run may change run.steps, run.world_size, the strategy, the transport, timeouts and "
      "checks, not what it trains";
  return check;
}

}  // namespace ddp
