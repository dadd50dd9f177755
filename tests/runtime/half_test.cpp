#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "ddp/half.hpp"

TEST_CASE("bfloat16: exact values survive, others round to nearest even") {
  for (float v : {0.0f, 1.0f, -2.5f, 3.0f, 1024.0f, 0.15625f}) {
    REQUIRE(ddp::to_float(ddp::to_bfloat16(v)) == v);
  }
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  REQUIRE(ddp::to_float(ddp::to_bfloat16(1.0f + 0x1p-8f)) == 1.0f);
  REQUIRE(ddp::to_float(ddp::to_bfloat16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  REQUIRE(std::isnan(ddp::to_float(ddp::to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(std::isinf(ddp::to_float(ddp::to_bfloat16(std::numeric_limits<float>::infinity()))));
}

TEST_CASE("float16: normals, subnormals, overflow and NaN") {
  for (float v : {0.0f, 1.0f, -2.5f, 0.75f, 65504.0f, 0x1p-14f, 0x1p-24f, -0x1p-20f}) {
    REQUIRE(ddp::to_float(ddp::to_float16(v)) == v);
  }
  REQUIRE(ddp::to_float16(1.0f).bits == 0x3c00);
  REQUIRE(ddp::to_float(ddp::to_float16(1.0f + 0x1p-11f)) == 1.0f);            // tie to even
  REQUIRE(ddp::to_float(ddp::to_float16(1.0f + 3 * 0x1p-11f)) == 1.0f + 0x1p-9f);
  REQUIRE(std::isinf(ddp::to_float(ddp::to_float16(70000.0f))));
  REQUIRE(ddp::to_float(ddp::to_float16(0x1p-26f)) == 0.0f);                   // below half the smallest
  REQUIRE(std::isnan(ddp::to_float(ddp::to_float16(std::numeric_limits<float>::quiet_NaN()))));
}
