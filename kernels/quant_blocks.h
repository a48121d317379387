// ggml block layouts for the quantized types snapfill reads from GGUF files,
// and the scalar fp16/bf16 conversions they need.
//
// Shared by kernels/ref and kernels/cpu (pure std, header only). The structs
// are byte-for-byte the ones in ggml's ggml/src/ggml-common.h, so a row of a
// GGUF tensor can be reinterpreted as an array of blocks. Each has a size
// static_assert, as ggml does. Half-precision fields are stored as raw
// uint16_t bits and converted with the helpers below.
#ifndef SNAPFILL_KERNELS_QUANT_BLOCKS_H_
#define SNAPFILL_KERNELS_QUANT_BLOCKS_H_

#include <cstdint>
#include <cstring>

#include "snapfill/dtype.h"
#include "src/base/half.h"

namespace snapfill {

inline constexpr int kQK4_0 = 32;  // elements per Q4_0 block
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;
inline constexpr int kQK_K = 256;  // elements per K-quant super-block
inline constexpr int kKScaleSize = 12;  // bytes of packed 6-bit scales/mins (Q4_K)

// x[i] = d * (q[i] - 8). Element j < 16 is the low nibble of qs[j],
// element j + 16 its high nibble.
struct BlockQ4_0 {
  uint16_t d;             // fp16 scale
  uint8_t qs[kQK4_0 / 2];  // nibbles
};
static_assert(sizeof(BlockQ4_0) == 2 + kQK4_0 / 2, "wrong q4_0 block size/padding");

// x[i] = d * q[i] + m, same nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 min
  uint8_t qs[kQK4_1 / 2];
};
static_assert(sizeof(BlockQ4_1) == 4 + kQK4_1 / 2, "wrong q4_1 block size/padding");

// x[i] = d * (q[i] - 16), q 5 bits: element j < 16 is the low nibble of
// qs[j] with bit j of qh as its fifth bit; element j + 16 the high nibble,
// with bit j + 16 (ggml's layout; qh read as a little-endian uint32).
struct BlockQ5_0 {
  uint16_t d;  // fp16 scale
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "wrong q5_0 block size/padding");

// x[i] = d * q[i] + m, q as in Q5_0 (0..31).
struct BlockQ5_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 min
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "wrong q5_1 block size/padding");

// x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 2 + kQK8_0, "wrong q8_0 block size/padding");

// Activation format partnering Q4_1: x[i] = d * qs[i]; s = fp16(d * Σ qs)
// (d before its fp16 rounding), which carries the min term of Q4_1 dots.
struct BlockQ8_1 {
  uint16_t d;  // fp16 scale
  uint16_t s;  // fp16 d * sum(qs)
  int8_t qs[kQK8_1];
};
static_assert(sizeof(BlockQ8_1) == 4 + kQK8_1, "wrong q8_1 block size/padding");

// 8 sub-blocks of 32: x = d * sc[j] * q - dmin * m[j], q in 0..15.
// scales[12] packs eight 6-bit (sc, m) pairs; see GetScaleMinK4.
// qs: for each 64-element chunk c (0..3), 32 bytes whose low nibbles are
// elements 64c + 0..31 and high nibbles 64c + 32..63.
struct BlockQ4_K {
  uint16_t d;     // fp16 super-block scale for the sub-block scales
  uint16_t dmin;  // fp16 super-block scale for the sub-block mins
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 4 + kKScaleSize + kQK_K / 2, "wrong q4_K block size/padding");

// Q4_K with a fifth bit: 8 sub-blocks of 32, x = d * sc[j] * q - dmin *
// m[j], q in 0..31; scales as Q4_K; qs as Q4_K's nibbles; the fifth bit of
// element 64c + l (l < 32) is bit 2c of qh[l], of element 64c + 32 + l bit
// 2c + 1.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5_K) == 4 + kKScaleSize + kQK_K / 8 + kQK_K / 2, "wrong q5_K block size/padding");

// 16 groups of 16: x = d * scales[g] * (q - 32), q in 0..63 (6 bits:
// 4 low bits in ql, 2 high bits in qh). See ref::DequantizeRowQ6_K for
// the bit positions.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];     // lower 4 bits
  uint8_t qh[kQK_K / 4];     // upper 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit group scales
  uint16_t d;                // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == kQK_K / 2 + kQK_K / 4 + kQK_K / 16 + 2,
              "wrong q6_K block size/padding");

// Activation format partnering the K-quants: x = d * qs, d is f32.
// bsums[g] = Σ qs[16g .. 16g+15].
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 4 + kQK_K + kQK_K / 16 * 2, "wrong q8_K block size/padding");

// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K block
// (ggml's get_scale_min_k4): j < 4 in the low 6 bits of q[j] / q[j + 4];
// j >= 4 split into a low nibble in q[j + 4] and 2 high bits on top of
// q[j - 4] (scale) / q[j] (min).
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// (FloatBits, BitsToFloat and the fp16 conversions: src/base/half.h.)
inline float Bf16ToFp32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// binary32 -> bfloat16, round-to-nearest-even; NaN is kept quiet (as ggml's
// ggml_compute_fp32_to_bf16).
inline uint16_t Fp32ToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7FFF + ((u >> 16) & 1))) >> 16);
}

// binary32 -> bfloat16 as vcvtneps2bf16 / vcvtne2ps2bf16 round (the AMX-BF16
// path's conversion): as Fp32ToBf16, except that a subnormal input becomes a
// zero of its sign (the instruction treats denormals as zero and does not
// consult MXCSR).
inline uint16_t Fp32ToBf16Rne(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7F800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000);
  return Fp32ToBf16(f);
}


// ---- The decode layout (cpu::PackForDecode, ref::UnpackDecodeLayout).
// A one-token product reads every weight byte once, so it runs at the speed
// the weights stream from memory only if it does little work per byte. In
// ggml's row-major blocks each row's dot ends in a horizontal sum and the
// block scales have to be gathered; here 16 rows are interleaved so that
// vector lane r is row r: one vpdpbusd takes 4 quant bytes of each of 16
// rows against 4 activation bytes broadcast, and the scales of the 16 rows
// are one vector.
// Rows are taken in groups of 16 (the last one padded with zero rows); group
// g, block b (32 elements) is one record of DecodeRecordBytes(type) bytes at
// (g * (k / 32) + b) * DecodeRecordBytes(type):
//   quants: for t in [0, T): for r in [0, 16): bytes 4t..4t+3 of row r's qs
//           (Q4_0 / Q4_1 / Q5_0: T = 4 of the 16 nibble bytes; Q8_0: T = 8
//           of 32)
//   Q5_0: then the fifth bits, a 32-bit word per row (r at 256 + 4r), whose
//           byte i holds in bit t the fifth bit of element 4t + i and in bit
//           4 + t that of element 16 + 4t + i (t < 4), so that one shift
//           brings the fifth bits of quant word t's low (or high) nibbles to
//           bit 4 of their bytes;
//   then the 16 rows' d (fp16) at DecodeQuantBytes(type), then for Q4_1 the
//   16 rows' m (fp16), then zero to the record's end: Q4 records are 320
//   bytes (5 lines); Q5_0's 352 and Q8_0's 544 have no padding, as their
//   bytes are what a step streams (a Q8_0 output head is most of a decode
//   step's reads; padded to 576 it read 6% more). Their records start on 32
//   bytes, where the AVX2 kernels' 32-byte loads do not cross a line.
inline constexpr int64_t kDecodeGroupRows = 16;

// 0 for a type the layout does not cover.
inline constexpr int64_t DecodeRecordBytes(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 ? 320
         : type == GgmlType::kQ5_0                         ? 352
         : type == GgmlType::kQ8_0                         ? 544
                                                           : 0;
}
// Bytes of the quant part of a record (the scales follow).
inline constexpr int64_t DecodeQuantBytes(GgmlType type) {
  return type == GgmlType::kQ8_0 ? 512 : type == GgmlType::kQ5_0 ? 320 : 256;
}
// T above: the 4-byte quant words of each row in a record.
inline constexpr int64_t DecodeQuantWords(GgmlType type) { return type == GgmlType::kQ8_0 ? 8 : 4; }
// Where a Q5_0 record's fifth-bit words start.
inline constexpr int64_t kDecodeQ5BitsOffset = 256;
// Q5_0's fifth bits (ggml's qh, bit e for element e) as the layout's word,
// and back.
inline uint32_t Q5DecodeBits(uint32_t qh) {
  uint32_t w = 0;
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 4; ++i) {
      w |= ((qh >> (4 * t + i)) & 1u) << (8 * i + t);
      w |= ((qh >> (16 + 4 * t + i)) & 1u) << (8 * i + 4 + t);
    }
  }
  return w;
}
inline uint32_t Q5BitsFromDecode(uint32_t w) {
  uint32_t qh = 0;
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 4; ++i) {
      qh |= ((w >> (8 * i + t)) & 1u) << (4 * t + i);
      qh |= ((w >> (8 * i + 4 + t)) & 1u) << (16 + 4 * t + i);
    }
  }
  return qh;
}

}  // namespace snapfill

#endif  // SNAPFILL_KERNELS_QUANT_BLOCKS_H_
