// rank.h — who this rank is and where it meets the others. The launcher
// (engine/launch) fills a RankEnv from the environment; the trainer and the
// benchmark run under it; the plugin host hands rank, world size and local
// rank to plugins.
#pragma once

#include <string>

namespace ddp {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank on this machine: the GPU it takes
};

struct RankEnv {
  RankInfo rank;
  std::string rendezvous;      // "file:<dir>" or "redis:<host>:<port>" (store.h)
  std::string run_id = "ddp";  // key prefix in the store, unique per run
};

}  // namespace ddp
