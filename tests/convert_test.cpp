// convert_test.cpp — float32 <-> bfloat16/float16 (ddp/numeric.h, the host's
// convert entry on the CPU): closed-form values (ties to even, subnormals,
// overflow), every 16-bit value through a round trip, and a million random
// floats against an independent rounding (scale, std::nearbyint in double).
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <ddp/numeric.h>
#include <gtest/gtest.h>

#include "convert.h"
#include "device.h"
#include "error.h"

namespace ddp {
namespace {

float bits_float(uint32_t u) { return ddp_f32_from_bits(u); }

TEST(Numeric, Bfloat16ClosedForms) {
  EXPECT_EQ(ddp_float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(ddp_float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(ddp_float_to_bf16(0.1f), 0x3dcd);                     // 0x3dcccccd rounds up
  EXPECT_EQ(ddp_float_to_bf16(bits_float(0x3f808000)), 0x3f80);   // a tie: to even (down)
  EXPECT_EQ(ddp_float_to_bf16(bits_float(0x3f818000)), 0x3f82);   // a tie: to even (up)
  EXPECT_EQ(ddp_float_to_bf16(bits_float(0x7f7fffff)), 0x7f80);   // the largest float: infinity
  EXPECT_EQ(ddp_float_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  EXPECT_EQ(ddp_bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(ddp_bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // subnormal
}

TEST(Numeric, Float16ClosedForms) {
  EXPECT_EQ(ddp_float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(ddp_float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(ddp_float_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(ddp_float_to_fp16(65504.0f), 0x7bff);              // the largest float16
  EXPECT_EQ(ddp_float_to_fp16(65519.0f), 0x7bff);              // below the tie: down
  EXPECT_EQ(ddp_float_to_fp16(65520.0f), 0x7c00);              // the tie: to even, infinity
  EXPECT_EQ(ddp_float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // the smallest subnormal
  EXPECT_EQ(ddp_float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: a tie, to even 0
  EXPECT_EQ(ddp_float_to_fp16(std::ldexp(3.0f, -26)), 0x0001);  // three quarters: up
  EXPECT_EQ(ddp_float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // a tie: to even
  EXPECT_EQ(ddp_float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // a tie: to even
  EXPECT_EQ(ddp_float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(ddp_fp16_to_float(ddp_float_to_fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ddp_fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(ddp_fp16_to_float(0x7c00), std::numeric_limits<float>::infinity());
}

// Every 16-bit pattern that is not a NaN survives float32 and back.
TEST(Numeric, EveryValueRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    if (!std::isnan(ddp_bf16_to_float(x))) {
      ASSERT_EQ(ddp_float_to_bf16(ddp_bf16_to_float(x)), x) << std::hex << h;
    }
    if (!std::isnan(ddp_fp16_to_float(x))) {
      ASSERT_EQ(ddp_float_to_fp16(ddp_fp16_to_float(x)), x) << std::hex << h;
    }
  }
}

// x rounded to `mantissa` bits below the leading one, exponents down to
// `min_exp` (below: subnormal steps of 2^(min_exp - mantissa)), to nearest
// even by std::nearbyint in double; infinity past `max`.
double reference(float x, int mantissa, int min_exp, double max) {
  if (x == 0) return x;
  int e = 0;
  std::frexp(double(x), &e);  // |x| in [2^(e-1), 2^e)
  const int step = std::max(e - 1, min_exp) - mantissa;
  const double r = std::nearbyint(std::ldexp(double(x), -step)) * std::ldexp(1.0, step);
  return std::fabs(r) > max ? std::copysign(std::numeric_limits<double>::infinity(), r) : r;
}

TEST(Numeric, RandomFloatsRoundAsAnIndependentReference) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 rng(7);
  for (int k = 0; k < 1000000; ++k) {
    const float x = bits_float(static_cast<uint32_t>(rng()));
    if (std::isnan(x) || std::isinf(x)) continue;
    // bfloat16: float32's exponent range (the reference's subnormals at 2^-126).
    const double bf16_max = std::ldexp(2.0 - std::ldexp(1.0, -7), 127);
    const double b = reference(x, 7, -126, bf16_max * (1 + std::ldexp(1.0, -9)));
    ASSERT_EQ(double(ddp_bf16_to_float(ddp_float_to_bf16(x))), b) << std::hexfloat << x;
    // float16 on a range where it is more than zero or infinity.
    const float y = std::ldexp(static_cast<float>(rng() % 2000000) / 1000000.0f - 1.0f, int(rng() % 44) - 28);
    const double h = reference(y, 10, -14, 65520.0 - 1e-9);
    ASSERT_EQ(double(ddp_fp16_to_float(ddp_float_to_fp16(y))), h) << std::hexfloat << y;
  }
}

TEST(Convert, BuffersOnTheCpuStream) {
  const std::vector<float> in = {1.0f, 0.1f, -65520.0f, std::ldexp(1.0f, -25)};
  std::vector<uint16_t> bf(in.size()), hf(in.size());
  std::vector<float> back(in.size());
  CpuDevice device;
  device.convert(bf.data(), DDP_BFLOAT16, in.data(), DDP_FLOAT32, in.size(), device.comm_stream());
  device.convert(hf.data(), DDP_FLOAT16, in.data(), DDP_FLOAT32, in.size(), device.comm_stream());
  device.convert(back.data(), DDP_FLOAT32, hf.data(), DDP_FLOAT16, in.size(), device.comm_stream());
  device.comm_stream().synchronize();
  EXPECT_EQ(bf, (std::vector<uint16_t>{0x3f80, 0x3dcd, 0xc780, 0x3300}));
  EXPECT_EQ(hf, (std::vector<uint16_t>{0x3c00, 0x2e66, 0xfc00, 0x0000}));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[2], -std::numeric_limits<float>::infinity());
}

TEST(Convert, OnlyFloat32AndTheSixteenBitFloats) {
  EXPECT_EQ(convert_refusal(DDP_BFLOAT16, DDP_FLOAT32), "");
  EXPECT_EQ(convert_refusal(DDP_FLOAT32, DDP_FLOAT16), "");
  EXPECT_EQ(convert_refusal(DDP_FLOAT16, DDP_BFLOAT16),
            "no conversion from bfloat16 to float16 (the host converts float32 to bfloat16 or float16, and back)");
  EXPECT_EQ(convert_refusal(DDP_FLOAT64, DDP_FLOAT32),
            "no conversion from float32 to float64 (the host converts float32 to bfloat16 or float16, and back)");
  CpuDevice device;
  std::vector<int32_t> a(2);
  std::vector<float> b(2);
  try {
    device.convert(a.data(), DDP_INT32, b.data(), DDP_FLOAT32, 2, device.comm_stream());
    ADD_FAILURE() << "int32 <- float32 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "no conversion from float32 to int32 (the host converts float32 to bfloat16 or float16, and back)");
  }
}

}  // namespace
}  // namespace ddp
