// safetensors_test.cpp — the safetensors reader and writer: round trips
// (names, shapes, bit-exact values), the 8-byte aligned data section, atomic
// writes, the committed toy_data fixture, and every malformed-input refusal
// with its exact message.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "safetensors.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(file[i]);
  return n;
}

// A file made of an 8-byte little-endian length, `header` and `data`.
std::string make_file(const std::string& header, const std::string& data = "",
                      uint64_t declared = UINT64_MAX) {
  uint64_t len = declared == UINT64_MAX ? header.size() : declared;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + header + data;
}

// The message read_safetensors throws, or "" if it reads the file.
std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddp_safetensors_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

// ---------------------------------------------------------------- round trip

TEST_F(Safetensors, RoundTripKeepsNamesShapesAndBits) {
  std::vector<float> a(6), b(24), c(1), d(7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::sin(static_cast<float>(i)) * 1e3f;
  c[0] = 3.14159265f;
  // Values that only survive a bit-exact copy.
  d = {-0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
       -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
       std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()};
  const std::vector<NamedFloats> tensors = {
      {"fc1.weight", {2, 3}, a.data()},
      {"layers.0.attn/q", {2, 3, 4}, b.data()},
      {"scalar", {}, c.data()},
      {"special", {7}, d.data()},
  };
  const std::string file = path("model.safetensors");
  write_safetensors(file, tensors);

  auto read = read_safetensors(file);
  ASSERT_EQ(read.size(), tensors.size());  // __metadata__ is not a tensor
  for (const auto& t : tensors) {
    SCOPED_TRACE(t.name);
    auto it = read.find(t.name);
    ASSERT_NE(it, read.end());
    EXPECT_EQ(it->second.dtype, "F32");
    EXPECT_EQ(it->second.shape, t.shape);
    const size_t n = numel_of(t.shape);
    ASSERT_EQ(it->second.bytes.size(), n * sizeof(float));
    EXPECT_EQ(std::memcmp(it->second.bytes.data(), t.data, n * sizeof(float)), 0);
    std::vector<float> floats = it->second.as_floats(file, t.name);
    ASSERT_EQ(floats.size(), n);
    EXPECT_EQ(std::memcmp(floats.data(), t.data, n * sizeof(float)), 0);
  }
  EXPECT_EQ(read.at("layers.0.attn/q").as_floats(file, "q")[5], b[5]);
  EXPECT_TRUE(std::isnan(read.at("special").as_floats(file, "special")[1]));
}

TEST_F(Safetensors, EmptyTensorRoundTrips) {
  float dummy = 1.0f;
  std::vector<float> after = {5.0f, 6.0f};
  write_safetensors(path("e.safetensors"),
                    {{"empty", {3, 0}, &dummy}, {"after", {2}, after.data()}});
  auto read = read_safetensors(path("e.safetensors"));
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read.at("empty").shape, (Shape{3, 0}));
  EXPECT_TRUE(read.at("empty").bytes.empty());
  EXPECT_EQ(read.at("after").as_floats("f", "after"), after);
}

TEST_F(Safetensors, DataSectionIsEightByteAligned) {
  // Header lengths vary with the name length, so some of these need padding.
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  int padded = 0;
  for (int len = 1; len <= 16; ++len) {
    const std::string name(static_cast<size_t>(len), 'n');
    const std::string file = path("align" + std::to_string(len) + ".safetensors");
    write_safetensors(file, {{name, {3}, v.data()}});
    const std::string bytes = read_bytes(file);
    ASSERT_GE(bytes.size(), 8u);
    const uint64_t n = header_length(bytes);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len << ", header length " << n;
    EXPECT_EQ(bytes.size(), 8 + n + 3 * sizeof(float)) << len;
    // Padding is trailing spaces after the JSON object.
    const std::string header = bytes.substr(8, n);
    const size_t close = header.find_last_of('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    if (close + 1 < header.size()) ++padded;
    auto read = read_safetensors(file);
    EXPECT_EQ(read.at(name).as_floats(file, name), v);
  }
  EXPECT_GT(padded, 0) << "no header needed padding: the alignment check proved nothing";
}

TEST_F(Safetensors, WriteLeavesNoTemporaryFile) {
  std::vector<float> v(100, 0.5f);
  write_safetensors(path("w.safetensors"), {{"v", {10, 10}, v.data()}});
  EXPECT_EQ(listing(), std::vector<std::string>{"w.safetensors"});
  // Overwriting an existing file replaces it, still with nothing left over.
  v.assign(4, 2.0f);
  write_safetensors(path("w.safetensors"), {{"v", {4}, v.data()}});
  EXPECT_EQ(listing(), std::vector<std::string>{"w.safetensors"});
  EXPECT_EQ(read_safetensors(path("w.safetensors")).at("v").shape, Shape{4});
}

TEST_F(Safetensors, WriteIntoAMissingDirectoryFails) {
  std::vector<float> v(1, 1.0f);
  const std::string file = path("no/such/dir/x.safetensors");
  try {
    write_safetensors(file, {{"v", {1}, v.data()}});
    ADD_FAILURE() << "write_safetensors did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), file + ": cannot write file (No such file or directory)");
  }
}

TEST_F(Safetensors, WriteFileAtomically) {
  write_file_atomically(path("summary.json"), "{\"a\": 1}\n");
  EXPECT_EQ(read_bytes(path("summary.json")), "{\"a\": 1}\n");
  write_file_atomically(path("summary.json"), "x");
  EXPECT_EQ(read_bytes(path("summary.json")), "x");
  EXPECT_EQ(listing(), std::vector<std::string>{"summary.json"});
}

TEST_F(Safetensors, WriterPutsTensorsInAnyOrderAsTheWholeWriteDoes) {
  std::vector<float> a(6), b(5, -2.5f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * float(i);
  write_safetensors(path("whole.safetensors"), {{"a", {2, 3}, a.data()}, {"empty", {0}, nullptr}, {"b", {5}, b.data()}});
  SafetensorsWriter writer(path("parts.safetensors"), {{"a", {2, 3}}, {"empty", {0}}, {"b", {5}}});
  writer.put(2, b.data());  // the order a strategy's units may give them in
  writer.put(1, nullptr);
  EXPECT_FALSE(fs::exists(path("parts.safetensors"))) << "only its temporary, until commit";
  writer.put(0, a.data());
  writer.commit();
  EXPECT_EQ(read_bytes(path("parts.safetensors")), read_bytes(path("whole.safetensors")));
}

TEST_F(Safetensors, WriterRefusesATensorNeverPutAndLeavesNothing) {
  std::vector<float> a(3, 1.0f);
  {
    SafetensorsWriter writer(path("w.safetensors"), {{"a", {3}}, {"layers.1.w", {3}}});
    writer.put(0, a.data());
    try {
      writer.commit();
      ADD_FAILURE() << "commit did not throw";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), path("w.safetensors") + ": tensor 'layers.1.w' was never written");
    }
  }
  {
    SafetensorsWriter abandoned(path("w.safetensors"), {{"a", {3}}});  // a rank that failed mid-write
    abandoned.put(0, a.data());
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(Safetensors, ReaderReadsOneTensorAtATimeInAnyOrder) {
  std::vector<float> a(6), b(5, -2.5f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * float(i);
  write_safetensors(path("w.safetensors"), {{"a", {2, 3}, a.data()}, {"b", {5}, b.data()}});
  SafetensorsReader reader(path("w.safetensors"));
  ASSERT_NE(reader.find("a"), nullptr);
  EXPECT_EQ(reader.find("a")->shape, (Shape{2, 3}));
  EXPECT_EQ(reader.find("b")->dtype, "F32");
  EXPECT_EQ(reader.find("c"), nullptr);
  EXPECT_EQ(reader.read("b").as_floats("w", "b"), b);  // the later one first, then back
  EXPECT_EQ(reader.read("a").as_floats("w", "a"), a);
  EXPECT_EQ(reader.read("b").as_floats("w", "b"), b);
  std::vector<float> slice(3);
  reader.read_floats("a", 2, 3, slice.data());  // a slice: what a rank's shard of optimizer state reads
  EXPECT_EQ(slice, (std::vector<float>{1.0f, 1.5f, 2.0f}));
  try {
    reader.read_floats("a", 4, 3, slice.data());
    ADD_FAILURE() << "a slice past the end did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path("w.safetensors") + ": tensor 'a': elements [4, 7) are outside its 6");
  }
  try {
    reader.read("c");
    ADD_FAILURE() << "read of a missing tensor did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path("w.safetensors") + ": no tensor 'c'");
  }
}

TEST_F(Safetensors, ReaderRefusesAMalformedEntryWhenItOpens) {
  write_bytes(path("bad.safetensors"),
              make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,8]}})", std::string(8, '\0')));
  try {
    SafetensorsReader reader(path("bad.safetensors"));
    ADD_FAILURE() << "opening did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path("bad.safetensors") + ": tensor 'b': data_offsets do not match shape [2]");
  }
}

// ------------------------------------------------------------------- fixture

TEST(SafetensorsFixture, ToyData) {
  const std::string file = DDP_TEST_DATA_DIR "/fixtures/toy_data.safetensors";
  auto t = read_safetensors(file);
  ASSERT_EQ(t.size(), 2u);
  ASSERT_EQ(t.count("x"), 1u);
  ASSERT_EQ(t.count("y"), 1u);
  EXPECT_EQ(t.at("x").dtype, "F32");
  EXPECT_EQ(t.at("y").dtype, "F32");
  EXPECT_EQ(t.at("x").shape, (Shape{20, 10}));
  EXPECT_EQ(t.at("y").shape, (Shape{20, 5}));
  auto x = t.at("x").as_floats(file, "x");
  auto y = t.at("y").as_floats(file, "y");
  ASSERT_EQ(x.size(), 200u);
  ASSERT_EQ(y.size(), 100u);
  // torch.manual_seed(0); torch.randn(20, 10) starts with these.
  EXPECT_NEAR(x[0], -1.1258398f, 1e-6);
  EXPECT_NEAR(x[1], -1.1523602f, 1e-6);
  EXPECT_NEAR(x[2], -0.2505786f, 1e-6);
  for (float v : x) EXPECT_TRUE(std::isfinite(v));
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

// -------------------------------------------------------------------- errors

TEST_F(Safetensors, MissingFile) {
  const std::string file = path("absent.safetensors");
  EXPECT_EQ(read_error(file), file + ": cannot open safetensors file");
}

TEST_F(Safetensors, ShorterThanTheLengthField) {
  for (size_t n : {0, 1, 7}) {
    const std::string file = path("short" + std::to_string(n));
    write_bytes(file, std::string(n, '\x01'));
    EXPECT_EQ(read_error(file),
              file + ": not a safetensors file (shorter than its 8-byte header length)")
        << n << " bytes";
  }
}

TEST_F(Safetensors, HeaderLengthBeyondTheFile) {
  const std::string file = path("long");
  write_bytes(file, make_file("{}", "", 100));  // 8 + 2 bytes, claims 100
  EXPECT_EQ(read_error(file), file + ": not a safetensors file (header length 100 exceeds the file)");
  // A huge length (e.g. a text file's first 8 bytes) does not wrap around.
  write_bytes(file, "hello, world, this is not a tensor file");
  EXPECT_EQ(read_error(file), file + ": not a safetensors file (header length " +
                                  std::to_string(header_length("hello, w")) + " exceeds the file)");
}

TEST_F(Safetensors, HeaderLengthExactlyTheFileIsFine) {
  const std::string file = path("exact");
  write_bytes(file, make_file("{}      "));
  EXPECT_EQ(read_error(file), "");
  EXPECT_TRUE(read_safetensors(file).empty());
}

TEST_F(Safetensors, MalformedJson) {
  const std::string file = path("bad_json");
  write_bytes(file, make_file("{\"x\": "));
  EXPECT_EQ(read_error(file),
            file + ": malformed safetensors header: [json.exception.parse_error.101] parse error "
                   "at line 1, column 7: syntax error while parsing value - unexpected end of "
                   "input; expected '[', '{', or a literal");
}

TEST_F(Safetensors, DataOffsetsNotMatchingShape) {
  const std::string file = path("mismatch");
  // [2, 3] F32 needs 24 bytes; the offsets give 20.
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                              std::string(24, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': data_offsets do not match shape [2, 3]");
}

// A shape or offsets that are not whole numbers: refused by name, never
// converted (the fuzzer found 2e+50 in a shape: undefined as an integer).
TEST_F(Safetensors, ShapesAndOffsetsAreWholeNumbers) {
  const std::string file = path("floats");
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":[2e+50],"data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': shape holds 2e+50, not an integer of 64 bits");
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})",
                              std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': shape holds 9223372036854775808, not an integer of 64 bits");
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': data_offsets holds 4.0, not an integer of 64 bits from 0");
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,4]}})", std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': data_offsets holds -4, not an integer of 64 bits from 0");
  write_bytes(file, make_file(R"({"x":{"dtype":"F32","shape":3,"data_offsets":[0,4]}})", std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'x': shape is not an array");
}

TEST_F(Safetensors, DataOffsetsOutOfRange) {
  const std::string file = path("range");
  write_bytes(file, make_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                              std::string(12, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'w': data_offsets out of range");
  write_bytes(file, make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                              std::string(12, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'w': data_offsets out of range");
}

TEST_F(Safetensors, UnknownDtype) {
  const std::string file = path("dtype");
  write_bytes(file, make_file(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})",
                              std::string(4, '\0')));
  EXPECT_EQ(read_error(file), file + ": tensor 'w': unknown dtype F8_E4M3");
}

TEST_F(Safetensors, OtherDtypesReadButAreNotFloats) {
  const std::string file = path("ints");
  std::string data(24, '\0');
  data[0] = 7;
  write_bytes(file, make_file(R"({"tok":{"dtype":"I64","shape":[3],"data_offsets":[0,24]}})", data));
  auto t = read_safetensors(file);
  EXPECT_EQ(t.at("tok").dtype, "I64");
  EXPECT_EQ(t.at("tok").shape, Shape{3});
  ASSERT_EQ(t.at("tok").bytes.size(), 24u);
  EXPECT_EQ(t.at("tok").bytes[0], 7);
  try {
    t.at("tok").as_floats(file, "tok");
    ADD_FAILURE() << "as_floats accepted I64";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), file + ": tensor 'tok' has dtype I64, expected F32");
  }
}

TEST_F(Safetensors, MissingFieldNamesTheTensor) {
  const std::string file = path("nofield");
  write_bytes(file, make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')));
  const std::string msg = read_error(file);
  EXPECT_EQ(msg.rfind(file + ": tensor 'w': ", 0), 0u) << msg;
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
}

// Hostile files (issue 13): a shape whose product wraps around, a negative
// dimension, a header over the format's cap or not an object, a directory.
TEST_F(Safetensors, AShapeWhoseSizeWrapsAroundIsRefused) {
  const std::string file = path("wrap");
  // 2^62 * 4 floats of 4 bytes: 2^66 bytes, which wraps to 0 in 64 bits.
  write_bytes(file, make_file(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})"));
  EXPECT_EQ(read_error(file), file + ": tensor 'w': shape [4611686018427387904, 4] holds more bytes than this "
                                     "machine can address");
  write_bytes(file, make_file(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})"));
  EXPECT_EQ(read_error(file), file + ": tensor 'w': shape [-1, 4] has a negative dimension");
}

TEST_F(Safetensors, AHeaderOverTheFormatsCapOrNotAnObjectIsRefused) {
  const std::string file = path("cap");
  write_bytes(file, make_file("[1]", std::string(8, '\0')));
  EXPECT_EQ(read_error(file), file + ": malformed safetensors header: not a JSON object");
  write_bytes(file, make_file(std::string(100'000'001, ' ')));
  EXPECT_EQ(read_error(file),
            file + ": not a safetensors file (header length 100000001 is over the format's 100 MB)");
}

TEST_F(Safetensors, ADirectoryIsNotAFile) {
  EXPECT_EQ(read_error(dir_), dir_ + ": cannot open safetensors file");
}

// Opening a FIFO with no writer would block: it is refused before that.
TEST_F(Safetensors, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(read_error(fifo), fifo + ": cannot open safetensors file");
}

}  // namespace
}  // namespace ddp