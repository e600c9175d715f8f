// agreement.h — ranks agree on what they train before they train. Ranks
// given different configs would otherwise diverge silently, or die in a
// Gloo error that names no mismatch. Each rank's fingerprint (a pure
// function): every key of its effective config but the rank-local ones
// (run.output_dir, run.threads, transport.hostname, checkpoint.dir), its
// plugins' names and versions, its parameters' names, shapes and dtypes,
// and its model's units (the parameters each owns and reads: a strategy
// that binds or shards by unit must see one layout on every rank).
// Once the plugins have started (before the first collective), every rank
// publishes its fingerprint in the rendezvous store; rank 0 compares them with its own and publishes the
// verdict, which every rank waits for: a difference is refused on every
// rank, naming the first key that differs and the ranks it differs on.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "model.h"
#include "rank.h"
#include "store.h"

namespace ddp {

using Fingerprint = std::map<std::string, std::string>;  // item → value, in item order

// Every key of the config as it takes effect: "optimizer.lr" → "0.1", a
// default left unset as if written out. Pure.
std::map<std::string, std::string> config_items(const Config& config);

// This rank's fingerprint. `plugins` says which plugins, of which versions;
// `units` are the model's. Pure.
Fingerprint fingerprint(const Config& config, const std::vector<Parameter>& params, const std::string& plugins,
                        const std::vector<Unit>& units = {});

// The first item (in item order) on which a rank differs from `base` (rank
// base_rank's), as a sentence naming the ranks; "" if every rank agrees.
// Pure.
std::string first_difference(const Fingerprint& base, int base_rank,
                             const std::vector<std::pair<int, Fingerprint>>& others);

// The exchange through `store`. Throws ConfigError (every rank the same
// one) if the ranks differ.
void agree_before_training(Store& store, const RankInfo& rank, const Fingerprint& mine);

}  // namespace ddp
