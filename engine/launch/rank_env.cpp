// rank_env.cpp — see rank_env.h.
#include "rank_env.h"

#include "error.h"

namespace ddp {
namespace {

struct Launcher {
  const char* name;
  const char* rank;
  const char* world;
  const char* local;
};

constexpr Launcher kLaunchers[] = {
    {"RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"mpiexec (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    // SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: a batch script (no srun step)
    // has SLURM_PROCID=0 too, and is no rank. (To check on a SLURM cluster.)
    {"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
};

int integer(const char* name, const char* value) {
  const std::string text = value ? value : "";
  try {
    size_t used = 0;
    const int n = std::stoi(text, &used);
    if (used == text.size()) return n;
  } catch (const std::exception&) {}
  throw Error(std::string("environment variable ") + name + "='" + text + "' is not an integer",
              DDP_ERR_INVALID_ARGUMENT);
}

}  // namespace

std::optional<RankSource> rank_from_environment(const std::function<const char*(const char*)>& lookup) {
  for (const Launcher& l : kLaunchers) {
    const char* rank = lookup(l.rank);
    if (!rank || !*rank) continue;
    const char* world = lookup(l.world);
    if ((!world || !*world) && std::string(l.name) == "srun") continue;  // a batch script, not a step
    RankSource s;
    s.launcher = l.name;
    s.variable = l.rank;
    s.rank.rank = integer(l.rank, rank);
    if (!world || !*world)
      throw Error(std::string(l.rank) + " is set but " + l.world + " is not", DDP_ERR_INVALID_ARGUMENT);
    s.rank.world_size = integer(l.world, world);
    const char* local = lookup(l.local);
    s.rank.local_rank = local && *local ? integer(l.local, local) : s.rank.rank;
    if (s.rank.world_size < 1)
      throw Error(std::string(l.world) + "=" + world + " is not a world size", DDP_ERR_INVALID_ARGUMENT);
    if (s.rank.rank < 0 || s.rank.rank >= s.rank.world_size)
      throw Error(std::string(l.rank) + "=" + rank + " is outside [0, " + l.world + ")", DDP_ERR_INVALID_ARGUMENT);
    return s;
  }
  return std::nullopt;
}

}  // namespace ddp
