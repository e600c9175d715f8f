// checksum.h — XXH3-64 digests of bytes and of files, written as 16
// lowercase hex digits: what a checkpoint records of every file it holds, so
// that a changed byte is found before a run resumes from it
// (docs/checkpoints.md). XXH3 hashes at memory speed (tens of GB/s), well
// above what a disk writes, so a checkpoint pays little for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

// The digest of `size` bytes at `data`. Pure.
std::string xxh3_hex(const void* data, size_t size);
// A digest's 64 bits as its 16 hex digits, and back (what gathers carry). Pure.
std::string digest_hex(uint64_t digest);
uint64_t digest_bits(const std::string& hex);

struct FileDigest {
  uint64_t bytes = 0;
  std::string xxh3;  // 16 hex digits
};

// The digest of the file at `path`, read in chunks; throws Error naming the
// path and why where it cannot be read.
FileDigest file_digest(const std::string& path);

}  // namespace ddp
