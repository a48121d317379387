#include "kernels/ref/peak_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant_blocks.h"

namespace snapfill::ref {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// vpmaddubsw on one 16-bit lane: its two bytes (low first) as u8, times -2
// as s8, summed with signed saturation.
int16_t MaddubsLane(int16_t a) {
  const auto u = static_cast<uint16_t>(a);
  const int32_t sum = (u & 0xFF) * -2 + (u >> 8) * -2;
  return static_cast<int16_t>(std::clamp(sum, -32768, 32767));
}

}  // namespace

void PeakChains(PeakInstruction instruction, int64_t steps, uint32_t lane0[12]) {
  for (int c = 0; c < 12; ++c) {
    switch (instruction) {
      case PeakInstruction::kFmaYmm:
      case PeakInstruction::kFmaZmm: {
        float a = 0.001f * c;
        for (int64_t s = 0; s < steps; ++s) a = std::fma(a, 0.999f, 0.0001f);
        lane0[c] = Bits(a);
        break;
      }
      case PeakInstruction::kMaddubsYmm: {
        // Every byte starts at c + 1; each 16-bit lane is a function of its own
        // two bytes, so all lanes stay equal and lane 0's 32 bits are two of them.
        auto a = static_cast<int16_t>(static_cast<uint16_t>(c + 1) * 0x0101);
        for (int64_t s = 0; s < steps; ++s) a = MaddubsLane(a);
        const auto h = static_cast<uint16_t>(a);
        lane0[c] = static_cast<uint32_t>(h) | static_cast<uint32_t>(h) << 16;
        break;
      }
      case PeakInstruction::kDpbusdYmm:
      case PeakInstruction::kDpbusdZmm: {
        // Each step adds 4 · (3 · -2) to every int32 lane, wrapping.
        uint32_t a = static_cast<uint32_t>(c);
        for (int64_t s = 0; s < steps; ++s) a += static_cast<uint32_t>(-24);
        lane0[c] = a;
        break;
      }
      case PeakInstruction::kDpbf16Zmm: {
        // The bf16 products are exact in f32; each of the two adds rounds
        // to nearest even (the values here are never denormal).
        const float x = Bf16ToFp32(Fp32ToBf16Rne(0.001f)), y = Bf16ToFp32(Fp32ToBf16Rne(0.002f));
        float a = 0.001f * c;
        for (int64_t s = 0; s < steps; ++s) {
          a = a + x * y;
          a = a + x * y;
        }
        lane0[c] = Bits(a);
        break;
      }
      case PeakInstruction::kNone:
        lane0[c] = 0;
        break;
    }
  }
}

}  // namespace snapfill::ref
