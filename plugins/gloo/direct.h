// direct.h — the `gloo` transport's own "direct" algorithms, on Gloo's
// unbound buffers: a reduce-scatter in one step and the all-reduce built on
// it (README.md says why and has the measurements). Header-only, included
// by gloo_transport.cpp alone; they run on a stream's executor and throw
// Gloo's exceptions, which the caller turns into a failed stream.
#pragma once

#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ddp_gloo {

// Slots of the direct algorithms, beside Gloo's own prefixes (gloo/types.h).
constexpr uint8_t kDirectSlotPrefix = 0x40;
// all_reduce goes in pieces of at most this (and at most 128 pieces): the
// scratch stays under (n-1)/n of a piece.
constexpr size_t kDirectPieceBytes = size_t(16) << 20;
// One direct step of a reduce-scatter over `count` elements of `send` from
// element `begin`, split in world chunks of `chunk` elements (the last ones
// shorter or empty): chunk q goes to rank q, all at once, and this rank's
// chunk is summed from everyone's into `into` (which may be send's own).
// `scratch` holds (n-1)·chunk elements.
template <typename T>
void scatter_reduce_step(gloo::Context& ctx_ref, gloo::transport::UnboundBuffer& send, size_t begin, size_t count,
                         size_t chunk, T* into, T* scratch, uint64_t slot) {
  gloo::Context* ctx = &ctx_ref;
  const size_t n = size_t(ctx->size);
  const size_t rank = size_t(ctx->rank);
  auto lo = [&](size_t q) { return std::min(count, q * chunk); };
  auto len = [&](size_t q) { return std::min(count, (q + 1) * chunk) - lo(q); };
  auto tmp = ctx->createUnboundBuffer(scratch, (n - 1) * chunk * sizeof(T));
  size_t sends = 0;
  size_t recvs = 0;
  for (size_t q = 0, k = 0; q < n; ++q) {
    if (q == rank) continue;
    if (len(rank) > 0) {
      tmp->recv(int(q), slot, k * chunk * sizeof(T), len(rank) * sizeof(T));
      ++recvs;
    }
    if (len(q) > 0) {
      send.send(int(q), slot, (begin + lo(q)) * sizeof(T), len(q) * sizeof(T));
      ++sends;
    }
    ++k;
  }
  for (; recvs > 0; --recvs) tmp->waitRecv(ctx->getTimeout());
  const T* own = static_cast<const T*>(send.ptr) + begin + lo(rank);
  if (into != own) std::memcpy(into, own, len(rank) * sizeof(T));
  for (size_t k = 0; k + 1 < n; ++k) gloo::sum<T>(into, into, scratch + k * chunk, len(rank));
  for (; sends > 0; --sends) send.waitSend(ctx->getTimeout());
}

// all_reduce, "direct": per piece, a reduce-scatter in one step (every rank
// sends chunk q to rank q and sums its own chunk from all), then an
// all-gather in one step (every rank sends its summed chunk to all). Each
// rank moves 2(n-1)/n of the bytes, as the ring, but in 2 steps of
// concurrent messages where the ring takes 2(n-1) steps of dependent ones,
// each waiting for two threads to wake. On 2 shared cores that waking is
// what a small all-reduce costs (README.md has the measurements).
template <typename T>
void direct_all_reduce(gloo::Context& ctx_ref, std::vector<unsigned char>& temp, T* ptr, size_t count, uint32_t tag) {
  gloo::Context* ctx = &ctx_ref;
  const size_t n = size_t(ctx->size);
  const size_t rank = size_t(ctx->rank);
  const size_t piece = std::max(kDirectPieceBytes / sizeof(T), (count + 127) / 128);
  auto out = ctx->createUnboundBuffer(ptr, count * sizeof(T));
  temp.resize(std::max(temp.size(), (n - 1) * ((std::min(piece, count) + n - 1) / n) * sizeof(T)));
  T* scratch = reinterpret_cast<T*>(temp.data());
  const gloo::Slot base = gloo::Slot::build(kDirectSlotPrefix, tag);
  for (size_t begin = 0, p = 0; begin < count; begin += piece, ++p) {
    const size_t len = std::min(piece, count - begin);
    const size_t chunk = (len + n - 1) / n;
    auto lo = [&](size_t q) { return begin + std::min(len, q * chunk); };
    auto size = [&](size_t q) { return begin + std::min(len, (q + 1) * chunk) - lo(q); };
    scatter_reduce_step<T>(*ctx, *out, begin, len, chunk, ptr + lo(rank), scratch, base + uint8_t(2 * p));
    const uint64_t gather = base + uint8_t(2 * p + 1);
    size_t sends = 0;
    size_t recvs = 0;
    for (size_t q = 0; q < n; ++q) {
      if (q == rank) continue;
      if (size(q) > 0) {
        out->recv(int(q), gather, lo(q) * sizeof(T), size(q) * sizeof(T));
        ++recvs;
      }
      if (size(rank) > 0) {
        out->send(int(q), gather, lo(rank) * sizeof(T), size(rank) * sizeof(T));
        ++sends;
      }
    }
    for (; recvs > 0; --recvs) out->waitRecv(ctx->getTimeout());
    for (; sends > 0; --sends) out->waitSend(ctx->getTimeout());
  }
}

}  // namespace ddp_gloo
