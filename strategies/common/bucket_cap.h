// bucket_cap.h — the `bucket_mb` key of [strategy], shared by `bucketed`
// and `sharded` (variant broadcast): a number of MiB, or "auto", which
// measures the transport at start-up and takes the bucket size that the
// overhead model (ddp/overhead_model.hpp) says minimises the time communication
// adds after backward. Header-only, so a plugin stays one shared library
// that links nothing of the engine. Throws ddp::plugin::Failure.
//
// "auto", in on_train_begin after the parameter broadcast: on the comm
// stream, all-reduces of three sizes derived from the model's size
// (auto_probe_sizes), each after a barrier, 1 untimed + kProbeRuns timed,
// the median kept; rank 0 fits t = o + bytes / w to them and publishes o and
// w through the run's store; every rank reads rank 0's two doubles back, so
// all lay out identical buckets (the ordering invariant of bucket_sync.h
// needs the same layout everywhere) and every rank issued the same probe
// collectives. The cap for G trainable gradient bytes is then
// sqrt(G·w·o) (at least 1 byte, i.e. one parameter per bucket when o is not
// measurable; at most G, one bucket), recomputed from the same o and w when
// the trainable set changes.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/overhead_model.hpp>
#include "buckets.h"
#include "strategy_util.h"

namespace ddp {
namespace strategy {

class BucketCap {
 public:
  static constexpr int kProbeRuns = 5;
  static constexpr const char* kStoreKey = "strategy.bucket_mb_auto";

  // Reads the key in create (config_* only there): a float of MiB (ints
  // accepted), finite and > 0, default kDefaultBucketMiB; or "auto".
  static BucketCap read(const plugin::Host& host) {
    BucketCap cap;
    try {
      cap.mib_ = host.config_float("bucket_mb", kDefaultBucketMiB);
    } catch (const plugin::Failure&) {  // not a number: "auto" is the one string taken
      std::string text;
      try {
        text = host.config_string("bucket_mb", "");
      } catch (const plugin::Failure&) {
        throw plugin::Failure(
            DDP_ERR_INVALID_ARGUMENT,
            "strategy.bucket_mb must be a finite number of MiB > 0 or \"auto\" (got a value of another type)");
      }
      if (text != "auto")
        throw plugin::Failure(
            DDP_ERR_INVALID_ARGUMENT,
            "strategy.bucket_mb must be a finite number of MiB > 0 or \"auto\" (got \"" + text + "\")");
      cap.automatic_ = true;
      return cap;
    }
    if (!(cap.mib_ > 0) || !std::isfinite(cap.mib_))
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                            "strategy.bucket_mb must be a finite number of MiB > 0 or "
                            "\"auto\" (got " +
                                number(cap.mib_) + ")");
    return cap;
  }

  bool automatic() const { return automatic_; }
  // A plan entry's cap in bytes: "auto" is refused, being chosen by a
  // measurement at run time.
  size_t plan_bytes() const {
    if (automatic_)
      throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                            "strategy.bucket_mb = \"auto\" is chosen by a measurement "
                            "at run time; `ddp plan` needs a number (MiB)");
    return bytes_of_mib(mib_);
  }

  // on_train_begin, after the parameter broadcast, on every rank: with
  // "auto", measures o and w (see the top); nothing for a number. Blocking.
  void measure(const StrategyBase& base) {
    if (!automatic_) return;
    const plugin::Host& h = base.host;
    double model_bytes = 0;
    for (size_t i = 0; i < h.param_count(); ++i) model_bytes += double(StrategyBase::float32_bytes(h.param(i)));
    const std::vector<size_t> sizes = auto_probe_sizes(size_t(model_bytes));
    plugin::DeviceBuffer buffer(h.raw(), sizes.back(), DDP_MEM_COMM_BUFFERS);
    probes_.clear();
    for (const size_t bytes : sizes) {
      const ddp_buffer b = h.floats(buffer.get(), bytes / sizeof(float));
      std::vector<double> runs;
      for (int run = 0; run <= kProbeRuns; ++run) {
        base.comm.barrier(h.comm_stream());
        base.wait_comm();
        const auto start = std::chrono::steady_clock::now();
        base.comm.all_reduce(b, DDP_REDUCE_SUM, h.comm_stream());
        base.wait_comm();
        if (run > 0) runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::sort(runs.begin(), runs.end());
      probes_.push_back({double(bytes), runs[runs.size() / 2]});
    }
    share_rank0_fit(h);
    measured_ = true;
  }

  // The cap in bytes for buckets of `trainable_bytes` of gradients in all.
  size_t bytes_for(size_t trainable_bytes) const {
    if (!automatic_) return bytes_of_mib(mib_);
    if (!measured_) throw plugin::Failure(DDP_ERR_INTERNAL, "bucket_mb = \"auto\": buckets laid out before measuring");
    const double best = optimal_bucket_bytes(fit_, double(trainable_bytes));
    return std::max<size_t>(1, static_cast<size_t>(std::min(best, double(std::max<size_t>(trainable_bytes, 1)))));
  }

  // Members for the strategy's stats JSON: "bucket_mb": 25, or with "auto"
  // "bucket_mb": "auto", "auto": {o, w, the probes, the cap chosen for
  // `trainable_bytes` in MiB, the overhead the model predicts for it}.
  std::string json_members(size_t trainable_bytes, size_t buckets) const {
    if (!automatic_) return "\"bucket_mb\": " + number(mib_);
    std::string probes;
    for (const CommTiming& p : probes_)
      probes += (probes.empty() ? "" : ", ") + std::string("{\"bytes\": ") + number(p.bytes) +
                ", \"seconds\": " + number(p.seconds) + "}";
    const size_t cap = measured_ ? bytes_for(trainable_bytes) : 0;
    return "\"bucket_mb\": \"auto\", \"auto\": {\"o_s\": " + number(fit_.o_s) + ", \"w_bytes_per_s\": " +
           (std::isinf(fit_.w_bytes_per_s) ? std::string("null") : number(fit_.w_bytes_per_s)) + ", \"probes\": [" +
           probes + "], \"gradient_bytes\": " + std::to_string(trainable_bytes) +
           ", \"chosen_bucket_mb\": " + number(double(cap) / (1024.0 * 1024.0)) +
           ", \"buckets\": " + std::to_string(buckets) + ", \"predicted_overhead_s\": " +
           number(buckets ? predicted_overhead_s(fit_, double(trainable_bytes), double(buckets)) : 0.0) + "}";
  }

 private:
  // Shortest text that reads back as the same double ("0.001", "25").
  static std::string number(double x) {
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof text, x).ptr);
  }

  static size_t bytes_of_mib(double mib) { return cap_bytes_of_mib(mib); }

  // Rank 0 fits and stores {o, w}; everyone (rank 0 too) reads those bytes.
  void share_rank0_fit(const plugin::Host& h) {
    const ddp_host* raw = h.raw();
    if (h.rank() == 0) {
      OverheadFit fit{0, 0};
      try {
        fit = fit_overhead(probes_);
      } catch (const std::invalid_argument& e) {
        throw plugin::Failure(DDP_ERR_INTERNAL, std::string("bucket_mb = \"auto\": ") + e.what());
      }
      const double values[2] = {fit.o_s, fit.w_bytes_per_s};
      plugin::check(raw->store_set(raw->ctx, kStoreKey, values, sizeof values));
      char text[160];
      std::snprintf(text, sizeof text, "bucket_mb = \"auto\": o = %.1f us, w = %.3f GB/s (all-reduce, %d ranks)",
                    fit.o_s * 1e6, fit.w_bytes_per_s / 1e9, h.world_size());
      h.log(DDP_LOG_INFO, text);
    }
    void* data = nullptr;
    size_t bytes = 0;
    plugin::check(raw->store_get(raw->ctx, kStoreKey, &data, &bytes));
    double values[2] = {0, 0};
    const bool whole = bytes == sizeof values;
    if (whole) std::memcpy(values, data, sizeof values);
    std::free(data);
    if (!whole) throw plugin::Failure(DDP_ERR_INTERNAL, "bucket_mb = \"auto\": rank 0's fit in the store is malformed");
    fit_ = OverheadFit{values[0], values[1]};
  }

  double mib_ = kDefaultBucketMiB;
  bool automatic_ = false;
  bool measured_ = false;
  std::vector<CommTiming> probes_;  // this rank's (bytes, median seconds)
  OverheadFit fit_{0, 0};           // rank 0's
};

}  // namespace strategy
}  // namespace ddp
