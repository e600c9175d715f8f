// compress.h — the `compress` key of `bucketed` (PyTorch's
// bf16_compress_hook and fp16_compress_hook): gradients travel in a 16-bit
// float, halving the bytes each rank sends. Each bucket is divided by the
// world size in float32, converted (round to nearest even: host->convert),
// summed by the transport in that dtype (in float32 per addition where the
// library has no native sum: gloo, mpi), and converted back. Header-only,
// pure apart from read(). Throws ddp::plugin::Failure.
#pragma once

#include <optional>
#include <string>

#include <ddp/numeric.h>
#include <ddp/plugin.hpp>

#include "strategy_util.h"

namespace ddp {
namespace strategy {

// The dtype a value of the key names: "none" float32, "bf16", "fp16"; else nullopt.
inline std::optional<ddp_dtype> compress_dtype(const std::string& value) {
  if (value == "none") return DDP_FLOAT32;
  if (value == "bf16") return DDP_BFLOAT16;
  if (value == "fp16") return DDP_FLOAT16;
  return std::nullopt;
}

// The key's value for a dtype compress_dtype gives: "none", "bf16", "fp16".
inline const char* compress_value(ddp_dtype wire) {
  return wire == DDP_BFLOAT16 ? "bf16" : wire == DDP_FLOAT16 ? "fp16" : "none";
}

// Why `wire` cannot travel on `transport` (its declared dtypes) with this
// host, or "" if it can. Pure.
// `key`: the key that chose it ("strategy.compress", "precision.reduce",
// "strategy.gather_dtype", "precision.compute").
inline std::string compress_refusal(ddp_dtype wire, const char* transport, uint64_t transport_dtypes,
                                    bool host_converts, const std::string& key = "strategy.compress") {
  if (wire == DDP_FLOAT32) return "";
  const std::string what = key + " = \"" + compress_value(wire) + "\": ";
  if (!(transport_dtypes & DDP_DTYPE_BIT(wire))) {
    std::string takes;
    for (int d = DDP_FLOAT32; d <= DDP_FLOAT16; ++d)
      if (transport_dtypes & DDP_DTYPE_BIT(d))
        takes += (takes.empty() ? "" : ", ") + std::string(ddp_dtype_name(ddp_dtype(d)));
    return what + "transport '" + transport + "' does not take " + ddp_dtype_name(wire) + " (it takes " + takes + ")";
  }
  if (!host_converts) return what + "this engine has no host->convert (it needs ABI 1.3 or newer)";
  return "";
}

// Reads the key in create and checks it against the transport: the dtype
// gradients travel in; unset, the run's [precision] reduce.
// `planning`: for a plan entry, whose host converts nothing (the run's will).
inline ddp_dtype read_compress(const plugin::Host& host, const ddp_transport_v1_t* transport, bool planning = false) {
  const std::string value = host.config_string("compress", kUnset);
  const bool set = value != kUnset;
  const std::optional<ddp_dtype> wire = set ? compress_dtype(value) : run_precision(host.raw()).reduce;
  if (!wire)
    throw plugin::Failure(DDP_ERR_INVALID_ARGUMENT,
                          "strategy.compress must be \"none\", \"bf16\" or \"fp16\" (got \"" + value + "\")");
  const std::string why =
      compress_refusal(*wire, transport->name, ddp_transport_dtypes(transport),
                       planning || plugin::has_convert(host.raw()), set ? "strategy.compress" : "precision.reduce");
  if (!why.empty())
    throw plugin::Failure(
        DDP_ERR_UNSUPPORTED,
        why + (set ? "" : " (strategy.compress, unset, follows it: compress = \"none\" keeps float32)"));
  return *wire;
}

}  // namespace strategy
}  // namespace ddp
