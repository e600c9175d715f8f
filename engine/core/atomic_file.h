// atomic_file.h — how every output of a run is written, and kept to one run:
// each file goes to a temporary name of its own beside the destination and
// is renamed into place, so that a reader (or a crash) never sees a
// half-written file; a directory a run writes into is locked for that run,
// so that two runs never mix their outputs.
#pragma once

#include <string>

namespace ddp {

// Writes `text` to `path` through "<path>.tmp.<pid>.<n>" and a rename; on
// failure removes the temporary and throws Error naming the path and why.
void write_file_atomically(const std::string& path, const std::string& text);

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
