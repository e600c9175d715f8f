// env_test.cpp — the environment read once (engine/core/env.h): parse_env,
// the pure function from the variables to the struct, with each malformed
// value's exact message; env()/set_env, which keep what they gave; and
// `ddp`, which reads it first thing and stops at a malformed one.
#include "env.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "error.h"
#include "process.h"

namespace ddp {
namespace {

// parse_env's refusal of `vars`, as its message; "" where it accepts them.
std::string refusal(const std::map<std::string, std::string>& vars) {
  try {
    parse_env(vars);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.status(), DDP_ERR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

TEST(Env, NothingSetIsEveryDefault) {
  const Env e = parse_env({});
  EXPECT_EQ(e.trace, "");
  EXPECT_FALSE(e.blas_choice.has_value());
  EXPECT_FALSE(e.restarts.has_value());
  EXPECT_FALSE(e.huge_pages.has_value());
  EXPECT_FALSE(e.huge_pages_restarted);
  EXPECT_EQ(e.plugin_dir, "");
  EXPECT_FALSE(e.debug);
  EXPECT_EQ(e.status_fd, -1);
  EXPECT_EQ(e.status_path, "");
  EXPECT_EQ(e.cache_dir, "");
  EXPECT_EQ(e.get("HOME"), nullptr);
}

TEST(Env, EachVariableLandsInItsField) {
  const Env e = parse_env({{"DDP_TRACE", "/out/trace-rank1.json"},
                           {"DDP_BLAS_CHOICE", R"({"kernel":"Haswell"})"},
                           {"DDP_RESTARTS", "[]"},
                           {"DDP_HUGE_PAGES", "0"},
                           {"DDP_HUGE_PAGES_RESTARTED", "1"},
                           {"DDP_PLUGIN_DIR", "/p:/q"},
                           {"DDP_DEBUG", ""},
                           {"DDP_STATUS_FD", "7"},
                           {"DDP_STATUS_PATH", "/run/fifo"},
                           {"DDP_CACHE_DIR", "/c"},
                           {"TMPDIR", ""}});
  EXPECT_EQ(e.trace, "/out/trace-rank1.json");
  EXPECT_EQ(e.blas_choice, R"({"kernel":"Haswell"})");
  EXPECT_EQ(e.restarts, "[]");
  EXPECT_EQ(e.huge_pages, false);
  EXPECT_TRUE(e.huge_pages_restarted);
  EXPECT_EQ(e.plugin_dir, "/p:/q");
  EXPECT_TRUE(e.debug);  // set, even empty, as getenv saw it
  EXPECT_EQ(e.status_fd, 7);
  EXPECT_EQ(e.status_path, "/run/fifo");
  EXPECT_EQ(e.cache_dir, "/c");
  ASSERT_NE(e.get("TMPDIR"), nullptr);  // set and empty is not unset
  EXPECT_STREQ(e.get("TMPDIR"), "");
  EXPECT_STREQ(e.get("DDP_STATUS_FD"), "7");
  EXPECT_EQ(parse_env({{"DDP_HUGE_PAGES", "1"}}).huge_pages, true);
  EXPECT_EQ(parse_env({{"DDP_STATUS_FD", ""}}).status_fd, -1);  // empty: none
}

TEST(Env, AMalformedStatusDescriptorIsRefusedByName) {
  for (const std::string bad : {"x", "3x", "-1", " 3", "+3", "2147483648", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(refusal({{"DDP_STATUS_FD", bad}}),
              "DDP_STATUS_FD=" + bad +
                  " in the environment is not a file descriptor (a number from 0 to 2147483647): ddp run sets "
                  "it for its ranks; unset it");
  }
  EXPECT_EQ(parse_env({{"DDP_STATUS_FD", "2147483647"}}).status_fd, 2147483647);
}

TEST(Env, HugePagesTakeZeroOrOne) {
  for (const std::string bad : {"", "yes", "2", "01"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(refusal({{"DDP_HUGE_PAGES", bad}}),
              "DDP_HUGE_PAGES=" + bad +
                  " in the environment is neither 0 nor 1 (0: malloc without huge pages, 1: with them)");
  }
}

TEST(Env, TheLaunchersJsonMustBeOfItsKind) {
  EXPECT_EQ(refusal({{"DDP_RESTARTS", "{}"}}),
            "DDP_RESTARTS={} in the environment is not a JSON array: ddp run sets it for its ranks; unset it");
  EXPECT_EQ(refusal({{"DDP_RESTARTS", "["}}),
            "DDP_RESTARTS=[ in the environment is not a JSON array: ddp run sets it for its ranks; unset it");
  EXPECT_EQ(refusal({{"DDP_BLAS_CHOICE", "Haswell"}}),
            "DDP_BLAS_CHOICE=Haswell in the environment is not a JSON object: ddp run sets it for its ranks; "
            "unset it");
  EXPECT_EQ(refusal({{"DDP_BLAS_CHOICE", "{}"}, {"DDP_RESTARTS", "[1]"}}), "");
}

TEST(Env, ReadOnceAndKeptAcrossASet) {
  setenv("DDP_ENV_TEST_VAR", "before", 1);
  load_env();
  const Env& first = env();
  EXPECT_STREQ(first.get("DDP_ENV_TEST_VAR"), "before");
  setenv("DDP_ENV_TEST_VAR", "after", 1);
  EXPECT_STREQ(env().get("DDP_ENV_TEST_VAR"), "before") << "env() read the environment again";
  EXPECT_EQ(process_environment().at("DDP_ENV_TEST_VAR"), "after");
  Env own = env();
  own.trace = "/t.json";
  set_env(std::move(own));
  EXPECT_EQ(env().trace, "/t.json");
  EXPECT_STREQ(env_var("DDP_ENV_TEST_VAR"), "before");
  EXPECT_EQ(first.trace, "") << "what env() gave before set_env changed";
  EXPECT_STREQ(first.get("DDP_ENV_TEST_VAR"), "before");
  unsetenv("DDP_ENV_TEST_VAR");
  load_env();
  EXPECT_EQ(env().get("DDP_ENV_TEST_VAR"), nullptr);
}

// `ddp` reads its environment before anything else: a malformed variable
// stops any command (even `ddp plugins`), named, with exit 1.
TEST(Env, TheCommandStopsAtAMalformedVariableFirstThing) {
  const std::string dir = temp_dir();
  const Process p = start({"plugins"}, {"DDP_HUGE_PAGES=yes"}, dir + "/plugins");
  EXPECT_EQ(wait_for(p, std::chrono::seconds(60)), 1);
  EXPECT_EQ(read_file(p.err),
            "ddp: error: DDP_HUGE_PAGES=yes in the environment is neither 0 nor 1 (0: malloc without huge pages, "
            "1: with them)\n");
  EXPECT_EQ(read_file(p.out), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ddp
