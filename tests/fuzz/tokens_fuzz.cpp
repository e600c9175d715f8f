// tokens_fuzz.cpp — libFuzzer target: the token-file reader (a flat uint16
// file, memory-mapped, random windows) on arbitrary bytes. The first byte
// picks the context length (1..32), the rest is the file; a few
// micro-batches are read from two ranks of two. Besides batches, only
// ddp::Error is acceptable; anything else is a finding.
#include "config.h"
#include "data.h"
#include "device.h"
#include "error.h"
#include "memfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t context = 1 + data[0] % 32;
  MemFile file(data + 1, size - 1);
  ddp::Config config;
  config.data.kind = "tokens";
  config.data.path = file.path();
  config.data.batch_size = 4;
  config.run.seed = data[0];
  ddp::CpuDevice device;
  const ddp::DataShape shape{ddp::DataShape::Tokens, 0, 0, context, 300};
  for (int rank = 0; rank < 2; ++rank) {
    try {
      auto dataset = ddp::make_dataset(config, shape, rank, 2, device);
      for (int64_t micro : {0, 1, 1000003}) dataset->batch(micro);
    } catch (const ddp::Error&) {
    }
  }
  return 0;
}
