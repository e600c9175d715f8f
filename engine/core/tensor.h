// tensor.h — the engine's one tensor type: a float32 buffer on a Device with
// a shape, owned (freed through the device that made it) and move-only; or
// a view of part of another Tensor's buffer (Tensor::view), never freed. An
// owned tensor may hold 16-bit elements instead (bfloat16 or float16: the
// activations a 16-bit compute keeps for backward), read through raw().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device.h"

namespace ddp {

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[20, 10]"

// The elements of `shape`. Throws Error (DDP_ERR_INVALID_ARGUMENT) for a
// negative dimension, or a count whose bytes (`element_bytes` each) do not
// fit in a size_t: a shape from a file or the config that wraps around must
// not allocate less than it claims.
size_t numel_of(const Shape& shape, size_t element_bytes = sizeof(float));

class Tensor {
 public:
  Tensor() = default;
  // `dtype`: DDP_FLOAT32, or DDP_BFLOAT16 / DDP_FLOAT16 (2 bytes each:
  // data() is then not to be read as floats; raw() is the memory).
  Tensor(Device& device, Shape shape, MemCategory category, ddp_dtype dtype = DDP_FLOAT32)
      : device_(&device), shape_(std::move(shape)), dtype_(dtype) {
    numel_ = numel_of(shape_, element_bytes());
    data_ = static_cast<float*>(device.alloc(numel_ * element_bytes(), category));
  }
  // `numel_of(shape)` floats at `data`, inside a buffer another Tensor of
  // `device` owns and that outlives this one.
  static Tensor view(Device& device, float* data, Shape shape) {
    Tensor t;
    t.device_ = &device;
    t.numel_ = numel_of(shape);
    t.shape_ = std::move(shape);
    t.data_ = data;
    t.owned_ = false;
    return t;
  }
  ~Tensor() { reset(); }
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(device_, o.device_);
      std::swap(data_, o.data_);
      std::swap(shape_, o.shape_);
      std::swap(numel_, o.numel_);
      std::swap(owned_, o.owned_);
      std::swap(dtype_, o.dtype_);
    }
    return *this;
  }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  void reset() {
    if (device_ && data_ && owned_) device_->free(data_);
    data_ = nullptr;
    owned_ = true;
    numel_ = 0;
    shape_.clear();
    dtype_ = DDP_FLOAT32;
  }
  bool defined() const { return data_ != nullptr; }
  // A view's memory from now on (null: none): a gradient the strategy
  // binds to its own storage. Throws for a tensor that owns its memory.
  void point_view_at(float* data) {
    if (owned_ && data_) throw Error("point_view_at: this tensor owns its memory; only a view moves");
    owned_ = false;
    data_ = data;
  }
  Device* device() const { return device_; }  // where the data lives (null: undefined)
  // The values on the host (a copy out of device memory on a GPU).
  std::vector<float> to_host() const {
    if (dtype_ != DDP_FLOAT32) throw Error("to_host: the tensor holds 16-bit elements, not floats");
    std::vector<float> out(numel_);
    if (data_) device_->download(out.data(), data_, bytes());
    return out;
  }
  float* data() { return data_; }
  const float* data() const { return data_; }
  void* raw() { return data_; }
  const void* raw() const { return data_; }
  ddp_dtype dtype() const { return dtype_; }
  size_t element_bytes() const { return dtype_ == DDP_FLOAT32 ? sizeof(float) : 2; }
  const Shape& shape() const { return shape_; }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * element_bytes(); }

 private:
  Device* device_ = nullptr;
  float* data_ = nullptr;
  Shape shape_;
  size_t numel_ = 0;
  bool owned_ = true;
  ddp_dtype dtype_ = DDP_FLOAT32;
};

}  // namespace ddp
