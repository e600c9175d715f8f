// summary.cpp — see summary.h.
#include "summary.h"

#include <algorithm>
#include <fstream>

namespace ddp {
namespace {

using json = nlohmann::ordered_json;

json peaks_json(const PeakBytes& peaks) {
  json j = json::object();
  size_t total = 0;
  for (int c = 0; c < kMemCategories; ++c) {
    j[to_string(static_cast<MemCategory>(c))] = peaks[c];
    total += peaks[c];
  }
  j["total"] = total;
  return j;
}

json rank_json(int rank, const RankTotals& t) {
  json peaks = json::object();
  for (int c = 0; c < kMemCategories; ++c) peaks[to_string(static_cast<MemCategory>(c))] = int64_t(t.peaks[c]);
  return {{"rank", rank},
          {"peak_bytes", peaks},
          {"total_comm_blocked_s", t.comm_blocked_s},
          {"total_comm_busy_s", t.comm_busy_s},
          {"collective_sequence", t.collective_sequence},
          {"peak_resident_bytes", t.peak_resident_bytes < 0 ? json(nullptr) : json(t.peak_resident_bytes)}};
}

// One column per StepRecord field, as summary.json lists them.
void add_columns(json& summary, const std::vector<StepRecord>& steps) {
  auto column = [&](auto member) {
    json a = json::array();
    for (const StepRecord& r : steps) a.push_back(r.*member);
    return a;
  };
  summary["data_s"] = column(&StepRecord::data_s);
  summary["forward_s"] = column(&StepRecord::forward_s);
  summary["backward_s"] = column(&StepRecord::backward_s);
  summary["optimizer_s"] = column(&StepRecord::optimizer_s);
  summary["comm_blocked_s"] = column(&StepRecord::comm_blocked_s);
  summary["comm_busy_s"] = column(&StepRecord::comm_busy_s);
  summary["collectives"] = column(&StepRecord::collectives);
  summary["comm_bytes"] = column(&StepRecord::comm_bytes);
  summary["bus_bytes"] = column(&StepRecord::bus_bytes);
  summary["collectives_before_last_grad_ready"] = column(&StepRecord::collectives_before_last_grad_ready);
  summary["collectives_before_sync_micro_batch"] = column(&StepRecord::collectives_before_sync_micro_batch);
  summary["comm_buffer_bytes"] = column(&StepRecord::comm_buffer_bytes);
  summary["device_allocations"] = column(&StepRecord::device_allocations);
  summary["largest_collective_bytes"] = column(&StepRecord::largest_collective_bytes);
  summary["lr"] = column(&StepRecord::lr);
  summary["grad_norm"] = column(&StepRecord::grad_norm);
  summary["synced"] = column(&StepRecord::synced);
  summary["val_loss"] = column(&StepRecord::val_loss);
  summary["loss_scale"] = column(&StepRecord::loss_scale);
  summary["step_skipped"] = column(&StepRecord::step_skipped);
}

}  // namespace

std::vector<double> RankTotals::to_doubles() const {
  std::vector<double> v;
  for (size_t p : peaks) v.push_back(double(p));
  v.push_back(comm_blocked_s);
  v.push_back(comm_busy_s);
  v.push_back(double(collective_sequence));
  v.push_back(double(peak_resident_bytes));
  return v;
}

RankTotals RankTotals::from_doubles(const double* v) {
  RankTotals t;
  for (int c = 0; c < kMemCategories; ++c) t.peaks[c] = size_t(int64_t(v[c]));
  t.comm_blocked_s = v[kMemCategories];
  t.comm_busy_s = v[kMemCategories + 1];
  t.collective_sequence = uint64_t(v[kMemCategories + 2]);
  t.peak_resident_bytes = int64_t(v[kMemCategories + 3]);
  return t;
}

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  for (int64_t kb = 0; status >> key;) {
    if (key == "VmHWM:" && status >> kb) return kb * 1024;
    status.ignore(1 << 16, '\n');
  }
  return -1;
}

std::string unsynced_weights_note(const std::string& strategy, int64_t steps) {
  return "weights.safetensors holds rank 0's replica as of step " + std::to_string(steps) +
         ", which was not a sync point: strategy plugin '" + strategy +
         "' lets the replicas differ between sync points and did not end the run with one";
}

// The summary's replica checks, weights, checkpoints, evaluations, restarts
// and groups: what the run checked and wrote.
static void add_checks_and_outputs(json& summary, const RunFacts& facts) {
  summary["replica_checks"] = {{"every", facts.replica_check_every},
                               {"sync_points_only", facts.divergent},
                               {"after_steps", facts.replica_checked_after},
                               {"seconds", facts.replica_check_s}};
  // What weights.safetensors holds: every rank's model, or (a divergent
  // strategy's last step not a sync point) rank 0's own replica, said.
  const json note = facts.weights_synced ? json() : json(unsynced_weights_note(facts.strategy, facts.steps));
  summary["weights"] = {{"after_step", facts.steps}, {"sync_point", facts.weights_synced}, {"note", note}};
  summary["checkpoints"] = {{"after_steps", facts.checkpoints}, {"seconds", facts.checkpoint_s}};
  json evaluated = json::array();
  json val_loss = json::array();
  for (const auto& [step, loss] : facts.val_losses) {
    evaluated.push_back(step);
    val_loss.push_back(loss);
  }
  summary["eval"] = {{"every", facts.eval_every},
                     {"batches", facts.eval_batches},
                     {"after_steps", evaluated},
                     {"val_loss", val_loss},
                     {"seconds", facts.eval_s}};
  summary["first_step"] = facts.first_step;
  summary["resumed_from"] = facts.resumed_from.empty() ? json() : json(facts.resumed_from);
  json restarts = facts.restarts_json.empty() ? json::array() : json::parse(facts.restarts_json, nullptr, false);
  summary["restarts"] = restarts.is_discarded() ? json::array() : restarts;
  if (!facts.groups.empty()) {
    json groups = json::array();
    for (const RunFacts::Group& g : facts.groups)
      groups.push_back({{"name", g.name},
                        {"size", g.ranks.size()},
                        {"ranks", g.ranks},
                        {"collectives", g.collectives},
                        {"comm_bytes", g.bytes},
                        {"bus_bytes", g.bus_bytes}});
    summary["groups"] = groups;
  }
}

json run_summary(const RunFacts& facts, const std::vector<StepRecord>& steps, const std::vector<RankTotals>& ranks,
                 const json* strategy_stats) {
  json summary;
  summary["world_size"] = facts.world_size;
  summary["steps"] = facts.steps;
  summary["model"] = facts.model;
  summary["transport"] = facts.transport;
  summary["strategy"] = facts.strategy;
  summary["precision"] = {{"compute", facts.compute},
                          {"loss_scale", facts.loss_scale ? loss_scale_json(*facts.loss_scale) : json()}};
  double total = 0;
  double blocked = 0;
  double busy = 0;
  json loss = facts.losses_before;
  json step_time = json::array();
  for (const StepRecord& r : steps) {
    loss.push_back(r.loss);
    step_time.push_back(r.step_s);
    total += r.step_s;
    blocked += r.comm_blocked_s;
    busy += r.comm_busy_s;
  }
  summary["loss"] = loss;
  summary["step_time_s"] = step_time;
  summary["mean_step_time_s"] = steps.empty() ? 0.0 : total / steps.size();
  // Samples (tokens for lm) the whole run processes per second of step time.
  const double per_step = facts.rows_per_step * double(facts.tokens_per_row);
  summary[facts.tokens_per_row > 1 ? "tokens_per_s" : "samples_per_s"] =
      total > 0 ? per_step * steps.size() / total : 0.0;
  add_columns(summary, steps);
  summary["total_comm_blocked_s"] = blocked;
  summary["total_comm_busy_s"] = busy;
  summary["peak_bytes"] = {{"after_setup", peaks_json(facts.after_setup)},
                           {"before_optimizer_step", peaks_json(facts.before_optimizer)},
                           {"after_optimizer_step", peaks_json(facts.after_optimizer)}};
  json ranks_json = json::array();
  bool agree = true;
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks_json.push_back(rank_json(int(r), ranks[r]));
    agree &= ranks[r].collective_sequence == ranks[0].collective_sequence;
  }
  summary["ranks"] = ranks_json;
  // A false here means ranks issued different collectives: with Gloo that
  // usually hangs; when it does not, data were silently mixed.
  summary["collective_sequences_agree"] = agree;
  add_checks_and_outputs(summary, facts);
  if (strategy_stats) summary["strategy_stats"] = *strategy_stats;
  json choice = facts.blas_choice_json.empty() ? json() : json::parse(facts.blas_choice_json, nullptr, false);
  summary["blas"] = {
      {"kernel", facts.blas_kernel}, {"build", facts.blas_build}, {"choice", choice.is_discarded() ? json() : choice}};
  const HugePages& h = facts.huge_pages;
  summary["huge_pages"] = {{"malloc_hugetlb", h.malloc_hugetlb},
                           {"transparent_huge_pages", h.thp_mode},
                           {"anon_huge_bytes", h.anon_huge_bytes}};
  summary["config"] = facts.config_toml;
  return summary;
}

}  // namespace ddp
