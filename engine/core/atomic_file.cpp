// atomic_file.cpp — see atomic_file.h.
#include "atomic_file.h"

#include <filesystem>
#include <fstream>

#include "error.h"

namespace ddp {

void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw Error(path + ": cannot write file");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": cannot rename into place: " + ec.message());
}

}  // namespace ddp
