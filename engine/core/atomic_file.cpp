// atomic_file.cpp — see atomic_file.h.
#include "atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "error.h"

namespace ddp {
namespace {

// "<path>.tmp.<pid>.<n>": two writers, in one process or two, never share
// a temporary.
std::string temporary_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = temporary_for(path);
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      const int err = errno;
      out.close();
      std::filesystem::remove(tmp, ec);
      throw Error(path + ": cannot write file (" + std::strerror(err) + ")");
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error(path + ": cannot rename into place: " + ec.message());
  }
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  path_ = (std::filesystem::path(dir) / ".ddp.lock").string();
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(dir + ": cannot lock " + what + " (" + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    throw Error(dir + " is in use by another ddp run (pid " + std::string(holder, n > 0 ? size_t(n) : 0) +
                    "): give this one another " + what,
                DDP_ERR_INVALID_ARGUMENT);
  }
  const std::string pid = std::to_string(getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // the lock holds without its note of the holder
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // before the unlock: no one locks a file we then remove
  ::close(fd_);
}

}  // namespace ddp
