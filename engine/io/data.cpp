// data.cpp — see data.h.
#include "data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "safetensors.h"

namespace ddp {
namespace {

// Global row `offset` of micro-batch `micro` (batch rows each), counted
// over the run; unsigned, so that an absurdly long run wraps instead of
// overflowing.
uint64_t global_row(int64_t micro, int64_t batch, int64_t offset) {
  return uint64_t(micro) * uint64_t(batch) + uint64_t(offset);
}

// This rank's rows of one micro-batch, in buffers made once (activations).
struct LocalRows {
  LocalRows(const DataShape& s, int64_t n, Device& device) : shape(s), rows(n) {
    if (shape.kind == DataShape::Tokens) {
      ints.resize(numel_of({rows, shape.context + 1}, sizeof(int32_t)));
      return;
    }
    x = Tensor(device, {rows, shape.in}, MemCategory::Activations);
    if (shape.kind == DataShape::Regression) {
      y = Tensor(device, {rows, shape.out}, MemCategory::Activations);
    } else {
      ints.resize(size_t(rows));
    }
  }
  Batch batch() {
    Batch b;
    b.rows = rows;
    if (shape.kind == DataShape::Tokens) {
      b.tokens = ints.data();
    } else {
      b.x = x.data();
      if (shape.kind == DataShape::Regression)
        b.y = y.data();
      else
        b.labels = ints.data();
    }
    return b;
  }

  DataShape shape;
  int64_t rows;
  Tensor x;                   // [rows, in]
  Tensor y;                   // [rows, out]
  std::vector<int32_t> ints;  // tokens [rows, context + 1] or labels [rows]
};

// Rows of the whole source as host arrays; a batch copies rank r's rows of
// micro-batch m (wrapping around) into buffers accounted as activations.
class InMemory final : public Dataset {
 public:
  InMemory(const Config& config, const DataShape& shape, int rank, int world, Device& device)
      : shape_(shape),
        global_(config.data.batch_size),
        local_(global_ / world),
        first_(int64_t(rank) * local_),
        holdout_(config.data.holdout_rows),
        held_out_(config.data.held_out),
        out_(shape, local_, device) {}

  // Reads the file, then sets aside its last holdout rows: training reads
  // the others, the held-out source those.
  void fill_safetensors(const std::string& path) {
    fill_rows(path);
    if (holdout_ == 0) return;
    if (holdout_ >= rows_)
      throw ConfigError(path + ": holds " + std::to_string(rows_) +
                        " rows, and eval.holdout_rows = " + std::to_string(holdout_) + " leaves none to train on");
    window_first_ = held_out_ ? rows_ - holdout_ : 0;
    rows_ = held_out_ ? holdout_ : rows_ - holdout_;
  }
  int64_t rows() const override { return rows_; }

 private:
  void fill_rows(const std::string& path) {
    auto tensors = read_safetensors(path);
    auto need = [&](const char* name) -> const HostTensor& {
      auto it = tensors.find(name);
      if (it == tensors.end()) throw ConfigError(path + ": missing tensor '" + name + "'");
      return it->second;
    };
    if (shape_.kind == DataShape::Tokens) {
      const HostTensor& t = need("tokens");
      if (t.shape.size() != 2 || t.shape[1] != row_width() || t.shape[0] < 1)
        throw ConfigError(path + ": tensor 'tokens' has shape " + shape_string(t.shape) + ", expected [samples, " +
                          std::to_string(row_width()) + "] (context_length + 1)");
      rows_ = t.shape[0];
      tokens_ = ids(path, "tokens", t, shape_.vocab);
      return;
    }
    const HostTensor& x = need("x");
    if (x.shape.size() != 2 || x.shape[1] != shape_.in || x.shape[0] < 1)
      throw ConfigError(path + ": tensor 'x' has shape " + shape_string(x.shape) + ", expected [samples, " +
                        std::to_string(shape_.in) + "]");
    rows_ = x.shape[0];
    xs_ = x.as_floats(path, "x");
    const HostTensor& y = need("y");
    if (shape_.kind == DataShape::Regression) {
      if (y.shape != Shape{rows_, shape_.out})
        throw ConfigError(path + ": tensor 'y' has shape " + shape_string(y.shape) + ", expected " +
                          shape_string({rows_, shape_.out}));
      ys_ = y.as_floats(path, "y");
    } else {
      if (y.shape != Shape{rows_})
        throw ConfigError(path + ": tensor 'y' has shape " + shape_string(y.shape) + ", expected labels " +
                          shape_string({rows_}));
      labels_ = ids(path, "y", y, shape_.out);
    }
  }

 public:
  Batch batch(int64_t micro) override {
    const int64_t w = row_width();
    for (int64_t i = 0; i < local_; ++i) {
      const int64_t row = window_first_ + int64_t(global_row(micro, global_, first_ + i) % uint64_t(rows_));
      if (shape_.kind == DataShape::Tokens) {
        std::memcpy(&out_.ints[size_t(i * w)], &tokens_[size_t(row * w)], size_t(w) * sizeof(int32_t));
        continue;
      }
      std::memcpy(out_.x.data() + i * shape_.in, &xs_[size_t(row * shape_.in)], size_t(shape_.in) * sizeof(float));
      if (shape_.kind == DataShape::Regression)
        std::memcpy(out_.y.data() + i * shape_.out, &ys_[size_t(row * shape_.out)], size_t(shape_.out) * sizeof(float));
      else
        out_.ints[size_t(i)] = labels_[size_t(row)];
    }
    return out_.batch();
  }

 private:
  int64_t row_width() const { return shape_.kind == DataShape::Tokens ? shape_.context + 1 : 1; }

  // Integer ids (I32 or I64) checked against [0, limit).
  static std::vector<int32_t> ids(const std::string& path, const char* name, const HostTensor& t, int64_t limit) {
    const size_t n = numel_of(t.shape);
    std::vector<int32_t> out(n);
    for (size_t k = 0; k < n; ++k) {
      int64_t v;
      if (t.dtype == "I64") {
        std::memcpy(&v, t.bytes.data() + k * 8, 8);
      } else if (t.dtype == "I32") {
        int32_t v32;
        std::memcpy(&v32, t.bytes.data() + k * 4, 4);
        v = v32;
      } else {
        throw ConfigError(path + ": tensor '" + std::string(name) + "' has dtype " + t.dtype + ", expected I32 or I64");
      }
      if (v < 0 || v >= limit)
        throw ConfigError(path + ": tensor '" + std::string(name) + "' holds " + std::to_string(v) + " at element " +
                          std::to_string(k) + ", outside [0, " + std::to_string(limit) + ")");
      out[k] = int32_t(v);
    }
    return out;
  }

  DataShape shape_;
  int64_t global_;
  int64_t local_;
  int64_t first_;
  int64_t holdout_;   // rows set aside at the end
  bool held_out_;     // this source reads them
  int64_t rows_ = 0;  // rows it reads, from window_first_ on
  int64_t window_first_ = 0;
  std::vector<float> xs_;  // all rows
  std::vector<float> ys_;
  std::vector<int32_t> labels_;  // all rows
  std::vector<int32_t> tokens_;
  LocalRows out_;  // this rank's rows
};

// Random rows: global row g is drawn from (seed, stream, g) alone, so
// every step brings new rows and DDP over N ranks sees what single-process
// training sees. With data.teacher the targets follow the inputs through a
// fixed teacher drawn from the seed, the same for every stream: labels
// argmax(W x), targets W x / sqrt(in) (W [out, in] standard normal), and
// tokens that follow the previous one through a fixed permutation 3 times
// in 4 (else uniform).
class RandomRows final : public Dataset {
 public:
  RandomRows(const Config& config, const DataShape& shape, int rank, int world, Device& device)
      : shape_(shape),
        seed_(config.run.seed),
        stream_(config.data.stream),
        global_(config.data.batch_size),
        local_(global_ / world),
        first_(int64_t(rank) * local_),
        out_(shape, local_, device) {
    if (config.data.teacher) draw_teacher();
  }

  Batch batch(int64_t micro) override {
    for (int64_t i = 0; i < local_; ++i) {
      std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + stream_ * 0xd1b54a32d192ed03ull +
                          global_row(micro, global_, first_ + i));
      if (shape_.kind == DataShape::Tokens) {
        draw_tokens(rng, &out_.ints[size_t(i * (shape_.context + 1))]);
        continue;
      }
      float* x = out_.x.data() + i * shape_.in;
      std::normal_distribution<float> normal;
      for (int64_t k = 0; k < shape_.in; ++k) x[k] = normal(rng);
      if (shape_.kind == DataShape::Regression) {
        float* y = out_.y.data() + i * shape_.out;
        for (int64_t k = 0; k < shape_.out; ++k)
          y[k] = teacher_.empty() ? normal(rng) : taught(x, k) / std::sqrt(float(shape_.in));
      } else {
        out_.ints[size_t(i)] = teacher_.empty()
                                   ? std::uniform_int_distribution<int32_t>(0, int32_t(shape_.out - 1))(rng)
                                   : taught_label(x);
      }
    }
    return out_.batch();
  }

 private:
  void draw_teacher() {
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + 0x7eac4e57eac4e5ull);
    if (shape_.kind == DataShape::Tokens) {
      for (int64_t t = 0; t < shape_.vocab; ++t) next_.push_back(int32_t(t));
      for (size_t t = next_.size(); t-- > 1;) std::swap(next_[t], next_[size_t(rng() % (t + 1))]);
      return;
    }
    std::normal_distribution<float> normal;
    teacher_.resize(size_t(shape_.out * shape_.in));
    for (float& w : teacher_) w = normal(rng);
  }
  float taught(const float* x, int64_t j) const {
    float sum = 0;
    for (int64_t k = 0; k < shape_.in; ++k) sum += teacher_[size_t(j * shape_.in + k)] * x[k];
    return sum;
  }
  int32_t taught_label(const float* x) const {
    int32_t best = 0;
    for (int64_t j = 1; j < shape_.out; ++j)
      if (taught(x, j) > taught(x, best)) best = int32_t(j);
    return best;
  }
  void draw_tokens(std::mt19937_64& rng, int32_t* row) const {
    std::uniform_int_distribution<int32_t> id(0, int32_t(shape_.vocab - 1));
    for (int64_t k = 0; k <= shape_.context; ++k)
      row[k] = k > 0 && !next_.empty() && rng() % 4 != 0 ? next_[size_t(row[k - 1])] : id(rng);
  }

  DataShape shape_;
  uint64_t seed_;
  uint64_t stream_;
  int64_t global_;
  int64_t local_;
  int64_t first_;
  std::vector<float> teacher_;  // W [out, in] (data.teacher)
  std::vector<int32_t> next_;   // the tokens' permutation (data.teacher)
  LocalRows out_;               // this rank's rows
};

// A flat uint16 token file, memory-mapped.
class TokenFile final : public Dataset {
 public:
  TokenFile(const Config& config, const DataShape& shape, int rank, int world, Device& device)
      : path_(config.data.path),
        shape_(shape),
        seed_(config.run.seed + config.data.stream * 0xd1b54a32d192ed03ull),
        global_(config.data.batch_size),
        local_(global_ / world),
        first_(int64_t(rank) * local_),
        out_(shape, local_, device) {
    int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block the open
    if (fd < 0) throw ConfigError(path_ + ": cannot open token file: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw ConfigError(path_ + ": cannot open token file: not a regular file");
    }
    bytes_ = size_t(st.st_size);
    if (bytes_ % 2 != 0) {
      ::close(fd);
      throw ConfigError(path_ + ": token file has an odd size (" + std::to_string(bytes_) +
                        " bytes): not uint16 tokens");
    }
    count_ = bytes_ / 2;
    if (count_ < size_t(shape.context + 1)) {
      ::close(fd);
      throw ConfigError(path_ + ": token file holds " + std::to_string(count_) +
                        " tokens; a window needs context_length + 1 = " + std::to_string(shape.context + 1));
    }
    void* map = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) throw ConfigError(path_ + ": cannot map token file: " + std::strerror(errno));
    tokens_ = static_cast<const uint16_t*>(map);
  }
  ~TokenFile() override { ::munmap(const_cast<uint16_t*>(tokens_), bytes_); }

  Batch batch(int64_t micro) override {
    const int64_t w = shape_.context + 1;
    const uint64_t starts = count_ - uint64_t(w) + 1;
    for (int64_t i = 0; i < local_; ++i) {
      // The window of global row g depends only on (seed, g).
      const uint64_t g = global_row(micro, global_, first_ + i);
      std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ull + g);
      const uint64_t start = rng() % starts;
      for (int64_t k = 0; k < w; ++k) {
        const uint16_t id = tokens_[start + uint64_t(k)];
        if (id >= shape_.vocab)
          throw ConfigError(path_ + ": token " + std::to_string(id) + " at position " + std::to_string(start + k) +
                            " is >= vocab_size " + std::to_string(shape_.vocab));
        out_.ints[size_t(i * w + k)] = id;
      }
    }
    return out_.batch();
  }

 private:
  std::string path_;
  DataShape shape_;
  uint64_t seed_;
  int64_t global_;
  int64_t local_;
  int64_t first_;
  const uint16_t* tokens_ = nullptr;
  size_t bytes_ = 0;
  size_t count_ = 0;
  LocalRows out_;  // this rank's rows
};

}  // namespace

std::unique_ptr<Dataset> make_dataset(const Config& config, const DataShape& shape, int rank, int world,
                                      Device& device) {
  if (config.data.kind == "tokens") return std::make_unique<TokenFile>(config, shape, rank, world, device);
  if (config.data.kind == "random") return std::make_unique<RandomRows>(config, shape, rank, world, device);
  auto d = std::make_unique<InMemory>(config, shape, rank, world, device);
  d->fill_safetensors(config.data.path);
  return d;
}

std::string eval_batches_beyond(int64_t batches, int64_t batch_size, int64_t rows) {
  if (rows < 0 || batch_size < 1) return "";
  const int64_t most = std::max<int64_t>(1, (rows + batch_size - 1) / batch_size);
  if (batches <= most) return "";
  return "eval.batches = " + std::to_string(batches) + " reads " + std::to_string(batches) + " × data.batch_size " +
         std::to_string(batch_size) + " rows, and the held-out rows are " + std::to_string(rows) + ": at most " +
         std::to_string(most) + (most == 1 ? " batch" : " batches") + ", past which it reads the same rows again";
}

std::unique_ptr<Dataset> make_eval_dataset(const Config& config, const DataShape& shape, int rank, int world,
                                           Device& device) {
  Config c = config;
  c.data.stream = 1;  // random rows and token windows of their own
  if (!config.eval.path.empty()) {
    c.data.path = config.eval.path;
    c.data.kind = config.eval.kind;
    c.data.holdout_rows = 0;
    if (c.data.kind == "tokens" && shape.kind != DataShape::Tokens)
      throw ConfigError(c.data.path + ": eval.path is a token file (eval.kind), and model '" + config.model.name +
                        "' reads no tokens");
  } else {
    c.data.held_out = true;  // the rows of data.path set aside, if any
  }
  return make_dataset(c, shape, rank, world, device);
}

}  // namespace ddp
