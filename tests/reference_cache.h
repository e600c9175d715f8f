// reference_cache.h — the conformance suite's single-process references
// kept in files, so that each is computed once per ctest run rather than
// once per test process (ctest runs every case in a process of its own).
//
// A reference is what the suite compares a run with: rank 0's weights after
// every step and the loss of every step. It is stored under a directory
// ($DDP_CONFORMANCE_REFERENCE_CACHE, which the build's ctest sets and a
// fixture empties at the start of each run) in a file named by a hash of
// the reference run's whole TOML document, written whole (a temporary file,
// then a rename) so that concurrent tests never read half of one. The file
// holds the TOML itself and a checksum: a file that is short, altered or
// another configuration's is refused with a sentence naming it, never used.
// encode_reference and decode_reference are pure (reference_cache_test.cpp).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ddp {
namespace reference_cache {

// step → parameter → values (harness::Snapshots).
using Snapshots = std::map<int64_t, std::vector<std::vector<float>>>;

struct Reference {
  Snapshots weights;         // rank 0's, every step
  std::vector<double> loss;  // per step
};

inline const std::string kMagic = "ddp-conformance-reference 1\n";

// FNV-1a, 64 bits. Pure.
inline uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The file name of the reference of `toml`. Pure.
inline std::string file_name(const std::string& toml) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(toml)));
  return std::string(hex) + ".ref";
}

namespace detail {
template <typename T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
// Reads what encode_reference wrote, saying what ran short.
struct Reader {
  const std::string& bytes;
  size_t at = 0;
  template <typename T>
  T get(const char* what) {
    T value;
    take(&value, sizeof value, what);
    return value;
  }
  void take(void* to, uint64_t n, const char* what) {
    if (n > bytes.size() - at) throw std::runtime_error(std::string("it ends inside ") + what);
    if (n == 0) return;  // `to` may be an empty vector's data(): NULL, which memcpy may not take
    std::memcpy(to, bytes.data() + at, n);
    at += n;
  }
};
}  // namespace detail

// The file's bytes: the magic line, the TOML, the losses, every step's
// weights, and a checksum of all that precedes it. Pure.
inline std::string encode_reference(const std::string& toml, const Reference& ref) {
  std::string out = kMagic;
  detail::put(out, uint64_t(toml.size()));
  out += toml;
  detail::put(out, uint64_t(ref.loss.size()));
  for (double l : ref.loss) detail::put(out, l);
  detail::put(out, uint64_t(ref.weights.size()));
  for (const auto& [step, params] : ref.weights) {
    detail::put(out, step);
    detail::put(out, uint64_t(params.size()));
    for (const std::vector<float>& v : params) {
      detail::put(out, uint64_t(v.size()));
      out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
    }
  }
  detail::put(out, fnv1a(out));
  return out;
}

// The reference in `bytes`, written for `toml`; on anything else, the
// reason in *why and nothing. Pure.
inline std::optional<Reference> decode_reference(const std::string& bytes, const std::string& toml,
                                                 std::string* why) {
  try {
    if (bytes.size() < kMagic.size() + sizeof(uint64_t) || bytes.compare(0, kMagic.size(), kMagic) != 0)
      throw std::runtime_error("it does not start as a reference file does");
    uint64_t sum;
    std::memcpy(&sum, bytes.data() + bytes.size() - sizeof sum, sizeof sum);
    if (sum != fnv1a(bytes.substr(0, bytes.size() - sizeof sum)))
      throw std::runtime_error("its checksum does not match its contents (short or altered)");
    const std::string body = bytes.substr(0, bytes.size() - sizeof sum);
    detail::Reader in{body, kMagic.size()};
    std::string stored(in.get<uint64_t>("the configuration's length"), '\0');
    in.take(stored.data(), stored.size(), "the configuration");
    if (stored != toml) throw std::runtime_error("it holds the reference of another configuration");
    Reference ref;
    ref.loss.resize(in.get<uint64_t>("the count of losses"));
    in.take(ref.loss.data(), ref.loss.size() * sizeof(double), "the losses");
    for (uint64_t steps = in.get<uint64_t>("the count of steps"); steps > 0; --steps) {
      auto& params = ref.weights[in.get<int64_t>("a step")];
      params.resize(in.get<uint64_t>("a count of parameters"));
      for (std::vector<float>& v : params) {
        v.resize(in.get<uint64_t>("a parameter's length"));
        in.take(v.data(), v.size() * sizeof(float), "a parameter's values");
      }
    }
    if (in.at != in.bytes.size()) throw std::runtime_error("it holds more than one reference");
    return ref;
  } catch (const std::exception& e) {  // std::length_error too: a count no memory holds
    *why = e.what();
    return std::nullopt;
  }
}

// The reference of `toml` in `dir`, if one was written; a file there that
// is not a whole reference of `toml` throws, naming it.
inline std::optional<Reference> load(const std::string& dir, const std::string& toml) {
  const std::string path = dir + "/" + file_name(toml);
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string why;
  std::optional<Reference> ref = decode_reference(bytes, toml, &why);
  if (!ref)
    throw std::runtime_error("the conformance reference cache file " + path + " is refused: " + why +
                             "; remove it (ctest empties " + dir + " at the start of every run)");
  return ref;
}

// Writes the reference of `toml` into `dir` whole: a temporary file of this
// process's, then a rename over any other process's copy.
inline void store(const std::string& dir, const std::string& toml, const Reference& ref) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // another test may create it at the same moment
  if (!std::filesystem::is_directory(dir))
    throw std::runtime_error("the conformance reference cache directory " + dir + " cannot be made: " + ec.message());
  const std::string path = dir + "/" + file_name(toml);
  const std::string partial = path + ".partial." + std::to_string(getpid());
  const std::string bytes = encode_reference(toml, ref);
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out.flush()) throw std::runtime_error("the conformance reference cache file " + partial + " cannot be written");
  }
  std::filesystem::rename(partial, path);
}

}  // namespace reference_cache
}  // namespace ddp
