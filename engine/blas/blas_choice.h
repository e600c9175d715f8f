// blas_choice.h — which OpenBLAS GEMM kernel the ranks use, chosen by
// measuring, not by CPU flag. OpenBLAS picks its kernel (OPENBLAS_CORETYPE)
// when it is loaded, so the choice is made by `ddp run` before it starts
// the ranks, and handed to them in their environment:
//   1. OPENBLAS_CORETYPE already set: kept, always (some machines set it
//      because some builds compute wrong results or crash on them);
//   2. run.blas_kernel names a kernel ("Haswell", "SkylakeX", ...) or
//      "default" (OpenBLAS's own pick): that one;
//   3. "auto" (the default): the machine's cached choice, else a
//      measurement: each candidate kernel runs the model's GEMMs
//      (gemm_probe.h) in a child process (`ddp blas-probe`; a kernel the
//      CPU cannot run dies there), is kept only if it is the kernel
//      OpenBLAS says it loaded and its results match a double-precision
//      reference, and the fastest is cached, keyed by CPU model and
//      OpenBLAS build, then by the GEMM shapes, in $DDP_CACHE_DIR, else
//      $XDG_CACHE_HOME/ddp, else ~/.cache/ddp (blas-kernel.json).
// A measurement that takes more than 2 s says which candidate it probes
// ("BLAS kernel: probing Haswell (2 of 6, round 1 of 3)..."); SIGINT,
// SIGTERM or SIGHUP during it stop the probe (its process group) and end
// the launcher with an Error naming the signal; a model whose GEMMs cannot
// fit this host's memory, or whose probe runs out of it, is said to be so.
// Ranks started by mpirun or srun use the machine's cached choice measured
// on the most work, where there is one (apply_cached_blas_kernel).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gemm_probe.h"

namespace ddp {

struct BlasChoice {
  std::string kernel;  // blas_kernel_candidates()'s, or "default": OPENBLAS_CORETYPE unset
  std::string source;  // "environment", "config", "cache", "measured"
  nlohmann::json timings = nlohmann::json::object();  // kernel -> seconds for the GEMMs (measured, cache)
  nlohmann::json json() const;
};

// The CPU feature (a __builtin_cpu_supports name) that OpenBLAS's `kernel`
// (any case) needs and `supports` says this CPU lacks; "" where it has them
// all, or for a kernel it does not know ("default"). Its code would die of
// SIGILL at the first GEMM. Pure.
std::string missing_cpu_feature(const std::string& kernel, const std::function<bool(const std::string&)>& supports);

// "" where each GEMM's three float32 matrices (what a probe allocates) fit
// within `memory_bytes` (this host's physical memory); else why not, naming
// the GEMM and its bytes: the probe would only run out of memory. Pure.
std::string probe_memory_problem(const std::vector<GemmShape>& shapes, int64_t memory_bytes);

// As above. `setting`: run.blas_kernel. `exe`: this program (for the
// probes), `threads` the ranks' BLAS threads (run.threads), part of the
// cache's key with the shapes. Throws Error if no candidate passes (a
// broken OpenBLAS), or if the kernel given (OPENBLAS_CORETYPE, or the
// setting) needs a CPU feature this CPU lacks.
BlasChoice choose_blas_kernel(const std::string& setting, const std::vector<GemmShape>& shapes, const std::string& exe,
                              int threads = 1);

// The file the choices are cached in, and this machine's key in it ("<CPU
// model> | <OpenBLAS build>").
std::string blas_cache_path();
std::string blas_machine_key();

// For a rank started by another launcher: where OPENBLAS_CORETYPE and the
// launcher's choice are both unset and this machine has a cached choice,
// sets it and starts this program again (execv), once. Returns otherwise.
void apply_cached_blas_kernel(char** argv);

}  // namespace ddp
