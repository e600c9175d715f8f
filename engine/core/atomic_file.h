// atomic_file.h — how every output of a run is written, and kept to one run:
// each file goes to a temporary name of its own beside the destination and
// is renamed into place, so that a reader (or a crash) never sees a
// half-written file; a directory a run writes into is locked for that run,
// so that two runs never mix their outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

// Writes `text` to `path` through "<path>.tmp.<pid>.<n>" and a rename; on
// failure removes the temporary and throws Error naming the path and why.
void write_file_atomically(const std::string& path, const std::string& text);

// The same, written in parts: a file too large to build in memory first
// (weights.safetensors of a model the ranks hold only in shards). Opens
// "<path>.tmp.<pid>.<n>"; write() puts bytes at an offset, in any order;
// commit() syncs and renames it
// into place. Each throws Error naming the path and why; an AtomicFile
// destroyed before its commit removes its temporary, so nothing is ever
// half-written under `path`.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(uint64_t offset, const void* data, size_t bytes);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& why);
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
};

// Holds `dir` (created if missing) for this process: an exclusive flock on
// "<dir>/.ddp.lock", which holds the holder's pid. Throws Error naming the
// directory and the holder's pid if another process holds it; `what` names
// the setting to change ("run.output_dir"). The kernel drops the lock when
// the process ends, however it ends; the destructor removes the file.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace ddp
