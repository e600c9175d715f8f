// bench_comm.cpp — `ddp bench-comm` (see bench_comm.h). The launcher side
// runs each (transport, world) as a set of ranks through launch_ranks; each
// rank loads the transport as the trainer does (plugin loader, host vtable,
// the run's store) and times the collectives on the comm stream. The
// all-reduce fit is the overhead model strategies use for bucket_mb =
// "auto" (plugins/include/ddp/overhead_model.hpp).
#include "bench_comm.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <ddp/overhead_model.hpp>
#include "atomic_file.h"
#include "compute_load.h"
#include "device.h"
#include "isolated.h"
#include "launcher.h"
#include "plugin_host.h"
#include "plugin_loader.h"
#include "rank.h"
#include "store.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

constexpr size_t kFloat = sizeof(float);

// One measured (transport, op, size, world).
struct Row {
  std::string transport;
  Collective op = Collective::AllReduce;
  int world = 1;
  size_t bytes = 0;  // S actually moved
  int iters = 0;
  int warmup = 0;
  std::string load = "none";  // --load
  TimeStats time;
  double algbw() const { return double(bytes) / time.mean_s / 1e9; }
  double busbw() const { return algbw() * bus_factor(op, world); }
};

json to_json(const Row& r) {
  return {{"transport", r.transport}, {"op", to_string(r.op)},        {"world", r.world},
          {"bytes", r.bytes},         {"size", format_size(r.bytes)}, {"iters", r.iters},
          {"warmup", r.warmup},       {"mean_s", r.time.mean_s},      {"median_s", r.time.median_s},
          {"algbw_GBps", r.algbw()},  {"busbw_GBps", r.busbw()},      {"load", r.load}};
}

Row row_from_json(const json& j) {
  Row r;
  r.transport = j.at("transport").get<std::string>();
  r.op = parse_collective(j.at("op").get<std::string>());
  r.world = j.at("world").get<int>();
  r.bytes = j.at("bytes").get<size_t>();
  r.iters = j.at("iters").get<int>();
  r.warmup = j.at("warmup").get<int>();
  r.load = j.at("load").get<std::string>();
  r.time = TimeStats{j.at("mean_s").get<double>(), j.at("median_s").get<double>()};
  return r;
}

std::string fixed(double x, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, x);
  return text;
}

// The all-reduce rows of each (transport, world) fitted to t = o + bytes / w
// (ddp/overhead_model.hpp), where there are two sizes or more.
// Median times: the typical call, as bucket_mb = "auto" measures it (a few
// descheduled iterations can double a mean at 1 MB on 2 cores).
json overhead_fits(const std::vector<Row>& rows) {
  json fits = json::array();
  std::vector<std::pair<std::string, int>> seen;
  for (const Row& r : rows) {
    const auto key = std::make_pair(r.transport, r.world);
    if (r.op != Collective::AllReduce || std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    std::vector<strategy::CommTiming> timings;
    for (const Row& q : rows)
      if (q.op == Collective::AllReduce && q.transport == r.transport && q.world == r.world)
        timings.push_back({double(q.bytes), q.time.median_s});
    try {
      const strategy::OverheadFit fit = strategy::fit_overhead(timings);
      fits.push_back({{"transport", r.transport},
                      {"world", r.world},
                      {"o_s", fit.o_s},
                      {"w_bytes_per_s", std::isinf(fit.w_bytes_per_s) ? json(nullptr) : json(fit.w_bytes_per_s)}});
    } catch (const std::invalid_argument&) {  // one size only: nothing to fit
    }
  }
  return fits;
}

// The Markdown table on stdout; bench_comm.json and bench_comm.csv in out_dir.
void write_outputs(const std::vector<Row>& rows, const std::string& out_dir, const std::string& load) {
  if (load != "none") std::cout << "Timed with --load " << load << ": one core of each rank busy with GEMMs.\n\n";
  std::cout << "| transport | op | size | world | iters | mean ms | median ms | algbw GB/s | busbw GB/s |\n"
            << "|---|---|---|---|---|---|---|---|---|\n";
  for (const Row& r : rows)
    std::cout << "| " << r.transport << " | " << to_string(r.op) << " | " << format_size(r.bytes) << " | " << r.world
              << " | " << r.iters << " | " << fixed(r.time.mean_s * 1e3, 3) << " | " << fixed(r.time.median_s * 1e3, 3)
              << " | " << fixed(r.algbw(), 3) << " | " << fixed(r.busbw(), 3) << " |\n";
  const json fits = overhead_fits(rows);
  if (!fits.empty()) {
    std::cout << "\nall_reduce fitted to t = o + bytes / w (median times; least squares, relative residuals):\n\n"
              << "| transport | world | o (µs) | w (GB/s) |\n|---|---|---|---|\n";
    for (const json& f : fits)
      std::cout << "| " << f["transport"].get<std::string>() << " | " << f["world"].get<int>() << " | "
                << fixed(f["o_s"].get<double>() * 1e6, 1) << " | "
                << (f["w_bytes_per_s"].is_null() ? std::string("inf")
                                                 : fixed(f["w_bytes_per_s"].get<double>() / 1e9, 3))
                << " |\n";
  }
  std::cout.flush();

  fs::create_directories(out_dir);
  json all = json::array();
  for (const Row& r : rows) all.push_back(to_json(r));
  const json doc = {{"conventions",
                     "nccl-tests: time = mean over ranks per iteration, mean/median over iterations; "
                     "algbw = bytes / mean time; busbw = algbw * bus factor; sizes binary, GB/s = 1e9 B/s"},
                    {"load", load},
                    {"rows", all},
                    {"overhead_fit", fits}};
  const std::string json_path = (fs::path(out_dir) / "bench_comm.json").string();
  write_file_atomically(json_path, doc.dump(2) + "\n");
  std::ostringstream csv;
  csv << "transport,op,size,bytes,world,iters,warmup,mean_s,median_s,algbw_GBps,busbw_GBps,load\n";
  for (const Row& r : rows)
    csv << r.transport << ',' << to_string(r.op) << ',' << format_size(r.bytes) << ',' << r.bytes << ',' << r.world
        << ',' << r.iters << ',' << r.warmup << ',' << r.time.mean_s << ',' << r.time.median_s << ',' << r.algbw()
        << ',' << r.busbw() << ',' << r.load << '\n';
  const std::string csv_path = (fs::path(out_dir) / "bench_comm.csv").string();
  write_file_atomically(csv_path, csv.str());
  std::cerr << "bench-comm: wrote " << json_path << " and " << csv_path
            << " (plot: /usr/bin/python3 tools/plot_bench_comm.py " << json_path << ")\n";
}

// Device memory, freed on scope exit, with a host copy for setting and
// checking values (the same memory on the CPU).
struct Buffer {
  Buffer(Device& device, size_t count) : device(device), count(count) {
    data = static_cast<float*>(device.alloc(count * kFloat, MemCategory::CommBuffers));
    if (device.kind() != DDP_DEVICE_CPU) mirror.resize(count);
  }
  ~Buffer() { device.free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ddp_buffer view() const { return ddp_buffer{data, count, DDP_FLOAT32, device.kind()}; }
  float* host() { return mirror.empty() ? data : mirror.data(); }
  void upload() {
    if (!mirror.empty()) device.upload(data, mirror.data(), count * kFloat);
  }
  void download() {
    if (!mirror.empty()) device.download(mirror.data(), data, count * kFloat);
  }
  Device& device;
  size_t count;
  float* data = nullptr;
  std::vector<float> mirror;  // a GPU's values on the host
};

// One rank's benchmark over one transport. Declaration order is teardown
// order in reverse: the comm is destroyed (after its stream is drained)
// before the library is unloaded and the device's streams stop.
class BenchRank {
 public:
  BenchRank(const BenchOptions& options, const RankEnv& env)
      : options_(options),
        env_(env),
        // GPUs shared among ranks where fewer: gloo can, nccl refuses (its own error).
        device_(make_device(options.device == "cuda" ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU, env.rank.local_rank, true)),
        store_(env.rendezvous, env.run_id, std::chrono::milliseconds(int64_t(options.timeout_s * 1000))),
        section_(plugin_section_from_overrides("transport", options.transport_sets)) {
    services_.rank = env.rank;
    services_.device = device_.get();
    services_.store = &store_;
    services_.timeout_ms = int64_t(options.timeout_s * 1000);
    lib_ = load_plugin(PluginKind::Transport, options.transports.at(0));
    api_ = lib_->transport();
    host_ = std::make_unique<PluginHost>(services_, section_, std::string("transport plugin '") + api_->name + "'");
  }
  ~BenchRank() {
    try {
      device_->comm_stream().synchronize();
    } catch (const std::exception&) {}
    if (comm_) api_->destroy(comm_);
  }

  std::vector<Row> run() {
    host_->check(api_->init(host_->get(), &comm_), "init");
    section_.check_all_read("transport", api_->name);
    std::vector<Row> rows;
    const ComputeLoad load(parse_load(options_.load));
    for (Collective op : options_.ops)
      for (size_t bytes : options_.sizes) rows.push_back(measure(op, bytes));
    return rows;
  }

 private:
  int world() const { return env_.rank.world_size; }
  int rank() const { return env_.rank.rank; }
  ddp_stream stream() { return reinterpret_cast<ddp_stream>(&device_->comm_stream()); }

  // Enqueues `op` on the comm stream and waits for it on this thread.
  void collective(Collective op, const Buffer& send, const Buffer& recv) {
    const ddp_buffer s = send.view();
    const ddp_buffer r = recv.view();
    switch (op) {
      case Collective::AllReduce:
        host_->check(api_->all_reduce(comm_, &s, DDP_REDUCE_SUM, stream()), "all_reduce");
        break;
      case Collective::AllGather: host_->check(api_->all_gather(comm_, &s, &r, stream()), "all_gather"); break;
      case Collective::ReduceScatter:
        if (!api_->reduce_scatter)
          throw Error(std::string("transport '") + api_->name + "' has no reduce_scatter: leave it out of --ops",
                      DDP_ERR_UNSUPPORTED);
        host_->check(api_->reduce_scatter(comm_, &s, &r, DDP_REDUCE_SUM, stream()), "reduce_scatter");
        break;
      case Collective::Broadcast: host_->check(api_->broadcast(comm_, &s, 0, stream()), "broadcast"); break;
    }
    wait();
  }
  void barrier() {
    host_->check(api_->barrier(comm_, stream()), "barrier");
    wait();
  }
  void wait() {
    done_.record(device_->comm_stream());
    done_.synchronize(services_.wait_limit());
  }

  Row measure(Collective op, size_t bytes) {
    const BufferCounts counts = buffer_counts(op, bytes, world());
    if (counts.send == 0 || counts.recv == 0)
      throw Error(std::string(to_string(op)) + " of " + format_size(bytes) + " on " + std::to_string(world()) +
                  " ranks: less than one float per rank (give a larger size)");
    const bool in_place = op == Collective::AllReduce || op == Collective::Broadcast;
    Buffer send(*device_, counts.send);
    std::unique_ptr<Buffer> recv_owned = in_place ? nullptr : std::make_unique<Buffer>(*device_, counts.recv);
    Buffer& recv = in_place ? send : *recv_owned;
    check_result(op, bytes, send, recv);

    Row row;
    row.transport = api_->name;
    row.op = op;
    row.world = world();
    row.bytes = (op == Collective::AllGather ? counts.recv : counts.send) * kFloat;
    row.warmup = options_.warmup;
    row.load = options_.load;
    row.iters = options_.iters > 0 ? options_.iters : default_iters(bytes);
    std::fill_n(send.host(), send.count, 0.0f);  // summing zeros: no overflow over the iterations
    send.upload();
    for (int i = 0; i < row.warmup; ++i) collective(op, send, recv);
    std::vector<double> mine(size_t(row.iters));
    for (double& t : mine) {
      barrier();
      const auto start = Clock::now();
      collective(op, send, recv);
      t = std::chrono::duration<double>(Clock::now() - start).count();
    }
    row.time = aggregate_times(gather(mine));
    if (rank() == 0)
      std::cerr << "bench-comm: " << row.transport << " world " << row.world << ": " << to_string(op) << " "
                << format_size(row.bytes) << ": " << row.iters << " iterations, mean "
                << fixed(row.time.mean_s * 1e3, 3) << " ms, busbw " << fixed(row.busbw(), 3) << " GB/s" << std::endl;
    return row;
  }

  // One untimed run on known values, checked everywhere: rank r holds r + 1
  // (reduce_scatter: chunk c of rank r holds (r + 1)(c + 1)).
  void check_result(Collective op, size_t bytes, Buffer& send, Buffer& recv) {
    const size_t n = size_t(world());
    const size_t r = size_t(rank());
    if (op == Collective::ReduceScatter) {
      for (size_t i = 0; i < send.count; ++i) send.host()[i] = float((r + 1) * (i / recv.count + 1));
    } else {
      std::fill_n(send.host(), send.count, float(r + 1));
    }
    send.upload();
    collective(op, send, recv);
    recv.download();
    auto expected = [&](size_t i) -> float {
      switch (op) {
        case Collective::AllReduce: return float(n * (n + 1) / 2);
        case Collective::AllGather: return float(i / send.count + 1);
        case Collective::ReduceScatter: return float((r + 1) * n * (n + 1) / 2);
        case Collective::Broadcast: return 1.0f;
      }
      return 0;
    };
    const float* got = recv.host();
    for (size_t i = 0; i < recv.count; ++i)
      if (got[i] != expected(i))
        throw Error(std::string(to_string(op)) + " of " + format_size(bytes) + " on " + std::to_string(n) +
                    " ranks gave " + std::to_string(got[i]) + " at element " + std::to_string(i) + " of rank " +
                    std::to_string(r) + ", expected " + std::to_string(expected(i)));
  }

  // Every rank's times, through the transport being measured.
  // (On a GPU through device copies: a transport may read device memory only.)
  std::vector<std::vector<double>> gather(const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * size_t(world()));
    Buffer send_copy(*device_, 2 * mine.size());  // doubles in floats
    Buffer recv_copy(*device_, 2 * all.size());
    std::memcpy(send_copy.host(), mine.data(), mine.size() * sizeof(double));
    send_copy.upload();
    const ddp_buffer send{send_copy.data, mine.size(), DDP_FLOAT64, device_->kind()};
    const ddp_buffer recv{recv_copy.data, all.size(), DDP_FLOAT64, device_->kind()};
    host_->check(api_->all_gather(comm_, &send, &recv, stream()), "all_gather of the times");
    wait();
    recv_copy.download();
    std::memcpy(all.data(), recv_copy.host(), all.size() * sizeof(double));
    std::vector<std::vector<double>> times;
    for (int q = 0; q < world(); ++q)
      times.emplace_back(all.begin() + q * mine.size(), all.begin() + (q + 1) * mine.size());
    return times;
  }

  const BenchOptions& options_;
  RankEnv env_;
  std::unique_ptr<Device> device_;  // --device
  Store store_;
  PluginSection section_;
  HostServices services_;
  std::unique_ptr<LoadedPlugin> lib_;
  const ddp_transport_v1_t* api_ = nullptr;
  std::unique_ptr<PluginHost> host_;
  ddp_comm* comm_ = nullptr;
  Event done_;
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string number_text(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

// The transport's caps, read in a process of its own within the collectives'
// bound (isolated.h): its constructors cannot take the launcher down.
uint64_t transport_caps(const std::string& transport, double timeout_s) {
  const std::string caps = run_isolated("bench-comm", std::chrono::milliseconds(int64_t(timeout_s * 1000)), [&] {
    return std::to_string(load_plugin(PluginKind::Transport, transport)->transport()->caps);
  });
  return std::stoull(caps);
}

}  // namespace

int bench_comm(const BenchOptions& options) {
  std::vector<std::string> sizes;
  std::vector<std::string> ops;
  for (size_t s : options.sizes) sizes.push_back(format_size(s));
  for (Collective op : options.ops) ops.push_back(to_string(op));
  plugin_section_from_overrides("transport", options.transport_sets);  // bad --set: refused before any rank starts
  if (parse_load(options.load) && options.device != "cpu")
    throw Error("--load " + options.load + " keeps CPU cores busy: it does not load a GPU (use --device cpu)");
  const DirectoryLock lock(options.out_dir, "--out");
  std::vector<Row> rows;
  int code = 0;
  std::string skipped;
  for (const std::string& transport : options.transports) {
    {
      const bool cuda = options.device == "cuda";
      if (!supports_device(transport_caps(transport, options.timeout_s), cuda ? DDP_DEVICE_CUDA : DDP_DEVICE_CPU)) {
        std::cerr << "bench-comm: transport '" << transport << "' skipped: it does not work on "
                  << (cuda ? "GPU" : "CPU") << " memory (--device " << options.device << ")\n";
        skipped += (skipped.empty() ? "'" : ", '") + transport + "'";
        continue;
      }
    }
    for (int world : options.worlds) {
      const std::string part = (fs::path(options.out_dir) / (".part-" + std::to_string(::getpid()) + ".json")).string();
      std::vector<std::string> args = {"ddp",         "bench-comm",
                                       "--transport", transport,
                                       "--world",     std::to_string(world),
                                       "--sizes",     join(sizes),
                                       "--ops",       join(ops),
                                       "--warmup",    std::to_string(options.warmup),
                                       "--out",       options.out_dir,
                                       "--timeout",   number_text(options.timeout_s),
                                       "--device",    options.device,
                                       "--load",      options.load,
                                       "--part",      part};
      if (options.iters > 0)
        args.insert(args.end(), {"--iters", std::to_string(options.iters)});  // else each size's default
      for (const auto& set : options.transport_sets) args.insert(args.end(), {"--set", set});
      std::cerr << "bench-comm: " << transport << " on " << world << " ranks" << std::endl;
      LaunchSpec spec;
      spec.world = world;
      spec.output_dir = options.out_dir;
      spec.args = args;
      spec.timeout_note = "--timeout " + number_text(options.timeout_s);
      spec.through_mpirun = needs_mpirun(transport);
      const int rc = launch_ranks(spec);
      std::ifstream in(part);
      if (rc == 0 && in) {
        for (const json& j : json::parse(in)) rows.push_back(row_from_json(j));
      } else {
        std::cerr << "bench-comm: " << transport << " on " << world << " ranks failed\n";
        code = rc ? rc : 1;
      }
      std::error_code ec;
      fs::remove(part, ec);
      if (rc == 130) return rc;  // interrupted: stop here
    }
  }
  if (!rows.empty()) write_outputs(rows, options.out_dir, options.load);
  if (rows.empty() && code == 0)  // every transport skipped: a run that measured nothing is no success
    throw Error("bench-comm: nothing measured: " + skipped + " cannot run on --device " + options.device);
  return code;
}

int bench_comm_rank(const BenchOptions& options) {
  return run_rank(
      [&](const RankEnv& env) {
        if (options.transports.size() != 1)
          throw Error("a rank of bench-comm measures one transport: give one --transport");
        if (std::find(options.worlds.begin(), options.worlds.end(), env.rank.world_size) == options.worlds.end())
          throw Error("WORLD_SIZE=" + std::to_string(env.rank.world_size) + " in the environment is not in --world");
        const std::vector<Row> rows = BenchRank(options, env).run();
        if (env.rank.rank != 0) return;
        if (options.part_file.empty()) {
          write_outputs(rows, options.out_dir, options.load);
          return;
        }
        json all = json::array();
        for (const Row& r : rows) all.push_back(to_json(r));
        write_file_atomically(options.part_file, all.dump() + "\n");
      },
      std::chrono::milliseconds(int64_t(options.timeout_s * 1000)), "--timeout " + number_text(options.timeout_s));
}

}  // namespace ddp
