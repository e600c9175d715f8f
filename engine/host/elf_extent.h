// elf_extent.h — whether a shared library's file holds every byte its ELF
// headers describe, checked before dlopen: dlopen maps a truncated library
// (a copy cut short, a full disk) and the process dies of SIGBUS touching
// what is not there, with no message. Pure but for reading the file.
#pragma once

#include <string>

namespace ddp {

// "" when the file is not a 64-bit ELF file (dlopen then says what it is)
// or holds its headers, program headers, segments and section headers;
// else why not, e.g. "truncated: 3000 bytes, where its ELF headers
// describe 96136".
std::string elf_truncation(const std::string& path);

}  // namespace ddp
