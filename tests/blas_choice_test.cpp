// blas_choice_test.cpp — engine/blas: the model's GEMM shapes (closed
// form), their text form, and a probe in this process (its kernel is the
// one OpenBLAS loaded, its results check out). tests/blas_kernel_test.py
// runs `ddp run` for the choice itself: environment, key, cache.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "blas_choice.h"
#include "blas_info.h"
#include "env.h"
#include "error.h"
#include "config.h"
#include "gemm_floor.h"
#include "gemm_probe.h"
#include "mlp.h"

namespace ddp {
namespace {

TEST(GemmShapes, ForwardInputAndWeightGradientOfEveryMatrixOnce) {
  // mlp 8 x 2 layers, 3 classes, 4 rows: two [8, 8] weights, a [3, 8] head.
  const Footprint f = mlp_footprint(MlpConfig{8, 2, 3}, 4, DDP_DEVICE_CPU);
  const std::vector<GemmShape> want = {{4, 8, 8}, {8, 4, 8}, {4, 8, 3}, {4, 3, 8}, {3, 4, 8}};
  EXPECT_EQ(model_gemm_shapes(f, 4), want);
}

TEST(GemmShapes, TextRoundTripAndRefusals) {
  const std::vector<GemmShape> shapes = {{1024, 256, 10000}, {1, 2, 3}};
  EXPECT_EQ(format_shapes(shapes), "1024x256x10000,1x2x3");
  EXPECT_EQ(parse_shapes("1024x256x10000,1x2x3"), shapes);
  for (const char* bad : {"", "1x2", "1x2x0", "1x2x3x4", "axbxc", "1x2x3,", "1x2x9999999"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(parse_shapes(bad), Error);
  }
}

// `ddp gemm-floor`: one rank's step GEMMs recorded and replayed alone. A
// 16-bit compute runs the same GEMMs (its kept activations go to them in
// 16 bits, which the float32 replay reads from a stand-in).
TEST(GemmFloor, RecordsAStepsGemmsAndReplaysThemInEveryPrecision) {
  nlohmann::json floors[3];
  const char* computes[3] = {"fp32", "bf16", "fp16"};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(computes[i]);
    const Config c = validate_config(
        toml::parse(std::string("[run]\nsteps = 1\n[model]\nname = \"lm\"\npreset = \"lm-tiny\"\n") +
                    "[data]\nbatch_size = 2\n[optimizer]\nlr = 0.1\n[precision]\ncompute = \"" + computes[i] +
                    "\"\n"),
        "t.toml");
    floors[i] = gemm_floor(c, 1);
    EXPECT_GE(floors[i]["forward_s"].get<double>(), 0.0);
    EXPECT_GE(floors[i]["backward_s"].get<double>(), 0.0);
    // lm-tiny, 2 rows of 32: 2 blocks of 7 linears and the head forward,
    // each with its weight and input gradients backward (the GEMMs of the
    // CPU's attention come on top).
    EXPECT_GE(floors[i]["gemms"]["forward"].get<int>(), 15);
    EXPECT_GE(floors[i]["gemms"]["backward"].get<int>(), 30);
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(floors[i]["gemms"], floors[0]["gemms"]) << computes[i];
    EXPECT_EQ(floors[i]["gflop"], floors[0]["gflop"]) << computes[i];
  }
}

TEST(GemmProbe, TimesWithTheLoadedKernelAndChecksResults) {
  const nlohmann::json r = probe_gemms({{64, 32, 48}, {7, 5, 3}}, 2, 1);
  EXPECT_EQ(r["corename"].get<std::string>(), blas_kernel_loaded());
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
  EXPECT_LT(r["worst_error"].get<double>(), 1e-5);
  EXPECT_GT(r["seconds"].get<double>(), 0.0);
}

// A model whose GEMMs cannot fit this host is said to be one before any
// probe runs (lm with d_model = 10^8 once read "no candidate ran the
// model's GEMMs correctly"); a probe that runs out of memory says so with
// the size it asked for.
TEST(BlasChoice, GemmsThatCannotFitAreNamedWithTheirSize) {
  EXPECT_EQ(probe_memory_problem({{8, 1000, 1000}}, int64_t{1} << 30), "");
  EXPECT_EQ(probe_memory_problem({{8, 1000, 1000}, {8, 100000000, 100000000}}, 24400000000),
            "the model's GEMM 8x100000000x100000000 needs 40000006.4 GB for its three matrices, more than this "
            "host's 24.4 GB of memory: the model does not fit this host, whatever the kernel (run.check_memory = "
            "false skipped the fit check that says so)");
  EXPECT_EQ(probe_memory_problem({{8, 100000000, 100000000}}, -1), "") << "memory unknown: not checked";
  // A probe whose matrices cannot be allocated (4 TB) says so, with the size.
  const nlohmann::json r = probe_gemms({{1 << 20, 1 << 20, 1}}, 1, 1);
  EXPECT_EQ(r.value("error", ""), "out of memory allocating 4398054899712 bytes for the GEMM 1048576x1048576x1");
  EXPECT_FALSE(r.value("ok", true));
}

TEST(BlasChoice, TheEnvironmentAndTheKeyWinWithoutMeasuring) {
  // The kernel this process's OpenBLAS loaded (as the variable would have
  // made it: it is read at load): whatever the CPU, Haswell on one, Prescott
  // on a virtual one that hides its model.
  const std::string loaded = blas_kernel_loaded();
  setenv("OPENBLAS_CORETYPE", loaded.c_str(), 1);
  load_env();  // the engine reads its environment once
  BlasChoice c = choose_blas_kernel("Zen", {}, "/nonexistent");
  EXPECT_EQ(c.kernel, loaded);
  EXPECT_EQ(c.source, "environment");
  unsetenv("OPENBLAS_CORETYPE");
  load_env();
  c = choose_blas_kernel("Zen", {}, "/nonexistent");
  EXPECT_EQ(c.kernel, "Zen");
  EXPECT_EQ(c.source, "config");
  EXPECT_EQ(c.json()["source"], "config");
}

TEST(BlasChoice, AKernelThisCpuCannotRunNamesTheFeatureItLacks) {
  const auto without = [](std::set<std::string> missing) {
    return [missing](const std::string& f) { return !missing.count(f); };
  };
  EXPECT_EQ(missing_cpu_feature("SkylakeX", without({"avx512f"})), "avx512f");
  EXPECT_EQ(missing_cpu_feature("skylakex", without({"avx512bw"})), "avx512bw") << "OpenBLAS reads it in any case";
  EXPECT_EQ(missing_cpu_feature("Cooperlake", without({"avx512bf16"})), "avx512bf16");
  EXPECT_EQ(missing_cpu_feature("Haswell", without({"fma"})), "fma");
  EXPECT_EQ(missing_cpu_feature("Zen", without({"avx2"})), "avx2");
  EXPECT_EQ(missing_cpu_feature("Sandybridge", without({"avx"})), "avx");
  EXPECT_EQ(missing_cpu_feature("SkylakeX", without({"avx2"})), "") << "AVX-512 without a feature it does not check";
  EXPECT_EQ(missing_cpu_feature("default", without({"avx", "avx2"})), "");
  EXPECT_EQ(missing_cpu_feature("Haswell", without({})), "");
}

}  // namespace
}  // namespace ddp
