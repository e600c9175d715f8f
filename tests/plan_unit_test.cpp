// plan_unit_test.cpp — engine/plan: run_plan.h on small hand-made
// footprints (closed forms), with the shipped plugins' plan entries
// (plugin_plan.h, loaded from the build) saying their part, and mesh.h's
// formulas against the numbers worked out by hand in docs/plan.md.
// tests/plan_test.py checks `ddp plan` against measured runs.
#include <sys/resource.h>

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include <functional>

#include <toml++/toml.h>

#include "config.h"
#include "config_plan.h"
#include "fit_check.h"
#include "mesh.h"
#include "plugin_loader.h"
#include "plugin_section.h"
#include "run_plan.h"

namespace ddp {
namespace {

// The bytes of a plan's collectives of every step, summed.
int64_t comm_bytes(const plan::RunPlan& p) {
  int64_t sum = 0;
  for (const plan::Collective& c : p.step_collectives()) sum += c.bytes;
  return sum;
}

// Three parameters of 10, 20 and 30 floats in units of one each; 2 rows of
// 5 inputs.
plan::RunInput three_params(int world) {
  plan::RunInput in;
  in.model.params = {{"a", 10, {10}}, {"b", 20, {20}}, {"c", 30, {30}}};
  in.model.units = {{"u0", {0}, {}}, {"u1", {1}, {}}, {"u2", {2}, {}}};
  in.model.data = DataShape{DataShape::Classification, 5, 3, 0, 0};
  in.model.setup_activation_bytes = 8;
  in.model.step_activation_bytes = 100;
  in.world_size = world;
  in.rows_per_rank = 2;
  in.optimizer = "adamw";
  return in;
}

// A plugin's TOML table as a config file would give it.
PluginSection section(const std::string& kind, const std::string& plugin, const std::string& keys) {
  const toml::table t = toml::parse("[" + kind + "]\nplugin = \"" + plugin + "\"\n" + keys);
  return PluginSection("test.toml", kind, *t[kind].as_table(), plugin);
}

struct Planned {
  plan::RunPlan plan;
  std::vector<plan::RankParts> parts;
};

// The plan of the three parameters on `world` ranks with the shipped (or a
// test) strategy and transport, through their plan entries.
Planned plan_with(const std::string& strategy, const std::string& keys = "", int world = 2,
                  const std::string& transport = "gloo", ddp_device_kind device = DDP_DEVICE_CPU,
                  bool clips = false, const std::string& dir = DDP_TEST_PLUGIN_DIR) {
  const plan::RunInput in = three_params(world);
  const auto s = load_plugin(PluginKind::Strategy, strategy, dir);
  const auto t = load_plugin(PluginKind::Transport, transport, DDP_TEST_PLUGIN_DIR);
  const PluginSection ss = section("strategy", strategy, keys), ts = section("transport", transport, "");
  plan::PlanRun run;
  run.model = &in.model, run.world = world, run.device = device, run.clips = clips;
  Planned out;
  for (int r = 0; r < world; ++r) {
    plan::RankParts p;
    p.strategy = plan::plan_strategy(*s->strategy(), *t->transport(), ss, run, r);
    p.transport = plan::plan_transport(*t->transport(), ts, run, r, p.strategy.collectives);
    p.owns_optimizer = (s->strategy()->caps & DDP_CAP_OWNS_OPTIMIZER) != 0;
    out.parts.push_back(std::move(p));
  }
  out.plan = plan::plan_run(in, out.parts);
  return out;
}

std::string during(const plan::RunPlan& p) {
  std::string marks;
  for (const plan::Collective& c : p.collectives) marks += c.beside_compute ? 'B' : '-';
  return marks;
}

TEST(RunPlan, CategoriesAtTheThreeMoments) {
  const plan::RunPlan p = plan_with("flat", "in_place = false\n").plan;  // a flat buffer of all gradients
  ASSERT_EQ(p.ranks.size(), 2u);
  // parameters, gradients, optimizer_state, comm_buffers, activations
  EXPECT_EQ(p.ranks[1].after_setup, (plan::Bytes{240, 240, 0, 240, 8 + 2 * 5 * 4}));
  EXPECT_EQ(p.ranks[1].before_optimizer_step, (plan::Bytes{240, 240, 480, 240, 48 + 100}));
  EXPECT_EQ(p.ranks[1].after_optimizer_step, p.ranks[1].before_optimizer_step);
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(p.collectives[0].op, "all_reduce");
  EXPECT_EQ(comm_bytes(p), 240);
  EXPECT_TRUE(p.unplanned.empty());
}

// In place (the default), flat averages the gradients' own memory: no buffer.
TEST(RunPlan, FlatInPlaceHoldsNoBuffer) {
  const plan::RunPlan p = plan_with("flat").plan;
  EXPECT_EQ(p.ranks[1].after_setup, (plan::Bytes{240, 240, 0, 0, 8 + 2 * 5 * 4}));
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(comm_bytes(p), 240);
}

TEST(RunPlan, StrategiesCollectives) {
  EXPECT_EQ(plan_with("naive").plan.collectives.size(), 3u);
  EXPECT_EQ(plan_with("overlap").plan.collectives.front().bytes, 120);  // c first: backward's order
  // Buckets of 100 bytes: c (120) alone, then b + a (80 + 40 > 100: b alone, a alone).
  const std::string cap = "bucket_mb = " + std::to_string(100.0 / (1024 * 1024)) + "\n";
  const plan::RunPlan b = plan_with("bucketed", cap).plan;
  ASSERT_EQ(b.collectives.size(), 3u);
  EXPECT_EQ(b.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 0);  // averaged in the gradients' memory
  EXPECT_EQ(b.ranks[0].before_optimizer_step[DDP_MEM_OPTIMIZER_STATE], 480);  // it steps every parameter
  // A buffer per bucket.
  EXPECT_EQ(plan_with("bucketed", cap + "in_place = false\n").plan.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 240);
  // Half the bytes on the wire, a 16-bit copy of each bucket.
  const plan::RunPlan half = plan_with("bucketed", cap + "in_place = false\ncompress = \"bf16\"\n").plan;
  EXPECT_EQ(comm_bytes(half), 120);
  EXPECT_EQ(half.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 240 + 120);
  EXPECT_EQ(plan_with("bucketed", cap + "compress = \"bf16\"\n").plan.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 120);
}

TEST(RunPlan, ShardedOwnsPartOfTheOptimizerState) {
  // Largest first to the least loaded: c (30) to rank 0, b (20) to rank 1, a (10) to rank 1.
  const plan::RunPlan p = plan_with("sharded", "variant = \"allgather\"\n").plan;
  EXPECT_EQ(p.ranks[0].before_optimizer_step[DDP_MEM_OPTIMIZER_STATE], 30 * 8);
  EXPECT_EQ(p.ranks[1].before_optimizer_step[DDP_MEM_OPTIMIZER_STATE], 30 * 8);
  // Flat N x S and a shard of S (S = 30), then gloo's reduce-scatter scratch (N - 1) S.
  EXPECT_EQ(p.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 3 * 30 * 4);
  EXPECT_EQ(p.ranks[0].before_optimizer_step[DDP_MEM_COMM_BUFFERS], 3 * 30 * 4 + 30 * 4);
  EXPECT_EQ(plan_with("sharded", "variant = \"allgather\"\n", 2, "mpi").plan.ranks[0]
                .before_optimizer_step[DDP_MEM_COMM_BUFFERS],
            3 * 30 * 4);
}

// ZeRO-2 on 2 ranks, a bucket per unit (a cap of 8 floats): c, b, a, each
// in chunks of 16 floats (aligned), padded to 32; a ring of the largest
// bucket (32); the shard of 48; rank 0 owns c[0, 16), b[0, 16), a[0, 10).
TEST(RunPlan, Stage2ClaimsTheGradientsAndHoldsItsShardAndRing) {
  const Planned s = plan_with("sharded", "stage = 2\nbucket_mb = " + std::to_string(32.0 / (1024 * 1024)) + "\n");
  const plan::RunPlan& p = s.plan;
  EXPECT_EQ(s.parts[0].strategy.claimed, (std::vector<bool>{true, true, true}));
  EXPECT_EQ(p.ranks[0].after_setup[DDP_MEM_GRADIENTS], (48 + 32) * 4);  // none of the engine's
  EXPECT_EQ(p.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 16 * 4);      // staging: the largest chunk
  EXPECT_EQ(p.ranks[0].before_optimizer_step[DDP_MEM_OPTIMIZER_STATE], (16 + 16 + 10) * 8);
  EXPECT_EQ(p.ranks[1].before_optimizer_step[DDP_MEM_OPTIMIZER_STATE], (14 + 4 + 0) * 8);
  // A reduce-scatter per bucket as it closes (all but the last beside
  // backward), an all-gather per bucket after the update.
  ASSERT_EQ(p.collectives.size(), 6u);
  EXPECT_EQ(during(p), "BB----");
  EXPECT_EQ(p.collectives[0].op, "reduce_scatter");
  EXPECT_EQ(p.collectives[0].bytes, 32 * 4);
  EXPECT_EQ(p.collectives[5].op, "all_gather");
  // Gloo's scratch: (N - 1) chunks of the largest reduce-scatter.
  EXPECT_EQ(p.ranks[0].before_optimizer_step[DDP_MEM_COMM_BUFFERS], 16 * 4 + 16 * 4);
}

// A plugin without a plan entry (one built against ABI 1.3) is planned for
// everything but its own part, and the plan names it.
TEST(RunPlan, APluginWithoutAPlanEntryIsNamed) {
  const plan::RunPlan p = plan_with("valid", "", 2, "gloo", DDP_DEVICE_CPU, false, DDP_TEST_BROKEN_PLUGIN_DIR).plan;
  EXPECT_EQ(p.unplanned, (std::vector<std::string>{"strategy plugin 'valid'"}));
  EXPECT_TRUE(p.collectives.empty());
  // Its caps say it owns the optimizer step, and it said nothing of it: no state.
  EXPECT_EQ(p.ranks[0].before_optimizer_step, (plan::Bytes{240, 240, 0, 0, 48 + 100}));
}

TEST(RunPlan, RefusesWhatItCannotPlanNamingThePlugin) {
  const auto refusal = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("planned");
  };
  EXPECT_EQ(refusal([] { plan_with("flat", "", 2, "gloo", DDP_DEVICE_CUDA); }),
            "transport plugin 'gloo': plan: gloo on a GPU stages through host memory, which `ddp plan` does not "
            "count: plan GPU runs with transport nccl");
  EXPECT_EQ(refusal([] { plan_with("bucketed", "bucket_mb = \"auto\"\n"); }),
            "strategy plugin 'bucketed': plan: strategy.bucket_mb = \"auto\" is chosen by a measurement at run time; "
            "`ddp plan` needs a number (MiB)");
  EXPECT_EQ(refusal([] { plan_with("sharded", "stage = 4\n"); }),
            "strategy plugin 'sharded': plan: strategy.stage must be 1, 2 or 3 (got 4)");
}

// A plan entry's sizes that wrap, or add up past what any rank holds, are
// refused naming the plugin and the plan entry: never a size of -1 bytes
// and the verdict "fits".
int g_wraps = 0;  // which size wraps_plan reports
ddp_status wraps_plan(const ddp_host*, const ddp_transport_v1_t*, ddp_plan* p) {
  const ddp_plan_collective huge = {DDP_OP_ALL_REDUCE, SIZE_MAX / 2, DDP_FLOAT32, 0};
  switch (g_wraps) {
    case 0: return p->buffer(p->ctx, DDP_MEM_COMM_BUFFERS, SIZE_MAX, DDP_PLAN_SETUP);
    case 1:
      p->buffer(p->ctx, DDP_MEM_COMM_BUFFERS, (size_t{1} << 49) + 1, DDP_PLAN_SETUP);
      return p->buffer(p->ctx, DDP_MEM_OPTIMIZER_STATE, (size_t{1} << 49) + 1, DDP_PLAN_STEP);
    case 2: return p->collective(p->ctx, &huge);
    default: p->buffer(p->ctx, DDP_MEM_COMM_BUFFERS, SIZE_MAX, DDP_PLAN_SETUP); return DDP_OK;  // its refusal ignored
  }
}

TEST(RunPlan, SizesPastWhatARankHoldsAreRefusedNamingThePluginAndEntry) {
  EXPECT_EQ(plan::plan_bytes_problem(uint64_t{1} << 50, 0), "");
  EXPECT_EQ(plan::plan_bytes_problem(1, int64_t{1} << 50),
            "1 bytes (with the 1125899906842624 it reported before) are more than a rank can hold: a plan entry's "
            "sizes add up to at most 2^50 bytes (1 PiB) a rank");
  const plan::RunInput in = three_params(2);
  const auto naive = load_plugin(PluginKind::Strategy, "naive", DDP_TEST_PLUGIN_DIR);
  const auto gloo = load_plugin(PluginKind::Transport, "gloo", DDP_TEST_PLUGIN_DIR);
  ddp_strategy_v1_t wraps = *naive->strategy();
  wraps.name = "wraps", wraps.plan = wraps_plan;
  plan::PlanRun run;
  run.model = &in.model, run.world = 2;
  const std::string limit = " are more than a rank can hold: a plan entry's sizes add up to at most 2^50 bytes "
                            "(1 PiB) a rank";
  const std::vector<std::string> want = {
      "strategy plugin 'wraps': plan: buffer: 18446744073709551615 bytes" + limit,
      "strategy plugin 'wraps': plan: buffer: 562949953421313 bytes (with the 562949953421313 it reported before)" +
          limit,
      "strategy plugin 'wraps': plan: collective: 9223372036854775807 elements of 4 bytes: 18446744073709551615 bytes" +
          limit,
      "strategy plugin 'wraps': plan: buffer: 18446744073709551615 bytes" + limit};
  for (g_wraps = 0; g_wraps < 4; ++g_wraps) {
    std::string got = "planned";
    try {
      plan::plan_strategy(wraps, *gloo->transport(), section("strategy", "wraps", ""), run, 0);
    } catch (const std::exception& e) {
      got = e.what();
    }
    EXPECT_EQ(got, want[size_t(g_wraps)]) << g_wraps;
  }
}

TEST(RunPlan, NcclHoldsItsBarriersFloatFromSetUp) {
#if DDP_WITH_CUDA
  const plan::RunPlan p = plan_with("flat", "", 2, "nccl", DDP_DEVICE_CUDA).plan;
  EXPECT_EQ(p.ranks[0].after_setup[DDP_MEM_COMM_BUFFERS], 4);
  EXPECT_EQ(plan_with("flat", "in_place = false\n", 2, "nccl", DDP_DEVICE_CUDA).plan.ranks[0]
                .after_setup[DDP_MEM_COMM_BUFFERS],
            240 + 4);
#else
  GTEST_SKIP() << "no nccl transport in this build";
#endif
}

TEST(RunPlan, CommSecondsIsOverheadPlusBusBytesAtTheAllReducesRate) {
  const std::vector<plan::Collective> c = {{"all_reduce", 1000}, {"all_reduce", 3000}};
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, {1e-3, 1e6}, 4), 2e-3 + 4e-3);
  // Half an all-reduce's bus bytes: half its time beyond o.
  EXPECT_DOUBLE_EQ(plan::comm_seconds({{"reduce_scatter", 4000}, {"all_gather", 4000}}, {1e-3, 1e6}, 4),
                   2e-3 + 4e-3);
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, {1e-3, 1e6}, 1), 0.0);
}

// Which collectives run beside compute: overlap's all-reduces but the last
// (launched when backward ends); the buckets but the last, and the last too
// with bucketed's overlap_optimizer (beside the updates of the others, if
// any); none of naive's, flat's or sharded's broadcasts after the step.
TEST(RunPlan, CollectivesBesideCompute) {
  const std::string cap = "bucket_mb = " + std::to_string(100.0 / (1024 * 1024)) + "\n";  // c, b, a: three buckets
  EXPECT_EQ(during(plan_with("bucketed", cap).plan), "BBB");
  EXPECT_EQ(during(plan_with("bucketed", cap + "overlap_optimizer = false\n").plan), "BB-");
  // sharded's variant "broadcast": the buckets, then a broadcast per parameter.
  EXPECT_EQ(during(plan_with("sharded", cap).plan), "BB----");
  EXPECT_EQ(during(plan_with("overlap").plan), "BB-");
  EXPECT_EQ(during(plan_with("naive").plan), "---");
  EXPECT_EQ(during(plan_with("flat").plan), "-");
  // Clipping: the engine waits for every gradient before any update.
  EXPECT_EQ(during(plan_with("bucketed", cap, 2, "gloo", DDP_DEVICE_CPU, true).plan), "BB-");
  // One bucket, launched when backward ends, no update beside it.
  EXPECT_EQ(during(plan_with("bucketed", "bucket_mb = 1\n").plan), "-");
}

// With a fit measured under load, the collectives beside compute take its
// price, the others the idle one.
TEST(RunPlan, CommSecondsPricesCollectivesBesideComputeUnderLoad) {
  const std::vector<plan::Collective> c = {{"all_reduce", 1000, true}, {"all_reduce", 3000, false}};
  const strategy::OverheadFit idle{1e-3, 1e6}, busy{2e-3, 0.5e6};
  // World 2: bus bytes = the buffer. 1000 B at busy: 2e-3 + 2e-3; 3000 B idle: 1e-3 + 3e-3.
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, idle, 2, &busy), 4e-3 + 4e-3);
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, idle, 2), 2e-3 + 4e-3);
  EXPECT_DOUBLE_EQ(plan::collective_seconds(c[0], busy, 2), 4e-3);
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, idle, 1, &busy), 0.0);
  // A negative o (a noisy fit) never prices a collective below nothing.
  EXPECT_DOUBLE_EQ(plan::collective_seconds(c[0], {-2e-3, 1e6}, 2), 0.0);
  EXPECT_DOUBLE_EQ(plan::comm_seconds(c, {-2e-3, 1e6}, 2), 0.0 + 1e-3);
}

// CS336 communication_accounting's XXL on TPU v5p (docs/plan.md); `tokens`:
// the batch, in tokens.
plan::MeshInput xxl(int64_t x, int64_t y, double tokens) {
  plan::MeshInput in;
  in.params = 126.0 * 2 * 16384 * 53248;
  in.saved_elements_per_token = 126.0 * (16384 + 53248);
  in.d_model = 16384;
  in.d_ff = 53248;
  in.tokens = tokens;
  in.x = x;
  in.y = y;
  in.hardware = plan::hardware_preset("tpu-v5p");
  return in;
}

TEST(Mesh, MemoryPerDeviceAndTheSmallestFsdpThatFits) {
  const plan::MeshPlan one = plan::plan_mesh(xxl(1, 1, 0));
  EXPECT_DOUBLE_EQ(one.total, 16 * xxl(1, 1, 0).params);
  // 16 P / X <= 95e9: X >= 37.02.
  EXPECT_EQ(one.min_x_to_fit, 38);
  // Half the activations sharded: 17.5 MB per token, 1000 tokens: 8.8 GB unsharded stay.
  const plan::MeshPlan acts = plan::plan_mesh(xxl(4, 1, 1000));
  const double a = 1000 * 126.0 * (16384 + 53248) * 2;
  EXPECT_DOUBLE_EQ(acts.activations, a / 2 + a / 2 / 4);
  // (16 P + A / 2) / X + A / 2 <= 95e9 from X = 41.
  EXPECT_EQ(acts.min_x_to_fit, 41);
  // Too many tokens: the unsharded half alone exceeds 95 GB, no X fits.
  EXPECT_EQ(plan::plan_mesh(xxl(1, 1, 20000)).min_x_to_fit, 0);
}

TEST(Mesh, ComputeBoundByTheScalingBooksCostModel) {
  const double alpha = 4.6e14 / 1.8e11;  // W_ici = 2 x 9e10
  const double per_device = 2 * alpha / (2 * 4 * 2);  // comm alpha / (2 Y M_X) = 319.4
  const plan::MeshPlan m = plan::plan_mesh(xxl(16, 4, 64 * per_device));
  EXPECT_DOUBLE_EQ(m.alpha, alpha);
  EXPECT_DOUBLE_EQ(m.fsdp_min_tokens_per_device, per_device);
  EXPECT_DOUBLE_EQ(m.tp_max_y, 2 * 1 * 53248 / (2 * alpha));  // m M_Y F / (comm alpha) = 20.8
  EXPECT_TRUE(m.tp_compute_bound);
  // At the bound T_math = T_FSDP; just above it compute-bound, just below not.
  EXPECT_DOUBLE_EQ(m.t_math, m.t_fsdp);
  EXPECT_TRUE(plan::plan_mesh(xxl(16, 4, 64 * per_device * 1.01)).compute_bound);
  EXPECT_FALSE(plan::plan_mesh(xxl(16, 4, 64 * per_device * 0.99)).compute_bound);
  // The times themselves, per block's forward, B tokens in all.
  const double b = 64 * per_device;
  EXPECT_DOUBLE_EQ(m.t_math, 2 * 2 * b * 16384 * 53248 / (64 * 4.6e14));
  EXPECT_DOUBLE_EQ(m.t_fsdp, 2 * 2 * 16384.0 * 53248 / (4 * 1.8e11 * 2));
  EXPECT_DOUBLE_EQ(m.t_tp, 2 * 2 * b * 16384 / (16 * 1.8e11 * 1));
  // TP past its bound: communication-bound at any batch.
  EXPECT_FALSE(plan::plan_mesh(xxl(1, 21, 1e9)).tp_compute_bound);
  // SwiGLU's three matrices raise TP's bound by half.
  plan::MeshInput swiglu = xxl(16, 4, b);
  swiglu.ffn_matrices = 3;
  EXPECT_DOUBLE_EQ(plan::plan_mesh(swiglu).tp_max_y, 1.5 * m.tp_max_y);
}

TEST(Mesh, Refusals) {
  EXPECT_THROW(plan::plan_mesh(xxl(0, 1, 0)), std::invalid_argument);
  EXPECT_THROW(plan::plan_mesh(xxl(int64_t{1} << 30, int64_t{1} << 30, 0)), std::invalid_argument);
  EXPECT_THROW(plan::plan_mesh(xxl(1, 1, -5)), std::invalid_argument);
  EXPECT_THROW(plan::plan_mesh(xxl(1, 1, INFINITY)), std::invalid_argument);
  EXPECT_THROW(plan::plan_mesh(xxl(16, 4, 1e308)), std::invalid_argument);  // finite, but its bytes are not
  plan::MeshInput in = xxl(1, 1, 0);
  in.activation_shard = 1.5;
  EXPECT_THROW(plan::plan_mesh(in), std::invalid_argument);
  in = xxl(1, 1, 0);
  in.precision.master = NAN;
  EXPECT_THROW(plan::plan_mesh(in), std::invalid_argument);
  in = xxl(2, 2, 0);
  in.hardware.axes_x = 0;
  EXPECT_THROW(plan::plan_mesh(in), std::invalid_argument);
  try {
    plan::hardware_preset("a100");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "unknown hardware 'a100' (known: h100-80gb, tpu-v5p)");
  }
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// The fit check's pure parts (fit_check.h).
TEST(FitCheck, HostMemoryIsMemAvailableOrTheCgroupsRoomWhereLower) {
  const std::string meminfo = "MemTotal:       24683620 kB\nMemFree:  1 kB\nMemAvailable:   24012004 kB\n";
  HostMemory h = host_memory_from(meminfo, "", "");
  EXPECT_EQ(h.bytes, int64_t{24012004} * 1024);
  EXPECT_EQ(h.source, "MemAvailable");
  h = host_memory_from(meminfo, "8000000000\n", "1000000000\n");  // v2 or v1: 7 GB of room
  EXPECT_EQ(h.bytes, 7000000000);
  EXPECT_EQ(h.source, "the cgroup's limit less its usage");
  EXPECT_EQ(host_memory_from(meminfo, "max\n", "1000\n").source, "MemAvailable");
  EXPECT_EQ(host_memory_from(meminfo, "9223372036854771712\n", "1432920064\n").source, "MemAvailable")
      << "cgroup v1's 'no limit'";
  EXPECT_EQ(host_memory_from(meminfo, "1000\n", "5000\n").bytes, 0) << "usage over the limit: no room";
  EXPECT_EQ(host_memory_from("", "", "").bytes, -1);
}

// RLIMIT_AS and RLIMIT_DATA apply to each rank's process, not to the sum:
// a rank's peak plus what its process maps before it must fit the limit.
TEST(FitCheck, AProcessLimitIsPerRankAndCountsTheProcesssBaseline) {
  const std::string status = "Name:\tddp\nVmPeak:\t  300000 kB\nVmSize:\t  250000 kB\nVmData:\t   50000 kB\n";
  const HostMemory host{24400000000, "MemAvailable"};
  HostMemory h = with_rank_limit(host, RLIM_INFINITY, RLIM_INFINITY, status, {1000, 1000, 0});
  EXPECT_EQ(h.rank_limit, -1) << "no limit";
  h = with_rank_limit(host, 1500000000, RLIM_INFINITY, status, {1000, 1000, 0});
  EXPECT_EQ(h.rank_limit, 1500000000);
  EXPECT_EQ(h.rank_baseline, 250000 * 1024 + 1000) << "VmSize, and what a rank maps beyond this process";
  EXPECT_EQ(h.rank_limit_source, "RLIMIT_AS (ulimit -v)");
  EXPECT_EQ(h.bytes, host.bytes) << "MemAvailable stays the sum's limit";
  h = with_rank_limit(host, 1500000000, 1300000000, status, {1000, 1000, 0});
  EXPECT_EQ(h.rank_limit_source, "RLIMIT_AS (ulimit -v)") << "1.5 GB less VmSize leaves less than 1.3 GB less VmData";
  h = with_rank_limit(host, 1500000000, 1000000000, status, {1000, 1000, 0});
  EXPECT_EQ(h.rank_limit_source, "RLIMIT_DATA (ulimit -d)");
  EXPECT_EQ(h.rank_baseline, 50000 * 1024 + 1000);

  h = with_rank_limit(host, 1500000000, RLIM_INFINITY, status, {});  // a baseline of 256 MB
  EXPECT_EQ(rank_limit_shortfall({1200000000, 1200000000}, h), "") << "1.2 GB + 0.256 GB a rank fits 1.5 GB";
  EXPECT_EQ(fit_shortfall({1300000000, 1300000000}, h),
            "needs 1.6 GB a rank (1.3 GB planned + 0.3 GB a rank's process maps before its run's memory: libraries, "
            "thread stacks, BLAS buffers), more than RLIMIT_AS (ulimit -v) allows each process (1.5 GB)");
  EXPECT_EQ(fit_shortfall({1200000000, 1200000000}, h), "") << "per rank, not summed: 2.4 GB > 1.5 GB fits";
}

// What each rank's process holds beyond its plan counts once per rank:
// what bounds how many ranks this host runs (bench-comm --world 4096).
TEST(FitCheck, EachRanksOwnMemoryCountsOncePerRank) {
  const std::string status = "VmSize:\t  250000 kB\nVmData:\t   50000 kB\nRssAnon:\t   20000 kB\n";
  const HostMemory h = with_rank_limit(HostMemory{24400000000, "MemAvailable"}, RLIM_INFINITY, RLIM_INFINITY,
                                       status, {0, 0, 10000000});
  EXPECT_EQ(h.rank_resident, 20000 * 1024 + 10000000);
  EXPECT_EQ(fit_shortfall(std::vector<int64_t>(4096, 1000000), h),
            "needs 128.9 GB (31.5 MB × 4096 ranks), 24.4 GB available (MemAvailable)");
  EXPECT_EQ(fit_shortfall(std::vector<int64_t>(64, 1000000), h), "");
  EXPECT_EQ(world_shortfall(4096, h), "4096 ranks do not fit this host's memory: the run needs 124.8 GB (30.5 MB × "
                                      "4096 ranks), 24.4 GB available (MemAvailable)");
  EXPECT_EQ(world_shortfall(64, h), "");
}

TEST(FitCheck, PeakIsTheMostOfTheThreeMoments) {
  plan::RankMemory m;
  m.after_setup[0] = 5;
  m.before_optimizer_step = {};
  m.before_optimizer_step[0] = 3, m.before_optimizer_step[1] = 4;
  m.after_optimizer_step[2] = 6;
  EXPECT_EQ(peak_bytes(m), 7);
}

TEST(FitCheck, TheShortfallSaysWhatItNeedsAndWhatIsAvailable) {
  const HostMemory host{24400000000, "MemAvailable"};
  EXPECT_EQ(fit_shortfall({16700000000, 16700000000}, host),
            "needs 33.4 GB (16.7 GB × 2 ranks), 24.4 GB available (MemAvailable)");
  EXPECT_EQ(fit_shortfall({12800000000, 12750000000}, host),
            "needs 25.6 GB (2 ranks, up to 12.8 GB each), 24.4 GB available (MemAvailable)");
  EXPECT_EQ(fit_shortfall({12000000000, 12000000000}, host), "");
  EXPECT_EQ(fit_shortfall({24400000000}, host), "") << "exactly what is there fits";
  EXPECT_EQ(fit_shortfall({30000000000}, HostMemory{}), "") << "unknown memory: not checked";
}

// The refusal for a config: lm `large` on 2 ranks (the numbers of
// docs/running.md), on a host given its memory. It names the mildest
// strategy setting that fits, of the strategy's own leaner settings
// (ddp_plan::leaner), then of the other strategy plugins here, and the
// largest smaller world size that fits.
TEST(FitCheck, ARefusalNamesAStrategySettingAndAWorldSizeThatFit) {
  const std::string file = std::string(DDP_TEST_DATA_DIR) + "/../configs/lm-cpu.toml";
  const std::vector<std::string> large = {"model.preset=\"large\"", "data.batch_size=2", "run.world_size=2"};
  const Config c = load_config(file, large);
  const std::string refused = c.file + ": the run does not fit this host's memory: it needs ";
  const std::string anyway = " (run.check_memory = false runs it anyway)";
  EXPECT_EQ(fit_refusal(c, {24400000000, "MemAvailable"}),
            refused + "33.4 GB (16.7 GB × 2 ranks), 24.4 GB available (MemAvailable); strategy.plugin = \"sharded\" "
                      "with strategy.sharded.stage = 2 needs 22.1 GB; run.world_size = 1 needs 17.8 GB" + anyway);
  EXPECT_EQ(fit_refusal(c, {20000000000, "MemAvailable"}),
            refused + "33.4 GB (16.7 GB × 2 ranks), 20.0 GB available (MemAvailable); strategy.plugin = \"sharded\" "
                      "with strategy.sharded.stage = 3 needs 18.7 GB; run.world_size = 1 needs 17.8 GB" + anyway);
  std::vector<std::string> stage1 = large;
  stage1.insert(stage1.end(), {"strategy.plugin=\"sharded\"", "strategy.sharded.stage=1"});
  EXPECT_EQ(fit_refusal(load_config(file, stage1), {20000000000, "MemAvailable"}),
            refused + "25.6 GB (2 ranks, up to 12.8 GB each), 20.0 GB available (MemAvailable); "
                      "strategy.sharded.stage = 3 needs 18.7 GB; run.world_size = 1 needs 17.8 GB" + anyway);
  EXPECT_EQ(fit_refusal(c, {10000000000, "MemAvailable"}),
            refused + "33.4 GB (16.7 GB × 2 ranks), 10.0 GB available (MemAvailable); no strategy setting or smaller "
                      "run.world_size fits: a strategy that shards more, or a smaller model" + anyway);
  EXPECT_EQ(fit_refusal(c, {34000000000, "MemAvailable"}), "");
  EXPECT_EQ(fit_refusal(c, HostMemory{}), "") << "unknown memory: not checked";
}

// The run a plan entry is told of, from a config: loss scaling waits for
// every gradient as clipping does (ddp_plan::clips), [precision] as set.
TEST(PlanRunOf, LossScalingWaitsForEveryGradientAsClippingDoesAndPrecisionIsTheConfigs) {
  const std::string file = std::string(DDP_TEST_DATA_DIR) + "/../configs/lm-cpu.toml";
  const plan::PlanRun plain = plan_run_of(load_config(file));
  EXPECT_FALSE(plain.clips);
  EXPECT_EQ(plain.precision.compute, DDP_FLOAT32);
  EXPECT_EQ(plain.precision.loss_scaled, 0);
  const plan::PlanRun fp16 = plan_run_of(load_config(file, {"precision.compute=fp16", "precision.reduce=bf16"}));
  EXPECT_TRUE(fp16.clips);
  EXPECT_EQ(fp16.precision.compute, DDP_FLOAT16);
  EXPECT_EQ(fp16.precision.reduce, DDP_BFLOAT16);
  EXPECT_EQ(fp16.precision.loss_scaled, 1);
  EXPECT_FALSE(plan_run_of(load_config(file, {"precision.compute=fp16", "precision.loss_scale=none"})).clips);
  EXPECT_TRUE(plan_run_of(load_config(file, {"optimizer.clip_grad_norm=1.0"})).clips);
}

}  // namespace
}  // namespace ddp
