// atomic_file.h — how every output of a run is written: to a temporary name
// beside the destination, then renamed into place, so that a reader (or a
// crash) never sees a half-written file.
#pragma once

#include <string>

namespace ddp {

// Writes `text` to `path` through "<path>.tmp" and a rename. Throws Error
// naming the path if it cannot.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace ddp
