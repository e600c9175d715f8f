// agreement.cpp — see agreement.h.
#include "agreement.h"

#include <sstream>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

namespace ddp {
namespace {

// Keys that may differ from rank to rank: where a rank writes, its BLAS
// threads, the address it listens on, where its checkpoints go (a shared
// directory may be mounted elsewhere on each host). (Not run.log_every: the loss
// all-reduce follows it.)
bool rank_local(const std::string& key) {
  return key == "run.output_dir" || key == "run.threads" || key == "transport.hostname" || key == "checkpoint.dir";
}

// A value as the fingerprint holds it: TOML's text, floats the shortest.
std::string value_text(const toml::node& node) {
  if (const auto* f = node.as_floating_point()) return shortest_text(f->get());
  std::string out;
  if (const toml::array* a = node.as_array()) {
    for (const toml::node& e : *a) out += (out.empty() ? "" : ", ") + value_text(e);
    return "[" + out + "]";
  }
  if (const toml::table* t = node.as_table()) {
    for (auto&& [k, v] : *t) out += (out.empty() ? "" : ", ") + std::string(k.str()) + " = " + value_text(v);
    return "{" + out + "}";
  }
  std::ostringstream text;
  node.visit([&](auto&& v) { text << v; });
  return text.str();
}

// "section.key" → its value, for every key of `doc`.
void flatten(const toml::table& doc, std::map<std::string, std::string>& out) {
  for (auto&& [section, node] : doc) {
    const toml::table* table = node.as_table();
    if (!table) continue;
    for (auto&& [key, value] : *table)
      out[std::string(section.str()) + "." + std::string(key.str())] = value_text(value);
  }
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return out;
}

std::string show(const std::string& value) { return value.empty() ? "(not set)" : value; }

// "000042": items sort in table order.
std::string padded_index(size_t i) {
  const std::string index = std::to_string(i);
  return std::string(6 - std::min<size_t>(6, index.size()), '0') + index;
}

// "parameters 3, 4, 5" (table indices), or "no parameters".
std::string index_list(const std::vector<size_t>& indices) {
  if (indices.empty()) return "no parameters";
  std::string out = indices.size() == 1 ? "parameter " : "parameters ";
  for (size_t k = 0; k < indices.size(); ++k) out += (k ? ", " : "") + std::to_string(indices[k]);
  return out;
}

}  // namespace

std::map<std::string, std::string> config_items(const Config& config) {
  std::map<std::string, std::string> items;
  flatten(toml::parse(config.toml_text, config.file), items);
  // Engine keys as they take effect: a default written out equals one unset.
  for (const auto& [key, value] : config.effective) items[key] = value;
  return items;
}

Fingerprint fingerprint(const Config& config, const std::vector<Parameter>& params, const std::string& plugins,
                        const std::vector<Unit>& units) {
  Fingerprint f;
  for (const auto& [key, value] : config_items(config))
    if (!rank_local(key)) f["config " + key] = value;
  f["plugins"] = plugins;
  for (size_t i = 0; i < params.size(); ++i)
    f["parameter " + padded_index(i)] = params[i].name + " " + shape_string(params[i].shape) + " float32";
  for (size_t u = 0; u < units.size(); ++u)
    f["unit " + padded_index(u)] = units[u].name + " owns " + index_list(units[u].params) +
                                   (units[u].tied.empty() ? "" : ", reads " + index_list(units[u].tied));
  return f;
}

std::string first_difference(const Fingerprint& base, int base_rank,
                             const std::vector<std::pair<int, Fingerprint>>& others) {
  // The items of every rank, in order: the first one anyone differs on.
  Fingerprint all = base;
  for (const auto& [rank, f] : others) all.insert(f.begin(), f.end());
  for (const auto& [item, unused] : all) {
    const auto mine = base.find(item);
    const std::string expected = mine == base.end() ? "" : mine->second;
    std::vector<int> differ;
    std::string theirs;
    for (const auto& [rank, f] : others) {
      const auto it = f.find(item);
      const std::string value = it == f.end() ? "" : it->second;
      if (value == expected) continue;
      if (differ.empty()) theirs = value;
      differ.push_back(rank);
    }
    if (differ.empty()) continue;
    return "the ranks disagree on " + item + ": rank " + std::to_string(base_rank) + " has " + show(expected) +
           ", rank" + (differ.size() > 1 ? "s " : " ") + join_ranks(differ) + (differ.size() > 1 ? " have " : " has ") +
           show(theirs) + (differ.size() > 1 ? " (or another value)" : "") +
           ": every rank must train the same model with the same config";
  }
  return "";
}

void agree_before_training(Store& store, const RankInfo& rank, const Fingerprint& mine) {
  const std::string text = nlohmann::json(mine).dump();
  store.set("ddp_agree_" + std::to_string(rank.rank), std::vector<char>(text.begin(), text.end()));
  if (rank.rank == 0) {
    std::vector<std::pair<int, Fingerprint>> others;
    for (int r = 1; r < rank.world_size; ++r) {
      const std::vector<char> theirs = store.get("ddp_agree_" + std::to_string(r));
      others.emplace_back(r, nlohmann::json::parse(theirs.begin(), theirs.end()).get<Fingerprint>());
    }
    const std::string verdict = "verdict " + first_difference(mine, 0, others);
    store.set("ddp_agree_verdict", std::vector<char>(verdict.begin(), verdict.end()));
  }
  const std::vector<char> reply = store.get("ddp_agree_verdict");
  const std::string verdict(reply.begin() + std::min<size_t>(8, reply.size()), reply.end());  // past "verdict "
  if (!verdict.empty()) throw ConfigError(verdict);
}

}  // namespace ddp
