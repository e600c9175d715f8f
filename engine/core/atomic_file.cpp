// atomic_file.cpp — see atomic_file.h.
#include "atomic_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

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

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(temporary_for(path_)) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path_ + ": cannot write file (" + std::strerror(errno) + ")");
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  std::error_code ignored;
  std::filesystem::remove(tmp_, ignored);
}

void AtomicFile::fail(const std::string& why) {
  ::close(fd_);
  fd_ = -1;
  std::error_code ignored;
  std::filesystem::remove(tmp_, ignored);
  throw Error(path_ + ": " + why);
}

// A short write, a full disk (which may show only at fsync) or an I/O
// error is reported by errno.
void AtomicFile::write(uint64_t offset, const void* data, size_t bytes) {
  if (fd_ < 0) throw Error(path_ + ": written after it was committed or failed");
  const char* at = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd_, at + done, bytes - done, off_t(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(std::string("cannot write file (") + std::strerror(n < 0 ? errno : ENOSPC) + ")");
    done += size_t(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(path_ + ": committed twice, or after it failed");
  if (::fsync(fd_) != 0) fail(std::string("cannot write file (") + std::strerror(errno) + ")");
  const int fd = fd_;
  fd_ = -1;
  std::error_code ignored;
  std::error_code ec;
  if (::close(fd) != 0) {
    const int err = errno;
    std::filesystem::remove(tmp_, ignored);
    throw Error(path_ + ": cannot write file (" + std::strerror(err) + ")");
  }
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    std::filesystem::remove(tmp_, ignored);
    throw Error(path_ + ": cannot rename into place: " + ec.message());
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(0, text.data(), text.size());
  file.commit();
}

namespace {

// The same file: `fd` is still the file named `path` (the holder before us
// removes the lock file as it leaves, so an fd opened just before that
// locks a file no one else will see).
bool still_named(int fd, const std::string& path) {
  struct stat open_st {};
  struct stat named_st {};
  return ::fstat(fd, &open_st) == 0 && ::stat(path.c_str(), &named_st) == 0 && open_st.st_dev == named_st.st_dev &&
         open_st.st_ino == named_st.st_ino;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create " + what + " (" + ec.message() + ")");
  path_ = (std::filesystem::path(dir) / ".ddp.lock").string();
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(dir + ": cannot lock " + what + " (" + std::strerror(errno) + ")");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[32] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK) throw Error(dir + ": cannot lock " + what + " (" + std::strerror(err) + ")");
      throw Error(dir + " is in use by another ddp run (pid " + std::string(holder, n > 0 ? size_t(n) : 0) +
                      "): give this one another " + what,
                  DDP_ERR_INVALID_ARGUMENT);
    }
    if (still_named(fd_, path_)) break;
    ::close(fd_);  // locked a file its holder removed as it left: again
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
