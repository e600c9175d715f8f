// rank_env.h — who this process is, from the variables the launcher that
// started it sets: ours and torchrun's (RANK, WORLD_SIZE, LOCAL_RANK), Open
// MPI's mpirun (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), MPICH's Hydra
// (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) and SLURM's srun (SLURM_PROCID,
// SLURM_STEP_NUM_TASKS, SLURM_LOCALID), in that order: the first launcher whose
// rank variable is set names all three. Pure (the environment comes in as
// a lookup).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "rank.h"

namespace ddp {

struct RankSource {
  RankInfo rank;
  std::string launcher;  // "RANK", "mpirun", "mpiexec (PMI)", "srun": who set it
  std::string variable;  // the rank's variable, for messages ("OMPI_COMM_WORLD_RANK")
};

// nullopt when no launcher's rank variable is set (this process is not a
// rank: `ddp run` starts its own). Throws Error (DDP_ERR_INVALID_ARGUMENT)
// naming the variable for a value that is not an integer, a world size
// missing or below 1, or a rank outside [0, world size).
std::optional<RankSource> rank_from_environment(const std::function<const char*(const char*)>& lookup);

}  // namespace ddp
