// safetensors.cpp — see safetensors.h.
#include "safetensors.h"

#include "atomic_file.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace ddp {
namespace {

// The format caps its JSON header at 100 MB (huggingface/safetensors).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

size_t dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

// An array of integers (a shape: any int64, its checks follow; the data
// offsets: unsigned). Anything else is refused naming `what`: a float among
// them too, which nlohmann's get<> would convert (undefined out of range;
// the fuzzer found 2e+50 in a shape).
template <typename Int>
std::vector<Int> integers(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) throw ConfigError(std::string(what) + " is not an array");
  std::vector<Int> out;
  for (const auto& v : j) {
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<Int>::max())
                                             : v.is_number_integer() && std::is_signed_v<Int>;
    if (!fits)
      throw ConfigError(std::string(what) + " holds " + v.dump() + ", not an integer of " +
                        (std::is_signed_v<Int> ? "64 bits" : "64 bits from 0"));
    out.push_back(v.get<Int>());
  }
  return out;
}

}  // namespace

std::vector<float> HostTensor::as_floats(const std::string& file, const std::string& name) const {
  if (dtype != "F32") throw ConfigError(file + ": tensor '" + name + "' has dtype " + dtype + ", expected F32");
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  // Checked before the open: opening a FIFO would block until a writer came.
  if (!std::filesystem::is_regular_file(path, ec)) throw ConfigError(path + ": cannot open safetensors file");
  in_.open(path, std::ios::binary);
  if (!in_) throw ConfigError(path + ": cannot open safetensors file");
  in_.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in_.tellg());
  in_.seekg(0);
  uint8_t len_bytes[8];
  if (file_size < 8 || !in_.read(reinterpret_cast<char*>(len_bytes), 8))
    throw ConfigError(path + ": not a safetensors file (shorter than its 8-byte header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | len_bytes[i];
  if (header_len > file_size - 8)
    throw ConfigError(path + ": not a safetensors file (header length " + std::to_string(header_len) +
                      " exceeds the file)");
  if (header_len > kMaxHeaderBytes)
    throw ConfigError(path + ": not a safetensors file (header length " + std::to_string(header_len) +
                      " is over the format's 100 MB)");
  std::string header(header_len, '\0');
  in_.read(header.data(), static_cast<std::streamsize>(header_len));
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    throw ConfigError(path + ": malformed safetensors header: " + e.what());
  }
  if (!doc.is_object()) throw ConfigError(path + ": malformed safetensors header: not a JSON object");
  for (auto& [name, info] : doc.items()) {
    if (name == "__metadata__") continue;
    try {
      Entry t;
      t.dtype = info.at("dtype").get<std::string>();
      t.shape = integers<int64_t>(info.at("shape"), "shape");
      const auto offsets = integers<uint64_t>(info.at("data_offsets"), "data_offsets");
      size_t esize = dtype_size(t.dtype);
      if (esize == 0) throw ConfigError("unknown dtype " + t.dtype);
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        throw ConfigError("data_offsets out of range");
      if (offsets[1] - offsets[0] != numel_of(t.shape, esize) * esize)
        throw ConfigError("data_offsets do not match shape " + shape_string(t.shape));
      t.offset = data_start + offsets[0];
      t.bytes = offsets[1] - offsets[0];
      entries_.emplace(name, std::move(t));
    } catch (const std::exception& e) {
      throw ConfigError(path + ": tensor '" + name + "': " + e.what());
    }
  }
}

const SafetensorsReader::Entry* SafetensorsReader::find(const std::string& name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const SafetensorsReader::Entry* SafetensorsReader::find_floats(const std::string& name) const {
  const Entry* e = find(name);
  if (e && e->dtype != "F32")
    throw ConfigError(path_ + ": tensor '" + name + "' has dtype " + e->dtype + ", expected F32");
  return e;
}

HostTensor SafetensorsReader::read(const std::string& name) {
  const Entry* e = find(name);
  if (!e) throw ConfigError(path_ + ": no tensor '" + name + "'");
  HostTensor t;
  t.dtype = e->dtype;
  t.shape = e->shape;
  t.bytes.resize(e->bytes);
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(e->offset));
  in_.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!in_) throw ConfigError(path_ + ": tensor '" + name + "': short read");
  return t;
}

void SafetensorsReader::read_floats(const std::string& name, size_t first, size_t count, float* out) {
  const Entry* e = find_floats(name);
  if (!e) throw ConfigError(path_ + ": no tensor '" + name + "'");
  const size_t n = e->bytes / sizeof(float);
  if (first > n || count > n - first)
    throw ConfigError(path_ + ": tensor '" + name + "': elements [" + std::to_string(first) + ", " +
                      std::to_string(first + count) + ") are outside its " + std::to_string(n));
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(e->offset + first * sizeof(float)));
  in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in_) throw ConfigError(path_ + ": tensor '" + name + "': short read");
}

std::map<std::string, HostTensor> read_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::map<std::string, HostTensor> out;
  for (const auto& [name, entry] : reader.entries()) out.emplace(name, reader.read(name));
  return out;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, const std::vector<std::pair<std::string, Shape>>& tensors)
    : path_(path), file_(path), tensors_(tensors), put_(tensors.size(), false) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, shape] : tensors_) {
    const uint64_t bytes = numel_of(shape) * sizeof(float);
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offsets_.push_back(offset);
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data section 8-byte aligned
  std::string start(8, '\0');
  for (int i = 0; i < 8; ++i) start[i] = static_cast<char>((uint64_t{h.size()} >> (8 * i)) & 0xff);
  start += h;
  file_.write(0, start.data(), start.size());
  for (uint64_t& o : offsets_) o += start.size();
}

void SafetensorsWriter::put(size_t index, const float* data) {
  if (index >= tensors_.size())
    throw Error(path_ + ": tensor " + std::to_string(index) + " of " + std::to_string(tensors_.size()) + " written");
  file_.write(offsets_.at(index), data, numel_of(tensors_[index].second) * sizeof(float));
  put_[index] = true;
}

void SafetensorsWriter::commit() {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (!put_[i]) throw Error(path_ + ": tensor '" + tensors_[i].first + "' was never written");
  file_.commit();
}

void write_safetensors(const std::string& path, const std::vector<NamedFloats>& tensors) {
  std::vector<std::pair<std::string, Shape>> names;
  for (const NamedFloats& t : tensors) names.emplace_back(t.name, t.shape);
  SafetensorsWriter writer(path, names);
  for (size_t i = 0; i < tensors.size(); ++i) writer.put(i, tensors[i].data);
  writer.commit();
}

}  // namespace ddp
