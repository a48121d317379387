// IEEE binary16 conversions, scalar and exact (every f16 is an f32), for
// every layer: the kernels' quantized blocks, the KV cache's fp16 copy and
// the recall store's f16 entries. They compile for CUDA devices as well, so
// that a device converts with these very functions (kernels/cuda/ops.cu).
#ifndef SNAPFILL_BASE_HALF_H_
#define SNAPFILL_BASE_HALF_H_

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SNAPFILL_HALF_HOST_DEVICE __host__ __device__
#else
#define SNAPFILL_HALF_HOST_DEVICE
#endif

namespace snapfill {

SNAPFILL_HALF_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
SNAPFILL_HALF_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 -> binary32, exact for every input (subnormals, inf); a
// NaN keeps its payload and comes back quiet, as F16C's vcvtph2ps gives it.
SNAPFILL_HALF_HOST_DEVICE inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);  // ±0
  // Subnormal: value = mant * 2^-24, exactly representable in f32.
  const float v = static_cast<float>(mant) * BitsToFloat(0x33800000u);  // 2^-24
  return sign ? -v : v;
}

// binary32 -> binary16 with round-to-nearest-even (what F16C's vcvtps2ph
// with rounding mode 0 and ggml's scalar fallback produce for numbers; ggml
// makes every NaN 0x7E00). Overflow gives ±inf; a NaN keeps its sign and
// its payload's top 10 bits, quiet (F16C's bits, so the vector kernels and
// the device agree with this on every input).
SNAPFILL_HALF_HOST_DEVICE inline uint16_t Fp32ToFp16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00 | ((ax >> 13) & 0x3FF);  // NaN, quiet
  if (ax >= 0x477FF000u) return sign | 0x7C00;  // rounds to >= 65536: inf
  if (ax < 0x38800000u) {
    // Result is subnormal or zero: h = round(|f| / 2^-24) with ties to even.
    if (ax < 0x33000000u) return sign;  // < 2^-25: rounds to 0 (2^-25 exactly ties to 0)
    const uint32_t e = ax >> 23;  // biased exponent, 102..112
    const uint32_t m = (ax & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;  // value = m * 2^(e-150) → units of 2^-24: m >> (126-e)
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits to even.
  uint32_t r = ax - 0x38000000u;  // exponent 127 -> 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;  // may carry into exponent: fine
  return sign | static_cast<uint16_t>(r);
}

}  // namespace snapfill

#endif  // SNAPFILL_BASE_HALF_H_
