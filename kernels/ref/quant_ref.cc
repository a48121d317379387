#include "kernels/ref/quant_ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

// ggml's reference code is C compiled without FP contraction; keep a*b + c
// as two roundings here too (the quantizers' "x * id + 8.5f" depend on it).
#pragma GCC optimize("fp-contract=off")

namespace snapfill::ref {
namespace {

// ggml's nearest_int: round to nearest, ties to even. ggml adds 1.5 * 2^23
// and reads the mantissa; for |f| <= 2^22 that is exactly nearbyint in the
// default rounding mode, which is what we call (no add that could fuse with
// the caller's multiply).
int NearestInt(float f) { return static_cast<int>(std::nearbyint(f)); }

// Smallest fp16 value >= v (v > 0, finite, below the fp16 maximum), so a
// stored scale never shrinks below what the quantizer asked for.
uint16_t Fp16RoundUp(float v) {
  uint16_t h = Fp32ToFp16(v);
  if (Fp16ToFp32(h) < v) ++h;
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------
// Dequantization.

void DequantizeRowF32(const float* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k; ++i) y[i] = x[i];
}

void DequantizeRowF16(const uint16_t* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k; ++i) y[i] = Fp16ToFp32(x[i]);
}

void DequantizeRowBF16(const uint16_t* x, float* y, int64_t k) {
  for (int64_t i = 0; i < k; ++i) y[i] = Bf16ToFp32(x[i]);
}

void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK4_0; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[b * kQK4_0 + j] = static_cast<float>((x[b].qs[j] & 0xF) - 8) * d;
      y[b * kQK4_0 + j + kQK4_0 / 2] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK4_1; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float m = Fp16ToFp32(x[b].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      y[b * kQK4_1 + j] = std::fmaf(static_cast<float>(x[b].qs[j] & 0xF), d, m);
      y[b * kQK4_1 + j + kQK4_1 / 2] = std::fmaf(static_cast<float>(x[b].qs[j] >> 4), d, m);
    }
  }
}

namespace {

// The fifth bit of element j (0..31) of a Q5_0 / Q5_1 block, as 0 or 16.
int Q5High(const uint8_t qh[4], int j) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return static_cast<int>((h >> j) & 1) << 4;
}

}  // namespace

void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < 16; ++j) {
      y[b * 32 + j] = static_cast<float>(((x[b].qs[j] & 0xF) | Q5High(x[b].qh, j)) - 16) * d;
      y[b * 32 + j + 16] = static_cast<float>(((x[b].qs[j] >> 4) | Q5High(x[b].qh, j + 16)) - 16) * d;
    }
  }
}

void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float m = Fp16ToFp32(x[b].m);
    for (int j = 0; j < 16; ++j) {
      y[b * 32 + j] = std::fmaf(static_cast<float>((x[b].qs[j] & 0xF) | Q5High(x[b].qh, j)), d, m);
      y[b * 32 + j + 16] = std::fmaf(static_cast<float>((x[b].qs[j] >> 4) | Q5High(x[b].qh, j + 16)), d, m);
    }
  }
}

void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK8_0; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < kQK8_0; ++j) y[b * kQK8_0 + j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

void DequantizeRowQ8_1(const BlockQ8_1* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK8_1; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    for (int j = 0; j < kQK8_1; ++j) y[b * kQK8_1 + j] = static_cast<float>(x[b].qs[j]) * d;
  }
}

void DequantizeRowQ8_K(const BlockQ8_K* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    for (int j = 0; j < kQK_K; ++j) y[b * kQK_K + j] = static_cast<float>(x[b].qs[j]) * x[b].d;
  }
}

void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float dmin = Fp16ToFp32(x[b].dmin);
    float* out = y + b * kQK_K;
    // Four chunks of 64: sub-block 2c in the low nibbles of qs[32c..32c+31],
    // sub-block 2c+1 in their high nibbles.
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      uint8_t sc, m;
      GetScaleMinK4(2 * c, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(2 * c + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        out[64 * c + l] = std::fmaf(d1, static_cast<float>(q[l] & 0xF), -m1);
        out[64 * c + 32 + l] = std::fmaf(d2, static_cast<float>(q[l] >> 4), -m2);
      }
    }
  }
}

void DequantizeRowQ5_K(const BlockQ5_K* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    const float dmin = Fp16ToFp32(x[b].dmin);
    float* out = y + b * kQK_K;
    // As Q4_K, each element's fifth bit from qh (see BlockQ5_K).
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = x[b].qs + 32 * c;
      uint8_t sc, m;
      GetScaleMinK4(2 * c, x[b].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      GetScaleMinK4(2 * c + 1, x[b].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        const int h1 = (x[b].qh[l] >> (2 * c)) & 1, h2 = (x[b].qh[l] >> (2 * c + 1)) & 1;
        out[64 * c + l] = std::fmaf(d1, static_cast<float>((q[l] & 0xF) | (h1 << 4)), -m1);
        out[64 * c + 32 + l] = std::fmaf(d2, static_cast<float>((q[l] >> 4) | (h2 << 4)), -m2);
      }
    }
  }
}

// Q6_K: each 128-element half h uses ql[64h..64h+63], qh[32h..32h+31] and
// scales[8h..8h+7]. For l in 0..31, element 128h + 32r + l (r = 0..3) takes
//   low 4 bits: r=0 ql[l]&15, r=1 ql[l+32]&15, r=2 ql[l]>>4, r=3 ql[l+32]>>4
//   high 2 bits: (qh[l] >> 2r) & 3
// and its group scale is scales[8h + 2r + l/16].
void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const float d = Fp16ToFp32(x[b].d);
    float* out = y + b * kQK_K;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = x[b].ql + 64 * h;
      const uint8_t* qh = x[b].qh + 32 * h;
      const int8_t* sc = x[b].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {
            ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32,
            ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32,
            ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32,
            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32,
        };
        for (int r = 0; r < 4; ++r) {
          out[128 * h + 32 * r + l] = d * static_cast<float>(sc[2 * r + l / 16]) * static_cast<float>(q[r]);
        }
      }
    }
  }
}

bool DequantizeRow(GgmlType type, const void* x, float* y, int64_t k) {
  switch (type) {
    case GgmlType::kF32: DequantizeRowF32(static_cast<const float*>(x), y, k); return true;
    case GgmlType::kF16: DequantizeRowF16(static_cast<const uint16_t*>(x), y, k); return true;
    case GgmlType::kBF16: DequantizeRowBF16(static_cast<const uint16_t*>(x), y, k); return true;
    case GgmlType::kQ4_0: DequantizeRowQ4_0(static_cast<const BlockQ4_0*>(x), y, k); return true;
    case GgmlType::kQ4_1: DequantizeRowQ4_1(static_cast<const BlockQ4_1*>(x), y, k); return true;
    case GgmlType::kQ5_0: DequantizeRowQ5_0(static_cast<const BlockQ5_0*>(x), y, k); return true;
    case GgmlType::kQ5_1: DequantizeRowQ5_1(static_cast<const BlockQ5_1*>(x), y, k); return true;
    case GgmlType::kQ5_K: DequantizeRowQ5_K(static_cast<const BlockQ5_K*>(x), y, k); return true;
    case GgmlType::kQ8_0: DequantizeRowQ8_0(static_cast<const BlockQ8_0*>(x), y, k); return true;
    case GgmlType::kQ8_1: DequantizeRowQ8_1(static_cast<const BlockQ8_1*>(x), y, k); return true;
    case GgmlType::kQ4_K: DequantizeRowQ4_K(static_cast<const BlockQ4_K*>(x), y, k); return true;
    case GgmlType::kQ6_K: DequantizeRowQ6_K(static_cast<const BlockQ6_K*>(x), y, k); return true;
    case GgmlType::kQ8_K: DequantizeRowQ8_K(static_cast<const BlockQ8_K*>(x), y, k); return true;
    default: return false;
  }
}

bool QuantizeRow(GgmlType type, const float* x, void* y, int64_t k) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(y, x, k * sizeof(float)); return true;
    case GgmlType::kF16:
      for (int64_t i = 0; i < k; ++i) static_cast<uint16_t*>(y)[i] = Fp32ToFp16(x[i]);
      return true;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < k; ++i) static_cast<uint16_t*>(y)[i] = Fp32ToBf16(x[i]);
      return true;
    case GgmlType::kQ4_0: QuantizeRowQ4_0(x, static_cast<BlockQ4_0*>(y), k); return true;
    case GgmlType::kQ4_1: QuantizeRowQ4_1(x, static_cast<BlockQ4_1*>(y), k); return true;
    case GgmlType::kQ5_0: QuantizeRowQ5_0(x, static_cast<BlockQ5_0*>(y), k); return true;
    case GgmlType::kQ5_1: QuantizeRowQ5_1(x, static_cast<BlockQ5_1*>(y), k); return true;
    case GgmlType::kQ5_K: QuantizeRowQ5_K(x, static_cast<BlockQ5_K*>(y), k); return true;
    case GgmlType::kQ8_0: QuantizeRowQ8_0(x, static_cast<BlockQ8_0*>(y), k); return true;
    case GgmlType::kQ4_K: QuantizeRowQ4_K(x, static_cast<BlockQ4_K*>(y), k); return true;
    case GgmlType::kQ6_K: QuantizeRowQ6_K(x, static_cast<BlockQ6_K*>(y), k); return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------
// Activation quantizers.

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK8_0; ++b) {
    const float* xb = x + b * kQK8_0;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[b].qs[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
  }
}

void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK8_1; ++b) {
    const float* xb = x + b * kQK8_1;
    float amax = 0.0f;
    for (int j = 0; j < kQK8_1; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    int sum = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::roundf(xb[j] * id));
      sum += y[b].qs[j];
    }
    y[b].s = Fp32ToFp16(static_cast<float>(sum) * d);
  }
}

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax == 0.0f) {
      y[b].d = 0.0f;
      std::memset(y[b].qs, 0, sizeof(y[b].qs));
      // ggml leaves bsums untouched here; we zero them (they are Σ of zeros).
      std::memset(y[b].bsums, 0, sizeof(y[b].bsums));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[b].qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * xb[j])));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[b].qs[16 * g + j];
      y[b].bsums[g] = static_cast<int16_t>(sum);
    }
    y[b].d = 1.0f / iscale;
  }
}

// ---------------------------------------------------------------------------
// Weight quantizers (test data).

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK4_0; ++b) {
    const float* xb = x + b * kQK4_0;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(xb[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(xb[j + kQK4_0 / 2] * id + 8.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ4_1(const float* x, BlockQ4_1* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK4_1; ++b) {
    const float* xb = x + b * kQK4_1;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < kQK4_1; ++j) {
      min = std::min(min, xb[j]);
      max = std::max(max, xb[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    y[b].m = Fp32ToFp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((xb[j] - min) * id + 0.5f)));
      const int q1 = std::min(
          15, static_cast<int>(static_cast<int8_t>((xb[j + kQK4_1 / 2] - min) * id + 0.5f)));
      y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

namespace {

// The scales of one Q4_K / Q5_K super-block (kMax = 15 / 31 levels) and its
// 256 quants q (0..kMax), element order: see QuantizeRowQ4_K in the header.
template <int kMax>
void QuantizeKSuper(const float* xb, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales, uint8_t* q) {
  float lo[8], hi[8];
  float max_neg_lo = 0.0f;
  for (int j = 0; j < 8; ++j) {
    lo[j] = 0.0f;  // the offset -dmin*m is <= 0, so include 0 in the range
    hi[j] = 0.0f;
    for (int l = 0; l < 32; ++l) {
      lo[j] = std::min(lo[j], xb[32 * j + l]);
      hi[j] = std::max(hi[j], xb[32 * j + l]);
    }
    max_neg_lo = std::max(max_neg_lo, -lo[j]);
  }
  // Mins: m_j = ceil(-lo_j / dmin) so that -dmin*m_j <= lo_j.
  const uint16_t dmin_h = max_neg_lo > 0.0f ? Fp16RoundUp(max_neg_lo / 63.0f) : 0;
  const float dmin = Fp16ToFp32(dmin_h);
  int m[8];
  float need[8];  // required step so the kMax + 1 levels reach hi_j
  float max_need = 0.0f;
  for (int j = 0; j < 8; ++j) {
    m[j] = dmin > 0.0f ? std::min(63, static_cast<int>(std::ceil(-lo[j] / dmin))) : 0;
    need[j] = (hi[j] + dmin * m[j]) / static_cast<float>(kMax);
    max_need = std::max(max_need, need[j]);
  }
  const uint16_t d_h = max_need > 0.0f ? Fp16RoundUp(max_need / 63.0f) : 0;
  const float d = Fp16ToFp32(d_h);
  int sc[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0.0f ? std::min(63, static_cast<int>(std::ceil(need[j] / d))) : 0;
  }
  *d_out = d_h;
  *dmin_out = dmin_h;
  std::memset(scales, 0, kKScaleSize);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      scales[j] |= sc[j];
      scales[j + 4] |= m[j];
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((m[j] >> 4) << 6);
    }
  }
  for (int j = 0; j < 8; ++j) {
    const float step = d * sc[j];
    const float offset = dmin * m[j];
    for (int l = 0; l < 32; ++l) {
      const int v = step > 0.0f ? NearestInt((xb[32 * j + l] + offset) / step) : 0;
      q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0, kMax));
    }
  }
}

// Q5_0 / Q5_1's nibbles and fifth bits of 32 quants (0..31).
void PackQ5(const int* q, uint8_t qs[16], uint8_t qh[4]) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh, &h, 4);
}

}  // namespace

void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    uint8_t q[kQK_K];
    QuantizeKSuper<15>(x + b * kQK_K, &y[b].d, &y[b].dmin, y[b].scales, q);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[b].qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
      }
    }
  }
}

void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    uint8_t q[kQK_K];
    QuantizeKSuper<31>(x + b * kQK_K, &y[b].d, &y[b].dmin, y[b].scales, q);
    std::memset(y[b].qh, 0, sizeof(y[b].qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = q[64 * c + l], q2 = q[64 * c + 32 + l];
        y[b].qs[32 * c + l] = static_cast<uint8_t>((q1 & 0xF) | ((q2 & 0xF) << 4));
        y[b].qh[l] |= static_cast<uint8_t>(((q1 >> 4) << (2 * c)) | ((q2 >> 4) << (2 * c + 1)));
      }
    }
  }
}

void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(xb[j])) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(xb[j] * id + 16.5f)));
    PackQ5(q, y[b].qs, y[b].qh);
  }
}

void QuantizeRowQ5_1(const float* x, BlockQ5_1* y, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* xb = x + b * 32;
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; ++j) {
      min = std::min(min, xb[j]);
      max = std::max(max, xb[j]);
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = Fp32ToFp16(d);
    y[b].m = Fp32ToFp16(min);
    int q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<uint8_t>((xb[j] - min) * id + 0.5f)));
    }
    PackQ5(q, y[b].qs, y[b].qh);
  }
}

void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t k) {
  for (int64_t b = 0; b < k / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    float s[16];
    float max_s = 0.0f;
    for (int g = 0; g < 16; ++g) {
      float amax = 0.0f;
      for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(xb[16 * g + l]));
      s[g] = amax / 31.5f;
      max_s = std::max(max_s, s[g]);
    }
    const uint16_t d_h = max_s > 0.0f ? Fp16RoundUp(max_s / 127.0f) : 0;
    const float d = Fp16ToFp32(d_h);
    y[b].d = d_h;
    uint8_t q[kQK_K];
    for (int g = 0; g < 16; ++g) {
      const int sc = d > 0.0f ? std::min(127, static_cast<int>(std::ceil(s[g] / d))) : 0;
      y[b].scales[g] = static_cast<int8_t>(sc);
      const float step = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        const int v = step > 0.0f ? NearestInt(xb[16 * g + l] / step) : 0;
        q[16 * g + l] = static_cast<uint8_t>(std::clamp(v, -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      uint8_t* ql = y[b].ql + 64 * h;
      uint8_t* qh = y[b].qh + 32 * h;
      const uint8_t* qq = q + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) |
                                     ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Matrix products.

GgmlType ActivationType(GgmlType w_type) {  // (Q5_1 / Q5_K: kF32, as the float types)
  switch (w_type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0: return GgmlType::kQ8_0;
    case GgmlType::kQ4_1: return GgmlType::kQ8_1;
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K: return GgmlType::kQ8_K;
    default: return GgmlType::kF32;
  }
}

bool MatMul(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w,
            GgmlType w_type, int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
  if (!IsSupportedWeightType(w_type)) return false;
  std::vector<float> wrow(k);
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRow(w_type, static_cast<const uint8_t*>(w) + j * w_row_bytes, wrow.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(x[i * x_stride + t]) * wrow[t];
      y[i * y_stride + j] = static_cast<float>(acc);
    }
  }
  return true;
}

bool MatMulBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w, GgmlType w_type,
                int64_t n, size_t w_row_bytes, float* y, int64_t y_stride, double* abs_terms) {
  if (!IsSupportedWeightType(w_type)) return false;
  std::vector<float> wrow(k);
  std::vector<double> xb(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) xb[i * k + t] = Bf16ToFp32(Fp32ToBf16Rne(x[i * x_stride + t]));
  }
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRow(w_type, static_cast<const uint8_t*>(w) + j * w_row_bytes, wrow.data(), k);
    for (float& v : wrow) v = Bf16ToFp32(Fp32ToBf16Rne(v));
    for (int64_t i = 0; i < m; ++i) {
      double acc = 0.0, abs = 0.0;
      for (int64_t t = 0; t < k; ++t) {
        const double term = xb[i * k + t] * wrow[t];  // exact: two 8-bit significands
        acc += term;
        abs += std::fabs(term);
      }
      y[i * y_stride + j] = static_cast<float>(acc);
      if (abs_terms != nullptr) abs_terms[i * n + j] = abs;
    }
  }
  return true;
}

namespace {

// One (weight row, activation row) dot in ggml's arithmetic; `abs` gets the
// sum of term magnitudes (see the header).
double DotQ4_0(const BlockQ4_0* w, const BlockQ8_0* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    int64_t sumi = 0, sum_abs = 0, sum_a = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (w[b].qs[j] & 0xF), q1 = (w[b].qs[j] >> 4);
      sumi += (q0 - 8) * a[b].qs[j] + (q1 - 8) * a[b].qs[j + 16];
      sum_abs += std::abs(q0 * a[b].qs[j]) + std::abs(q1 * a[b].qs[j + 16]);
      sum_a += a[b].qs[j] + a[b].qs[j + 16];
    }
    const double s = static_cast<double>(Fp16ToFp32(w[b].d)) * Fp16ToFp32(a[b].d);
    acc += s * static_cast<double>(sumi);
    *abs += std::fabs(s) * static_cast<double>(sum_abs + 8 * std::abs(sum_a));
  }
  return acc;
}

double DotQ4_1(const BlockQ4_1* w, const BlockQ8_1* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    int64_t sumi = 0, sum_abs = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (w[b].qs[j] & 0xF), q1 = (w[b].qs[j] >> 4);
      sumi += q0 * a[b].qs[j] + q1 * a[b].qs[j + 16];
      sum_abs += std::abs(q0 * a[b].qs[j]) + std::abs(q1 * a[b].qs[j + 16]);
    }
    const double s = static_cast<double>(Fp16ToFp32(w[b].d)) * Fp16ToFp32(a[b].d);
    const double corr = static_cast<double>(Fp16ToFp32(w[b].m)) * Fp16ToFp32(a[b].s);
    acc += s * static_cast<double>(sumi) + corr;
    *abs += std::fabs(s) * static_cast<double>(sum_abs) + std::fabs(corr);
  }
  return acc;
}

double DotQ8_0(const BlockQ8_0* w, const BlockQ8_0* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    int64_t sumi = 0, sum_abs = 0, sum_w = 0;
    for (int j = 0; j < 32; ++j) {
      sumi += w[b].qs[j] * a[b].qs[j];
      sum_abs += std::abs(w[b].qs[j] * a[b].qs[j]);
      sum_w += w[b].qs[j];
    }
    const double s = static_cast<double>(Fp16ToFp32(w[b].d)) * Fp16ToFp32(a[b].d);
    acc += s * static_cast<double>(sumi);
    // A kernel may offset the activations by 128 (u8 × s8 products).
    *abs += std::fabs(s) * static_cast<double>(sum_abs + 128 * std::abs(sum_w));
  }
  return acc;
}

// ggml's Q5_0 · Q8_0: the weights' 5-bit q − 16 against the activations'
// int8, an int32 sum per block scaled by both d.
double DotQ5_0(const BlockQ5_0* w, const BlockQ8_0* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    uint32_t h;
    std::memcpy(&h, w[b].qh, 4);
    int64_t sumi = 0, sum_abs = 0, sum_w = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = ((w[b].qs[j] & 0xF) | static_cast<int>(((h >> j) & 1) << 4)) - 16;
      const int hi = ((w[b].qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1) << 4)) - 16;
      sumi += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
      sum_abs += std::abs(lo * a[b].qs[j]) + std::abs(hi * a[b].qs[j + 16]);
      sum_w += lo + hi;
    }
    const double s = static_cast<double>(Fp16ToFp32(w[b].d)) * Fp16ToFp32(a[b].d);
    acc += s * static_cast<double>(sumi);
    // A kernel may offset the activations by 128 (u8 × s8 products), as for Q8_0.
    *abs += std::fabs(s) * static_cast<double>(sum_abs + 128 * std::abs(sum_w));
  }
  return acc;
}

double DotQ4_K(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    int64_t sum_sc = 0, sum_abs = 0, sum_min = 0, sum_min_abs = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      GetScaleMinK4(j, w[b].scales, &sc, &mn);
      const uint8_t* q = w[b].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      int64_t sumi = 0, sumi_abs = 0;
      for (int l = 0; l < 32; ++l) {
        const int qv = (q[l] >> shift) & 0xF;
        sumi += qv * a[b].qs[32 * j + l];
        sumi_abs += std::abs(qv * a[b].qs[32 * j + l]);
      }
      sum_sc += sc * sumi;
      sum_abs += sc * sumi_abs;
      const int bs = a[b].bsums[2 * j] + a[b].bsums[2 * j + 1];
      sum_min += mn * bs;
      sum_min_abs += mn * (std::abs(a[b].bsums[2 * j]) + std::abs(a[b].bsums[2 * j + 1]));
    }
    const double d = static_cast<double>(Fp16ToFp32(w[b].d)) * a[b].d;
    const double dmin = static_cast<double>(Fp16ToFp32(w[b].dmin)) * a[b].d;
    acc += d * static_cast<double>(sum_sc) - dmin * static_cast<double>(sum_min);
    *abs += std::fabs(d) * static_cast<double>(sum_abs) + std::fabs(dmin) * static_cast<double>(sum_min_abs);
  }
  return acc;
}

double DotQ6_K(const BlockQ6_K* w, const BlockQ8_K* a, int64_t nb, double* abs) {
  double acc = 0.0;
  *abs = 0.0;
  for (int64_t b = 0; b < nb; ++b) {
    // Decode the 6-bit values in element order (see DequantizeRowQ6_K).
    int q[kQK_K];
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[b].ql + 64 * h;
      const uint8_t* qh = w[b].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        q[128 * h + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
        q[128 * h + 32 + l] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        q[128 * h + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        q[128 * h + 96 + l] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
    int64_t sum = 0, sum_abs = 0;
    for (int g = 0; g < 16; ++g) {
      int64_t sumi = 0, sumi_abs = 0;
      for (int l = 0; l < 16; ++l) {
        sumi += (q[16 * g + l] - 32) * a[b].qs[16 * g + l];
        sumi_abs += std::abs(q[16 * g + l] * a[b].qs[16 * g + l]);
      }
      sum += w[b].scales[g] * sumi;
      sum_abs += std::abs(static_cast<int>(w[b].scales[g])) * (sumi_abs + 32 * std::abs(a[b].bsums[g]));
    }
    const double d = static_cast<double>(Fp16ToFp32(w[b].d)) * a[b].d;
    acc += d * static_cast<double>(sum);
    *abs += std::fabs(d) * static_cast<double>(sum_abs);
  }
  return acc;
}

template <typename WBlock, typename ABlock, typename Quantize, typename Dot>
void QuantizedProduct(const float* x, int64_t m, int64_t k, int64_t x_stride, const void* w,
                      int64_t n, size_t w_row_bytes, float* y, int64_t y_stride,
                      double* abs_terms, int block_size, Quantize quantize, Dot dot) {
  const int64_t nb = k / block_size;
  std::vector<ABlock> xq(static_cast<size_t>(m * nb));
  for (int64_t i = 0; i < m; ++i) quantize(x + i * x_stride, xq.data() + i * nb, k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const auto* wr = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + j * w_row_bytes);
      double abs = 0.0;
      y[i * y_stride + j] = static_cast<float>(dot(wr, xq.data() + i * nb, nb, &abs));
      if (abs_terms != nullptr) abs_terms[i * y_stride + j] = abs;
    }
  }
}

}  // namespace

bool MatMulQuantizedActivations(const float* x, int64_t m, int64_t k, int64_t x_stride,
                                const void* w, GgmlType w_type, int64_t n, size_t w_row_bytes,
                                float* y, int64_t y_stride, double* abs_terms) {
  switch (w_type) {
    case GgmlType::kQ4_0:
      QuantizedProduct<BlockQ4_0, BlockQ8_0>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK8_0, QuantizeRowQ8_0, DotQ4_0);
      return true;
    case GgmlType::kQ4_1:
      QuantizedProduct<BlockQ4_1, BlockQ8_1>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK8_1, QuantizeRowQ8_1, DotQ4_1);
      return true;
    case GgmlType::kQ8_0:
      QuantizedProduct<BlockQ8_0, BlockQ8_0>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK8_0, QuantizeRowQ8_0, DotQ8_0);
      return true;
    case GgmlType::kQ5_0:
      QuantizedProduct<BlockQ5_0, BlockQ8_0>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK8_0, QuantizeRowQ8_0, DotQ5_0);
      return true;
    case GgmlType::kQ4_K:
      QuantizedProduct<BlockQ4_K, BlockQ8_K>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK_K, QuantizeRowQ8_K, DotQ4_K);
      return true;
    case GgmlType::kQ6_K:
      QuantizedProduct<BlockQ6_K, BlockQ8_K>(x, m, k, x_stride, w, n, w_row_bytes, y, y_stride,
                                             abs_terms, kQK_K, QuantizeRowQ8_K, DotQ6_K);
      return true;
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ5_1:
    case GgmlType::kQ5_K: {
      if (!MatMul(x, m, k, x_stride, w, w_type, n, w_row_bytes, y, y_stride)) return false;
      if (abs_terms != nullptr) {
        std::vector<float> wrow(k);
        for (int64_t j = 0; j < n; ++j) {
          DequantizeRow(w_type, static_cast<const uint8_t*>(w) + j * w_row_bytes, wrow.data(), k);
          for (int64_t i = 0; i < m; ++i) {
            double a = 0.0;
            for (int64_t t = 0; t < k; ++t) a += std::fabs(static_cast<double>(x[i * x_stride + t]) * wrow[t]);
            abs_terms[i * y_stride + j] = a;
          }
        }
      }
      return true;
    }
    default: return false;
  }
}

bool UnpackDecodeLayout(const void* packed, GgmlType type, int64_t n, int64_t k, void* rows, size_t row_bytes) {
  const int64_t rec = DecodeRecordBytes(type), quant = DecodeQuantBytes(type);
  if (rec == 0 || k % 32 != 0) return false;
  const int64_t nb = k / 32;
  const int64_t blk = static_cast<int64_t>(RowBytes(type, 32));
  const bool q5 = type == GgmlType::kQ5_0;
  const int64_t qs_off = type == GgmlType::kQ4_1 ? 4 : q5 ? 6 : 2;
  const int64_t words = DecodeQuantWords(type);
  const auto* src = static_cast<const uint8_t*>(packed);
  auto* dst = static_cast<uint8_t*>(rows);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t g = j / kDecodeGroupRows, r = j % kDecodeGroupRows;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* rp = src + (g * nb + b) * rec;
      uint8_t* out = dst + j * row_bytes + b * blk;
      for (int64_t t = 0; t < words; ++t) std::memcpy(out + qs_off + 4 * t, rp + 64 * t + 4 * r, 4);
      if (q5) {
        uint32_t bits;
        std::memcpy(&bits, rp + kDecodeQ5BitsOffset + 4 * r, 4);
        const uint32_t qh = Q5BitsFromDecode(bits);
        std::memcpy(out + 2, &qh, 4);
      }
      std::memcpy(out, rp + quant + 2 * r, 2);
      if (type == GgmlType::kQ4_1) std::memcpy(out + 2, rp + quant + 32 + 2 * r, 2);
    }
  }
  return true;
}

bool MatMulDecodePacked(const float* x, int64_t k, const void* packed, GgmlType type, int64_t n, float* y,
                        double* abs_terms) {
  const size_t row_bytes = RowBytes(type, k);
  std::vector<uint8_t> rows(row_bytes * n);
  if (!UnpackDecodeLayout(packed, type, n, k, rows.data(), row_bytes)) return false;
  return MatMulQuantizedActivations(x, 1, k, k, rows.data(), type, n, row_bytes, y, n, abs_terms);
}

}  // namespace snapfill::ref
