// 16-bit floating point storage types: IEEE 754 binary16 (Float16) and
// bfloat16 (BFloat16). Both convert to and from float with
// round-to-nearest-even; arithmetic is done in float by callers.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace sluice {

struct Float16 {
  uint16_t bits = 0;

  Float16() = default;
  explicit Float16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return ToFloat(bits); }

  static uint16_t FromFloat(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan
      return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
      return static_cast<uint16_t>(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
      // value = abs_float; half subnormal unit is 2^-24.
      float af = std::bit_cast<float>(abs);
      // Scale so that one half-subnormal ulp is 1.0, then round to nearest even
      // via the float adder (2^23 trick keeps rounding exact).
      float scaled = af * 16777216.0f;  // 2^24
      float r = (scaled + 8388608.0f) - 8388608.0f;  // round-half-even to integer
      return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
    }
    // Normal: rebias exponent (127 -> 15) and round mantissa 23 -> 10 bits.
    uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xfffu + mant_odd;  // round to nearest even
    abs -= (112u << 23);
    return static_cast<uint16_t>(sign | (abs >> 13));
  }

  static float ToFloat(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t out;
    if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: value = mant * 2^-24
        float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
        out = sign | std::bit_cast<uint32_t>(f);
      }
    } else if (exp == 0x1f) {
      out = sign | 0x7f800000u | (mant << 13);
    } else {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    return std::bit_cast<float>(out);
  }
};

struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return ToFloat(bits); }

  static uint16_t FromFloat(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {  // nan: keep it a quiet nan
      return static_cast<uint16_t>((x >> 16) | 0x40u);
    }
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return static_cast<uint16_t>(x >> 16);
  }

  static float ToFloat(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
  }
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2);

}  // namespace sluice
