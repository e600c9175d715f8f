// elf_extent.cpp — see elf_extent.h.
#include "elf_extent.h"

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

namespace ddp {
namespace {

// The end of `count` entries of `size` bytes at `offset`, or UINT64_MAX
// where that overflows (the file cannot hold it either).
uint64_t end_of(uint64_t offset, uint64_t count, uint64_t size) {
  const uint64_t bytes = count * size;  // both < 2^16
  return offset > UINT64_MAX - bytes ? UINT64_MAX : offset + bytes;
}

}  // namespace

std::string elf_truncation(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";  // dlopen says why
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Elf64_Ehdr header{};
  char magic[SELFMAG] = {};
  if (!in.read(magic, SELFMAG) || std::memcmp(magic, ELFMAG, SELFMAG) != 0) return "";
  in.seekg(0);
  const auto truncated = [&](uint64_t need) {
    return "truncated: " + std::to_string(size) + " bytes, where its ELF headers describe " + std::to_string(need);
  };
  if (size < sizeof header) return truncated(sizeof header);
  in.read(reinterpret_cast<char*>(&header), sizeof header);
  if (header.e_ident[EI_CLASS] != ELFCLASS64) return "";
  uint64_t need = std::max(end_of(header.e_phoff, header.e_phnum, header.e_phentsize),
                           end_of(header.e_shoff, header.e_shnum, header.e_shentsize));
  if (need > size) return truncated(need);
  if (header.e_phentsize == sizeof(Elf64_Phdr)) {
    std::vector<Elf64_Phdr> segments(header.e_phnum);
    in.seekg(static_cast<std::streamoff>(header.e_phoff));
    in.read(reinterpret_cast<char*>(segments.data()), std::streamsize(segments.size() * sizeof(Elf64_Phdr)));
    for (const Elf64_Phdr& s : segments) need = std::max(need, end_of(s.p_offset, 1, s.p_filesz));
  }
  return need > size ? truncated(need) : "";
}

}  // namespace ddp
