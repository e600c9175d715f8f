// bench_comm.h — `ddp bench-comm`: the collective benchmark (CS336
// assignment 2's distributed_communication_single_node, reported as
// nccl-tests does). For each transport and world size it starts the ranks
// with the launcher of `ddp run` and times all-reduce, all-gather,
// reduce-scatter and broadcast of float32 buffers through the transport
// plugin's ABI, so a third-party transport is measured the same way.
//
// Conventions (nccl-tests' doc/PERFORMANCE.md):
//   size S       all_reduce, broadcast: the buffer; all_gather: the gathered
//                (receive) buffer, S/n sent per rank; reduce_scatter: the
//                send buffer, S/n received per rank. S/n is rounded down to
//                whole floats, and the row reports the S actually moved.
//   time         one collective, from enqueue on the comm stream until its
//                completion is seen on the training thread; each timed
//                iteration follows a barrier and comes after `warmup`
//                untimed ones. Ranks are aggregated as nccl-tests' default
//                (-a 1): iteration i's time is the mean over ranks; mean
//                and median are over iterations.
//   algbw        S / mean time (GB/s, 1e9 bytes).
//   busbw        algbw × bus_factor(op, n).
// Sizes are binary (1MB = 2^20 bytes, as nccl-tests' -b 1M); bandwidths
// decimal GB/s.
//
// --load gemm keeps one core of each rank busy with GEMMs while it times
// (compute_load.h): collectives beside a backward, as overlapping
// strategies run them. CPU only; bench_comm.json says which load it had.
//
// --device cuda puts the buffers in GPU memory (one GPU per local rank,
// shared where fewer); a transport without the device's capability bit is
// skipped, and said so.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

struct RankEnv;  // rank.h

enum class Collective { AllReduce, AllGather, ReduceScatter, Broadcast };

const char* to_string(Collective op);  // "all_reduce", ...
// Throws Error naming `text` and the choices.
Collective parse_collective(const std::string& text);

// nccl-tests' bus-bandwidth factor: 2(n-1)/n for all_reduce, (n-1)/n for
// all_gather and reduce_scatter, 1 for broadcast. Pure.
double bus_factor(Collective op, int world);

// "4096", "4KB", "1MB", "1GB" (also KiB/MiB/GiB, K/M/G, B; binary units,
// case-insensitive) in bytes. Throws Error naming `text`.
size_t parse_size(const std::string& text);
// The shortest of those forms that reads back as `bytes` ("1MB", "1536KB").
std::string format_size(size_t bytes);

// float32 elements each rank sends and receives for a collective of size S
// (see the conventions above); in-place ops (all_reduce, broadcast) have
// send == recv and use one buffer. Pure.
struct BufferCounts {
  size_t send = 0;
  size_t recv = 0;
};
BufferCounts buffer_counts(Collective op, size_t bytes, int world);

// Timed iterations when the user gives none: about 2 GiB moved per size,
// between 5 (1 GiB) and 50 (small sizes), so world 6 at 1 GiB stays within
// a minute or two on this machine. Pure.
int default_iters(size_t bytes);

// times[rank][iteration] (seconds) → mean and median over iterations of the
// per-iteration mean over ranks. Throws Error on ragged or empty input. Pure.
struct TimeStats {
  double mean_s = 0;
  double median_s = 0;
};
TimeStats aggregate_times(const std::vector<std::vector<double>>& times);

struct BenchOptions {
  std::vector<std::string> transports = {"gloo"};  // names or paths
  std::vector<std::string> transport_sets;         // "transport.key=value", as ddp run's --set
  std::vector<int> worlds = {2, 4, 6};
  std::vector<size_t> sizes;  // bytes (S)
  std::vector<Collective> ops = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                 Collective::Broadcast};
  int warmup = 5;
  int iters = 0;  // 0: default_iters(S)
  std::string out_dir = "runs/bench-comm";
  double timeout_s = 300;      // per collective (Gloo's timeout) and rendezvous
  std::string part_file;       // set by the launcher for its ranks: rank 0 writes its rows there
  std::string device = "cpu";  // "cpu" | "cuda": where the buffers live (cuda: GPU local_rank)
  std::string load = "none";   // "none" | "gemm": a core of each rank busy with GEMMs (compute_load.h)
};

// The launcher side: runs every (transport, world) as its own set of ranks,
// then prints the Markdown table and writes <out_dir>/bench_comm.json and
// bench_comm.csv. Returns the exit code.
int bench_comm(const BenchOptions& options);

// One rank (RANK set): runs the whole benchmark for WORLD_SIZE ranks and the
// first transport. Rank 0 writes its rows to options.part_file, or, without
// one (ranks started by another launcher), prints and writes the outputs
// itself. Returns the exit code.
int bench_comm_rank(const BenchOptions& options);

}  // namespace ddp
