// AMX-BF16 tile path of cpu::MatMul for token blocks; see matmul_amx.h.
//
// Y[t, j] = Σ_i bf16(X[t, i]) · bf16(W[j, i])  (f32 accumulation)
// where W[j, i] is ggml's f32 dequantization of the weight (ref::DequantizeRow:
// Q4_1 fmaf(q, d, m), Q4_0 (q - 8)·d, Q8_0 q·d) and bf16() is
// vcvtneps2bf16's rounding (ref::Fp32ToBf16Rne). Products of two bf16 values
// are exact in f32, so the only other rounding is the f32 accumulation.
//
// Why: the AMX-INT8 path has to fold every 32-element block's two scales into
// f32 on the vector units (64 vector ops per tile op), and on this CPU those
// do not overlap with the tile unit, which caps it near 15% of the tile
// peak. Here the scales are applied once, while a weight panel is unpacked to
// bf16, and the C tiles accumulate over K with nothing between tile ops but
// tile loads (K in parts of at most kPartBlocks blocks, the C tiles waiting
// in a per-thread buffer between parts). The C tiles are stored straight
// into Y.
//
// Tiles (palette 1, all 16 rows × 64 bytes):
//   C (tmm0-3): 16 tokens × 16 f32 outputs (lanes = weight rows), 2 × 2 of
//               them per kernel call: 32 tokens × 32 weight rows.
//   A (tmm4-5): 16 tokens × 32 bf16 (one 32-element block of K) from the
//               call's bf16 copy of X, in tile order ([pair][block][2][16][32]).
//   B (tmm6-7): 16 rows × 64 bytes, VNNI pairs of 16 weight rows: row r holds
//               elements (2r, 2r+1) of each weight row (16 × 4 bytes).
// A thread unpacks the B tiles of its current weight panel (as many row
// pairs of 32 rows, all K, as kPanelBytes holds) once and reuses them for
// every token pair of its units. Q4_0 / Q4_1: per block, the 16 rows'
// scales and nibbles are gathered with a row per lane, which is the tiles'
// layout, and each tile row is computed as it is stored (UnpackGroupQ4).
// The other types: per weight row and 32-element block, its 32
// values (for the K-quants, one sub-block of a 256-element super-block, with
// its own scale), then a 16 × 16 dword transpose per 16 rows.
//
// Work split: units of (a panel of row pairs) × (up to kBlockPairs token
// pairs), panel-major, static on the kernels' team; every output is computed by one
// thread's kernel calls in a fixed operation order, so the result does not
// depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "kernels/cpu/kernel_config.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/spin_team.h"
#include "kernels/cpu/ops.h"
#include "kernels/quant_blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SNAPFILL_AMX_BF16_COMPILED 1
#include <cpuid.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "kernels/cpu/amx_tiles.h"
#else
#define SNAPFILL_AMX_BF16_COMPILED 0
#endif

namespace snapfill::cpu::internal {

#if SNAPFILL_AMX_BF16_COMPILED
namespace {

#define SNAPFILL_AMXBF16_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))

constexpr int64_t kTile = 16;           // tokens per A tile, weight rows per B tile
constexpr int64_t kBTileBytes = 1024;   // one K block (32 elements) of 16 weight rows
// The bf16 B tiles of the weight panel(s) a unit unpacks, at most: row pairs
// of 32 weight rows, all of K (PanelPairsFor); the feed-forward block's gate
// and up share it. 768 KiB holds a whole 576 × 576 or 192 × 576 weight, so
// at 1,024 tokens and more Q, K, V and O split by tokens, each thread
// reading half of X and writing half of Y (2,048 tokens: q, k, v 1.48-1.52 →
// 0.91 ms; o with its add at 1,024 tokens 0.45-0.46 → 0.29-0.30), where
// panels of at most 4 row pairs (144 KiB at k = 576) split them by rows;
// docs/history/BENCHMARKS-log.md.
constexpr int64_t kPanelBytes = 768 * 1024;
constexpr int64_t kBlockPairs = 8;      // token pairs (32 tokens each) per unit, at most
// K blocks per kernel call, at most: a token pair's A tiles of 18 blocks
// (36 KiB, k = 576) stay in L1 while B streams past them; of the down
// projection's 48 (k = 1,536, 96 KiB) they did not, and K is cut in parts.
constexpr int64_t kPartBlocks = 18;

SNAPFILL_AMXBF16_TARGET void ConfigureTiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
}

SNAPFILL_AMXBF16_TARGET void ReleaseTiles() { _tile_release(); }

// fp16 at p, broadcast as f32 (F16C: the same value as Fp16ToFp32).
SNAPFILL_AMXBF16_TARGET inline __attribute__((always_inline)) __m512 HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// The 32 elements of one Q8_0 block as bf16, in element order (word i =
// element i): q·d of ref::DequantizeRow rounded by vcvtneps2bf16.
SNAPFILL_AMXBF16_TARGET inline __attribute__((always_inline)) __m512i DequantBlockQ8_0(const uint8_t* blk) {
  const __m512 d = HalfAt(blk);
  const __m128i* qs = reinterpret_cast<const __m128i*>(blk + 2);
  const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs))), d);
  const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs + 1))), d);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// B tiles of one group of `rows` (<= 16) Q8_0 weight rows for all nb blocks:
// out[b * stride + r * 64 + 4 * j + 2 * p] = bf16 of element 32b + 2r + p
// of row j (absent rows: zero). A row's 32 values per block, then a 16 × 16
// dword transpose.
SNAPFILL_AMXBF16_TARGET void UnpackGroupQ8_0(const uint8_t* w, size_t row_bytes, int rows, int64_t nb, uint8_t* out,
                                             int64_t stride) {
  const int64_t blk = AmxWeightBlockBytes(AmxWeightKind::kQ8_0);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i v[16], t[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      v[j] = j < rows ? DequantBlockQ8_0(w + j * row_bytes + b * blk) : _mm512_setzero_si512();
    }
    Transpose16x16Dwords(v, t);
    uint8_t* o = out + b * stride;
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(o + 64 * r, t[r]);
  }
}

// One tile row r of a Q4 group (UnpackGroupQ4): elements 2r and 2r + 1 of
// the 16 rows, from the qs dword gathers g (lane j = bytes 4c..4c+3 of row
// j's nibbles): for r < 8 the low nibbles of bytes 2r, 2r + 1, else the high
// nibbles of bytes 2r - 16, 2r - 15.
template <AmxWeightKind kKind, int R>
SNAPFILL_AMXBF16_TARGET inline __attribute__((always_inline)) __m512i Q4TileRow(const __m512i* g, __m512 d, __m512 m,
                                                                                __m512i pair_index) {
  constexpr int kByte = 2 * (R % 2), kShift = R >= 8 ? 4 : 0;
  const __m512i v = g[(R % 8) / 2];
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  const __m512 qe = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * kByte + kShift), low4));
  const __m512 qo = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * kByte + 8 + kShift), low4));
  __m512 ve, vo;
  if constexpr (kKind == AmxWeightKind::kQ4_1) {  // fmaf(q, d, m), as ref::DequantizeRow
    ve = _mm512_fmadd_ps(qe, d, m);
    vo = _mm512_fmadd_ps(qo, d, m);
  } else {  // (q - 8)·d
    ve = _mm512_mul_ps(_mm512_sub_ps(qe, _mm512_set1_ps(8.0f)), d);
    vo = _mm512_mul_ps(_mm512_sub_ps(qo, _mm512_set1_ps(8.0f)), d);
  }
  // Words (bf16(ve[j]), bf16(vo[j])) per dword lane j.
  return _mm512_permutexvar_epi16(pair_index, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(vo, ve)));
}

// Word i of a tile row: word i / 2 of the even (i even) or odd elements.
struct alignas(64) PairIndex {
  uint16_t ix[32];
  constexpr PairIndex() : ix() {
    for (int i = 0; i < 32; ++i) ix[i] = static_cast<uint16_t>((i % 2 ? 16 : 0) + i / 2);
  }
};
constexpr PairIndex kPairIndex;

// The B tiles of a group (as UnpackGroupQ8_0) for Q4_0 / Q4_1, without a
// transpose: per block, the 16 rows' scales and nibbles are gathered with
// the rows in the lanes, which is the tiles' layout already (a lane is a
// weight row, a tile row two elements), so each tile row is a few shifts,
// two conversions, two FMAs and one word permutation. The values of
// ref::DequantizeRow, rounded by vcvtne2ps2bf16.
template <AmxWeightKind kKind, int... R>
SNAPFILL_AMXBF16_TARGET void UnpackGroupQ4(const uint8_t* w, size_t row_bytes, int rows, int64_t nb, uint8_t* out,
                                           int64_t stride, std::integer_sequence<int, R...>) {
  constexpr int64_t kQs = kKind == AmxWeightKind::kQ4_1 ? 4 : 2;  // the nibbles' offset in a block
  const int64_t blk = AmxWeightBlockBytes(kKind);
  const __mmask16 live = static_cast<__mmask16>(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
  const __m512i offs = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(static_cast<int>(row_bytes)));
  const __m512i pair_index = _mm512_load_si512(kPairIndex.ix);
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* base = w + b * blk;
    const __m512i hdr = _mm512_mask_i32gather_epi32(zero, live, offs, base, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
    const __m512 m = kKind == AmxWeightKind::kQ4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)))
                                                   : _mm512_setzero_ps();
    __m512i g[4];
    for (int c = 0; c < 4; ++c) g[c] = _mm512_mask_i32gather_epi32(zero, live, offs, base + kQs + 4 * c, 1);
    uint8_t* o = out + b * stride;
    if (rows >= 16) {
      ((_mm512_storeu_si512(o + 64 * R, Q4TileRow<kKind, R>(g, d, m, pair_index))), ...);
    } else {  // absent rows zero (Q4_0's (0 - 8)·0 would be -0)
      ((_mm512_storeu_si512(o + 64 * R, _mm512_maskz_mov_epi32(live, Q4TileRow<kKind, R>(g, d, m, pair_index)))), ...);
    }
  }
}

template <AmxWeightKind kKind>
SNAPFILL_AMXBF16_TARGET void UnpackGroupQ4Rows(const uint8_t* w, size_t row_bytes, int rows, int64_t nb, uint8_t* out,
                                               int64_t stride) {
  UnpackGroupQ4<kKind>(w, row_bytes, rows, nb, out, stride, std::make_integer_sequence<int, 16>());
}

// The other types by rows, as Q8_0: row j's 32 elements of block b as bf16
// in element order (RowBlock<kType>::Get: ref::DequantizeRow's f32 values,
// rounded by vcvtne2ps2bf16), then a 16 × 16 dword transpose per 16 rows.
template <GgmlType kType>
struct RowBlock;

template <>
struct RowBlock<GgmlType::kF16> {  // F16C's conversion is exact
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const auto* h = reinterpret_cast<const __m256i*>(row + 64 * b);
    const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256(h)), hi = _mm512_cvtph_ps(_mm256_loadu_si256(h + 1));
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  }
};

template <>
struct RowBlock<GgmlType::kBF16> {  // through f32, so subnormals go to zero as Fp32ToBf16Rne has them
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const auto* h = reinterpret_cast<const __m256i*>(row + 64 * b);
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h)), 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h + 1)), 16));
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  }
};

// 32 bytes as 32 f32 (two halves), unsigned.
SNAPFILL_AMXBF16_TARGET inline __attribute__((always_inline)) void BytesToF32(__m256i q, __m512* lo, __m512* hi) {
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
}

template <>
struct RowBlock<GgmlType::kQ4_K> {  // sub-block b % 8 of super-block b / 8: fmaf(d·sc, q, -(dmin·m))
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(row)[b / 8];
    const int s = static_cast<int>(b % 8);
    uint8_t sc, m;
    GetScaleMinK4(s, blk.scales, &sc, &m);
    const float d1 = Fp16ToFp32(blk.d) * sc, m1 = Fp16ToFp32(blk.dmin) * m;
    // Sub-block 2c in the low nibbles of qs[32c..32c+31], 2c + 1 in the high.
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    __m512 lo, hi;
    BytesToF32(q, &lo, &hi);
    const __m512 dv = _mm512_set1_ps(d1), mv = _mm512_set1_ps(-m1);
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(dv, hi, mv), _mm512_fmadd_ps(dv, lo, mv)));
  }
};

// Q5_0 / Q5_1: the 32 quants of block b (0..31: nibble | fifth bit << 4)
// as f32 halves.
SNAPFILL_AMXBF16_TARGET inline __attribute__((always_inline)) void Q5Block(const uint8_t* qs, const uint8_t* qh,
                                                                         __m512* lo, __m512* hi) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m512i sixteen = _mm512_set1_epi32(16);
  const __m512i a = _mm512_cvtepu8_epi32(_mm_and_si128(q, low4));
  const __m512i b = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low4));
  *lo = _mm512_cvtepi32_ps(_mm512_mask_or_epi32(a, static_cast<__mmask16>(h), a, sixteen));
  *hi = _mm512_cvtepi32_ps(_mm512_mask_or_epi32(b, static_cast<__mmask16>(h >> 16), b, sixteen));
}

template <>
struct RowBlock<GgmlType::kQ5_0> {  // (q - 16)·d
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const BlockQ5_0& blk = reinterpret_cast<const BlockQ5_0*>(row)[b];
    __m512 lo, hi;
    Q5Block(blk.qs, blk.qh, &lo, &hi);
    const __m512 d = _mm512_set1_ps(Fp16ToFp32(blk.d)), off = _mm512_set1_ps(16.0f);
    return reinterpret_cast<__m512i>(
        _mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_sub_ps(hi, off), d), _mm512_mul_ps(_mm512_sub_ps(lo, off), d)));
  }
};

template <>
struct RowBlock<GgmlType::kQ5_1> {  // fmaf(q, d, m)
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const BlockQ5_1& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
    __m512 lo, hi;
    Q5Block(blk.qs, blk.qh, &lo, &hi);
    const __m512 d = _mm512_set1_ps(Fp16ToFp32(blk.d)), m = _mm512_set1_ps(Fp16ToFp32(blk.m));
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(hi, d, m), _mm512_fmadd_ps(lo, d, m)));
  }
};

template <>
struct RowBlock<GgmlType::kQ5_K> {  // Q4_K's with the fifth bit 2c or 2c + 1 of qh (BlockQ5_K)
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const BlockQ5_K& blk = reinterpret_cast<const BlockQ5_K*>(row)[b / 8];
    const int s = static_cast<int>(b % 8);
    uint8_t sc, m;
    GetScaleMinK4(s, blk.scales, &sc, &m);
    const float d1 = Fp16ToFp32(blk.d) * sc, m1 = Fp16ToFp32(blk.dmin) * m;
    __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs + 32 * (s / 2)));
    if (s % 2) q = _mm256_srli_epi16(q, 4);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh));
    const __m256i h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
    q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    __m512 lo, hi;
    BytesToF32(q, &lo, &hi);
    const __m512 dv = _mm512_set1_ps(d1), mv = _mm512_set1_ps(-m1);
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_fmadd_ps(dv, hi, mv), _mm512_fmadd_ps(dv, lo, mv)));
  }
};

template <>
struct RowBlock<GgmlType::kQ6_K> {  // (d·sc)·(q - 32), sc per 16 elements (ref::DequantizeRowQ6_K's layout)
  SNAPFILL_AMXBF16_TARGET static __m512i Get(const uint8_t* row, int64_t b) {
    const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int h = static_cast<int>(b % 8) / 4, r = static_cast<int>(b % 4);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h + 32 * (r % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i lo4 = _mm256_and_si256(r >= 2 ? _mm256_srli_epi16(ql, 4) : ql, low4);
    const __m256i hi2 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * r)), _mm256_set1_epi8(0x03));
    const __m256i q = _mm256_or_si256(lo4, _mm256_slli_epi16(hi2, 4));  // 0..63
    __m512 lo, hi;
    BytesToF32(q, &lo, &hi);
    const __m512 off = _mm512_set1_ps(32.0f);  // q - 32 is exact in f32
    const float d = Fp16ToFp32(blk.d);
    const __m512 vlo = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(blk.scales[8 * h + 2 * r])),
                                     _mm512_sub_ps(lo, off));
    const __m512 vhi = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(blk.scales[8 * h + 2 * r + 1])),
                                     _mm512_sub_ps(hi, off));
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(vhi, vlo));
  }
};

template <GgmlType kType>
SNAPFILL_AMXBF16_TARGET void UnpackGroupByRows(const uint8_t* w, size_t row_bytes, int rows, int64_t nb,
                                               uint8_t* out, int64_t stride) {
  for (int64_t b = 0; b < nb; ++b) {
    __m512i v[16], t[16];
    for (int j = 0; j < 16; ++j) {
      v[j] = j < rows ? RowBlock<kType>::Get(w + j * row_bytes, b) : _mm512_setzero_si512();
    }
    Transpose16x16Dwords(v, t);
    uint8_t* o = out + b * stride;
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) _mm512_storeu_si512(o + 64 * r, t[r]);
  }
}

using UnpackFn = void (*)(const uint8_t*, size_t, int, int64_t, uint8_t*, int64_t);

// Q4_0 / Q4_1 by gathers (no transpose; 5-16% faster products at 512-1,024
// tokens, docs/history/BENCHMARKS-log.md), Q8_0 and the others by rows and a
// transpose. (AmxBf16SupportsType lists the types.)
UnpackFn PickUnpack(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return UnpackGroupQ4Rows<AmxWeightKind::kQ4_0>;
    case GgmlType::kQ4_1: return UnpackGroupQ4Rows<AmxWeightKind::kQ4_1>;
    case GgmlType::kF16: return UnpackGroupByRows<GgmlType::kF16>;
    case GgmlType::kBF16: return UnpackGroupByRows<GgmlType::kBF16>;
    case GgmlType::kQ5_0: return UnpackGroupByRows<GgmlType::kQ5_0>;
    case GgmlType::kQ5_1: return UnpackGroupByRows<GgmlType::kQ5_1>;
    case GgmlType::kQ4_K: return UnpackGroupByRows<GgmlType::kQ4_K>;
    case GgmlType::kQ5_K: return UnpackGroupByRows<GgmlType::kQ5_K>;
    case GgmlType::kQ6_K: return UnpackGroupByRows<GgmlType::kQ6_K>;
    default: return UnpackGroupQ8_0;
  }
}

// One row of k f32 as bf16: elements 32b..32b+31 at out + b * stride (in
// bf16 elements); a tail past the last multiple of 32 lands in block k / 32.
SNAPFILL_AMXBF16_TARGET void ConvertRow(const float* x, int64_t k, uint16_t* out, int64_t stride) {
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_si512(out + i / 32 * stride, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  for (; i < k; ++i) out[i / 32 * stride + i % 32] = Fp32ToBf16Rne(x[i]);
}

// n (a multiple of 32) contiguous f32 as n contiguous bf16, rounded as
// ConvertRow rounds.
SNAPFILL_AMXBF16_TARGET inline void ConvertContiguous(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(x + i), hi = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

// The SwiGLU of one (token pair, row pair) of gate and up outputs (32 × 32,
// token-major) into its 2 KiB of h, in steps of 64 elements: cpu::SwiGlu
// (element-wise, so the same bits as over whole rows), then vcvtneps2bf16 as
// ConvertXTiles would. One step per call, from Kernel's side work, so that
// it runs while the tile unit works on the next pair (BM_FeedForward_Prefill
// docs/history/BENCHMARKS-log.md); Finish does what is left.
class SwiGluSteps {
 public:
  void Start(float* g, const float* u, uint16_t* h) {
    g_ = g;
    u_ = u;
    h_ = h;
    next_ = 0;
  }
  void operator()() {
    if (next_ < kSteps) Step(next_++);
  }
  void Finish() {
    while (next_ < kSteps) Step(next_++);
  }

 private:
  static constexpr int kStep = 64, kSteps = 32 * 32 / kStep;
  void Step(int i) {
    ::snapfill::cpu::SwiGlu(g_ + i * kStep, u_ + i * kStep, g_ + i * kStep, kStep);
    ConvertContiguous(g_ + i * kStep, kStep, h_ + i * kStep);
  }
  float* g_ = nullptr;
  const float* u_ = nullptr;
  uint16_t* h_ = nullptr;
  int next_ = kSteps;  // nothing to do
};

struct KernelArgs {
  const uint8_t* xa;    // A tiles of the token pair from the chunk's first block: [nb][2][16][32] bf16
  const uint8_t* bp;    // B tiles of the row pair from the same block: [nb][2][1024 bytes]
  int64_t nb;
  float* y;             // Y[first token, first row]
  int64_t y_stride;     // floats
  int toks[2];          // valid tokens in each token tile (0..16)
  int rows[2];          // valid weight rows in each row group (0..16)
  bool add;             // Y += the product (the residual add), else Y = it
  // A part of K (RunProductUnits): the four C tiles start from c_in (else
  // zero) and, with c_out, go there (1 KiB each, in order) instead of Y.
  const float* c_in = nullptr;
  float* c_out = nullptr;
};

// Stores C tile `tmm` (token tile ti, row group rj) into Y.
#define SNAPFILL_BF16_STORE_C(tmm, ti, rj)                                                        \
  do {                                                                                            \
    const int toks = a.toks[ti], rows = a.rows[rj];                                               \
    float* dst = a.y + (ti) * kTile * a.y_stride + (rj) * kTile;                                  \
    if (a.add && toks > 0 && rows > 0) {                                                          \
      /* y + c in f32, as a separate add of the stored product would give */                     \
      SNAPFILL_TILE_STORE(tmm, buf, 64);                                                     \
      const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);                            \
      for (int t = 0; t < toks; ++t) {                                                            \
        float* yr = dst + t * a.y_stride;                                                         \
        _mm512_mask_storeu_ps(yr, mask,                                                           \
                              _mm512_add_ps(_mm512_maskz_loadu_ps(mask, yr), _mm512_load_ps(buf + 16 * t))); \
      }                                                                                           \
    } else if (toks == kTile && rows == kTile) {                                                  \
      SNAPFILL_TILE_STORE(tmm, dst, a.y_stride * 4);                                         \
    } else if (toks > 0 && rows > 0) {                                                            \
      SNAPFILL_TILE_STORE(tmm, buf, 64);                                                     \
      const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);                            \
      for (int t = 0; t < toks; ++t) {                                                            \
        _mm512_mask_storeu_ps(dst + t * a.y_stride, mask, _mm512_load_ps(buf + 16 * t));          \
      }                                                                                           \
    }                                                                                             \
  } while (0)

// No work between a kernel's tile ops.
struct NoSideWork {
  void operator()() const {}
};

// 32 tokens × 32 weight rows over all nb blocks, calling side() once per
// block after the first (vector work of the caller's that then runs while
// the tile unit works: the feed-forward block's SwiGLU).
template <class SideWork = NoSideWork>
SNAPFILL_AMXBF16_TARGET void Kernel(const KernelArgs& a, SideWork&& side = SideWork()) {
  alignas(64) float buf[256];
  if (a.c_in != nullptr) {
    SNAPFILL_TILE_LOAD(0, a.c_in, 64);
    SNAPFILL_TILE_LOAD(1, a.c_in + 256, 64);
    SNAPFILL_TILE_LOAD(2, a.c_in + 512, 64);
    SNAPFILL_TILE_LOAD(3, a.c_in + 768, 64);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  // Tile registers are not renamed: a load into a tile waits until every
  // earlier op reading it has finished. So each next-block load is issued
  // right after the last op that reads its register, and the next block's
  // first op (A0·B0) finds both operands loaded one op earlier.
  // The token pair's A tiles are read again by the panel's next row pair
  // and stay in L1; the B tiles go through with the non-temporal hint so
  // they do not evict them (docs/history/amx_notes.md: 7.2 -> 5.6 ns
  // per op at k = 576 in a stand-alone loop).
  const uint8_t* xa = a.xa;
  const uint8_t* bp = a.bp;
  SNAPFILL_TILE_LOAD(4, xa, 64);
  SNAPFILL_TILE_LOAD_STREAM(6, bp, 64);
  SNAPFILL_TILE_LOAD_STREAM(7, bp + kBTileBytes, 64);
  SNAPFILL_TILE_LOAD(5, xa + kBTileBytes, 64);
  for (int64_t b = 1; b < a.nb; ++b) {
    xa += 2 * kBTileBytes;
    bp += 2 * kBTileBytes;
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    side();
    SNAPFILL_TILE_LOAD(4, xa, 64);
    _tile_dpbf16ps(2, 5, 6);
    SNAPFILL_TILE_LOAD_STREAM(6, bp, 64);
    _tile_dpbf16ps(3, 5, 7);
    SNAPFILL_TILE_LOAD(5, xa + kBTileBytes, 64);
    SNAPFILL_TILE_LOAD_STREAM(7, bp + kBTileBytes, 64);
  }
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
  if (a.c_out != nullptr) {
    SNAPFILL_TILE_STORE(0, a.c_out, 64);
    SNAPFILL_TILE_STORE(1, a.c_out + 256, 64);
    SNAPFILL_TILE_STORE(2, a.c_out + 512, 64);
    SNAPFILL_TILE_STORE(3, a.c_out + 768, 64);
    return;
  }
  SNAPFILL_BF16_STORE_C(0, 0, 0);
  SNAPFILL_BF16_STORE_C(1, 0, 1);
  SNAPFILL_BF16_STORE_C(2, 1, 0);
  SNAPFILL_BF16_STORE_C(3, 1, 1);
}

#undef SNAPFILL_BF16_STORE_C

bool DetectAmxBf16() {
  if (!AmxAvailable()) return false;
  if (ActiveKernelConfig().amx != AmxMode::kAll) return false;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1)) return false;  // AMX-BF16
  if (a < 1 || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return false;  // AVX512_BF16
  return true;
}

// A 64-byte-aligned buffer that grows and never shrinks (per thread, reused
// across calls). Uninitialized: callers write what they read.
class AlignedScratch {
 public:
  AlignedScratch() = default;
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  ~AlignedScratch() { std::free(data_); }
  uint8_t* Reserve(size_t bytes) {
    if (bytes > size_) {
      std::free(data_);
      size_ = (bytes + 63) / 64 * 64;
      data_ = static_cast<uint8_t*>(std::aligned_alloc(64, size_));
      if (data_ == nullptr) {
        size_ = 0;
        throw std::bad_alloc();  // as the std::vector scratch of the other paths would
      }
    }
    return data_;
  }
  size_t capacity() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One buffer per use and thread of the team (thread_scratch.h): kTag tells
// the uses apart.
template <int kTag>
struct TaggedScratch : AlignedScratch {
  uint64_t bytes() const { return capacity(); }
};
AlignedScratch& ThreadPanel() {  // [row pairs * 2][nb][1024] B tiles (kPanelBytes at most)
  return CurrentScratch().Get<TaggedScratch<0>>();
}
AlignedScratch& ThreadGlu() {  // one row of silu(gate) ⊙ up, or of RmsNorm(x)
  return CurrentScratch().Get<TaggedScratch<1>>();
}
AlignedScratch& CallerXb() {  // bf16 X in tile order: [token pair][block][2][16][32]
  return CurrentScratch().Get<TaggedScratch<2>>();
}
AlignedScratch& ThreadPartial() {  // C tiles between parts of K: [row pair][4][256] f32
  return CurrentScratch().Get<TaggedScratch<3>>();
}
AlignedScratch& CallerHb() {  // FeedForwardAmxBf16's h, in the same order
  return CurrentScratch().Get<TaggedScratch<4>>();
}

}  // namespace

bool AmxBf16Available() {
  static const bool available = DetectAmxBf16();
  return available;
}

bool AmxBf16SupportsType(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ8_0:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return true;
    default: return false;
  }
}

void ConfigureBf16Tiles() { ConfigureTiles(); }
void ReleaseBf16Tiles() { ReleaseTiles(); }

void UnpackBf16TilesForTesting(const uint8_t* w, GgmlType type, size_t w_row_bytes, int rows, int64_t k,
                               uint8_t* out) {
  PickUnpack(type)(w, w_row_bytes, rows, k / 32, out, kBTileBytes);
}

void ConvertRowBf16ForTesting(const float* x, int64_t k, uint16_t* out) { ConvertRow(x, k, out, 32); }

namespace {

// How one product's outputs are cut into units: panels of row pairs ×
// blocks of token pairs, panel-major.
struct UnitLayout {
  int64_t num_rp, rp_per_unit, num_mu, tp_per_unit, num_units;
};

// Unit u of a layout: its panel nu (row pairs [rp0, rp1)) and its token
// pairs [tp0, tp1).
struct UnitRange {
  int64_t nu, rp0, rp1, tp0, tp1;
};
UnitRange RangeOf(const UnitLayout& l, int64_t u, int64_t num_tp) {
  UnitRange r;
  r.nu = u / l.num_mu;
  const int64_t mu = u % l.num_mu;
  r.rp0 = r.nu * l.rp_per_unit;
  r.rp1 = std::min(l.num_rp, r.rp0 + l.rp_per_unit);
  r.tp0 = mu * l.tp_per_unit;
  r.tp1 = std::min(num_tp, r.tp0 + l.tp_per_unit);
  return r;
}

// The most row pairs per panel whose B tiles (K blocks of nb) fit in `bytes`
// (at least one; at most 64, for tiny K).
int64_t PanelPairsFor(int64_t nb, int64_t bytes) {
  return std::clamp<int64_t>(bytes / (2 * nb * kBTileBytes), 1, 64);
}

UnitLayout LayoutFor(int64_t num_tp, int64_t n, int threads, int64_t max_rp) {
  UnitLayout l;
  l.num_rp = (n + 2 * kTile - 1) / (2 * kTile);
  // Token blocks and panels of near-equal size (a short last one would leave
  // a thread idle at the end of the static schedule).
  l.num_mu = (num_tp + kBlockPairs - 1) / kBlockPairs;
  l.tp_per_unit = (num_tp + l.num_mu - 1) / l.num_mu;
  // Panels of at most max_rp row pairs, and small enough that every thread
  // gets at least two units.
  const int64_t want_nu = std::max<int64_t>((l.num_rp + max_rp - 1) / max_rp,
                                            (2 * threads + l.num_mu - 1) / l.num_mu);
  l.rp_per_unit = std::max<int64_t>(1, (l.num_rp + want_nu - 1) / want_nu);
  l.num_units = (l.num_rp + l.rp_per_unit - 1) / l.rp_per_unit * l.num_mu;
  return l;
}

// Rows [0, m_pad) of X (or of silu(X) ⊙ up, with `up`; or of
// cpu::RmsNorm(X; norm, eps), with `norm`) as bf16 A tiles:
// [token pair][block][2][16 tokens][32], 2 KiB per pair and block, so a
// kernel reads one contiguous stream; rows past m are zero. By thread t of
// a team run of nt threads, its static share of the rows, then the team's
// barrier.
void ConvertXTiles(const float* x, int64_t m, int64_t m_pad, int64_t k, int64_t x_stride, const float* up,
                   const float* norm, float eps, uint16_t* xb, int t, int nt) {
  const int64_t nb = k / 32;
  // silu(x) ⊙ up or the normalized row, one at a time (L1-sized for the
  // model's widths: 6 KiB at k = 1536).
  float* const tmp = up != nullptr || norm != nullptr ? reinterpret_cast<float*>(ThreadGlu().Reserve(k * sizeof(float)))
                                                      : nullptr;
  const StaticRange rows(m_pad, t, nt);
  for (int64_t i = rows.first; i < rows.last; ++i) {
    uint16_t* row = xb + (i / (2 * kTile)) * 2 * kTile * k + (i % (2 * kTile)) * 32;  // block 0
    constexpr int64_t kStride = 2 * kTile * 32;  // bf16 elements between blocks
    if (i < m && up != nullptr) {
      ::snapfill::cpu::SwiGlu(x + i * x_stride, up + i * x_stride, tmp, k);
      ConvertRow(tmp, k, row, kStride);
    } else if (i < m && norm != nullptr) {
      // One row: cpu::RmsNorm's per-row arithmetic, on this thread.
      ::snapfill::cpu::RmsNorm(x + i * x_stride, k, norm, tmp, k, 1, k, eps);
      ConvertRow(tmp, k, row, kStride);
    } else if (i < m) {
      ConvertRow(x + i * x_stride, k, row, kStride);
    } else {
      for (int64_t b = 0; b < nb; ++b) std::memset(row + b * kStride, 0, 64);
    }
  }
  SpinTeam::Current().Barrier(nt);
}

// The B tiles of row pairs [rp0, rp1) of a weight of n rows into `panel`:
// [row pair][block][2 groups][1024 bytes] (rows past n: zero).
void UnpackPanel(UnpackFn unpack, const uint8_t* w, size_t w_row_bytes, int64_t n, int64_t nb, int64_t rp0,
                 int64_t rp1, uint8_t* panel) {
  for (int64_t g = 2 * rp0; g < 2 * rp1; ++g) {
    uint8_t* dst = panel + ((g / 2 - rp0) * nb * 2 + g % 2) * kBTileBytes;
    const int rows = static_cast<int>(std::clamp<int64_t>(n - g * kTile, 0, kTile));
    if (rows > 0) {
      unpack(w + g * kTile * w_row_bytes, w_row_bytes, rows, nb, dst, 2 * kBTileBytes);
    } else {
      for (int64_t b = 0; b < nb; ++b) std::memset(dst + b * 2 * kBTileBytes, 0, kBTileBytes);
    }
  }
}

// Thread t's units of one product over A tiles xb (from ConvertXTiles, or
// FeedForwardAmxBf16's h): its static share of a team run of nt threads,
// without a barrier after. `configured` says whether this thread loaded the
// tile configuration yet (it does so at its first unit).
void RunProductUnits(const uint16_t* xb, int64_t m, int64_t nb, const AmxBf16Out& o, const UnitLayout& l,
                     UnpackFn unpack, uint8_t* panel, bool add, bool& configured, int t, int nt) {
  const int64_t n = o.n, k = nb * 32;
  const int64_t num_tp = (m + 2 * kTile - 1) / (2 * kTile);
  // K in parts of at most kPartBlocks blocks, so that a token pair's A tiles
  // of one part stay in L1 while the panel's row pairs stream past them;
  // between parts the C tiles wait in `partial` (exact: f32 in and out, the
  // same sums in the same order).
  const int64_t parts = (nb + kPartBlocks - 1) / kPartBlocks;
  float* const partial =
      parts > 1 ? reinterpret_cast<float*>(ThreadPartial().Reserve(static_cast<size_t>(l.rp_per_unit) * 4096)) : nullptr;
  int64_t unpacked_nu = -1;
  // No barrier: a thread done with one product's units starts on the next
  // (they read only X, converted before the caller's barrier).
  const StaticRange units(l.num_units, t, nt);
  for (int64_t u = units.first; u < units.last; ++u) {
    if (!configured) {
      ConfigureTiles();
      configured = true;
    }
    const auto [nu, rp0, rp1, tp0, tp1] = RangeOf(l, u, num_tp);
    auto group_rows = [&](int64_t g) { return static_cast<int>(std::clamp<int64_t>(n - g * kTile, 0, kTile)); };
    if (unpacked_nu != nu) {
      UnpackPanel(unpack, o.w, o.w_row_bytes, n, nb, rp0, rp1, panel);
      unpacked_nu = nu;
    }
    // Token pairs outer: a pair's A tiles (2 KiB per block) are reused by
    // every row pair of the panel; consecutive calls write neighbouring
    // columns of the same Y rows. (Measured against row pairs outer, and
    // against K cut into parts where A fits L1 anyway, which lost to the
    // parts' extra C stores: docs/history/BENCHMARKS-log.md; parts
    // pay only past kPartBlocks.)
    for (int64_t tp = tp0; tp < tp1; ++tp) {
      for (int64_t part = 0; part < parts; ++part) {
        const int64_t b0 = nb * part / parts, b1 = nb * (part + 1) / parts;
        for (int64_t rp = rp0; rp < rp1; ++rp) {
          KernelArgs a;
          a.xa = reinterpret_cast<const uint8_t*>(xb + tp * 2 * kTile * k) + b0 * 2 * kBTileBytes;
          a.bp = panel + ((rp - rp0) * nb + b0) * 2 * kBTileBytes;
          a.nb = b1 - b0;
          a.y_stride = o.y_stride;
          const int64_t t0 = tp * 2 * kTile;
          a.toks[0] = static_cast<int>(std::clamp<int64_t>(m - t0, 0, kTile));
          a.toks[1] = static_cast<int>(std::clamp<int64_t>(m - t0 - kTile, 0, kTile));
          a.rows[0] = group_rows(2 * rp);
          a.rows[1] = group_rows(2 * rp + 1);
          a.y = o.y + t0 * o.y_stride + rp * 2 * kTile;
          a.add = add;
          float* const c = partial + (rp - rp0) * 4 * 256;
          a.c_in = part > 0 ? c : nullptr;
          a.c_out = part + 1 < parts ? c : nullptr;
          Kernel(a);
        }
      }
    }
  }
}

}  // namespace

void MatMulAmxBf16Shared(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType type,
                         const AmxBf16Out* outs, int count, const float* up, bool add, const float* norm, float eps) {
  constexpr int kMaxOuts = 8;
  if (count > kMaxOuts) {
    MatMulAmxBf16Shared(x, m, k, x_stride, type, outs, kMaxOuts, up, add, norm, eps);
    MatMulAmxBf16Shared(x, m, k, x_stride, type, outs + kMaxOuts, count - kMaxOuts, up, add, norm, eps);
    return;
  }
  const UnpackFn unpack = PickUnpack(type);
  const int64_t nb = k / 32;
  const int64_t num_tp = (m + 2 * kTile - 1) / (2 * kTile);  // token pairs
  const int64_t m_pad = num_tp * 2 * kTile;
  // X converted once for all the products.
  uint16_t* const xb = reinterpret_cast<uint16_t*>(CallerXb().Reserve(m_pad * k * sizeof(uint16_t)));

  // On the spinning team (SpinTeam says why), not OpenMP.
  SpinTeam& team = SpinTeam::Current();
  const int threads = team.Threads(internal::SpinTeam::CurrentThreads());
  UnitLayout layouts[kMaxOuts];
  const int64_t max_rp = PanelPairsFor(nb, kPanelBytes);
  for (int c = 0; c < count; ++c) layouts[c] = LayoutFor(num_tp, outs[c].n, threads, max_rp);

  team.Run(threads, [&](int t, int nt) {
    ConvertXTiles(x, m, m_pad, k, x_stride, up, norm, eps, xb, t, nt);
    uint8_t* const panel = ThreadPanel().Reserve(static_cast<size_t>(max_rp * 2 * nb * kBTileBytes));
    bool configured = false;
    for (int c = 0; c < count; ++c) {
      RunProductUnits(xb, m, nb, outs[c], layouts[c], unpack, panel, add, configured, t, nt);
    }
    if (configured) ReleaseTiles();
  });
}

void FeedForwardAmxBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, GgmlType gu_type,
                        const uint8_t* gate, const uint8_t* up, int64_t n_ff, size_t gu_row_bytes, GgmlType d_type,
                        const uint8_t* down, int64_t n, size_t d_row_bytes, float* y, int64_t y_stride, bool add,
                        const float* norm, float eps) {
  const UnpackFn unpack_gu = PickUnpack(gu_type);
  const UnpackFn unpack_d = PickUnpack(d_type);
  const int64_t nb = k / 32, nb_ff = n_ff / 32;
  const int64_t num_tp = (m + 2 * kTile - 1) / (2 * kTile);
  const int64_t m_pad = num_tp * 2 * kTile;
  uint16_t* const xb = reinterpret_cast<uint16_t*>(CallerXb().Reserve(m_pad * k * sizeof(uint16_t)));
  // h = bf16(silu(X·Gᵀ) ⊙ X·Uᵀ) as the down projection's A tiles: row pair
  // rp of gate and up is block rp of h, so the 32 × 32 outputs of one
  // (token pair, row pair) are one contiguous 2 KiB A tile pair.
  uint16_t* const hb = reinterpret_cast<uint16_t*>(CallerHb().Reserve(m_pad * n_ff * sizeof(uint16_t)));

  SpinTeam& team = SpinTeam::Current();
  const int threads = team.Threads(internal::SpinTeam::CurrentThreads());
  const int64_t max_rp_gu = PanelPairsFor(nb, kPanelBytes / 2), max_rp_d = PanelPairsFor(nb_ff, kPanelBytes);
  const UnitLayout lg = LayoutFor(num_tp, n_ff, threads, max_rp_gu);
  const UnitLayout ld = LayoutFor(num_tp, n, threads, max_rp_d);

  team.Run(threads, [&](int t, int nt) {
    ConvertXTiles(x, m, m_pad, k, x_stride, nullptr, norm, eps, xb, t, nt);
    const size_t gu_panel = static_cast<size_t>(max_rp_gu * 2 * nb * kBTileBytes);
    uint8_t* const panel =
        ThreadPanel().Reserve(std::max(2 * gu_panel, static_cast<size_t>(max_rp_d * 2 * nb_ff * kBTileBytes)));
    bool configured = false;
    {
      // One (token pair, row pair) of each, token-major; two of each, so
      // that the SwiGLU of one runs between the tile ops of the next
      // (SwiGluSteps).
      alignas(64) float g[2][32 * 32], u[2][32 * 32];
      SwiGluSteps swiglu;
      int64_t unpacked_nu = -1, i = 0;
      const StaticRange units(lg.num_units, t, nt);
      for (int64_t unit = units.first; unit < units.last; ++unit) {
        if (!configured) {
          ConfigureTiles();
          configured = true;
        }
        const auto [nu, rp0, rp1, tp0, tp1] = RangeOf(lg, unit, num_tp);
        if (unpacked_nu != nu) {
          UnpackPanel(unpack_gu, gate, gu_row_bytes, n_ff, nb, rp0, rp1, panel);
          UnpackPanel(unpack_gu, up, gu_row_bytes, n_ff, nb, rp0, rp1, panel + gu_panel);
          unpacked_nu = nu;
        }
        for (int64_t tp = tp0; tp < tp1; ++tp) {
          for (int64_t rp = rp0; rp < rp1; ++rp, ++i) {
            // Whole tiles into g and u (rows past n_ff and tokens past m
            // come out zero: their B rows and A rows are zero).
            KernelArgs a;
            a.xa = reinterpret_cast<const uint8_t*>(xb + tp * 2 * kTile * k);
            a.nb = nb;
            a.y_stride = 32;
            a.toks[0] = a.toks[1] = a.rows[0] = a.rows[1] = static_cast<int>(kTile);
            a.add = false;
            a.bp = panel + (rp - rp0) * nb * 2 * kBTileBytes;
            a.y = g[i & 1];
            Kernel(a, swiglu);
            a.bp += gu_panel;
            a.y = u[i & 1];
            Kernel(a, swiglu);
            swiglu.Finish();
            swiglu.Start(g[i & 1], u[i & 1], hb + (tp * nb_ff + rp) * 32 * 32);
          }
        }
      }
      swiglu.Finish();
      // The down projection reads every token pair's h.
      team.Barrier(nt);
    }
    RunProductUnits(hb, m, nb_ff, AmxBf16Out{down, n, d_row_bytes, y, y_stride}, ld, unpack_d, panel, add,
                    configured, t, nt);
    if (configured) ReleaseTiles();
  });
}

void MatMulAmxBf16(const float* x, int64_t m, int64_t k, int64_t x_stride, const uint8_t* w, GgmlType type,
                   int64_t n, size_t w_row_bytes, float* y, int64_t y_stride) {
  const AmxBf16Out out{w, n, w_row_bytes, y, y_stride};
  MatMulAmxBf16Shared(x, m, k, x_stride, type, &out, 1);
}

uint64_t AmxBf16ScratchBytes(int64_t m, int64_t widest, int64_t ffn, int threads) {
  const uint64_t m_pad = static_cast<uint64_t>((m + 2 * kTile - 1) / (2 * kTile) * 2 * kTile);
  const uint64_t w = static_cast<uint64_t>(std::max(widest, ffn));
  // CallerXb and CallerHb.
  const uint64_t caller = m_pad * (w + static_cast<uint64_t>(ffn)) * sizeof(uint16_t);
  // ThreadPanel: kPanelBytes, or one row pair of gate and up (2 · 64 bytes
  // per input value) where a weight is too wide for it; ThreadGlu; and
  // ThreadPartial, at most 64 row pairs of C tiles (PanelPairsFor).
  const uint64_t panel = std::max<uint64_t>(kPanelBytes, 128 * w);
  const uint64_t per_thread = panel + w * sizeof(float) + 64 * 4096 + 3 * 64;
  return caller + 2 * 64 + static_cast<uint64_t>(std::max(threads, 1)) * per_thread;
}

#else  // !SNAPFILL_AMX_BF16_COMPILED

bool AmxBf16Available() { return false; }
bool AmxBf16SupportsType(GgmlType) { return false; }
uint64_t AmxBf16ScratchBytes(int64_t, int64_t, int64_t, int) { return 0; }
void ConfigureBf16Tiles() {}
void ReleaseBf16Tiles() {}
void MatMulAmxBf16(const float*, int64_t, int64_t, int64_t, const uint8_t*, GgmlType, int64_t, size_t, float*,
                   int64_t) {}
void MatMulAmxBf16Shared(const float*, int64_t, int64_t, int64_t, GgmlType, const AmxBf16Out*, int, const float*,
                         bool, const float*, float) {}
void FeedForwardAmxBf16(const float*, int64_t, int64_t, int64_t, GgmlType, const uint8_t*, const uint8_t*, int64_t,
                        size_t, GgmlType, const uint8_t*, int64_t, size_t, float*, int64_t, bool, const float*, float) {}
void UnpackBf16TilesForTesting(const uint8_t*, GgmlType, size_t, int, int64_t, uint8_t*) {}
void ConvertRowBf16ForTesting(const float*, int64_t, uint16_t*) {}

#endif  // SNAPFILL_AMX_BF16_COMPILED

}  // namespace snapfill::cpu::internal
