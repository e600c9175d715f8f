// conformance_options_test.cpp — the conformance tool's command line (pure:
// parse_conformance_args) and its behaviour as a user meets it: unknown
// options refused, --help its own, values as ddp run --set takes them,
// invariants reported apart from parity, a declared tolerance, a verdict.
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "conformance_options.h"

namespace ddp {
namespace {

std::string parse(const std::vector<std::string>& args, ConformanceOptions* out = nullptr,
                  std::vector<std::string>* gtest = nullptr) {
  ConformanceOptions o;
  std::vector<std::string> g;
  return parse_conformance_args(args, out ? out : &o, gtest ? gtest : &g);
}

TEST(ConformanceArgs, UnknownOptionsAreRefusedWithTheNearest) {
  EXPECT_EQ(parse({"--stratgy", "my.so"}),
            "unknown option '--stratgy' (did you mean --strategy?); ddp-conformance --help lists the options");
  EXPECT_EQ(parse({"--strategy_key=a=1"}),
            "unknown option '--strategy_key=a=1' (did you mean --strategy-key?); ddp-conformance --help lists the "
            "options");
  EXPECT_EQ(parse({"--fast"}), "unknown option '--fast'; ddp-conformance --help lists the options");
  EXPECT_EQ(parse({"my.so"}), "unknown option 'my.so'; ddp-conformance --help lists the options");
}

TEST(ConformanceArgs, WorldsAreThoseAPluginDeclares) {
  ConformanceOptions o;
  EXPECT_EQ(o.worlds, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(parse({"--worlds", "4,2"}, &o), "");
  EXPECT_EQ(o.worlds, (std::vector<int>{2, 4}));
  for (const std::string bad : {"0,2", "5", "2,2", "2,,4", "", "two"})
    EXPECT_EQ(parse({"--worlds=" + bad}),
              "--worlds wants world sizes from 1 to 4, each once, separated by commas; got '" + bad + "'");
}

TEST(ConformanceArgs, ValuesAndGoogleTestFlags) {
  ConformanceOptions o;
  std::vector<std::string> g;
  EXPECT_EQ(parse({"--strategy=sharded", "--strategy-key", "variant=allgather", "--gtest_filter=*_world2",
                   "--tolerance", "1e-3", "--transport", "mpi", "--device=cpu"},
                  &o, &g),
            "");
  EXPECT_EQ(o.strategy, "sharded");
  EXPECT_EQ(o.transport, "mpi");
  EXPECT_EQ(o.strategy_sets(), std::vector<std::string>{"strategy.variant=allgather"});
  ASSERT_TRUE(o.tolerance.has_value());
  EXPECT_FLOAT_EQ(*o.tolerance, 1e-3f);
  EXPECT_EQ(g, std::vector<std::string>{"--gtest_filter=*_world2"});
  EXPECT_FALSE(o.help);
  EXPECT_EQ(parse({"--help"}, &o), "");
  EXPECT_TRUE(o.help);
}

// [precision] for the run and its reference: bare words quoted, numbers and
// TOML strings as given; the reference without `reduce`.
TEST(ConformanceArgs, PrecisionKeysMakeATableForTheRunAndItsReference) {
  ConformanceOptions o;
  EXPECT_EQ(o.precision_table(false), "");
  EXPECT_EQ(parse({"--precision", "compute=fp16", "--precision=reduce=bf16", "--precision", "init_scale=1024",
                   "--precision", "loss_scale=\"none\""},
                  &o),
            "");
  EXPECT_EQ(o.precision_table(false),
            "[precision]\ncompute = \"fp16\"\nreduce = \"bf16\"\ninit_scale = 1024\nloss_scale = \"none\"\n");
  EXPECT_EQ(o.precision_table(true), "[precision]\ncompute = \"fp16\"\ninit_scale = 1024\nloss_scale = \"none\"\n");
}

// Per optimizer: each named one its own, the others the plain --tolerance,
// else the scenario's own.
TEST(ConformanceArgs, TolerancePerOptimizer) {
  ConformanceOptions o;
  EXPECT_EQ(parse({"--tolerance", "sgd=0.001,adamw=0.25"}, &o), "");
  EXPECT_FLOAT_EQ(o.parity_tolerance("sgd", 1e-6f), 1e-3f);
  EXPECT_FLOAT_EQ(o.parity_tolerance("adamw", 1e-5f), 0.25f);
  EXPECT_EQ(o.declared_tolerance(), "adamw=0.25, sgd=0.001");
  ConformanceOptions p;
  EXPECT_EQ(parse({"--tolerance", "adamw=0.5", "--tolerance", "0.01"}, &p), "");
  EXPECT_FLOAT_EQ(p.parity_tolerance("adamw", 1e-5f), 0.5f);
  EXPECT_FLOAT_EQ(p.parity_tolerance("sgd", 1e-6f), 0.01f);
  EXPECT_EQ(p.declared_tolerance(), "0.01, adamw=0.5");
  ConformanceOptions q;
  EXPECT_EQ(parse({"--tolerance", "adamw=0.5"}, &q), "");
  EXPECT_FLOAT_EQ(q.parity_tolerance("sgd", 1e-6f), 1e-6f);  // not loosened
}

TEST(ConformanceArgs, MalformedValuesSaySo) {
  EXPECT_EQ(parse({"--strategy"}), "--strategy needs a value");
  EXPECT_EQ(parse({"--strategy-key", "wire"}), "--strategy-key wants KEY=VALUE, got 'wire'");
  EXPECT_EQ(parse({"--precision", "bf16"}), "--precision wants KEY=VALUE, got 'bf16'");
  EXPECT_EQ(parse({"--strategy-key", "=fp32"}), "--strategy-key wants KEY=VALUE, got '=fp32'");
  EXPECT_EQ(parse({"--tolerance", "-1"}), "--tolerance wants a number >= 0 or OPT=T[,OPT=T], got '-1'");
  EXPECT_EQ(parse({"--tolerance=loose"}), "--tolerance wants a number >= 0 or OPT=T[,OPT=T], got 'loose'");
  EXPECT_EQ(parse({"--tolerance", "sgd=1e-3,lion=2"}), "--tolerance: 'lion=2' is not sgd=T or adamw=T (T a number >= 0)");
  EXPECT_EQ(parse({"--tolerance", "adamw="}), "--tolerance: 'adamw=' is not sgd=T or adamw=T (T a number >= 0)");
}

// The built tool, run as a user runs it: (exit code, stdout and stderr).
std::pair<int, std::string> tool(const std::string& args) {
  const std::string cmd = std::string(DDP_BIN_DIR) + "/ddp-conformance " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(ConformanceTool, RefusesAMisspeltOptionInsteadOfTestingNaive) {
  const auto [code, out] = tool("--stratgy my.so");
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "ddp-conformance: error: unknown option '--stratgy' (did you mean --strategy?); "
                 "ddp-conformance --help lists the options\n");
}

TEST(ConformanceTool, HelpListsItsOwnOptions) {
  const auto [code, out] = tool("--help");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out, kConformanceHelp);
}

TEST(ConformanceTool, TakesBareWordsAsDdpRunSetDoes) {
  const auto [code, out] = tool("--strategy sharded --strategy-key variant=allgather "
                                "--gtest_filter='Strategy/Conformance.Protocol/sgd_toy_world2'");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("ddp-conformance: PASS: strategy sharded (variant=allgather), transport gloo, device cpu: "
                     "1 case(s), every invariant and parity check held\n"),
            std::string::npos)
      << out;
}

// A strategy run on worlds none of the chosen cases has: every case skips,
// and the tool says nothing was checked and exits 1; one case alone (as
// ctest runs each) skips and exits 0.
TEST(ConformanceTool, EveryCaseSkippedIsNoPass) {
  const auto [code, out] = tool("--worlds 3 --gtest_filter='Strategy/Conformance.Protocol/pytorch_sgd_toy*'");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("ddp-conformance: error: every case skipped (the reasons above): nothing was checked\n"),
            std::string::npos)
      << out;
  const auto [one, one_out] = tool("--worlds 3 --gtest_filter='Strategy/Conformance.Protocol/pytorch_sgd_toy_world2'");
  EXPECT_EQ(one, 0) << one_out;
}

// AdamW on two ranks differs from the single process by float rounding
// (the scenario's tolerance is 1e-5): with a declared tolerance of 0 parity
// fails, and the verdict keeps the invariants, which hold, apart.
TEST(ConformanceTool, ReportsParityApartFromInvariantsAtTheDeclaredTolerance) {
  const auto [code, out] = tool("--tolerance 0 --gtest_filter='Strategy/Conformance.Protocol/adamw_toy_world2'");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("[parity] weights differ from the single-process engine by up to "), std::string::npos) << out;
  EXPECT_EQ(out.find("[invariant]"), std::string::npos) << out;
  EXPECT_NE(out.find("ddp-conformance: FAIL: strategy naive, transport gloo, device cpu, parity tolerance 0 "
                     "(declared): 1 case(s); invariants broken in 0, parity off in 1, other failures (the run "
                     "itself) in 0\n"),
            std::string::npos)
      << out;
  const auto [exact, exact_out] = tool("--gtest_filter='Strategy/Conformance.Protocol/adamw_toy_world2'");
  EXPECT_EQ(exact, 0) << exact_out;
}

TEST(ConformanceTool, AFilterThatMatchesNothingIsAnError) {
  const auto [code, out] = tool("--gtest_filter=nothing");
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("ddp-conformance: error: no case matched (check --gtest_filter)\n"), std::string::npos) << out;
}

}  // namespace
}  // namespace ddp
