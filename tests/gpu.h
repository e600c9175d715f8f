// gpu.h — whether this machine has a usable GPU, for tests of the GPU path
// that must skip (GTEST_SKIP, with the reason) where none is.
//
// - Counted in a forked child: the CUDA driver does not survive fork(), and
//   a test that forks ranks (tests/multirank.h, the conformance harness)
//   would give them a CUDA that fails with "initialization error" if this
//   process had initialised it, even only to count devices.
// - Any error of cudaGetDeviceCount counts as none: without a driver the
//   runtime returns cudaErrorInsufficientDriver, not "no device".
// - DDP_GPUS_IN_PROCESS=1 counts in this process instead, for a test program
//   that never forks (gpu_check.sh sets it under compute-sanitizer, which
//   would have to follow the child).
// - DDP_EXPECT_GPU=1 (tools/gpu_check.sh sets it) says the machine has a GPU:
//   there, finding none fails the test instead of skipping it, so that a
//   driver the build cannot use is not a green run of skipped tests.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace ddp::test {

struct Gpus {
  int count = 0;
  std::string why;  // why count is 0: the runtime's words
};

// "<count> cudaGetDeviceCount: <the runtime's words>", from this process.
inline std::string count_gpus_here() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return "0 cudaGetDeviceCount: " + std::string(cudaGetErrorString(e));
  }
  return std::to_string(n) + " cudaGetDeviceCount: 0 devices";
}

inline const Gpus& gpus() {
  static const Gpus found = [] {
    Gpus g;
    const char* here = std::getenv("DDP_GPUS_IN_PROCESS");
    if (here && *here && std::string(here) != "0") {
      std::istringstream in(count_gpus_here());
      in >> g.count;
      std::getline(in >> std::ws, g.why);
      if (g.count > 0) g.why.clear();
      return g;
    }
    int fds[2];
    if (pipe(fds) != 0) {
      g.why = "pipe failed";
      return g;
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      const std::string out = count_gpus_here();
      const ssize_t written = write(fds[1], out.data(), out.size());
      _exit(written == static_cast<ssize_t>(out.size()) ? 0 : 1);
    }
    close(fds[1]);
    std::string text;
    char chunk[256];
    while (pid > 0) {
      const ssize_t got = read(fds[0], chunk, sizeof chunk);
      if (got > 0) {
        text.append(chunk, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        break;
      }
    }
    close(fds[0]);
    if (pid > 0)
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    std::istringstream in(text);
    in >> g.count;
    std::getline(in >> std::ws, g.why);
    if (!in && g.why.empty()) g.why = pid < 0 ? "fork failed" : "no answer from the child that counts GPUs";
    if (g.count > 0) g.why.clear();
    return g;
  }();
  return found;
}

// "N (the runtime's words)", or "N" where there are GPUs.
inline std::string describe(const Gpus& g) {
  return std::to_string(g.count) + (g.why.empty() ? "" : " (" + g.why + ")");
}

inline bool gpu_expected() {
  const char* v = std::getenv("DDP_EXPECT_GPU");
  return v && *v && std::string(v) != "0";
}

}  // namespace ddp::test

// First statement of a test that needs n GPUs, counted by `found` (a Gpus).
#define DDP_REQUIRE_GPUS_OF(found, n)                                                                      \
  if ((found).count >= (n)) {                                                                              \
  } else if ((found).count == 0 && ::ddp::test::gpu_expected())                                            \
    GTEST_FAIL() << "DDP_EXPECT_GPU is set, but this machine has " << ::ddp::test::describe(found);       \
  else                                                                                                     \
    GTEST_SKIP() << "needs " << (n) << " GPU(s); this machine has " << ::ddp::test::describe(found)

#define DDP_REQUIRE_GPUS(n) DDP_REQUIRE_GPUS_OF(::ddp::test::gpus(), n)
