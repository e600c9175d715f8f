// blas_info.cpp — what this process's OpenBLAS is (blas_info.h).
#include "blas_info.h"

#include <cblas.h>

#include <algorithm>

namespace ddp {

std::string blas_kernel_loaded() { return openblas_get_corename(); }
void set_blas_threads(int threads) { openblas_set_num_threads(threads); }
std::string blas_build() {
  // Its configuration string names the kernel loaded: drop that word, so
  // that the build reads the same whichever kernel was picked.
  std::string config = openblas_get_config();
  std::string out;
  const std::string core = openblas_get_corename();
  size_t start = 0;
  while (start <= config.size()) {
    const size_t end = std::min(config.find(' ', start), config.size());
    const std::string word = config.substr(start, end - start);
    if (!word.empty() && word != core) out += (out.empty() ? "" : " ") + word;
    start = end + 1;
  }
  return out;
}

}  // namespace ddp
