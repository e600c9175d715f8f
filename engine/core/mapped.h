// mapped.h — whether memory a plugin points the engine at is there to read:
// a count larger than the data behind a pointer (a strategy's `state` of
// 2^40 elements over one float) is refused by name before the engine reads
// past the end of what is mapped and dies of a segmentation fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

// "" where [begin, begin + bytes) lies within readable mappings of `maps`
// (the text of /proc/self/maps: "start-end perms ..." per line, sorted);
// else the first address of the range that does not, in words:
// "its 4398046511104 bytes from 0x7f00 run past the memory mapped there
// (unmapped from 0x8000)". An empty range is readable. Pure.
std::string unreadable_in(const std::string& maps, uintptr_t begin, size_t bytes);

// The same for this process, where a range is large enough to be checked
// (a count wrong by a little lands in memory that is mapped anyway: only
// ranges over kCheckedBytes are looked up).
inline constexpr size_t kCheckedBytes = size_t{1} << 20;
std::string unreadable(const void* begin, size_t bytes);

}  // namespace ddp
