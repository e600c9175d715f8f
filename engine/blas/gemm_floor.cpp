// gemm_floor.cpp — see gemm_floor.h.
#include "gemm_floor.h"

#include <algorithm>
#include <vector>

#include "blas_info.h"
#include "data.h"
#include "device.h"
#include "layers.h"
#include "registry.h"

namespace ddp {
namespace {

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
  set_blas_threads(config.run.threads);
  CpuDevice device;
  DataShape shape;
  auto model = build_model(config.model.name, config.model.options, device, config.run.seed, &shape);
  model->pack_gradients(device);                       // (backward's weight GEMMs add into them)
  model->set_compute_dtype(config.precision.compute);  // the step's GEMMs (a replay multiplies them unrounded)
  // Rank 0's first micro-batch of the configured data, as the run sees it.
  const std::unique_ptr<Dataset> data = make_dataset(config, shape, 0, config.run.world_size, device);
  const Batch batch = data->batch(0);
  model->forward(batch);  // once unrecorded: activations allocated, caches warm
  model->backward(1.0f, [](size_t) {});
  std::vector<layers::GemmCall> forward;
  std::vector<layers::GemmCall> backward;
  layers::record_gemms(&forward);
  model->forward(batch);
  layers::record_gemms(&backward);
  model->backward(1.0f, [](size_t) {});
  layers::record_gemms(nullptr);
  // The calls hold the model's buffers: it stays alive while they replay.
  return {{"forward_s", median_of(forward, repeats)},
          {"backward_s", median_of(backward, repeats)},
          {"gemms", {{"forward", forward.size()}, {"backward", backward.size()}}},
          {"gflop", {{"forward", gflop(forward)}, {"backward", gflop(backward)}}},
          {"kernel", blas_kernel_loaded()}};
}

}  // namespace ddp
