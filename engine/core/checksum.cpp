// checksum.cpp — see checksum.h.
#include "checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "error.h"

namespace ddp {

std::string digest_hex(uint64_t digest) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(digest));
  return out;
}

uint64_t digest_bits(const std::string& hex) { return hex.empty() ? 0 : std::stoull(hex, nullptr, 16); }

std::string xxh3_hex(const void* data, size_t size) { return digest_hex(XXH3_64bits(data, size)); }

FileDigest file_digest(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot read (" + std::strerror(errno) + ")", DDP_ERR_INVALID_ARGUMENT);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  XXH3_64bits_reset(state.get());
  // A chunk of at most 4 MiB, no larger than the file: not zeroed, so a
  // small file costs no page faults for memory it never reads into.
  struct stat st {};
  const size_t size = ::fstat(fd, &st) == 0 && st.st_size > 0 ? size_t(st.st_size) + 1 : size_t(1) << 16;
  const size_t chunk_size = std::min(size, size_t(4) << 20);
  const std::unique_ptr<char[]> chunk(new char[chunk_size]);
  FileDigest digest;
  for (;;) {
    const ssize_t n = ::read(fd, chunk.get(), chunk_size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot read (" + std::strerror(err) + ")", DDP_ERR_INVALID_ARGUMENT);
    }
    if (n == 0) break;
    XXH3_64bits_update(state.get(), chunk.get(), size_t(n));
    digest.bytes += uint64_t(n);
  }
  ::close(fd);
  digest.xxh3 = digest_hex(XXH3_64bits_digest(state.get()));
  return digest;
}

}  // namespace ddp
