// rank_checks.h — what the transport tests (transport_test, nccl_transport_test,
// gloo_cuda_test) check collectives with: a rank body throws on the first
// wrong result (multirank.h reports it), naming how many elements are wrong
// and the first of them; the parent turns each failing rank into a failure.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <ddp/plugin.h>

namespace ddp {

[[noreturn]] inline void fail(const std::string& message) { throw std::runtime_error(message); }

// The ABI dtype of T; uint16_t stands for bfloat16 (or float16, given explicitly).
template <typename T>
constexpr ddp_dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DDP_FLOAT32;
  if constexpr (std::is_same_v<T, double>) return DDP_FLOAT64;
  if constexpr (std::is_same_v<T, int32_t>) return DDP_INT32;
  if constexpr (std::is_same_v<T, int64_t>) return DDP_INT64;
  return DDP_BFLOAT16;
}

// A value as text, every digit of a double; 16-bit codes as numbers.
template <typename T>
std::string str(T v) {
  std::ostringstream os;
  os.precision(17);
  os << +v;
  return os.str();
}

// Throws naming the first mismatch (and how many there are) unless
// got[i] == expected(i) for every i.
template <typename T, typename F>
void check_all(const std::string& what, const std::vector<T>& got, F&& expected) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == static_cast<T>(expected(i))) && bad++ == 0) first = i;
  if (bad)
    fail(what + ": " + std::to_string(bad) + " of " + std::to_string(got.size()) + " elements wrong, first at [" +
         std::to_string(first) + "]: got " + str(got[first]) + ", expected " + str(static_cast<T>(expected(first))));
}

}  // namespace ddp

// One GoogleTest failure per failing rank, at the line of the call.
#define EXPECT_RANKS_OK(...)                                                     \
  do {                                                                           \
    for (const std::string& failure_ : (__VA_ARGS__)) ADD_FAILURE() << failure_; \
  } while (0)
