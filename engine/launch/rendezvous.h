// rendezvous.h — where the ranks of a run meet (store.h) when another
// launcher started them and DDP_RENDEZVOUS does not say:
//   1. MASTER_ADDR and MASTER_PORT (torchrun's): rank 0 serves a Redis
//      store there (redis-server on that host), every rank uses it;
//   2. every rank on this host, as the launcher says (Open MPI's local
//      size, srun's node count, torchrun's LOCAL_WORLD_SIZE, Hydra's
//      MPI_LOCALNRANKS): a file store in the temporary directory, named by
//      the launcher's job id;
//   3. a PMIx launcher (mpirun, srun --mpi=pmix) across hosts: rank 0
//      serves a Redis store on a free port of its own address and tells the
//      others through PMIx (put, fence, get);
//   else the rank is refused, told what to set.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "rank.h"

namespace ddp {

// Which of the ways above applies (pure: the environment is a lookup).
// Throws Error naming the variable for a DDP_RENDEZVOUS or MASTER_PORT that
// cannot be one (no directory, no host, a port outside 1 to 65535).
struct RendezvousPlan {
  enum Way { kGiven, kMaster, kLocalFile, kPmix, kNone } way = kNone;
  std::string location;  // kGiven: DDP_RENDEZVOUS; kMaster: MASTER_ADDR:MASTER_PORT; kLocalFile: file:<dir>
};
RendezvousPlan plan_rendezvous(const std::function<const char*(const char*)>& lookup, const std::string& run_id,
                               const std::string& temp_dir);

// What a rank holds while it runs: the store location all ranks use, and
// for rank 0 of a kMaster or kPmix plan the Redis server it serves (stopped
// when this is destroyed). Throws Error saying what to set when no way
// applies, or what failed (no redis-server, a port taken, PMIx). Destroyed
// by a failure (an exception passing through), a kLocalFile directory goes
// with whatever keys are in it: it is ours, and the launcher's job id may
// come again (a restarted slurmctld counts from 1), whose run the keys of
// a failed one would refuse.
class Rendezvous {
 public:
  Rendezvous(const RankInfo& rank, const std::string& run_id, double timeout_s);
  ~Rendezvous();
  const std::string& location() const { return location_; }

 private:
  std::string location_;
  std::string local_dir_;  // kLocalFile's directory
  int unwinding_ = 0;      // std::uncaught_exceptions() at construction: more at destruction is a failure
  int server_ = -1;        // redis-server's pid (rank 0), or -1
  bool pmix_ = false;      // PMIx_Init was called: PMIx_Finalize at the end
};

}  // namespace ddp
