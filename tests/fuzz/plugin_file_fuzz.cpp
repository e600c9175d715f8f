// plugin_file_fuzz.cpp — the check a plugin file passes before dlopen
// (engine/host/elf_extent.h) on arbitrary bytes: a file cut short, ELF
// headers describing segments or sections beyond it, offsets that overflow.
// It must say "" or why, never crash or read past the file.
#include <cstdint>
#include <string>

#include "elf_extent.h"
#include "memfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemFile file(data, size);
  (void)ddp::elf_truncation(file.path());
  return 0;
}
