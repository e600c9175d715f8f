// gemm_floor.cpp — see gemm_floor.h.
#include "gemm_floor.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "device.h"
#include "layers.h"
#include "registry.h"

namespace ddp {
namespace {

// Random inputs of the model's data shape, `rows` rows.
struct RandomBatch {
  std::vector<float> x, y;
  std::vector<int32_t> ints;
  Batch batch;
  RandomBatch(const DataShape& s, int64_t rows) {
    std::mt19937 rng(1);
    batch.rows = rows;
    if (s.kind == DataShape::Tokens) {
      ints.resize(size_t(rows * (s.context + 1)));
      for (int32_t& t : ints) t = int32_t(rng() % uint32_t(s.vocab));
      batch.tokens = ints.data();
      return;
    }
    std::normal_distribution<float> normal;
    x.resize(size_t(rows * s.in));
    for (float& v : x) v = normal(rng);
    batch.x = x.data();
    if (s.kind == DataShape::Regression) {
      y.resize(size_t(rows * s.out));
      for (float& v : y) v = normal(rng);
      batch.y = y.data();
    } else {
      ints.resize(size_t(rows));
      for (int32_t& l : ints) l = int32_t(rng() % uint32_t(s.out));
      batch.labels = ints.data();
    }
  }
};

double gflop(const std::vector<layers::GemmCall>& calls) {
  double flop = 0.0;
  for (const layers::GemmCall& g : calls) flop += 2.0 * double(g.m) * double(g.n) * double(g.k);
  return flop / 1e9;
}

// The median of `repeats` replays after one warm-up: the statistic the
// step's times are summarised by (bench_gemm_floor.py), so that neither
// side is a best case against the other's typical one.
double median_of(const std::vector<layers::GemmCall>& calls, int repeats) {
  layers::replay_gemms(calls);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) seconds.push_back(layers::replay_gemms(calls));
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  return n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
}

}  // namespace

nlohmann::json gemm_floor(const Config& config, int repeats) {
  layers::set_blas_threads(config.run.threads);
  CpuDevice device;
  DataShape shape;
  auto model = build_model(config.model.name, config.model.options, device, config.run.seed, &shape);
  const RandomBatch data(shape, config.data.batch_size / config.run.world_size);
  model->forward(data.batch);  // once unrecorded: activations allocated, caches warm
  model->backward(1.0f, [](size_t) {});
  std::vector<layers::GemmCall> forward, backward;
  layers::record_gemms(&forward);
  model->forward(data.batch);
  layers::record_gemms(&backward);
  model->backward(1.0f, [](size_t) {});
  layers::record_gemms(nullptr);
  // The calls hold the model's buffers: it stays alive while they replay.
  return {{"forward_s", median_of(forward, repeats)},
          {"backward_s", median_of(backward, repeats)},
          {"gemms", {{"forward", forward.size()}, {"backward", backward.size()}}},
          {"gflop", {{"forward", gflop(forward)}, {"backward", gflop(backward)}}},
          {"kernel", layers::blas_kernel_loaded()}};
}

}  // namespace ddp
