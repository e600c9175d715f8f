// rank_env_test.cpp — who a process is, from each launcher's variables
// (engine/launch/rank_env.h), with exact messages for bad values.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "env.h"
#include "error.h"
#include "rank_env.h"
#include "rendezvous.h"

namespace ddp {
namespace {

std::optional<RankSource> from(const std::map<std::string, std::string>& env) {
  return rank_from_environment([&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string refusal(const std::map<std::string, std::string>& env) {
  try {
    from(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(RankEnv, EachLaunchersVariablesNameTheRank) {
  EXPECT_FALSE(from({}).has_value());
  auto s = from({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->launcher, "RANK");
  EXPECT_EQ(s->rank.rank, 1);
  EXPECT_EQ(s->rank.world_size, 4);
  EXPECT_EQ(s->rank.local_rank, 0);
  s = from({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->launcher, "mpirun");
  EXPECT_EQ(s->rank.rank, 3);
  EXPECT_EQ(s->rank.local_rank, 1);
  s = from({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->launcher, "mpiexec (PMI)");
  EXPECT_EQ(s->rank.local_rank, 2) << "no local rank variable: the rank";
  s = from({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "1"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->launcher, "srun");
}

TEST(RankEnv, OursWinsOverTheLauncherItRunsUnder) {
  // `ddp run` inside an mpirun or srun job: its ranks have RANK.
  const auto s = from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "4"}});
  ASSERT_TRUE(s);
  EXPECT_EQ(s->launcher, "RANK");
  EXPECT_EQ(s->rank.world_size, 2);
}

TEST(RankEnv, ABatchScriptIsNoRank) {
  EXPECT_FALSE(from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}).has_value());
}

TEST(RankEnv, BadValuesAreRefusedNamingTheVariable) {
  EXPECT_EQ(refusal({{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "environment variable RANK='one' is not an integer");
  EXPECT_EQ(refusal({{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not");
  EXPECT_EQ(refusal({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}),
            "OMPI_COMM_WORLD_RANK=4 is outside [0, OMPI_COMM_WORLD_SIZE)");
  EXPECT_EQ(refusal({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}), "PMI_SIZE=0 is not a world size");
}

// Where ranks of another launcher meet (rendezvous.h), in order.
RendezvousPlan plan(const std::map<std::string, std::string>& env, const std::string& run_id = "pmix-7") {
  return plan_rendezvous(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      run_id, "/tmp");
}

TEST(Rendezvous, DdpRendezvousWinsThenMasterAddrThenOneHostThenPmix) {
  const std::map<std::string, std::string> all = {
      {"DDP_RENDEZVOUS", "file:/shared/r"}, {"MASTER_ADDR", "node1"},       {"MASTER_PORT", "29500"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},  {"OMPI_COMM_WORLD_SIZE", "4"}, {"PMIX_NAMESPACE", "7"}};
  auto env = all;
  EXPECT_EQ(plan(env).way, RendezvousPlan::kGiven);
  EXPECT_EQ(plan(env).location, "file:/shared/r");
  env.erase("DDP_RENDEZVOUS");
  EXPECT_EQ(plan(env).way, RendezvousPlan::kMaster);
  EXPECT_EQ(plan(env).location, "node1:29500");
  env.erase("MASTER_PORT");  // both, or neither
  EXPECT_EQ(plan(env).way, RendezvousPlan::kLocalFile);
  EXPECT_EQ(plan(env).location, "file:/tmp/ddp-rendezvous-pmix-7");
  env["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";  // two hosts
  EXPECT_EQ(plan(env).way, RendezvousPlan::kPmix);
  env.erase("PMIX_NAMESPACE");
  EXPECT_EQ(plan(env).way, RendezvousPlan::kNone);
}

TEST(Rendezvous, AMalformedLocationIsRefusedNamingTheVariable) {
  auto refusal = [](const std::map<std::string, std::string>& env) {
    try {
      plan(env);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<accepted>");
  };
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:127.0.0.1:abc"}}),
            "DDP_RENDEZVOUS=redis:127.0.0.1:abc: 'abc' is not a port (1 to 65535)");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:h:70000"}}), "DDP_RENDEZVOUS=redis:h:70000: '70000' is not a port (1 to 65535)");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:h:"}}), "DDP_RENDEZVOUS=redis:h:: '' is not a port (1 to 65535)");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:"}}), "DDP_RENDEZVOUS=redis:: no host after redis:");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis::6379"}}), "DDP_RENDEZVOUS=redis::6379: no host after redis:");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "file:"}}), "DDP_RENDEZVOUS=file:: no directory after file:");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "tcp://h:1"}}),
            "DDP_RENDEZVOUS=tcp://h:1: neither file:<directory shared by all ranks> nor redis:<host>:<port>");
  EXPECT_EQ(refusal({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500x"}}), "MASTER_PORT=29500x is not a port (1 to 65535)");
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:h"}}), "<accepted>");  // Redis's port, 6379
  EXPECT_EQ(refusal({{"DDP_RENDEZVOUS", "redis:h:6379"}}), "<accepted>");
}

TEST(Rendezvous, OneHostAsEachLauncherSaysIt) {
  EXPECT_EQ(plan({{"SLURM_STEP_NUM_NODES", "1"}}, "slurm-5.0").way, RendezvousPlan::kLocalFile);
  EXPECT_EQ(plan({{"SLURM_STEP_NUM_NODES", "2"}}, "slurm-5.0").way, RendezvousPlan::kNone);
  EXPECT_EQ(plan({{"LOCAL_WORLD_SIZE", "2"}, {"WORLD_SIZE", "2"}}, "torchrun-x").way, RendezvousPlan::kLocalFile);
  EXPECT_EQ(plan({{"MPI_LOCALNRANKS", "3"}, {"PMI_SIZE", "3"}}, "job").way, RendezvousPlan::kLocalFile);
  // No launcher's job id to name the directory by: nothing to agree on.
  EXPECT_EQ(plan({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "ddp").way,
            RendezvousPlan::kNone);
}

// A rank of one host's run (SLURM, one node): the file store is its own
// directory under TMPDIR, named by the job. A rank that ends well removes
// only the directory, once empty (its keys it removed itself); one that
// fails removes it with what is left, so that the job id, should it come
// again, starts clean.
TEST(Rendezvous, AFailedRankTakesTheLocalDirectoryWithIt) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path() / ("rendezvous_test." + std::to_string(getpid()));
  fs::create_directories(tmp);
  setenv("TMPDIR", tmp.c_str(), 1);
  setenv("SLURM_STEP_NUM_NODES", "1", 1);
  load_env();  // the engine reads its environment once
  const fs::path dir = tmp / "ddp-rendezvous-slurm-9.0";
  const RankInfo rank{0, 2, 0};
  {
    const Rendezvous ok(rank, "slurm-9.0", 5);
    EXPECT_EQ(ok.location(), "file:" + dir.string());
    fs::create_directories(dir);
    std::ofstream(dir / "a peer's key") << "x";
  }
  EXPECT_TRUE(fs::exists(dir / "a peer's key")) << "a rank that ended well removed a peer's key";
  try {
    const Rendezvous failing(rank, "slurm-9.0", 5);
    throw std::runtime_error("the rank failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(fs::exists(dir)) << "a failed rank left the job's directory behind";
  unsetenv("SLURM_STEP_NUM_NODES");
  unsetenv("TMPDIR");
  load_env();
  fs::remove_all(tmp);
}

}  // namespace
}  // namespace ddp
