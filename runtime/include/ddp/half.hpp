#pragma once
// 16-bit floating point element types for collectives and gradient compression: storage
// only, converted through float. Conversions round to nearest even.

#include <cstdint>

namespace ddp {

struct float16 {
  std::uint16_t bits = 0;
};

struct bfloat16 {
  std::uint16_t bits = 0;
};

float to_float(float16 value);
float to_float(bfloat16 value);
float16 to_float16(float value);
bfloat16 to_bfloat16(float value);

}  // namespace ddp
