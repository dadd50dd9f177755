#include "ddp/half.hpp"

#include <bit>

namespace ddp {

float to_float(bfloat16 value) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(value.bits) << 16);
}

bfloat16 to_bfloat16(float value) {
  auto bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return {static_cast<std::uint16_t>((bits >> 16) | 0x0040u)};  // keep NaN a quiet NaN
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return {static_cast<std::uint16_t>(bits >> 16)};
}

float to_float(float16 value) {
  const std::uint32_t sign = static_cast<std::uint32_t>(value.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (value.bits >> 10) & 0x1fu;
  std::uint32_t mantissa = value.bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

float16 to_float16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return {static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // overflow
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    const float magnitude = std::bit_cast<float>(abs);
    // Adding 0.5 scales the value into float's mantissa so that the FPU rounds it to
    // nearest even at the half-subnormal step of 2^-24.
    const float shifted = magnitude + 0.5f;
    return {static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3f000000u))};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  rounded -= 112u << 23;
  return {static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

}  // namespace ddp
