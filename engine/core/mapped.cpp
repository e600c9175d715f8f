// mapped.cpp — see mapped.h.
#include "mapped.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ddp {
namespace {

std::string hex(uintptr_t address) {
  char out[24];
  std::snprintf(out, sizeof out, "0x%jx", uintmax_t(address));
  return out;
}

}  // namespace

std::string unreadable_in(const std::string& maps, uintptr_t begin, size_t bytes) {
  if (bytes == 0) return "";
  const std::string what = "its " + std::to_string(bytes) + " bytes from " + hex(begin);
  if (bytes > UINTPTR_MAX - begin) return what + " run past the end of the address space";
  const uintptr_t end = begin + bytes;
  uintptr_t covered = begin;  // [begin, covered) is readable
  std::istringstream lines(maps);
  std::string line;
  while (covered < end && std::getline(lines, line)) {
    unsigned long long start = 0;
    unsigned long long stop = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &start, &stop, perms) != 3) continue;
    if (stop <= covered) continue;
    if (start > covered || perms[0] != 'r') break;
    covered = uintptr_t(stop);
  }
  if (covered >= end) return "";
  return what + " run past the memory mapped there (" +
         (covered == begin ? "nothing readable at " + hex(begin) : "unmapped from " + hex(covered)) + ")";
}

std::string unreadable(const void* begin, size_t bytes) {
  if (bytes <= kCheckedBytes) return "";
  std::ifstream in("/proc/self/maps");
  if (!in) return "";  // (no /proc: not checkable)
  std::ostringstream text;
  text << in.rdbuf();
  return unreadable_in(text.str(), reinterpret_cast<uintptr_t>(begin), bytes);
}

}  // namespace ddp
