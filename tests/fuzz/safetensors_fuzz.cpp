// safetensors_fuzz.cpp — libFuzzer target: the safetensors reader on
// arbitrary bytes (header length, JSON header, dtypes, shapes, offsets).
// Besides tensors, only ddp::Error is acceptable; anything else is a
// finding.
#include "error.h"
#include "memfile.h"
#include "safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFile file(data, size);
  try {
    ddp::read_safetensors(file.path());
  } catch (const ddp::Error&) {
  }
  return 0;
}
