// reference_cache_test.cpp — the conformance suite's reference files
// (reference_cache.h): a stored reference reads back bit for bit; a file
// that is short, altered, or another configuration's is refused by name.
#include "reference_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "harness.h"

namespace ddp {
namespace {

using reference_cache::Reference;

// Values whose bits a careless round trip loses: -0, a subnormal, NaN with a
// payload, infinities, the extremes.
Reference awkward_reference() {
  Reference ref;
  const float nan_payload = [] {
    uint32_t bits = 0x7fc01234u;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }();
  for (int64_t step = -1; step <= 5; ++step)
    ref.weights[step] = {{-0.0f, std::numeric_limits<float>::denorm_min(), nan_payload, float(step) / 3},
                         {},
                         {INFINITY, -INFINITY, std::numeric_limits<float>::max(), 1e-7f * float(step)}};
  ref.loss = {2.302585092994046, -0.0, std::numeric_limits<double>::denorm_min(), 1.0 / 3};
  return ref;
}

// Whether the n bytes at a and b are the same (an empty vector's data() may
// be NULL, which memcmp may not take even for no bytes).
bool same_bytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

bool same_bits(const Reference& a, const Reference& b) {
  if (a.loss.size() != b.loss.size() || a.weights.size() != b.weights.size()) return false;
  if (!same_bytes(a.loss.data(), b.loss.data(), a.loss.size() * sizeof(double))) return false;
  for (const auto& [step, params] : a.weights) {
    const auto it = b.weights.find(step);
    if (it == b.weights.end() || it->second.size() != params.size()) return false;
    for (size_t p = 0; p < params.size(); ++p)
      if (params[p].size() != it->second[p].size() ||
          !same_bytes(params[p].data(), it->second[p].data(), params[p].size() * sizeof(float)))
        return false;
  }
  return true;
}

const std::string kToml = "[run]\nsteps = 5\n[model]\nname = \"toy\"\n";

TEST(ReferenceCache, ADecodedReferenceHasEveryBitOfTheEncodedOne) {
  const Reference ref = awkward_reference();
  std::string why;
  const std::optional<Reference> back = reference_cache::decode_reference(
      reference_cache::encode_reference(kToml, ref), kToml, &why);
  ASSERT_TRUE(back) << why;
  EXPECT_TRUE(same_bits(ref, *back));
  EXPECT_FALSE(same_bits(ref, Reference{}));  // the comparison itself sees a difference
}

TEST(ReferenceCache, AStoredReferenceIsLoadedWithEveryBitAndOnlyForItsConfiguration) {
  harness::TempDir dir("ddp-reference-cache");
  const std::string cache = dir.path + "/references";  // made by the first store
  EXPECT_FALSE(reference_cache::load(cache, kToml)) << "nothing stored yet";
  const Reference ref = awkward_reference();
  reference_cache::store(cache, kToml, ref);
  const std::optional<Reference> back = reference_cache::load(cache, kToml);
  ASSERT_TRUE(back);
  EXPECT_TRUE(same_bits(ref, *back));
  EXPECT_FALSE(reference_cache::load(cache, kToml + "seed = 8\n")) << "another configuration's is another file";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(cache)) {
    EXPECT_EQ(entry.path().filename().string(), reference_cache::file_name(kToml)) << "no temporary file left";
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(ReferenceCache, FileNamesAreTheConfigurationsHash) {
  EXPECT_EQ(reference_cache::fnv1a(""), 14695981039346656037ull);
  EXPECT_EQ(reference_cache::fnv1a("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(reference_cache::file_name("a"), "af63dc4c8601ec8c.ref");
  EXPECT_NE(reference_cache::file_name(kToml), reference_cache::file_name(kToml + " "));
}

TEST(ReferenceCache, EveryShortFileIsRefusedSayingWhy) {
  const std::string bytes = reference_cache::encode_reference(kToml, awkward_reference());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string why;
    EXPECT_FALSE(reference_cache::decode_reference(bytes.substr(0, n), kToml, &why)) << n << " bytes";
    EXPECT_FALSE(why.empty()) << n << " bytes";
  }
  std::string why;
  EXPECT_FALSE(reference_cache::decode_reference(bytes.substr(0, bytes.size() - 1), kToml, &why));
  EXPECT_EQ(why, "its checksum does not match its contents (short or altered)");
  EXPECT_FALSE(reference_cache::decode_reference(bytes.substr(0, 5), kToml, &why));
  EXPECT_EQ(why, "it does not start as a reference file does");
}

TEST(ReferenceCache, EveryChangedByteIsRefused) {
  const std::string bytes = reference_cache::encode_reference(kToml, awkward_reference());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string changed = bytes;
    changed[i] = char(changed[i] ^ 0x01);
    std::string why;
    EXPECT_FALSE(reference_cache::decode_reference(changed, kToml, &why)) << "byte " << i;
  }
}

TEST(ReferenceCache, AnotherConfigurationsReferenceIsRefused) {
  std::string why;
  EXPECT_FALSE(reference_cache::decode_reference(reference_cache::encode_reference(kToml, awkward_reference()),
                                                 kToml + "seed = 8\n", &why));
  EXPECT_EQ(why, "it holds the reference of another configuration");
}

TEST(ReferenceCache, ACorruptFileIsRefusedNamingItNotRecomputedSilently) {
  harness::TempDir dir("ddp-reference-cache");
  reference_cache::store(dir.path, kToml, awkward_reference());
  const std::string path = dir.path + "/" + reference_cache::file_name(kToml);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  try {
    reference_cache::load(dir.path, kToml);
    ADD_FAILURE() << "a short file was used";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "the conformance reference cache file " + path +
                                         " is refused: its checksum does not match its contents (short or altered)"
                                         "; remove it (ctest empties " + dir.path +
                                         " at the start of every run)");
  }
}

}  // namespace
}  // namespace ddp
