// main.cpp — the `ddp` command. The only place that exits.
//   ddp run CONFIG [--set section.key=value]... [--trace] [--resume [PATH]]
//   ddp bench-comm [--transport gloo|PATH] [--world 2,4,6] [--sizes 1MB,...]
//                  [--ops all_reduce,...] [--warmup 5] [--iters N] [--out DIR]
//                  [--set transport.key=value]... [--timeout S] [--load none|gemm]
//   ddp plan CONFIG [--set section.key=value]... [--json] [--bench FILE | --overhead O_US,W_GBPS]
//                  [--bench-busy FILE]
//                  [--mesh X,Y] [--hardware NAME] [--hw KEY=VALUE]... [--axes MX,MY] [--tokens N]
//                  [--activation-shard F] [--precision CLASS=BYTES]...
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "atomic_file.h"
#include "bench_comm.h"
#include "blas_choice.h"
#include "checkpoint.h"
#include "config.h"
#include "env.h"
#include "fit_check.h"
#include "gemm_floor.h"
#include "huge_pages.h"
#include "isolated.h"
#include "launcher.h"
#include "plan_command.h"
#include "plugin_loader.h"
#include "rank_env.h"
#include "registry.h"
#include "trace.h"
#include "trainer.h"
#include "whereabouts.h"

namespace ddp {
namespace {

// "run.timeout_s = 30": what a hung rank ran into.
std::string timeout_note(const Config& config) {
  std::ostringstream note;
  note << "run.timeout_s = " << config.run.timeout_s;
  return note.str();
}

// This rank's number as text, for its trace file's name ("0" where the
// environment cannot tell: run_rank then refuses it).
std::string rank_text() {
  try {
    const auto source = rank_from_environment(env_var);
    return source ? std::to_string(source->rank.rank) : "0";
  } catch (const std::exception&) {
    return "0";
  }
}

// One run per checkpoint.dir as per output directory, when it is another
// one; this also finds a directory that cannot be written before training.
std::unique_ptr<DirectoryLock> lock_checkpoint_dir(const Config& config) {
  std::error_code ec;
  if (config.checkpoint.every == 0 || std::filesystem::equivalent(config.checkpoint.dir, config.run.output_dir, ec))
    return nullptr;
  return std::make_unique<DirectoryLock>(config.checkpoint.dir, "checkpoint.dir");
}

// `ddp run` as one rank: under our launcher, or under another one (RANK
// set by hand, srun, mpirun) with a world size that must match the config.
int run_as_rank(const Config& config) {
  return run_rank(
      [&](const RankEnv& env) {
        // Under another launcher rank 0 holds the output directory itself.
        std::unique_ptr<DirectoryLock> lock;
        std::unique_ptr<DirectoryLock> checkpoint_lock;
        if (env.rank.rank == 0 && !whereabouts::has_channel()) {
          lock = std::make_unique<DirectoryLock>(config.run.output_dir, "run.output_dir");
          checkpoint_lock = lock_checkpoint_dir(config);
        }
        train_rank(config, env);
      },
      std::chrono::milliseconds(int64_t(config.run.timeout_s * 1000)), timeout_note(config),
      [&](const RankInfo& rank) {
        if (rank.world_size != config.run.world_size)
          throw ConfigError("WORLD_SIZE=" + std::to_string(rank.world_size) + " in the environment but " +
                            "run.world_size = " + std::to_string(config.run.world_size) + " in " + config.file);
      });
}

// Every rank's command line: `ddp run CONFIG --set ... [--resume WHICH]`.
std::vector<std::string> rank_args(const std::string& config_path, const std::vector<std::string>& overrides,
                                   const std::string& resume) {
  std::vector<std::string> args = {"ddp", "run", config_path};
  for (const auto& o : overrides) args.insert(args.end(), {"--set", o});
  if (!resume.empty()) args.insert(args.end(), {"--resume", resume});
  return args;
}

// The last line of a completed `ddp run`: its mean step, its throughput
// and where its outputs are, from the summary.json rank 0 wrote.
std::string run_done_line(const std::string& output_dir) {
  const std::filesystem::path summary_path = std::filesystem::path(output_dir) / "summary.json";
  std::ifstream in(summary_path);
  const nlohmann::json s = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (s.is_discarded() || !s.contains("mean_step_time_s")) return "ddp: done; outputs in " + output_dir;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line << "ddp: done: " << s["steps"].get<int64_t>() << " steps, mean step " << std::setprecision(1)
       << s["mean_step_time_s"].get<double>() * 1e3 << " ms, ";
  const bool tokens = s.contains("tokens_per_s");
  line << std::setprecision(0) << s[tokens ? "tokens_per_s" : "samples_per_s"].get<double>()
       << (tokens ? " tokens/s" : " samples/s") << "; outputs in " << output_dir;
  return line.str();
}

// All or nothing: a failed attempt (a rank, or the trace's merge, ran out of
// disk, say) leaves none of the outputs it wrote; outputs of earlier runs
// it did not reach stay.
void remove_outputs_since(const std::string& output_dir, std::filesystem::file_time_type began) {
  for (const char* name : {"summary.json", "weights.safetensors", "trace.json"}) {
    const std::filesystem::path file = std::filesystem::path(output_dir) / name;
    std::error_code ec;
    const auto written = std::filesystem::last_write_time(file, ec);
    if (!ec && written >= began) std::filesystem::remove(file, ec);
  }
}

// The GEMM kernel the ranks use (blas_choice.h), measured at the model's
// GEMMs where it is not given; a GPU run or a model without a footprint
// leaves OpenBLAS's own pick unless one is given.
BlasChoice blas_choice(const Config& config) {
  if (config.run.device != DDP_DEVICE_CPU) return {"default", "GPU run (GEMMs on cuBLAS)"};
  const ModelInfo* model = find_model(config.model.name);
  std::vector<GemmShape> shapes;
  if (model && model->footprint) {
    const int64_t rows = config.data.batch_size / config.run.world_size;
    try {
      shapes = model_gemm_shapes(
          model->footprint(config.model.options, rows, config.run.device, config.precision.compute), rows);
    } catch (const Error& e) {  // the model's refusal of its sizes, in the config's file
      throw Error(config.file + ": " + e.what(), e.status());
    }
  } else if (config.run.blas_kernel == "auto" && !env().get("OPENBLAS_CORETYPE")) {
    return {"default", "model without GEMM shapes"};
  }
  return choose_blas_kernel(config.run.blas_kernel, shapes, std::filesystem::read_symlink("/proc/self/exe"),
                            config.run.threads);
}

// Before any rank starts, in a process of its own bounded by run.timeout_s
// (isolated.h: a plugin's code that exits, crashes or hangs there cannot
// take the launcher down): a CPU run whose plan does not fit this host is
// refused before anything is measured or started (the BLAS probe runs the
// model's GEMMs); then the plugins every rank will load are loaded once: a
// misspelt name, a library that cannot load or a key the plugin does not
// declare is refused (a plugin that declares no keys has them checked by
// each rank instead).
void check_plugins(const Config& config) {
  const std::string refusal = run_isolated(
      "checking the run's plugins before any rank starts",
      std::chrono::milliseconds(int64_t(config.run.timeout_s * 1000)), [&] {
        const std::string fit = config.run.check_memory ? fit_refusal(config, host_memory()) : "";
        if (!fit.empty()) return fit;
        const auto strategy = load_and_check(PluginKind::Strategy, config.strategy_plugin, config.strategy);
        load_and_check(PluginKind::Transport, config.transport_plugin, config.transport);
        const uint64_t caps = strategy->strategy()->caps;
        const std::string reduce = reduce_refusal(caps, config.precision.reduce, config.strategy_plugin);
        return reduce.empty() ? reduce : config.file + ": " + reduce;
      });
  if (!refusal.empty()) throw ConfigError(refusal);
}

// `ddp run` on this machine: run.world_size ranks of this executable, each
// running the same command line as a rank. With --trace, each rank records
// into the run's private directory and the files are merged into
// <output_dir>/trace.json once every rank has succeeded. A failed group
// starts again from its latest checkpoint (from the start if it has none),
// up to run.max_restarts times; a rank that refused its input is not
// started again.
int launch_run(const Config& config, const std::string& config_path, const std::vector<std::string>& overrides,
               bool trace) {
  check_plugins(config);
  const BlasChoice blas = blas_choice(config);
  LaunchSpec spec;
  spec.world = config.run.world_size;
  spec.output_dir = config.run.output_dir;
  spec.timeout_note = timeout_note(config);
  spec.through_mpirun = needs_mpirun(config.transport_plugin);
  spec.unset = {"DDP_TRACE", "DDP_RESTARTS"};
  nlohmann::json restarts = nlohmann::json::array();
  spec.rank_env = [&](int r, const std::string& run_dir) {
    std::vector<std::string> env = {"DDP_BLAS_CHOICE=" + blas.json().dump()};
    if (blas.kernel != "default") env.push_back("OPENBLAS_CORETYPE=" + blas.kernel);
    if (trace) env.push_back("DDP_TRACE=" + rank_trace_path(run_dir, std::to_string(r)));
    if (!restarts.empty()) env.push_back("DDP_RESTARTS=" + restarts.dump());
    return env;
  };
  if (trace) {
    spec.on_success = [&](const std::string& run_dir) {
      std::vector<std::string> files;
      for (int r = 0; r < spec.world; ++r) files.push_back(rank_trace_path(run_dir, std::to_string(r)));
      const std::string merged = (std::filesystem::path(config.run.output_dir) / "trace.json").string();
      merge_traces(files, merged);
      std::cout << "trace: " << merged << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
    };
  }
  const DirectoryLock lock(config.run.output_dir, "run.output_dir");  // one run per output directory
  const auto checkpoint_lock = lock_checkpoint_dir(config);
  std::string resume = config.resume;
  for (int64_t attempt = 0;; ++attempt) {
    spec.args = rank_args(config_path, overrides, resume);
    const std::string latest_before = latest_name(config.checkpoint.dir);
    LaunchOutcome outcome;
    const auto began = std::filesystem::file_time_type::clock::now();
    const int code = launch_ranks(spec, &outcome);
    if (code == 0) std::cout << run_done_line(config.run.output_dir) << std::endl;
    if (code != 0) remove_outputs_since(config.run.output_dir, began);
    if (code != 1 || outcome.bad_input) return code;
    if (attempt >= config.run.max_restarts) {
      if (attempt > 0) std::cerr << "ddp: no restart left (run.max_restarts = " << config.run.max_restarts << ")\n";
      return code;
    }
    // From a checkpoint this attempt wrote; else from where this attempt began.
    if (latest_name(config.checkpoint.dir) != latest_before) resume = "latest";
    const std::string from = resume.empty() ? "" : resolve_checkpoint(config.checkpoint.dir, resume);
    std::cerr << "ddp: restarting the run (" << attempt + 1 << " of run.max_restarts = " << config.run.max_restarts
              << ") from " << (from.empty() ? "the start" : from) << std::endl;
    restarts.push_back(
        {{"failure", outcome.message}, {"resumed_from", from.empty() ? nlohmann::json() : nlohmann::json(from)}});
  }
}

}  // namespace
}  // namespace ddp

// `ddp bench-comm` and its options.
CLI::App* add_bench_comm(CLI::App& app, ddp::BenchOptions& bench, std::vector<std::string>& bench_sizes,
                         std::vector<std::string>& bench_ops) {
  CLI::App* bc = app.add_subcommand(
      "bench-comm", "time collectives through a transport plugin (nccl-tests' algbw/busbw; starts the ranks)");
  bc->add_option("--transport", bench.transports, "transport plugin names or paths (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  bc->add_option("--world", bench.worlds, "world sizes (comma-separated)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096) & CLI::Validator(ddp::world_fits_this_host, "", "RANKS THIS HOST HOLDS"))
      ->capture_default_str();
  bc->add_option("--sizes", bench_sizes, "sizes S in nccl-tests' sense: 4KB, 1MB, 1GB, ... (binary)")
      ->delimiter(',')
      ->capture_default_str();
  bc->add_option("--ops", bench_ops, "collectives (comma-separated)")->delimiter(',')->capture_default_str();
  bc->add_option("--warmup", bench.warmup, "untimed iterations first")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  bc->add_option("--iters", bench.iters, "timed iterations (default: 50 for small sizes down to 5 at 1GB)")
      ->check(CLI::Range(1, 1000000));
  bc->add_option("--out", bench.out_dir, "where bench_comm.json and bench_comm.csv go")
      ->check(CLI::Validator(
          [](const std::string& dir) { return dir.empty() ? "empty (\".\" is the working directory)" : ""; }, "DIR"))
      ->capture_default_str();
  bc->add_option("--set", bench.transport_sets, "a transport key: transport.key=value (repeatable)")->take_all();
  bc->add_option("--timeout", bench.timeout_s, "seconds a collective or the rendezvous may take")
      ->check(CLI::Range(0.001, 1e7))
      ->capture_default_str();
  bc->add_option("--device", bench.device, "where the buffers live: cpu, or cuda (GPU local_rank per rank)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  bc->add_option("--load", bench.load, "none, or gemm: one core of each rank busy with GEMMs while timing (CPU)")
      ->capture_default_str();
  bc->add_option("--part", bench.part_file, "(internal) where rank 0 writes its rows")->group("");
  return bc;
}

// `ddp plan` and its options.
CLI::App* add_plan(CLI::App& app, ddp::PlanOptions& p) {
  CLI::App* plan = app.add_subcommand(
      "plan", "predict a run's memory per rank and communication per step, and FSDP x TP layouts, from its config");
  plan->add_option("config", p.config_path, "the run's TOML file")->required();
  plan->add_option("--set", p.overrides, "override a key: section.key=value (TOML value; repeatable)")->take_all();
  plan->add_flag("--json", p.json, "the plan as JSON on stdout");
  plan->add_option("--bench", p.bench_file, "a bench_comm.json whose all_reduce fit (o, w) times the step");
  plan->add_option("--bench-busy", p.bench_busy_file,
                   "a bench_comm.json measured with --load gemm: times the collectives beside compute");
  plan->add_option("--overhead", p.overhead, "o in µs and w in GB/s, instead of --bench")->delimiter(',');
  plan->add_option("--mesh", p.mesh, "X (FSDP), Y (TP) devices: account for that layout")->delimiter(',');
  plan->add_option("--hardware", p.hardware, "h100-80gb or tpu-v5p (memory, W, C)")->capture_default_str();
  plan->add_option("--hw", p.hardware_set, "memory=BYTES, bandwidth=BYTES_PER_S or flops=FLOP_PER_S (repeatable)")
      ->take_all();
  plan->add_option("--axes", p.axes, "M_X, M_Y: mesh axes X and Y span (default: the hardware's)")->delimiter(',');
  plan->add_option("--tokens", p.tokens, "the batch in tokens (the mesh's activations and compute)");
  plan->add_option("--activation-shard", p.activation_shard, "fraction of activations sharded over X")
      ->capture_default_str();
  plan->add_option("--precision", p.precision,
                   "bytes per element: master, gradients, optimizer, activations, comm (CLASS=BYTES, repeatable)")
      ->take_all();
  return plan;
}

// `ddp blas-probe` (internal: blas_choice.h runs it once per candidate
// kernel) and `ddp gemm-floor CONFIG` (tools/bench_gemm_floor.py): JSON on
// stdout.
struct BlasCommands {
  CLI::App* probe = nullptr;
  CLI::App* floor = nullptr;
  std::string shapes;
  std::string config;
  std::vector<std::string> sets;
  int probe_repeats = 3;
  int probe_threads = 1;
  int floor_repeats = 5;
};

void add_blas_commands(CLI::App& app, BlasCommands& b) {
  b.probe = app.add_subcommand("blas-probe", "(internal) time GEMMs with this process's BLAS kernel");
  b.probe->group("");
  b.probe->add_option("--shapes", b.shapes, "MxKxN,...")->required();
  b.probe->add_option("--repeats", b.probe_repeats, "timed runs of each")->check(CLI::PositiveNumber);
  b.probe->add_option("--threads", b.probe_threads, "BLAS threads")->check(CLI::PositiveNumber);
  b.floor = app.add_subcommand(
      "gemm-floor", "time one rank's forward and backward GEMMs alone, as the model runs them (JSON on stdout)");
  b.floor->add_option("config", b.config, "the run's TOML file")->required();
  b.floor->add_option("--set", b.sets, "override a key: section.key=value (repeatable)")->take_all();
  b.floor->add_option("--repeats", b.floor_repeats, "timed replays (their median)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
}

int blas_command(const BlasCommands& b, char** argv) {
  ddp::restart_with_huge_pages(argv);  // its GEMMs on the memory a rank's would be on
  const nlohmann::json out = b.probe->parsed()
                                 ? ddp::probe_gemms(ddp::parse_shapes(b.shapes), b.probe_repeats, b.probe_threads)
                                 : ddp::gemm_floor(ddp::load_config(b.config, b.sets), b.floor_repeats);
  std::cout << out.dump() << "\n";
  return 0;
}

// `ddp plan` in a process of its own, bounded by the config's run.timeout_s
// (isolated.h): the plugins' plan entries run there; its text is printed
// whole, or not at all.
int plan_isolated(const ddp::PlanOptions& o) {
  const ddp::Config c = ddp::load_config(o.config_path, o.overrides);
  const std::string text =
      ddp::run_isolated("ddp plan", std::chrono::milliseconds(int64_t(c.run.timeout_s * 1000)), [&] {
        std::ostringstream out;
        std::streambuf* const console = std::cout.rdbuf(out.rdbuf());
        try {
          ddp::plan_command(o);
        } catch (...) {
          std::cout.rdbuf(console);
          throw;
        }
        std::cout.rdbuf(console);
        return out.str();
      });
  std::cout << text;
  return 0;
}

int bench_comm_command(ddp::BenchOptions& bench, const std::vector<std::string>& sizes,
                       const std::vector<std::string>& ops, char** argv) {
  bench.sizes.clear();
  for (const auto& s : sizes) bench.sizes.push_back(ddp::parse_size(s));
  bench.ops.clear();
  for (const auto& o : ops) bench.ops.push_back(ddp::parse_collective(o));
  if (!ddp::launched_as_rank()) return ddp::bench_comm(bench);
  ddp::restart_with_huge_pages(argv);
  return ddp::bench_comm_rank(bench);
}

// Reads every variable the engine reads, once (env.h); false after saying
// which one is malformed.
bool read_environment() {
  try {
    ddp::load_env();
    return true;
  } catch (const std::exception& e) {
    std::cerr << "ddp: error: " << e.what() << std::endl;
    return false;
  }
}

int main(int argc, char** argv) {
  if (!read_environment()) return 1;
  ddp::ask_for_huge_pages();  // for the processes this one starts (huge_pages.h)
  CLI::App app{"ddp: data-parallel training with plugin strategies and transports"};
  app.set_version_flag("--version", "ddp 0.2.0 (plugin ABI " + std::to_string(DDP_ABI_VERSION_MAJOR) + "." +
                                        std::to_string(DDP_ABI_VERSION_MINOR) + ")");
  app.require_subcommand(1);
  std::string config_path;
  std::vector<std::string> overrides;
  CLI::App* plugins = app.add_subcommand(
      "plugins", "list the strategy and transport plugins ddp can load (DDP_PLUGIN_DIR, then lib/ddp)");
  double plugins_timeout_s = 30;
  plugins->add_option("--timeout", plugins_timeout_s, "seconds loading one plugin may take (its constructors)")
      ->check(CLI::Range(0.001, 1e6))
      ->capture_default_str();
  CLI::App* run = app.add_subcommand("run", "train as the TOML file says (starts run.world_size ranks)");
  run->add_option("config", config_path, "the run's TOML file")->required();
  run->add_option("--set", overrides, "override a key: section.key=value (TOML value; repeatable)")->take_all();
  std::string resume;
  CLI::Option* resume_option =
      run->add_option("--resume", resume,
                      "continue from the latest checkpoint in checkpoint.dir, or from the checkpoint PATH")
          ->expected(0, 1);
  bool trace = false;
  run->add_flag("--trace", trace,
                "write a Chrome trace (Perfetto) of compute and communication per rank to <output_dir>/trace.json");

  ddp::BenchOptions bench;
  std::vector<std::string> bench_sizes = {"1MB", "10MB", "100MB", "1GB"};
  std::vector<std::string> bench_ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
  CLI::App* bc = add_bench_comm(app, bench, bench_sizes, bench_ops);
  ddp::PlanOptions plan_options;
  CLI::App* plan = add_plan(app, plan_options);
  BlasCommands blas;
  add_blas_commands(app, blas);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {  // --help and --version: 0; a usage error: 2, as getopt's tools
    return app.exit(e) == 0 ? 0 : 2;
  }

  try {
    if (plugins->parsed()) {  // what a config may name, loaded and checked as a run loads it, each within the bound
      const auto bound = std::chrono::milliseconds(int64_t(plugins_timeout_s * 1000));
      const std::string dir = ddp::default_plugin_dir();
      std::cout << "search path: " << dir << "\n"
                << ddp::format_plugins(ddp::describe_plugins(ddp::PluginKind::Strategy, dir, bound))
                << ddp::format_plugins(ddp::describe_plugins(ddp::PluginKind::Transport, dir, bound));
      return 0;
    }
    if (blas.probe->parsed() || blas.floor->parsed()) return blas_command(blas, argv);
    if (plan->parsed()) return plan_isolated(plan_options);
    if (bc->parsed()) return bench_comm_command(bench, bench_sizes, bench_ops, argv);
    ddp::Config config = ddp::load_config(config_path, overrides);
    if (resume_option->count() > 0) config.resume = resume.empty() ? "latest" : resume;
    if (ddp::launched_as_rank()) {
      ddp::apply_cached_blas_kernel(argv);  // a rank of mpirun or srun: this machine's choice, if cached
      ddp::restart_with_huge_pages(argv);   // a rank started without them (by hand, mpirun, srun)
      // Ranks of our own launcher (they have its channel) get DDP_TRACE from
      // it. Under another launcher nobody merges: with --trace each rank
      // keeps its own file, and an inherited DDP_TRACE does not count.
      if (!ddp::whereabouts::has_channel()) {
        ddp::Env own = ddp::env();
        own.trace = trace ? ddp::rank_trace_path(config.run.output_dir, ddp::rank_text()) : "";
        ddp::set_env(std::move(own));
      }
      return ddp::run_as_rank(config);
    }
    return ddp::launch_run(config, config_path, overrides, trace);
  } catch (const std::exception& e) {
    if (run->parsed() && ddp::launched_as_rank()) return ddp::rank_failed_early(e);  // a rank: say which
    std::cerr << "ddp: error: " << e.what() << std::endl;
    return 1;
  }
}
