// safetensors.h — read and write the safetensors format (the one PyTorch
// users share weights in): an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then raw little-endian data.
// Only what the engine uses: F32 for weights and data, I32/I64 for tokens.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "atomic_file.h"  // write_file_atomically, which write_safetensors uses
#include "tensor.h"

namespace ddp {

struct HostTensor {
  std::string dtype;  // "F32", "I32", "I64", ...
  Shape shape;
  std::vector<uint8_t> bytes;
  std::vector<float> as_floats(const std::string& file, const std::string& name) const;
};

// Throws Error naming the file (and tensor) on any malformed input.
std::map<std::string, HostTensor> read_safetensors(const std::string& path);

// The same file, a tensor at a time, so that no more than one need be in
// memory (a model read unit by unit). Opening reads and checks the whole
// header, throwing as read_safetensors does for any malformed entry; a
// tensor's data is read when asked for.
class SafetensorsReader {
 public:
  struct Entry {
    std::string dtype;
    Shape shape;
    uint64_t offset = 0;  // of its data, in the file
    uint64_t bytes = 0;   // of its data, in the file
  };
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  // The entry named `name`, or null.
  const Entry* find(const std::string& name) const;
  // The same, for a tensor read as float32: throws Error naming the file
  // and the tensor where it has another dtype.
  const Entry* find_floats(const std::string& name) const;
  const std::map<std::string, Entry>& entries() const { return entries_; }
  // Tensor `name`'s data; throws Error naming the file and the tensor for
  // a name the file lacks or a short read.
  HostTensor read(const std::string& name);
  // Elements [first, first + count) of float32 tensor `name` into `out`;
  // throws Error naming the file and the tensor for one not F32, a range
  // outside it, or a short read.
  void read_floats(const std::string& name, size_t first, size_t count, float* out);

 private:
  std::string path_;
  std::ifstream in_;
  std::map<std::string, Entry> entries_;
};

// Writes float32 tensors in the given order, to a temporary name first and
// renamed into place, so a reader never sees a half-written file.
struct NamedFloats {
  std::string name;
  Shape shape;
  const float* data;
};
void write_safetensors(const std::string& path, const std::vector<NamedFloats>& tensors);

// The same file, written tensor by tensor, in any order, so that no more
// than one tensor need be in memory at once (a model held in shards): the
// header (every name and shape, in the order given) is written first,
// put(i, data) writes tensor i, and commit() renames the file into place.
// commit() throws Error naming the first tensor never put; a writer
// destroyed before commit() leaves nothing behind (AtomicFile).
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<std::pair<std::string, Shape>>& tensors);
  void put(size_t index, const float* data);
  void commit();

 private:
  std::string path_;
  AtomicFile file_;
  std::vector<std::pair<std::string, Shape>> tensors_;
  std::vector<uint64_t> offsets_;  // of each tensor's data, in the file
  std::vector<bool> put_;
};

}  // namespace ddp
